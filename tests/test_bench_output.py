"""What ``maf-compaction bench`` prints answers the question (issue 18): every finding pinned.

Found as a new user: the output read like a data dump (16 rows in a 170-column table, counter
lines over 250 characters, no verdict); the legend spoke of "the ranking" though none was
printed, and said ``lost unnamed ... must be 0`` beside our own anchored row at 22; a
``--session`` replay without probes showed ``acc 100%`` (the JSON: ``"asked": 0,
"accuracy": 1.0``) for a row that lost most of its facts.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from agent_framework import AgentSession, Content, InMemoryHistoryProvider, Message

from maf_compaction.bench import __main__ as bench_main
from maf_compaction.bench.report import COMPACT_COLUMNS, WIDTH, Verdict, render_table, to_json, verdict
from maf_compaction.bench.rows import ROWS
from maf_compaction.bench.runner import Cell, CellResult, RowSummary, Settings, run_cell, summarize

SMALL = ["--context-window", "8192", "--max-output-tokens", "1024", "--tool-turns", "3", "--markers-per-tool", "4"]
TINY = Settings(context_window=8_192, max_output_tokens=1_024, tool_turns=3, markers_per_tool=4)
ROWS_RUN = "none,context_window,anchored,tool_and_user_summary_anchored"


def run(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = bench_main.main(["bench", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def summary(row: str, cost: float, **changes: Any) -> RowSummary:
    """A row's summary at fill 1.5 that keeps every fact with no DQ, unless ``changes`` say otherwise."""
    base = RowSummary(
        row=row,
        fill=1.5,
        seeds=3,
        cost=cost,
        vs_none=cost / 0.2,
        hit=0.8,
        breaks=3.0,
        max_prompt_share=0.9,
        dq=0,
        dq_seeds=0,
        facts_kept=52.0,
        facts_total=52,
        facts_lost=0.0,
        lost_unnamed=0.0,
        accuracy=1.0,
        model_calls=31.0,
        summarizer_calls=0.0,
        pass_ms_median=0.5,
        pass_ms_max=30.0,
        errors=(),
    )
    return replace(base, **changes)


# -- the verdict ------------------------------------------------------------------------------------


def test_the_verdict_names_the_cheapest_row_that_loses_nothing_and_the_cheapest_overall() -> None:
    rows = [
        summary("none", 0.20, dq=15, dq_seeds=3),
        summary("cheap_but_lossy", 0.10, facts_kept=8.0, accuracy=0.15),
        summary("over_the_window", 0.11, dq=4, dq_seeds=1),
        summary("stopped", 0.12, errors=("seed 2: turn 9: CompactionBudgetExceeded: no room",)),
        summary("keeps_all", 0.15),
        summary("keeps_all_dearer", 0.16),
    ]
    judged = verdict(rows)
    assert (judged.keeps_all, judged.cheapest) == ("keeps_all", "cheap_but_lossy")
    assert judged.lines == (
        "verdict: cheapest with 0 DQ and every fact kept: keeps_all ($0.1500, 0.75x none)",
        "         cheapest overall: cheap_but_lossy ($0.1000, 0.50x none): loses 44 of 52 facts (acc 15%)",
    )
    # A DQ or a stopped cell is what a row loses too; when the cheapest keeps everything, the verdict says so.
    assert "4 call(s) over the window in 1/3 seed(s)" in verdict(rows[2:3]).lines[1]
    assert "stopped early in 1/3 seed(s)" in verdict(rows[3:4]).lines[1]
    assert verdict(rows[4:]).lines[1].strip() == "cheapest overall: the same row"
    assert verdict(rows[:4]).lines[0].endswith("every fact kept: no row")
    unasked = verdict([replace(rows[1], accuracy=None)]).lines[1]  # no probes: no acc to quote
    assert unasked.endswith("loses 44 of 52 facts")


def test_the_command_prints_a_verdict_per_fill_that_agrees_with_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.json"
    argv = [*SMALL, "--fill", "0.9,1.5", "--seeds", "1", "--jobs", "1", "--quiet", "--rows", ROWS_RUN]
    status, out, err = run([*argv, "--json", str(report)], capsys)
    assert status == 0, err
    data = json.loads(report.read_text())
    assert [v["fill"] for v in data["verdicts"]] == [0.9, 1.5]
    for judged in data["verdicts"]:
        rows = [s for s in data["summaries"] if s["fill"] == judged["fill"]]
        whole = [s for s in rows if s["dq"] == 0 and not s["errors"] and s["facts_kept"] >= s["facts_total"]]
        assert judged["keeps_all"] == min(whole, key=lambda s: s["cost"])["row"]
        assert judged["cheapest"] == min(rows, key=lambda s: s["cost"])["row"]
        assert f"  {judged['lines'][0]}\n" in out
        assert f"cheapest with 0 DQ and every fact kept: {judged['keeps_all']} ($" in out


# -- the compact table, and --full ------------------------------------------------------------------


def worst_case_rows() -> list[RowSummary]:
    """Every built-in row with the widest figures a default-grid row can show (3 seeds, stopped, DQs...)."""
    return [
        summary(
            row,
            12.3456,
            vs_none=10.0,
            hit=1.0,
            breaks=100.0,
            max_prompt_share=10.0,
            dq=999,
            dq_seeds=3,
            facts_kept=99.7,
            facts_total=100,
            accuracy=0.997,
            errors=("seed 1: turn 3: CompactionBudgetExceeded: " + "x" * 20,),
        )
        for row in ROWS
    ]


def test_the_default_output_fits_120_columns_with_the_default_grids_rows() -> None:
    rows = worst_case_rows()
    table = render_table([*rows, *(replace(s, fill=3.0) for s in rows)], Settings())
    body = table.split("\nStopped early:", 1)[0]  # what follows quotes each exception as it was raised
    assert max(len(line) for line in body.splitlines()) <= WIDTH
    header = next(line for line in body.splitlines() if line.lstrip().startswith("row "))
    assert re.split(r"\s{2,}", header.strip()) == [title for _, title in COMPACT_COLUMNS]


def test_the_full_table_and_the_counters_are_behind_a_flag_and_in_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.json"
    argv = [*SMALL, "--fill", "1.5", "--seeds", "1", "--jobs", "1", "--quiet", "--rows", ROWS_RUN]
    status, compact, err = run([*argv, "--json", str(report)], capsys)
    assert status == 0, err
    assert max(len(line) for line in compact.splitlines()) <= WIDTH
    header = next(line for line in compact.splitlines() if line.startswith("  row "))
    assert re.split(r"\s{2,}", header.strip()) == [title for _, title in COMPACT_COLUMNS]
    for hidden in ("breaks", "gap closed", "model calls", "pass ms med"):
        assert hidden not in header
    assert "(mean per seed)" not in compact
    assert "lost unnamed" not in compact
    assert "--full: every column (breaks, gap closed, calls, pass ms), each row's counters and lost values" in compact
    status, full, err = run([*argv, "--full"], capsys)
    assert status == 0, err
    for shown in ("gap closed", "model calls", "pass ms med/max", "tool_and_user_summary_anchored (mean per seed)"):
        assert shown in full
    counters = [line for line in full.splitlines() if "(mean per seed)" in line or line.startswith("    ")]
    assert counters
    assert max(len(line) for line in counters) <= WIDTH  # wrapped, not 250 characters
    data = json.loads(report.read_text())
    composed = next(s for s in data["summaries"] if s["row"] == "tool_and_user_summary_anchored")
    assert composed["counters"]["records"] >= 1
    for figure in ("gap_closed", "model_calls", "pass_ms_median", "facts_lost", "lost_unnamed", "lost_cut_in_place"):
        assert figure in composed


# -- acc when nothing was asked ---------------------------------------------------------------------


def session_export(path: Path) -> Path:
    """An ``AgentSession.to_dict()`` export of a short conversation without a probe (the framework's save path)."""
    call = Content.from_function_call(call_id="c1", name="lookup", arguments={"n": 1})
    messages = [
        Message("user", ["Requirement R1 has code RQ-ABC123; look up the first batch."]),
        Message("assistant", [call]),
        Message("tool", [Content.from_function_result(call_id="c1", result="code_1=TL-ABCDEF\n" * 3)]),
        Message("assistant", ["The batch is logged."]),
    ]
    session = AgentSession(session_id="s")
    provider = InMemoryHistoryProvider("in_memory")
    asyncio.run(provider.save_messages(session.session_id, messages, state=session.state.setdefault("in_memory", {})))
    path.write_text(json.dumps(session.to_dict()))
    return path


def test_acc_is_a_dash_and_null_when_nothing_was_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exported, report = session_export(tmp_path / "session.json"), tmp_path / "r.json"
    argv = ["--session", str(exported), "--rows", "none,anchored", "--jobs", "1", "--quiet", "--json", str(report)]
    status, out, err = run(argv, capsys)
    assert status == 0, err
    rows = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line.startswith(("  none", "  anch"))]
    assert [cells[-1] for cells in rows] == ["-", "-"]
    data = json.loads(report.read_text())
    assert [(c["asked"], c["accuracy"]) for c in data["cells"]] == [(0, None), (0, None)]
    assert [s["accuracy"] for s in data["summaries"]] == [None, None]


def test_a_summary_averages_accuracy_over_the_seeds_that_asked() -> None:
    asked = CellResult(row="r", fill=1.0, seed=1, window=8_192, asked=4, correct=3)
    silent = CellResult(row="r", fill=1.0, seed=2, window=8_192)
    assert (asked.accuracy, silent.accuracy) == (0.75, None)
    assert summarize([asked, silent])[0].accuracy == 0.75
    assert summarize([silent])[0].accuracy is None


# -- the legend is true for every row ---------------------------------------------------------------


_CELLS: dict[str, CellResult] = {}


def cell(row: str) -> CellResult:
    if row not in _CELLS:
        _CELLS[row] = asyncio.run(run_cell(Cell(row, 1.5, 1), TINY))
    return _CELLS[row]


def test_the_legend_says_what_lost_unnamed_counts_and_when_it_is_by_design() -> None:
    summaries = summarize([cell("none"), cell("anchored"), cell("context_window")])
    for full in (False, True):
        legend = render_table(summaries, TINY, full=full)
        assert "ranking" not in legend
        assert "must be 0" not in legend
    legend = " ".join(render_table(summaries, TINY, full=True).split())
    assert "lost unnamed: of those, values no maf_compaction WARNING named a carrying message of, by id" in legend
    assert "cut in place: of those, values cut from the middle of a tool result the anchored rules shortened" in legend
    assert "a row with a DQ is never the verdict's first pick" in legend


def test_the_anchored_rows_unnamed_losses_are_exactly_the_values_cut_in_place() -> None:
    """What the legend says of a non-zero ``lost unnamed`` beside an anchored row holds on a run."""
    anchored = cell("anchored")
    assert anchored.lost_unnamed > 0, "the anchored row must shorten a result in place here"
    assert anchored.lost_cut_in_place == anchored.lost_unnamed
    assert all(fact.cut_in_place for fact in anchored.lost if not fact.named)
    framework = cell("context_window")
    assert framework.facts_lost > 0
    assert (framework.lost_unnamed, framework.lost_cut_in_place) == (framework.facts_lost, 0)
    data = json.loads(to_json([anchored], summarize([anchored]), TINY, 1.0))
    assert data["summaries"][0]["lost_cut_in_place"] == anchored.lost_cut_in_place
    assert any(fact["cut_in_place"] for fact in data["cells"][0]["lost"])


def test_verdicts_are_in_the_json() -> None:
    cells = [cell("none"), cell("anchored")]
    data = json.loads(to_json(cells, summarize(cells), TINY, 1.0))
    assert data["verdicts"] == [
        {
            "fill": 1.5,
            "keeps_all": None,
            "cheapest": verdict(summarize(cells)).cheapest,
            "lines": list(verdict(summarize(cells)).lines),
        }
    ]
    assert isinstance(verdict(summarize(cells)), Verdict)


def test_the_legend_speaks_of_stopped_cells_only_when_one_stopped() -> None:
    rows = [summary("none", 0.2), summary("anchored", 0.18)]
    assert "(stopped)" not in render_table(rows, Settings())
    stopped = [*rows, summary("tool_and_user_summary_anchored_raise", 0.1, errors=("seed 1: turn 9: boom",))]
    shown = render_table(stopped, Settings())
    assert "(stopped): a cell ended early" in shown
    assert "Stopped early:" in shown
