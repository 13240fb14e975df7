"""``maf-compaction docs``: the bench tables of the README and docs/, regenerated from pinned runs.

Each ``<!-- bench:NAME -->`` ... ``<!-- /bench -->`` region is rendered by :data:`REGIONS` from
one of the :data:`RUNS` (seed 1), or side by side from several (:class:`Across`: the wire table,
one run per real client and cache rule); ``--write`` rewrites them, without it the command checks them
and exits 1 naming what differs (``tests/test_docs.py``).

The figures the prose quotes come from here too: the demo region opens with the size of
``make demo``'s grid (:data:`DEMO_GRID`) and the time ``--write`` measured running it. A time
sits between ``<!-- timing -->`` and ``<!-- /timing -->``; the check ignores what is between
them (a time is never the same twice), and ``--write`` leaves alone a document whose only
change would be its time.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from .args import positive_int, program_name
from .breaks import DOC_ROWS
from .provider import CacheKind
from .report import _cells, columns_for, row_figures, verdict, vs_none  # pyright: ignore[reportPrivateUsage]
from .rows import ROWS
from .runner import SPEND, AnthropicCacheMode, Cell, CellResult, RowSummary, Settings, run_batches, run_grid, summarize

#: The documents whose regions the command maintains, relative to the repository root.
DOCUMENTS: Final = (
    "README.md",
    "docs/bench.md",
    "docs/records.md",
    "docs/user-summaries.md",
    "docs/composition.md",
    "docs/wire-cache.md",
    "docs/claude.md",
)
_REGION = re.compile(
    r"(<!-- bench:(?P<name>[A-Za-z0-9_-]+)(?P<note>[^>]*?)-->\n)(?P<body>.*?)(<!-- /bench -->)", re.DOTALL
)
_OPEN = re.compile(r"<!-- bench:(?P<name>[A-Za-z0-9_-]+)")
_DEFAULT_FILLS: Final = (0.9, 1.5, 3.0)
USER_HEAVY_ROWS: Final = (
    "none",
    "context_window",
    "summarization",
    "anchored",
    "tool_summary_anchored",
    "user_summary_anchored",
    "user_summary_anchored_boundary",
    "user_summary_anchored_fold",
    "tool_and_user_summary_anchored",
    "tool_and_user_summary_anchored_pinned",
    "tool_and_user_summary_anchored_recompact",
)


#: The rows the composition's page compares: the control, the framework's default, both halves alone and composed.
COMPOSITION_ROWS: Final = (
    "none",
    "context_window",
    "tool_summary_anchored",
    "tool_summary_anchored_pinned",
    "user_summary_anchored_boundary",
    "tool_and_user_summary_anchored",
    "tool_and_user_summary_anchored_pinned",
    "tool_and_user_summary_anchored_recompact",
)


#: The rows the safety net's tables compare: the control, the framework's default, our record rows in both
#: request shapes (over the cached prefix, the README's wiring; pinned): the rows docs/wire-cache.md tabulates.
NET_ROWS: Final = DOC_ROWS
_NET_FILLS: Final = (1.5, 3.0)


@dataclass(frozen=True, slots=True)
class Run:
    """A pinned bench run: settings, rows, fills and seeds, and the command line that makes it."""

    settings: Settings
    rows: tuple[str, ...]
    fills: tuple[float, ...] = _DEFAULT_FILLS
    seeds: tuple[int, ...] = (1,)
    command: str = "python -m maf_compaction.bench --seeds 1"

    def cells(self) -> list[Cell]:
        """The run's grid, in the order ``maf-compaction bench`` builds it."""
        return [Cell(row, fill, seed) for fill in self.fills for seed in self.seeds for row in self.rows]


#: The rows the wire table compares: the control, the framework's default and the composition in both shapes.
WIRE_ROWS: Final = ("none", "context_window", "tool_and_user_summary_anchored", "tool_and_user_summary_anchored_pinned")
_WIRE_CACHES: Final[tuple[tuple[CacheKind, str], ...]] = (
    ("openai", "default"),
    ("openai-free-tool-choice", "default"),
    ("anthropic", "anthropic-5m"),
)
#: One run per real client and cache rule, over the loopback server: the README's figures on the wire.
WIRE_RUNS: Final[Mapping[str, Run]] = {
    f"wire-{client}-{cache}": Run(
        Settings(cache=cache, profile=profile, client=client),
        WIRE_ROWS,
        command=f"python -m maf_compaction.bench --seeds 1 --client {client} --cache {cache} "
        f"--rows {','.join(WIRE_ROWS)}",
    )
    for client in ("openai-responses", "openai-chat")
    for cache, profile in _WIRE_CACHES
}

#: Claude through agent-framework-anthropic's client: the control, the framework's default and the composition.
CLAUDE_ROWS: Final = ("none", "context_window", "tool_and_user_summary_anchored")
_CLAUDE_SEEDS: Final = (1, 2, 3)
#: Per thinking mode: ``ours`` (automatic caching on every row, and ``cache_breakpoints`` on the client, which marks
#: the requests our passes precede), ``auto`` (the composition with automatic caching alone) and ``none`` (the
#: control with no cache_control at all: what the framework sends by default).
_CLAUDE_CACHES: Final[Mapping[AnthropicCacheMode, tuple[str, ...]]] = {
    "ours": CLAUDE_ROWS,
    "auto": ("tool_and_user_summary_anchored",),
    "none": ("none",),
}
CLAUDE_RUNS: Final[Mapping[str, Run]] = {
    f"claude-{cache}{'-thinking' if thinking else ''}": Run(
        Settings(
            cache="anthropic", profile="anthropic-5m", client="anthropic", anthropic_cache=cache, thinking=thinking
        ),
        rows,
        seeds=_CLAUDE_SEEDS,
        command=f"python -m maf_compaction.bench --client anthropic --anthropic-cache {cache}"
        f"{' --thinking' if thinking else ''} --rows {','.join(rows)}",
    )
    for thinking in (False, True)
    for cache, rows in _CLAUDE_CACHES.items()
}

#: The rows the workload tables compare: the control, the framework's default, anchored trimming, the composition.
WORKLOAD_ROWS: Final = ("none", "context_window", "anchored", "tool_and_user_summary_anchored")
_WORKLOAD_CACHES: Final[tuple[tuple[CacheKind, str], ...]] = (("openai", "default"), ("anthropic", "anthropic-5m"))
#: The workloads beside the default one (``--results``), under each cache rule the README tabulates.
WORKLOAD_RUNS: Final[Mapping[str, Run]] = {
    f"{results}{'' if cache == 'openai' else '-' + cache}": Run(
        Settings(results=results, cache=cache, profile=profile),
        WORKLOAD_ROWS,
        command=f"python -m maf_compaction.bench --seeds 1 --results {results}"
        f"{'' if cache == 'openai' else ' --cache ' + cache} --rows {','.join(WORKLOAD_ROWS)}",
    )
    for results in ("dense", "stdlib")
    for cache, profile in _WORKLOAD_CACHES
}
#: The rows the payoff table compares: the control, the framework's default, and the README's composition with its
#: ``record_payoff_share`` and asking for every record.
PAYOFF_ROWS: Final = (
    "none",
    "context_window",
    "tool_and_user_summary_anchored",
    "tool_and_user_summary_anchored_ungated",
)
#: The value-dense workloads under the payoff rows (the default workload's are in the demo run, which has every row).
PAYOFF_RUNS: Final[Mapping[str, Run]] = {
    f"payoff-{results}": Run(
        Settings(results=results),
        PAYOFF_ROWS,
        command=f"python -m maf_compaction.bench --seeds 1 --results {results} --rows {','.join(PAYOFF_ROWS)}",
    )
    for results in ("dense", "stdlib")
}
#: The rows the model comparison shows under both models.
MODEL_ROWS: Final = (*WORKLOAD_ROWS, "tool_and_user_summary_anchored_pinned")

RUNS: Final[Mapping[str, Run]] = {
    "demo": Run(Settings(), tuple(ROWS)),
    "oracle": Run(
        Settings(model="oracle"),
        MODEL_ROWS,
        command=f"python -m maf_compaction.bench --seeds 1 --model oracle --rows {','.join(MODEL_ROWS)}",
    ),
    **WORKLOAD_RUNS,
    **PAYOFF_RUNS,
    "user-heavy": Run(
        Settings(tool_share=0.2),
        USER_HEAVY_ROWS,
        command=f"python -m maf_compaction.bench --seeds 1 --tool-share 0.2 --rows {','.join(USER_HEAVY_ROWS)}",
    ),
    "free-tool-choice": Run(
        Settings(cache="openai-free-tool-choice"),
        COMPOSITION_ROWS,
        command="python -m maf_compaction.bench --seeds 1 --cache openai-free-tool-choice "
        f"--rows {','.join(COMPOSITION_ROWS)}",
    ),
    "ignore-pin": Run(
        Settings(ignore_pin=True),
        NET_ROWS,
        fills=_NET_FILLS,
        command=f"python -m maf_compaction.bench --seeds 1 --fill 1.5,3.0 --ignore-pin --rows {','.join(NET_ROWS)}",
    ),
    "ignore-instruction": Run(
        Settings(ignore_instruction=True),
        NET_ROWS,
        fills=_NET_FILLS,
        command="python -m maf_compaction.bench --seeds 1 --fill 1.5,3.0 --ignore-instruction "
        f"--rows {','.join(NET_ROWS)}",
    ),
    "record-quality-0.5": Run(
        Settings(record_quality=0.5),
        NET_ROWS,
        fills=_NET_FILLS,
        command="python -m maf_compaction.bench --seeds 1 --fill 1.5,3.0 --record-quality 0.5 "
        f"--rows {','.join(NET_ROWS)}",
    ),
    "anthropic": Run(
        Settings(cache="anthropic", profile="anthropic-5m"),
        (*COMPOSITION_ROWS, "anchored"),
        command="python -m maf_compaction.bench --seeds 1 --cache anthropic "
        f"--rows {','.join((*COMPOSITION_ROWS, 'anchored'))}",
    ),
    **WIRE_RUNS,
    **CLAUDE_RUNS,
}


#: ``make demo``'s grid (``python -m maf_compaction.bench``: every row, fills 0.9, 1.5, 3.0, seeds 1-3); the demo
#: region's run is its seed 1, and ``--write`` times the whole grid for the prose.
DEMO_GRID: Final = Run(Settings(), tuple(ROWS), seeds=(1, 2, 3), command="python -m maf_compaction.bench")
#: Marks a measured time in a document: the check ignores what is between the markers.
TIMING_OPEN: Final = "<!-- timing -->"
TIMING_CLOSE: Final = "<!-- /timing -->"
_TIMING = re.compile(re.escape(TIMING_OPEN) + ".*?" + re.escape(TIMING_CLOSE), re.DOTALL)
#: What stands for the time when none was measured (a check).
UNTIMED: Final = "not measured"


def timing(text: str) -> str:
    """``text`` between the timing markers."""
    return f"{TIMING_OPEN}{text}{TIMING_CLOSE}"


def without_timings(text: str) -> str:
    """``text`` with every measured time blanked: what the check compares."""
    return _TIMING.sub(timing("..."), text)


@dataclass(frozen=True, slots=True)
class Timed:
    """A grid ``--write`` ran and timed: its wall time and its worker processes."""

    seconds: float
    jobs: int


@dataclass(frozen=True, slots=True)
class Region:
    """A kind of marked region: the run it reads and how it renders that run's summaries."""

    run: str
    render: Callable[[Run, Sequence[RowSummary]], str]
    doc: str = field(default="")

    @property
    def runs(self) -> tuple[str, ...]:
        """The runs the region reads."""
        return (self.run,)


@dataclass(frozen=True, slots=True)
class Across:
    """A region over several runs (the same rows under other settings), rendered side by side."""

    runs: tuple[str, ...]
    render: Callable[[Sequence[tuple[Run, Sequence[RowSummary]]]], str]
    doc: str = field(default="")


def _by_fill(summaries: Sequence[RowSummary]) -> dict[float, dict[str, RowSummary]]:
    table: dict[float, dict[str, RowSummary]] = {}
    for summary in summaries:
        table.setdefault(summary.fill, {})[summary.row] = summary
    return table


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _source_line(run: Run, what: str = "") -> str:
    cells = len(run.cells())
    return f"{what}`{run.command}`, {cells} cells (generated by `make docs`; do not edit by hand):"


def demo_grid_line(timed: Timed | None) -> str:
    """The generated sentence on ``make demo``'s grid: its cells, and how long ``make docs`` took to run it."""
    cells = len(DEMO_GRID.cells())
    took = UNTIMED if timed is None else f"{timed.seconds:.1f} s with {timed.jobs} worker(s)"
    return (
        f"`make demo` (`{DEMO_GRID.command}`) runs {cells} cells ({len(DEMO_GRID.rows)} rows x "
        f"{len(DEMO_GRID.fills)} fills x {len(DEMO_GRID.seeds)} seeds); when `make docs` last ran that grid, it took "
        f"{timing(took)}."
    )


def render_demo(run: Run, summaries: Sequence[RowSummary], timed: Timed | None = None) -> str:
    """The verdict and the full table ``--full`` prints, per fill, without the pass timings (one seed).

    ``timed`` is how long ``make demo``'s grid took when ``make docs --write`` ran it.
    """
    keys = [(key, title) for key, title in columns_for(run.settings, full=True) if key != "pass"]
    lines = [demo_grid_line(timed), "", _source_line(run), ""]
    for fill, rows in _by_fill(summaries).items():
        lines.append(
            f"Fill {fill:.1f} (a conversation of {fill:g}x the {run.settings.context_window:,}-token window), "
            f"seed {', '.join(map(str, run.seeds))}, budget {run.settings.budget:,}:"
        )
        lines.append("")
        lines += [f"    {line}" for line in verdict(list(rows.values())).lines]  # a code block, as printed
        lines.append("")
        table = [[_cells(s)[key] for key, _ in keys] for s in rows.values()]
        lines += _markdown([title for _, title in keys], table)
        figures = [(s.row, row_figures(s)) for s in rows.values()]
        if any(shown for _, shown in figures):
            lines.append("")
        lines += [f"- `{row}`: {shown}" for row, shown in figures if shown]
        lines.append("")
    return "\n".join(lines)


_README_ROWS: Final = {
    "none": "no compaction",
    "context_window": "framework default (`context_window`)",
    "anchored": "`AnchoredCompactionStrategy`",
    "tool_summary_anchored": "`ToolResultAnchoredSummarizationCompactionStrategy`, over the cached prefix",
    "tool_summary_anchored_pinned": "the same, records pinned",
    "tool_and_user_summary_anchored": "`ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy`, over the "
    "cached prefix",
    "tool_and_user_summary_anchored_pinned": "the same, records pinned, summaries to the summarizer",
}
#: The payoff table's rows (:func:`render_payoff`).
_PAYOFF_NAMES: Final = {
    "context_window": _README_ROWS["context_window"],
    "tool_and_user_summary_anchored": "the README's composition (`record_payoff_share=0.2`)",
    "tool_and_user_summary_anchored_ungated": "the same, a record asked for every tool group (`None`)",
}


def render_readme(run: Run, summaries: Sequence[RowSummary]) -> str:
    """The README's short table: five rows, cost against the control, hit share, facts, disqualifications."""
    table = _by_fill(summaries)
    fills = list(table)
    header = [
        "row",
        *(f"fill {f:.1f}: cost vs none, hit%, facts kept" if i == 0 else f"fill {f:.1f}" for i, f in enumerate(fills)),
    ]
    rows: list[list[str]] = []
    for row, label in _README_ROWS.items():
        if row not in table[fills[0]]:
            continue
        cells = [label]
        for fill in fills:
            s = table[fill][row]
            vs = vs_none(s)
            dq = ", **disqualified**" if s.dq else ""
            cells.append(f"{vs}, {s.hit * 100:.1f}%, {s.facts_kept:g}/{s.facts_total}{dq}")
        rows.append(cells)
    intro = _source_line(
        run, f"`{run.settings.cache}` cache rule, seed 1, {run.settings.context_window:,}-token window, "
    )
    return "\n".join([intro, "", *_markdown(header, rows), ""])


def render_user_heavy(run: Run, summaries: Sequence[RowSummary]) -> str:
    """The user-heavy workload: cost against the control, hit share, facts, DQ and summarizer calls."""
    table = _by_fill(summaries)
    fills = list(table)
    header = ["row", *(f"fill {f:.1f}: vs none, hit%, facts, DQ, summarizer calls" for f in fills)]
    rows: list[list[str]] = []
    for row in run.rows:
        cells = [f"`{row}`"]
        for fill in fills:
            s = table[fill][row]
            vs = vs_none(s)
            cells.append(
                f"{vs}, {s.hit * 100:.1f}%, {s.facts_kept:g}/{s.facts_total}, {s.dq} DQ, {s.summarizer_calls:g}"
            )
        rows.append(cells)
    return "\n".join([_source_line(run), "", *_markdown(header, rows), ""])


def _dq(summary: RowSummary) -> str:
    return "0" if not summary.dq else f"{summary.dq} in {summary.dq_seeds}/{summary.seeds} seed(s)"


def render_records(run: Run, summaries: Sequence[RowSummary]) -> str:
    """The record row (``tool_summary_anchored``) of the default grid, one line per fill."""
    table = _by_fill(summaries)
    header = ["fill", "cost vs none", "hit%", "breaks", "max/window", "DQ", "facts kept", "records", "model calls"]
    rows: list[list[str]] = []
    for fill, by_row in table.items():
        s, control = by_row["tool_summary_anchored"], by_row["none"]
        rows.append(
            [
                f"{fill:.1f}",
                vs_none(s),
                f"{s.hit * 100:.1f}%",
                f"{s.breaks:g}",
                f"{s.max_prompt_share:.2f}",
                _dq(s),
                f"{s.facts_kept:g}/{s.facts_total}",
                f"{s.counters.get('records', 0):g}",
                f"{s.model_calls:g} (none: {control.model_calls:g})",
            ]
        )
    return "\n".join([_source_line(run, "Row `tool_summary_anchored` of "), "", *_markdown(header, rows), ""])


def render_safety_net(run: Run, summaries: Sequence[RowSummary]) -> str:
    """Our record rows beside the framework's default when the model does not write complete records."""
    header = ["fill", "row", "cost vs none", "hit%", "max/window", "DQ", "facts kept"]
    rows: list[list[str]] = []
    for fill, by_row in _by_fill(summaries).items():
        for name in run.rows[1:]:
            s = by_row[name]
            vs = vs_none(s)
            cells = [f"{s.hit * 100:.1f}%", f"{s.max_prompt_share:.2f}", _dq(s), f"{s.facts_kept:g}/{s.facts_total}"]
            rows.append([f"{fill:.1f}", f"`{name}`", vs, *cells])
    return "\n".join([_source_line(run), "", *_markdown(header, rows), ""])


_MODES: Final = {
    "user_summary_anchored": "`recompact`",
    "user_summary_anchored_boundary": "`boundary`",
    "user_summary_anchored_fold": "`fold`",
}


def render_user_modes(run: Run, summaries: Sequence[RowSummary]) -> str:
    """The user-turn strategy's three modes on the user-heavy workload, past the window."""
    table = _by_fill(summaries)
    fills = [fill for fill in table if fill > 1]
    header = ["mode"]
    for fill in fills:
        header += [f"fill {fill:.1f}: vs none, hit%, DQ, facts", "summarizer calls, standing, replays"]
    rows: list[list[str]] = []
    for row, label in _MODES.items():
        cells = [label]
        for fill in fills:
            s = table[fill][row]
            vs = vs_none(s)
            cells.append(f"{vs}, {s.hit * 100:.1f}%, {s.dq}, {s.facts_kept:g}/{s.facts_total}")
            standing, replays = s.counters.get("standing", 0), s.counters.get("replayed", 0)
            cells.append(f"{s.summarizer_calls:g}, {standing:g}, {replays:g}")
        rows.append(cells)
    return "\n".join([_source_line(run, "The user-turn rows of "), "", *_markdown(header, rows), ""])


def _split(summary: RowSummary, control: RowSummary) -> str:
    """The pinned record calls' and the summarizer calls' share of a row's cost, against the control's cost."""
    if not control.cost or not (summary.pinned_cost or summary.summarizer_cost):
        return "-"
    return f"{summary.pinned_cost / control.cost:.2f}x, {summary.summarizer_cost / control.cost:.2f}x"


def render_composition(run: Run, summaries: Sequence[RowSummary]) -> str:
    """The composition against the control, the framework's default and each half alone, per fill, with the floor."""
    table = _by_fill(summaries)
    header = ["fill", "row", "cost vs none", "of it: pinned records, summarizer", "gap closed", "hit%", "breaks"]
    header += ["max/window", "DQ", "facts kept", "model calls", "summarizer calls"]
    rows: list[list[str]] = []
    for fill, by_row in table.items():
        for row in COMPOSITION_ROWS:
            s = by_row.get(row)
            if s is None:
                continue
            rows.append(
                [
                    f"{fill:.1f}",
                    f"`{row}`",
                    vs_none(s),
                    _split(s, by_row["none"]),
                    "-" if s.gap_closed is None or row == "none" else f"{s.gap_closed * 100:.0f}%",
                    f"{s.hit * 100:.1f}%",
                    f"{s.breaks:g}",
                    f"{s.max_prompt_share:.2f}",
                    _dq(s),
                    f"{s.facts_kept:g}/{s.facts_total}",
                    f"{s.model_calls:g}",
                    f"{s.summarizer_calls:g}",
                ]
            )
        floor = by_row["none"].floor
        if floor is not None:
            control = by_row["none"].cost
            rows.append([f"{fill:.1f}", "floor", f"{floor / control:.2f}x", "", "100%", *[""] * 7])
    return "\n".join([_source_line(run, f"{run.settings.cache} cache rules, "), "", *_markdown(header, rows), ""])


_CLIENT_NAMES: Final = {"openai-responses": "Responses", "openai-chat": "Chat Completions"}


def render_wire(runs: Sequence[tuple[Run, Sequence[RowSummary]]]) -> str:
    """The composition in both request shapes against the framework's default, per real client and cache rule."""
    fills = list(_by_fill(runs[0][1]))
    header = ["client", "cache rule", "row", *(f"fill {f:.1f}: cost vs none, facts kept" for f in fills)]
    rows: list[list[str]] = []
    for run, summaries in runs:
        table = _by_fill(summaries)
        for row in WIRE_ROWS[1:]:
            cells = [_CLIENT_NAMES[run.settings.client], f"`{run.settings.cache}`", _README_ROWS[row]]
            for fill in fills:
                s = table[fill][row]
                vs = vs_none(s)
                cells.append(f"{vs}, {s.facts_kept:g}/{s.facts_total}{', **disqualified**' if s.dq else ''}")
            rows.append(cells)
    first = runs[0][0]
    intro = (
        f"Seed 1, {first.settings.context_window:,}-token window, the real `agent-framework-openai` clients against "
        f"the loopback server, {sum(len(run.cells()) for run, _ in runs)} cells, one run per client and rule "
        f"(`python -m maf_compaction.bench --seeds 1 --client CLIENT --cache RULE --rows {','.join(WIRE_ROWS)}`; "
        "generated by `make docs`; do not edit by hand):"
    )
    return "\n".join([intro, "", *_markdown(header, rows), ""])


_CLAUDE_LABELS: Final = {
    ("none", "none"): "no compaction, no `cache_control` (the framework's default request)",
    ("none", "ours"): "no compaction, automatic caching (the control)",
    ("context_window", "ours"): "`ContextWindowCompactionStrategy`, automatic caching",
    ("tool_and_user_summary_anchored", "auto"): "the composition, automatic caching",
    ("tool_and_user_summary_anchored", "ours"): "the composition, automatic caching and `cache_breakpoints`",
}


def render_claude(runs: Sequence[tuple[Run, Sequence[RowSummary]]]) -> str:
    """Claude's rows side by side, with and without extended thinking: dollars per conversation (mean over the
    seeds), the ratio to the control (automatic caching, no compaction), facts kept and requests refused."""
    fills = list(_by_fill(runs[0][1]))
    header = ["thinking", "row", *(f"fill {f:.1f}: $ (vs control), facts, refused" for f in fills)]
    rows: list[list[str]] = []
    for thinking in (False, True):
        mine = [(run, _by_fill(summaries)) for run, summaries in runs if run.settings.thinking == thinking]
        control = next(table for run, table in mine if run.settings.anthropic_cache == "ours")
        for (row, cache), label in _CLAUDE_LABELS.items():
            table = next(table for run, table in mine if run.settings.anthropic_cache == cache)
            cells = ["on" if thinking else "off", label]
            for fill in fills:
                s, base = table[fill][row], control[fill]["none"]
                dq = ", **disqualified**" if s.dq else ""
                ratio = s.cost / base.cost
                cells.append(f"${s.cost:.4f} ({ratio:.2f}x), {s.facts_kept:g}/{s.facts_total}, {s.rejected:g}{dq}")
            rows.append(cells)
    first = runs[0][0]
    intro = (
        f"Seeds {first.seeds[0]}-{first.seeds[-1]}, {first.settings.context_window:,}-token window, "
        "agent-framework-anthropic's `AnthropicClient` against the Anthropic loopback (`claude-sonnet-4-6`: "
        f"2,048-token minimum, 5-minute writes at 1.25x, reads at 0.1x), {sum(len(run.cells()) for run, _ in runs)} "
        "cells (`python -m maf_compaction.bench --client anthropic --anthropic-cache CACHE [--thinking] --rows ROWS`; "
        "generated by `make docs`; do not edit by hand). Dollars are per conversation, the mean over the seeds; "
        "refused: requests the loopback answered with Anthropic's 400, per conversation:"
    )
    return "\n".join([intro, "", *_markdown(header, rows), ""])


_WORKLOAD_NAMES: Final = {
    "synthetic": "generated logs with planted codes (the default)",
    "dense": "number-dense logs (`--results dense`)",
    "stdlib": "reads of the standard library (`--results stdlib`)",
}


def _cell(summary: RowSummary) -> str:
    dq = ", **disqualified**" if summary.dq else ""
    return f"{vs_none(summary)}, {summary.facts_kept:g}/{summary.facts_total}{dq}"


def render_workloads(runs: Sequence[tuple[Run, Sequence[RowSummary]]]) -> str:
    """Per workload: the control, the framework's default, anchored trimming and the composition, per fill; then
    the verdicts (the cheapest row that keeps every fact with no call over the window, and the cheapest row)."""
    fills = list(_by_fill(runs[0][1]))
    header = ["workload", "row", *(f"fill {f:.1f}: cost vs none, facts kept" for f in fills)]
    rows: list[list[str]] = []
    verdicts: list[str] = []
    for run, summaries in runs:
        table = _by_fill(summaries)
        name = _WORKLOAD_NAMES[run.settings.results]
        for row in WORKLOAD_ROWS:
            rows.append([name, _README_ROWS[row], *(_cell(table[fill][row]) for fill in fills)])
        for fill in fills:
            judged = verdict([table[fill][row] for row in WORKLOAD_ROWS])
            keeps = f"`{judged.keeps_all}` ({vs_none(table[fill][judged.keeps_all])})" if judged.keeps_all else "none"
            cheapest = table[fill][judged.cheapest]
            lost = cheapest.facts_total - cheapest.facts_kept
            loses = f", loses {lost:g} of {cheapest.facts_total} facts" if lost else ""
            overall = (
                "the same"
                if judged.cheapest == judged.keeps_all
                else f"`{judged.cheapest}` ({vs_none(cheapest)}{loses}{', disqualified' if cheapest.dq else ''})"
            )
            verdicts.append(f"- {name}, fill {fill:.1f}: keeps every fact: {keeps}; cheapest: {overall}.")
    first = runs[0][0]
    intro = (
        f"`{first.settings.cache}` cache rule, seed 1, {first.settings.context_window:,}-token window, "
        f"{sum(len(run.cells()) for run, _ in runs)} cells, one run per workload "
        f"(`python -m maf_compaction.bench --seeds 1 --results RESULTS"
        f"{'' if first.settings.cache == 'openai' else ' --cache ' + first.settings.cache}"
        f" --rows {','.join(WORKLOAD_ROWS)}`; generated by `make docs`; do not edit by hand):"
    )
    return "\n".join([intro, "", *_markdown(header, rows), "", *verdicts, ""])


def _choice(table: Mapping[str, RowSummary]) -> str:
    """What to use at one fill of one workload and cache rule, read from the measurement (see :func:`render_when`)."""
    none, default, anchored, ours = (table[row] for row in WORKLOAD_ROWS)
    if not none.dq and none.cost <= ours.cost:
        return "no compaction: it fits the window and keeps every fact for less than the composition"
    more = ours.facts_kept - max(default.facts_kept, anchored.facts_kept)
    if ours.cost <= default.cost and more >= 0:
        return f"the composition: cheaper than the framework's default, {more:g} more fact(s) kept"
    if more > 0:
        ratio = ours.cost / default.cost
        return f"the composition if the facts matter: {more:g} more fact(s) kept for {ratio:.2f}x the default's cost"
    return "the framework's default: the composition keeps no more facts"


def render_when(runs: Sequence[tuple[Run, Sequence[RowSummary]]]) -> str:
    """Per workload and cache rule, at each fill: the composition's cost against the framework's default and the
    anchored strategy, the facts each keeps, and which to use by those figures (:func:`_choice`)."""
    header = [
        "workload",
        "cache rule",
        "fill",
        "composition vs default",
        "composition vs anchored",
        "facts kept: composition / default / anchored",
        "use",
    ]
    rows: list[list[str]] = []
    for run, summaries in runs:
        for fill, table in _by_fill(summaries).items():
            _, default, anchored, ours = (table[row] for row in WORKLOAD_ROWS)
            rows.append(
                [
                    _WORKLOAD_NAMES[run.settings.results],
                    run.settings.cache,
                    f"{fill:.1f}",
                    f"{ours.cost / default.cost:.2f}x",
                    f"{ours.cost / anchored.cost:.2f}x",
                    f"{ours.facts_kept:g} / {default.facts_kept:g} / {anchored.facts_kept:g} of {ours.facts_total}",
                    _choice(table),
                ]
            )
    intro = (
        "Seed 1, 32,000-token window, the plausible model; the same runs as the workload tables above (generated by "
        "`make docs`; do not edit by hand). Costs are ratios of dollars in one run: the composition "
        "(`ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy`, over the cached prefix) against "
        "`ContextWindowCompactionStrategy` (the framework's default) and `AnchoredCompactionStrategy`:"
    )
    return "\n".join([intro, "", *_markdown(header, rows), ""])


def render_models(runs: Sequence[tuple[Run, Sequence[RowSummary]]]) -> str:
    """The same rows under the plausible model and the oracle, side by side: what honest writing costs."""
    (plausible_run, plausible), (oracle_run, oracle) = runs
    fills = list(_by_fill(oracle))
    header = ["row", *(f"fill {f:.1f}: plausible, oracle" for f in fills)]
    mine, theirs = _by_fill(plausible), _by_fill(oracle)
    rows = [
        [_README_ROWS[row], *(f"{_cell(mine[fill][row])}; {_cell(theirs[fill][row])}" for fill in fills)]
        for row in MODEL_ROWS
    ]
    intro = (
        f"Seed 1, `{plausible_run.settings.cache}` cache rule, cost vs none and facts kept under each model "
        f"(`{plausible_run.command}` and `{oracle_run.command}`; generated by `make docs`; do not edit by hand):"
    )
    return "\n".join([intro, "", *_markdown(header, rows), ""])


def render_payoff(runs: Sequence[tuple[Run, Sequence[RowSummary]]]) -> str:
    """Per workload: the framework's default, and the README's composition with its payoff share and asking for
    every record, per fill (cost against the control, facts kept)."""
    fills = list(_by_fill(runs[0][1]))
    header = ["workload", "row", *(f"fill {f:.1f}: cost vs none, facts kept" for f in fills)]
    rows = [
        [_WORKLOAD_NAMES[run.settings.results], _PAYOFF_NAMES[row], *(_cell(table[fill][row]) for fill in fills)]
        for run, summaries in runs
        for table in [_by_fill(summaries)]
        for row in PAYOFF_ROWS[1:]
    ]
    intro = (
        "`openai` cache rule, seed 1 (`python -m maf_compaction.bench --seeds 1 [--results dense|stdlib] "
        f"--rows {','.join(PAYOFF_ROWS)}`; generated by `make docs`; do not edit by hand):"
    )
    return "\n".join([intro, "", *_markdown(header, rows), ""])


def render_spend(run: Run, summaries: Sequence[RowSummary]) -> str:
    """Where the cost of the control, the framework's default and the composition goes, per fill (shares of the
    control's cost)."""
    header = ["fill", "row", "cost vs none", *SPEND]
    rows: list[list[str]] = []
    for fill, by_row in _by_fill(summaries).items():
        control = by_row["none"].cost or 1.0
        for row in ("none", "context_window", "tool_and_user_summary_anchored"):
            s = by_row[row]
            rows.append(
                [f"{fill:.1f}", f"`{row}`", vs_none(s), *(f"{s.spend.get(part, 0.0) / control:.3f}" for part in SPEND)]
            )
    intro = _source_line(run, "Each part as a share of the control's cost (`expiry` is part of the others), ")
    return "\n".join([intro, "", *_markdown(header, rows), ""])


REGIONS: Final[Mapping[str, Region | Across]] = {
    "claude": Across(
        tuple(CLAUDE_RUNS),
        render_claude,
        "docs/claude.md: Claude through AnthropicClient, with and without thinking and cache_breakpoints",
    ),
    "wire": Across(
        tuple(WIRE_RUNS),
        render_wire,
        "docs/wire-cache.md: the composition's request shapes through both real clients, every cache rule",
    ),
    "demo": Region(
        "demo", render_demo, "docs/bench.md: make demo's size and time; per fill, the verdict and every column"
    ),
    "readme": Region("demo", render_readme, "README.md: five rows of the default grid, openai rule"),
    "readme-free-tool-choice": Region(
        "free-tool-choice", render_readme, "README.md: the same rows, openai-free-tool-choice rule"
    ),
    "readme-anthropic": Region("anthropic", render_readme, "README.md: the same rows, anthropic rule"),
    "readme-workloads": Across(
        ("demo", "dense", "stdlib"), render_workloads, "README.md: every workload, openai rule, with verdicts"
    ),
    "readme-workloads-anthropic": Across(
        ("anthropic", "dense-anthropic", "stdlib-anthropic"),
        render_workloads,
        "README.md: every workload, anthropic rule, with verdicts",
    ),
    "when": Across(
        ("demo", "dense", "stdlib", "anthropic", "dense-anthropic", "stdlib-anthropic"),
        render_when,
        "README.md, When to use it: per workload and cache rule, the composition against the default and anchored",
    ),
    "models": Across(("demo", "oracle"), render_models, "docs/bench.md: the plausible model beside the oracle"),
    "spend": Region("demo", render_spend, "docs/bench.md: where the cost goes, per fill"),
    "user-heavy": Region("user-heavy", render_user_heavy, "docs/bench.md: the user-heavy workload"),
    "records": Region("demo", render_records, "docs/records.md: the record row of the default grid"),
    "payoff": Across(
        ("demo", "payoff-dense", "payoff-stdlib"),
        render_payoff,
        "docs/records.md: the composition with its payoff share and asking for every record, per workload",
    ),
    "user-modes": Region("user-heavy", render_user_modes, "docs/user-summaries.md: the three modes, user-heavy"),
    "composition": Region("demo", render_composition, "docs/composition.md: the composition on the default grid"),
    "composition-free-tool-choice": Region(
        "free-tool-choice",
        render_composition,
        "docs/composition.md: the composition when tool_choice does not key the cache",
    ),
    "composition-anthropic": Region(
        "anthropic", render_composition, "docs/composition.md: the composition under Anthropic's cache rules"
    ),
    "net-ignore-pin": Region("ignore-pin", render_safety_net, "docs/records.md: a model that ignores every pin"),
    "net-ignore-instruction": Region(
        "ignore-instruction",
        render_safety_net,
        "docs/records.md: a model that ignores every instruction asked over the cached prefix",
    ),
    "net-record-quality": Region(
        "record-quality-0.5", render_safety_net, "docs/records.md: records that quote half the values"
    ),
}


class DocsError(ValueError):
    """A document's regions are malformed or name an unknown region (the message names the file)."""


def regions_in(text: str, where: str) -> list[str]:
    """The region names ``text`` marks, in order; refuses unknown names and unclosed markers."""
    names = [m.group("name") for m in _REGION.finditer(text)]
    opened = [m.group("name") for m in _OPEN.finditer(text)]
    if opened != names:
        raise DocsError(f"{where}: a '<!-- bench:NAME -->' marker has no '<!-- /bench -->' after it")
    for name in names:
        if name not in REGIONS:
            raise DocsError(f"{where}: unknown region {name!r}; known: {', '.join(REGIONS)}")
    return names


def rewrite(text: str, rendered: Mapping[str, str]) -> str:
    """``text`` with each region's body replaced by its rendering."""

    def body(match: re.Match[str]) -> str:
        return match.group(1) + rendered[match.group("name")] + match.group(5)

    return _REGION.sub(body, text)


def _within(run: Run, grid: Run) -> bool:
    """``run``'s cells are cells of ``grid``, under the same settings (so ``grid``'s results can stand for them)."""
    return run.settings == grid.settings and set(run.cells()) <= set(grid.cells())


def render_documents(
    root: Path, *, jobs: int = 1, documents: Sequence[str] = DOCUMENTS, timed: bool = False
) -> dict[Path, str]:
    """What every document under ``root`` should contain: each marked region regenerated.

    Each run the regions read is made once (``jobs`` worker processes). With ``timed`` (what
    ``--write`` does), ``make demo``'s whole grid runs first, alone and timed, and the demo
    run's cells are taken from it (a cell's figures do not depend on the grid around it);
    without, the time reads "not measured" (:func:`without_timings` makes the two compare equal).
    """
    texts = {root / name: (root / name).read_text(encoding="utf-8") for name in documents}
    names = {name for path, text in texts.items() for name in regions_in(text, str(path))}
    needed = sorted({run for name in names for run in REGIONS[name].runs})
    made: dict[str, list[CellResult]] = {}
    took: Timed | None = None
    demo = RUNS.get("demo")
    if timed and demo is not None and "demo" in needed and _within(demo, DEMO_GRID):
        started = time.perf_counter()
        whole = run_grid(DEMO_GRID.cells(), DEMO_GRID.settings, jobs=jobs)
        took = Timed(time.perf_counter() - started, jobs)
        wanted = set(demo.cells())
        made["demo"] = [r for r in whole if Cell(r.row, r.fill, r.seed) in wanted]
    rest = [run for run in needed if run not in made]
    batches = [(RUNS[run].cells(), RUNS[run].settings) for run in rest]
    made.update(zip(rest, run_batches(batches, jobs=jobs), strict=True))
    summaries = {run: summarize(results) for run, results in made.items()}
    rendered: dict[str, str] = {}
    for name in names:
        region = REGIONS[name]
        if isinstance(region, Across):
            rendered[name] = region.render([(RUNS[run], summaries[run]) for run in region.runs])
            continue
        run = RUNS[region.run]
        if region.render is render_demo:
            rendered[name] = render_demo(run, summaries[region.run], took)
        else:
            rendered[name] = region.render(run, summaries[region.run])
    return {path: rewrite(text, rendered) for path, text in texts.items()}


def parser() -> argparse.ArgumentParser:
    """The command line."""
    cli = argparse.ArgumentParser(
        prog=f"{program_name()} docs",
        description="Regenerate the bench tables in README.md and docs/ from pinned bench runs "
        "(check them without --write).",
        epilog="regions:\n" + "\n".join(f"  {name:<11} {region.doc}" for name, region in REGIONS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cli.add_argument("--write", action="store_true", help="rewrite the regions in place (default: check only)")
    cli.add_argument("--root", default=".", help="the repository checkout (default: the current directory)")
    cli.add_argument("--jobs", type=positive_int, default=min(os.cpu_count() or 1, 8), help="worker processes")
    return cli


def main(argv: Sequence[str] | None = None) -> int:
    """Check (or with ``--write``, rewrite) the generated regions; returns the exit status."""
    cli = parser()
    args = cli.parse_args(argv)
    root = Path(args.root)
    missing = [name for name in DOCUMENTS if not (root / name).is_file()]
    if missing:
        print(f"{cli.prog}: error: {root.resolve()} is not a checkout: no {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        wanted = render_documents(root, jobs=args.jobs, timed=args.write)
    except DocsError as error:
        print(f"{cli.prog}: error: {error}", file=sys.stderr)
        return 2
    stale = [
        path
        for path, text in wanted.items()
        if without_timings(path.read_text(encoding="utf-8")) != without_timings(text)
    ]
    for path in stale:
        if args.write:
            path.write_text(wanted[path], encoding="utf-8")
            print(f"rewrote {path}")
        else:
            old = path.read_text(encoding="utf-8").splitlines(keepends=True)
            sys.stdout.writelines(
                difflib.unified_diff(old, wanted[path].splitlines(keepends=True), str(path), "generated")
            )
    if stale and not args.write:
        print(f"{cli.prog}: {len(stale)} document(s) differ from the bench: run `make docs`", file=sys.stderr)
        return 1
    if not stale:
        print("the documents match the bench")
    return 0
