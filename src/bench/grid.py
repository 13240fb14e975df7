"""``maf-compaction bench`` (``python -m maf_compaction.bench``): replay a conversation through every row.

Runs a grid of cells (rows x fills x seeds) against the simulated provider and prints,
per fill, a verdict and a table that fits 120 columns (``--full``: every column and each
row's counters); ``--json`` writes every figure, ``--plot`` draws prompt size, cached share
and the window per call. See ``docs/bench.md`` for the workload, the simulator's rules and
each metric.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from .. import __version__
from ..adapters.tiktoken import TokenizerUnavailableError
from .args import install_hint, positive_int, program_name
from .model import MODEL_KINDS
from .provider import CACHE_KINDS, default_profile
from .report import plot, render_table, to_json
from .rows import ROW_DESCRIPTIONS, ROWS, RowFactoryError, load_factory, parse_strategy_options, resolve_rows
from .runner import (
    ANTHROPIC_CACHE_MODES,
    CLIENT_MODES,
    Cell,
    CellError,
    CellResult,
    Settings,
    bench_tokenizer,
    check_factory,
    load_scenario,
    run_grid,
    summarize,
)
from .scenario import (
    DEFAULT_MARKERS_PER_TOOL,
    DEFAULT_TOOL_SHARE,
    DEFAULT_TOOL_TURNS,
    DEFAULT_WINDOW,
    RESULTS_KINDS,
    Scenario,
)
from .simulator import PROFILES

DEFAULT_FILLS: Final = (0.9, 1.5, 3.0)
DEFAULT_SEEDS: Final = 3
#: Generator options a file workload (``--workload``, ``--session``) does not use: it is replayed once, as written.
GENERATOR_ONLY: Final = {
    "fill": "--fill",
    "seeds": "--seeds",
    "tool_share": "--tool-share",
    "tool_turns": "--tool-turns",
    "markers_per_tool": "--markers-per-tool",
    "results": "--results",
}


class UsageError(ValueError):
    """A problem with the command line or the environment, found before any cell runs (one line, exit 2)."""


def _fills(text: str) -> list[float]:
    try:
        fills = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not fills or any(not 0 < f <= 10 for f in fills):
        raise argparse.ArgumentTypeError(f"every fill must be in (0, 10], got {text!r}")
    return fills


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def _token_range(text: str) -> tuple[int, int]:
    low, comma, high = text.partition(",")
    try:
        bounds = (int(low), int(high if comma else low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH whole numbers, got {text!r}") from None
    if not 0 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"expected 0 <= LOW <= HIGH, got {text!r}")
    return bounds


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's layout and shows each option's default (when it has a meaningful one)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default: object = action.default
        if "%(default)" in text or not action.option_strings or default in (None, False, argparse.SUPPRESS):
            return text
        if isinstance(default, list | tuple) and not default:
            return text
        return f"{text} (default: %(default)s)"


HELP_WIDTH = 120
_ROW_NAME_WIDTH = 30


def _row_help(name: str, text: str) -> str:
    """One row of the epilog: its name, then its description wrapped to ``HELP_WIDTH`` columns under the column."""
    indent = " " * (_ROW_NAME_WIDTH + 3)
    wrap = {"width": HELP_WIDTH, "subsequent_indent": indent, "break_long_words": False, "break_on_hyphens": False}
    if len(name) <= _ROW_NAME_WIDTH:
        return textwrap.fill(text, initial_indent=f"  {name:<{_ROW_NAME_WIDTH}} ", **wrap)
    return f"  {name}\n" + textwrap.fill(text, initial_indent=indent, **wrap)


def parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command line (``prog`` defaults to how the program was started, plus ``bench``)."""
    rows = "\n".join(_row_help(name, text) for name, text in ROW_DESCRIPTIONS.items())
    cli = argparse.ArgumentParser(
        prog=prog or f"{program_name()} bench",
        description="Replay a long agent conversation through compaction strategies against a simulated provider.",
        epilog=f"rows:\n{rows}",
        formatter_class=HelpFormatter,
    )
    cli.add_argument("--version", action="version", version=f"maf-compaction {__version__}")
    work = cli.add_argument_group("workload")
    work.add_argument("--context-window", type=positive_int, default=DEFAULT_WINDOW, help="tokens")
    work.add_argument(
        "--fill",
        "--fills",
        type=_fills,
        default=",".join(str(fill) for fill in DEFAULT_FILLS),
        help="conversation size / window, comma-separated",
    )
    work.add_argument("--seeds", type=positive_int, default=DEFAULT_SEEDS, help="seeds 1..N per cell")
    work.add_argument("--tool-share", type=_share, default=DEFAULT_TOOL_SHARE, help="share of tokens in tool results")
    work.add_argument("--tool-turns", type=positive_int, default=DEFAULT_TOOL_TURNS, help="lookups")
    work.add_argument(
        "--markers-per-tool", type=positive_int, default=DEFAULT_MARKERS_PER_TOOL, help="codes per lookup"
    )
    work.add_argument(
        "--results",
        choices=RESULTS_KINDS,
        default="synthetic",
        help="what lookups return: generated logs with planted codes, number-dense logs (hundreds of values per "
        "result), or reads of this Python's standard library (source, grep hits, module docs)",
    )
    work.add_argument(
        "--dense-values",
        dest="results",
        action="store_const",
        const="dense",
        help="the same as --results dense",
    )
    work.add_argument(
        "--think-time",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="median pause between user turns, lognormal (default: 60 for the plausible model, 0 for the oracle)",
    )
    source = work.add_mutually_exclusive_group()
    source.add_argument(
        "--workload",
        metavar="FILE.json",
        help="replay a workload file once (docs/workload-format.md); the generator's options do not apply",
    )
    source.add_argument(
        "--session", metavar="FILE.json", help="replay an AgentSession.to_dict() export once (as --workload)"
    )
    work.add_argument(
        "--facts", metavar="FILE.json", help="with --session: the values to track, a JSON list of {label, value, scope}"
    )
    sim = cli.add_argument_group("provider and client")
    sim.add_argument("--max-output-tokens", type=positive_int, default=2_048, help="output reservation")
    sim.add_argument(
        "--cache",
        choices=CACHE_KINDS,
        default="openai",
        help="prompt cache rule: openai (a tool_choice change misses the prompt), openai-free-tool-choice, "
        "anthropic (layered invalidation, breakpoints, write premium); docs/bench.md",
    )
    sim.add_argument(
        "--prices",
        choices=sorted(PROFILES),
        default=None,
        help="price profile (default: 'default', or 'anthropic-5m' with --cache anthropic)",
    )
    sim.add_argument(
        "--ttl",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="seconds a cache entry lives unused (default: 300, or 3600 with --prices anthropic-1h)",
    )
    model = cli.add_argument_group("the scripted model (docs/bench.md, 'The scripted model')")
    model.add_argument(
        "--model",
        choices=MODEL_KINDS,
        default="plausible",
        help="plausible: records and summaries with prose, a generic value rule, an answer length and losses; "
        "oracle: the minimal, perfect writer of earlier figures (comparison only)",
    )
    model.add_argument("--record-quality", type=_share, default=1.0, help="share of values a record keeps")
    model.add_argument("--summary-quality", type=_share, default=1.0, help="share of values a summary keeps")
    model.add_argument(
        "--prose-tokens",
        type=_token_range,
        default=(30, 60),
        metavar="LOW,HIGH",
        help="plausible model: prose tokens per message a record or summary covers",
    )
    model.add_argument(
        "--answer-tokens", type=positive_int, default=1_500, help="plausible model: the longest record or summary"
    )
    model.add_argument(
        "--drop-requirements",
        type=_share,
        default=0.05,
        help="plausible model: chance a summary leaves out a requirement, constraint or correction line",
    )
    model.add_argument(
        "--miscopy", type=_share, default=0.01, help="plausible model: chance a copied value has one character wrong"
    )
    model.add_argument(
        "--partial-records",
        type=_share,
        default=0.05,
        help="plausible model: chance a record covers only half of what it was asked about",
    )
    model.add_argument(
        "--reasoning-tokens",
        type=_count,
        default=None,
        help="reasoning tokens billed as output on every call (default: 256 plausible, 0 oracle)",
    )
    model.add_argument("--ignore-pin", action="store_true", help="the model ignores a pinned record request")
    model.add_argument(
        "--ignore-instruction",
        action="store_true",
        help="the model ignores a compaction instruction (a record or summary asked over the cached prefix)",
    )
    sim.add_argument(
        "--client",
        choices=CLIENT_MODES,
        default="inprocess",
        help="in process, or a real agent-framework-openai or agent-framework-anthropic client against a loopback "
        "server (anthropic: Anthropic's Messages API, validated and priced from the request's own cache_control)",
    )
    sim.add_argument("--stream", action="store_true", help="streaming model calls")
    sim.add_argument(
        "--thinking", action="store_true", help="with --client anthropic: extended thinking on (budget 1,024 tokens)"
    )
    sim.add_argument(
        "--anthropic-cache",
        choices=ANTHROPIC_CACHE_MODES,
        default="auto",
        help="with --client anthropic: auto sends the request-level cache_control (automatic caching, one line in "
        "the agent's options); ours adds maf_compaction.cache_breakpoints on the client (our rows' requests carry "
        "marks where the pass keeps the bytes); none sends no cache_control at all (the framework's default)",
    )
    rows_group = cli.add_argument_group("rows")
    rows_group.add_argument(
        "--rows", help="comma-separated rows (default: every built-in row, then every --strategy row)"
    )
    rows_group.add_argument(
        "--strategy",
        action="append",
        default=[],
        metavar="NAME=module:factory",
        help="add a row: factory(RowContext) returns a CompactionStrategy or a RowSetup (repeatable; the "
        "module is imported from the current directory too)",
    )
    out = cli.add_argument_group("output")
    out.add_argument(
        "--full",
        action="store_true",
        help="print every column (gap closed, calls, pass ms), each row's counters and lost values "
        "(default: a verdict per fill and a table that fits 120 columns)",
    )
    out.add_argument("--json", metavar="FILE", help="write every figure as JSON (the verdicts too)")
    out.add_argument(
        "--plot", metavar="FILE.png", help="plot prompt size, cached share and window per call (the plot extra)"
    )
    out.add_argument("--jobs", type=positive_int, default=min(os.cpu_count() or 1, 8), help="worker processes")
    out.add_argument("--quiet", action="store_true", help="no progress bar (it is shown only on a terminal anyway)")
    return cli


def given_options(argv: Sequence[str] | None) -> set[str]:
    """The destinations of the options the command line actually gives (not their defaults)."""
    bare = parser(prog="bench")
    for action in bare._actions:  # pyright: ignore[reportPrivateUsage]
        action.default = argparse.SUPPRESS
    return set(vars(bare.parse_args(argv)))


def settings_from(args: argparse.Namespace) -> Settings:
    """:class:`Settings` from parsed arguments (validates ``--strategy`` and the window)."""
    extra = parse_strategy_options(args.strategy)
    if args.facts is not None and args.session is None:
        raise ValueError("--facts goes with --session (a workload file lists its facts itself)")
    if args.max_output_tokens >= args.context_window:
        raise ValueError(
            f"--max-output-tokens ({args.max_output_tokens}) must be below --context-window ({args.context_window})"
        )
    if args.thinking and args.client != "anthropic":
        raise ValueError("--thinking goes with --client anthropic")
    names = set(Settings.__dataclass_fields__) - {"profile", "strategies", "cache"}
    # Over the Anthropic wire the request's own cache_control marks decide (docs/bench.md, "The Anthropic loopback").
    cache = "anthropic" if args.client == "anthropic" else args.cache
    profile = args.prices or default_profile(cache)
    return Settings(profile=profile, strategies=extra, cache=cache, **{name: getattr(args, name) for name in names})


def row_names(args: argparse.Namespace, settings: Settings) -> list[str]:
    """The rows to run: ``--rows`` as given, else every built-in row and every ``--strategy``."""
    if args.rows:
        return [n.strip() for n in args.rows.split(",") if n.strip()]
    return [*ROWS, *settings.strategies]


def cells_for(args: argparse.Namespace, settings: Settings) -> list[Cell]:
    """The grid: fills x rows x seeds (one fill and one seed for a file workload)."""
    names = row_names(args, settings)
    resolve_rows(names, settings.strategies)  # fail early, with the row's name
    from_file = settings.workload is not None or settings.session is not None
    fills = [1.0] if from_file else args.fill
    seeds = [1] if from_file else list(range(1, args.seeds + 1))
    return [Cell(row, fill, seed) for fill in fills for seed in seeds for row in names]


def check_environment(args: argparse.Namespace, settings: Settings) -> None:
    """Every optional dependency this run needs, and the tokenizer, before any work.

    Raises:
        UsageError: One line naming what is missing and the extra that installs it.
    """
    needed = [("tiktoken", "the bench")]
    if settings.client == "anthropic":
        needed += [(module, "--client anthropic") for module in ("agent_framework_anthropic", "anthropic", "aiohttp")]
    elif settings.client != "inprocess":
        needed += [
            (module, f"--client {settings.client}") for module in ("agent_framework_openai", "openai", "aiohttp")
        ]
    if args.plot:
        needed.append(("matplotlib", "--plot"))
    missing = [(module, who) for module, who in needed if importlib.util.find_spec(module) is None]
    if missing:
        what = "; ".join(f"{who} needs {module}" for module, who in missing)
        verb = "is" if len(missing) == 1 else "are"
        raise UsageError(f"{what}, which {verb} not installed: {install_hint(*(m for m, _ in missing))}")
    try:
        bench_tokenizer()  # loaded once here, inherited by the workers
    except TokenizerUnavailableError as error:
        raise UsageError(f"the bench's o200k_base tokenizer is unavailable: {error}") from None
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            _check_writable(flag, Path(path))


def _check_writable(flag: str, path: Path) -> None:
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name")
    parent = path.parent
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{flag} {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {path}: not writable")


def check_rows(args: argparse.Namespace, settings: Settings, names: Sequence[str]) -> list[str]:
    """Import every ``--strategy`` and call each factory once; returns warnings.

    Raises:
        UsageError: A module does not import or a factory fails (the message names the row).
    """
    notes: list[str] = []
    for name, target in settings.strategies.items():
        try:
            factory = load_factory(target)
            if name in names:
                check_factory(name, factory, settings)
        except ValueError as error:
            raise UsageError(f"row {name!r}: {error}") from None
        except RowFactoryError as error:
            raise UsageError(f"{error} (--strategy {name}={target})") from None
        if name not in names:
            notes.append(f"--strategy {name} is not in --rows, so it does not run (add it: --rows {args.rows},{name})")
    return notes


def ignored_options(given: set[str], settings: Settings) -> list[str]:
    """Warnings for generator options a file workload ignores."""
    if settings.workload is None and settings.session is None:
        return []
    ignored = [flag for dest, flag in GENERATOR_ONLY.items() if dest in given]
    if not ignored:
        return []
    source = "--workload" if settings.workload is not None else "--session"
    return [f"{source} replays its file once, as written: {', '.join(ignored)} ignored"]


def missing_facts(scenario: Scenario) -> list[str]:
    """A warning for the facts whose value never occurs in the conversation (they cannot be kept)."""
    parts = [scenario.system]
    for turn in scenario.turns:
        parts += [turn.user, turn.reply]
        for call in turn.calls:
            parts += [call.result, *(str(v) for v in call.arguments.values())]
    text = "\n".join(parts)
    absent = [fact for fact in scenario.facts if fact.value not in text]
    if not absent:
        return []
    shown = ", ".join(f"{fact.label}={fact.value!r}" for fact in absent[:5]) + (", ..." if len(absent) > 5 else "")
    return [
        f"{len(absent)} of {len(scenario.facts)} fact(s) never occur in the conversation, so no row can keep them: "
        f"{shown}"
    ]


class _Progress:
    """A progress bar on stderr, drawn only when both stdout and stderr are terminals (never into a log file)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet or not (_is_terminal(sys.stdout) and _is_terminal(sys.stderr))
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


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty()) if callable(isatty) else False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the grid and print the table; returns the exit status."""
    cli = parser()
    args = cli.parse_args(argv)
    prog = cli.prog
    scenario: Scenario | None = None
    try:
        settings = settings_from(args)
        check_environment(args, settings)
        names = row_names(args, settings)
        notes = check_rows(args, settings, names)
        cells = cells_for(args, settings)
        notes += ignored_options(given_options(argv), settings)
        if settings.workload is not None or settings.session is not None:
            scenario = load_scenario(settings, 1.0, 1)  # validate the file before starting workers
            notes += missing_facts(scenario)
    except ValueError as error:  # UsageError, WorkloadError, a bad --rows...
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"{prog}: warning: {note}", file=sys.stderr)
    started = time.perf_counter()
    try:
        results = run_grid(cells, settings, jobs=args.jobs, progress=_Progress(args.quiet))
    except CellError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - started
    summaries = summarize(results)

    workload = None if scenario is None else scenario.name
    print(render_table(summaries, settings, workload=workload, full=args.full))
    print(f"\n{len(cells)} cells in {seconds:.1f} s ({args.jobs} worker(s)).")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(to_json(results, summaries, settings, seconds, workload=workload))
        print(f"wrote {args.json}")
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot(results, args.plot, settings, workload=workload)
        print(f"wrote {args.plot}")
    return 0
