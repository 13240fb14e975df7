"""The floor line and the share of the gap to it each row closes (issue 12, item 5)."""

from __future__ import annotations

import pytest

from maf_compaction.bench.provider import CallRecord
from maf_compaction.bench.report import render_table
from maf_compaction.bench.runner import CellResult, Settings, _floor, summarize  # pyright: ignore[reportPrivateUsage]
from maf_compaction.bench.simulator import get_profile


def call(kind: str, tokens: int, output: int) -> CallRecord:
    return CallRecord(kind, 1, tokens, 0, 0, output, 0.0, False, False)  # type: ignore[arg-type]


def test_the_floor_is_each_model_calls_new_input_and_its_output_alone() -> None:
    profile = get_profile("default")
    calls = [call("model", 1_000, 10), call("summarizer", 5_000, 99), call("model", 1_500, 20), call("model", 1_200, 5)]
    # New input: 1,000, then 500, then nothing (the prompt shrank); summarizer calls are a strategy's own cost.
    expected = (1_500 * profile.input + 35 * profile.output) / 1_000_000
    assert _floor(profile, calls) == pytest.approx(expected)


def test_the_gap_closed_is_none_minus_row_over_none_minus_floor() -> None:
    cells = [
        CellResult(row="none", fill=1.5, seed=1, cost=1.0, floor=0.2, window=1, facts_total=1),
        CellResult(row="mine", fill=1.5, seed=1, cost=0.6, floor=0.0, window=1, facts_total=1),
    ]
    summaries = {s.row: s for s in summarize(cells)}
    assert summaries["mine"].gap_closed == pytest.approx(0.5)
    assert summaries["mine"].floor == pytest.approx(0.2)  # the control's floor, for every row
    table = render_table(list(summaries.values()), Settings(), full=True)  # gap closed: a --full column
    assert "floor" in table
    assert "0.2000" in table
    assert "50%" in table
