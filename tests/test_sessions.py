"""Serving many sessions, unit level: the stack, the registry, the session provider, middleware and tool.

Covers the seed README's "Serving many sessions" section and issue 13 items 1 to 3 with
real framework classes: a plain ``Agent`` over a chat client built from the framework's
own client layers (function invocation, chat middleware, telemetry over ``BaseChatClient``)
whose provider call is scripted, and a summarizer client that answers (or fails) without a
network. The agent is wired as the README wires a shared agent: one
:class:`SessionCompactionProvider`, one :class:`SessionToolResultRecallMiddleware` and one
recall tool from :func:`make_session_recall_tool`, all over one
:class:`SessionCompactionRegistry`. Budgets are tiny so that the record protocol and the
composition act from the first turns (``CharacterEstimatorTokenizer``: 4 characters a token).

What the framework hands each piece (the hook's ``session`` argument,
``ChatContext.session``, ``FunctionInvocationContext.session``) is the only way a session
is found; the tests call the pieces directly where that shows it best, and through
``agent.run`` otherwise. The end-to-end counterpart is ``test_e2e_sessions.py``.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import traceback
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import pytest
from agent_framework import (
    Agent,
    AgentSession,
    BaseChatClient,
    CharacterEstimatorTokenizer,
    ChatContext,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    FunctionInvocationContext,
    Message,
    ResponseStream,
    SessionContext,
    tool,
)
from agent_framework._middleware import ChatMiddlewareLayer
from agent_framework._tools import FunctionInvocationLayer
from agent_framework.observability import ChatTelemetryLayer
from hypothesis import given

from maf_compaction import (
    ChainDecisions,
    CompactionBudgetExceeded,
    CompactionStack,
    RecallGate,
    RecordDecisions,
    RecordRoute,
    SessionCompactionProvider,
    SessionCompactionRegistry,
    SessionToolResultRecallMiddleware,
    SnapshotError,
    SnapshotVersionError,
    StackKindError,
    State,
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
    ToolResultRecallMiddleware,
    make_session_recall_tool,
)
from maf_compaction.bench.model import content_text
from maf_compaction.bench.sessions import make_builder
from maf_compaction.core.composition import OverflowPolicy
from maf_compaction.core.envelope import READS, VERSION
from maf_compaction.core.records import RECALL_TOOL_NAME
from maf_compaction.core.state import RequestKind
from snapshot_values import chain_decisions, record_decisions

TOKENIZER = CharacterEstimatorTokenizer()
KEY = "maf_compaction"
PIN = {"mode": "required", "required_function_name": RECALL_TOOL_NAME}
TINY = 1  # every prompt is over the recall trigger: a record is due from the first tool result on
HUGE = 10**9  # no prompt is
#: The stored routes of a recall state that gave pinning up (``core.recall.pins_given_up``; was ``pin_disabled``).
PINS_GIVEN_UP = (RecordRoute.PINS_IGNORED.value, RecordRoute.NONE.value)
#: The stored kinds of the chain's answers (record replacements and emergency folds; were ``chain.replacements``).
CHAIN_KINDS = tuple(kind.value for kind in (RequestKind.MERGE, RequestKind.REWRITE, RequestKind.EMERGENCY_FOLD))
#: A composition budget at which the record half records, the chain asks the summarizer to merge records,
#: and a later turn's protected messages no longer fit (CompactionBudgetExceeded): see the tests that use it.
COMPOSITION_BUDGET = 400


# --- the scripted model and summarizer ------------------------------------------------------------


class Model(FunctionInvocationLayer, ChatMiddlewareLayer, ChatTelemetryLayer, BaseChatClient):
    """The framework's client layers over a scripted provider that follows one rule.

    A pinned request gets a recall call quoting the lookups; a request ending with a user
    message gets a ``lookup`` call; anything else gets a short answer. ``fail`` makes
    matching requests raise; ``hold`` makes every request wait for an event (``arrived``
    is set when one is waiting). Each request is kept as the provider received it.
    """

    OTEL_PROVIDER_NAME = "scripted"

    def __init__(
        self,
        *,
        fail: Callable[[Mapping[str, Any]], bool] | None = None,
        hold: asyncio.Event | None = None,
    ) -> None:
        super().__init__()
        self.requests: list[tuple[tuple[Message, ...], dict[str, Any]]] = []
        self.fail = fail
        self.hold = hold
        self.arrived = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        number = len(self.requests) + 1
        self.requests.append((tuple(messages), dict(options)))
        failing = self.fail is not None and self.fail(options)
        response = self._respond(number, messages, options, failing)
        if not stream:
            return response
        return ResponseStream(_updates(response), finalizer=ChatResponse.from_updates)

    async def _respond(
        self, number: int, messages: Sequence[Message], options: Mapping[str, Any], failing: bool
    ) -> ChatResponse:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.arrived.set()
            if self.hold is not None:
                await self.hold.wait()
            await asyncio.sleep(0)  # let other sessions' tasks run between a request and its answer
        finally:
            self.in_flight -= 1
        if failing:
            raise ProviderDown(f"request {number} failed")
        last = messages[-1]
        number = len(messages)  # ids that depend on the conversation only, not on other sessions' requests
        if options.get("tool_choice") == PIN:
            content = Content.from_function_call(
                f"c{number}", RECALL_TOOL_NAME, arguments={"values": _quoted(messages)}
            )
        elif last.role == "user":
            content = Content.from_function_call(f"c{number}", "lookup", arguments={"q": last.text[:40]})
        else:
            content = Content.from_text("done")
        return ChatResponse(messages=[Message("assistant", [content])], response_id=f"r{number}")


class ProviderDown(RuntimeError):
    """The scripted provider failed."""


async def _updates(response: Awaitable[ChatResponse]) -> AsyncIterator[ChatResponseUpdate]:
    answer = await response
    for message in answer.messages:
        yield ChatResponseUpdate(role="assistant", contents=list(message.contents), response_id=answer.response_id)


def _quoted(messages: Sequence[Message]) -> str:
    """A faithful record: every lookup result's value line."""
    lines = [
        str(c.result).split(" pad")[0]
        for m in messages
        for c in m.contents
        if c.type == "function_result" and "code=" in str(c.result)
    ]
    return "lookup: " + "; ".join(lines)


class Summarizer(BaseChatClient):
    """A summarizer that counts its calls and answers with the transcript's value lines (its opening words when it has
    none), or raises ``error``."""

    def __init__(self, error: BaseException | None = None) -> None:
        super().__init__()
        self.calls = 0
        self.error = error

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse]:
        self.calls += 1
        error = self.error
        words = messages[-1].text.split()
        # The value lines, or the opening words when the turns carry none (the coverage rule's "something of them").
        text = "Summary: " + " ".join([w for w in words if "code=" in w] or words[:8])

        async def answer() -> ChatResponse:
            if error is not None:
                raise error
            return ChatResponse(messages=[Message("assistant", [Content.from_text(text)])])

        return answer()


@tool(approval_mode="never_require")
def lookup(q: str) -> str:
    """Look up the code of an item."""
    return f"{q}: code=XR-{len(q)} " + "pad " * 40


# --- stacks, registries and agents -------------------------------------------------------------------


def records_stack(budget: int = TINY) -> CompactionStack:
    """The README's record-strategy stack."""
    return make_builder("records", budget, TOKENIZER, None)()


def composition_stack(
    summarizer: Any, budget: int = COMPOSITION_BUDGET, policy: OverflowPolicy = "shed"
) -> CompactionStack:
    """The README's composition stack (``build_compaction``)."""
    return make_builder("composition", budget, TOKENIZER, summarizer, overflow_policy=policy)()


def shared_agent(
    registry: SessionCompactionRegistry,
    client: Model | None = None,
    *,
    compact_before: bool = False,
    after: bool = True,
) -> Agent:
    """One agent for every session: the session provider, middleware and recall tool over ``registry``.

    With ``compact_before`` the middleware hands each model call the session's strategy and the
    provider's before phase is off (the README's harness wiring); otherwise the provider compacts
    the loaded context in ``before_run``. ``after`` compacts the stored history in ``after_run``.
    """
    return Agent(
        client or Model(),
        "Be terse.",
        tools=[lookup, make_session_recall_tool(registry)],
        middleware=[SessionToolResultRecallMiddleware(registry, compact_before=compact_before)],
        context_providers=[
            SessionCompactionProvider(registry, tokenizer=TOKENIZER, before=not compact_before, after=after)
        ],
    )


def question(number: int, session: int = 0) -> str:
    return f"question {number} of session {session}: " + "about the deployment " * 6


def entry(session: AgentSession, key: str = KEY) -> dict[str, Any]:
    """The session's stored entry, as JSON would carry it."""
    return json.loads(json.dumps(session.state[key]))


def fresh_state(build: Callable[[], CompactionStack]) -> dict[str, object]:
    return build().to_dict()


def stack_dict(stored: Mapping[str, Any]) -> dict[str, Any]:
    """The stack's dict (``CompactionStack.to_dict()``) a session entry carries: its fields under the stack's
    header (the entry holds them flat, under its own)."""
    return {"kind": "stack", "version": VERSION, "strategy": stored["strategy"], "state": stored["state"]}


async def converse(agent: Agent, session: AgentSession, turns: int, *, label: int = 0, stream: bool = False) -> None:
    for number in range(turns):
        if stream:
            run = agent.run(question(number, label), session=session, stream=True)
            async for _ in run:
                pass
            await run.get_final_response()
        else:
            await agent.run(question(number, label), session=session)


async def converse_until_full(agent: Agent, session: AgentSession, turns: int) -> bool:
    """Up to ``turns`` turns; True when the budget ran out first (``CompactionBudgetExceeded``)."""
    try:
        await converse(agent, session, turns)
    except CompactionBudgetExceeded:
        return True
    return False


def texts(requests: Sequence[tuple[tuple[Message, ...], dict[str, Any]]]) -> list[str]:
    """Requests as comparable text: every message's role and contents (less the framework's random content
    ids), and the tool choice."""
    return [
        json.dumps(
            [[m.role, [_without_id(c.to_dict()) for c in m.contents]] for m in messages]
            + [str(options.get("tool_choice"))],
            sort_keys=True,
            default=str,
        )
        for messages, options in requests
    ]


def _without_id(content: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in content.items() if k != "id"}


# --- parameters -------------------------------------------------------------------------------------


def _recall_for(records: ToolResultAnchoredSummarizationCompactionStrategy, gate: RecallGate) -> Any:
    return ToolResultRecallMiddleware(
        max_input_tokens=TINY,
        tokenizer=TOKENIZER,
        arm=gate.arm,
        disarm=gate.disarm,
        reforce=records.take_reforce,
    )


def test_compaction_stack_refuses_parts_of_the_wrong_type() -> None:
    good = records_stack()
    anchored = good.strategy
    with pytest.raises(ValueError, match="strategy must be a ToolResultAnchoredSummarizationCompactionStrategy"):
        CompactionStack(object(), good.gate, good.recall)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="gate must be a RecallGate"):
        CompactionStack(anchored, object(), good.recall)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="recall must be a ToolResultRecallMiddleware"):
        CompactionStack(anchored, good.gate, object())  # pyright: ignore[reportArgumentType]


def test_compaction_stack_refuses_a_recall_not_wired_to_its_record_half() -> None:
    records = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=TINY, tokenizer=TOKENIZER)
    gate = RecallGate()
    unwired = ToolResultRecallMiddleware(max_input_tokens=TINY, tokenizer=TOKENIZER, arm=gate.arm, disarm=gate.disarm)
    with pytest.raises(ValueError, match=r"recall must share the record strategy's state.*take_reforce"):
        CompactionStack(records, gate, unwired)
    other = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=TINY, tokenizer=TOKENIZER)
    with pytest.raises(ValueError, match="recall must share the record strategy's state"):
        CompactionStack(records, gate, _recall_for(other, gate))
    # The composition's record half is the one that counts, not some other record strategy.
    composed = composition_stack(Summarizer())
    with pytest.raises(ValueError, match="recall must share the record strategy's state"):
        CompactionStack(composed.strategy, gate, _recall_for(other, gate))
    # bind_recall is the other documented wiring.
    bound = ToolResultRecallMiddleware(max_input_tokens=TINY, tokenizer=TOKENIZER, arm=gate.arm, disarm=gate.disarm)
    records.bind_recall(bound)
    assert CompactionStack(records, gate, bound).kind == "records"


def test_compaction_stack_refuses_a_recall_that_arms_another_gate() -> None:
    records = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=TINY, tokenizer=TOKENIZER)
    with pytest.raises(ValueError, match=r"recall must arm this gate.*arm=gate.arm"):
        CompactionStack(records, RecallGate(), _recall_for(records, RecallGate()))


def test_a_stack_refuses_to_restore_another_kinds_state() -> None:
    summarizer = Summarizer()
    records, composed = records_stack(), composition_stack(summarizer)
    with pytest.raises(ValueError, match="state is a 'composition' stack's, this stack is a 'records' stack"):
        records.restore(composed.state())
    with pytest.raises(ValueError, match="state is a 'records' stack's, this stack is a 'composition' stack"):
        composed.restore(records.state())


def test_compaction_stack_names_its_kind_and_parts() -> None:
    summarizer = Summarizer()
    records, composed = records_stack(), composition_stack(summarizer)
    assert records.kind == "records"
    assert composed.kind == "composition"
    assert isinstance(composed.strategy, ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy)
    assert composed.tool_results is composed.strategy.tool_results
    assert composed.parts() == (
        composed.strategy,
        composed.strategy.tool_results,
        composed.strategy.user_turns,
        composed.gate,
        composed.recall,
    )
    assert records.parts() == (records.strategy, records.gate, records.recall)


async def _async_builder() -> CompactionStack:
    return records_stack()


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"builder": None}, "builder must be a callable returning a CompactionStack"),
        ({"builder": records_stack()}, "builder must be a callable returning a CompactionStack"),
        ({"builder": _async_builder}, "builder must be a callable returning a CompactionStack that is not async"),
        ({"max_cached_sessions": -1}, "max_cached_sessions must be an integer >= 0"),
        ({"max_cached_sessions": 1.5}, "max_cached_sessions must be an integer >= 0"),
        ({"max_cached_sessions": True}, "max_cached_sessions must be an integer >= 0"),
        ({"max_cached_sessions": "8"}, "max_cached_sessions must be an integer >= 0"),
        ({"state_key": ""}, "state_key must be a non-empty string"),
        ({"state_key": "   "}, "state_key must be a non-empty string"),
        ({"state_key": 7}, "state_key must be a non-empty string"),
        ({"state_key": None}, "state_key must be a non-empty string"),
    ],
)
def test_registry_parameters_are_checked(options: dict[str, Any], name: str) -> None:
    arguments: dict[str, Any] = {"builder": records_stack, **options}
    builder = arguments.pop("builder")
    with pytest.raises(ValueError, match=name):
        SessionCompactionRegistry(builder, **arguments)


def test_registry_defaults_follow_the_readme() -> None:
    registry = SessionCompactionRegistry(records_stack)
    assert registry.max_cached_sessions == 128
    assert registry.state_key == "maf_compaction"
    assert SessionCompactionRegistry(records_stack, max_cached_sessions=0).max_cached_sessions == 0


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"registry": object()}, "registry"),
        ({"registry": None}, "registry"),
        ({"tokenizer": object()}, "tokenizer"),
        ({"tokenizer": None}, "tokenizer"),
        ({"before": "yes"}, "before must be True or False"),
        ({"before": 1}, "before must be True or False"),
        ({"after": None}, "after must be True or False"),
        ({"after": "false"}, "after must be True or False"),
    ],
)
def test_provider_parameters_are_checked(options: dict[str, Any], name: str) -> None:
    arguments: dict[str, Any] = {
        "registry": SessionCompactionRegistry(records_stack),
        "tokenizer": TOKENIZER,
        **options,
    }
    registry = arguments.pop("registry")
    with pytest.raises(ValueError, match=name):
        SessionCompactionProvider(registry, **arguments)


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"registry": object()}, "registry"),
        ({"registry": records_stack()}, "registry"),
        ({"compact_before": "true"}, "compact_before must be True or False"),
        ({"compact_before": 0}, "compact_before must be True or False"),
    ],
)
def test_middleware_parameters_are_checked(options: dict[str, Any], name: str) -> None:
    arguments: dict[str, Any] = {"registry": SessionCompactionRegistry(records_stack), **options}
    registry = arguments.pop("registry")
    with pytest.raises(ValueError, match=name):
        SessionToolResultRecallMiddleware(registry, **arguments)


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"registry": None}, "registry"),
        ({"registry": RecallGate()}, "registry"),
        ({"target_tokens": 0}, "target_tokens must be an integer >= 1 or None"),
        ({"target_tokens": -5}, "target_tokens must be an integer >= 1 or None"),
        ({"target_tokens": 2.5}, "target_tokens must be an integer >= 1 or None"),
        ({"target_tokens": True}, "target_tokens must be an integer >= 1 or None"),
    ],
)
def test_recall_tool_parameters_are_checked(options: dict[str, Any], name: str) -> None:
    arguments: dict[str, Any] = {"registry": SessionCompactionRegistry(records_stack), **options}
    registry = arguments.pop("registry")
    with pytest.raises(ValueError, match=name):
        make_session_recall_tool(registry, **arguments)


def test_the_recall_tool_states_its_target_or_none() -> None:
    registry = SessionCompactionRegistry(records_stack)
    assert "2,000 tokens" in make_session_recall_tool(registry).description
    assert "1,234 tokens" in make_session_recall_tool(registry, target_tokens=1234).description
    assert "tokens in total" not in make_session_recall_tool(registry, target_tokens=None).description


def test_a_builder_that_returns_no_stack_is_refused_naming_the_builder() -> None:
    registry = SessionCompactionRegistry(lambda: records_stack().strategy)  # pyright: ignore[reportArgumentType, reportReturnType]
    session = AgentSession()
    with pytest.raises(TypeError, match="builder must return a CompactionStack"), registry.phase(session):
        pass
    assert KEY not in session.state


def test_a_builder_that_shares_instances_between_stacks_is_refused() -> None:
    one = records_stack()
    registry = SessionCompactionRegistry(lambda: one)
    with registry.phase(AgentSession()):
        pass
    with pytest.raises(ValueError, match="builder returned a stack that shares"), registry.phase(AgentSession()):
        pass

    gate = RecallGate()

    def shared_gate() -> CompactionStack:
        records = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=TINY, tokenizer=TOKENIZER)
        return CompactionStack(records, gate, _recall_for(records, gate))

    registry = SessionCompactionRegistry(shared_gate)
    with registry.phase(AgentSession()):
        pass
    with pytest.raises(ValueError, match="shares RecallGate"), registry.phase(AgentSession()):
        pass


def test_a_builder_that_changes_kind_is_refused() -> None:
    made: list[CompactionStack] = []

    def flipping() -> CompactionStack:
        stack = records_stack() if not made else composition_stack(Summarizer())
        made.append(stack)
        return stack

    registry = SessionCompactionRegistry(flipping)
    with registry.phase(AgentSession()):
        pass
    with (
        pytest.raises(ValueError, match=r"builder made a 'composition' stack after a 'records' one"),
        registry.phase(AgentSession()),
    ):
        pass


# --- state in the session ---------------------------------------------------------------------------


async def test_the_stacks_state_lives_in_the_session_json_safe_and_survives_the_framework_round_trip() -> None:
    registry = SessionCompactionRegistry(records_stack)
    agent = shared_agent(registry)
    session = agent.create_session()
    await converse(agent, session, 3)
    stored = session.state[KEY]
    assert json.loads(json.dumps(stored)) == stored
    assert stored["kind"] == "session_compaction"
    assert stored["version"] == VERSION
    assert set(stored) == {"kind", "version", "configuration", "strategy", "state"}, "one flat entry, one header"
    assert stored["configuration"] == registry.configuration.to_dict()
    assert stored["configuration"]["parameters"]["kind"] == "records"
    assert stored["strategy"] == "records"
    assert stack_dict(stored) != fresh_state(records_stack), "three turns over a tiny budget decided nothing"
    with registry.phase(session) as stack:
        assert stack.to_dict() == stack_dict(stored)
    restored = AgentSession.from_dict(json.loads(json.dumps(session.to_dict())))
    assert restored.state[KEY] == stored
    assert restored.session_id == session.session_id


async def test_every_phase_reads_the_session_even_when_its_stack_is_cached() -> None:
    registry = SessionCompactionRegistry(records_stack)
    agent = shared_agent(registry)
    session = agent.create_session()
    await converse(agent, session, 1)
    older = entry(session)
    await converse(agent, session, 2)
    newer = entry(session)
    assert stack_dict(newer) != stack_dict(older)
    built, restored = registry.stacks_built, registry.states_restored
    session.state[KEY] = older  # another replica, or the host, moved the session back
    with registry.phase(session) as stack:
        assert stack.to_dict() == stack_dict(older), "the cached stack did not follow the session"
    assert registry.stacks_built == built, "a cache hit must not rebuild the stack"
    assert registry.states_restored == restored + 1
    # The same through the gate alone: an armed permission written by one phase is withdrawn by the session.
    with registry.phase(session) as stack:
        stack.gate.arm()
    assert session.state[KEY]["state"]["recall"]["armed"] is True
    session.state[KEY] = older
    with registry.phase(session) as stack:
        assert not stack.gate.armed


async def test_a_session_that_holds_what_the_stack_wrote_is_not_read_again() -> None:
    registry = SessionCompactionRegistry(records_stack)
    session = AgentSession()
    with registry.phase(session) as stack:
        stack.gate.arm()
    restored = registry.states_restored
    with registry.phase(session) as stack:
        assert stack.gate.armed
    assert registry.states_restored == restored


async def test_removing_the_entry_resets_the_sessions_stack() -> None:
    registry = SessionCompactionRegistry(records_stack)
    agent = shared_agent(registry)
    session = agent.create_session()
    await converse(agent, session, 3)
    with registry.phase(session) as before:
        before.gate.arm()
    built = registry.stacks_built
    del session.state[KEY]
    with registry.phase(session) as after:
        assert after is not before
        assert after.to_dict() == fresh_state(records_stack)
    assert registry.stacks_built == built + 1
    assert stack_dict(session.state[KEY]) == fresh_state(records_stack)


@pytest.mark.parametrize("cache", [1, 0])
async def test_cache_eviction_loses_no_decision(cache: int) -> None:
    """Three sessions in turn through one agent: each sends what it sends with every stack cached."""

    async def play(max_cached: int) -> tuple[list[list[str]], SessionCompactionRegistry, list[AgentSession]]:
        registry = SessionCompactionRegistry(records_stack, max_cached_sessions=max_cached)
        client = Model()
        agent = shared_agent(registry, client)
        sessions = [agent.create_session() for _ in range(3)]
        sent: list[list[str]] = [[] for _ in sessions]
        for number in range(4):
            for index, session in enumerate(sessions):
                start = len(client.requests)
                await agent.run(question(number, index), session=session)
                sent[index] += texts(client.requests[start:])
                assert registry.cached_sessions <= max_cached
        return sent, registry, sessions

    cached, every, cached_sessions = await play(128)
    evicted, registry, sessions = await play(cache)
    assert every.stacks_built == 3
    assert registry.stacks_built > 3, "the test evicted nothing"
    assert evicted == cached
    assert any(json.loads(t)[-1] == str(PIN) for s in cached for t in s), "no record was forced"
    for mine, theirs in zip(sessions, cached_sessions, strict=True):
        assert stack_dict(entry(mine)) == stack_dict(entry(theirs))


async def test_forget_drops_only_the_cached_stack() -> None:
    registry = SessionCompactionRegistry(records_stack)
    session = AgentSession()
    with registry.phase(session) as stack:
        stack.gate.arm()
    assert registry.cached_sessions == 1
    registry.forget(session.session_id)
    registry.forget("no such session")
    assert registry.cached_sessions == 0
    with registry.phase(session) as again:
        assert again is not stack
        assert again.gate.armed
    assert registry.stacks_built == 2


def test_distinct_state_keys_let_two_registries_serve_one_session_side_by_side() -> None:
    summarizer = Summarizer()
    first = SessionCompactionRegistry(records_stack, state_key="first")
    second = SessionCompactionRegistry(lambda: composition_stack(summarizer), state_key="second")
    session = AgentSession()
    with first.phase(session) as stack:
        stack.gate.arm()
    with second.phase(session) as other:
        assert not other.gate.armed
    with first.phase(session) as stack:
        assert stack.gate.armed
    assert session.state["first"]["strategy"] == "records"
    assert session.state["second"]["strategy"] == "composition"
    assert session.state["first"]["configuration"] != session.state["second"]["configuration"]
    assert KEY not in session.state


def _dead_registry_entry(build: Callable[[], CompactionStack]) -> dict[str, Any]:
    """An entry written by a registry that no longer exists (another replica's)."""
    registry = SessionCompactionRegistry(build)
    session = AgentSession()
    with registry.phase(session) as stack:
        stack.gate.arm()
    data = entry(session)
    del registry, stack
    gc.collect()
    return data


def test_a_stack_kind_mismatch_raises_stack_kind_error_naming_both() -> None:
    stored = _dead_registry_entry(records_stack)
    registry = SessionCompactionRegistry(lambda: composition_stack(Summarizer()))
    session = AgentSession()
    session.state[KEY] = copy.deepcopy(stored)
    with (
        pytest.raises(StackKindError, match=r"'records' stack but the builder makes a 'composition'") as raised,
        registry.phase(session),
    ):
        pass
    assert (raised.value.stored, raised.value.built) == ("records", "composition")
    assert isinstance(raised.value, SnapshotError)
    assert session.state[KEY] == stored, "a refused phase wrote"
    with pytest.raises(StackKindError):
        composition_stack(Summarizer()).from_dict(stack_dict(stored))


def _assert_another_builds_version(raised: pytest.ExceptionInfo[SnapshotVersionError], version: int, kind: str) -> None:
    assert (raised.value.version, raised.value.kind) == (version, kind)
    assert raised.value.supported == READS
    assert "it reads versions 1 and 5" in str(raised.value)
    assert "a newer release: upgrade to read it" in str(raised.value)


def test_a_newer_version_raises_snapshot_version_error_naming_it() -> None:
    stored = _dead_registry_entry(records_stack)
    stored["version"] = 3
    registry = SessionCompactionRegistry(records_stack)
    session = AgentSession()
    session.state[KEY] = copy.deepcopy(stored)
    with (
        pytest.raises(SnapshotVersionError, match="'session_compaction' snapshot version 3 is not supported") as raised,
        registry.phase(session),
    ):
        pass
    _assert_another_builds_version(raised, 3, "session_compaction")
    assert session.state[KEY] == stored, "a refused phase wrote"


def test_a_newer_stack_dict_raises_snapshot_version_error_naming_it() -> None:
    data = stack_dict(_dead_registry_entry(records_stack))
    data["version"] = 9
    stack = records_stack()
    with pytest.raises(SnapshotVersionError, match="'stack' snapshot version 9 is not supported") as raised:
        stack.from_dict(data)
    _assert_another_builds_version(raised, 9, "stack")
    assert stack.to_dict() == fresh_state(records_stack), "a refused dict was read"


@pytest.mark.parametrize(
    ("path", "named"),
    [(("state",), "'state.version'"), (("state", "recall"), "'state.recall.version'")],
    ids=["state", "recall"],
)
def test_a_version_inside_the_entry_is_an_unknown_field(path: tuple[str, ...], named: str) -> None:
    """One version, at the top: a nested value carries none, so a version inside the entry is refused, never
    read past."""
    stored = _dead_registry_entry(records_stack)
    inner = stored
    for name in path:
        inner = inner[name]
    inner["version"] = 1
    registry = SessionCompactionRegistry(records_stack)
    session = AgentSession()
    session.state[KEY] = copy.deepcopy(stored)
    with pytest.raises(SnapshotError, match=f"unknown snapshot field.*{named}"), registry.phase(session):
        pass
    assert session.state[KEY] == stored, "a refused phase wrote"


def _routed_stack(record_request: Any) -> CompactionStack:
    """The README's record-strategy stack with the recall middleware's ``record_request``."""
    return make_builder("records", TINY, TOKENIZER, None, record_request=record_request)()


def test_the_request_shape_is_no_part_of_the_configuration() -> None:
    """How records are asked for (``record_request``) changes no decision: both shapes have the fingerprint an
    earlier release wrote, and a session stored under one continues under the other."""
    pinned, prefix = _routed_stack("pinned").configuration(), _routed_stack("cached_prefix").configuration()
    assert pinned == records_stack().configuration() == prefix
    assert not any("aligned" in name for name in pinned.parameters)
    stored = _dead_registry_entry(lambda: _routed_stack("pinned"))
    session = AgentSession()
    session.state[KEY] = copy.deepcopy(stored)
    with SessionCompactionRegistry(lambda: _routed_stack("cached_prefix")).phase(session):
        pass
    with SessionCompactionRegistry(records_stack).phase(session):
        pass


def _mutations() -> list[tuple[str, Callable[[dict[str, Any]], object], str]]:
    def drop(*path: str) -> Callable[[dict[str, Any]], object]:
        def apply(data: dict[str, Any]) -> object:
            inner = data
            for name in path[:-1]:
                inner = inner[name]
            del inner[path[-1]]
            return data

        return apply

    def put(value: object, *path: str) -> Callable[[dict[str, Any]], object]:
        def apply(data: dict[str, Any]) -> object:
            inner = data
            for name in path[:-1]:
                inner = inner[name]
            inner[path[-1]] = value
            return data

        return apply

    return [
        ("not-a-mapping", lambda data: ["not", "an", "entry"], "must be a mapping"),
        ("no-configuration", drop("configuration"), "'configuration' is missing"),
        ("no-digest", drop("configuration", "digest"), "'configuration.digest' is missing"),
        ("digest-not-text", put(7, "configuration", "digest"), "configuration.digest"),
        ("parameters-not-scalars", put({"kind": []}, "configuration", "parameters"), "configuration.parameters"),
        ("parameters-not-object", put([], "configuration", "parameters"), "configuration.parameters"),
        ("no-state", drop("state"), "'state' is missing"),
        ("state-not-object", put([], "state"), "state"),
        ("no-strategy", drop("strategy"), "'strategy' is missing"),
        ("unknown-field", put(1, "extra"), "'extra'"),
        ("unknown-strategy", put("anchored", "strategy"), "'strategy'"),
        ("gate-not-bool", put("yes", "state", "recall", "armed"), "armed"),
        ("no-gate", drop("state", "recall", "armed"), "'state.recall.armed' is missing"),
        ("no-recall", drop("state", "recall"), "'state.recall' is missing"),
        ("negative-count", put(-1, "state", "recall", "ignored_streak"), "ignored_streak"),
        ("wrong-kind", put("stack", "kind"), "expected a 'session_compaction' snapshot, got kind 'stack'"),
    ]


@pytest.mark.parametrize(
    ("case", "mutate", "named"),
    [pytest.param(*m, id=m[0]) for m in _mutations()],
)
def test_a_malformed_entry_raises_snapshot_error_naming_the_field(
    case: str, mutate: Callable[[dict[str, Any]], object], named: str
) -> None:
    corrupt = mutate(_dead_registry_entry(records_stack))
    registry = SessionCompactionRegistry(records_stack)
    session = AgentSession()
    session.state[KEY] = copy.deepcopy(corrupt)
    with pytest.raises(SnapshotError, match=named), registry.phase(session):
        pass
    assert session.state[KEY] == corrupt, f"{case}: a refused phase wrote"


def _nested(depth: int, leaf: object, wrap: Callable[[object], object]) -> object:
    value = leaf
    for _ in range(depth):
        value = wrap(value)
    return value


@pytest.mark.parametrize("where", ["entry", "configuration.parameters", "state.recall", "state"])
def test_an_entry_nested_a_hundred_thousand_deep_raises_snapshot_error_not_recursion_error(where: str) -> None:
    """A hostile or damaged entry, nested far past Python's recursion limit anywhere, is refused with the typed
    error naming the field; its description in the message is a few levels of it, never its whole repr."""
    deep = _nested(100_000, 0, lambda inner: [inner])
    if where == "entry":
        corrupt: object = deep
    else:
        corrupt = _dead_registry_entry(records_stack)
        *parents, leaf = where.split(".")
        holder: Any = corrupt
        for name in parents:
            holder = holder[name]
        holder[leaf] = {"kind": deep} if leaf == "parameters" else _nested(100_000, {}, lambda inner: {"a": inner})
    registry = SessionCompactionRegistry(records_stack)
    session = AgentSession()
    session.state[KEY] = corrupt
    with pytest.raises(SnapshotError) as refused, registry.phase(session):
        pass
    assert len(str(refused.value)) < 2_000
    assert session.state[KEY] is corrupt, "a refused phase replaced the entry"


async def test_stack_to_dict_and_from_dict_round_trip_a_conversations_state() -> None:
    summarizer = Summarizer()
    for build in (records_stack, lambda: composition_stack(summarizer)):
        registry = SessionCompactionRegistry(build)
        agent = shared_agent(registry)
        session = agent.create_session()
        await converse_until_full(agent, session, 6)
        with registry.phase(session) as stack:
            data = stack.to_dict()
            state = stack.state()
        assert data != fresh_state(build)
        copy_of = build()
        assert copy_of.from_dict(json.loads(json.dumps(data))) is copy_of
        assert copy_of.to_dict() == data
        assert copy_of.state() == state
    assert summarizer.calls > 0, "the composition never asked the summarizer"


@given(chain_decisions)
def test_chain_decisions_to_dict_round_trips(chain: ChainDecisions) -> None:
    data = chain.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert ChainDecisions.from_dict(json.loads(json.dumps(data))) == chain


@given(record_decisions())
def test_record_decisions_to_dict_round_trips(decisions: RecordDecisions) -> None:
    data = decisions.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert RecordDecisions.from_dict(json.loads(json.dumps(data))) == decisions


# --- written after every phase, exceptional exits included ----------------------------------------------


async def test_provider_middleware_and_tool_phases_each_write_the_session() -> None:
    registry = SessionCompactionRegistry(records_stack)
    client = Model()
    agent = shared_agent(registry, client)
    session = agent.create_session()
    provider = agent.context_providers[-1]
    assert isinstance(provider, SessionCompactionProvider)

    # Provider: after_run compacts the stored history and writes the session.
    await converse(agent, session, 2)
    del session.state[KEY]
    context = SessionContext(session_id=session.session_id, input_messages=[Message("user", ["hi"])])
    await provider.after_run(agent=agent, session=session, context=context, state={})
    assert session.state[KEY]["strategy"] == "records"

    # Middleware: one model call is one phase.
    del session.state[KEY]
    middleware = SessionToolResultRecallMiddleware(registry)
    chat = ChatContext(client, [Message("user", ["hi"])], {}, session=session)

    async def call_next() -> None:
        chat.result = ChatResponse(messages=[Message("assistant", ["ok"])])

    await middleware.process(chat, call_next)
    assert KEY in session.state

    # Tool: the recall call spends the session's gate, and the session says so.
    with registry.phase(session) as stack:
        stack.gate.arm()
    recall = make_session_recall_tool(registry)
    invocation = FunctionInvocationContext(recall, {"values": "lookup: code=XR-7"}, session=session)
    await recall.invoke(arguments={"values": "lookup: code=XR-7"}, context=invocation)
    assert session.state[KEY]["state"]["recall"]["armed"] is False


async def test_a_middleware_phase_that_raises_writes_what_it_decided() -> None:
    """A forced call fails and so does its unpinned retry: the run raises, and the session keeps the verdict
    (forcing is disabled after a forced call fails)."""
    registry = SessionCompactionRegistry(records_stack)
    client = Model()
    agent = shared_agent(registry, client)
    session = agent.create_session()
    with registry.phase(session):
        pass
    assert session.state[KEY]["state"]["recall"]["route"] not in PINS_GIVEN_UP
    # The first call looks something up; the next is forced (a record is due) and fails, and so does its retry.
    client.fail = lambda options: len(client.requests) > 1
    with pytest.raises(Exception, match="failed") as raised:
        await agent.run(question(0), session=session)
    assert any(isinstance(e, ProviderDown) for e in _chain(raised.value)), raised.value
    assert any(options.get("tool_choice") == PIN for _, options in client.requests), "no call was forced"
    assert session.state[KEY]["state"]["recall"]["route"] in PINS_GIVEN_UP, "the raising phase wrote nothing"
    client.fail = None
    with registry.phase(session) as stack:
        assert stack.to_dict() == stack_dict(session.state[KEY])


async def test_a_streamed_phase_writes_when_the_stream_is_consumed_even_when_it_fails() -> None:
    registry = SessionCompactionRegistry(records_stack)
    client = Model()
    agent = shared_agent(registry, client)
    session = agent.create_session()
    await converse(agent, session, 2, stream=True)
    with registry.phase(session) as stack:
        assert stack.to_dict() == stack_dict(session.state[KEY])
    client.fail = lambda options: True
    del session.state[KEY]
    run = agent.run(question(2), session=session, stream=True)
    with pytest.raises(Exception, match="failed"):
        async for _ in run:
            pass
    assert KEY in session.state, "the failed stream's phase wrote nothing"
    client.fail = None
    await converse(agent, session, 1, stream=True)  # the phase was closed: the session is free


async def _run_until_the_budget_runs_out(
    agent: Agent, session: AgentSession, summarizer: Summarizer
) -> tuple[int, int, list[str]]:
    """Turns until one raises CompactionBudgetExceeded: its number, the summarizer calls it made, where it raised."""
    for number in range(12):
        asked = summarizer.calls
        try:
            await agent.run(question(number), session=session)
        except CompactionBudgetExceeded as error:
            frames = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
            return number, summarizer.calls - asked, frames
    raise AssertionError("the budget never ran out")


@pytest.mark.parametrize(
    ("raising", "compact_before", "after"),
    [("process", True, False), ("after_run", False, True)],
    ids=["middleware-phase", "provider-after-phase"],
)
async def test_a_phase_that_raises_the_budget_error_still_writes_the_answers_it_got(
    raising: str, compact_before: bool, after: bool
) -> None:
    """Under overflow_policy="raise" a late turn no longer fits: the phase raises CompactionBudgetExceeded after
    asking the summarizer. The answers are in the session: another replica that retries the same turn raises the
    same error without asking the summarizer again."""
    summarizer = Summarizer()
    registry = SessionCompactionRegistry(lambda: composition_stack(summarizer, policy="raise"))
    agent = shared_agent(registry, compact_before=compact_before, after=after)
    session = agent.create_session()
    failed, asked, frames = await _run_until_the_budget_runs_out(agent, session, summarizer)
    assert raising in frames, f"the error came from elsewhere: {frames}"
    assert asked > 0, "the failing turn asked the summarizer nothing: nothing to remember"
    stored = entry(session)
    with registry.phase(session) as stack:
        assert stack.to_dict() == stack_dict(stored)

    # Another process picks the session up (its registry is not this one).
    moved = AgentSession.from_dict(json.loads(json.dumps(session.to_dict())))
    again = Summarizer()
    replica = SessionCompactionRegistry(lambda: composition_stack(again, policy="raise"))
    with pytest.raises(CompactionBudgetExceeded):
        await shared_agent(replica, compact_before=compact_before, after=after).run(question(failed), session=moved)
    assert again.calls == 0, "the replica asked the summarizer again for answers the failed phase got"


async def test_a_budget_error_on_a_forced_call_is_no_provider_verdict() -> None:
    """The session's own compaction raising CompactionBudgetExceeded on a forced call (compact_before=True) says
    nothing about the provider: forcing stays enabled for the session."""
    summarizer = Summarizer()
    registry = SessionCompactionRegistry(lambda: composition_stack(summarizer, policy="raise"))
    agent = shared_agent(registry, compact_before=True, after=False)
    session = agent.create_session()
    await _run_until_the_budget_runs_out(agent, session, summarizer)
    recall = entry(session)["state"]["recall"]
    assert recall["route"] not in PINS_GIVEN_UP, "a local budget error disabled forced recall for this session"


async def test_a_summarizer_that_raises_is_recorded_and_a_host_abort_still_writes() -> None:
    class HostAbort(BaseException):
        """Raised through every ``except Exception``: the phase ends exceptionally."""

    failing = Summarizer(error=ProviderDown("summarizer down"))
    registry = SessionCompactionRegistry(lambda: composition_stack(failing))
    agent = shared_agent(registry)
    session = agent.create_session()
    with pytest.raises(CompactionBudgetExceeded):
        await converse(agent, session, 12)
    assert failing.calls > 0
    failures = [a for a in entry(session)["state"]["answers"] if a["kind"] in CHAIN_KINDS and a["text"] is None]
    assert failures, "the summarizer's failure is not in the session"

    aborting = Summarizer(error=HostAbort())
    registry = SessionCompactionRegistry(lambda: composition_stack(aborting))
    agent = shared_agent(registry)
    session = agent.create_session()
    with pytest.raises(HostAbort):
        await converse(agent, session, 12)
    assert aborting.calls > 0
    assert KEY in session.state
    with registry.phase(session) as stack:  # the aborted phase closed: the session is free and consistent
        assert stack.to_dict() == stack_dict(session.state[KEY])


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


# --- scoping ------------------------------------------------------------------------------------------


async def test_a_missing_session_is_refused_by_the_provider_middleware_and_tool() -> None:
    registry = SessionCompactionRegistry(records_stack)
    client = Model()
    provider = SessionCompactionProvider(registry, tokenizer=TOKENIZER)
    context = SessionContext(input_messages=[Message("user", ["hi"])])
    for hook in (provider.before_run, provider.after_run):
        with pytest.raises(ValueError, match="needs the run's AgentSession"):
            await hook(agent=None, session=None, context=context, state={})

    called: list[bool] = []

    async def call_next() -> None:
        called.append(True)

    middleware = SessionToolResultRecallMiddleware(registry)
    with pytest.raises(ValueError, match="needs the run's AgentSession"):
        await middleware.process(ChatContext(client, [Message("user", ["hi"])], {}), call_next)
    assert not called

    recall = make_session_recall_tool(registry)
    with pytest.raises(ValueError, match="never taken from a tool argument"):
        await recall.invoke(
            arguments={"values": "x"}, context=FunctionInvocationContext(recall, {"values": "x"}, session=None)
        )
    assert registry.stacks_built == 0

    # An agent with no context provider hands the middleware no session: the run is refused.
    bare = Agent(client, "Be terse.", tools=[lookup], middleware=[middleware])
    with pytest.raises(Exception, match="needs the run's AgentSession"):
        await bare.run("hi")


def test_the_recall_tools_schema_has_no_session_parameter() -> None:
    recall = make_session_recall_tool(SessionCompactionRegistry(records_stack))
    schema = recall.parameters()
    assert recall.name == RECALL_TOOL_NAME
    assert set(schema["properties"]) == {"values"}
    assert schema.get("required") == ["values"]


async def test_the_tool_spends_the_gate_of_the_injected_session_only() -> None:
    registry = SessionCompactionRegistry(records_stack)
    mine, other = AgentSession(), AgentSession()
    for session in (mine, other):
        with registry.phase(session) as stack:
            stack.gate.arm()
    recall = make_session_recall_tool(registry)
    # The model cannot choose a session: an argument naming the other one changes nothing.
    arguments = {"values": "lookup: code=XR-7", "session": other.session_id, "session_id": other.session_id}
    invocation = FunctionInvocationContext(recall, arguments, session=mine)
    await recall.invoke(arguments=arguments, context=invocation)
    assert session_armed(mine) is False
    assert session_armed(other) is True


def session_armed(session: AgentSession) -> bool:
    return bool(session.state[KEY]["state"]["recall"]["armed"])


async def test_each_hook_works_on_the_session_it_is_handed() -> None:
    """Two sessions through one agent: each session's entry is its own stack's, and the stacks are distinct."""
    registry = SessionCompactionRegistry(records_stack)
    agent = shared_agent(registry)
    first, second = agent.create_session(), agent.create_session()
    await converse(agent, first, 3)
    await converse(agent, second, 1, label=1)
    assert stack_dict(entry(first)) != stack_dict(entry(second))
    with registry.phase(first) as one:
        assert one.to_dict() == stack_dict(entry(first))
    with registry.phase(second) as two:
        assert two.to_dict() == stack_dict(entry(second))
    assert one is not two
    lone = SessionCompactionRegistry(records_stack)
    solo = shared_agent(lone)
    alone = solo.create_session()
    await converse(solo, alone, 1, label=1)
    assert stack_dict(entry(alone)) == stack_dict(entry(second)), "the other session's turns leaked into this one"


async def test_overlapping_phases_of_one_session_in_two_tasks_are_rejected() -> None:
    registry = SessionCompactionRegistry(records_stack)
    session = AgentSession()
    inside, release = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        with registry.phase(session, "first"):
            inside.set()
            await release.wait()

    task = asyncio.create_task(holder())
    await inside.wait()

    async def intruder() -> None:
        with registry.phase(session, "second"):
            pass

    with pytest.raises(RuntimeError, match=r"second for session .* overlaps its first"):
        await asyncio.create_task(intruder())
    release.set()
    await task
    with registry.phase(session):  # free again
        pass


async def test_overlapping_runs_of_one_session_through_the_agent_are_rejected() -> None:
    registry = SessionCompactionRegistry(records_stack)
    hold = asyncio.Event()
    client = Model(hold=hold)
    agent = shared_agent(registry, client)
    session = agent.create_session()

    async def run_first() -> None:
        await agent.run(question(0), session=session)

    first = asyncio.create_task(run_first())
    await client.arrived.wait()  # the first run is inside its model call
    with pytest.raises(Exception, match="overlaps") as raised:
        await asyncio.wait_for(agent.run(question(1), session=session), timeout=10)  # waiting would be wrong too
    assert any(isinstance(e, RuntimeError) and "overlaps" in str(e) for e in _chain(raised.value))
    hold.set()
    await first
    await converse(agent, session, 1)


async def test_a_streamed_response_holds_its_session_until_it_is_consumed() -> None:
    registry = SessionCompactionRegistry(records_stack)
    agent = shared_agent(registry)
    session = agent.create_session()
    run = agent.run(question(0), session=session, stream=True)
    updates = aiter(run)
    await anext(updates)  # the first model call's answer is out; its stream is not finished
    with pytest.raises(Exception, match="overlaps") as raised:
        await asyncio.wait_for(agent.run(question(1), session=session), timeout=10)
    assert any(isinstance(e, RuntimeError) for e in _chain(raised.value))
    async for _ in updates:
        pass
    await run.get_final_response()
    await converse(agent, session, 1)  # consumed: the session is free
    with registry.phase(session) as stack:
        assert stack.to_dict() == stack_dict(session.state[KEY])


async def test_distinct_sessions_run_concurrently_with_their_own_decisions() -> None:
    """Four sessions through one agent with asyncio.gather send what each sends alone."""
    alone: list[list[str]] = []
    for index in range(4):
        client = Model()
        agent = shared_agent(SessionCompactionRegistry(records_stack), client)
        await converse(agent, agent.create_session(), 3, label=index)
        alone.append(texts(client.requests))

    registry = SessionCompactionRegistry(records_stack)
    client = Model()
    agent = shared_agent(registry, client)
    sessions = [agent.create_session() for _ in range(4)]
    await asyncio.gather(*(converse(agent, s, 3, label=i) for i, s in enumerate(sessions)))
    assert client.most_in_flight > 1, "the sessions did not overlap"
    together = texts(client.requests)
    for index, expected in enumerate(alone):
        mine = [t for t in together if f"of session {index}:" in t]
        assert mine == expected


async def test_phases_of_distinct_sessions_overlap_freely() -> None:
    registry = SessionCompactionRegistry(records_stack)
    sessions = [AgentSession() for _ in range(5)]
    everyone = asyncio.Barrier(len(sessions))

    async def phase(session: AgentSession) -> None:
        with registry.phase(session) as stack:
            await everyone.wait()  # every session is inside its phase at once
            stack.gate.arm()

    await asyncio.gather(*(phase(s) for s in sessions))
    assert all(session_armed(s) for s in sessions)
    assert registry.stacks_built == 5


def test_a_phase_left_by_an_exception_writes_the_session_and_frees_it() -> None:
    """The recall tool's phase is ``registry.phase``: what it changed is written even when it raises."""

    class Boom(Exception):
        pass

    registry = SessionCompactionRegistry(records_stack)
    session = AgentSession()
    seen: list[CompactionStack] = []

    def arm_and_fail() -> None:
        with registry.phase(session) as stack:
            seen.append(stack)
            stack.gate.arm()
            raise Boom

    with pytest.raises(Boom):
        arm_and_fail()
    assert session_armed(session)
    with registry.phase(session) as again:
        assert again is seen[0]


def test_a_nested_phase_of_the_same_session_shares_the_stack_and_the_outer_one_writes() -> None:
    registry = SessionCompactionRegistry(records_stack)
    session = AgentSession()
    with registry.phase(session, "outer") as outer:
        with registry.phase(session, "inner") as inner:
            assert inner is outer
            inner.gate.arm()
        assert KEY not in session.state, "the nested phase wrote"
    assert session_armed(session)


async def test_a_child_task_beside_its_parents_phase_overlaps_it() -> None:
    """A task spawned inside a phase inherits the context variable, but runs beside the phase: rejected."""
    registry = SessionCompactionRegistry(records_stack)
    session = AgentSession()

    async def child() -> None:
        with registry.phase(session, "child"):
            pass

    with (
        registry.phase(session, "parent"),
        pytest.raises(RuntimeError, match=r"child for session .* overlaps its parent"),
    ):
        await asyncio.create_task(child())
    await asyncio.create_task(child())  # once the parent's phase has ended the session is free


async def test_a_tool_phase_nested_in_a_middleware_phase_shares_its_stack() -> None:
    """A chat middleware inside ours that calls the recall tool: one phase, no overlap."""
    registry = SessionCompactionRegistry(records_stack)
    recall = make_session_recall_tool(registry)
    session = AgentSession()
    with registry.phase(session) as stack:
        stack.gate.arm()
    middleware = SessionToolResultRecallMiddleware(registry)
    chat = ChatContext(Model(), [Message("user", ["hi"])], {}, session=session)
    replies: list[Any] = []

    async def call_next() -> None:
        invocation = FunctionInvocationContext(recall, {"values": "v"}, session=session)
        replies.append(await recall.invoke(arguments={"values": "v"}, context=invocation))
        chat.result = ChatResponse(messages=[Message("assistant", ["ok"])])

    await middleware.process(chat, call_next)
    assert replies
    assert not session_armed(session)


async def test_each_phase_sets_a_scoped_context_variable_and_clears_it_on_exit() -> None:
    from maf_compaction.adapters import sessions

    registry = SessionCompactionRegistry(records_stack)
    session = AgentSession()
    middleware = SessionToolResultRecallMiddleware(registry)
    chat = ChatContext(Model(), [Message("user", ["hi"])], {}, session=session)
    seen: list[Any] = []

    async def call_next() -> None:
        current = sessions._CURRENT.get()  # pyright: ignore[reportPrivateUsage]
        seen.append(current.session if current is not None else None)
        chat.result = ChatResponse(messages=[Message("assistant", ["ok"])])

    assert sessions._CURRENT.get() is None  # pyright: ignore[reportPrivateUsage]
    await middleware.process(chat, call_next)
    assert seen == [session]
    assert sessions._CURRENT.get() is None  # pyright: ignore[reportPrivateUsage]
    with registry.phase(session):
        assert sessions._CURRENT.get() is not None  # pyright: ignore[reportPrivateUsage]
    assert sessions._CURRENT.get() is None  # pyright: ignore[reportPrivateUsage]


async def test_the_inner_middleware_keeps_its_single_session_guard() -> None:
    registry = SessionCompactionRegistry(records_stack)
    agent = shared_agent(registry)
    mine, other = agent.create_session(), agent.create_session()
    await converse(agent, mine, 1)
    with registry.phase(mine) as stack:
        chat = ChatContext(Model(), [Message("user", ["hi"])], {}, session=other)

        async def call_next() -> None:
            chat.result = ChatResponse(messages=[Message("assistant", ["ok"])])

        with pytest.raises(RuntimeError, match="serves one session"):
            await stack.recall.process(chat, call_next)


async def test_counters_are_local_and_restart_while_the_decisions_travel() -> None:
    registry = SessionCompactionRegistry(records_stack)
    agent = shared_agent(registry)
    session = agent.create_session()
    await converse(agent, session, 2)
    with registry.phase(session) as stack:
        assert stack.recall.forced_calls > 0
        assert stack.strategy.passes > 0
        decisions = stack.to_dict()
    registry.forget(session.session_id)
    with registry.phase(session) as rebuilt:
        assert rebuilt.recall.forced_calls == 0
        assert rebuilt.strategy.passes == 0
        assert rebuilt.to_dict() == decisions


async def test_the_stack_dict_holds_the_narrower_replay_snapshots() -> None:
    """State.to_dict(), ChainDecisions.to_dict() and RecordDecisions.to_dict() are the parts CompactionStack.to_dict()
    carries (nested, without their headers: one version, at the top)."""
    summarizer = Summarizer()
    registry = SessionCompactionRegistry(lambda: composition_stack(summarizer))
    agent = shared_agent(registry)
    session = agent.create_session()
    await converse_until_full(agent, session, 6)
    with registry.phase(session) as stack:
        strategy = stack.strategy
        assert isinstance(strategy, ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy)
        data = stack.to_dict()
        state = strategy.decision_state()
        records = stack.tool_results.decision_state()
    assert records == state, "the composition and its record half hold one conversation's one state"
    inner: Any = data["state"]
    assert inner == _fields(state.to_dict())
    assert inner["chain"] == _fields(state.chain.to_dict())
    assert inner["records"] == _fields(records.records.to_dict())
    assert State.from_dict({"kind": "state", "version": VERSION, **inner}) == state
    assert ChainDecisions.from_dict({"kind": "chain", "version": VERSION, **inner["chain"]}) == state.chain
    assert RecordDecisions.from_dict({"kind": "records", "version": VERSION, **inner["records"]}) == records.records


def _fields(stored: Mapping[str, object]) -> dict[str, object]:
    """A stored value's fields, without its header (how it is nested in another)."""
    return {k: v for k, v in stored.items() if k not in ("kind", "version")}


async def test_with_compact_before_off_the_providers_before_phase_compacts_the_loaded_context() -> None:
    """For a host that hands provider hooks the loaded context: the session's strategy compacts it in before_run."""
    registry = SessionCompactionRegistry(records_stack)
    agent = shared_agent(registry)
    session = agent.create_session()
    await converse(agent, session, 3)
    provider = next(p for p in agent.context_providers if isinstance(p, SessionCompactionProvider))
    with registry.phase(session) as stack:
        passes = stack.strategy.passes
    loaded = copy.deepcopy(list(session.state["in_memory"]["messages"]))
    context = SessionContext(
        session_id=session.session_id,
        input_messages=[Message("user", ["next"])],
        context_messages={"in_memory": loaded},
    )
    await provider.before_run(agent=agent, session=session, context=context, state={})
    with registry.phase(session) as stack:
        assert stack.strategy.passes == passes + 1
    off = SessionCompactionProvider(registry, tokenizer=TOKENIZER, before=False, after=False)
    await off.before_run(agent=agent, session=session, context=context, state={})
    await off.after_run(agent=agent, session=session, context=context, state={})
    with registry.phase(session) as stack:
        assert stack.strategy.passes == passes + 1, "a disabled phase compacted"


@tool(name="lookup", approval_mode="never_require")
def lookup_distinct(q: str) -> str:
    """Look up the code of an item (each question's code is its own)."""
    return f"{q}: code=XR-{zlib.crc32(q.encode()) % 100000} " + "pad " * 40


@pytest.mark.parametrize("policy", ["shed", "raise"])
async def test_a_replacement_the_hosts_list_loses_is_put_back_on_the_next_call(policy: OverflowPolicy) -> None:
    """The harness wiring (``compact_before=True``, no after phase): each model call's list is the session's stored
    messages, which keep the exclusion flags a pass wrote but not the messages it inserted (a record merge or
    rewrite, a user summary). The next call's pass puts the replacement back: every code a lookup returned reaches
    every later request, in the results or in what stands for them."""
    summarizer = Summarizer()
    registry = SessionCompactionRegistry(lambda: composition_stack(summarizer, policy=policy))
    client = Model()
    agent = Agent(
        client,
        "Be terse.",
        tools=[lookup_distinct, make_session_recall_tool(registry)],
        middleware=[SessionToolResultRecallMiddleware(registry, compact_before=True)],
        context_providers=[SessionCompactionProvider(registry, tokenizer=TOKENIZER, before=False, after=False)],
    )
    session = agent.create_session()
    ran_out = await converse_until_full(agent, session, 8)
    assert summarizer.calls > 0, "no replacement was made: the test shows nothing"
    returned: list[str] = []
    for number, (messages, _) in enumerate(client.requests):
        sent = " ".join(content_text(c) for m in messages for c in m.contents)
        lost = [code for code in returned if code not in sent]
        assert not lost, f"request {number + 1} (of {len(client.requests)}, ran out: {ran_out}) lost {lost}"
        results = (str(c.result) for m in messages for c in m.contents if c.type == "function_result")
        returned += [w for r in results for w in r.split() if w.startswith("code=") and w not in returned]
