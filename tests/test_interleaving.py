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
