"""The shell's record cache answers exactly what a fresh conversion answers, pass after pass.

``HistoryCache`` reuses the records of unchanged messages between passes (by position,
then by contents list). Whatever happens to the list between two passes (copies as the
harness loads them, appends, messages inserted or removed, a content replaced inside a
shared list, flags and ids changed), its records must equal a conversion from scratch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from agent_framework import CharacterEstimatorTokenizer, Content, Message
from agent_framework._compaction import EXCLUDED_KEY
from hypothesis import given, note
from hypothesis import strategies as st

from histories import HISTORY_ATTRIBUTION, TODO_ATTRIBUTION, conversation_chunks, describe
from maf_compaction.adapters.convert import PRESERVED_KEY, HistoryCache, to_history
from maf_compaction.adapters.counting import MediaTokenEstimator

NOTE_KIND = "anchored"
_COUNTER = MediaTokenEstimator(CharacterEstimatorTokenizer()).parts

Edit = Callable[[list[Message], st.DataObject], list[Message]]


def _loaded(messages: list[Message], data: st.DataObject) -> list[Message]:
    """Fresh shallow copies, as the harness loads stored history (contents stay shared)."""
    copies = []
    for message in messages:
        loaded = copy.copy(message)
        loaded.additional_properties = dict(message.additional_properties)
        loaded.additional_properties.setdefault("_attribution", dict(HISTORY_ATTRIBUTION))
        copies.append(loaded)
    return copies


def _insert(messages: list[Message], data: st.DataObject) -> list[Message]:
    index = data.draw(st.integers(0, len(messages)), label="insert at")
    return [*messages[:index], Message("assistant", ["an inserted note"]), *messages[index:]]


def _remove(messages: list[Message], data: st.DataObject) -> list[Message]:
    if not messages:
        return messages
    index = data.draw(st.integers(0, len(messages) - 1), label="remove at")
    return messages[:index] + messages[index + 1 :]


def _replace_content_in_place(messages: list[Message], data: st.DataObject) -> list[Message]:
    """Swap one Content inside a contents list that other copies share: every copy changes."""
    candidates = [m for m in messages if m.contents]
    if not candidates:
        return messages
    message = data.draw(st.sampled_from(candidates), label="edited message")
    slot = data.draw(st.integers(0, len(message.contents) - 1), label="slot")
    message.contents[slot] = Content.from_text("replaced in place " + "x" * data.draw(st.integers(0, 40)))
    return messages


def _flags(messages: list[Message], data: st.DataObject) -> list[Message]:
    """Change flags, ids and attribution on some messages (each copy has its own dict)."""
    if not messages:
        return messages
    for _ in range(data.draw(st.integers(1, 3))):
        message = data.draw(st.sampled_from(messages), label="flagged message")
        key = data.draw(st.sampled_from(["excluded", "preserved", "id", "attribution", "note"]), label="flag")
        props = message.additional_properties
        if key == "excluded":
            props[EXCLUDED_KEY] = not props.get(EXCLUDED_KEY, False)
        elif key == "preserved":
            props[PRESERVED_KEY] = data.draw(st.sampled_from([True, False, 1, 0, None]))
        elif key == "id":
            message.message_id = data.draw(st.sampled_from([None, "renamed", f"id-{len(messages)}"]))
        elif key == "attribution":
            props["_attribution"] = data.draw(
                st.sampled_from(
                    [
                        dict(HISTORY_ATTRIBUTION),
                        dict(TODO_ATTRIBUTION),
                        {"source_id": "memory"},  # a dict without source_type: injected
                        "not a dict",  # not an attribution the framework writes: history
                        {"source_type": 7},
                    ]
                )
            )
        else:
            props["_maf_compaction_note"] = data.draw(st.sampled_from([NOTE_KIND, "other", None]))
    return messages


EDITS: dict[str, Edit] = {
    "load copies": _loaded,
    "insert": _insert,
    "remove": _remove,
    "replace content in place": _replace_content_in_place,
    "change flags": _flags,
}


@given(conversation_chunks(min_chunks=2, max_chunks=4, max_turns=6), st.data())
def test_cached_records_equal_a_fresh_conversion_after_any_edits(
    chunks: list[list[Message]], data: st.DataObject
) -> None:
    cache = HistoryCache(_COUNTER)
    messages: list[Message] = []
    for chunk in chunks:
        messages = [*messages, *chunk]
        # Several passes per chunk, each after a few edits (or none).
        for name in data.draw(st.lists(st.sampled_from(sorted(EDITS)), min_size=1, max_size=6), label="edits"):
            messages = EDITS[name](messages, data)
            note(f"after {name}:\n{describe(messages)}")
            cached = cache.history(messages, note_kind=NOTE_KIND)
            fresh = to_history(messages, _COUNTER, note_kind=NOTE_KIND)
            assert list(cached) == list(fresh)
            # A second pass over the very same list reuses every record object.
            again = cache.history(messages, note_kind=NOTE_KIND)
            assert all(a is b for a, b in zip(again, cached, strict=True))


def test_a_dict_attribution_without_source_type_is_injected_and_a_non_dict_one_is_not() -> None:
    """Both kinds in one pass: the per-pass memo must not give them the same answer."""
    odd = Message("user", ["odd"], additional_properties={"_attribution": "not a dict"})
    context = Message("user", ["context"], additional_properties={"_attribution": {"source_id": "memory"}})
    records = HistoryCache(_COUNTER).history([odd, context], note_kind=NOTE_KIND)
    assert [r.injected for r in records] == [False, True]
