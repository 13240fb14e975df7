"""A benchmark row: the record strategy that drops a tool group only when a record quotes every value.

    maf-compaction bench --strategy strict=docs.examples.strict_records:make --rows none,tool_summary_anchored,strict

(run from the repository root, so ``docs.examples`` imports; or copy this file into your own package).
"""

from __future__ import annotations

from maf_compaction.bench.rows import RowContext, RowSetup, record_row


def make(context: RowContext) -> RowSetup:
    """``tool_summary_anchored`` with ``coverage_share=1.0``."""
    return record_row(context, coverage_share=1.0)
