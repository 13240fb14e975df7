"""Benchmark rows: variants of the composition (records + user turns + the chain).

The README's wiring is the built-in row ``tool_and_user_summary_anchored``; these add the
``"raise"`` overflow policy, which a table row cannot show by default:

    maf-compaction bench --rows none,tool_and_user_summary_anchored,composed_raise \\
        --strategy composed_raise=docs.examples.composed_rows:raising

(run from the repository root, so ``docs.examples`` imports; or copy this file into your own package).
"""

from __future__ import annotations

from maf_compaction.bench.rows import RowContext, RowSetup, composed_row


def boundary(context: RowContext) -> RowSetup:
    """The README's wiring: the user half in the boundary mode (the built-in row)."""
    return composed_row(context, summary_mode="boundary")


def recompact(context: RowContext) -> RowSetup:
    """The user half in the recompacting mode."""
    return composed_row(context, summary_mode="recompact")


def raising(context: RowContext) -> RowSetup:
    """``overflow_policy="raise"``: uncovered results are kept; a pass that cannot fit raises."""
    return composed_row(context, overflow_policy="raise")
