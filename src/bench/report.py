"""The benchmark's output: the results table, the JSON file and the optional plot."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .runner import CellResult, RowSummary, Settings

COLUMNS = (
    ("row", "row"),
    ("cost", "cost $"),
    ("vs", "vs none"),
    ("hit", "hit%"),
    ("breaks", "breaks"),
    ("max", "max/window"),
    ("dq", "DQ"),
    ("facts", "facts kept"),
    ("acc", "acc"),
    ("calls", "model calls"),
    ("summ", "summarizer"),
    ("pass", "pass ms med/max"),
)


def _cells(summary: RowSummary) -> dict[str, str]:
    median = "-" if summary.pass_ms_median is None else f"{summary.pass_ms_median:.1f}"
    worst = "-" if summary.pass_ms_max is None else f"{summary.pass_ms_max:.1f}"
    dq = "0" if not summary.dq else f"{summary.dq} ({summary.dq_seeds}/{summary.seeds} seeds)"
    return {
        "row": summary.row + (" (error)" if summary.errors else ""),
        "cost": f"{summary.cost:.4f}",
        "vs": "-" if summary.vs_none is None else f"{summary.vs_none:.2f}x",
        "hit": f"{summary.hit * 100:.1f}",
        "breaks": f"{summary.breaks:.1f}",
        "max": f"{summary.max_prompt_share:.2f}",
        "dq": dq,
        "facts": f"{summary.facts_kept:.1f}/{summary.facts_total}",
        "acc": f"{summary.accuracy * 100:.0f}%",
        "calls": f"{summary.model_calls:.1f}",
        "summ": f"{summary.summarizer_calls:.1f}",
        "pass": f"{median}/{worst}",
    }


def render_table(summaries: Sequence[RowSummary], settings: Settings) -> str:
    """One table per fill, rows in grid order, averaged over seeds."""
    lines: list[str] = []
    fills = sorted({s.fill for s in summaries})
    for fill in fills:
        rows = [s for s in summaries if s.fill == fill]
        seeds = max(s.seeds for s in rows)
        source = settings.workload or settings.session
        what = f"{source} at a" if source else f"fill {fill:g} x"
        lines.append(
            f"{what} {settings.context_window:,}-token window, {seeds} seed(s), "
            f"{settings.cache} cache, '{settings.profile}' prices, budget {settings.budget:,}"
        )
        table = [[title for _, title in COLUMNS], *([_cells(s)[key] for key, _ in COLUMNS] for s in rows)]
        widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
        for index, row in enumerate(table):
            cells = [
                row[0].ljust(widths[0]),
                *(cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)),
            ]
            lines.append("  " + "  ".join(cells))
            if index == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        for summary in rows:
            if summary.counters:
                shown = ", ".join(f"{name.replace('_', ' ')} {value:g}" for name, value in summary.counters.items())
                lines.append(f"  {summary.row} (mean per seed): {shown}")
        lines.append("")
    lines += [
        "cost: dollars over every call (summarizer calls included); vs none: per-seed ratio to the control;",
        "hit%: cached / input tokens; breaks: model calls that do not extend the previous prompt;",
        "max/window: largest prompt over the window; DQ: calls over the window (row leaves the ranking);",
        "facts kept: planted values in the final stored history's included messages; acc: probe values quoted.",
    ]
    errors = [f"  {s.row} (fill {s.fill:g}): {e}" for s in summaries for e in s.errors]
    if errors:
        lines += ["", "Errors:", *errors]
    return "\n".join(lines)


def to_json(results: Sequence[CellResult], summaries: Sequence[RowSummary], settings: Settings, seconds: float) -> str:
    """Every figure: the settings, the per-(fill, row) summaries and every cell."""
    payload: dict[str, Any] = {
        "settings": _settings_dict(settings),
        "seconds": seconds,
        "summaries": [s.to_dict() for s in summaries],
        "cells": [r.to_dict() for r in results],
    }
    return json.dumps(payload, indent=2, sort_keys=True)


def _settings_dict(settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in settings.__dataclass_fields__:
        value = getattr(settings, name)
        out[name] = dict(value) if isinstance(value, Mapping) else value
    out["budget"] = settings.budget
    return out


def plot(results: Sequence[CellResult], path: str | Path, settings: Settings) -> None:
    """Prompt size, cached share and the window per model call, one panel per (fill, row).

    Uses the first seed of each (fill, row). Needs matplotlib (``pip install 'maf-compaction[plot]'``).
    """
    try:
        import matplotlib  # noqa: PLC0415 - an optional extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as error:  # pragma: no cover - depends on the optional extra
        raise RuntimeError("--plot needs matplotlib: pip install 'maf-compaction[plot]'") from error
    firsts: dict[tuple[float, str], CellResult] = {}
    for result in results:
        firsts.setdefault((result.fill, result.row), result)
    fills = sorted({fill for fill, _ in firsts})
    rows = list(dict.fromkeys(row for _, row in firsts))
    figure, axes = plt.subplots(
        len(rows), len(fills), figsize=(4.2 * len(fills), 2.0 * len(rows)), sharex="col", squeeze=False
    )
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
            axis.axhline(settings.context_window, color="red", linewidth=0.8, label="window")
            axis.set_title(f"{row}, fill {fill:g}", fontsize=8)
            axis.tick_params(labelsize=6)
            top = max([settings.context_window, *result.prompts]) * 1.05
            axis.set_ylim(0, math.ceil(top))
    axes[0][0].legend(fontsize=6, loc="upper left")
    figure.supxlabel("model call")
    figure.supylabel("tokens")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
