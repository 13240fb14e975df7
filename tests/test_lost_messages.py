"""A loaded list that lost the excluded messages is detected, never mis-shed.

A history provider that drops excluded messages when it loads (``skip_excluded=True``)
moves every band position after a shed group. The notes of earlier sheds then stand
where other groups now are; replaying the watermarks would exclude live groups.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from agent_framework import CharacterEstimatorTokenizer, Content, Message

from maf_compaction import AnchoredCompactionStrategy

EXCLUDED = "_excluded"


def conversation(turns: int) -> list[Message]:
    messages = [Message("user", ["Deploy the service. Requirement RQ-000001."], message_id="u")]
    for turn in range(turns):
        call = Content.from_function_call(call_id=f"c{turn}", name="lookup", arguments={"turn": turn})
        result = Content.from_function_result(call_id=f"c{turn}", result=f"code_{turn}=TL-{turn:06d}\n" + "x" * 600)
        messages += [
            Message("user", [f"Look up part {turn}."], message_id=f"q{turn}"),
            Message("assistant", [call], message_id=f"a{turn}"),
            Message("tool", [result], message_id=f"t{turn}"),
            Message("assistant", [f"Part {turn} is code_{turn}."], message_id=f"r{turn}"),
        ]
    return messages


def strategy() -> AnchoredCompactionStrategy:
    return AnchoredCompactionStrategy(
        max_input_tokens=1_200, tokenizer=CharacterEstimatorTokenizer(), keep_tokens=10_000
    )


def test_a_list_without_its_excluded_messages_is_reported_and_not_mis_shed(caplog: pytest.LogCaptureFixture) -> None:
    anchored = strategy()
    stored = conversation(8)
    asyncio.run(anchored(stored))
    assert anchored.shed_events == 1

    # What InMemoryHistoryProvider(skip_excluded=True) would load: no excluded messages.
    loaded = [m for m in stored if not m.additional_properties.get(EXCLUDED)]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="maf_compaction"):
        asyncio.run(anchored(loaded))

    report = anchored.last_report
    assert report is not None
    assert report.misplaced > 0
    assert not report.shed
    assert not any(m.additional_properties.get(EXCLUDED) for m in loaded), "a live group was excluded by replay"
    assert any("skip_excluded=False" in r.getMessage() for r in caplog.records)


def test_a_list_without_its_excluded_messages_leaves_the_tail_whole() -> None:
    """Results are shortened by position; the list lost its shed groups, so the band is shorter than the positions the
    state committed to shorten. Those past the band now name the tail's groups, the newest results: the state's
    positions cannot be trusted, so nothing past the band is shortened (decisions past the band replay only where
    the notes stand at their groups: a band that was wider when they were made)."""
    anchored = AnchoredCompactionStrategy(
        max_input_tokens=1_200, tokenizer=CharacterEstimatorTokenizer(), keep_tokens=100
    )
    stored = conversation(10)
    asyncio.run(anchored(stored))
    loaded = [m for m in stored if not m.additional_properties.get(EXCLUDED)] + conversation(11)[-4:]
    tail = [m.to_dict() for m in loaded[-4:]]
    asyncio.run(anchored(loaded))

    assert anchored.last_report is not None
    assert anchored.last_report.misplaced > 0
    assert [m.to_dict() for m in loaded[-4:]] == tail


def test_the_full_stored_list_is_not_misplaced() -> None:
    anchored = strategy()
    stored = conversation(8)
    asyncio.run(anchored(stored))
    asyncio.run(anchored(stored))

    assert anchored.last_report is not None
    assert anchored.last_report.misplaced == 0


def test_a_tool_message_joining_a_shed_group_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    # Found by the long hypothesis profile: with no tail, a tool message appended right after a
    # shed group's results joins that group's run and is excluded with it; it must be named.
    anchored = AnchoredCompactionStrategy(
        max_input_tokens=120, tokenizer=CharacterEstimatorTokenizer(), keep_head_groups=1, keep_tail_groups=0
    )
    call = Content.from_function_call(call_id="c1", name="lookup", arguments={})
    first = [
        Message("user", ["Look it up."], message_id="u"),
        Message("assistant", [call], message_id="a1"),
        Message("tool", [Content.from_function_result(call_id="c1", result="x" * 800)], message_id="t1"),
    ]
    asyncio.run(anchored([*first]))
    assert anchored.last_report is not None
    assert anchored.last_report.shed

    late = Message("tool", [Content.from_function_result(call_id="other", result="y" * 40)], message_id="t2")
    grown = [Message(m.role, list(m.contents), message_id=m.message_id) for m in first] + [late]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="maf_compaction"):
        asyncio.run(anchored(grown))

    assert late.additional_properties.get(EXCLUDED)
    assert anchored.last_report is not None
    assert anchored.last_report.joined
    assert any("t2" in r.getMessage() and "keep earlier sheds whole" in r.getMessage() for r in caplog.records)
