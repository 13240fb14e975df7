"""The package's property tests draw histories as framework messages, from ``maf_compaction.testing``.

The generator is ``maf_compaction.testing`` (one copy: a host's checks and ours draw the same
conversations, see its strategies module for what they cover); this module makes fresh
Agent Framework ``Message`` objects of every draw, and builds the other lists a pass sees:
:func:`with_injected_context` (the harness's todo list at position 0, loaded copies
attributed to the history provider), :func:`reshape_opaque_payloads` (the same history
with opaque payloads of other lengths) and :func:`describe` (a readable rendering for
``hypothesis.note``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import cast

from agent_framework import Content, Message
from hypothesis import strategies as st

from maf_compaction import testing
from maf_compaction.testing import messages as drawn
from maf_compaction.testing.strategies import opaque_blob

__all__ = [
    "HISTORY_ATTRIBUTION",
    "NOTE_KEY",
    "TODO_ATTRIBUTION",
    "Chunks",
    "conversation_and_extension",
    "conversation_chunks",
    "conversations",
    "deep_copy_messages",
    "describe",
    "is_injected_todo",
    "reshape_opaque_payloads",
    "with_injected_context",
]

#: What ``SessionContext.extend_messages`` stamps on the copies a history provider loads.
HISTORY_ATTRIBUTION: dict[str, str] = {"source_id": "in_memory", "source_type": "InMemoryHistoryProvider"}
#: What the harness's todo list carries (``TodoProvider`` is a context provider, not history).
TODO_ATTRIBUTION: dict[str, str] = {"source_id": "todo", "source_type": "TodoProvider"}
#: The key our notes carry (mirrors ``maf_compaction.adapters.convert.NOTE_KEY``).
NOTE_KEY = "_maf_compaction_note"

Chunks = list[list[Message]]


# ----------------------------------------------------------------------------- framework messages of the draws


def to_content(content: drawn.Content) -> Content:
    """The framework content of one drawn content."""
    if isinstance(content, drawn.Text):
        return Content.from_text(content.text)
    if isinstance(content, drawn.Media):
        if content.data is not None:
            return Content.from_data(content.data, content.media_type)
        return Content.from_uri(content.uri or "", media_type=content.media_type)
    if isinstance(content, drawn.Call):
        arguments = content.arguments if isinstance(content.arguments, str) else dict(content.arguments)
        return Content.from_function_call(call_id=content.call_id, name=content.name, arguments=arguments)
    if isinstance(content, drawn.Reasoning):
        return Content.from_text_reasoning(
            id=content.reasoning_id, text=content.text, protected_data=content.protected_data
        )
    if isinstance(content.result, str):
        return Content.from_function_result(call_id=content.call_id, result=content.result, exception=content.exception)
    return Content.from_function_result(call_id=content.call_id, result=[to_content(item) for item in content.result])


def to_messages(messages: Sequence[drawn.Drawn]) -> list[Message]:
    """Fresh framework messages of drawn ones."""
    return [Message(m.role, [to_content(content) for content in m.contents], message_id=m.message_id) for m in messages]


# ----------------------------------------------------------------------------- public strategies


def conversations(min_turns: int = 1, max_turns: int = 8) -> st.SearchStrategy[list[Message]]:
    """A fresh history of ``min_turns`` to ``max_turns`` user turns (``maf_compaction.testing.conversations``)."""
    return testing.conversations(min_turns, max_turns).map(to_messages)


def conversation_chunks(
    min_chunks: int = 2, max_chunks: int = 4, min_turns: int = 1, max_turns: int = 8
) -> st.SearchStrategy[Chunks]:
    """A history cut between steps into ``min_chunks`` to ``max_chunks`` non-empty chunks.

    ``chunks[0]`` is what was stored first; each later chunk is an append-only extension,
    so every ``sum(chunks[:i])`` is a valid history that starts the next one.
    """
    return testing.conversation_chunks(min_chunks, max_chunks, min_turns, max_turns).map(
        lambda chunks: [to_messages(chunk) for chunk in chunks]
    )


def conversation_and_extension(
    min_turns: int = 1, max_turns: int = 8
) -> st.SearchStrategy[tuple[list[Message], list[Message]]]:
    """``(prefix, extra)``: ``prefix + extra`` is a history and ``prefix`` is exactly its start."""
    return testing.conversation_and_extension(min_turns, max_turns).map(
        lambda pair: (to_messages(pair[0]), to_messages(pair[1]))
    )


def deep_copy_messages(messages: Sequence[Message]) -> list[Message]:
    """Independent copies: compacting them never touches ``messages``."""
    return copy.deepcopy(list(messages))


def with_injected_context(messages: Sequence[Message], *, loaded: int | None = None) -> list[Message]:
    """The list a harness model call sees: a todo list at position 0, then the history.

    The first ``loaded`` messages (all by default) are copies a history provider loaded
    and carry its ``_attribution``; the rest are this run's own new messages.
    """
    count = len(messages) if loaded is None else loaded
    copies = deep_copy_messages(messages)
    for message in copies[:count]:
        message.additional_properties["_attribution"] = dict(HISTORY_ATTRIBUTION)
    todo = Message(
        "user",
        ["## Todo list\n- [x] gather the ticket history\n- [ ] reconcile the invoice totals\n- [ ] report back"],
        message_id="todo_context",
        additional_properties={"_attribution": dict(TODO_ATTRIBUTION)},
    )
    return [todo, *copies]


def is_injected_todo(message: Message) -> bool:
    """The message is the todo list :func:`with_injected_context` put in."""
    attribution = message.additional_properties.get("_attribution")
    return isinstance(attribution, dict) and attribution.get("source_type") == TODO_ATTRIBUTION["source_type"]


def reshape_opaque_payloads(messages: Sequence[Message], lengths: Sequence[int]) -> list[Message]:
    """Copies whose opaque reasoning payloads have other lengths (0 removes them).

    The i-th reasoning part with a payload gets ``lengths[i % len(lengths)]`` characters of
    opaque data: a bare blob is replaced (or dropped), and in a JSON payload only the
    ``encrypted_content`` or ``signature`` member, or the ``data`` of a
    ``reasoning.encrypted`` entry, changes (or is dropped). Clear text (reasoning text, a
    JSON summary) is left exactly as it was.
    """
    copies = deep_copy_messages(messages)
    index = 0
    for message in copies:
        for content in message.contents:
            if content.type != "text_reasoning" or not content.protected_data:
                continue
            length = lengths[index % len(lengths)] if lengths else 0
            content.protected_data = _reshaped(content.protected_data, length, seed=index)
            index += 1
    return copies


def _reshaped(payload: str, length: int, *, seed: int) -> str | None:
    try:
        parsed: object = json.loads(payload)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return json.dumps(_reshaped_entry(cast("dict[str, object]", parsed), length, seed))
    if isinstance(parsed, list):
        entries = cast("list[object]", parsed)
        return json.dumps(
            [_reshaped_entry(cast("dict[str, object]", e), length, seed) if isinstance(e, dict) else e for e in entries]
        )
    return opaque_blob(seed, length) if length else None


def _reshaped_entry(entry: dict[str, object], length: int, seed: int) -> dict[str, object]:
    data = dict(entry)
    opaque = ["encrypted_content", "signature"]
    if data.get("type") == "reasoning.encrypted":
        opaque.append("data")
    for key in opaque:
        if key in data:
            if length:
                data[key] = opaque_blob(seed, length)
            else:
                del data[key]
    return data


def describe(messages: Sequence[Message]) -> str:
    """A readable one-line-per-message rendering, for ``hypothesis.note`` on failure."""
    lines: list[str] = []
    for index, message in enumerate(messages):
        parts: list[str] = []
        for content in message.contents:
            if content.type == "function_call":
                parts.append(f"call({content.call_id}, {content.name})")
            elif content.type == "function_result":
                parts.append(f"result({content.call_id}, {len(str(content.result or ''))} chars)")
            elif content.type == "text_reasoning":
                parts.append(f"reasoning({len(content.text or '')} chars, opaque {len(content.protected_data or '')})")
            elif content.type == "text":
                parts.append(f"text({len(content.text or '')} chars)")
            else:
                parts.append(content.type)
        flags = " excluded" if message.additional_properties.get("_excluded") else ""
        flags += " injected" if is_injected_todo(message) else ""
        flags += " note" if message.additional_properties.get(NOTE_KEY) else ""
        lines.append(f"{index:3d} {message.role:<9} {message.message_id or '-'}{flags}: {', '.join(parts)}")
    return "\n".join(lines)
