"""The counting basis: what of a message the model sees, and so what we count.

We count text, tool names and arguments, tool results, clear-text reasoning and a
small per-message overhead. Media parts count at a fixed estimate the shell supplies
(never by the length of a base64 string or a URL), and opaque provider payloads count
zero: a non-JSON ``protected_data`` blob, and ``encrypted_content``, ``signature`` and
``thought_signature`` members at any depth. The provider never tokenises ciphertext,
and counting it (three to four tokens per character of base64 under o200k_base) made
the framework's compaction fire early; see the bug report in the project's seeds.

Metadata a client keeps beside a part (``additional_properties``, ``raw_representation``)
is not prompt text and is not counted either.

:data:`BASIS_VERSION` changes whenever this basis changes, so cached counts made on an
older basis are never reused.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import cast

from .model import TOOL_CALL_KINDS

#: Bumped whenever what we count changes.
BASIS_VERSION = 1

#: Tokens charged per message for role and framing, as chat formats do (OpenAI documents
#: three to four).
MESSAGE_OVERHEAD_TOKENS = 4

#: Keys whose values are opaque provider payloads, dropped at any depth.
OPAQUE_KEYS: frozenset[str] = frozenset({"encrypted_content", "signature", "thought_signature"})

#: The ``reasoning_details`` entry type whose ``data`` member is ciphertext.
ENCRYPTED_ENTRY_TYPE = "reasoning.encrypted"

Measure = Callable[[str], int]


def strip_opaque(value: object) -> object:
    """Drop opaque members at any depth; ``None`` when nothing readable is left.

    Besides :data:`OPAQUE_KEYS`, a ``reasoning_details`` entry of type
    ``reasoning.encrypted`` keeps its ciphertext under ``data``, which is dropped too.
    """
    if isinstance(value, dict):
        entries = cast("dict[str, object]", value)
        dropped = OPAQUE_KEYS | {"data"} if entries.get("type") == ENCRYPTED_ENTRY_TYPE else OPAQUE_KEYS
        stripped = {key: strip_opaque(item) for key, item in entries.items() if key not in dropped}
        return {key: item for key, item in stripped.items() if item is not None} or None
    if isinstance(value, list):
        items = [s for s in (strip_opaque(item) for item in cast("list[object]", value)) if s is not None]
        return items or None
    return value


def clear_reasoning_text(protected_data: str | None) -> str:
    """The readable part of a reasoning ``protected_data`` payload.

    A JSON structure (the Chat Completions ``reasoning_details``) is replayed as clear
    text except for its opaque members, so what is left of it counts. Anything else
    (a Responses ``encrypted_content`` blob, an Anthropic thinking signature, a Gemini
    thought signature) is opaque and counts zero.
    """
    try:
        parsed: object = json.loads(protected_data) if protected_data else None
    except ValueError:
        return ""
    stripped = strip_opaque(cast("object", parsed)) if isinstance(parsed, (dict, list)) else None
    return "" if stripped is None else compact_json(stripped)


def is_json_container(text: str) -> bool:
    """``text`` is a JSON object or array (a tool returned structured data)."""
    if text.lstrip()[:1] not in ("{", "["):
        return False
    try:
        parsed: object = json.loads(text)
    except ValueError:
        return False
    return isinstance(parsed, (dict, list))


def call_text(name: str | None, arguments: str) -> str:
    """What a tool call shows the model: its name and its arguments."""
    return f"{name or ''} {arguments}".strip()


def arguments_text(arguments: object) -> str:
    """A call's arguments as the string the provider receives."""
    if arguments is None or isinstance(arguments, str):
        return arguments or ""
    return compact_json(arguments)


def compact_json(value: object) -> str:
    """``value`` as compact JSON with sorted keys (what we count for structured text)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)


def message_tokens(part_tokens: Iterable[int]) -> int:
    """Tokens of a message: its parts plus the per-message overhead."""
    return MESSAGE_OVERHEAD_TOKENS + sum(part_tokens)


def visible_text(
    kind: str,
    *,
    text: str | None = None,
    name: str | None = None,
    arguments: object = None,
    result: object = None,
    protected_data: str | None = None,
) -> str:
    """The text a part of ``kind`` shows the model, from its fields.

    Media kinds show nothing (they count at an estimate); kinds without a rule here go
    through :func:`other_text`. A result's ``exception`` is host-side diagnostics that
    clients never send, so it is not an argument.
    """
    if kind == "text":
        return text or ""
    if kind == "function_result":
        return result_text(result)
    if kind in TOOL_CALL_KINDS:
        return call_text(name, arguments_text(arguments))
    if kind == "text_reasoning":
        return (text or "") + clear_reasoning_text(protected_data)
    return ""


def result_text(result: object) -> str:
    """A tool result as clients send it: a string as is, anything else as JSON.

    Like the framework's OpenAI clients, a value JSON cannot encode (a tuple key, a
    circular structure) is sent as its ``str``.
    """
    if result is None or isinstance(result, str):
        return result or ""
    try:
        return json.dumps(result, default=str)
    except (TypeError, ValueError):
        return str(result)


def other_text(payload: Mapping[str, object]) -> str:
    """A compact rendering of a content kind with no dedicated rule (errors, approvals...).

    ``payload`` is the content's dict; metadata, raw provider objects, mirrored items
    and opaque members are left out.
    """
    stripped = strip_opaque({k: v for k, v in payload.items() if k not in _NOT_VISIBLE})
    return compact_json(stripped) if stripped else ""


#: Dedicated rules exist for these kinds; everything else goes through :func:`other_text`.
RULED_KINDS: frozenset[str] = frozenset({"text", "function_result", "text_reasoning", *TOOL_CALL_KINDS})

_NOT_VISIBLE: frozenset[str] = frozenset(
    {"raw_representation", "additional_properties", "items", "protected_data", "type"}
)
