"""The benchmark's output: the results table, the JSON file and the optional plot."""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..core.extras import install_hint
from .provider import CACHE_RULES
from .runner import CellResult, RowSummary, Settings

#: Every column (``--full``, and the tables of docs/bench.md): key, title.
COLUMNS = (
    ("row", "row"),
    ("cost", "cost $"),
    ("vs", "vs none"),
    ("gap", "gap closed"),
    ("hit", "hit%"),
    ("breaks", "breaks"),
    ("max", "max/window"),
    ("dq", "DQ (seeds)"),
    ("facts", "facts kept"),
    ("acc", "acc"),
    ("calls", "model calls"),
    ("summ", "summarizer"),
    ("pass", "pass ms med/max"),
    ("rejected", "rejected"),
)
#: The default table's columns: what a choice needs, within :data:`WIDTH` with the default grid's rows.
COMPACT_COLUMNS = tuple(
    (key, title) for key, title in COLUMNS if key in ("row", "cost", "vs", "hit", "max", "dq", "facts", "acc")
)
#: The columns only ``--client anthropic`` fills (its loopback refuses invalid requests).
ANTHROPIC_ONLY = frozenset({"rejected"})
#: The terminal width the default output keeps to (every line, the default grid's rows included).
WIDTH = 120

_LEGEND = (
    "cost $: dollars over every call, summarizer calls included; vs none: per-seed ratio to the control's cost;",
    "floor: the cost of each call's new input and its output alone (from the control): no row costs less;",
    "hit%: cached / input tokens;",
    "max/window: largest prompt / window; DQ (seeds): calls over the window, which a real provider would refuse",
    "  (and in how many seeds); a row with a DQ is never the verdict's first pick;",
    "facts kept: planted values in the final prompt (records and summaries count), of those planted;",
    'acc: share of the probes\' expected values the model quoted ("-": the workload asks none);',
)
#: Said only when a cell stopped.
_STOPPED = "(stopped): a cell ended early (below); its figures cover the turns before the stop."
_FULL_LEGEND = (
    "breaks: model calls whose prompt does not extend the previous one (a compaction event, to the cache);",
    "gap closed: share of the distance from the control to the floor a row closes, (none - row) / (none - floor);",
    "model calls, summarizer: calls by kind; pass ms: median and slowest compaction pass;",
    "facts lost: values the conversation gave that the final prompt lacks; lost unnamed: of those, values no",
    "  maf_compaction WARNING named a carrying message of, by id; cut in place: of those, values cut from the",
    "  middle of a tool result the anchored rules shortened in place (the message stays in the prompt with a",
    "  removal marker, which is the notice: by design). Other unnamed losses had no WARNING: all the framework's",
    "  strategies' losses, and a value a user-turn summary leaves out (it links its turns at INFO).",
    "cost goes to: the agent's own calls (task input, task output), compaction requests (compaction input: what",
    "  they re-read; instructions; compaction output: records and summaries), reasoning on every call, and of all",
    "  of it what cache entries that expired during a user's think time added.",
)
_MORE = (
    "--full: every column (breaks, gap closed, calls, pass ms), each row's counters and lost values;",
    "--json FILE: every figure of every cell, and the verdicts.",
)


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.0f}%"


def vs_none(summary: RowSummary) -> str:
    """A row's cost against the control, as every table prints it (``-`` for a cell without one)."""
    return "-" if summary.vs_none is None else f"{summary.vs_none:.2f}x"


def _cells(summary: RowSummary) -> dict[str, str]:
    median = "-" if summary.pass_ms_median is None else f"{summary.pass_ms_median:.1f}"
    worst = "-" if summary.pass_ms_max is None else f"{summary.pass_ms_max:.1f}"
    dq = "0" if not summary.dq else f"{summary.dq} ({summary.dq_seeds}/{summary.seeds})"
    return {
        "row": summary.row + (" (stopped)" if summary.errors else ""),
        "cost": f"{summary.cost:.4f}",
        "vs": vs_none(summary),
        "gap": "-" if summary.gap_closed is None or summary.row == "none" else f"{summary.gap_closed * 100:.0f}%",
        "hit": f"{summary.hit * 100:.1f}",
        "breaks": f"{summary.breaks:.1f}",
        "max": f"{summary.max_prompt_share:.2f}",
        "dq": dq,
        "facts": f"{summary.facts_kept:.1f}/{summary.facts_total}",
        "acc": _percent(summary.accuracy),
        "calls": f"{summary.model_calls:.1f}",
        "summ": f"{summary.summarizer_calls:.1f}",
        "pass": f"{median}/{worst}",
        "rejected": f"{summary.rejected:g}",
    }


def row_figures(summary: RowSummary) -> str:
    """The line under the full table for a row: its own counters, then what it lost ("" when neither applies).

    ``facts lost``, ``lost unnamed`` and ``cut in place`` (see :class:`~.runner.CellResult`)
    follow the counters of every row that has counters or lost a value.
    """
    shown = [f"{name.replace('_', ' ')} {value:g}" for name, value in summary.counters.items()]
    if summary.counters or summary.facts_lost:
        shown += [
            f"facts lost {summary.facts_lost:g}",
            f"lost unnamed {summary.lost_unnamed:g}",
            f"cut in place {summary.lost_cut_in_place:g}",
        ]
    return ", ".join(shown)


def spend_line(summary: RowSummary) -> str:
    """Where a row's cost goes (mean per seed): each part with its share of the cost, then its compaction requests."""
    total = summary.cost or 1.0
    parts = [
        f"{name} ${value:.4f} ({value / total:.0%})"
        for name, value in summary.spend.items()
        if value and name != "expiry"
    ]
    expiry = summary.spend.get("expiry", 0.0)
    if expiry:
        parts.append(f"of which expired cache ${expiry:.4f} ({expiry / total:.0%})")
    asked = ", ".join(f"{kind} {count:g}" for kind, count in sorted(summary.requests.items()))
    return "; ".join(parts) + (f"; compaction requests: {asked}" if asked else "")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one fill's rows answer: the cheapest row that loses nothing, and the cheapest row at all.

    Attributes:
        fill: The fill (1.0 for a file workload).
        keeps_all: The cheapest row with no call over the window, no stopped cell and every
            planted value kept in every seed; ``None`` when no row qualifies.
        cheapest: The cheapest row, whatever it loses.
        lines: The verdict as the table prints it.
    """

    fill: float
    keeps_all: str | None
    cheapest: str
    lines: tuple[str, ...]


def _keeps_all(summary: RowSummary) -> bool:
    return not summary.dq and not summary.errors and summary.facts_kept >= summary.facts_total


def _price(summary: RowSummary) -> str:
    ratio = "" if summary.vs_none is None else f", {summary.vs_none:.2f}x none"
    return f"${summary.cost:.4f}{ratio}"


def _losses(summary: RowSummary) -> str:
    lost: list[str] = []
    if summary.facts_kept < summary.facts_total:
        missing = summary.facts_total - summary.facts_kept
        answered = "" if summary.accuracy is None else f" (acc {_percent(summary.accuracy)})"
        lost.append(f"loses {missing:.3g} of {summary.facts_total} facts{answered}")
    if summary.dq:
        lost.append(f"{summary.dq} call(s) over the window in {summary.dq_seeds}/{summary.seeds} seed(s)")
    if summary.errors:
        lost.append(f"stopped early in {len(summary.errors)}/{summary.seeds} seed(s)")
    return "; ".join(lost) if lost else "keeps every fact"


def verdict(rows: Sequence[RowSummary]) -> Verdict:
    """The verdict on one fill's rows (in grid order; the first of equal costs wins)."""
    cheapest = min(rows, key=lambda s: s.cost)
    safe = [s for s in rows if _keeps_all(s)]
    best = min(safe, key=lambda s: s.cost) if safe else None
    head = "verdict: cheapest with 0 DQ and every fact kept: "
    first = f"{head}{best.row} ({_price(best)})" if best else f"{head}no row"
    if best is cheapest:
        second = "cheapest overall: the same row"
    else:
        second = f"cheapest overall: {cheapest.row} ({_price(cheapest)}): {_losses(cheapest)}"
    lines = [
        *textwrap.wrap(first, WIDTH - 2, subsequent_indent="  "),
        *textwrap.wrap(second, WIDTH - 2, initial_indent=" " * 9, subsequent_indent=" " * 11),
    ]
    return Verdict(rows[0].fill, best.row if best else None, cheapest.row, tuple(lines))


def verdicts(summaries: Sequence[RowSummary]) -> list[Verdict]:
    """One :func:`verdict` per fill, in fill order."""
    return [verdict([s for s in summaries if s.fill == fill]) for fill in sorted({s.fill for s in summaries})]


def describe_workload(settings: Settings, workload: str | None, fill: float) -> str:
    """``workload 'name' (file) at a`` for a file workload, ``fill F x`` for the generated one."""
    source = settings.workload or settings.session
    if not source:
        return f"fill {fill:g} x"
    kind = "workload" if settings.workload else "session"
    return f"{kind} {workload!r} ({source}) at a" if workload else f"{kind} {source} at a"


def table_lines(
    rows: Sequence[RowSummary], columns: Sequence[tuple[str, str]], *, floor: float | None = None
) -> list[str]:
    """The aligned table of ``rows`` with ``columns`` (names left, figures right), a rule under the titles.

    ``floor`` (dollars) adds the floor line under the rows, its figure under ``cost $``.
    """
    table = [[title for _, title in columns], *([_cells(s)[key] for key, _ in columns] for s in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    lines: list[str] = []
    for index, row in enumerate(table):
        cells = [row[0].ljust(widths[0]), *(cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True))]
        lines.append("  " + "  ".join(cells))
        if index == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    if floor is not None:
        cost = f"{floor:.4f}".rjust(widths[1])
        lines.append(f"  {'floor'.ljust(widths[0])}  {cost}  (each call's new input and its output alone)")
    return lines


def refusal_lines(summary: RowSummary) -> list[str]:
    """One paragraph per validation rule that refused a row's requests: the mean count per seed and a message."""
    lines: list[str] = []
    for rule, count in summary.rejections.items():
        text = f"{summary.row} refused ({rule}, {count:g} per seed): {summary.rejection_messages.get(rule, '')}"
        lines += textwrap.wrap(text, WIDTH, initial_indent="  ", subsequent_indent="    ")
    return lines


def rule_line(settings: Settings) -> str:
    """The cache rule a run priced by, and the client that sent its requests."""
    if settings.client == "anthropic":
        automatic = {
            "auto": "request-level automatic cache_control",
            "ours": "request-level automatic cache_control and cache_breakpoints on the client",
            "none": "no cache_control",
        }[settings.anthropic_cache]
        thinking = "extended thinking on" if settings.thinking else "thinking off"
        return (
            f"cache rule: the Anthropic wire (anthropic client over the loopback, {automatic}, {thinking}): "
            "each request is validated as Anthropic documents (rejected: answered with a 400) and priced from the "
            "cache_control marks it carries (at most 4, 20-block lookback, minimum length, 5m/1h writes at 1.25x/2x, "
            "reads at 0.1x)."
        )
    client = "in process" if settings.client == "inprocess" else f"{settings.client} client over the loopback"
    return f"cache rule {settings.cache} ({client}): {CACHE_RULES[settings.cache]}."


def columns_for(settings: Settings, *, full: bool) -> tuple[tuple[str, str], ...]:
    """The table's columns: every one (``full``) or the compact ones, ``rejected`` only for ``--client anthropic``."""
    chosen = COLUMNS if full else (*COMPACT_COLUMNS, ("rejected", "rejected"))
    return tuple((k, t) for k, t in chosen if settings.client == "anthropic" or k not in ANTHROPIC_ONLY)


def render_table(
    summaries: Sequence[RowSummary], settings: Settings, *, workload: str | None = None, full: bool = False
) -> str:
    """Per fill: the settings, the verdict and the table (rows in grid order, averaged over seeds); then a legend.

    The default table has the columns a choice needs (:data:`COMPACT_COLUMNS`) and every line
    fits :data:`WIDTH`; ``full`` prints every column, each row's counters and lost values, and
    the legend of those. ``workload`` is a file workload's name.
    """
    lines = textwrap.wrap(rule_line(settings), WIDTH, subsequent_indent="  ")
    lines.append("")
    by_fill = {v.fill: v for v in verdicts(summaries)}
    for fill, judged in by_fill.items():
        rows = [s for s in summaries if s.fill == fill]
        seeds = max(s.seeds for s in rows)
        what = describe_workload(settings, workload, fill)
        lines.append(
            f"{what} {settings.context_window:,}-token window, {seeds} seed(s), "
            f"{settings.cache} cache, '{settings.profile}' prices, budget {settings.budget:,}"
        )
        lines += [f"  {line}" for line in judged.lines]
        floor = next((s.floor for s in rows if s.row == "none" and s.floor is not None), None)
        lines += table_lines(rows, columns_for(settings, full=full), floor=floor)
        if full:
            for summary in rows:
                shown = row_figures(summary)
                if shown:
                    text = f"{summary.row} (mean per seed): {shown}"
                    lines += textwrap.wrap(text, WIDTH, initial_indent="  ", subsequent_indent="    ")
                text = f"{summary.row} cost goes to: {spend_line(summary)}"
                lines += textwrap.wrap(text, WIDTH, initial_indent="  ", subsequent_indent="    ")
        for summary in rows:
            lines += refusal_lines(summary)
        lines.append("")
    errors = [f"  {s.row} (fill {s.fill:g}) {e}" for s in summaries for e in s.errors]
    lines += [*_LEGEND, *([_STOPPED] if errors else []), *(_FULL_LEGEND if full else _MORE)]
    if errors:
        lines += ["", "Stopped early:", *errors]
    return "\n".join(lines)


def to_json(
    results: Sequence[CellResult],
    summaries: Sequence[RowSummary],
    settings: Settings,
    seconds: float,
    *,
    workload: str | None = None,
) -> str:
    """Every figure: the workload, the settings, the per-(fill, row) summaries and every cell."""
    source = settings.workload or settings.session
    payload: dict[str, Any] = {
        "workload": {
            "name": workload if workload is not None else ("generated" if source is None else None),
            "kind": "workload" if settings.workload else "session" if settings.session else "generated",
            "file": source,
        },
        "settings": {**asdict(settings), "budget": settings.budget, "cache_rule": CACHE_RULES[settings.cache]},
        "seconds": seconds,
        "summaries": [asdict(s) for s in summaries],
        "verdicts": [asdict(v) for v in verdicts(summaries)],
        "cells": [r.to_dict() for r in results],
    }
    return json.dumps(payload, indent=2, sort_keys=True)


def plot(results: Sequence[CellResult], path: str | Path, settings: Settings, *, workload: str | None = None) -> None:
    """Prompt size, cached tokens and the window per model call, one panel per (fill, row).

    Every panel shares one y axis (so rows compare at a glance) and shows the first seed
    of its (fill, row), which the title names with the settings. Needs matplotlib
    (the ``plot`` extra: ``pip install '.[plot]'`` in a checkout).
    """
    try:
        import matplotlib  # noqa: PLC0415 - an optional extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
        from matplotlib.ticker import FuncFormatter  # noqa: PLC0415
    except ImportError:  # pragma: no cover - depends on the optional extra; the command checks first
        raise RuntimeError(f"--plot needs matplotlib: {install_hint('plot')}") from None
    firsts: dict[tuple[float, str], CellResult] = {}
    for result in results:
        key = (result.fill, result.row)
        if key not in firsts or result.seed < firsts[key].seed:
            firsts[key] = result
    fills = sorted({fill for fill, _ in firsts})
    rows = list(dict.fromkeys(row for _, row in firsts))
    seeds = sorted({r.seed for r in firsts.values()})
    top = max([settings.context_window, *(p for r in firsts.values() for p in r.prompts)]) * 1.05
    source = settings.workload or settings.session
    what = f"{workload or source}" if source else "generated workload"
    run = sorted({r.seed for r in results})
    seed_text = f"seed {', '.join(map(str, seeds))}" + (f" (the first of {len(run)} seeds run)" if len(run) > 1 else "")
    about = (
        f"{what}, {settings.context_window:,}-token window, budget {settings.budget:,}, {settings.cache} cache, "
        f"'{settings.profile}' prices, {seed_text}"
    )
    width = max(8.0, 5.0 * len(fills))
    about_lines = textwrap.wrap(about, width=int(width * 12))
    header = 0.5 + 0.22 * len(about_lines) + 0.4  # inches: the title, the settings, the legend
    height = 1.9 * len(rows) + 0.7 + header
    figure, axes = plt.subplots(
        len(rows), len(fills), figsize=(width, height), sharex="col", sharey=True, squeeze=False
    )
    thousands = FuncFormatter(lambda value, _: f"{value / 1000:g}K")
    for column, fill in enumerate(fills):
        for line, row in enumerate(rows):
            axis = axes[line][column]
            result = firsts.get((fill, row))
            if result is None:
                axis.set_visible(False)
                continue
            calls = range(1, len(result.prompts) + 1)
            axis.fill_between(calls, result.prompts, step="mid", alpha=0.35, label="prompt tokens")
            axis.fill_between(calls, result.cached, step="mid", alpha=0.6, label="cached tokens")
            axis.axhline(settings.context_window, color="red", linewidth=1.0, label="window")
            dq = f", {result.dq} DQ" if result.dq else ""
            axis.set_title(f"{row}: fill {fill:g}, {result.hit * 100:.0f}% cached{dq}", fontsize=10)
            axis.tick_params(labelsize=8)
            axis.yaxis.set_major_formatter(thousands)
            axis.set_ylim(0, math.ceil(top))
            axis.grid(axis="y", linewidth=0.3, alpha=0.5)
    figure.text(
        0.01, 1 - 0.12 / height, "Prompt and cached tokens per model call", fontsize=13, weight="bold", va="top"
    )
    figure.text(0.01, 1 - 0.48 / height, "\n".join(about_lines), fontsize=10, va="top", linespacing=1.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(0.005, 1 - (0.5 + 0.22 * len(about_lines) + 0.02) / height),
        fontsize=10,
        ncol=3,
        frameon=False,
    )
    figure.supxlabel("model call", fontsize=10)
    figure.supylabel("tokens", fontsize=10)
    figure.tight_layout(rect=(0, 0, 1, 1 - header / height))
    figure.savefig(path, dpi=110)
    plt.close(figure)
