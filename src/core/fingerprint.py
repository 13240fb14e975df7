"""A configuration's fingerprint: every parameter that changes a decision, as flat JSON-safe values.

A session's compaction state is only meaningful under the configuration that made it: a
state restored under another budget, tail, policy, mode or tokenizer would continue with
decisions the new configuration would not have made (and requests the provider never
cached). So the session entry carries the fingerprint of the stack that wrote it, and a
registry serves any session whose fingerprint matches its own, whichever instance wrote
it (:mod:`maf_compaction.adapters.sessions`).

The fingerprint is built generically from the configured values (frozen dataclasses,
tuples, mappings, scalars), so a parameter added to a config later is in it without a
hand-written list: :func:`flatten` walks the value and names each leaf by its path
(``strategy.records.keep_tail_groups``). Long texts (prompts) are kept as a digest, so the
entry stays small and the parameter can still be named.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Final, TypeAlias, cast

Scalar: TypeAlias = "str | int | float | bool | None"
Parameters: TypeAlias = "Mapping[str, Scalar]"

#: Texts longer than this are kept as a digest (prompts): named, compared, but not copied into every session.
LONG_TEXT: Final = 64
#: Parameters added after a release, by their last path component, with the value that keeps that release's
#: behaviour: an entry stored before one existed was written under that value, and a stack built with it
#: continues the entry as it was written.
ADDED: Final[Mapping[str, Scalar]] = {"payoff_share": None}


#: A dataclass field's metadata key: ``False`` leaves the field out (a value set per pass from the host's request,
#: not configured).
FINGERPRINT: Final = "fingerprint"


def _digest_text(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def flatten(value: object, path: str) -> dict[str, Scalar]:
    """Every leaf of ``value`` by its dotted path below ``path``.

    Dataclasses are walked field by field (but a field whose metadata says ``fingerprint: False``),
    mappings key by key, sequences and sets item by item (sets sorted by their text), scalars
    are kept (long texts as a digest); any other value is known by its type's qualified name.
    """
    if value is None or isinstance(value, (bool, int, float)):
        return {path: value}
    if isinstance(value, str):
        return {path: value if len(value) <= LONG_TEXT else _digest_text(value)}
    empty: dict[str, Scalar] = {}  # what stands for a value with no leaves
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        children = [
            (field.name, getattr(value, field.name))
            for field in dataclasses.fields(value)
            if field.metadata.get(FINGERPRINT, True)
        ]
    elif isinstance(value, Mapping):
        children = sorted(((str(k), v) for k, v in cast("Mapping[object, object]", value).items()), key=lambda c: c[0])
        empty = {path: "{}"}
    elif isinstance(value, (tuple, list, frozenset, set)):
        items = cast("tuple[object, ...] | list[object] | frozenset[object] | set[object]", value)
        children = list(enumerate(sorted(items, key=str) if isinstance(items, (frozenset, set)) else items))
        empty = {path: "[]"}
    else:
        return {path: f"{type(value).__module__}.{type(value).__qualname__}"}
    found = {leaf: item for name, child in children for leaf, item in flatten(child, f"{path}.{name}").items()}
    return found or empty


def digest(parameters: Parameters) -> str:
    """A short, stable digest of ``parameters`` (the same for equal parameters in any process)."""
    text = json.dumps(dict(parameters), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def differences(stored: Parameters, built: Parameters) -> tuple[tuple[str, Scalar, Scalar], ...]:
    """``(parameter, stored value, built value)`` for every parameter that differs (missing: ``None``), sorted.

    A parameter added after the entry was stored (:data:`ADDED`) differs only when the stack is built with
    another value than the one that kept the earlier behaviour.
    """
    return tuple(
        (name, stored.get(name), built.get(name))
        for name in sorted(set(stored) | set(built))
        if name not in stored or name not in built or stored[name] != built[name]
        if not _added_as_before(name, stored, built)
    )


def _added_as_before(name: str, stored: Parameters, built: Parameters) -> bool:
    """``name`` is missing from ``stored`` because it was added later, and ``built`` keeps the earlier behaviour."""
    last = name.rsplit(".", 1)[-1]
    return name not in stored and name in built and last in ADDED and built[name] == ADDED[last]
