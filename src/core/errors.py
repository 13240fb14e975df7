"""Errors that are part of an answer, and errors about stored state."""

from __future__ import annotations


class CompactionBudgetExceeded(Exception):
    """What must stay in the prompt does not fit the budget.

    The core returns it as a ``Failure`` value; the shell raises it. The host handles
    it by reducing protected context or choosing a larger budget.

    Attributes:
        needed: Tokens the protected messages need.
        budget: The budget they had to fit.
    """

    def __init__(self, message: str, *, needed: int, budget: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.budget = budget


class SnapshotError(ValueError):
    """A stored snapshot cannot be read."""


class SnapshotVersionError(SnapshotError):
    """A stored snapshot was written by a newer or unknown version of the schema.

    Attributes:
        version: The version found in the snapshot.
        supported: The versions this build reads.
        kind: The kind of snapshot (``"stack"``, ``"composition"``, ...), when known.
    """

    def __init__(self, version: object, supported: tuple[int, ...], *, kind: str | None = None) -> None:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > max(supported, default=0)
        # Upgrading helps only with a newer version; anything else is no version any build wrote.
        advice = "upgrade maf-compaction to read it" if newer else "no build of maf-compaction writes it"
        what = "snapshot" if kind is None else f"{kind!r} snapshot"
        super().__init__(
            f"{what} version {version!r} is not supported by this build of maf-compaction "
            f"(it reads versions {', '.join(map(str, supported))}); {advice}"
        )
        self.version = version
        self.supported = supported
        self.kind = kind
