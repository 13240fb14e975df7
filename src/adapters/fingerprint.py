"""What a built stack's configuration is, as a fingerprint (see :mod:`maf_compaction.core.fingerprint`).

The parameters are read from the configured values themselves, never from a hand-written
list: the strategy's core config (the composition's holds both halves' and the record
half's in-pass fallback), the configuration of a fallback strategy the host gave the record
half, the recall middleware's pin rule, and the tokenizer's identity. The one list is of
parameters left out (``_REQUEST_SHAPES``): how records and summaries are asked for changes no
decision, so a session continues when the host changes it.

A tokenizer is known by its class and the settings it declares with a ``decision_identity()``
method (``TiktokenTokenizer`` names its encoding, not the file it was loaded from;
``MediaTokenEstimator`` its media estimates, its ``estimate_media`` hook and the tokenizer
it wraps). A host's own tokenizer whose counts depend on settings declares them the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from ..core.fingerprint import Scalar, flatten
from .recall import ToolResultRecallMiddleware

#: How deep wrapped tokenizers are followed.
_DEPTH = 4
#: Parameters that say how a request is made, not what a decision means: the request shape of
#: records (``record_request``) and of the composition's summaries (``summary_request``). A
#: state written under one shape continues under the other (its records and summaries replay
#: however they were asked for), so they are no part of the fingerprint.
_REQUEST_SHAPES: frozenset[str] = frozenset({"recall.pin_rule.aligned", "strategy.summary_request"})


def _qualified(value: object) -> str:
    kind = value if isinstance(value, type) else type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def _callable_name(value: Any) -> str:
    module = getattr(value, "__module__", None) or type(value).__module__
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    return f"{module}.{name}"


def tokenizer_identity(tokenizer: object, path: str = "tokenizer", depth: int = 0) -> dict[str, Scalar]:
    """The tokenizer's identity as flat parameters below ``path``: its class, then what it declares.

    A tokenizer declares the settings that change its counts with a ``decision_identity()``
    method returning a mapping: scalars are kept, a wrapped tokenizer is identified the same
    way, a callable by its qualified name. A tokenizer without one is known by its class
    alone (its attributes may be counters or caches, which must not make two equal
    tokenizers differ).
    """
    found: dict[str, Scalar] = {path: _qualified(tokenizer)}
    declared = getattr(tokenizer, "decision_identity", None)
    if not callable(declared) or depth >= _DEPTH:
        return found
    settings = declared()
    if not isinstance(settings, Mapping):
        return found
    for name, value in sorted(cast("Mapping[object, object]", settings).items(), key=lambda pair: str(pair[0])):
        key = f"{path}.{name}"
        if value is None or isinstance(value, (str, int, float, bool)):
            found[key] = value
        elif callable(getattr(value, "count_tokens", None)):
            found.update(tokenizer_identity(value, key, depth + 1))
        elif callable(value):
            found[key] = _callable_name(value)
        else:
            found.update(flatten(value, key))
    return found


def _configured(value: object) -> object | None:
    """The core config of a configured strategy (an adapter's ``config``), or ``None``."""
    return getattr(value, "config", None) if isinstance(getattr(type(value), "config", None), property) else None


def stack_parameters(
    kind: str, strategy: Any, host_fallback: object | None, recall: ToolResultRecallMiddleware
) -> dict[str, Scalar]:
    """Every parameter of a stack that changes a decision, by its dotted path: its ``kind``, its ``strategy``'s
    config and tokenizer, the record half's ``host_fallback`` (or ``None``) and the ``recall`` middleware's."""
    found: dict[str, Scalar] = {"kind": kind}
    found.update(flatten(strategy.config, "strategy"))
    if host_fallback is not None:
        config = _configured(host_fallback)
        found.update(flatten(config, "fallback") if config is not None else {"fallback": _qualified(host_fallback)})
        fallback_tokenizer = getattr(host_fallback, "tokenizer", None)
        if fallback_tokenizer is not None:
            found.update(tokenizer_identity(fallback_tokenizer, "fallback.tokenizer"))
    found.update(flatten(recall.pin_rule, "recall.pin_rule"))
    found["recall.max_input_tokens"] = recall.max_input_tokens
    found["recall.trigger_fraction"] = recall.trigger_fraction
    found.update(tokenizer_identity(strategy.tokenizer))
    return {name: value for name, value in found.items() if name not in _REQUEST_SHAPES}
