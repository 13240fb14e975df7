"""A benchmark row: the record strategy that drops a tool group only when a record quotes every value.

A record that misses a value leaves its group in the prompt, held, so a new record is
asked for after every new tool group (``min_groups_before_repeat=1``): each asks the
model again, and the union of the records completes the groups.

    maf-compaction bench --strategy strict=docs.examples.strict_records:make --rows none,tool_summary_anchored,strict

(run from the repository root, so ``docs.examples`` imports; or copy this file into your own package).
"""

from __future__ import annotations

from maf_compaction.bench.rows import RowContext, RowSetup, record_row


def make(context: RowContext) -> RowSetup:
    """``tool_summary_anchored`` with ``coverage_share=1.0`` and ``min_groups_before_repeat=1``."""
    return record_row(context, coverage_share=1.0, min_groups_before_repeat=1)
