"""``python -m maf_compaction.bench [COMMAND] [options]``: the bench's command line.

Without a command (or with an option first) it runs ``bench``. Each command's module is
imported only when it runs, so one command's dependencies never load for another.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Final, cast

from .args import install_hint, program_name

_PACKAGE: Final = "maf_compaction.bench"

#: Command name -> (module under ``maf_compaction.bench``, one-line help).
COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "bench": ("grid", "replay a conversation through every strategy against the simulated provider (the default)"),
    "speed": ("speed", "time one compaction pass: ours against the framework's"),
    "redis": ("sessions_redis", "time the Redis lease + load + save round trip of one session turn on loopback"),
    "sessions": ("sessions", "time the session registry's state read and write per phase, at 10 to 1,000 sessions"),
    "load": ("load", "turns per second through the session registry and through Redis, beside the baseline"),
    "docs": ("docs", "regenerate (--write) or check the bench tables in README.md and docs/bench.md"),
}


DEFAULT_COMMAND: Final = "bench"


class MissingDependency(RuntimeError):
    """A command's module needs an optional dependency that is not installed (the message says how to add it)."""


def _version() -> str:
    from .. import __version__  # noqa: PLC0415 - the package is imported already

    return f"maf-compaction {__version__}"


def _usage() -> str:
    lines = [f"usage: {program_name()} [COMMAND] [options]", "", "commands:"]
    lines += [f"  {name:<8} {text}" for name, (_, text) in COMMANDS.items()]
    lines.append("\nRun a command with --help for its options; --version prints the version.")
    return "\n".join(lines)


def _load(command: str) -> Callable[[Sequence[str]], int] | None:
    """The ``main`` of ``command``'s module, or ``None`` when that module is not there.

    Raises:
        MissingDependency: The module imports a third-party package that is not installed.
    """
    module_name = f"{_PACKAGE}.{COMMANDS[command][0]}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name:
            return None
        if error.name and not error.name.startswith("maf_compaction"):
            raise MissingDependency(
                f"the {command!r} command needs {error.name}, which is not installed: {install_hint(error.name)}"
            ) from None
        raise
    return cast("Callable[[Sequence[str]], int]", module.main)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``argv`` (default ``sys.argv[1:]``) to a command; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if args and args[0] == "--version":
        print(_version())
        return 0
    if not args or args[0].startswith("-"):
        args = [DEFAULT_COMMAND, *args]  # `maf-compaction bench` is what runs without a command
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"{program_name()}: error: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        run = _load(command)
    except MissingDependency as error:
        print(f"{program_name()}: error: {error}", file=sys.stderr)
        return 2
    if run is None:
        print(f"{program_name()}: error: the {command!r} command is not available in this build", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
