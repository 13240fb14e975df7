"""``maf-compaction bench`` (``python -m maf_compaction.bench``): replay a conversation through every row.

Runs a grid of cells (rows x fills x seeds) against the simulated provider and prints
the results table; ``--json`` writes every figure, ``--plot`` draws prompt size, cached
share and the window per call. See ``docs/bench.md`` for the workload, the simulator's
rules and each metric.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from .args import positive_int
from .provider import CACHE_KINDS
from .report import plot, render_table, to_json
from .rows import ROW_DESCRIPTIONS, ROWS, parse_strategy_option, resolve_rows
from .runner import CLIENT_MODES, Cell, CellResult, Settings, load_scenario, run_grid, summarize
from .scenario import DEFAULT_MARKERS_PER_TOOL, DEFAULT_TOOL_SHARE, DEFAULT_TOOL_TURNS, DEFAULT_WINDOW
from .simulator import PROFILES

DEFAULT_FILLS: Final = (0.9, 1.5, 3.0)
DEFAULT_SEEDS: Final = 3


def _fills(text: str) -> list[float]:
    try:
        fills = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not fills or any(not 0 < f <= 10 for f in fills):
        raise argparse.ArgumentTypeError(f"every fill must be in (0, 10], got {text!r}")
    return fills


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    """The command line."""
    rows = "\n".join(f"  {name:<18} {text}" for name, text in ROW_DESCRIPTIONS.items())
    cli = argparse.ArgumentParser(
        prog="maf-compaction bench",
        description="Replay a long agent conversation through compaction strategies against a simulated provider.",
        epilog=f"rows:\n{rows}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    work = cli.add_argument_group("workload")
    work.add_argument("--context-window", type=positive_int, default=DEFAULT_WINDOW, help="tokens (default: 32000)")
    work.add_argument(
        "--fill",
        "--fills",
        type=_fills,
        default=list(DEFAULT_FILLS),
        help="conversation size / window, comma-separated (default: 0.9,1.5,3.0)",
    )
    work.add_argument("--seeds", type=positive_int, default=DEFAULT_SEEDS, help="seeds 1..N per cell (default: 3)")
    work.add_argument("--tool-share", type=_share, default=DEFAULT_TOOL_SHARE, help="share of tokens in tool results")
    work.add_argument("--tool-turns", type=positive_int, default=DEFAULT_TOOL_TURNS, help="lookups (default: 6)")
    work.add_argument(
        "--markers-per-tool", type=positive_int, default=DEFAULT_MARKERS_PER_TOOL, help="codes per lookup (default: 8)"
    )
    work.add_argument(
        "--dense-values",
        action="store_true",
        help="number-dense log lines in lookup results (hundreds of distinctive values per result)",
    )
    source = work.add_mutually_exclusive_group()
    source.add_argument("--workload", metavar="FILE.json", help="replay a workload file (docs/workload-format.md)")
    source.add_argument("--session", metavar="FILE.json", help="replay an AgentSession.to_dict() export")
    work.add_argument(
        "--facts", metavar="FILE.json", help="with --session: the values to track, a JSON list of {label, value, scope}"
    )
    sim = cli.add_argument_group("provider and model")
    sim.add_argument("--max-output-tokens", type=positive_int, default=2_048, help="output reservation (default: 2048)")
    sim.add_argument("--cache", choices=CACHE_KINDS, default="openai", help="prompt cache rules (default: openai)")
    sim.add_argument("--prices", choices=sorted(PROFILES), default="default", help="price profile (default: default)")
    sim.add_argument("--record-quality", type=_share, default=1.0, help="share of values a record keeps")
    sim.add_argument("--summary-quality", type=_share, default=1.0, help="share of values a summary keeps")
    sim.add_argument("--ignore-pin", action="store_true", help="the model ignores a pinned record request")
    sim.add_argument("--client", choices=CLIENT_MODES, default="inprocess", help="in process or a real client")
    sim.add_argument("--stream", action="store_true", help="streaming model calls")
    rows_group = cli.add_argument_group("rows")
    rows_group.add_argument("--rows", help=f"comma-separated rows (default: all built-in: {', '.join(ROWS)})")
    rows_group.add_argument(
        "--strategy",
        action="append",
        default=[],
        metavar="NAME=module:factory",
        help="add a row: factory(RowContext) returns a CompactionStrategy or a RowSetup (repeatable)",
    )
    out = cli.add_argument_group("output")
    out.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    out.add_argument("--plot", metavar="FILE.png", help="plot prompt size, cached share and window per call")
    out.add_argument("--jobs", type=positive_int, default=min(os.cpu_count() or 1, 8), help="worker processes")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    return cli


def settings_from(args: argparse.Namespace) -> Settings:
    """:class:`Settings` from parsed arguments (validates ``--strategy`` and the window)."""
    extra = dict(parse_strategy_option(text) for text in args.strategy)
    if args.facts is not None and args.session is None:
        raise ValueError("--facts goes with --session (a workload file lists its facts itself)")
    if args.max_output_tokens >= args.context_window:
        raise ValueError(
            f"--max-output-tokens ({args.max_output_tokens}) must be below --context-window ({args.context_window})"
        )
    return Settings(
        context_window=args.context_window,
        max_output_tokens=args.max_output_tokens,
        cache=args.cache,
        profile=args.prices,
        tool_share=args.tool_share,
        tool_turns=args.tool_turns,
        markers_per_tool=args.markers_per_tool,
        dense_values=args.dense_values,
        record_quality=args.record_quality,
        summary_quality=args.summary_quality,
        ignore_pin=args.ignore_pin,
        client=args.client,
        stream=args.stream,
        workload=args.workload,
        session=args.session,
        facts=args.facts,
        strategies=extra,
    )


def cells_for(args: argparse.Namespace, settings: Settings) -> list[Cell]:
    """The grid: fills x rows x seeds (one fill and one seed for a file workload)."""
    names = [n.strip() for n in args.rows.split(",") if n.strip()] if args.rows else [*ROWS, *settings.strategies]
    resolve_rows(names, settings.strategies)  # fail early, with the row's name
    from_file = settings.workload is not None or settings.session is not None
    fills = [1.0] if from_file else args.fill
    seeds = [1] if from_file else list(range(1, args.seeds + 1))
    return [Cell(row, fill, seed) for fill in fills for seed in seeds for row in names]


class _Progress:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started = time.perf_counter()

    def __call__(self, done: int, total: int, result: CellResult) -> None:
        if self.quiet:
            return
        width = 30
        filled = int(width * done / total)
        elapsed = time.perf_counter() - self.started
        line = f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} cells, {elapsed:5.1f} s"
        sys.stderr.write(line)
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the grid and print the table; returns the exit status."""
    args = parser().parse_args(argv)
    try:
        settings = settings_from(args)
        cells = cells_for(args, settings)
        if settings.workload is not None or settings.session is not None:
            load_scenario(settings, 1.0, 1)  # validate the file before starting workers
    except ValueError as error:
        print(f"maf-compaction bench: error: {error}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    results = run_grid(cells, settings, jobs=args.jobs, progress=_Progress(args.quiet))
    seconds = time.perf_counter() - started
    summaries = summarize(results)

    print(render_table(summaries, settings))
    print(f"\n{len(cells)} cells in {seconds:.1f} s ({args.jobs} worker(s)).")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(to_json(results, summaries, settings, seconds))
        print(f"wrote {args.json}")
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot(results, args.plot, settings)
        print(f"wrote {args.plot}")
    return 0
