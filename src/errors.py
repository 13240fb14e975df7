"""Public warning and error types."""

from __future__ import annotations

from .adapters.leases import (
    LeaseTimeoutError,
    SessionLeaseError,
    SessionPayloadError,
    SessionStoreError,
    SessionVanishedError,
    StaleLeaseError,
)
from .core.errors import CompactionBudgetExceeded, SnapshotError, SnapshotVersionError
from .core.stack import StackConfigurationError, StackKindError


class MafCompactionExperimentalWarning(UserWarning):
    """maf-compaction is experimental: releases before 1.0 may change or remove APIs."""


__all__ = [
    "CompactionBudgetExceeded",
    "LeaseTimeoutError",
    "MafCompactionExperimentalWarning",
    "SessionLeaseError",
    "SessionPayloadError",
    "SessionStoreError",
    "SessionVanishedError",
    "SnapshotError",
    "SnapshotVersionError",
    "StackConfigurationError",
    "StackKindError",
    "StaleLeaseError",
]
