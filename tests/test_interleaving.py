"""A recall middleware's change made while a composed pass awaits its summarizer survives the pass.

The composition's pass reads the conversation's state, may await the summarizer (an
effect), and writes its result back. Meanwhile the recall middleware wired to the record
half (``reforce=records.take_reforce``) can take the record half's outstanding ask for
uncovered tool groups: it does so on the way out of any chat call of the same
conversation, e.g. a second run on the same session while the first run's compaction
awaits the summarizer. The pass's write-back must not undo the take (the ask would be
pinned twice) nor any recall-protocol change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from agent_framework import Message

from maf_compaction.core.recall import RecallState
from test_composition import build, conversation, measured, user_rounds
from test_user_summaries import ScriptedSummarizer, extractive


def test_a_reforce_take_while_a_composed_pass_awaits_the_summarizer_is_kept() -> None:
    summarizer = ScriptedSummarizer(extractive)
    messages = conversation(6, covers=(0, 1, 2))
    messages += user_rounds(10, start=10, pad=8)
    strategy = build(int(measured(messages)[1] / 0.8), summarizer=summarizer)

    async def scenario() -> None:
        release = asyncio.Event()
        waiting = asyncio.Event()

        async def slow(messages: Sequence[Message]) -> str | None:
            waiting.set()
            await release.wait()
            return extractive(messages)

        records = strategy.tool_results
        cell = records.state_cell
        cell.value = replace(cell.value, recall=RecallState(pin_disabled=True))
        await strategy(messages)  # the record half asks for the uncovered lookups
        assert records.reforce_pending(), "an ask for the uncovered lookups is outstanding"
        cell.value = replace(cell.value, recall=RecallState())  # forcing works again

        summarizer.script = slow
        # A long user turn (no model response, so the ask stays outstanding) puts the prompt over the
        # budget: a pass over the budget does not wait for the record, it asks the summarizer.
        messages.append(Message("user", ["x " * 8_000], message_id="long"))
        calls = summarizer.calls
        pass_ = asyncio.create_task(strategy(messages))
        await asyncio.wait_for(waiting.wait(), 10)
        assert summarizer.calls == calls + 1, "the pass awaits the summarizer"
        assert records.take_reforce(), "the middleware takes the ask meanwhile"
        taken = records.decision_state()
        release.set()
        await pass_
        assert not records.reforce_pending(), "the pass wrote the ask back as not taken"
        assert not records.take_reforce(), "one ask pins one request"
        assert records.decision_state().ask == taken.ask

    asyncio.run(scenario())


def test_the_settle_rule_keeps_both_sides_changes() -> None:
    """The pure rule: the recall state is the middleware's; decisions are the pass's, a take of the same ask kept."""
    from maf_compaction.core.record_decisions import Ask, RecordDecisions
    from maf_compaction.core.records import RecordState
    from maf_compaction.core.settle import settle

    ask = Ask(targets=(3, 4), records_at_ask=1, responses_at_ask=5)
    passed = RecordState(decisions=RecordDecisions(settled=(1,), ask=ask))
    taken = RecordState(decisions=RecordDecisions(ask=replace(ask, taken=True)), recall=RecallState(next_pin="reforce"))
    settled = settle(passed, taken)
    assert settled.decisions == RecordDecisions(settled=(1,), ask=replace(ask, taken=True))
    assert settled.recall == RecallState(next_pin="reforce")
    other = replace(ask, targets=(5,))
    assert settle(replace(passed, decisions=RecordDecisions(ask=other)), taken).decisions.ask == other, "a new ask"
    assert settle(RecordState(), taken).decisions.ask is None, "the pass ended the ask"
    assert settle(passed, RecordState()) == passed, "nothing happened meanwhile"


def test_a_middleware_wired_before_or_after_the_composition_shares_its_one_value() -> None:
    """The record half's view follows the composition that adopts it: no second value to merge or split."""
    from maf_compaction import (
        RecallGate,
        ToolResultAnchoredSummarizationCompactionStrategy,
        ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
        ToolResultRecallMiddleware,
        UserTurnAnchoredSummarizationCompactionStrategy,
    )
    from maf_compaction.adapters.sessions import CompactionStack
    from test_composition import TOKENIZER

    for before in (True, False):
        records = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=1_000, tokenizer=TOKENIZER)
        users = UserTurnAnchoredSummarizationCompactionStrategy(
            max_input_tokens=1_000, tokenizer=TOKENIZER, client=ScriptedSummarizer(extractive), remembered_requests=2
        )
        gate = RecallGate()

        def middleware(
            records: ToolResultAnchoredSummarizationCompactionStrategy = records, gate: RecallGate = gate
        ) -> ToolResultRecallMiddleware:
            return ToolResultRecallMiddleware(
                max_input_tokens=1_000,
                tokenizer=TOKENIZER,
                arm=gate.arm,
                disarm=gate.disarm,
                reforce=records.take_reforce,
            )

        recall = middleware() if before else None
        composed = ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
            tokenizer=TOKENIZER, tool_results=records, user_turns=users
        )
        recall = recall or middleware()
        stack = CompactionStack(composed, gate, recall)
        cell = records.state_cell
        cell.value = replace(cell.value, recall=RecallState(awaiting_record=True))
        assert recall.awaiting_record, "the middleware reads the record half's part of the composition's value"
        assert composed.decision_state().records.recall.awaiting_record
        gate.arm()
        assert composed.decision_state().records.recall.armed, "the gate's permission is in the one value"
        assert stack.state().armed
        recall.forget_pending()
        assert not gate.armed
        assert not composed.decision_state().records.recall.awaiting_record
        stack.restore(
            replace(
                stack.state(),
                state=replace(composed.decision_state(), records=replace(cell.value, recall=RecallState(armed=True))),
            )
        )
        assert gate.armed, "a restore sets the gate's permission with the rest of the state"
