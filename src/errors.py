"""Public warning and error types."""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING

from .core.errors import CompactionBudgetExceeded, SnapshotError, SnapshotVersionError
from .core.stack import StackConfigurationError, StackKindError

if TYPE_CHECKING:  # the session-lease errors live with the leases, which import agent_framework: loaded on first use
    from .adapters.leases import (
        LeaseTimeoutError,
        SessionLeaseError,
        SessionPayloadError,
        SessionStoreError,
        SessionVanishedError,
        StaleLeaseError,
    )

_LEASE_ERRORS = frozenset(
    {
        "LeaseTimeoutError",
        "SessionLeaseError",
        "SessionPayloadError",
        "SessionStoreError",
        "SessionVanishedError",
        "StaleLeaseError",
    }
)


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


def __getattr__(name: str) -> object:
    """A session-lease error, imported from :mod:`maf_compaction.adapters.leases` on first use."""
    if name not in _LEASE_ERRORS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module("maf_compaction.adapters.leases"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Every public name, the lease errors included."""
    return sorted({*globals(), *__all__})
