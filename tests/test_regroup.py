"""Regrouping with the previous pass's grouping gives exactly what grouping from scratch gives."""

from __future__ import annotations

from collections.abc import Sequence

from agent_framework import CharacterEstimatorTokenizer, Content, Message
from hypothesis import given
from hypothesis import strategies as st

from histories import conversation_chunks
from maf_compaction.adapters.convert import HistoryCache
from maf_compaction.adapters.counting import MediaTokenEstimator
from maf_compaction.core.grouping import Grouping, group_records, regroup
from maf_compaction.core.model import MessageRecord


def _cache() -> HistoryCache:
    return HistoryCache(MediaTokenEstimator(CharacterEstimatorTokenizer())._parts)  # pyright: ignore[reportPrivateUsage]


def _same(incremental: Grouping, records: Sequence[MessageRecord]) -> None:
    scratch = regroup(records)
    assert incremental.all == scratch.all
    assert incremental.linked == scratch.linked
    assert incremental.declarations == scratch.declarations
    assert incremental.groups() == group_records(records)


@given(conversation_chunks(min_chunks=2, max_chunks=5, max_turns=10))
def test_growing_history_regroups_like_a_fresh_grouping(chunks: list[list[Message]]) -> None:
    """Each append-only extension, regrouped from the last grouping, equals grouping from scratch."""
    cache, grouping, messages = _cache(), None, list[Message]()
    for chunk in chunks:
        messages += chunk
        records = cache.history(messages, note_kind="anchored")
        grouping = regroup(records, grouping)
        _same(grouping, records)


@given(conversation_chunks(min_chunks=2, max_chunks=3, max_turns=10), st.data())
def test_a_changed_record_anywhere_regroups_like_a_fresh_grouping(
    chunks: list[list[Message]], data: st.DataObject
) -> None:
    """Replacing any earlier record (an edit, not an append) never leaves a stale group behind."""
    cache = _cache()
    first = [m for chunk in chunks for m in chunk]
    records = cache.history(first, note_kind="anchored")
    grouping = regroup(records)
    index = data.draw(st.integers(0, len(first) - 1))
    edited = list(records)
    edited[index] = MessageRecord(role=edited[index].role, parts=edited[index].parts, origin=index)
    _same(regroup(edited, grouping), edited)


def _assistant(*contents: Content) -> Message:
    return Message("assistant", list(contents))


def test_reasoning_runs_join_a_call_that_arrives_on_a_later_pass() -> None:
    cache = _cache()
    thinking = [Message("user", ["go"]), _assistant(Content.from_text_reasoning(text="a"))]
    thinking.append(_assistant(Content.from_text_reasoning(text="b")))
    first = cache.history(thinking, note_kind="anchored")
    grouping = regroup(first)
    assert [g.kind for g in grouping.groups()] == ["user", "assistant_text", "assistant_text"]
    later = [*thinking, _assistant(Content.from_function_call(call_id="c1", name="f", arguments="{}"))]
    records = cache.history(later, note_kind="anchored")
    regrouped = regroup(records, grouping)
    assert [g.kind for g in regrouped.groups()] == ["user", "tool_call"]
    _same(regrouped, records)


def test_a_late_result_linking_back_to_an_earlier_call_falls_back_to_a_full_grouping() -> None:
    cache = _cache()
    call = _assistant(Content.from_function_call(call_id="c1", name="f", arguments="{}"))
    first = [Message("user", ["go"]), call, Message("user", ["meanwhile"])]
    grouping = regroup(cache.history(first, note_kind="anchored"))
    later = [*first, Message("tool", [Content.from_function_result(call_id="c1", result="done")])]
    records = cache.history(later, note_kind="anchored")
    regrouped = regroup(records, grouping)
    assert regrouped.linked  # the call and its late result are one linked group
    assert [g.members for g in regrouped.groups()] == [(0,), (1, 3), (2,)]
    _same(regrouped, records)


def test_skipping_more_groups_than_there_are_leaves_none() -> None:
    records = _cache().history([Message("user", ["a"]), Message("assistant", ["b"])], note_kind="anchored")
    grouping = regroup(records)

    assert grouping.groups(skip_tail=5) == ()
    assert grouping.groups(skip_head=1, skip_tail=1) == ()
    assert grouping.groups(skip_head=5) == ()
    assert len(grouping.groups(skip_tail=1)) == 1
