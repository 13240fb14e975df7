"""Real wiring can interleave a recall decision with a composed pass that awaits its summarizer.

Within one run it cannot: compaction runs inside the chat middleware's ``call_next``
(``BaseChatClient.get_response`` applies the strategy), so the middleware decides about
the next request only after the pass has finished. Two runs on one conversation can: run
B's pass finishes and its model call is under way when run A's pass starts and awaits
the summarizer; B's response arrives, and the recall middleware, on B's way out, takes
the record strategy's outstanding ask for uncovered tool groups. A's pass then writes
its state back, and A's own response is seen after B decided to pin the next request.
Here both runs go through a real ``Agent`` (the framework's function-invocation,
chat-middleware and compaction layers over a scripted client), with the README's wiring
of the composition and ``ToolResultRecallMiddleware(reforce=records.take_reforce)``. The
take must survive A's write-back, and B's pin must survive A's history seen: one ask pins
one request, the next one to start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from agent_framework import (
    Agent,
    BaseChatClient,
    ChatMiddlewareLayer,
    ChatResponse,
    Content,
    FunctionInvocationLayer,
    Message,
    tool,
)
from msgspec.structs import replace

from maf_compaction import RecallGate, ToolResultRecallMiddleware, make_recall_tool
from maf_compaction.core.recall import RecallState
from maf_compaction.core.state import RecordRoute
from test_composition import TOKENIZER, build, conversation, measured, user_rounds
from test_user_summaries import ScriptedSummarizer, extractive


class GatedClient(FunctionInvocationLayer, ChatMiddlewareLayer, BaseChatClient):
    """The framework's client layers over a model that answers "Noted." once its request's gate opens.

    A request is known by the id of its last user message; ``arrived`` is set when it reaches the
    model, ``gates`` holds it there (once), and ``calls`` answers it with a tool call instead (once).
    ``pinned`` lists the ids of requests sent with a named ``tool_choice`` (a forced record).
    """

    def __init__(self) -> None:
        super().__init__()
        self.arrived: dict[str, asyncio.Event] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.calls: dict[str, Content] = {}
        self.pinned: list[str] = []

    def _inner_get_response(self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **_: Any):
        async def respond() -> ChatResponse:
            await self._validate_options(options)
            key = next(m.message_id or "" for m in reversed(messages) if m.role == "user")
            if isinstance(options.get("tool_choice"), Mapping):
                self.pinned.append(key)
            self.arrived.setdefault(key, asyncio.Event()).set()
            gate = self.gates.pop(key, None)
            if gate is not None:
                await gate.wait()
            call = self.calls.pop(key, None)
            reply = Message("assistant", [call] if call is not None else ["Noted."])
            return ChatResponse(messages=[reply], response_id=f"r{key}")

        return respond()


@tool
def lookup(n: int) -> str:
    """Look up deployment ``n``."""
    return f"deployment {n}: healthy"


@pytest.mark.parametrize("b_calls_a_tool", [True, False], ids=["b-continues", "b-ends"])
def test_a_take_by_another_run_while_a_composed_pass_awaits_the_summarizer_is_kept(b_calls_a_tool: bool) -> None:
    """B's answer is a tool call (its next request spends the pin: A's write-back must keep the ask
    taken, or A's way out takes it again and pins a second request), or plain text (the pin waits
    for the next request to start, C's: A's history seen must not drop it)."""
    summarizer = ScriptedSummarizer(extractive)
    history = conversation(6, covers=(0, 1, 2)) + user_rounds(10, start=10, pad=8)
    budget = int(measured(history)[1] / 0.8)
    strategy = build(budget, summarizer=summarizer)
    records = strategy.tool_results
    gate = RecallGate()
    recall = ToolResultRecallMiddleware(
        max_input_tokens=budget,
        tokenizer=TOKENIZER,
        arm=gate.arm,
        disarm=gate.disarm,
        trigger_fraction=records.trigger_fraction,
        reforce=records.take_reforce,
    )
    client = GatedClient()
    agent = Agent(
        client, "Be terse.", tools=[lookup, make_recall_tool(gate)], middleware=[recall], compaction_strategy=strategy
    )

    async def in_flight() -> None:
        """Until a pinned request is under way (its pin spent when it started)."""
        while not records.conversation.value.recall.in_flight:
            await asyncio.sleep(0.005)

    async def scenario() -> None:
        # An outstanding ask for the uncovered lookups, made by a pass while forcing was off.
        shared = records.conversation
        shared.value = replace(shared.value, recall=RecallState(route=RecordRoute.PINS_IGNORED))
        await strategy([Message.from_dict(m.to_dict()) for m in history])
        assert records.reforce_pending(), "an ask for the uncovered lookups is outstanding"
        shared.value = replace(shared.value, recall=RecallState())
        calls = summarizer.calls

        # Run B: its pass fits the budget (the user half waits for the due record, no summary is asked),
        # and its model call is held; its answer will be a tool call, so B's run makes a second request.
        b_input = [*history, Message("user", ["Anything else?"], message_id="b")]
        gate_b = client.gates["b"] = asyncio.Event()
        if b_calls_a_tool:
            client.calls["b"] = Content.from_function_call(call_id="call_b", name="lookup", arguments={"n": 99})
        run_b = asyncio.ensure_future(agent.run(b_input))
        await asyncio.wait_for(client.arrived.setdefault("b", asyncio.Event()).wait(), 10)
        assert summarizer.calls == calls, "B's pass asked for no summary"

        # Run A: a long user turn puts its prompt over the budget, so its pass asks the summarizer, which waits.
        release = asyncio.Event()
        asked = asyncio.Event()

        async def slow(messages: Sequence[Message]) -> str | None:
            asked.set()
            await release.wait()
            return extractive(messages)

        summarizer.script = slow
        a_input = [*history, Message("user", ["x " * 8_000], message_id="a")]
        run_a = asyncio.ensure_future(agent.run(a_input))
        await asyncio.wait_for(asked.wait(), 10)

        # B's answer arrives while A's pass awaits the summarizer: the middleware takes the ask on B's way out
        # (and B's next request, pinned for it, starts; its pass waits for A's).
        gate_b.set()
        await asyncio.wait_for(in_flight() if b_calls_a_tool else run_b, 10)
        assert not records.reforce_pending(), "run B's middleware took the ask while A's pass was awaiting"
        taken = records.decision_state().records.ask
        assert taken is not None
        assert taken.taken

        release.set()
        await asyncio.wait_for(asyncio.gather(run_a, run_b), 10)
        assert summarizer.calls > calls, "A's pass asked for a summary"
        assert records.decision_state().records.ask == taken, "A's write-back keeps the take"
        assert not records.reforce_pending(), "one ask pins one request"
        assert not records.take_reforce(), "one ask pins one request"

        # The pin B decided is spent by the next request to start (B's second, or C's: A's had started
        # before it), and the ask pins no other.
        for key in ("c", "d"):
            await agent.run([*history, Message("user", ["Report."], message_id=key)])
        expected = ["b"] if b_calls_a_tool else ["c"]
        assert client.pinned == expected, f"one ask pins one request, got pinned requests {client.pinned}"

    asyncio.run(scenario())


def test_a_reforce_pin_stands_until_a_request_spends_it() -> None:
    """The pure rule: a history seen before the pin is spent keeps a re-force pin (its ask is taken); a size
    pin is the pin rule's on the latest history."""
    from maf_compaction.core.recall import HistorySeen, Nothing, Pin, PinRule, RecallStatus, RequestStarting, advance

    rule = PinRule(trigger_tokens=1_000)
    small = RecallStatus(included_tokens=10, records=1, pending_groups=0)
    state, action = advance(rule, RecallState(next_pin="reforce"), HistorySeen(small))
    assert (state.next_pin, action) == ("reforce", Nothing())
    state, action = advance(rule, state, RequestStarting())
    assert isinstance(action, Pin)
    assert action.kind == "reforce"
    assert state.next_pin is None
    state, _ = advance(rule, RecallState(next_pin="size"), HistorySeen(small))
    assert state.next_pin is None, "a size pin follows the latest history"
