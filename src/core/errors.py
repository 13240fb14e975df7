"""Errors that are part of an answer, and errors about stored state."""

from __future__ import annotations

import functools
from typing import Any


class ErrorValue(Exception):
    """An error that crosses processes: it pickles through its constructor and compares by value.

    The default pickling of an exception calls ``cls(*self.args)``, which fails for an error
    whose constructor takes structured arguments and formats the message itself (a host that
    passes errors between processes, through ``multiprocessing`` or a task queue, would get a
    ``TypeError`` instead of the error). Subclasses say which arguments rebuild them
    (:meth:`_arguments`); the attributes and notes travel as the instance's state. Two
    errors are equal when they have the same type, arguments and attributes.
    """

    def _arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The positional and keyword arguments that rebuild this error."""
        return tuple(self.args), {}

    def __reduce__(self) -> tuple[Any, ...]:
        args, kwargs = self._arguments()
        return (functools.partial(type(self), **kwargs), args, dict(vars(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ErrorValue) or type(other) is not type(self):
            return NotImplemented
        return self.args == other.args and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), self.args))


class CompactionBudgetExceeded(ErrorValue):
    """What must stay in the prompt does not fit the budget.

    The composition's step raises it, and the strategy lets it through. The host handles
    it by reducing protected context or choosing a larger budget.

    Attributes:
        needed: Tokens the protected messages need.
        budget: The budget they had to fit.
        refused: Identities of the record replacements and emergency folds the failing pass
            found refused (counted and warned about like on any pass).
        failed: Identities of those whose failed request stands on the failing pass.
        skipped: Identities of the record replacements the failing pass did not ask for, because an
            answer over records they stand for already left a value out (counted like on any pass).
    """

    def __init__(
        self,
        message: str,
        *,
        needed: int,
        budget: int,
        refused: tuple[str, ...] = (),
        failed: tuple[str, ...] = (),
        skipped: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.needed = needed
        self.budget = budget
        self.refused = tuple(refused)
        self.failed = tuple(failed)
        self.skipped = tuple(skipped)

    def _arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        keywords = {
            "needed": self.needed,
            "budget": self.budget,
            "refused": self.refused,
            "failed": self.failed,
            "skipped": self.skipped,
        }
        return tuple(self.args), keywords


class SnapshotError(ErrorValue, ValueError):
    """A stored snapshot cannot be read."""


class SnapshotVersionError(SnapshotError):
    """A stored snapshot names a version this build does not read.

    The stored format started over at 1 with the first release: a snapshot of another
    version was written by a newer release, or by a pre-release build whose formats no
    release reads; either way its decisions are not guessed at.

    Attributes:
        version: The version found in the snapshot.
        supported: The versions this build reads.
        kind: The kind of snapshot (``"stack"``, ``"state"``, ...), when known.
    """

    def __init__(self, version: object, supported: tuple[int, ...], *, kind: str | None = None) -> None:
        what = "snapshot" if kind is None else f"{kind!r} snapshot"
        super().__init__(
            f"{what} version {version!r} is not supported by this build of maf-compaction "
            f"(it reads {_versions(supported)}): another build wrote it (a newer release: "
            "upgrade to read it; a pre-release build: its formats are not read, delete the entry to start the "
            "conversation's compaction afresh, its history stays)"
        )
        self.version = version
        self.supported = supported
        self.kind = kind

    def _arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.version, self.supported), {"kind": self.kind}


def _versions(supported: tuple[int, ...]) -> str:
    """``no version``, ``version 1``, ``versions 1 and 5``, ``versions 1, 3 and 5``."""
    said = [str(v) for v in supported]
    if len(said) <= 1:
        return f"version {said[0]}" if said else "no version"
    return f"versions {', '.join(said[:-1])} and {said[-1]}"
