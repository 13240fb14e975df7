"""Public warning and error types."""

from __future__ import annotations

from .core.errors import CompactionBudgetExceeded, SnapshotError, SnapshotVersionError


class MafCompactionExperimentalWarning(UserWarning):
    """maf-compaction is experimental: releases before 1.0 may change or remove APIs."""


__all__ = [
    "CompactionBudgetExceeded",
    "MafCompactionExperimentalWarning",
    "SnapshotError",
    "SnapshotVersionError",
]
