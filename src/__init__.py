"""Prompt-cache-aware compaction strategies for Microsoft Agent Framework.

Experimental: releases before 1.0 may change or remove APIs. Importing the package emits
:class:`MafCompactionExperimentalWarning` once.
"""

from __future__ import annotations

import contextlib as _contextlib
import importlib as _importlib
import os as _os
import sys as _sys
import warnings as _warnings
from typing import TYPE_CHECKING

from .core.stack import StackConfiguration, StackConfigurationError, StackKindError, StackState
from .core.state import AnchoredSnapshot, Answer, Ask, ChainDecisions, RecallState, RecordDecisions, RecordRoute, State
from .errors import (
    CompactionBudgetExceeded,
    MafCompactionExperimentalWarning,
    SnapshotError,
    SnapshotVersionError,
)

if TYPE_CHECKING:  # the adapters' names, seen by type checkers and IDEs; imported on first use at run time
    from .adapters.anchored import AnchoredCompactionStrategy, MinimumGainAnchoredCompactionStrategy
    from .adapters.breakpoints import cache_breakpoints
    from .adapters.composition import ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy
    from .adapters.convert import original_results
    from .adapters.counting import MediaTokenEstimator
    from .adapters.leases import (
        HeldLease,
        LeaseTimeoutError,
        SessionLease,
        SessionLeaseError,
        SessionLeases,
        SessionPayloadError,
        SessionStore,
        SessionStoreError,
        SessionVanishedError,
        StaleLeaseError,
        leased_session,
    )
    from .adapters.nested import find_nested_strategy
    from .adapters.overhead import AgentOverhead, measure_agent_overhead
    from .adapters.recall import RecallGate, ToolResultRecallMiddleware, make_recall_tool
    from .adapters.records import ToolResultAnchoredSummarizationCompactionStrategy, record_text
    from .adapters.sessions import (
        CompactionStack,
        SessionCompactionProvider,
        SessionCompactionRegistry,
        SessionToolResultRecallMiddleware,
        make_session_recall_tool,
    )
    from .adapters.tiktoken import TiktokenTokenizer, TokenizerUnavailableError
    from .adapters.user_summaries import UserTurnAnchoredSummarizationCompactionStrategy

#: Where each adapter name lives. The adapters import agent_framework, so they are imported on first use (PEP 562):
#: ``import maf_compaction.core`` (a custom host's whole need) never loads the framework.
_LAZY: dict[str, str] = {
    "AnchoredCompactionStrategy": "anchored",
    "MinimumGainAnchoredCompactionStrategy": "anchored",
    "cache_breakpoints": "breakpoints",
    "ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy": "composition",
    "original_results": "convert",
    "MediaTokenEstimator": "counting",
    **dict.fromkeys(
        (
            "HeldLease",
            "LeaseTimeoutError",
            "SessionLease",
            "SessionLeaseError",
            "SessionLeases",
            "SessionPayloadError",
            "SessionStore",
            "SessionStoreError",
            "SessionVanishedError",
            "StaleLeaseError",
            "leased_session",
        ),
        "leases",
    ),
    "find_nested_strategy": "nested",
    "AgentOverhead": "overhead",
    "measure_agent_overhead": "overhead",
    "RecallGate": "recall",
    "ToolResultRecallMiddleware": "recall",
    "make_recall_tool": "recall",
    "ToolResultAnchoredSummarizationCompactionStrategy": "records",
    "record_text": "records",
    **dict.fromkeys(
        (
            "CompactionStack",
            "SessionCompactionProvider",
            "SessionCompactionRegistry",
            "SessionToolResultRecallMiddleware",
            "make_session_recall_tool",
        ),
        "sessions",
    ),
    "TiktokenTokenizer": "tiktoken",
    "TokenizerUnavailableError": "tiktoken",
    "UserTurnAnchoredSummarizationCompactionStrategy": "user_summaries",
}


def __getattr__(name: str) -> object:
    """An adapter name, imported from its module on first use (and then kept in this module's namespace)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"{__name__}.adapters.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Every public name, the lazy ones included."""
    return sorted({*globals(), *__all__})


__version__ = "0.1.0.dev0"

__all__ = [
    "AgentOverhead",
    "AnchoredCompactionStrategy",
    "AnchoredSnapshot",
    "Answer",
    "Ask",
    "ChainDecisions",
    "CompactionBudgetExceeded",
    "CompactionStack",
    "HeldLease",
    "LeaseTimeoutError",
    "MafCompactionExperimentalWarning",
    "MediaTokenEstimator",
    "MinimumGainAnchoredCompactionStrategy",
    "RecallGate",
    "RecallState",
    "RecordDecisions",
    "RecordRoute",
    "SessionCompactionProvider",
    "SessionCompactionRegistry",
    "SessionLease",
    "SessionLeaseError",
    "SessionLeases",
    "SessionPayloadError",
    "SessionStore",
    "SessionStoreError",
    "SessionToolResultRecallMiddleware",
    "SessionVanishedError",
    "SnapshotError",
    "SnapshotVersionError",
    "StackConfiguration",
    "StackConfigurationError",
    "StackKindError",
    "StackState",
    "StaleLeaseError",
    "State",
    "TiktokenTokenizer",
    "TokenizerUnavailableError",
    "ToolResultAnchoredSummarizationCompactionStrategy",
    "ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy",
    "ToolResultRecallMiddleware",
    "UserTurnAnchoredSummarizationCompactionStrategy",
    "__version__",
    "cache_breakpoints",
    "find_nested_strategy",
    "leased_session",
    "make_recall_tool",
    "make_session_recall_tool",
    "measure_agent_overhead",
    "original_results",
    "record_text",
]


def _own_command_line() -> bool:
    """The ``maf-compaction`` console script, or ``python -m maf_compaction.bench`` (its documented equivalent)."""
    if _os.path.basename(_sys.argv[0] if _sys.argv else "").startswith("maf-compaction"):
        return True
    # Under ``-m`` the package is imported before ``sys.argv[0]`` names the module; the original argv does.
    original: list[str] = list(getattr(_sys, "orig_argv", ()))
    modules = ("maf_compaction.bench", "maf_compaction.bench.__main__")
    return any(original[i] == "-m" and original[i + 1] in modules for i in range(len(original) - 1))


def _warn_experimental() -> None:
    # The warning is for code that imports the library; the package's own command line is not
    # such code and stays quiet.
    if _own_command_line():
        return
    # Under ``python -W error`` a warning becomes an exception; the import must still succeed.
    with _contextlib.suppress(MafCompactionExperimentalWarning):
        _warnings.warn(
            "maf-compaction is experimental: releases before 1.0 may change or remove APIs.",
            MafCompactionExperimentalWarning,
            stacklevel=3,
        )


_warn_experimental()
