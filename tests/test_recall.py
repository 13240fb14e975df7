"""The recall gate, the recall tool and ``ToolResultRecallMiddleware``, driven through the framework.

A scripted chat client composes the framework's own client layers (function invocation,
chat middleware and telemetry over ``BaseChatClient``, as the framework's OpenAI client
does); only the provider call is scripted. Each request is recorded as the provider
receives it (messages and validated options) and answered by the next step of a script:
text, a ``lookup`` call, a recall call, a failure before answering, in the middle of the
stream or in its finalizer, or a response cut at the cap (``finish_reason="length"``). A
real ``Agent`` and ``create_harness_agent`` drive it.

Budgets are chosen so that only the rule under test decides: ``TINY`` makes every prompt
exceed the trigger (a size-triggered record is due from the first exit on), ``HUGE`` makes
none do.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pytest
from agent_framework import (
    Agent,
    AgentResponse,
    AgentSession,
    BaseChatClient,
    CharacterEstimatorTokenizer,
    ChatContext,
    ChatMiddleware,
    ChatResponse,
    ChatResponseUpdate,
    CompactionStrategy,
    Content,
    FinishReasonLiteral,
    Message,
    MiddlewareFailure,
    MiddlewareTermination,
    ResponseStream,
    create_harness_agent,
    tool,
)
from agent_framework._middleware import ChatMiddlewareLayer
from agent_framework._tools import FunctionInvocationLayer
from agent_framework.observability import ChatTelemetryLayer

from maf_compaction.adapters.recall import (
    NOT_NEEDED_REPLY,
    RecallGate,
    ToolResultRecallMiddleware,
    make_recall_tool,
)
from maf_compaction.adapters.records import ToolResultAnchoredSummarizationCompactionStrategy, record_text
from maf_compaction.core.answers import ANSWER_HEADROOM_TOKENS
from maf_compaction.core.recall import pin_due
from maf_compaction.core.records import (
    RECALL_TOOL_NAME,
    RECORD_INSTRUCTION,
    RECORD_MARKER,
    RECORD_PREFIX,
    RECORD_RECEIPT,
)
from maf_compaction.errors import CompactionBudgetExceeded

TOKENIZER = CharacterEstimatorTokenizer()
PIN = {"mode": "required", "required_function_name": RECALL_TOOL_NAME}
TINY = 1  # every prompt is over the trigger
HUGE = 10**9  # no prompt is
MODES = pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])

# --- the scripted provider ------------------------------------------------------------------

Failure = Literal["before", "mid", "final"]


class ScriptError(RuntimeError):
    """The scripted provider failed."""


@dataclass(frozen=True)
class Turn:
    """One scripted answer.

    Attributes:
        parts: ``("text", chunk)`` or ``("call", tool name, value)``; each part streams as
            its own update.
        fail: Where to fail: before answering, after the first streamed update, or in the
            stream's finalizer (a non-streaming answer fails at once for all three).
        error: What to raise.
        finish_reason: The response's finish reason.
    """

    parts: tuple[tuple[str, ...], ...] = ()
    fail: Failure | None = None
    error: type[BaseException] = ScriptError
    finish_reason: FinishReasonLiteral | None = None


@dataclass(frozen=True)
class Request:
    """One request as the provider received it (``sent``: each message's role and contents, serialized on arrival)."""

    number: int
    messages: tuple[Message, ...]
    options: dict[str, Any]
    stream: bool
    sent: tuple[str, ...] = ()

    @property
    def forced(self) -> bool:
        return self.options.get("tool_choice") == PIN

    @property
    def asks_for_record(self) -> bool:
        """The request ends with one user message holding the instruction to write a record (over the cached prefix)."""
        last = self.messages[-1]
        return last.role == "user" and [c.text for c in last.contents] == [RECORD_INSTRUCTION]


def wire(messages: Sequence[Message]) -> tuple[str, ...]:
    """What the provider reads of ``messages``: each one's role and contents, serialized."""
    return tuple(
        json.dumps({"role": m.role, "contents": [c.to_dict() for c in m.contents]}, sort_keys=True, default=str)
        for m in messages
    )


Step = Turn | Callable[[Request], Turn]


def say(*chunks: str, finish_reason: FinishReasonLiteral | None = None) -> Turn:
    return Turn(tuple(("text", chunk) for chunk in chunks), finish_reason=finish_reason)


def lookup_call(q: str = "alpha") -> Turn:
    return Turn((("call", "lookup", q),))


def recall_call(values: str = "lookup: code=XR-7", *, finish_reason: FinishReasonLiteral | None = None) -> Turn:
    return Turn((("call", RECALL_TOOL_NAME, values),), finish_reason=finish_reason)


def fail(where: Failure, error: type[BaseException] = ScriptError) -> Turn:
    return Turn((("text", "partial "), ("text", "answer")), fail=where, error=error)


def obey(otherwise: Turn) -> Step:
    """A model that honours the pin: a recall call when forced, ``otherwise`` when not."""
    return lambda request: recall_call() if request.forced else otherwise


def ignore(otherwise: Turn) -> Step:
    """A model that ignores the pin (it answers the same either way)."""
    return lambda request: otherwise


class ScriptedClient(FunctionInvocationLayer, ChatMiddlewareLayer, ChatTelemetryLayer, BaseChatClient):
    """The framework's client layers over a scripted provider (see the module docstring)."""

    OTEL_PROVIDER_NAME = "scripted"

    def __init__(self, script: Sequence[Step] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.script: list[Step] = list(script)
        self.requests: list[Request] = []
        self.events: list[str] = []  # "produced n.k" as the provider streams update k of request n

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        number = len(self.requests) + 1
        request = Request(number, tuple(messages), dict(options), stream, wire(messages))
        self.requests.append(request)
        step = self.script.pop(0) if self.script else say("done")
        turn = step(request) if callable(step) else step
        if turn.fail == "before":
            raise turn.error(f"request {number} failed before answering")
        contents = [_content(part, f"call_{number}_{k}") for k, part in enumerate(turn.parts)]
        if not stream:
            return self._respond(number, turn, contents)
        return ResponseStream(self._updates(number, turn, contents), finalizer=lambda ups: _finalize(turn, ups))

    async def _respond(self, number: int, turn: Turn, contents: list[Content]) -> ChatResponse:
        if turn.fail is not None:
            raise turn.error(f"request {number} failed")
        message = Message("assistant", contents)
        return ChatResponse(messages=[message], response_id=f"r{number}", finish_reason=turn.finish_reason)

    async def _updates(self, number: int, turn: Turn, contents: list[Content]) -> AsyncIterator[ChatResponseUpdate]:
        for k, content in enumerate(contents):
            await asyncio.sleep(0)
            self.events.append(f"produced {number}.{k}")
            last = k == len(contents) - 1
            yield ChatResponseUpdate(
                role="assistant",
                contents=[content],
                response_id=f"r{number}",
                finish_reason=turn.finish_reason if last else None,
            )
            if turn.fail == "mid":
                raise turn.error(f"request {number} failed mid-stream")


def _content(part: tuple[str, ...], call_id: str) -> Content:
    if part[0] == "text":
        return Content.from_text(part[1])
    return Content.from_function_call(
        call_id, part[1], arguments={"values": part[2]} if part[1] == RECALL_TOOL_NAME else {"q": part[2]}
    )


def _finalize(turn: Turn, updates: Sequence[ChatResponseUpdate]) -> ChatResponse:
    if turn.fail == "final":
        raise turn.error("the stream failed in finalization")
    return ChatResponse.from_updates(updates)


@tool(approval_mode="never_require")
def lookup(q: str) -> str:
    """Look up the code of an item."""
    return f"{q}: code=XR-7 " + "pad " * 40


# --- wiring ----------------------------------------------------------------------------------


@dataclass
class Stack:
    """A client, its agent and the recall parts, wired as the README wires them."""

    client: ScriptedClient
    agent: Agent
    recall: ToolResultRecallMiddleware
    gate: RecallGate
    session: AgentSession
    updates: list[list[ChatResponseUpdate]] = field(default_factory=list)

    async def ask(self, prompt: str = "go", *, stream: bool = False) -> AgentResponse:
        """One run; streamed updates are kept per run (with the consumer's progress in ``events``)."""
        if not stream:
            return await self.agent.run(prompt, session=self.session)
        run = self.agent.run(prompt, session=self.session, stream=True)
        seen: list[ChatResponseUpdate] = []
        async for update in run:
            self.client.events.append(f"consumed {len(seen)}")
            seen.append(update)  # pyright: ignore[reportArgumentType]
        self.updates.append(seen)
        return await run.get_final_response()

    def stored(self) -> list[Message]:
        return list(self.session.state["in_memory"]["messages"])


def stack(
    script: Sequence[Step],
    *,
    budget: int = TINY,
    harness: bool = False,
    harness_defaults: bool = False,
    middleware: Sequence[Any] = (),
    inner_middleware: Sequence[Any] = (),
    default_options: dict[str, Any] | None = None,
    compaction: CompactionStrategy | None = None,
    **recall_options: Any,
) -> Stack:
    """A conversation with the recall middleware; ``middleware`` wraps it, ``inner_middleware`` runs inside it;
    ``compaction`` is the client's compaction strategy (it runs inside every request, below the middleware)."""
    client = ScriptedClient(script, compaction_strategy=compaction)
    gate = RecallGate()
    options: dict[str, Any] = {"trigger_fraction": 1.0, **recall_options}
    recall = ToolResultRecallMiddleware(
        max_input_tokens=budget, tokenizer=TOKENIZER, arm=gate.arm, disarm=gate.disarm, **options
    )
    tools = [lookup, make_recall_tool(gate)]
    chain = [*middleware, recall, *inner_middleware]
    if harness:
        switches = {} if harness_defaults else {"disable_todo": True, "disable_mode": True}
        agent = create_harness_agent(
            client,
            tools=tools,
            middleware=chain,
            disable_web_search=True,
            disable_file_memory=True,
            default_options=default_options,  # pyright: ignore[reportArgumentType]
            **switches,  # pyright: ignore[reportArgumentType]
        )
    else:
        agent = Agent(
            client,
            "Be terse.",
            tools=tools,
            middleware=chain,
            default_options=default_options,  # pyright: ignore[reportArgumentType]
        )
    return Stack(client, agent, recall, gate, agent.create_session())


def record_results(messages: Sequence[Message]) -> list[str]:
    """Texts of the records in ``messages``: results of recall calls that carry the marker."""
    calls = {
        c.call_id for m in messages for c in m.contents if c.type == "function_call" and c.name == RECALL_TOOL_NAME
    }
    return [
        str(c.result)
        for m in messages
        for c in m.contents
        if c.type == "function_result" and c.call_id in calls and RECORD_MARKER in str(c.result)
    ]


def words(text: str) -> str:
    """``text`` with its whitespace normalised (streamed and whole answers join chunks differently)."""
    return " ".join(text.split())


class Spy(ChatMiddleware):
    """Records what a chat middleware sees of each call, going in and coming out."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def process(self, context: ChatContext, call_next: Callable[[], Awaitable[None]]) -> None:
        options = context.options
        snapshot = dict(options) if options is not None else None
        entry: dict[str, Any] = {"in": len(context.messages), "options": options, "snapshot": snapshot}
        self.seen.append(entry)
        await call_next()
        entry["out"] = len(context.messages)
        entry["roles_out"] = [m.role for m in context.messages]
        entry["options_after"] = context.options


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings_seen() -> Any:
    handler = Capture()
    logger = logging.getLogger("maf_compaction")
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


# --- RecallGate and the tool -------------------------------------------------------------------


def test_gate_starts_disarmed_and_take_is_one_shot() -> None:
    gate = RecallGate()
    assert not gate.armed
    assert gate.take() is False
    gate.arm()
    assert gate.armed
    assert gate.take() is True
    assert not gate.armed
    assert gate.take() is False
    gate.arm()
    gate.disarm()
    assert gate.take() is False


def test_tool_is_a_function_tool_with_one_string_parameter() -> None:
    recall = make_recall_tool(RecallGate())
    assert recall.name == RECALL_TOOL_NAME
    parameters = recall.parameters()
    assert list(parameters["properties"]) == ["values"]
    assert parameters["properties"]["values"]["type"] == "string"
    assert parameters["required"] == ["values"]


def test_tool_description_is_the_whole_prompt_in_three_parts() -> None:
    purpose, target, guidance = make_recall_tool(target_tokens=2_000).description.split("\n\n")
    assert "earlier tool results" in purpose
    assert "removed to save space" in purpose
    assert "about 2,000 tokens" in target
    assert "cannot be reconstructed rather than on summaries" in target
    for phrase in (
        "values:",
        "grouped by the tool that produced it",
        "nothing is lost unnoticed",
        "Quote verbatim",
        "identifiers, codes, names, numbers, paths, URLs, versions, states and timestamps",
        "Markdown table rows verbatim, under their column heading and separator rows",
        "findings and conclusions as stated",
        "summary a tool wrote",
        "Briefly summarise the rest",
        "only what was actually present",
        "exactness over brevity",
    ):
        assert phrase in guidance
    assert "12,345 tokens" in make_recall_tool(target_tokens=12_345).description
    untargeted = make_recall_tool(target_tokens=None).description.split("\n\n")
    assert len(untargeted) == 2
    assert "tokens" not in untargeted[0] + untargeted[1]


async def test_tool_records_only_with_the_gates_permission() -> None:
    gate = RecallGate()
    recall = make_recall_tool(gate)
    assert await recall.invoke(arguments={"values": "v"}, skip_parsing=True) == NOT_NEEDED_REPLY
    assert RECORD_MARKER not in NOT_NEEDED_REPLY
    assert "nothing was recorded" in NOT_NEEDED_REPLY
    assert "nothing was removed" in NOT_NEEDED_REPLY
    gate.arm()
    # The record is the call's argument, which the prompt carries: the result is a receipt, not a second copy.
    assert await recall.invoke(arguments={"values": "lookup: XR-7"}, skip_parsing=True) == RECORD_RECEIPT
    assert RECORD_RECEIPT.startswith(RECORD_PREFIX)
    assert await recall.invoke(arguments={"values": "again"}, skip_parsing=True) == NOT_NEEDED_REPLY  # one-shot
    ungated = make_recall_tool()
    assert await ungated.invoke(arguments={"values": "x"}, skip_parsing=True) == RECORD_RECEIPT
    assert await ungated.invoke(arguments={"values": "y"}, skip_parsing=True) == RECORD_RECEIPT


@pytest.mark.parametrize("target", [0, -5, True, 1.5, "2000", 2.0])
def test_invalid_target_tokens_are_refused(target: Any) -> None:
    with pytest.raises(ValueError, match=r"target_tokens must be an integer >= 1 or None"):
        make_recall_tool(target_tokens=target)


# --- construction ------------------------------------------------------------------------------


def _middleware(**overrides: Any) -> ToolResultRecallMiddleware:
    options: dict[str, Any] = {"max_input_tokens": 1_000, "tokenizer": TOKENIZER, "arm": RecallGate().arm}
    return ToolResultRecallMiddleware(**{**options, **overrides})


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("max_input_tokens", 0, ">= 1"),
        ("max_input_tokens", True, ">= 1"),
        ("max_input_tokens", 10.0, ">= 1"),
        ("trigger_fraction", 0, r"\(0, 1\]"),
        ("trigger_fraction", 1.5, r"\(0, 1\]"),
        ("trigger_fraction", float("nan"), r"\(0, 1\]"),
        ("trigger_fraction", True, r"\(0, 1\]"),
        ("record_max_tokens", 0, ">= 1 or None"),
        ("record_max_tokens", False, ">= 1 or None"),
        ("max_groups_before_record", 0, ">= 1 or None"),
        ("max_groups_before_record", 2.5, ">= 1 or None"),
        ("min_groups_before_repeat", 0, ">= 1"),
        ("min_groups_before_repeat", None, ">= 1"),
        ("repeat_fraction", 0, r"\(0, 1\] or None"),
        ("repeat_fraction", 1.5, r"\(0, 1\] or None"),
        ("repeat_fraction", True, r"\(0, 1\] or None"),
        ("repeat_records", 1, "True or False"),
        ("arm", None, "callable"),
        ("disarm", "no", "callable"),
        ("reforce", 3, "callable"),
        ("tokenizer", object(), "count_tokens"),
    ],
)
def test_invalid_parameters_are_refused_by_name(name: str, value: Any, allowed: str) -> None:
    with pytest.raises(ValueError, match=rf"{name} .*{allowed}|{name}.*{allowed}"):
        _middleware(**{name: value})


def test_defaults_and_properties() -> None:
    recall = _middleware()
    assert recall.max_input_tokens == 1_000
    assert recall.trigger_fraction == 0.6
    assert not recall.pin_disabled
    assert not recall.record_due()  # nothing seen yet
    counters = (
        recall.forced_calls,
        recall.reforced_calls,
        recall.ignored_forced_calls,
        recall.failed_forced_calls,
        recall.records_truncated,
    )
    assert counters == (0, 0, 0, 0, 0)


class RecordStrategy:
    """The record strategy's side of the wiring: a queue of re-force asks."""

    def __init__(self, asks: int = 0) -> None:
        self.asks = asks
        self.taken = 0
        self.bound: ToolResultRecallMiddleware | None = None

    def bind_recall(self, recall: ToolResultRecallMiddleware) -> None:
        self.bound = recall

    def reforce_pending(self) -> bool:
        return self.asks > 0

    def take_reforce(self) -> bool:
        self.taken += 1
        if self.asks:
            self.asks -= 1
            return True
        return False


def test_the_strategys_take_reforce_shares_its_state_and_a_wrapper_shares_it_on_bind() -> None:
    """No introspection: the strategy's ``take_reforce`` carries its state; a host's wrapper is bound explicitly."""
    strategy = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=1_000, tokenizer=TOKENIZER)
    recall = _middleware(reforce=strategy.take_reforce)
    assert recall.conversation is strategy.conversation
    assert recall.shares(strategy.conversation)

    other = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=1_000, tokenizer=TOKENIZER)

    def wrapper() -> bool:  # not the strategy's own take_reforce: nothing is shared until the host binds
        return other.take_reforce()

    wrapped = _middleware(reforce=wrapper)
    assert wrapped.conversation is not other.conversation
    assert not wrapped.shares(other.conversation)
    other.bind_recall(wrapped)
    assert wrapped.conversation is other.conversation
    assert wrapped.shares(other.conversation)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"max_input_tokens": 2_000}, r"max_input_tokens.*1000.*2000"),
        ({"trigger_fraction": 0.5}, r"trigger_fraction.*0\.6.*0\.5"),
    ],
)
def test_a_middleware_must_share_the_budget_and_trigger_of_the_strategy_it_serves(
    overrides: dict[str, Any], named: str
) -> None:
    """Its trigger decides when the strategy's record is asked for: another budget or trigger is a wiring error."""
    strategy = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=1_000, tokenizer=TOKENIZER)
    with pytest.raises(ValueError, match=named):
        _middleware(reforce=strategy.take_reforce, **overrides)

    def wrapper() -> bool:  # a host's callable: nothing is shared until the host binds
        return strategy.take_reforce()

    wrapped = _middleware(reforce=wrapper, **overrides)
    with pytest.raises(ValueError, match=named):
        strategy.bind_recall(wrapped)
    _middleware(reforce=strategy.take_reforce, trigger_fraction=strategy.trigger_fraction)  # agreeing: fine


# --- where the middleware runs ---------------------------------------------------------------


@pytest.mark.parametrize("harness_defaults", [False, True], ids=["todo-mode-off", "todo-mode-on"])
@MODES
async def test_harness_middleware_sees_deltas_in_and_loaded_history_out(stream: bool, harness_defaults: bool) -> None:
    """The experiment the design rests on: only on the way out does ``context.messages`` hold history."""
    spy = Spy()
    run = stack(
        [lookup_call(), say("ok"), lookup_call("beta"), say("ok")],
        budget=HUGE,
        harness=True,
        harness_defaults=harness_defaults,
        middleware=[spy],
    )
    await run.ask(stream=stream)
    await run.ask(stream=stream)
    todo = 1 if harness_defaults else 0  # the todo list joins the first call of each run, at position 0
    assert [(s["in"], s["out"]) for s in spy.seen] == [
        (1 + todo, 1 + todo),  # the user turn (and the todo list the agent's providers added)
        (1, 3),  # only the tool result goes in; the whole turn, loaded, comes out
        (1 + todo, 5 + todo),
        (1, 7),
    ]
    assert spy.seen[3]["roles_out"] == ["user", "assistant", "tool", "assistant", "user", "assistant", "tool"]


# --- rule 1: one session ------------------------------------------------------------------------


async def test_a_second_session_is_refused_and_a_call_without_one_binds_nothing() -> None:
    run = stack([say("a"), say("b"), say("c")], budget=HUGE)
    await run.client.get_response([Message("user", ["no session"])], client_kwargs={"middleware": [run.recall]})
    await run.ask()
    other = run.agent.create_session()
    with pytest.raises(RuntimeError, match=r"one session.*session registry"):
        await run.agent.run("hello", session=other)
    await run.ask()  # the first session still works


# --- rules 2 and 3: arming, pinning, the cap ---------------------------------------------------------


@MODES
async def test_a_due_record_pins_the_next_request_only(stream: bool) -> None:
    run = stack([lookup_call(), obey(say("unused")), say("noted")], default_options=None)
    response = await run.ask(stream=stream)
    first, forced, after = run.client.requests
    assert not first.forced
    assert forced.forced
    assert forced.options["max_tokens"] == 4_000
    assert not after.forced
    assert "max_tokens" not in first.options
    assert "max_tokens" not in after.options
    # no instruction or message is injected: the forced request is what it would have been
    assert [m.role for m in forced.messages] == ["user", "assistant", "tool"]
    assert forced.options.get("instructions") == first.options.get("instructions")
    assert response.text == "noted"
    assert len(record_results(after.messages)) == 1
    assert (run.recall.forced_calls, run.recall.reforced_calls) == (1, 0)


async def test_the_gate_is_armed_for_the_forced_request_and_disarmed_for_any_other() -> None:
    arming: list[bool] = []

    class Peek(ChatMiddleware):
        async def process(self, context: ChatContext, call_next: Callable[[], Awaitable[None]]) -> None:
            arming.append(run.gate.armed)
            await call_next()

    run = stack([lookup_call(), ignore(say("no record")), say("next")], inner_middleware=[Peek()])
    run.gate.arm()  # a leftover permission
    await run.ask()
    await run.ask()
    assert arming == [False, True, False]
    assert not run.gate.armed


async def test_the_callers_options_are_never_mutated() -> None:
    spy = Spy()
    run = stack([lookup_call(), obey(say("x")), say("y")], middleware=[spy], default_options={"max_tokens": 77})
    await run.ask()
    forced = run.client.requests[1]
    assert forced.forced
    assert forced.options["max_tokens"] == 4_000
    for seen in spy.seen:
        assert seen["options_after"] is seen["options"]
        assert seen["options"] == seen["snapshot"]
        assert seen["options"].get("tool_choice") != PIN
        assert seen["options"]["max_tokens"] == 77


async def test_without_record_max_tokens_the_callers_cap_stays() -> None:
    run = stack([lookup_call(), obey(say("x")), say("y")], record_max_tokens=None, default_options={"max_tokens": 77})
    await run.ask()
    assert [r.forced for r in run.client.requests] == [False, True, False]
    assert [r.options["max_tokens"] for r in run.client.requests] == [77, 77, 77]


@pytest.mark.parametrize("harness_defaults", [False, True], ids=["todo-mode-off", "todo-mode-on"])
@MODES
async def test_harness_records_once_and_keeps_it(stream: bool, harness_defaults: bool) -> None:
    run = stack(
        [lookup_call(), obey(say("unused")), say("noted"), lookup_call("beta"), say("beta noted")],
        harness=True,
        harness_defaults=harness_defaults,
    )
    await run.ask(stream=stream)
    await run.ask(stream=stream)
    assert [r.forced for r in run.client.requests] == [False, True, False, False, False]
    assert run.client.requests[1].options["max_tokens"] == 4_000
    assert all("max_tokens" not in r.options for i, r in enumerate(run.client.requests) if i != 1)
    stored = run.stored()
    assert len(record_results(stored)) == 1
    assert record_results(stored) == [RECORD_RECEIPT]
    (receipt,) = [
        m for m in stored if any(c.type == "function_result" and c.result == RECORD_RECEIPT for c in m.contents)
    ]
    assert record_text(receipt, stored) == f"{RECORD_PREFIX}\nlookup: code=XR-7"  # the record, read from its call
    assert run.recall.forced_calls == 1
    assert not run.recall.pin_disabled


def tool_names(request: Request) -> list[str]:
    return sorted(getattr(t, "name", "") for t in request.options.get("tools", []))


@pytest.mark.parametrize("harness_defaults", [False, True], ids=["todo-mode-off", "todo-mode-on"])
@MODES
async def test_harness_pins_the_first_call_of_the_next_run(stream: bool, harness_defaults: bool) -> None:
    run = stack([say("hello"), obey(say("unused")), say("recorded")], harness=True, harness_defaults=harness_defaults)
    await run.ask(stream=stream)  # one call: its exit pins the next run's first call
    assert run.recall.record_due()
    await run.ask(stream=stream)
    first, forced, after = run.client.requests
    assert [r.forced for r in (first, forced, after)] == [False, True, False]
    todo = [
        m for m in forced.messages if (m.additional_properties.get("_attribution") or {}).get("source_id") == "todo"
    ]
    assert len(todo) == (1 if harness_defaults else 0)  # the run's context reaches the forced call unchanged
    assert tool_names(forced) == tool_names(first) == tool_names(after)
    assert RECALL_TOOL_NAME in tool_names(forced)
    assert len(record_results(run.stored())) == 1


# --- rule 4: the verdict on forced responses ------------------------------------------------------


#: The record strategy's budget and trigger when it runs inside the requests: 10 tokens, so a size-triggered record
#: is due once a lookup result is in the prompt, and no prompt comes near the budget (nothing else is compacted).
RECORD_BUDGET = 10_000
RECORD_TRIGGER = 0.001
RECORD_VALUES = "lookup: code=XR-7"


def ignores_pins(request: Request) -> Turn:
    """A model that never honours a pin but follows an instruction to write a record: a lookup for a user turn,
    text after a tool result, the record when the request ends with the instruction."""
    if request.asks_for_record:
        return say(RECORD_VALUES)
    return say("noted") if request.messages[-1].role == "tool" else lookup_call()


@MODES
async def test_two_ignored_pins_in_a_row_disable_forcing(stream: bool, warnings_seen: list[str]) -> None:
    """Two ignored pins disable forcing; the next due record is asked over the cached prefix instead: the
    conversation's last request byte for byte, what arrived since and one instruction, with the caller's head."""
    strategy = ToolResultAnchoredSummarizationCompactionStrategy(
        max_input_tokens=RECORD_BUDGET, tokenizer=TOKENIZER, trigger_fraction=RECORD_TRIGGER
    )
    run = stack(
        [ignores_pins] * 12,
        budget=RECORD_BUDGET,
        trigger_fraction=RECORD_TRIGGER,
        reforce=strategy.take_reforce,
        compaction=strategy,
    )
    requests = run.client.requests
    await run.ask(stream=stream)  # a lookup and its result: the exit with the result pins the next run's first call
    await run.ask(stream=stream)  # pinned, ignored (a lookup again): streak 1
    assert (run.recall.ignored_forced_calls, run.recall.pin_disabled) == (1, False)
    assert not warnings_seen
    await run.ask(stream=stream)  # the unpinned request between the two did not reset the streak
    assert (run.recall.ignored_forced_calls, run.recall.pin_disabled) == (2, True)
    assert any("did not call it; forcing recall is disabled" in w for w in warnings_seen)
    assert [r.forced for r in requests] == [False, False, True, False, True, False]
    # the two ignored responses carried the cap; the other requests keep the caller's own options
    assert [r.options.get("max_tokens") for r in requests] == [None, None, 4_000, None, 4_000, None]
    assert run.recall.record_due()  # still due: asked over the cached prefix from now on, not pinned
    assert strategy.prefix_requests == 0
    last = requests[-1]

    await run.ask(stream=stream)
    assert not any(r.forced for r in requests[6:]), "a request was pinned after forcing was disabled"
    assert run.recall.forced_calls == 2
    assert [r.number for r in requests if r.asks_for_record] == [7]
    prefix, following = requests[6], requests[7]
    # The conversation's last request byte for byte (what arrived since is left to the conversation's next
    # request: it is new to the provider's cache), then the instruction alone: the provider reads everything
    # before the instruction from its cache.
    assert prefix.sent[:-1] == last.sent
    assert [m.role for m in prefix.messages[len(last.messages) :]] == ["user"]
    # ... with the head the caller sent: the same tools, instructions and tool_choice; never streamed. Its one
    # option of its own is its output cap: what a record must be shorter than (the results it shows) plus headroom.
    assert {k: v for k, v in prefix.options.items() if k != "max_tokens"} == last.options == following.options
    shown = [c.result for m in prefix.messages if m.role == "tool" for c in m.contents if c.type == "function_result"]
    bound = strategy._counter.measure("\n".join(str(r) for r in shown))  # pyright: ignore[reportPrivateUsage]
    assert prefix.options["max_tokens"] == bound + max(bound, ANSWER_HEADROOM_TOKENS)
    assert not prefix.stream
    assert (strategy.prefix_requests, strategy.failed_prefix_requests) == (1, 0)
    # The answer is a record: it stands in the conversation's request, which no longer carries the lookups it
    # covers (the first lookup, in the head, stays); the instruction never enters history.
    written = [m.text for m in following.messages if m.text.startswith(RECORD_PREFIX)]
    assert written == [f"{RECORD_PREFIX}\n{RECORD_VALUES}"]
    assert [sum(m.role == "tool" for m in r.messages) for r in (prefix, following)] == [3, 1]
    assert not any(r.asks_for_record for r in requests[7:])
    assert not any(RECORD_INSTRUCTION in (m.text or "") for m in run.stored())
    assert not record_results(run.stored())  # no recall call: nothing was pinned
    assert not run.recall.record_due()  # the record arrived: the next one waits for new groups


async def test_a_recall_call_resets_the_streak() -> None:
    strategy = RecordStrategy()
    run = stack(
        [
            *[lookup_call(), ignore(say("no"))],  # streak 1
            *[lookup_call(), obey(say("unused")), say("recorded")],  # a recall call: streak 0
            *[lookup_call(), ignore(say("no"))],  # re-forced, ignored: streak 1
            *[lookup_call(), ignore(say("no"))],  # streak 2: disabled
        ],
        reforce=strategy.take_reforce,
    )
    await run.ask()
    await run.ask()
    assert len(record_results(run.client.requests[-1].messages)) == 1
    strategy.asks = 1  # with a record in place only a re-force pins again
    await run.ask()
    assert (run.recall.ignored_forced_calls, run.recall.pin_disabled) == (2, False)
    strategy.asks = 1
    await run.ask()
    assert (run.recall.ignored_forced_calls, run.recall.pin_disabled) == (3, True)
    assert [r.number for r in run.client.requests if r.forced] == [2, 4, 7, 9]
    assert run.recall.reforced_calls == 2


@MODES
async def test_a_response_cut_at_the_cap_counts_as_truncated(stream: bool) -> None:
    run = stack([lookup_call(), ignore(say("cut", finish_reason="length")), say("x")])
    await run.ask(stream=stream)
    assert run.recall.records_truncated == 1
    assert run.recall.ignored_forced_calls == 1  # the cut response carries no recall call
    run2 = stack([lookup_call(), recall_call(finish_reason="length"), say("x")])
    await run2.ask(stream=stream)
    assert (run2.recall.records_truncated, run2.recall.ignored_forced_calls) == (1, 0)
    unforced = stack([say("cut", finish_reason="length")], budget=HUGE)
    await unforced.ask(stream=stream)
    assert unforced.recall.records_truncated == 0


# --- rules 5 and 6: failures, retries and the stream buffer -------------------------------------


def texts(updates: Sequence[ChatResponseUpdate]) -> str:
    return "".join(c.text or "" for u in updates for c in u.contents if c.type == "text")


@pytest.mark.parametrize("where", ["before", "mid", "final"])
@MODES
async def test_a_failed_forced_request_disables_forcing_and_retries_once_unpinned(
    stream: bool, where: Failure, warnings_seen: list[str]
) -> None:
    run = stack([lookup_call(), fail(where), say("retried ", "answer"), lookup_call(), say("later")])
    response = await run.ask(stream=stream)
    assert words(response.text) == "retried answer"
    first, forced, retry = run.client.requests
    assert not first.forced
    assert forced.forced
    assert forced.options["max_tokens"] == 4_000
    assert not retry.forced
    assert "max_tokens" not in retry.options  # absent before the pin, absent on the retry
    assert "tool_choice" not in retry.options or retry.options["tool_choice"] == first.options.get("tool_choice")
    assert [m.text for m in retry.messages] == [m.text for m in forced.messages]
    if stream:
        assert words(texts(run.updates[0])) == "retried answer"  # nothing of the failed attempt
    assert run.recall.pin_disabled
    assert (run.recall.failed_forced_calls, run.recall.ignored_forced_calls) == (1, 0)
    assert not run.gate.armed
    assert any("failed (ScriptError" in w and "retried once" in w for w in warnings_seen)
    await run.ask(stream=stream)
    assert [r.forced for r in run.client.requests[3:]] == [False, False]


async def test_the_retry_keeps_a_cap_the_caller_set() -> None:
    run = stack([lookup_call(), fail("before"), say("retried")], default_options={"max_tokens": 77})
    await run.ask()
    assert [r.options["max_tokens"] for r in run.client.requests] == [77, 4_000, 77]


@pytest.mark.parametrize("where", ["before", "mid", "final"])
@MODES
async def test_a_failed_retry_propagates(stream: bool, where: Failure) -> None:
    run = stack([lookup_call(), fail(where), fail(where, ValueError)])
    with pytest.raises(ValueError, match=r"request 3 failed|finalization"):
        await run.ask(stream=stream)
    assert len(run.client.requests) == 3
    assert run.recall.pin_disabled
    assert run.recall.failed_forced_calls == 1


@pytest.mark.parametrize("harness_defaults", [False, True], ids=["todo-mode-off", "todo-mode-on"])
@MODES
async def test_a_retry_under_the_harness_loads_and_persists_history_once(stream: bool, harness_defaults: bool) -> None:
    run = stack([lookup_call(), fail("mid"), say("retried")], harness=True, harness_defaults=harness_defaults)
    response = await run.ask(stream=stream)
    assert response.text == "retried"
    forced, retry = run.client.requests[1:]
    assert [m.role for m in retry.messages] == [m.role for m in forced.messages]
    assert [m.role for m in run.stored()] == ["user", "assistant", "tool", "assistant"]
    assert run.stored()[-1].text == "retried"


def _position(events: list[str], event: str) -> int:
    return events.index(event)


async def test_forced_streams_are_held_until_complete_and_others_stream_live() -> None:
    thinking = Turn((("text", "thinking "), ("text", "aloud "), ("call", RECALL_TOOL_NAME, "lookup: XR-7")))
    run = stack([lookup_call(), thinking, say("one ", "two ", "three")])
    response = await run.ask(stream=True)
    events = run.client.events
    # request 2 (forced): every update is produced before the consumer sees the first of them
    consumed_after_forced = [i for i, e in enumerate(events) if e.startswith("consumed")]
    first_seen = next(i for i in consumed_after_forced if i > _position(events, "produced 2.0"))
    assert _position(events, "produced 2.2") < first_seen
    # request 3 (unforced): the consumer sees each update before the next is produced
    assert events[_position(events, "produced 3.0") + 1].startswith("consumed")
    assert events[_position(events, "produced 3.1") + 1].startswith("consumed")
    assert words(texts(run.updates[0])) == "thinking aloud one two three"
    assert words(response.text).endswith("one two three")
    assert len(record_results(run.client.requests[2].messages)) == 1
    assert run.recall.ignored_forced_calls == 0


async def test_the_retry_of_a_forced_stream_streams_live() -> None:
    run = stack([lookup_call(), fail("mid"), say("one ", "two ", "three")])
    await run.ask(stream=True)
    events = run.client.events
    assert events[_position(events, "produced 3.0") + 1].startswith("consumed")
    assert events[_position(events, "produced 3.1") + 1].startswith("consumed")
    assert "produced 2.0" in events  # the failed attempt did stream an update: it was held back
    assert words(texts(run.updates[0])) == "one two three"


@pytest.mark.parametrize("where", ["before", "mid"])
@MODES
async def test_cancellation_propagates_without_retry_or_verdict(stream: bool, where: Failure) -> None:
    run = stack([lookup_call(), fail(where, asyncio.CancelledError), obey(say("unused")), say("after")])
    with pytest.raises(asyncio.CancelledError):
        await run.ask(stream=stream)
    assert len(run.client.requests) == 2
    assert not run.recall.pin_disabled
    assert (run.recall.failed_forced_calls, run.recall.ignored_forced_calls) == (0, 0)
    assert run.recall.record_due()  # the pin was not spent
    await run.ask(stream=stream)
    assert [r.forced for r in run.client.requests] == [False, True, True, False]


class TerminateForced(ChatMiddleware):
    """Ends a forced call's chain with a framework abort signal, leaving a result behind."""

    def __init__(self, signal: type[Exception]) -> None:
        self.signal = signal

    async def process(self, context: ChatContext, call_next: Callable[[], Awaitable[None]]) -> None:
        if (context.options or {}).get("tool_choice") != PIN:
            await call_next()
            return
        message = Message("assistant", ["stopped"])
        if context.stream:
            update = ChatResponseUpdate(role="assistant", contents=[Content.from_text("stopped")])
            context.result = ResponseStream(_one(update), finalizer=ChatResponse.from_updates)
        else:
            context.result = ChatResponse(messages=[message])
        raise self.signal("stopped by an inner middleware")


async def _one(update: ChatResponseUpdate) -> AsyncIterator[ChatResponseUpdate]:
    yield update


@pytest.mark.parametrize("signal", [MiddlewareTermination, MiddlewareFailure])
@MODES
async def test_middleware_abort_signals_propagate_without_retry_or_verdict(
    stream: bool, signal: type[Exception]
) -> None:
    run = stack([lookup_call(), say("after")], inner_middleware=[TerminateForced(signal)])
    if signal is MiddlewareFailure:
        with pytest.raises(MiddlewareFailure):
            await run.ask(stream=stream)
    else:  # the pipeline absorbs a termination and returns the result left behind
        assert (await run.ask(stream=stream)).text == "stopped"
    assert len(run.client.requests) == 1
    assert run.recall.forced_calls == 1
    assert not run.recall.pin_disabled
    assert (run.recall.failed_forced_calls, run.recall.ignored_forced_calls) == (0, 0)


class OverBudget(ChatMiddleware):
    """Raises what a compaction pass inside the chat client raises when what must stay cannot fit."""

    async def process(self, context: ChatContext, call_next: Callable[[], Awaitable[None]]) -> None:
        if (context.options or {}).get("tool_choice") != PIN:
            await call_next()
            return
        raise CompactionBudgetExceeded("40,000 tokens must stay; the budget is 30,000", needed=40_000, budget=30_000)


@MODES
async def test_a_budget_failure_on_a_forced_call_propagates_without_retry_or_verdict(stream: bool) -> None:
    """The request was never sent: the provider is not judged, forcing stays on and the pin is not spent."""
    run = stack([lookup_call(), say("after")], inner_middleware=[OverBudget()])
    with pytest.raises(CompactionBudgetExceeded):
        await run.ask(stream=stream)
    assert len(run.client.requests) == 1  # the unforced first call only: no retry was sent
    assert run.recall.forced_calls == 1
    assert not run.recall.pin_disabled
    assert (run.recall.failed_forced_calls, run.recall.ignored_forced_calls) == (0, 0)
    assert run.recall.record_due()


# --- rule 7: when a record is due ---------------------------------------------------------------------


async def test_further_size_records_wait_for_min_groups_before_repeat() -> None:
    script: list[Step] = [
        *[lookup_call(), obey(say("unused")), say("recorded")],  # calls 1-3: the first record at once
        *[lookup_call(), say("one group")],  # 4-5: one group since the record
        *[lookup_call(), say("two groups")],  # 6-7: two: call 7's exit pins
        *[obey(say("unused")), say("recorded again")],  # 8-9
    ]
    run = stack(script, min_groups_before_repeat=2)
    for _ in range(4):
        await run.ask()
    assert [r.number for r in run.client.requests if r.forced] == [2, 8]
    assert len(record_results(run.client.requests[-1].messages)) == 2

    once = stack(script, min_groups_before_repeat=2, repeat_records=False)
    for _ in range(3):
        await once.ask()
    assert [r.number for r in once.client.requests if r.forced] == [2]


@pytest.mark.parametrize(("repeat_fraction", "due"), [(None, False), (0.9, False), (0.05, True)])
async def test_new_tool_groups_that_send_repeat_fraction_of_the_budget_make_a_later_record_due_alone(
    repeat_fraction: float | None, due: bool
) -> None:
    """One lookup since the record: with ``min_groups_before_repeat=2`` it waits for a second group, unless
    ``repeat_fraction`` is set and that one group sends at least that share of the budget (a lookup here is about
    45 tokens: 5% of a 400-token budget is 20, 90% is 360); then the record is due at once, and below the trigger
    too (the second budget puts the trigger above every prompt once the first record is in)."""

    # The record quotes another code than the lookups': a group the newest record quotes does not count (it was
    # shown it; tests/test_cached_prefix.py), and every lookup here returns XR-7.
    def record(request: Request) -> Turn:
        return recall_call("lookup: code=XR-1") if request.forced else say("unused")

    script: list[Step] = [lookup_call(), record, say("recorded"), lookup_call(), say("one group")]
    run = stack(script, budget=400, trigger_fraction=0.01, min_groups_before_repeat=2, repeat_fraction=repeat_fraction)
    for _ in range(2):
        await run.ask()
    assert [r.number for r in run.client.requests if r.forced] == [2]
    assert run.recall.record_due() is due
    assert recall_rule_due(run, trigger_tokens=10**6) is due


def recall_rule_due(run: Stack, *, trigger_tokens: int) -> bool:
    """Whether ``run``'s pin rule, with its trigger at ``trigger_tokens``, makes a record due on the last request
    its middleware saw."""
    rule = replace(run.recall.pin_rule, trigger_tokens=trigger_tokens)
    seen = run.recall.conversation.value.recall.seen
    assert seen is not None
    return pin_due(rule, seen)


async def test_the_default_waits_four_groups_before_a_repeat() -> None:
    script: list[Step] = [lookup_call(), obey(say("unused")), say("recorded")]
    script += [step for _ in range(4) for step in (lookup_call(), say("ok"))]
    run = stack(script)
    for _ in range(5):
        await run.ask()
    assert [r.number for r in run.client.requests if r.forced] == [2]
    assert run.recall.record_due()  # four groups since the record: the next request is pinned


async def test_max_groups_before_record_pins_below_the_trigger() -> None:
    script: list[Step] = [
        *[lookup_call(), say("a")],  # calls 1-2
        *[lookup_call(), say("b")],  # 3-4: two groups: call 4's exit pins
        *[obey(say("unused")), say("recorded")],  # 5-6
        *[lookup_call(), say("c")],  # 7-8
        *[lookup_call(), say("d")],  # 9-10: two groups since the record
        obey(say("unused")),  # 11
    ]
    run = stack(script, budget=HUGE, max_groups_before_record=2, repeat_records=False)
    for _ in range(6):
        await run.ask()
    assert [r.number for r in run.client.requests if r.forced] == [5, 11]

    by_size_only = stack(script, budget=HUGE)
    for _ in range(6):
        await by_size_only.ask()
    assert not any(r.forced for r in by_size_only.client.requests)


async def test_reforce_is_consumed_once_per_pin_and_only_peeked_by_record_due() -> None:
    strategy = RecordStrategy()
    run = stack(
        [say("a"), lookup_call(), obey(say("unused")), say("b"), say("c")], budget=HUGE, reforce=strategy.take_reforce
    )
    assert not run.recall.record_due()
    await run.ask()  # call 1's exit asks the strategy: nothing
    assert (strategy.taken, run.recall.record_due()) == (1, False)
    strategy.asks = 1
    assert not run.recall.record_due()  # a host's own callable is never called for a preview...
    assert (strategy.taken, strategy.asks) == (1, 1)  # ...so nothing is consumed
    await run.ask()  # call 2's exit takes the ask and pins call 3; call 4's exit asks again
    assert [r.number for r in run.client.requests if r.forced] == [3]
    assert (strategy.taken, strategy.asks) == (3, 0)
    assert (run.recall.forced_calls, run.recall.reforced_calls) == (1, 1)
    strategy.asks = 1
    await run.ask()  # call 5's exit takes it: the pin is decided, the ask is spent
    assert strategy.asks == 0
    assert run.recall.record_due()  # a decided pin is due even though nothing is pending


async def test_a_disabled_pin_still_takes_reforce_asks_and_never_pins() -> None:
    """Once pinning is disabled the re-force ask is still taken (its record is asked over the cached prefix by the
    pass inside the next request), and no request is pinned again."""
    strategy = RecordStrategy()
    run = stack([lookup_call(), fail("before"), say("retried"), say("x"), say("y")], reforce=strategy.take_reforce)
    await run.ask()  # the pinned request fails: pinning is disabled and the request retried once unpinned
    assert run.recall.pin_disabled
    assert [r.forced for r in run.client.requests] == [False, True, False]
    taken = strategy.taken
    strategy.asks = 1
    assert run.recall.record_due()  # the size record the retry's exit decided is still due, over the prefix
    assert (strategy.taken, strategy.asks) == (taken, 1)  # a preview consumes nothing
    await run.ask()
    assert (strategy.taken, strategy.asks) == (taken + 1, 0)  # the exit took the ask although pinning is disabled
    assert run.recall.record_due()  # the re-force record it decided is due on the next request
    await run.ask()
    assert [r.forced for r in run.client.requests] == [False, True, False, False, False]
    assert (run.recall.forced_calls, run.recall.reforced_calls) == (1, 0)


# --- rule 8: forget_pending ---------------------------------------------------------------------------


async def test_forget_pending_drops_queued_work_but_keeps_the_verdict() -> None:
    run = stack([lookup_call(), ignore(say("no")), say("pins again"), ignore(say("no")), say("x")])
    await run.ask()  # the forced call 2 is ignored: streak 1
    assert run.recall.awaiting_record
    await run.ask()  # call 3's exit pins
    assert not run.recall.awaiting_record
    assert run.recall.record_due()
    run.gate.arm()
    run.recall.forget_pending()
    assert not run.recall.record_due()
    assert not run.gate.armed
    other = run.agent.create_session()  # the session binding is gone too
    await run.agent.run("again", session=other)  # call 4: not forced; its exit pins
    assert not run.client.requests[3].forced
    await run.agent.run("again", session=other)  # call 5: forced, ignored: the streak reaches 2
    assert run.client.requests[4].forced
    assert run.recall.pin_disabled
    run.recall.forget_pending()
    assert run.recall.pin_disabled  # the verdict outlives queued work
