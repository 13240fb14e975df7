"""The bench tables in README.md and docs/bench.md are generated, and the committed ones are current.

``make docs`` (``python -m maf_compaction.bench docs --write``) rewrites every region marked
``<!-- bench:NAME -->...<!-- /bench -->`` from pinned bench runs. The first test makes those
runs with the current code and fails when a committed document differs from what the
command would write, so a change to a strategy that moves a figure also moves the docs.
It regenerates; it never compares against numbers written here.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from maf_compaction.bench import docs
from maf_compaction.bench.docs import (
    REGIONS,
    RUNS,
    WIRE_ROWS,
    Across,
    DocsError,
    Region,
    Run,
    regions_in,
    render_documents,
    rewrite,
)
from maf_compaction.bench.report import render_table
from maf_compaction.bench.runner import RowSummary, Settings, run_grid, summarize

ROOT = Path(__file__).resolve().parents[1]
TINY = Run(
    Settings(context_window=8_192, max_output_tokens=1_024, tool_turns=3, markers_per_tool=4),
    ("none", "anchored"),
    fills=(0.9, 1.5),
    command="python -m maf_compaction.bench --context-window 8192 ...",
)


def test_the_committed_docs_are_what_make_docs_writes() -> None:
    """Measured times aside (``make docs`` measures them; a check cannot repeat them)."""
    wanted = render_documents(ROOT, jobs=min(os.cpu_count() or 1, 8))
    assert set(wanted) == {ROOT / name for name in docs.DOCUMENTS}
    for path, generated in wanted.items():
        committed, text = docs.without_timings(path.read_text(encoding="utf-8")), docs.without_timings(generated)
        diff = "".join(difflib.unified_diff(committed.splitlines(True), text.splitlines(True), str(path), "generated"))
        assert committed == text, f"{path.name} is stale: run `make docs`\n{diff[:4000]}"


def test_every_generated_region_is_used_and_marked() -> None:
    """README carries the short tables, every workload's and When to use it; docs/bench.md the plausible model
    beside the oracle, where the cost goes, the full default grid and the user-heavy workload; each strategy's page
    its own rows (the composition's under both cache rules; the records page the payoff share's, per workload);
    the wire page the real clients'; Claude's page its own client's."""
    found = {name: regions_in((ROOT / name).read_text(encoding="utf-8"), name) for name in docs.DOCUMENTS}
    assert found == {
        "README.md": [
            "readme",
            "readme-free-tool-choice",
            "readme-anthropic",
            "readme-workloads",
            "readme-workloads-anthropic",
            "when",
        ],
        "docs/bench.md": ["models", "spend", "demo", "user-heavy"],
        "docs/records.md": ["payoff", "net-ignore-pin", "net-ignore-instruction", "net-record-quality", "records"],
        "docs/user-summaries.md": ["user-modes"],
        "docs/composition.md": ["composition", "composition-free-tool-choice", "composition-anthropic"],
        "docs/wire-cache.md": ["wire"],
        "docs/claude.md": ["claude"],
    }
    assert {name for names in found.values() for name in names} == set(REGIONS)


def test_the_pinned_demo_run_is_make_demos_grid_at_seed_1() -> None:
    """The docs' default grid is what ``make demo`` runs (every row, fills 0.9, 1.5, 3.0), at one seed."""
    from maf_compaction.bench import grid
    from maf_compaction.bench.rows import ROWS

    demo = RUNS["demo"]
    args = grid.parser().parse_args([])
    assert demo.settings == grid.settings_from(args)
    assert list(demo.fills) == args.fill
    assert demo.rows == tuple(ROWS)
    assert demo.seeds == (1,)
    assert demo.cells() == grid.cells_for(grid.parser().parse_args(["--seeds", "1"]), demo.settings)
    # The grid whose size and time the prose quotes is ``make demo``'s own (all seeds), and holds the demo run.
    assert docs.DEMO_GRID.settings == demo.settings
    assert docs.DEMO_GRID.cells() == grid.cells_for(args, demo.settings)
    assert set(demo.cells()) <= set(docs.DEMO_GRID.cells())


def test_the_prose_quotes_no_typed_cell_counts_or_timings() -> None:
    """Issue 18: docs/bench.md said "117 cells; about 40 s" long after both had changed. Cell counts and times now
    appear only inside generated regions, and the demo region's first line gives ``make demo``'s size and time."""
    for name in ("README.md", "docs/bench.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        prose = re.sub(r"<!-- bench:.*?<!-- /bench -->", "", text, flags=re.DOTALL)
        assert not re.search(r"\b\d[\d,]* cells\b", prose), f"{name} types a cell count outside a generated region"
        assert not re.search(r"\b(about|in) \d+(\.\d+)? ?s\b", prose), f"{name} types a time outside a region"
    bench = (ROOT / "docs" / "bench.md").read_text(encoding="utf-8")
    region = bench.split("<!-- bench:demo -->\n", 1)[1]
    first = region.splitlines()[0]
    cells = len(docs.DEMO_GRID.cells())
    assert first.startswith(f"`make demo` (`python -m maf_compaction.bench`) runs {cells} cells")
    took = re.search(r"<!-- timing -->(.*?)<!-- /timing -->", first)
    assert took is not None
    assert re.fullmatch(r"\d+\.\d s with \d+ worker\(s\)", took.group(1)), "make docs measured the time"


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """The generator reads a tiny pinned run (a few cells at an 8K window) instead of the real ones."""
    monkeypatch.setattr(docs, "RUNS", {"demo": TINY})
    monkeypatch.setattr(docs, "REGIONS", {"demo": Region("demo", docs.render_demo)})
    monkeypatch.setattr(docs, "DEMO_GRID", Run(TINY.settings, TINY.rows, TINY.fills, (1, 2), TINY.command))


def checkout(tmp_path: Path, bench_text: str) -> Path:
    (tmp_path / "docs").mkdir()
    for name in docs.DOCUMENTS:
        (tmp_path / name).write_text("# a document\n\nno regions here\n", encoding="utf-8")
    (tmp_path / "docs" / "bench.md").write_text(bench_text, encoding="utf-8")
    return tmp_path


STALE = "# bench\n\nBefore.\n\n<!-- bench:demo -->\n| old | table |\n<!-- /bench -->\n\nAfter, by hand.\n"


@pytest.mark.usefixtures("tiny")
def test_check_fails_on_stale_docs_and_write_fixes_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = checkout(tmp_path, STALE)
    assert docs.main(["--root", str(root), "--jobs", "1"]) == 1
    captured = capsys.readouterr()
    assert "-| old | table |" in captured.out  # the diff
    assert "1 document(s) differ from the bench: run `make docs`" in captured.err
    assert docs.main(["--root", str(root), "--jobs", "1", "--write"]) == 0
    written = (root / "docs" / "bench.md").read_text(encoding="utf-8")
    assert written.startswith("# bench\n\nBefore.\n\n<!-- bench:demo -->\n")
    assert written.endswith("<!-- /bench -->\n\nAfter, by hand.\n")  # text outside the markers is kept
    assert "| old | table |" not in written
    took = re.search(r"<!-- timing -->(\d+\.\d) s with 1 worker\(s\)<!-- /timing -->", written)
    assert took is not None, "--write measures the time of the timed grid"
    assert "runs 8 cells (2 rows x 2 fills x 2 seeds)" in written
    assert docs.main(["--root", str(root), "--jobs", "1"]) == 0
    assert "the documents match the bench" in capsys.readouterr().out
    # Another time alone is no change: the check ignores it, and --write leaves the file as it is.
    other = written.replace(took.group(0), docs.timing("999.9 s with 7 worker(s)"))
    (root / "docs" / "bench.md").write_text(other, encoding="utf-8")
    assert docs.main(["--root", str(root), "--jobs", "1"]) == 0
    assert docs.main(["--root", str(root), "--jobs", "1", "--write"]) == 0
    assert (root / "docs" / "bench.md").read_text(encoding="utf-8") == other


@pytest.mark.usefixtures("tiny")
def test_the_demo_region_shows_the_terminal_tables_figures(tmp_path: Path) -> None:
    """Each generated row carries the same strings ``maf-compaction bench`` prints (timings aside)."""
    root = checkout(tmp_path, STALE)
    written = render_documents(root)[root / "docs" / "bench.md"]
    terminal = render_table(summarize(run_grid(TINY.cells(), TINY.settings)), TINY.settings, full=True)
    shown = 0
    for line in terminal.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] in TINY.rows:
            assert "| " + " | ".join(cells[:-1]) + " |" in written  # every column but pass ms
            shown += 1
    assert shown == len(TINY.rows) * len(TINY.fills)
    verdicts = [line[2:] for line in terminal.splitlines() if line.startswith(("  verdict:", "           "))]
    assert sum(line.startswith("verdict:") for line in verdicts) == len(TINY.fills)
    assert all(f"\n    {line}\n" in written for line in verdicts)  # a code block of the lines the terminal shows
    assert "4 cells (generated by `make docs`" in written


def test_markers_are_checked() -> None:
    with pytest.raises(DocsError, match="unknown region 'nope'"):
        regions_in("<!-- bench:nope -->\nx\n<!-- /bench -->\n", "f.md")
    with pytest.raises(DocsError, match="has no '<!-- /bench -->' after it"):
        regions_in("<!-- bench:demo -->\nx\n", "f.md")
    text = "a\n<!-- bench:demo note -->\nold\n<!-- /bench -->\nb\n<!-- bench:demo -->\n<!-- /bench -->\n"
    assert regions_in(text, "f.md") == ["demo", "demo"]
    assert (
        rewrite(text, {"demo": "new\n"})
        == "a\n<!-- bench:demo note -->\nnew\n<!-- /bench -->\nb\n<!-- bench:demo -->\nnew\n<!-- /bench -->\n"
    )


def test_not_a_checkout_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert docs.main(["--root", str(tmp_path)]) == 2
    assert "is not a checkout: no README.md, docs/bench.md, docs/records.md, docs/user-summaries.md" in (
        capsys.readouterr().err
    )


def test_a_region_across_runs_renders_each_run_side_by_side(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The wire table reads one run per real client over the loopback server and tabulates them together."""
    wire = {
        client: Run(replace(TINY.settings, client=client), WIRE_ROWS, fills=(1.5,), command=f"... --client {client}")
        for client in ("openai-responses", "openai-chat")
    }
    monkeypatch.setattr(docs, "RUNS", wire)
    monkeypatch.setattr(docs, "REGIONS", {"wire": Across(tuple(wire), docs.render_wire)})
    root = checkout(tmp_path, "# bench\n\n<!-- bench:wire -->\n<!-- /bench -->\n")
    text = render_documents(root, documents=("docs/bench.md",))[root / "docs" / "bench.md"]
    rows = [line for line in text.splitlines() if line.startswith(("| Responses", "| Chat"))]
    assert len(rows) == 2 * (len(WIRE_ROWS) - 1), text  # the control is what the others are priced against
    assert all(re.search(r"\| \d+\.\d\dx, \d+/\d+", row) for row in rows), text
    assert "8 cells" in text  # two runs of four rows at one fill, seed 1


def _summary(row: str, cost: float, facts: float, *, dq: int = 0) -> RowSummary:
    return RowSummary(
        row=row, fill=1.5, seeds=1, cost=cost, vs_none=None, hit=0.8, breaks=0, max_prompt_share=0.9, dq=dq,
        dq_seeds=int(dq > 0), facts_kept=facts, facts_total=52, facts_lost=52 - facts, lost_unnamed=0,
        accuracy=None, model_calls=30, summarizer_calls=0, pass_ms_median=None, pass_ms_max=None, errors=(),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("none", "default", "anchored", "ours", "says"),
    [
        # (cost, facts kept, calls over the window) per row.
        # Below the window: not compacting keeps every fact for less.
        ((0.10, 52, 0), (0.09, 25, 0), (0.10, 30, 0), (0.12, 52, 0), "no compaction"),
        # Past it (the control over the window): the composition is cheaper and keeps more.
        ((0.20, 52, 5), (0.17, 16, 0), (0.19, 14, 0), (0.15, 52, 0), "cheaper than the framework's default, 36 more"),
        # It keeps more facts, for more money: the table says how much more.
        ((0.20, 52, 5), (0.10, 16, 0), (0.12, 14, 0), (0.15, 52, 0), "36 more fact(s) kept for 1.50x the default's"),
        # It keeps no more than the better of the others and costs more: the framework's default.
        ((0.20, 52, 5), (0.10, 20, 0), (0.12, 30, 0), (0.15, 30, 0), "the framework's default"),
    ],
)
def test_when_to_use_it_reads_the_choice_from_the_measurement(
    none: tuple[float, int, int],
    default: tuple[float, int, int],
    anchored: tuple[float, int, int],
    ours: tuple[float, int, int],
    says: str,
) -> None:
    rows = dict(zip(docs.WORKLOAD_ROWS, (none, default, anchored, ours), strict=True))
    table = {row: _summary(row, cost, facts, dq=dq) for row, (cost, facts, dq) in rows.items()}
    assert says in docs._choice(table)  # pyright: ignore[reportPrivateUsage]
