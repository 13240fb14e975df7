"""Issue 10's findings, one test each, and the protocol every strategy's core now speaks.

Each test reproduces a path that was silent or unclear (a shed replayed with no WARNING,
one instance on two conversations at once, a deep copy keeping other bytes, a second
summarizer call for one state, a record the public helper could not read) and shows it
fixed, through the public API with real framework messages.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from agent_framework import CharacterEstimatorTokenizer, Content, Message
from agent_framework._compaction import EXCLUDED_KEY

from maf_compaction import (
    AnchoredCompactionStrategy,
    AnchoredSnapshot,
    MinimumGainAnchoredCompactionStrategy,
    SnapshotError,
    State,
    UserTurnAnchoredSummarizationCompactionStrategy,
    record_text,
)
from maf_compaction.core import anchored, answers, records, user_summaries
from maf_compaction.core.protocol import Done, Needs
from maf_compaction.core.records import RECALL_TOOL_NAME, RECORD_MARKER
from test_user_summaries import ScriptedSummarizer, conversation, extractive, over_budget
from wiring import recalled

TOKENIZER = CharacterEstimatorTokenizer()


def tool_conversation(groups: int = 6, size: int = 3_000) -> list[Message]:
    """A task, ``groups`` lookups with large results, and a closing turn."""
    messages = [Message("user", ["Audit the deployments."], message_id="task")]
    for n in range(groups):
        call = Content.from_function_call(call_id=f"c{n}", name="lookup", arguments={"n": n})
        messages.append(Message("assistant", [call], message_id=f"a{n}"))
        result = Content.from_function_result(call_id=f"c{n}", result=f"row {n} " + "x" * size)
        messages.append(Message("tool", [result], message_id=f"t{n}"))
        messages.append(Message("assistant", [f"Lookup {n} done."], message_id=f"r{n}"))
    messages.append(Message("user", ["Summarise."], message_id="last"))
    return messages


def excluded_ids(messages: list[Message]) -> list[str | None]:
    return [m.message_id for m in messages if m.additional_properties.get(EXCLUDED_KEY)]


def dump(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.to_dict() for m in messages]


# -- one protocol ------------------------------------------------------------------------------


@pytest.mark.parametrize("module", [anchored, records, user_summaries], ids=lambda m: m.__name__.rsplit(".")[-1])
def test_every_core_exposes_step_with_one_signature_and_absorbs_through_the_one_absorb(module: Any) -> None:
    import inspect

    step = inspect.signature(module.step)
    assert list(step.parameters)[:4] == ["config", "state", "history", "measure"]
    assert "memo" in step.parameters
    assert not hasattr(module, "absorb")  # one absorb for every strategy
    assert list(inspect.signature(answers.absorb).parameters) == ["state", "answers"]


def test_a_step_answers_with_needs_or_done() -> None:
    from maf_compaction.adapters.convert import to_history

    messages = conversation(12)
    config = user_summaries.UserSummaryConfig(max_input_tokens=over_budget(messages), max_summary_input_tokens=10_000)
    history = to_history(
        messages,
        UserTurnAnchoredSummarizationCompactionStrategy(
            max_input_tokens=1_000, tokenizer=TOKENIZER, client=ScriptedSummarizer()
        )._counter,
        note_kind="anchored",
    )  # pyright: ignore[reportPrivateUsage]
    needs = user_summaries.step(config, State(), history, TOKENIZER.count_tokens)
    assert isinstance(needs, Needs)
    assert needs.requests
    faithful = extractive([Message("user", [needs.requests[0].transcript])])  # what the coverage rule asks for
    state = answers.absorb(State(), [(needs.requests[0], faithful)])
    done = user_summaries.step(config, state, history, TOKENIZER.count_tokens)
    assert isinstance(done, Done)
    assert done.state.answers


def test_minimum_gain_is_the_anchored_strategy_with_one_more_parameter() -> None:
    import inspect

    plain = inspect.signature(AnchoredCompactionStrategy).parameters
    gain = inspect.signature(MinimumGainAnchoredCompactionStrategy).parameters
    assert list(gain) == [*plain, "min_gain_fraction"]
    assert MinimumGainAnchoredCompactionStrategy.__init__.__code__.co_kwonlyargcount == 1  # not a copy


# -- no silent path ----------------------------------------------------------------------------


def test_a_shed_replayed_from_a_restored_snapshot_is_named_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Finding: a restored ``tools_shed`` excluded 12 messages far below the budget with nothing logged."""
    first = AnchoredCompactionStrategy(max_input_tokens=1_500, tokenizer=TOKENIZER, keep_tail_groups=2)
    source = tool_conversation()
    asyncio.run(first(copy.deepcopy(source)))
    state = first.decision_state()
    assert state.tools_shed > 0

    fresh = AnchoredCompactionStrategy(max_input_tokens=1_500, tokenizer=TOKENIZER, keep_tail_groups=2)
    fresh.restore_decisions(state.to_dict())
    replayed = copy.deepcopy(source)
    with caplog.at_level(logging.WARNING, logger="maf_compaction"):
        asyncio.run(fresh(replayed))
    gone = excluded_ids(replayed)
    assert gone
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert all(message_id in warned for message_id in gone if message_id)


def test_the_same_exclusions_are_named_once_not_once_per_list(caplog: pytest.LogCaptureFixture) -> None:
    strategy = AnchoredCompactionStrategy(max_input_tokens=1_500, tokenizer=TOKENIZER, keep_tail_groups=2)
    source = tool_conversation()
    with caplog.at_level(logging.WARNING, logger="maf_compaction"):
        asyncio.run(strategy(copy.deepcopy(source)))  # the in-call copies
        asyncio.run(strategy(copy.deepcopy(source)))  # the stored history: the same decision
    named = [r for r in caplog.records if "excluded" in r.getMessage()]
    assert len(named) == 1


def test_an_instance_refuses_a_second_conversation() -> None:
    """Finding: one instance on two lists at once silently lost six messages of the second."""
    strategy = AnchoredCompactionStrategy(max_input_tokens=4_000, tokenizer=TOKENIZER)
    asyncio.run(strategy(tool_conversation()))
    other = [Message("user", ["Another user's conversation."], message_id="elsewhere"), *tool_conversation()[1:]]
    before = dump(other)
    with pytest.raises(RuntimeError, match="serves one conversation"):
        asyncio.run(strategy(other))
    assert dump(other) == before


def test_an_instance_refuses_a_second_conversation_running_at_the_same_time() -> None:
    strategy = AnchoredCompactionStrategy(max_input_tokens=4_000, tokenizer=TOKENIZER)
    a = tool_conversation()
    b = [Message("user", ["Someone else."], message_id="b-task"), *tool_conversation(size=10)[1:]]

    async def both() -> list[object]:
        return list(await asyncio.gather(strategy(a), strategy(b), return_exceptions=True))

    outcomes = asyncio.run(both())
    assert isinstance(outcomes[1], RuntimeError)
    assert excluded_ids(b) == []


def test_concurrent_passes_on_copies_of_one_conversation_make_one_summarizer_call() -> None:
    """Finding: two copies at once made two summarizer calls for one request and left list and state apart."""

    async def slow(messages: Sequence[Message]) -> str:
        await asyncio.sleep(0.01)
        return extractive(messages)

    client = ScriptedSummarizer(slow)
    messages = conversation(12)
    worker = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=over_budget(messages), tokenizer=TOKENIZER, client=client, max_summary_input_tokens=10_000
    )
    first, second = copy.deepcopy(messages), copy.deepcopy(messages)

    async def both() -> None:
        await asyncio.gather(worker(first), worker(second))

    asyncio.run(both())
    assert client.calls == 1
    assert dump(first) == dump(second)


def test_a_deep_copy_of_the_uncompacted_list_gets_the_same_bytes_excluded_text_included() -> None:
    """Finding: on a deep copy a shed result kept its unshortened text (22 of 27 histories)."""
    source = tool_conversation(groups=8, size=6_000)
    strategy = AnchoredCompactionStrategy(max_input_tokens=9_000, tokenizer=TOKENIZER, keep_tail_groups=2)
    grown: list[Message] = []
    lists: list[list[Message]] = []
    for cut in range(4, len(source) + 1, 3):  # the conversation grows; every pass on the same list
        grown = [*grown, *copy.deepcopy(source[len(grown) : cut])]
        asyncio.run(strategy(grown))
        lists.append(grown)
    replay = copy.deepcopy(source[: len(grown)])
    asyncio.run(strategy(replay))
    assert dump(replay) == dump(grown)


def test_a_deep_copy_after_two_passes_makes_no_new_summarizer_call() -> None:
    """Finding: ``s(L1); s(L1); s(deepcopy(orig))`` asked the summarizer again."""
    client = ScriptedSummarizer()
    messages = conversation(12)
    worker = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=over_budget(messages), tokenizer=TOKENIZER, client=client, max_summary_input_tokens=10_000
    )
    original = copy.deepcopy(messages)
    asyncio.run(worker(messages))
    asyncio.run(worker(messages))
    calls = client.calls
    replay = copy.deepcopy(original)
    asyncio.run(worker(replay))
    assert client.calls == calls
    assert dump(replay) == dump(messages)


# -- record_text answers from the core's rule ----------------------------------------------------


def test_record_text_reads_a_record_whose_marker_is_mid_text() -> None:
    """Finding: a recall result with the marker in mid-text was a record to the core and '' to the helper."""
    call = Content.from_function_call(call_id="r1", name=RECALL_TOOL_NAME, arguments={"values": "v"})
    text = f"Notes first.\n{RECORD_MARKER} lookup: code_1=TL-3FA9C2"
    result = Message("tool", [Content.from_function_result(call_id="r1", result=text)], message_id="rec")
    conversation_ = [Message("assistant", [call], message_id="ask"), result]
    assert record_text(result, conversation_) == text
    assert record_text(result) == text
    other = Message("tool", [Content.from_function_result(call_id="zz", result=text)])
    assert record_text(other, conversation_) == ""  # no recall call answers it


def test_a_restored_snapshot_is_the_anchored_state_value() -> None:
    strategy = AnchoredCompactionStrategy(max_input_tokens=4_000, tokenizer=TOKENIZER)
    assert strategy.decision_state() == AnchoredSnapshot()


@pytest.mark.parametrize("field", ["tools_shed", "shortened", "texts_shed"])
def test_a_restored_count_past_what_the_history_holds_is_refused_before_anything_is_touched(field: str) -> None:
    """Finding: ``tools_shed=10**9`` restored into a fresh strategy excluded 12 messages, nothing logged."""
    strategy = AnchoredCompactionStrategy(max_input_tokens=100_000, tokenizer=TOKENIZER)
    data = AnchoredSnapshot(keep_head_groups=3).to_dict()
    data[field] = 10**9
    strategy.restore_decisions(data)
    messages = tool_conversation()
    before = dump(messages)
    with pytest.raises(SnapshotError, match=field):
        asyncio.run(strategy(messages))
    assert dump(messages) == before


def test_restored_record_decisions_naming_groups_the_conversation_lacks_are_refused() -> None:
    from maf_compaction import RecordDecisions, ToolResultAnchoredSummarizationCompactionStrategy

    strategy = recalled(
        ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=100_000, tokenizer=TOKENIZER)
    )
    strategy.restore_decisions(State(records=RecordDecisions(settled=(0, 40))).to_dict())
    messages = tool_conversation()
    before = dump(messages)
    with pytest.raises(SnapshotError, match="settled"):
        asyncio.run(strategy(messages))
    assert dump(messages) == before


def test_a_restored_state_that_fits_is_used() -> None:
    first = AnchoredCompactionStrategy(max_input_tokens=1_500, tokenizer=TOKENIZER, keep_tail_groups=2)
    source = tool_conversation()
    stored = copy.deepcopy(source)
    asyncio.run(first(stored))
    second = AnchoredCompactionStrategy(max_input_tokens=1_500, tokenizer=TOKENIZER, keep_tail_groups=2)
    second.restore_decisions(first.decision_state().to_dict())
    replay = copy.deepcopy(source)
    asyncio.run(second(replay))
    assert dump(replay) == dump(stored)


def test_two_conversations_sharing_a_system_prompt_are_told_apart() -> None:
    """Review finding: a shared system message made every conversation look like the bound one."""
    system = Message("system", ["You are the deployment auditor."])
    strategy = AnchoredCompactionStrategy(max_input_tokens=1_500, tokenizer=TOKENIZER, keep_tail_groups=2)
    asyncio.run(strategy([copy.deepcopy(system), *tool_conversation()]))
    other = [
        copy.deepcopy(system),
        Message("user", ["A different user's question."]),
        Message("assistant", ["A different answer."]),
    ]
    before = dump(other)
    with pytest.raises(RuntimeError, match="serves one conversation"):
        asyncio.run(strategy(other))
    assert dump(other) == before


def test_the_same_conversation_growing_from_one_message_stays_bound() -> None:
    strategy = AnchoredCompactionStrategy(max_input_tokens=1_500, tokenizer=TOKENIZER, keep_tail_groups=2)
    source = tool_conversation()
    for cut in range(1, len(source) + 1, 2):
        asyncio.run(strategy(copy.deepcopy(source[:cut])))


def test_a_restored_ask_counting_more_responses_than_the_conversation_has_is_refused() -> None:
    """Review finding: a forged ``responses_at_ask`` kept an ask outstanding for ever."""
    from maf_compaction import Ask, RecordDecisions, ToolResultAnchoredSummarizationCompactionStrategy

    strategy = recalled(
        ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=100_000, tokenizer=TOKENIZER)
    )
    forged = State(records=RecordDecisions(ask=Ask(targets=(1,), records_at_ask=1, responses_at_ask=2**31 - 1)))
    strategy.restore_decisions(forged.to_dict())
    with pytest.raises(SnapshotError, match="responses_at_ask"):
        asyncio.run(strategy(tool_conversation()))
