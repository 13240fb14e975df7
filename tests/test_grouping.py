"""Our grouping over core records partitions a history exactly like the framework's.

``maf_compaction.core.grouping`` restates ``agent_framework._compaction.group_messages``
so the pure core never imports the framework. Anchors, band positions and tool
integrity all rest on the two agreeing, so they are held to the same answer on
generated histories and on one hand-written example per rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from agent_framework import CharacterEstimatorTokenizer, Content, Message
from agent_framework._compaction import group_messages
from hypothesis import given, note

from histories import conversations, deep_copy_messages, describe
from maf_compaction.adapters.convert import to_history
from maf_compaction.adapters.counting import MediaTokenEstimator
from maf_compaction.core.grouping import group_records

#: (member indices, kind, has_reasoning) of one group.
GroupShape = tuple[tuple[int, ...], str, bool]

_COUNTER = MediaTokenEstimator(CharacterEstimatorTokenizer())._parts  # pyright: ignore[reportPrivateUsage]


def ours(messages: Sequence[Message]) -> list[GroupShape]:
    """Groups from ``maf_compaction.core.grouping``, in order of their first member."""
    records = to_history(messages, _COUNTER, note_kind="anchored")
    return [(group.members, group.kind, group.has_reasoning) for group in group_records(records)]


def framework(messages: Sequence[Message]) -> list[GroupShape]:
    """Groups from the framework: spans that share a ``group_id`` form one group."""
    spans = group_messages(deep_copy_messages(messages))  # it assigns missing message ids
    members: dict[str, list[int]] = {}
    kind: dict[str, str] = {}
    reasoning: dict[str, bool] = {}
    for span in spans:
        group_id = str(span["group_id"])
        members.setdefault(group_id, []).extend(range(int(span["start_index"]), int(span["end_index"]) + 1))
        kind.setdefault(group_id, str(span["kind"]))
        reasoning[group_id] = reasoning.get(group_id, False) or bool(span["has_reasoning"])
    shapes = [(tuple(sorted(m)), kind[g], reasoning[g]) for g, m in members.items()]
    return sorted(shapes, key=lambda shape: shape[0][0])


@given(conversations(min_turns=1, max_turns=10))
def test_grouping_matches_the_framework(messages: list[Message]) -> None:
    """For every generated history our groups equal the framework's: members, kind and has_reasoning."""
    note(describe(messages))
    assert ours(messages) == framework(messages)


@given(conversations(min_turns=1, max_turns=6))
def test_grouping_partitions_every_message(messages: list[Message]) -> None:
    """Every message belongs to exactly one group."""
    indices = sorted(i for members, _, _ in ours(messages) for i in members)
    assert indices == list(range(len(messages)))


# ----------------------------------------------------------------------------- one example per rule


def _system() -> Message:
    return Message("system", ["You are helpful."])


def _user(text: str = "hello") -> Message:
    return Message("user", [text])


def _text(text: str = "Here you go.") -> Message:
    return Message("assistant", [text])


def _reasoning(text: str = "") -> Content:
    return Content.from_text_reasoning(id="rs_1", text=text, protected_data="gAAAAABopaque==")


def _reasoning_only() -> Message:
    return Message("assistant", [_reasoning()])


def _call(*call_ids: str, reasoning: bool = False) -> Message:
    calls = [Content.from_function_call(call_id=c, name="search_docs", arguments='{"q": "x"}') for c in call_ids]
    return Message("assistant", [*([_reasoning("thinking")] if reasoning else []), *calls])


def _tool(*call_ids: str) -> Message:
    return Message("tool", [Content.from_function_result(call_id=c, result=f"result of {c}") for c in call_ids])


EXAMPLES: dict[str, tuple[list[Message], list[GroupShape]]] = {
    "system": (
        [_system(), _user()],
        [((0,), "system", False), ((1,), "user", False)],
    ),
    "user": (
        [_user(), _user("again")],
        [((0,), "user", False), ((1,), "user", False)],
    ),
    "assistant_text": (
        [_user(), _text(), Message("assistant", [_reasoning("why"), Content.from_text("answer")])],
        [((0,), "user", False), ((1,), "assistant_text", False), ((2,), "assistant_text", True)],
    ),
    "reasoning prefix, call, trailing reasoning and tool run": (
        [_user(), _reasoning_only(), _call("c1", "c2"), _reasoning_only(), _tool("c1"), _tool("c2"), _text()],
        [((0,), "user", False), ((1, 2, 3, 4, 5), "tool_call", True), ((6,), "assistant_text", False)],
    ),
    "reasoning in the call's own message": (
        [_user(), _call("c1", reasoning=True), _tool("c1")],
        [((0,), "user", False), ((1, 2), "tool_call", True)],
    ),
    "call and result separated by a user message are linked": (
        [_user(), _call("c1"), _user("meanwhile"), _tool("c1"), _text()],
        [((0,), "user", False), ((1, 3), "tool_call", False), ((2,), "user", False), ((4,), "assistant_text", False)],
    ),
    "ambiguous duplicate call ids are not linked": (
        [_user(), _call("c1"), _user(), _call("c1"), _user(), _tool("c1")],
        [
            ((0,), "user", False),
            ((1,), "tool_call", False),
            ((2,), "user", False),
            ((3,), "tool_call", False),
            ((4,), "user", False),
            ((5,), "tool_call", False),
        ],
    ),
    "a reused call id links to the one declaration still open": (
        [_call("c1"), _tool("c1"), _call("c1"), _user(), _tool("c1")],
        [((0, 1), "tool_call", False), ((2, 4), "tool_call", False), ((3,), "user", False)],
    ),
    "stray tool run": (
        [_user(), _tool("gone_1"), _tool("gone_2"), _text()],
        [((0,), "user", False), ((1, 2), "tool_call", False), ((3,), "assistant_text", False)],
    ),
    "a stray tool run stops before a reasoning prefix": (
        [_user(), _call("c1"), _user("meanwhile"), _tool("c1"), _reasoning_only(), _call("c2"), _tool("c2")],
        [((0,), "user", False), ((1, 3), "tool_call", False), ((2,), "user", False), ((4, 5, 6), "tool_call", True)],
    ),
    "reasoning-only message not followed by a call": (
        [_user(), _reasoning_only(), _text()],
        [((0,), "user", False), ((1,), "assistant_text", True), ((2,), "assistant_text", False)],
    ),
}


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_grouping_rule_example(name: str) -> None:
    """Each hand-written rule example groups as written, in our code and in the framework's."""
    messages, expected = EXAMPLES[name]
    assert framework(messages) == expected
    assert ours(messages) == expected
