"""The composition's record replacements, step by step, through the public strategy.

Two records from the recall tool stand in a conversation whose budget they (with the
anchors) exceed; the chain asks the user half's summarizer to merge them. A merge that
quotes every value and is smaller is kept as a written record, linked to what it
replaces; one that drops a value, or is not smaller, is refused, counted and never asked
for again. Kept merges replay on a deep copy and after a restore without a call.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from agent_framework import CharacterEstimatorTokenizer, Content, Message
from agent_framework._compaction import EXCLUDED_KEY
from msgspec.structs import replace

from maf_compaction import (
    CompactionBudgetExceeded,
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
    UserTurnAnchoredSummarizationCompactionStrategy,
    record_text,
)
from maf_compaction.core.records import RECALL_TOOL_NAME, RECORD_PREFIX
from maf_compaction.core.state import RequestKind
from test_user_summaries import ScriptedSummarizer
from wiring import recalled

TOKENIZER = CharacterEstimatorTokenizer()
CODE = re.compile(r"code_\d+=[A-Z]{2}-[0-9A-F]{6}")


def record_pair(n: int, codes: Sequence[str]) -> list[Message]:
    """A recall call and its result: a record quoting ``codes`` with some padding words."""
    call = Content.from_function_call(call_id=f"r{n}", name=RECALL_TOOL_NAME, arguments={"values": "..."})
    body = "lookup: " + ", ".join(codes) + ". " + "These values were recorded from earlier lookups. " * 6
    result = Content.from_function_result(call_id=f"r{n}", result=f"{RECORD_PREFIX}\n{body}")
    return [Message("assistant", [call], message_id=f"rc{n}"), Message("tool", [result], message_id=f"rt{n}")]


def conversation() -> list[Message]:
    messages = [Message("user", ["Audit the deployments and quote every code."], message_id="task")]
    codes = [f"code_{k}=TL-{k:06X}" for k in range(8)]
    for n in range(2):
        call = Content.from_function_call(call_id=f"c{n}", name="lookup", arguments={"n": n})
        result = Content.from_function_result(call_id=f"c{n}", result=" ".join(codes[4 * n : 4 * n + 4]))
        messages += [Message("assistant", [call], message_id=f"a{n}"), Message("tool", [result], message_id=f"t{n}")]
        messages += record_pair(n, codes[4 * n : 4 * n + 4])
        messages.append(Message("assistant", [f"Recorded batch {n}."], message_id=f"ok{n}"))
    messages.append(Message("user", ["Now list every code."], message_id="last"))
    return messages


def merged(messages: Sequence[Message]) -> str:
    """A faithful merge: every code of the transcript, once."""
    return "lookup: " + ", ".join(dict.fromkeys(CODE.findall(messages[-1].text)))


def lossy(messages: Sequence[Message]) -> str:
    """A merge that drops all but two codes: smaller, but not faithful."""
    return "lookup: " + ", ".join(list(dict.fromkeys(CODE.findall(messages[-1].text)))[:2])


def build(script: Callable[[Sequence[Message]], str], budget: int, **kwargs: Any) -> tuple[Any, ScriptedSummarizer]:
    client = ScriptedSummarizer(script)
    records = ToolResultAnchoredSummarizationCompactionStrategy(
        max_input_tokens=budget, tokenizer=TOKENIZER, keep_head_groups=1, keep_tail_groups=1
    )
    users = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=budget,
        tokenizer=TOKENIZER,
        client=client,
        summary_mode="boundary",
        remembered_requests=2,
        max_summary_input_tokens=1_000,
    )
    strategy = ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
        tokenizer=TOKENIZER, tool_results=records, user_turns=users, **kwargs
    )
    return recalled(strategy), client


def size(messages: Sequence[Message]) -> int:
    from maf_compaction import MediaTokenEstimator

    estimator = MediaTokenEstimator(TOKENIZER)
    return sum(estimator.count_message_tokens(m) for m in messages if not m.additional_properties.get(EXCLUDED_KEY))


def budget_for(messages: list[Message]) -> int:
    """Over the budget with both records, within it once they are merged."""
    return size(messages) - 60


def test_a_faithful_smaller_merge_is_kept_as_a_written_record() -> None:
    messages = conversation()
    strategy, client = build(merged, budget_for(messages))
    asyncio.run(strategy(messages))
    assert client.calls == 1
    assert "compaction records" in client.requests[0][0].text
    written = [m for m in messages if record_text(m) and not m.additional_properties.get(EXCLUDED_KEY)]
    assert len(written) == 1
    assert all(code in written[0].text for code in CODE.findall(" ".join(m.text for m in conversation())))
    for message_id in ("rc0", "rt0", "rc1", "rt1"):
        assert next(m for m in messages if m.message_id == message_id).additional_properties.get(EXCLUDED_KEY)
    assert strategy.records_replaced == 1


def test_a_kept_merge_replays_on_a_deep_copy_and_after_a_restore_without_a_call() -> None:
    source = conversation()
    strategy, client = build(merged, budget_for(source))
    stored = copy.deepcopy(source)
    asyncio.run(strategy(stored))
    calls = client.calls
    replay = copy.deepcopy(source)
    asyncio.run(strategy(replay))
    assert client.calls == calls
    assert [m.to_dict() for m in replay] == [m.to_dict() for m in stored]


@pytest.mark.parametrize("policy", ["shed", "raise"])
def test_a_merge_that_drops_a_value_is_refused_counted_and_not_asked_again(policy: str) -> None:
    messages = conversation()
    before = [m.to_dict() for m in messages]
    strategy, client = build(lossy, budget_for(messages), overflow_policy=policy)
    # The records alone do not fit and the merge is refused: both policies raise, the list untouched.
    with pytest.raises(CompactionBudgetExceeded) as raised:
        asyncio.run(strategy(messages))
    assert (raised.value.needed > raised.value.budget, [m.to_dict() for m in messages]) == (True, before)
    assert strategy.budget_failures == 1
    calls = client.calls
    with pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(messages))
    assert client.calls == calls  # never asked again for the same records


def test_a_refused_merge_is_counted_and_the_shed_policy_still_makes_room(caplog: pytest.LogCaptureFixture) -> None:
    messages = conversation()
    call = Content.from_function_call(call_id="late", name="lookup", arguments={"n": 9})
    extra = Content.from_function_result(call_id="late", result="status: fine " + "pad " * 120)
    messages[-1:-1] = [Message("assistant", [call], message_id="a9"), Message("tool", [extra], message_id="t9")]
    strategy, client = build(lossy, size(messages) - 100, overflow_policy="shed")
    with caplog.at_level("WARNING", logger="maf_compaction"):
        asyncio.run(strategy(messages))
    # The merge drops values; a harder rewrite of the same records would drop as many: neither is asked.
    assert (strategy.replacements_refused, strategy.replacements_skipped, client.calls) == (1, 2, 1)
    shed = [m.message_id for m in messages if m.additional_properties.get(EXCLUDED_KEY)]
    assert {"a9", "t9"} <= set(shed)
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "a9" in warned
    assert "t9" in warned
    assert "Refused 1 record replacement" in warned
    # What the refusal cost: the refused answer's output tokens, counted and said in the WARNING.
    merge = next(a for a in strategy.decision_state().answers if a.kind is RequestKind.MERGE)
    paid = TOKENIZER.count_tokens(merge.text or "")
    assert strategy.refused_answer_tokens == paid > 0
    assert f"their answers, {paid} output token(s), were paid for and dropped" in warned


def test_a_merge_refused_only_for_its_size_still_gets_a_harder_rewrite() -> None:
    """A faithful answer that is too long says nothing of the values: the harder rewrite is asked, and kept."""

    def script(messages: Sequence[Message]) -> str:
        if "Rewrite it as one record" in messages[0].text:
            return merged(messages)
        return merged(messages) + " Recorded with care and at length." * 80

    messages = conversation()
    strategy, client = build(script, budget_for(messages))
    asyncio.run(strategy(messages))
    assert (client.calls, strategy.replacements_refused, strategy.replacements_skipped) == (2, 1, 0)
    assert strategy.records_replaced == 1


def test_a_merge_of_records_a_lossy_merge_stood_for_is_not_asked_again_with_one_more() -> None:
    """After a merge left a value out, a merge of the same records and a newer one is skipped too."""
    messages = conversation()
    strategy, client = build(lossy, budget_for(messages), overflow_policy="shed")
    with pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(messages))
    assert client.calls == 1
    codes = [f"code_{k}=TL-{k:06X}" for k in range(8, 12)]
    messages[-1:-1] = record_pair(2, codes)
    with pytest.raises(CompactionBudgetExceeded) as raised:
        asyncio.run(strategy(messages))
    assert client.calls == 1, "the merge of all three records stands for the two a lossy merge stood for"
    # The failing pass names and counts what it did not ask for, as a pass that fits does.
    assert raised.value.skipped
    assert f"{len(raised.value.skipped)} not asked" in str(raised.value)
    assert strategy.replacements_skipped >= len(raised.value.skipped)


def test_the_user_half_declines_a_summary_whose_break_costs_more_than_it_saves() -> None:
    """chain_gain_fraction gates the user half while the prompt fits; over the budget room matters more."""
    from maf_compaction.adapters.convert import to_history
    from maf_compaction.core import user_summaries
    from maf_compaction.core.protocol import Done, Needs
    from maf_compaction.core.state import State
    from test_user_summaries import conversation as user_conversation
    from test_user_summaries import over_budget

    messages = user_conversation(12, tools=True)
    history = to_history(messages, strategy_counter(), note_kind="anchored")
    budget = over_budget(messages)  # the trigger is passed, the budget is not
    config = user_summaries.UserSummaryConfig(
        max_input_tokens=budget, max_summary_input_tokens=10_000, trigger_fraction=0.5
    )
    asks = user_summaries.step(config, State(), history, TOKENIZER.count_tokens)
    assert isinstance(asks, Needs)
    gated = user_summaries.UserSummaryConfig(
        max_input_tokens=budget, max_summary_input_tokens=10_000, trigger_fraction=0.5, min_gain_fraction=0.99
    )
    answer = user_summaries.step(gated, State(), history, TOKENIZER.count_tokens)
    assert isinstance(answer, Done)
    assert answer.report.outcome is user_summaries.Outcome.DECLINED
    tight = user_summaries.UserSummaryConfig(
        max_input_tokens=budget // 2, max_summary_input_tokens=10_000, trigger_fraction=0.5, min_gain_fraction=0.99
    )
    over = user_summaries.step(tight, State(), history, TOKENIZER.count_tokens)
    assert isinstance(over, Needs)  # over the budget the gate is off


def strategy_counter() -> Any:
    from maf_compaction import MediaTokenEstimator

    return MediaTokenEstimator(TOKENIZER).parts


def test_a_kept_merge_is_neither_a_response_nor_fewer_records_so_no_new_wait_starts_behind_it() -> None:
    """Asks and waits read one clock and one record count that only grow; a kept merge moves neither.

    The user half waits for a due record, the wait ends after two responses behind the two
    records, then the prompt outgrows the budget and the chain merges them into one
    written record: the records behind which the wait ended are the same records, so no
    new wait starts (the count of active records fell to one, and the written record
    would have counted as a response).
    """
    from maf_compaction.adapters.convert import to_history
    from maf_compaction.core import records as records_core
    from maf_compaction.core.state import RecallState

    messages = conversation()
    source = [Message.from_dict(m.to_dict()) for m in messages]
    strategy, client = build(merged, size(messages) + 30)
    shared = strategy.tool_results.conversation
    # A record is due, as the middleware says.
    shared.value = replace(shared.value, recall=RecallState(next_pin="size"))
    waited: list[bool] = []
    for n in range(6):  # the prompt outgrows the budget on the fifth pass: the chain merges
        if n:
            messages += [
                Message("assistant", [f"Working on step {n} of the audit now."], message_id=f"w{n}"),
                Message("user", [f"Continue with step {n}, please."], message_id=f"k{n}"),
            ]
        asyncio.run(strategy(messages))
        waited.append(strategy.last_report.waited)
    assert strategy.records_replaced >= 1, "the chain kept a merge"
    assert client.calls == 1
    assert waited == [True, True, False, False, False, False], waited
    counter = strategy_counter()
    before = to_history(source, counter, note_kind="anchored")
    grown = {f"{kind}{n}" for kind in "wk" for n in range(6)}
    after = to_history([m for m in messages if m.message_id not in grown], counter, note_kind="anchored")
    assert any(r.written_record for r in after), "the merged record is in the list"
    assert records_core.records_written(after) == records_core.records_written(before) == 2
    assert records_core.responses(after) == records_core.responses(before)


def flaky(failure: str) -> Callable[[Sequence[Message]], str]:
    """A summarizer whose first answer fails (it raises, or answers nothing), then merges faithfully."""
    calls: list[int] = []

    def script(messages: Sequence[Message]) -> str:
        calls.append(1)
        if len(calls) > 1:
            return merged(messages)
        if failure == "raises":
            raise RuntimeError("the summarizer is down")
        return "  "

    return script


@pytest.mark.parametrize("failure", ["raises", "blank"])
def test_a_failed_merge_stands_until_the_next_user_turn_then_is_asked_again(failure: str) -> None:
    messages = conversation()
    strategy, client = build(flaky(failure), budget_for(messages), overflow_policy="raise")
    with pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(messages))
    assert client.calls == 1, "a failure stops the chain's asks on its pass: no rewrite is asked behind it"
    assert (strategy.replacements_failed, strategy.replacements_refused) == (1, 0)
    # The same conversation state, on this instance and after a round trip through the envelope: no second call.
    saved = json.loads(json.dumps(strategy.decision_state().to_dict()))
    with pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(copy.deepcopy(messages)))
    restored, restored_client = build(flaky("raises"), budget_for(messages), overflow_policy="raise")
    restored.restore_decisions(saved)
    with pytest.raises(CompactionBudgetExceeded):
        asyncio.run(restored(copy.deepcopy(messages)))
    assert (client.calls, restored_client.calls) == (1, 0)
    # A new user turn is a new state: the same request is asked once more, and this time it is kept.
    messages.append(Message("user", ["And the totals?"], message_id="more"))
    asyncio.run(strategy(messages))
    assert client.calls == 2
    assert client.transcript(1) == client.transcript(0), "the same request, asked again"
    assert strategy.records_replaced == 1
    assert strategy.replacements_refused == 0
    asyncio.run(strategy(copy.deepcopy(messages)))
    assert client.calls == 2, "a kept merge replays without a call"


def test_a_refused_merge_stays_refused_after_new_user_turns() -> None:
    messages = conversation()
    strategy, client = build(lossy, budget_for(messages), overflow_policy="raise")
    with pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(messages))
    calls = client.calls
    for n in range(2):
        messages.append(Message("user", [f"Still there? ({n})"], message_id=f"more{n}"))
        with pytest.raises(CompactionBudgetExceeded):
            asyncio.run(strategy(messages))
    assert client.calls == calls, "an answer judged lossy is never asked for again"
    assert strategy.replacements_failed == 0


def test_a_lossy_harder_rewrite_does_not_spare_a_merge_of_its_record_with_another() -> None:
    """A rewrite asked for a shorter record: its loss says nothing of a merge, which asks for no length."""
    messages = [m for m in conversation() if m.message_id not in ("rc1", "rt1")]
    strategy, client = build(lossy, size(messages) - 60, overflow_policy="shed")
    with pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(messages))
    assert client.calls == 1, "one record: no merge, one harder rewrite, which drops values; the second is skipped"
    assert "Rewrite it as one record" in client.requests[0][0].text
    messages[-1:-1] = record_pair(2, [f"code_{k}=TL-{k:06X}" for k in range(8, 12)])
    with pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(messages))
    assert client.calls == 2
    assert "compaction records" in client.requests[1][0].text, "the merge of both records is asked"
