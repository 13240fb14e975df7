"""Three faults of a compaction pass, found by fault injection (issue 21, item 5), each pinned here.

(a) A pass that ends in ``CompactionBudgetExceeded`` still counts and warns the replacements
    it refused, and its error names them. (b) A summarizer answer the tokenizer cannot count
    is kept like any answer: no second call for it. (c) A pass over a pass's output changes
    nothing (see also the properties in the strategies' property files).
"""

from __future__ import annotations

import asyncio
import copy
import pickle

import pytest
from agent_framework import CharacterEstimatorTokenizer, Content, Message
from agent_framework._compaction import EXCLUDED_KEY

from maf_compaction import CompactionBudgetExceeded
from maf_compaction import UserTurnAnchoredSummarizationCompactionStrategy as Strategy
from test_composition_chain import budget_for, build, conversation, lossy, merged, size
from test_user_summaries import ScriptedSummarizer, extractive, over_budget
from test_user_summaries import conversation as user_conversation

POISON = "<|poison|>"


class PoisonedTokenizer:
    """A tokenizer that raises on one text it cannot encode (as tiktoken does on a disallowed special token)."""

    def __init__(self) -> None:
        self._inner = CharacterEstimatorTokenizer()

    def count_tokens(self, text: str) -> int:
        if POISON in text:
            raise ValueError(f"cannot encode {POISON!r}")
        return self._inner.count_tokens(text)


# --- (a) refusals on a pass that fails -------------------------------------------------------------


def test_refusals_on_a_pass_that_exceeds_the_budget_are_counted_warned_and_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    messages = conversation()
    strategy, client = build(lossy, budget_for(messages), overflow_policy="raise")
    with caplog.at_level("WARNING", logger="maf_compaction"), pytest.raises(CompactionBudgetExceeded) as raised:
        asyncio.run(strategy(messages))
    assert client.calls == 1  # the merge drops values: a harder rewrite of the same records would too, not asked
    assert strategy.replacements_refused == 1
    assert "Refused 1 record replacement" in " ".join(r.getMessage() for r in caplog.records)
    assert "1 record replacement(s) or emergency fold(s) refused" in str(raised.value)
    assert len(raised.value.refused) == 1
    assert pickle.loads(pickle.dumps(raised.value)) == raised.value
    caplog.clear()
    with caplog.at_level("WARNING", logger="maf_compaction"), pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(copy.deepcopy(messages)))
    assert strategy.replacements_refused == 1, "a refusal is counted once"
    assert "Refused" not in " ".join(r.getMessage() for r in caplog.records), "and warned once"


# --- (b) an answer the tokenizer cannot count --------------------------------------------------------


def test_an_answer_the_tokenizer_cannot_count_is_kept_and_not_asked_again() -> None:
    """The pass fails with the tokenizer's error (loudly, the list untouched) on every pass, with one call."""
    messages = user_conversation(12)
    budget = over_budget(messages)
    client = ScriptedSummarizer(lambda m: f"{extractive(m)}\nThe user asked for exports {POISON}.")
    strategy = Strategy(
        max_input_tokens=budget, tokenizer=PoisonedTokenizer(), client=client, max_summary_input_tokens=10_000
    )
    before = [m.to_dict() for m in messages]
    for _ in range(3):
        with pytest.raises(ValueError, match="cannot encode"):
            asyncio.run(strategy(messages))
    assert client.calls == 1, "the answer is remembered by its request's identity"
    assert [m.to_dict() for m in messages] == before
    assert any(a.text and POISON in a.text for a in strategy.decision_state().answers)


# --- (c) a pass over a pass's output -----------------------------------------------------------------


def test_a_second_pass_leaves_a_shed_result_as_it_is() -> None:
    """A second pass leaves every stored byte as the first left it.

    The first pass keeps a merge of the two records (they are excluded, linked to it) and sheds
    the late lookup; the fallback held both while it ran. Before the fix the second pass found
    them excluded and no longer held, and its fallback shortened their stored results.
    """
    messages = conversation()
    call = Content.from_function_call(call_id="late", name="lookup", arguments={"n": 9})
    extra = Content.from_function_result(call_id="late", result="status: fine " + "pad words " * 400)
    messages[-1:-1] = [Message("assistant", [call], message_id="a9"), Message("tool", [extra], message_id="t9")]
    strategy, _ = build(merged, size(messages) // 4, overflow_policy="shed")
    asyncio.run(strategy(messages))
    shed = next(m for m in messages if m.message_id == "t9")
    assert shed.additional_properties.get(EXCLUDED_KEY)
    first = [m.to_dict() for m in messages]
    assert asyncio.run(strategy(messages)) is False
    assert [m.to_dict() for m in messages] == first
