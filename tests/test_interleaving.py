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

from agent_framework import Message
from msgspec.structs import replace

from maf_compaction.core.recall import HistorySeen, PinRule, RecallState, RecallStatus, TakeAsk
from maf_compaction.core.records import on_recall
from maf_compaction.core.state import RecordRoute, RequestKind, State
from test_composition import Composition, build, conversation, measured, user_rounds
from test_user_summaries import ScriptedSummarizer, extractive


def _asked_while_forcing_was_off(summarizer: ScriptedSummarizer) -> tuple[Composition, list[Message]]:
    """A composition and its conversation: six lookups, three of them recorded, then ten user rounds, within the
    budget (a pass over it leaves three lookups uncovered and asks for a record of them)."""
    messages = conversation(6, covers=(0, 1, 2))
    messages += user_rounds(10, start=10, pad=8)
    strategy = build(int(measured(messages)[1] / 0.8), summarizer=summarizer)
    return strategy, messages


def test_a_reforce_take_while_a_composed_pass_awaits_the_summarizer_is_kept() -> None:
    summarizer = ScriptedSummarizer(extractive)
    strategy, messages = _asked_while_forcing_was_off(summarizer)

    async def scenario() -> None:
        release = asyncio.Event()
        waiting = asyncio.Event()

        async def slow(messages: Sequence[Message]) -> str | None:
            waiting.set()
            await release.wait()
            return extractive(messages)

        records = strategy.tool_results
        shared = records.conversation
        shared.value = replace(shared.value, recall=RecallState(route=RecordRoute.PINS_IGNORED))
        await strategy(messages)  # the record half asks for the uncovered lookups
        assert records.reforce_pending(), "an ask for the uncovered lookups is outstanding"
        shared.value = replace(shared.value, recall=RecallState())  # forcing works again

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
        assert records.decision_state().records.ask == taken.records.ask

    asyncio.run(scenario())


def test_both_writers_changes_survive_a_composed_pass_that_awaits_the_summarizer() -> None:
    """What the settle rule merged (``core.settle`` is gone: the shell absorbs each answer into the conversation's
    current value, re-read after the await, and steps again from it), through the real shell. While a composed pass
    awaits its summarizer, the recall middleware's transition on another call's way out (a history seen) takes the
    outstanding ask and decides a re-force pin. After the pass, the one value holds both writers' changes: the
    middleware's recall state (its pin) and its take of the same ask, and the pass's own (its summary, absorbed and
    allocated, applied to the list)."""
    summarizer = ScriptedSummarizer(extractive)
    strategy, messages = _asked_while_forcing_was_off(summarizer)

    async def scenario() -> None:
        release = asyncio.Event()
        waiting = asyncio.Event()

        async def slow(messages: Sequence[Message]) -> str | None:
            waiting.set()
            await release.wait()
            return extractive(messages)

        records = strategy.tool_results
        shared = records.conversation
        shared.value = replace(shared.value, recall=RecallState(route=RecordRoute.PINS_IGNORED))
        await strategy(messages)
        assert records.reforce_pending(), "an ask for the uncovered lookups is outstanding"
        shared.value = replace(shared.value, recall=RecallState())
        before: State = shared.value
        assert not before.answered(RequestKind.SUMMARY)

        summarizer.script = slow
        messages.append(Message("user", ["x " * 8_000], message_id="long"))
        pass_ = asyncio.create_task(strategy(messages))
        await asyncio.wait_for(waiting.wait(), 10)
        # The middleware's transition, as ``ToolResultRecallMiddleware`` makes it on the shared value.
        seen = HistorySeen(RecallStatus(included_tokens=100, records=1, pending_groups=0))
        shared.value, action = on_recall(PinRule(trigger_tokens=10**6), shared.value, seen)
        assert isinstance(action, TakeAsk)
        meanwhile: State = shared.value
        assert meanwhile.recall.next_pin == "reforce"
        assert meanwhile.records.ask is not None
        assert meanwhile.records.ask.taken
        release.set()
        await pass_

        after: State = shared.value
        assert after.recall == meanwhile.recall, "the pass undid the middleware's recall state"
        assert after.records.ask == meanwhile.records.ask, "the pass undid the take of its ask"
        assert not records.take_reforce(), "one ask pins one request"
        summaries = [a for a in after.answered(RequestKind.SUMMARY) if a.text is not None]
        assert len(summaries) == 1, "the pass's summary was not absorbed into the current value"
        assert after.compactions == 1
        assert strategy.user_turns.user_compactions == 1
        assert any(m.message_id == summaries[0].message_id for m in messages), "the pass's summary is not applied"

    asyncio.run(scenario())


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
        shared = records.conversation
        assert composed.conversation is shared, "the composition shares its record half's conversation"
        assert recall.shares(shared)
        assert gate.conversation is shared
        shared.value = replace(shared.value, recall=RecallState(awaiting_record=True))
        assert recall.awaiting_record, "the middleware reads the record half's part of the composition's value"
        assert composed.decision_state().recall.awaiting_record
        gate.arm()
        assert composed.decision_state().recall.armed, "the gate's permission is in the one value"
        assert stack.state().armed
        recall.forget_pending()
        assert not gate.armed
        assert not composed.decision_state().recall.awaiting_record
        stack.restore(replace(stack.state(), state=replace(composed.decision_state(), recall=RecallState(armed=True))))
        assert gate.armed, "a restore sets the gate's permission with the rest of the state"
