"""The chain's emergency folds, step by step, through the public strategy.

Three user summaries stand in a conversation (the user half wrote them in ``boundary``
mode: each stands for turns already excluded) whose budget they exceed; no record can
help and the user half has nothing left to summarise. Still over the budget after the
record merges and rewrites, the chain asks the user half's summarizer to fold the oldest
summaries into one, without the fold mode's profitability gate. A fold that is smaller
and quotes every distinctive value is kept, linked to what it replaces, and replays on a
deep copy and after a restore without a call; one that drops a value or is not smaller is
refused, counted and never asked for again; a failed one is asked again after the next
user turn. The fold comes before the fallback and the overflow policy.
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
from agent_framework._compaction import EXCLUDE_REASON_KEY, EXCLUDED_KEY
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn

from maf_compaction import (
    CompactionBudgetExceeded,
    MediaTokenEstimator,
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
    UserTurnAnchoredSummarizationCompactionStrategy,
)
from maf_compaction.adapters.convert import SUMMARY_KEY, SUMMARY_OF_KEY, is_summary
from maf_compaction.adapters.user_summaries import FOLD_EXCLUDE_REASON
from maf_compaction.core.composition import EMERGENCY_FOLD_ID_PREFIX
from maf_compaction.core.user_summaries import DEFAULT_FOLD_PROMPT, USER_SUMMARY_MARKER
from test_user_summaries import ScriptedSummarizer
from wiring import recalled

TOKENIZER = CharacterEstimatorTokenizer()
REQUIREMENT = re.compile(r"RQ-\d{6}")
PAD = "The user restated the layout preferences and thanked the assistant for the earlier work. " * 4


def summary(n: int) -> Message:
    """A standing user summary, as the user half writes it, carrying requirement ``n`` and padding."""
    summary_id = f"user_summary_{n}"
    text = f"{USER_SUMMARY_MARKER}\nThe user asked to keep step {n} (RQ-{n:06d}). {PAD}"
    return Message(
        "user",
        [text],
        message_id=summary_id,
        additional_properties={SUMMARY_KEY: summary_id, SUMMARY_OF_KEY: [f"q{n}"]},
    )


def conversation(summaries: int = 3) -> list[Message]:
    messages = [Message("user", ["Task: reconcile the deployments, keeping every requirement."], message_id="task")]
    for n in range(summaries):
        excluded = {EXCLUDED_KEY: True, EXCLUDE_REASON_KEY: "user_turn_summarized"}
        messages.append(
            Message("user", [f"Keep step {n} (RQ-{n:06d}). {PAD}"], message_id=f"q{n}", additional_properties=excluded)
        )
        messages.append(summary(n))
        messages.append(Message("assistant", [f"Noted step {n}."], message_id=f"a{n}"))
    messages.append(Message("user", ["Now list every requirement."], message_id="last"))
    return messages


def lookup_group() -> list[Message]:
    """An unrecorded lookup the shed policy may remove."""
    call = Content.from_function_call(call_id="late", name="lookup", arguments={"n": 9})
    result = Content.from_function_result(call_id="late", result="status: fine " + "pad " * 120)
    return [Message("assistant", [call], message_id="a9"), Message("tool", [result], message_id="t9")]


def faithful(messages: Sequence[Message]) -> str:
    """A fold that keeps every requirement, once."""
    return "The user asked to keep: " + ", ".join(dict.fromkeys(REQUIREMENT.findall(messages[-1].text))) + "."


def lossy(messages: Sequence[Message]) -> str:
    """A fold that drops the last requirement: smaller, but not faithful."""
    return "The user asked to keep: " + ", ".join(list(dict.fromkeys(REQUIREMENT.findall(messages[-1].text)))[:-1])


def verbose(messages: Sequence[Message]) -> str:
    """A faithful fold that is no smaller than what it replaces."""
    return messages[-1].text + " " + PAD


def build(
    script: Callable[[Sequence[Message]], str | None], budget: int, *, limit: int = 2_000, **kwargs: Any
) -> tuple[ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy, ScriptedSummarizer]:
    client = ScriptedSummarizer(script)  # type: ignore[arg-type]
    records = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=budget, tokenizer=TOKENIZER)
    users = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=budget,
        tokenizer=TOKENIZER,
        client=client,
        summary_mode="boundary",
        remembered_requests=2,
        max_summary_input_tokens=limit,
    )
    strategy = ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
        tokenizer=TOKENIZER, tool_results=records, user_turns=users, **kwargs
    )
    return recalled(strategy), client


def size(messages: Sequence[Message]) -> int:
    estimator = MediaTokenEstimator(TOKENIZER)
    return sum(estimator.count_message_tokens(m) for m in messages if not m.additional_properties.get(EXCLUDED_KEY))


def by_id(messages: Sequence[Message], message_id: str) -> Message:
    return next(m for m in messages if m.message_id == message_id)


def excluded(message: Message) -> bool:
    return bool(message.additional_properties.get(EXCLUDED_KEY))


def budget_for(messages: list[Message]) -> int:
    """Over the budget with three summaries, within it once they are folded."""
    return size(messages) - 80


def test_a_faithful_smaller_fold_of_the_oldest_summaries_is_kept_and_linked() -> None:
    messages = conversation()
    strategy, client = build(faithful, budget_for(messages))
    asyncio.run(strategy(messages))
    assert client.calls == 1
    assert client.requests[0][0].text == DEFAULT_FOLD_PROMPT  # the user half's fold prompt
    assert client.transcript(0).count("\n") == 2  # three numbered summaries
    fold = by_id(messages, f"{EMERGENCY_FOLD_ID_PREFIX}0")
    assert is_summary(fold)
    assert not excluded(fold)
    assert all(f"RQ-{n:06d}" in fold.text for n in range(3))
    assert fold.additional_properties[SUMMARY_OF_KEY] == ["user_summary_0", "user_summary_1", "user_summary_2"]
    for n in range(3):
        folded = by_id(messages, f"user_summary_{n}")
        assert excluded(folded)
        assert folded.additional_properties[EXCLUDE_REASON_KEY] == FOLD_EXCLUDE_REASON
    assert messages.index(fold) < messages.index(by_id(messages, "a0"))  # where the first summary stood
    assert size(messages) <= strategy.max_input_tokens
    report = strategy.last_report
    assert report is not None
    assert (report.folded, report.fallback, report.shed) == (1, None, None)  # before the fallback and the policy
    assert strategy.emergency_folds == 1


def test_a_kept_fold_replays_on_a_deep_copy_and_after_a_restore_without_a_call() -> None:
    source = conversation()
    strategy, client = build(faithful, budget_for(source))
    stored = copy.deepcopy(source)
    asyncio.run(strategy(stored))
    assert client.calls == 1
    replay = copy.deepcopy(source)
    asyncio.run(strategy(replay))
    assert client.calls == 1
    assert [m.to_dict() for m in replay] == [m.to_dict() for m in stored]
    state = json.loads(json.dumps(strategy.decision_state().to_dict()))
    restored, other = build(faithful, budget_for(source))
    restored.restore_decisions(state)
    again = copy.deepcopy(source)
    asyncio.run(restored(again))
    assert other.calls == 0
    assert [m.to_dict() for m in again] == [m.to_dict() for m in stored]


def test_a_kept_fold_replays_on_a_pass_that_fits_without_it() -> None:
    """Like the other chain decisions, a kept fold is state: it replays whatever the prompt's size."""
    source = conversation()
    strategy, _ = build(faithful, budget_for(source))
    asyncio.run(strategy(copy.deepcopy(source)))
    roomy, client = build(faithful, size(source) + 1_000)  # this list fits as it is
    roomy.restore_decisions(strategy.decision_state().to_dict())
    messages = copy.deepcopy(source)
    asyncio.run(roomy(messages))
    assert client.calls == 0
    assert not excluded(by_id(messages, f"{EMERGENCY_FOLD_ID_PREFIX}0"))
    assert all(excluded(by_id(messages, f"user_summary_{n}")) for n in range(3))
    # Without the decision, the same list is left alone.
    fresh, _ = build(faithful, size(source) + 1_000)
    untouched = copy.deepcopy(source)
    asyncio.run(fresh(untouched))
    assert [m.to_dict() for m in untouched] == [m.to_dict() for m in source]


@pytest.mark.parametrize("script", [lossy, verbose], ids=["drops-a-value", "not-smaller"])
def test_a_fold_that_drops_a_value_or_is_not_smaller_is_refused_counted_and_not_asked_again(
    script: Callable[[Sequence[Message]], str], caplog: pytest.LogCaptureFixture
) -> None:
    messages = conversation()
    before = [m.to_dict() for m in messages]
    strategy, client = build(script, budget_for(messages), overflow_policy="shed")
    with pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(messages))  # nothing else can make room: the summaries are what must stay
    assert [m.to_dict() for m in messages] == before
    assert client.calls == 1
    with pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(messages))
    assert client.calls == 1, "a refused fold was asked for again"
    # With an unrecorded lookup to shed, the pass completes: the refusal is counted and warned about.
    lookup = lookup_group()
    at = messages.index(by_id(messages, "a0")) + 1  # in the band: past the head, before the tail
    messages[at:at] = lookup
    strategy, client = build(script, size(messages) - 100, overflow_policy="shed")
    with caplog.at_level("WARNING", logger="maf_compaction"):
        asyncio.run(strategy(messages))
    assert client.calls == 1
    assert strategy.replacements_refused == 1
    assert "emergency fold" in " ".join(r.getMessage() for r in caplog.records)
    assert all(excluded(m) for m in lookup), "the overflow policy came after the refused fold"
    assert not any(excluded(by_id(messages, f"user_summary_{n}")) for n in range(3))


def test_a_failed_fold_stands_until_the_next_user_turn_then_is_asked_again() -> None:
    messages = conversation()
    strategy, client = build(lambda _: None, budget_for(messages))
    with pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(messages))
    assert (client.calls, strategy.replacements_failed) == (1, 1)
    with pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(messages))
    assert client.calls == 1, "a failure stands for this conversation state"
    client.script = faithful
    messages += [Message("assistant", ["Listing."], message_id="a9"), Message("user", ["Go on."], message_id="more")]
    asyncio.run(strategy(messages))
    assert client.calls == 2
    assert not excluded(by_id(messages, f"{EMERGENCY_FOLD_ID_PREFIX}0"))


def test_a_fold_request_is_bounded_by_max_summary_input_tokens() -> None:
    """Only the oldest summaries whose request fits the bound are folded (two at least)."""
    messages = conversation()
    one = TOKENIZER.count_tokens(DEFAULT_FOLD_PROMPT) + 8 + 2 * TOKENIZER.count_tokens(f"1. {summary(0).text}")
    strategy, client = build(faithful, size(messages) - 20, limit=one)
    asyncio.run(strategy(messages))
    assert client.calls == 1
    assert client.transcript(0).startswith("1. ")
    assert "\n3. " not in client.transcript(0)
    assert client.request_tokens(0) <= one
    fold = by_id(messages, f"{EMERGENCY_FOLD_ID_PREFIX}0")
    assert fold.additional_properties[SUMMARY_OF_KEY] == ["user_summary_0", "user_summary_1"]
    assert not excluded(by_id(messages, "user_summary_2"))


def test_no_fold_while_the_prompt_fits_or_with_fewer_than_two_summaries() -> None:
    messages = conversation()
    strategy, client = build(faithful, size(messages) + 100)
    asyncio.run(strategy(messages))
    assert client.calls == 0
    single = conversation(1)
    strategy, client = build(faithful, size(single) - 10)
    with pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(single))
    assert client.calls == 0


# ----------------------------------------------------------------------------- properties

ANSWERS = {"faithful": faithful, "lossy": lossy, "verbose": verbose, "failed": lambda _: None}


@st.composite
def fold_cases(draw: DrawFn) -> tuple[list[Message], int, str]:
    """Two to five standing summaries, a budget from far under to over their size, and a summarizer's behaviour."""
    messages = conversation(draw(st.integers(2, 5)))
    budget = max(1, int(size(messages) * draw(st.floats(0.5, 1.1))))
    return messages, budget, draw(st.sampled_from(sorted(ANSWERS)))


@given(fold_cases())
def test_a_kept_fold_is_smaller_and_quotes_every_value_and_replays_without_a_call(
    case: tuple[list[Message], int, str],
) -> None:
    """Whatever the summarizer answers, a fold in the prompt replaced smaller-or-equal text with every value kept,
    and the same state gives the same bytes on a deep copy without a second call."""
    messages, budget, answer = case
    source = copy.deepcopy(messages)
    strategy, client = build(ANSWERS[answer], budget)
    try:
        asyncio.run(strategy(messages))
    except CompactionBudgetExceeded:
        assert [m.to_dict() for m in messages] == [m.to_dict() for m in source]
        return
    folds = [m for m in messages if (m.message_id or "").startswith(EMERGENCY_FOLD_ID_PREFIX)]
    for fold in folds:
        replaced = [by_id(source, i) for i in fold.additional_properties[SUMMARY_OF_KEY]]
        assert len(replaced) >= 2
        assert all(REQUIREMENT.findall(r.text)[0] in fold.text for r in replaced)
        assert TOKENIZER.count_tokens(fold.text) < sum(TOKENIZER.count_tokens(r.text) for r in replaced)
    if answer != "faithful":
        assert folds == []
    calls = client.calls
    again = copy.deepcopy(source)
    asyncio.run(strategy(again))
    assert client.calls == calls
    assert [m.to_dict() for m in again] == [m.to_dict() for m in messages]


def test_a_fold_that_quotes_every_value_but_drops_a_constraint_line_is_refused() -> None:
    """The summary coverage rule judges emergency folds as it judges the user half's summaries: a constraint one of
    the folded summaries carries must be carried by the fold too."""
    messages = conversation()
    constrained = by_id(messages, "user_summary_1")
    constrained.contents[0].text = f"{constrained.text}\nNever drain more than one shard at a time."
    strategy, client = build(faithful, budget_for(messages))
    with pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(messages))
    assert client.calls == 1
    assert not any(m.message_id and m.message_id.startswith(EMERGENCY_FOLD_ID_PREFIX) for m in messages)
    constraint = "Never drain more than one shard at a time."
    carrying, client = build(lambda m: f"{faithful(m)} {constraint}", budget_for(messages))
    asyncio.run(carrying(messages))
    assert any(m.message_id and m.message_id.startswith(EMERGENCY_FOLD_ID_PREFIX) for m in messages)
