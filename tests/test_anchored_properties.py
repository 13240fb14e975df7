"""Property-based tests of DESIGN.md's invariants for the anchored strategies.

Every property runs over generated tool-using histories (``histories.py``) with small
budgets, so shortening and shedding really happen, for ``AnchoredCompactionStrategy``
and ``MinimumGainAnchoredCompactionStrategy`` alike. The properties use the public
behaviour (``await strategy(messages)`` in place, ``last_report``, ``decision_state``);
where one needs the band, it asks ``maf_compaction.core.anchored.band_groups`` or
regroups with ``group_records``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import pytest
from agent_framework import CharacterEstimatorTokenizer, Content, Message
from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.strategies import DrawFn

from histories import (
    NOTE_KEY,
    Chunks,
    conversation_and_extension,
    conversation_chunks,
    conversations,
    deep_copy_messages,
    describe,
    is_injected_todo,
    reshape_opaque_payloads,
    with_injected_context,
)
from maf_compaction import (
    AnchoredCompactionStrategy,
    AnchoredSnapshot,
    MediaTokenEstimator,
    MinimumGainAnchoredCompactionStrategy,
    SnapshotError,
    SnapshotVersionError,
    original_results,
)
from maf_compaction.adapters.convert import to_history
from maf_compaction.core.anchored import TEXT_NOTE, TOOL_NOTE_PREFIX, AnchoredConfig, Report, band_groups
from maf_compaction.core.counting import MESSAGE_OVERHEAD_TOKENS
from maf_compaction.core.envelope import READS
from maf_compaction.core.grouping import group_records
from maf_compaction.core.model import Group
from snapshot_values import anchored_snapshots

StrategyKind = Literal["anchored", "min_gain"]
BOTH: tuple[StrategyKind, ...] = ("anchored", "min_gain")

#: Independent counting on the strategies' basis (a separate instance, a separate cache).
ESTIMATOR = MediaTokenEstimator(CharacterEstimatorTokenizer())
COUNTER = ESTIMATOR._parts  # pyright: ignore[reportPrivateUsage]


# ----------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class Params:
    """One strategy configuration, small enough that compaction happens."""

    kind: StrategyKind
    max_input_tokens: int
    keep_head_groups: int
    keep_tail_groups: int
    band_share: float
    low_water_fraction: float
    collapse_assistant_text: bool
    keep_tokens: int | None
    min_gain_fraction: float

    def build(self) -> AnchoredCompactionStrategy:
        """A fresh strategy instance (fresh snapshot, fresh count cache)."""
        common: dict[str, Any] = {
            "max_input_tokens": self.max_input_tokens,
            "tokenizer": CharacterEstimatorTokenizer(),
            "keep_head_groups": self.keep_head_groups,
            "keep_tail_groups": self.keep_tail_groups,
            "band_share": self.band_share,
            "low_water_fraction": self.low_water_fraction,
            "collapse_assistant_text": self.collapse_assistant_text,
            "keep_tokens": self.keep_tokens,
        }
        if self.kind == "min_gain":
            return MinimumGainAnchoredCompactionStrategy(min_gain_fraction=self.min_gain_fraction, **common)
        return AnchoredCompactionStrategy(**common)

    @property
    def config(self) -> AnchoredConfig:
        """The core configuration the strategy runs with."""
        return self.build().config


@st.composite
def params(draw: DrawFn, kinds: Sequence[StrategyKind] = BOTH) -> Params:
    """Budgets of 300 to 6,000 tokens and anchors of a few groups, so bands are busy."""
    kind = draw(st.sampled_from(list(kinds)))
    return Params(
        kind=kind,
        max_input_tokens=draw(st.integers(300, 6_000)),
        keep_head_groups=draw(st.integers(0, 4)),
        keep_tail_groups=draw(st.integers(0, 5)),
        band_share=draw(st.sampled_from([0.25, 0.1, 0.5, 1.0]) | st.floats(0.01, 1.0)),
        low_water_fraction=draw(st.sampled_from([0.75, 0.5, 1.0]) | st.floats(0.05, 1.0)),
        collapse_assistant_text=draw(st.integers(0, 3)) > 0,
        keep_tokens=draw(st.integers(0, 300)) if draw(st.integers(0, 4)) >= 3 else None,
        min_gain_fraction=draw(st.sampled_from([0.29, 0.1, 0.5]) | st.floats(0.0, 0.99)) if kind == "min_gain" else 0,
    )


# ----------------------------------------------------------------------------- helpers


def run(strategy: AnchoredCompactionStrategy, messages: list[Message]) -> Report:
    """One pass, through the framework protocol (``await strategy(messages)``)."""
    asyncio.run(strategy(messages))
    report = strategy.last_report
    assert report is not None
    if currently_in_test_context():
        # Shown by ``pytest --hypothesis-show-statistics``: the properties are only worth
        # something if passes really shorten, shed, decline and overflow.
        event("pass sheds" if report.shed else "pass sheds nothing")
        event("pass shortens" if report.shortened else "pass shortens nothing")
        event("pass overflows" if report.overflow else "pass fits")
        if report.declined:
            event("pass declines a collapse")
    return report


def render(message: Message, *, flag: bool = True, opaque: bool = True) -> str:
    """Canonical bytes of a message: role, id, excluded flag and every content's ``to_dict``."""
    contents: list[dict[str, Any]] = []
    for content in message.contents:
        data = content.to_dict()
        data.pop("raw_representation", None)
        if not opaque:
            data.pop("protected_data", None)
        contents.append(data)
    payload: dict[str, Any] = {"role": message.role, "message_id": message.message_id, "contents": contents}
    if flag:
        payload["excluded"] = is_excluded(message)
    return json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)


def rendering(messages: Iterable[Message], *, opaque: bool = True) -> list[str]:
    """The whole list, excluded messages and notes included."""
    return [render(m, opaque=opaque) for m in messages]


def projection(messages: Iterable[Message]) -> list[str]:
    """What the model is sent: the included messages, injected context left out."""
    return [render(m, flag=False) for m in messages if not is_excluded(m) and not is_injected_todo(m)]


def is_excluded(message: Message) -> bool:
    """The message carries the framework's exclusion flag."""
    return bool(message.additional_properties.get("_excluded", False))


def is_note(message: Message) -> bool:
    """The message is a note the anchored strategy inserted."""
    return message.additional_properties.get(NOTE_KEY) == "anchored"


def tokens(messages: Iterable[Message]) -> int:
    """Included tokens, counted independently of the strategy."""
    return sum(ESTIMATOR.count_message_tokens(m) for m in messages if not is_excluded(m))


def worth_shedding(messages: Sequence[Message], group: Group) -> bool:
    """The group is still included and frees more than the longest note that could replace it."""
    members = [messages[i] for i in group.members]
    if all(is_excluded(m) for m in members):
        return False
    names = sorted({c.name for m in members for c in m.contents if c.type == "function_call" and c.name})
    # A tool group whose call is gone (a late result) still leaves a tool note, without names.
    note = f"{TOOL_NOTE_PREFIX} ({', '.join(names)})]" if names else TOOL_NOTE_PREFIX + "]"
    if group.kind != "tool_call":
        note = TEXT_NOTE
    return tokens(members) > MESSAGE_OVERHEAD_TOKENS + ESTIMATOR.count_tokens(note)


def conversation_groups(messages: Sequence[Message]) -> list[Group]:
    """Groups over the conversation (injected context and notes left out), as list indices."""
    records = to_history(messages, COUNTER, note_kind="anchored")
    kept = [i for i, r in enumerate(records) if not r.injected and not r.note]
    groups = group_records([records[i] for i in kept])
    return [
        Group(kind=g.kind, members=tuple(kept[m] for m in g.members), has_reasoning=g.has_reasoning) for g in groups
    ]


def band(config: AnchoredConfig, messages: Sequence[Message]) -> tuple[Group, ...]:
    """The band groups of ``messages`` (indices into it)."""
    return band_groups(config, to_history(messages, COUNTER, note_kind="anchored"))


def sheddable(config: AnchoredConfig, groups: Iterable[Group]) -> list[Group]:
    """Band groups the strategy may shed: tool groups, and replies when it collapses them."""
    kinds = {"tool_call", "assistant_text"} if config.collapse_assistant_text else {"tool_call"}
    return [g for g in groups if g.kind in kinds]


def prefix_before(after: Sequence[Message], index_of: dict[int, int], boundary: int) -> list[str]:
    """The projection of ``after`` up to the first original message at index ``boundary`` or later.

    Notes stand right before the group they replace, so notes directly in front of that
    message belong to a group at or after the boundary and are left out too.
    """
    kept: list[Message] = []
    for message in after:
        origin = index_of.get(id(message))
        if origin is not None and origin >= boundary:
            break
        kept.append(message)
    while kept and is_note(kept[-1]):
        kept.pop()
    return projection(kept)


def index_by_identity(messages: Sequence[Message]) -> dict[int, int]:
    """Each message object's index in ``messages`` (a pass inserts notes, so positions shift)."""
    return {id(m): i for i, m in enumerate(messages)}


# ----------------------------------------------------------------------------- 1. determinism


@given(conversations(min_turns=1, max_turns=10), params())
def test_same_input_gives_the_same_bytes(messages: list[Message], p: Params) -> None:
    """Two fresh strategies on copies of one history leave byte-identical lists and decisions."""
    note(describe(messages))
    first, second = deep_copy_messages(messages), deep_copy_messages(messages)
    a, b = p.build(), p.build()
    assert run(a, first) == run(b, second)
    assert rendering(first) == rendering(second)
    assert a.decision_state() == b.decision_state()


@given(conversations(min_turns=1, max_turns=10), params())
def test_a_second_pass_changes_nothing(messages: list[Message], p: Params) -> None:
    """Compacting an already compacted list again returns False and leaves every byte as it was."""
    note(describe(messages))
    strategy = p.build()
    compacted = deep_copy_messages(messages)
    run(strategy, compacted)
    before, decisions = rendering(compacted), strategy.decision_state()
    assert asyncio.run(strategy(compacted)) is False
    assert rendering(compacted) == before
    assert strategy.decision_state() == decisions


# ----------------------------------------------------------------------------- 2. prefix stability


def first_allowed_change(p: Params, before: Sequence[Message], after: Sequence[Message], committed: int) -> int:
    """Index of the first message a pass after append-only growth may change.

    That is the start of the first band group that was not in the band before (it aged
    out of the tail, or arrived with the extension). The minimum-gain strategy may also
    apply, at once, the collapses it declined earlier: from band tool position
    ``committed`` (its snapshot's commitment before the pass) on.
    """
    config = p.config
    old = {g.start for g in band(config, before)}
    new = band(config, after)
    starts = [g.start for g in new if g.start not in old]
    tools = [g for g in new if g.kind == "tool_call"]
    if committed < len(tools):
        starts.append(tools[committed].start)
    return min([*starts, len(before)])  # messages of the extension are new anyway


@given(conversation_chunks(min_chunks=2, max_chunks=4, min_turns=2, max_turns=10), params())
def test_growth_keeps_the_prefix(chunks: Chunks, p: Params) -> None:
    """Growth leaves every included message before the first newly banded group byte-identical, unless a pass sheds."""
    strategy = p.build()
    history: list[Message] = []
    previous: tuple[list[Message], dict[int, int]] | None = None
    for chunk in chunks:
        grown = [*history, *chunk]
        committed = strategy.decision_state().shortened
        current = deep_copy_messages(grown)  # the harness loads fresh copies every pass
        index_of = index_by_identity(current)
        report = run(strategy, current)
        if previous is not None:
            note(describe(grown))
            if report.shed:
                assert report.tokens_before > p.max_input_tokens, "a shed happened while the prompt fit"
            else:
                boundary = first_allowed_change(p, history, grown, committed)
                note(f"boundary {boundary}")
                before, before_index = previous
                assert prefix_before(current, index_of, boundary) == prefix_before(before, before_index, boundary)
        history, previous = grown, (current, index_of)


@given(conversation_chunks(min_chunks=3, max_chunks=10, min_turns=3, max_turns=12), params())
def test_sheds_are_rare(chunks: Chunks, p: Params) -> None:
    """A pass sheds only when the growth outgrew the room the last pass left, and then frees room to low water."""
    strategy = p.build()
    config = p.config
    low_water = math.floor(p.max_input_tokens * p.low_water_fraction)
    history: list[Message] = []
    room: int | None = None
    for chunk in chunks:
        history = [*history, *chunk]
        current = deep_copy_messages(history)
        originals = list(current)
        report = run(strategy, current)
        grown_by = tokens(chunk)
        # The earlier messages come back with the same decisions and cost at most what they
        # cost after the last pass (newly banded results only get shorter), so growth that
        # fits the room left cannot push the prompt over the budget.
        if room is not None and grown_by <= room:
            assert not report.shed, f"shed although {grown_by} new tokens fit the {room} left"
        if report.shed and not report.overflow:
            groups = sheddable(config, band(config, originals))
            exhausted = all(not worth_shedding(originals, g) for g in groups)
            assert report.tokens_after <= low_water or exhausted, "a shed stopped above the low-water mark"
        room = p.max_input_tokens - report.tokens_after
    assert strategy.shed_events <= strategy.passes == len(chunks)


# ----------------------------------------------------------------------------- 3. anchors


@given(conversations(min_turns=1, max_turns=10), params(), st.booleans())
def test_anchors_are_never_touched(messages: list[Message], p: Params, injected: bool) -> None:
    """Head and tail groups, every user and system message and injected context are neither excluded nor rewritten."""
    note(describe(messages))
    current = with_injected_context(messages) if injected else deep_copy_messages(messages)
    groups = conversation_groups(current)
    anchors = [
        *groups[: p.keep_head_groups],
        *(groups[len(groups) - p.keep_tail_groups :] if p.keep_tail_groups else []),
    ]
    protected = {i for g in anchors for i in g.members}
    protected |= {i for i, m in enumerate(current) if m.role in ("user", "system") or is_injected_todo(m)}
    expected = {id(current[i]): (current[i], render(current[i])) for i in protected}
    run(p.build(), current)
    present = {id(m) for m in current}
    for key, (message, before) in expected.items():
        assert key in present
        assert render(message) == before


# ----------------------------------------------------------------------------- 4. tool integrity


@given(conversations(min_turns=1, max_turns=10), params())
def test_tool_calls_and_results_share_one_fate(messages: list[Message], p: Params) -> None:
    """A function call and its result, and all other members of a tool group, are kept or excluded together."""
    note(describe(messages))
    current = deep_copy_messages(messages)
    groups = conversation_groups(current)
    calls: dict[str, list[Message]] = {}
    results: dict[str, list[Message]] = {}
    for message in current:
        for content in message.contents:
            if content.type == "function_call" and content.call_id:
                calls.setdefault(content.call_id, []).append(message)
            elif content.type == "function_result" and content.call_id:
                results.setdefault(content.call_id, []).append(message)
    originals = list(current)
    run(p.build(), current)
    for call_id, declared in calls.items():
        if len(declared) == 1:  # a reused call id is ambiguous; the framework does not pair it either
            fates = {is_excluded(m) for m in [*declared, *results.get(call_id, [])]}
            assert len(fates) == 1, f"call {call_id} and its result were split"
    for group in groups:
        if group.kind == "tool_call":
            assert len({is_excluded(originals[i]) for i in group.members}) == 1, "a tool group was split"


# ----------------------------------------------------------------------------- 5. two lists agree


@given(conversation_and_extension(min_turns=2, max_turns=10), params(), st.booleans(), st.booleans())
def test_in_call_copies_and_stored_history_agree(
    parts: tuple[list[Message], list[Message]], p: Params, in_call_first: bool, one_instance: bool
) -> None:
    """With the same decisions, the in-call copies and the stored history project to the same conversation."""
    stored, new = parts
    conversation = [*stored, *new]
    note(describe(conversation))
    in_call = with_injected_context(conversation, loaded=len(stored))
    stored_list = deep_copy_messages(conversation)
    first, second = (in_call, stored_list) if in_call_first else (stored_list, in_call)
    strategy = p.build()
    run(strategy, first)
    decisions = strategy.decision_state()
    if not one_instance:
        strategy = p.build()
        strategy.restore_decisions(decisions.to_dict())
    run(strategy, second)
    if strategy.decision_state() == decisions:
        assert projection(first) == projection(second)
    # The second pass may decide more (the lists differ in size by the todo list); with
    # the final decisions, the first list projects to what the second one does.
    replay = p.build()
    replay.restore_decisions(strategy.decision_state())
    again = (
        with_injected_context(conversation, loaded=len(stored)) if in_call_first else deep_copy_messages(conversation)
    )
    run(replay, again)
    assert projection(again) == projection(second)


@given(conversation_chunks(min_chunks=2, max_chunks=5, min_turns=2, max_turns=10), params())
def test_stored_history_compacted_in_place_agrees(chunks: Chunks, p: Params) -> None:
    """A stored list compacted in place as it grows agrees with fresh copies and is left alone by a fresh instance."""
    strategy = p.build()
    stored: list[Message] = []  # the after phase rewrites the stored messages themselves
    originals: list[Message] = []
    for chunk in chunks:
        stored.extend(deep_copy_messages(chunk))
        originals.extend(chunk)
        note(describe(stored))
        run(strategy, stored)
        loaded = p.build()
        loaded.restore_decisions(strategy.decision_state())
        copies = deep_copy_messages(originals)
        run(loaded, copies)
        assert projection(copies) == projection(stored), "fresh copies and the stored list disagree"
        # A restored session or another replica starts with no snapshot; the stored
        # history (its notes, exclusions and shortened results) must be enough.
        restarted = p.build()
        again = deep_copy_messages(stored)
        assert asyncio.run(restarted(again)) is False, "a fresh instance changed the stored history"
        assert projection(again) == projection(stored)


@given(conversation_chunks(min_chunks=2, max_chunks=5, min_turns=2, max_turns=10), params(), st.booleans())
def test_same_state_any_copy_same_bytes(chunks: Chunks, p: Params, restored: bool) -> None:
    """The same state on any copy of the same conversation gives the same bytes, excluded messages included."""
    strategy = p.build()
    stored: list[Message] = []
    originals: list[Message] = []
    for chunk in chunks:
        stored.extend(deep_copy_messages(chunk))
        originals.extend(chunk)
        note(describe(stored))
        run(strategy, stored)
        replica = strategy
        if restored:  # another replica, from the snapshot alone
            replica = p.build()
            replica.restore_decisions(strategy.decision_state().to_dict())
        copies = deep_copy_messages(originals)
        run(replica, copies)
        assert [m.to_dict() for m in copies] == [m.to_dict() for m in stored]


# ----------------------------------------------------------------------------- 6. budget


@given(conversations(min_turns=1, max_turns=10), params(), st.booleans(), st.none() | st.floats(0.2, 1.0))
def test_fits_the_budget_or_says_why_not(
    messages: list[Message], p: Params, injected: bool, ceiling_share: float | None
) -> None:
    """A pass ends within its ceiling, or reports overflow when even shedding every band group cannot fit."""
    note(describe(messages))
    current = with_injected_context(messages) if injected else deep_copy_messages(messages)
    config = p.config
    eligible = sheddable(config, band(config, current))
    members = {i for g in eligible for i in g.members}
    protected = sum(ESTIMATOR.count_message_tokens(m) for i, m in enumerate(current) if i not in members)
    originals = list(current)
    strategy = p.build()
    if ceiling_share is None:
        ceiling = p.max_input_tokens
        run(strategy, current)
    else:  # the seam a composition uses to compact below the budget
        ceiling = max(1, int(p.max_input_tokens * ceiling_share))
        strategy.compact_to(current, ceiling=ceiling)
    report = strategy.last_report
    assert report is not None
    assert report.ceiling == ceiling
    assert report.tokens_after == tokens(current), "the report's total is not what the model is sent"
    assert report.overflow == (report.tokens_after > ceiling)
    if report.overflow:
        # Every band group that may be shed was shed (or frees no more than its note would
        # cost), and what is left (anchors, user and system turns, injected context, the
        # notes the sheds leave, groups too small to shed) is still too big.
        assert all(not worth_shedding(originals, g) for g in eligible), "overflow while a band group could still go"
        notes = [m for m in current if is_note(m)]
        kept_small = [originals[i] for g in eligible for i in g.members if not is_excluded(originals[i])]
        assert protected + tokens(notes) + tokens(kept_small) > ceiling


def _short_replies(count: int) -> list[Message]:
    """Brief assistant replies; each costs fewer tokens than the note a shed would leave."""
    return [Message("assistant", ["Done, ticket updated."]) for _ in range(count)]


def _budget_strategy() -> AnchoredCompactionStrategy:
    return AnchoredCompactionStrategy(
        max_input_tokens=1_000, tokenizer=CharacterEstimatorTokenizer(), keep_head_groups=0, keep_tail_groups=0
    )


def test_shedding_never_grows_the_prompt() -> None:
    """A pass never leaves the prompt bigger than it found it."""
    messages = [Message("user", ["x" * 3_584]), *_short_replies(30)]  # 900 + 30 x 9 = 1,170 tokens
    report = run(_budget_strategy(), messages)
    assert report.tokens_after <= report.tokens_before


def test_a_prompt_that_fits_after_shedding_tools_does_not_overflow() -> None:
    """Once shedding the band's tool group brings the prompt under the budget, the pass does not end over it."""
    call = Content.from_function_call(call_id="c1", name="search_docs", arguments="{}")
    result = Content.from_function_result(call_id="c1", result="row\n" * 2_000)
    messages = [
        Message("user", ["x" * 2_784]),  # 700 tokens of anchors, under the 1,000 budget
        Message("assistant", [call]),
        Message("tool", [result]),
        *_short_replies(30),  # 270 tokens; with the tool group's 19-token note the prompt is 989
    ]
    report = run(_budget_strategy(), messages)
    assert not report.overflow, f"{report.tokens_after} tokens although 989 would have fit"


# ----------------------------------------------------------------------------- 7. nothing lost silently


def logged_warnings(caplog: pytest.LogCaptureFixture) -> str:
    """The text of every WARNING logger ``maf_compaction`` emitted so far."""
    return " ".join(
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "maf_compaction"
    )


def names(message: Message, index: int, warnings: str) -> bool:
    """The warnings name ``message``: by its id, or by its place in the conversation when it has none.

    (Not by its list position: notes inserted before it would make that untrue.)
    """
    if message.message_id is None:
        return f"<{message.role} message {index + 1} of the conversation" in warnings
    return re.search(rf"(?<![\w#]){re.escape(message.message_id)}(?!\w)", warnings) is not None


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(messages=conversations(min_turns=1, max_turns=10), p=params())
def test_nothing_is_lost_silently(messages: list[Message], p: Params, caplog: pytest.LogCaptureFixture) -> None:
    """No message leaves the list, sheds are logged and marked by a note, and shortened results keep originals."""
    note(describe(messages))
    caplog.clear()
    current = deep_copy_messages(messages)
    originals = list(current)
    results = {id(m): [c.result for c in m.contents] for m in current}
    groups = conversation_groups(current)
    with caplog.at_level(logging.WARNING, logger="maf_compaction"):
        run(p.build(), current)
    warnings = logged_warnings(caplog)

    present = {id(m) for m in current}
    assert all(id(m) in present for m in originals), "a message disappeared from the list"
    for index, message in enumerate(originals):
        if is_excluded(message):
            assert names(message, index, warnings), f"shed {message.message_id or index} was not logged"
    for group in groups:
        if all(is_excluded(originals[i]) for i in group.members):
            position = next(i for i, m in enumerate(current) if m is originals[group.start])
            assert position > 0, "a shed group has no note before it"
            assert is_note(current[position - 1]), "a shed group has no note before it"
            assert not is_excluded(current[position - 1]), "a shed group's note is excluded"
    for message in originals:
        kept = original_results(message)
        call_ids = [c.call_id for c in message.contents]
        for index, (content, before) in enumerate(zip(message.contents, results[id(message)], strict=True)):
            if content.type == "function_result" and content.result != before:
                unique = bool(content.call_id) and call_ids.count(content.call_id) == 1
                key = content.call_id if unique else f"{content.call_id}#{index}"
                assert kept.get(key or "") == before, "a shortened result lost its original"


def _late_result_after_a_shed() -> tuple[Chunks, Params]:
    """A call is shed while its result is pending (an approval, a long job); then the result arrives."""
    call = Content.from_function_call(call_id="c1", name="build_report", arguments="{}")
    stored = [
        Message("user", ["build the quarterly report"], message_id="u1"),
        Message("assistant", [call], message_id="a1"),
        Message("user", ["meanwhile, " + "summarize the tickets " * 100], message_id="u2"),
        Message("assistant", ["Here is the summary. " * 100], message_id="a2"),
        Message("user", ["thanks"], message_id="u3"),
    ]
    arrived = [
        Message("tool", [Content.from_function_result(call_id="c1", result="report ready\n" * 20)], message_id="t1"),
        Message("assistant", ["The report is ready."], message_id="a3"),
    ]
    p = Params("anchored", 800, 1, 2, 0.25, 0.75, True, None, 0)
    return [stored, arrived], p


_LATE_CHUNKS, _LATE_PARAMS = _late_result_after_a_shed()


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@example(chunks=_LATE_CHUNKS, p=_LATE_PARAMS)
@given(chunks=conversation_chunks(min_chunks=2, max_chunks=5, min_turns=2, max_turns=10), p=params())
def test_growth_never_excludes_silently(chunks: Chunks, p: Params, caplog: pytest.LogCaptureFixture) -> None:
    """As the conversation grows, every message a pass excludes that was new or sent before is named in its WARNING."""
    strategy = p.build()
    history: list[Message] = []
    sent: set[int] = set()
    for chunk in chunks:
        known = len(history)
        history = [*history, *chunk]
        current = deep_copy_messages(history)
        originals = list(current)
        note(describe(history))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="maf_compaction"):
            run(strategy, current)
        warnings = logged_warnings(caplog)
        for index, message in enumerate(originals):
            if is_excluded(message) and (index >= known or index in sent):
                assert names(message, index, warnings), f"{message.message_id or index} was excluded silently"
        sent = {i for i, m in enumerate(originals) if not is_excluded(m)}


def test_originals_of_results_sharing_a_call_id() -> None:
    """Two shortened results sharing a call id (clients that use the tool name as id) both keep their originals."""
    table = "\n".join(f"code_{i}=TL-{i:06X} | row {i} | " + "value " * 10 for i in range(40))
    calls = [Content.from_function_call(call_id="search_docs", name="search_docs", arguments="{}") for _ in "ab"]
    texts = [f"first\n{table}", f"second\n{table}"]
    tool = Message("tool", [Content.from_function_result(call_id="search_docs", result=text) for text in texts])
    messages = [Message("user", ["find the codes"]), Message("assistant", calls), tool, Message("assistant", ["done"])]
    strategy = AnchoredCompactionStrategy(
        max_input_tokens=100_000,
        tokenizer=CharacterEstimatorTokenizer(),
        keep_head_groups=1,
        keep_tail_groups=1,
        keep_tokens=50,
    )
    run(strategy, messages)
    assert all(c.result not in texts for c in tool.contents), "both results are shortened"
    assert original_results(tool) == {"search_docs#0": texts[0], "search_docs#1": texts[1]}


# ----------------------------------------------------------------------------- 8. opaque payloads


@given(conversations(min_turns=1, max_turns=10), params(), st.lists(st.integers(0, 6_000), min_size=1, max_size=6))
def test_opaque_payloads_are_not_counted(messages: list[Message], p: Params, lengths: list[int]) -> None:
    """Opaque reasoning payloads of any length, or none, change no decision and no token total."""
    note(describe(messages))
    with_payloads = deep_copy_messages(messages)
    reshaped = reshape_opaque_payloads(messages, lengths)
    a, b = p.build(), p.build()
    report_a, report_b = run(a, with_payloads), run(b, reshaped)
    assert rendering(with_payloads, opaque=False) == rendering(reshaped, opaque=False)
    assert (report_a.tokens_before, report_a.tokens_after) == (report_b.tokens_before, report_b.tokens_after)
    assert a.decision_state() == b.decision_state()


# ----------------------------------------------------------------------------- 9. snapshots


#: Snapshots ``step`` could write (spared and sized positions below their watermarks, a head named).
snapshots = anchored_snapshots()


@given(snapshots)
def test_snapshot_round_trip(snapshot: AnchoredSnapshot) -> None:
    """A snapshot read back from its JSON dict equals the original."""
    assert AnchoredSnapshot.from_dict(json.loads(json.dumps(snapshot.to_dict()))) == snapshot


@given(conversation_and_extension(min_turns=2, max_turns=8), params())
def test_decisions_of_real_passes_round_trip(parts: tuple[list[Message], list[Message]], p: Params) -> None:
    """Decisions a strategy made survive ``to_dict``/``from_dict`` unchanged."""
    strategy = p.build()
    grown: list[Message] = []
    for chunk in parts:  # one conversation, growing: an instance serves one conversation
        grown += chunk
        run(strategy, deep_copy_messages(grown))
        state = strategy.decision_state()
        assert AnchoredSnapshot.from_dict(json.loads(json.dumps(state.to_dict()))) == state


@given(snapshots, st.integers(2, 99).filter(lambda version: version not in READS))
def test_newer_snapshot_versions_are_refused(snapshot: AnchoredSnapshot, version: int) -> None:
    """A snapshot of a version this build does not read (the pre-release 2 to 4, or a newer one) raises
    SnapshotVersionError naming that version (the long profile drew 5, which this build reads)."""
    data = snapshot.to_dict()
    data["version"] = version
    with pytest.raises(SnapshotVersionError, match=rf"\b{version}\b") as raised:
        AnchoredSnapshot.from_dict(data)
    assert raised.value.version == version
    with pytest.raises(SnapshotVersionError):
        AnchoredCompactionStrategy(max_input_tokens=1_000, tokenizer=CharacterEstimatorTokenizer()).restore_decisions(
            data
        )


def _stored(**fields: object) -> dict[str, object]:
    """A stored snapshot with every field (as ``to_dict`` writes it), ``fields`` changed: only they are wrong."""
    return {**AnchoredSnapshot().to_dict(), **fields}


def _without(name: str) -> dict[str, object]:
    data = _stored()
    del data[name]
    return data


#: Each malformed snapshot and what its refusal names.
MALFORMED: dict[str, tuple[object, str]] = {
    "not a mapping": ([1, 2, 3], "mapping"),
    "no version": (_without("version"), "'version'"),
    "version as text": (_stored(version="1"), "version '1'"),
    "version as bool": (_stored(version=True), "version True"),
    "another kind": (_stored(kind="summary"), "'summary'"),
    "missing field": (_without("shortened"), "'shortened'"),
    "negative field": (_stored(tools_shed=-1), "'tools_shed'"),
    "field as text": (_stored(tools_shed="3"), "'tools_shed'"),
    "field as bool": (_stored(texts_shed=False), "'texts_shed'"),
    "field as float": (_stored(shortened=1.5), "'shortened'"),
    "spared not a list": (_stored(spared_tools=3), "'spared_tools'"),
    "spared negative": (_stored(spared_texts=[-1]), r"'spared_texts\[0\]'"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_snapshots_are_refused(name: str) -> None:
    """A malformed snapshot raises SnapshotError, never a bare TypeError or KeyError."""
    assert AnchoredSnapshot.from_dict(_stored()) == AnchoredSnapshot()  # the base is well formed
    data, named = MALFORMED[name]
    with pytest.raises(SnapshotError, match=named):
        AnchoredSnapshot.from_dict(cast("Any", data))
