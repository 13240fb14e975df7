"""What a built stack's configuration is, as a fingerprint (see :mod:`maf_compaction.core.fingerprint`).

The parameters are read from the configured values themselves, never from a hand-written
list: the strategy's core config (the composition's holds both halves' and the record
half's in-pass fallback), the configuration of a fallback strategy the host gave the record
half, the recall middleware's pin rule, and the tokenizer's identity.

A tokenizer is known by its class and its own settings: a ``decision_identity()`` method
when it has one (``TiktokenTokenizer`` names its encoding, not the file it was loaded
from), else its scalar attributes, the tokenizers it wraps (``MediaTokenEstimator``) and
the qualified names of the callables it holds (an ``estimate_media`` hook).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.fingerprint import Scalar, flatten

if TYPE_CHECKING:
    from .sessions import CompactionStack

#: How deep wrapped tokenizers are followed.
_DEPTH = 4


def _qualified(value: object) -> str:
    kind = value if isinstance(value, type) else type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def _callable_name(value: Any) -> str:
    module = getattr(value, "__module__", None) or type(value).__module__
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    return f"{module}.{name}"


def _attributes(value: object) -> dict[str, object]:
    found: dict[str, object] = dict(getattr(value, "__dict__", {}))
    for kind in type(value).__mro__:
        for slot in getattr(kind, "__slots__", ()):
            if isinstance(slot, str) and hasattr(value, slot):
                found.setdefault(slot, getattr(value, slot))
    return found


def tokenizer_identity(tokenizer: object, path: str = "tokenizer", depth: int = 0) -> dict[str, Scalar]:
    """The tokenizer's identity as flat parameters below ``path`` (its class, then its settings)."""
    found: dict[str, Scalar] = {path: _qualified(tokenizer)}
    declared = getattr(tokenizer, "decision_identity", None)
    if callable(declared):
        found.update(flatten(declared(), path))
        return found
    if depth >= _DEPTH:
        return found
    for name, value in sorted(_attributes(tokenizer).items()):
        key = f"{path}.{name.lstrip('_')}"
        if value is None or isinstance(value, (str, int, float, bool)):
            found[key] = value
        elif callable(getattr(value, "count_tokens", None)):
            found.update(tokenizer_identity(value, key, depth + 1))
        elif callable(value) and hasattr(value, "__qualname__"):
            found[key] = _callable_name(value)
    return found


def _configured(value: object) -> object | None:
    """The core config of a configured strategy (an adapter's ``config``), or ``None``."""
    config = getattr(type(value), "config", None)
    if isinstance(config, property):
        return getattr(value, "config", None)
    return None


def stack_parameters(stack: CompactionStack) -> dict[str, Scalar]:
    """Every parameter of ``stack`` that changes a decision, by its dotted path."""
    strategy = stack.strategy
    found: dict[str, Scalar] = {"kind": stack.kind}
    found.update(flatten(_configured(strategy), "strategy"))
    host_fallback = stack.tool_results.host_fallback
    if host_fallback is not None:
        config = _configured(host_fallback)
        found.update(flatten(config, "fallback") if config is not None else {"fallback": _qualified(host_fallback)})
        fallback_tokenizer = getattr(host_fallback, "tokenizer", None)
        if fallback_tokenizer is not None:
            found.update(tokenizer_identity(fallback_tokenizer, "fallback.tokenizer"))
    recall = stack.recall
    found.update(flatten(recall.pin_rule, "recall.pin_rule"))
    found["recall.max_input_tokens"] = recall.max_input_tokens
    found["recall.trigger_fraction"] = recall.trigger_fraction
    found.update(tokenizer_identity(strategy.tokenizer))
    return found
