"""End to end: many sessions through one ``create_harness_agent``, wired as the README's "Serving many sessions".

The agent is built exactly as the README's shared-agent example builds it (the builder
``build_compaction``, ``SessionCompactionRegistry(build_compaction, max_cached_sessions=...)``,
``SessionCompactionProvider(registry, tokenizer=tokenizer, before=False)``, the session
middleware with ``compact_before=True``, ``disable_compaction=True``, and the provider moved
to position 1), plus ``disable_web_search=True`` because the simulated provider has no web
search. The bench's generated workload at fill 1.5 (seed 1, first ``TURNS`` turns, a chart
attached to one early note so that the user half has a media part to describe) is played
by the bench's scripted model behind the simulated provider, once per session.

The yardstick is a *private* stack: the same stack wired directly for one conversation
(``before_compaction_strategy``/``after_compaction_strategy``, its own recall middleware
and ``make_recall_tool(gate)``). Every session must send exactly the requests the private
stack sends (rendered as the provider receives them: instructions, tool declarations,
messages, tool choice and output cap), whatever runs between its turns:

- *interleaved*: several sessions through one agent at once (``asyncio.gather``; the model
  client yields between a request and its answer, so the sessions' model calls overlap),
  blocking with every stack cached, streaming with a cache of one stack;
- *replicas*: one session moved after every few turns to a new replica (new registry,
  agent, model, provider and clients, sharing nothing but the scenario; the previous
  replica is gone) through ``AgentSession.to_dict()`` and ``json.dumps``/``json.loads``,
  with ``max_cached_sessions=0``.

Both kinds of stack run (the composition and the record strategy alone), streaming and
not. The summarizer and ``describe_media`` are counted: no session and no replica asks
either for anything the private stack asked once. Each run is played once per test
session and cached (the runs are deterministic); the harness's file memory writes under
a temporary working directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import tempfile
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import pytest
from agent_framework import (
    AgentSession,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    Message,
    ResponseStream,
    create_harness_agent,
)

from maf_compaction import (
    CompactionStack,
    RecallGate,
    SessionCompactionProvider,
    SessionCompactionRegistry,
    SessionToolResultRecallMiddleware,
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
    ToolResultRecallMiddleware,
    UserTurnAnchoredSummarizationCompactionStrategy,
    make_recall_tool,
    make_session_recall_tool,
)
from maf_compaction.adapters.convert import EXCLUDED_KEY
from maf_compaction.bench.client import SimulatedChatClient, media_contents, scenario_tools
from maf_compaction.bench.model import ModelOptions, ScriptedModel
from maf_compaction.bench.provider import CallRecord, SimulatedProvider
from maf_compaction.bench.rendering import RenderedRequest, render_message
from maf_compaction.bench.runner import Settings, load_scenario, stored_messages
from maf_compaction.bench.scenario import Media, Scenario
from maf_compaction.bench.simulator import get_profile
from maf_compaction.core.envelope import VERSION
from maf_compaction.core.records import RECALL_TOOL_NAME
from offline_tokenizers import offline_tiktoken

Kind = Literal["composition", "records"]

SETTINGS: Final = Settings()  # a 32,000-token window, 2,048 output tokens
WINDOW: Final = SETTINGS.context_window
MAX_OUTPUT: Final = SETTINGS.max_output_tokens
#: Half the window: the composition records, summarizes and describes within the first turns.
BUDGET: Final = 16_000
TURNS: Final = 12
SEED: Final = 1
CHART: Final = Media("image/png", uri="https://example.invalid/charts/error-budget-week-14.png")
#: The note that carries the chart: in the band from the first compaction on.
CHART_TURN: Final = 3
SESSIONS: Final = 3
#: Turns a replica serves before the session moves to the next one.
REPLICA_TURNS: Final = 4
tokenizer = offline_tiktoken()


def _scenario() -> Scenario:
    base = load_scenario(SETTINGS, 1.5, SEED)
    turns = list(base.turns[:TURNS])
    turns[CHART_TURN] = dataclasses.replace(turns[CHART_TURN], media=(CHART,))
    return dataclasses.replace(base, turns=tuple(turns))


SCENARIO: Final = _scenario()

#: The session a model request belongs to (set per session task; asyncio copies it into the task).
LABEL: ContextVar[int] = ContextVar("session_label", default=-1)

Request = tuple[str, ...]


class ModelClient(SimulatedChatClient):
    """The bench's in-process client; keeps every request as the provider receives it, per session.

    It waits 10 ms between a request and its answer (as a network call does, longer than a
    compaction pass), so concurrent sessions' model calls overlap; ``most_in_flight`` shows that
    they did. (A bare ``sleep(0)`` let the other sessions run only until their next await, which
    could fall short of their model call: the overlap then depended on scheduling.)
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sent: dict[int, list[Request]] = {}
        self.in_flight = 0
        self.most_in_flight = 0

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        rendered = RenderedRequest.of(messages, options).entries
        cap = json.dumps([options.get("tool_choice"), options.get("max_tokens")], sort_keys=True, default=str)
        self.sent.setdefault(LABEL.get(), []).append((*rendered, cap))
        return super()._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)

    async def _respond(self, messages: Sequence[Message], options: Mapping[str, Any]) -> ChatResponse:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)
        finally:
            self.in_flight -= 1
        return await super()._respond(messages, options)


@dataclass
class Describer:
    """The host's ``describe_media`` hook: a fixed description, counted."""

    calls: int = 0

    async def __call__(self, content: Content, message: Message) -> str | None:
        self.calls += 1
        return f"A line chart ({content.media_type}) of the week's error budget, attached to a note."


@dataclass
class Replica:
    """One process's worth of objects: provider, model, clients, registry and agent."""

    provider: SimulatedProvider
    client: ModelClient
    describer: Describer
    registry: SessionCompactionRegistry | None
    agent: Any

    @property
    def calls(self) -> list[CallRecord]:
        return self.provider.calls

    @property
    def summarizer_calls(self) -> int:
        return sum(1 for c in self.calls if c.kind == "summarizer")


def _provider_and_model() -> tuple[SimulatedProvider, ScriptedModel]:
    provider = SimulatedProvider(
        encoder=tokenizer, window=WINDOW, profile=get_profile(SETTINGS.profile), cache=SETTINGS.cache
    )
    return provider, ScriptedModel(SCENARIO, ModelOptions(seed=SEED))


def builder(kind: Kind, summarizer_client: Any, describer: Describer) -> Callable[[], CompactionStack]:
    """The README's ``build_compaction`` (the composition), or its record strategy alone."""

    def build_compaction() -> CompactionStack:
        records = ToolResultAnchoredSummarizationCompactionStrategy(
            max_input_tokens=BUDGET,
            tokenizer=tokenizer,
        )
        users = UserTurnAnchoredSummarizationCompactionStrategy(
            max_input_tokens=BUDGET,
            tokenizer=tokenizer,
            client=summarizer_client,
            summary_mode="boundary",
            remembered_requests=2,
            describe_media=describer,
        )
        strategy = ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
            tokenizer=tokenizer,
            tool_results=records,
            user_turns=users,
        )
        gate = RecallGate()
        recall = ToolResultRecallMiddleware(
            max_input_tokens=BUDGET,
            tokenizer=tokenizer,
            arm=gate.arm,
            disarm=gate.disarm,
            trigger_fraction=records.trigger_fraction,
            reforce=records.take_reforce,
        )
        return CompactionStack(strategy, gate, recall)

    def build_records() -> CompactionStack:
        records = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=BUDGET, tokenizer=tokenizer)
        gate = RecallGate()
        recall = ToolResultRecallMiddleware(
            max_input_tokens=BUDGET,
            tokenizer=tokenizer,
            arm=gate.arm,
            disarm=gate.disarm,
            trigger_fraction=records.trigger_fraction,
            reforce=records.take_reforce,
        )
        return CompactionStack(records, gate, recall)

    return build_compaction if kind == "composition" else build_records


def shared_replica(kind: Kind, *, max_cached_sessions: int) -> Replica:
    """The README's shared agent, pasted (``disable_web_search=True`` added for the simulated provider)."""
    provider, model = _provider_and_model()
    client = ModelClient(model=model, provider=provider)
    summarizer_client = SimulatedChatClient(model=model, provider=provider, kind="summarizer")
    describer = Describer()
    build_compaction = builder(kind, summarizer_client, describer)
    lookup_tools = scenario_tools(SCENARIO)

    registry = SessionCompactionRegistry(build_compaction, max_cached_sessions=max_cached_sessions)
    compaction = SessionCompactionProvider(registry, tokenizer=tokenizer, before=False)
    agent = create_harness_agent(
        client,
        name="shared-assistant",
        tools=[*lookup_tools, make_session_recall_tool(registry)],
        middleware=[SessionToolResultRecallMiddleware(registry, compact_before=True)],
        disable_compaction=True,
        context_providers=[compaction],
        max_output_tokens=MAX_OUTPUT,
        tokenizer=tokenizer,
        disable_web_search=True,
    )
    # Match the harness's built-in placement immediately after its history provider.
    agent.context_providers.remove(compaction)
    agent.context_providers.insert(1, compaction)
    return Replica(provider, client, describer, registry, agent)


def private_replica(kind: Kind) -> Replica:
    """One conversation's stack wired directly: the yardstick."""
    provider, model = _provider_and_model()
    client = ModelClient(model=model, provider=provider)
    summarizer_client = SimulatedChatClient(model=model, provider=provider, kind="summarizer")
    describer = Describer()
    stack = builder(kind, summarizer_client, describer)()
    agent = create_harness_agent(
        client,
        name="shared-assistant",
        tools=[*scenario_tools(SCENARIO), make_recall_tool(stack.gate)],
        middleware=[stack.recall],
        max_context_window_tokens=WINDOW,
        max_output_tokens=MAX_OUTPUT,
        tokenizer=tokenizer,
        before_compaction_strategy=stack.strategy,
        after_compaction_strategy=stack.strategy,
        disable_web_search=True,
    )
    return Replica(provider, client, describer, None, agent)


def user_message(number: int) -> Message | str:
    turn = SCENARIO.turns[number]
    if not turn.media:
        return turn.user
    return Message("user", [Content.from_text(turn.user), *media_contents(turn.media)])


async def play_turns(agent: Any, session: AgentSession, turns: range, *, label: int, stream: bool) -> None:
    """Play ``turns`` of the scenario in ``session`` (requests are filed under ``label``)."""
    LABEL.set(label)
    for number in turns:
        if stream:
            updates = agent.run(user_message(number), session=session, stream=True)
            async for _ in updates:
                pass
            await updates.get_final_response()
        else:
            await agent.run(user_message(number), session=session)


@dataclass
class Played:
    """What the provider received, per session, and what was asked of the summarizer and describe_media."""

    sent: dict[int, list[Request]]
    summarizer_calls: int
    describe_calls: int
    calls: list[CallRecord]
    forced: int
    stored: dict[int, list[str]] = field(default_factory=dict[int, list[str]])
    entries: dict[int, Any] = field(default_factory=dict[int, Any])
    replicas: int = 1
    most_in_flight: int = 1
    stacks_built: int = 0
    extra: dict[str, Any] = field(default_factory=dict[str, Any])


def stored_history(session: AgentSession) -> list[str]:
    """The session's stored history as the provider would see each message, with its exclusion flag."""
    return [
        f"{'excluded' if m.additional_properties.get(EXCLUDED_KEY) else 'included'} {render_message(m)}"
        for m in stored_messages(session)
    ]


def _forced(sent: Mapping[int, list[Request]]) -> int:
    return sum(1 for requests in sent.values() for r in requests if RECALL_TOOL_NAME in r[-1])


async def _private(kind: Kind) -> Played:
    replica = private_replica(kind)
    session = replica.agent.create_session()
    await play_turns(replica.agent, session, range(TURNS), label=0, stream=False)
    sent = replica.client.sent
    return Played(
        sent,
        replica.summarizer_calls,
        replica.describer.calls,
        replica.calls,
        _forced(sent),
        stored={0: stored_history(session)},
    )


async def _interleaved(kind: Kind, stream: bool) -> Played:
    """``SESSIONS`` sessions at once through one shared agent."""
    replica = shared_replica(kind, max_cached_sessions=1 if stream else 128)
    agent = replica.agent
    sessions = [agent.create_session() for _ in range(SESSIONS)]
    await asyncio.gather(*(play_turns(agent, s, range(TURNS), label=i, stream=stream) for i, s in enumerate(sessions)))
    assert replica.registry is not None
    sent = replica.client.sent
    return Played(
        sent,
        replica.summarizer_calls,
        replica.describer.calls,
        replica.calls,
        _forced(sent),
        stored={i: stored_history(s) for i, s in enumerate(sessions)},
        entries={i: json.loads(json.dumps(s.state["maf_compaction"])) for i, s in enumerate(sessions)},
        most_in_flight=replica.client.most_in_flight,
        stacks_built=replica.registry.stacks_built,
        extra={"cached": replica.registry.cached_sessions},
    )


async def _replicas(kind: Kind, stream: bool) -> Played:
    """One session moved to a new replica every ``REPLICA_TURNS`` turns through its JSON."""
    saved: str | None = None
    stored: list[str] = []
    sent: list[Request] = []
    summarizer = describe = 0
    calls: list[CallRecord] = []
    replicas = 0
    asked: list[tuple[int, int]] = []  # per replica: summarizer and describe_media calls
    for start in range(0, TURNS, REPLICA_TURNS):
        replica = shared_replica(kind, max_cached_sessions=0)
        replicas += 1
        agent = replica.agent
        session = agent.create_session() if saved is None else AgentSession.from_dict(json.loads(saved))
        await play_turns(agent, session, range(start, min(start + REPLICA_TURNS, TURNS)), label=0, stream=stream)
        saved = json.dumps(session.to_dict())
        stored = stored_history(session)
        sent += replica.client.sent[0]
        summarizer += replica.summarizer_calls
        describe += replica.describer.calls
        asked.append((replica.summarizer_calls, replica.describer.calls))
        calls += replica.calls
        # The replica stops: nothing of it survives but the saved session.
        gone = weakref.ref(replica.registry)
        del replica, agent, session
        gc.collect()
        assert gone() is None, "the previous replica's registry is still alive"
    return Played(
        {0: sent},
        summarizer,
        describe,
        calls,
        _forced({0: sent}),
        stored={0: stored},
        replicas=replicas,
        extra={"asked": asked},
    )


_RUNS: dict[tuple[str, ...], Played] = {}


async def played(*key: Any) -> Played:
    """Play a run once per test session (the runs are deterministic)."""
    name = tuple(map(str, key))
    if name not in _RUNS:
        runner: Callable[..., Awaitable[Played]] = {"private": _private, "interleaved": _interleaved}.get(
            key[0], _replicas
        )
        with tempfile.TemporaryDirectory(prefix="maf-e2e-sessions-") as directory, contextlib.chdir(directory):
            _RUNS[name] = await runner(*key[1:])
    return _RUNS[name]


KINDS: Final[tuple[Kind, ...]] = ("composition", "records")
CELLS: Final = [(k, s) for k in KINDS for s in (False, True)]
IDS: Final = [f"{k}-{'stream' if s else 'blocking'}" for k, s in CELLS]
MATRIX = pytest.mark.parametrize(("kind", "stream"), CELLS, ids=IDS)


@pytest.mark.parametrize("kind", KINDS)
async def test_the_private_stack_does_the_work_the_sessions_are_judged_on(kind: Kind) -> None:
    """The yardstick is not trivial: records are forced, and the composition summarizes and describes media."""
    private = await played("private", kind)
    assert private.forced > 0, "no record was forced"
    if kind == "composition":
        assert private.summarizer_calls > 0, "the composition never asked the summarizer"
        assert private.describe_calls > 0, "the composition never described the chart"
    else:
        assert private.summarizer_calls == 0
        assert private.describe_calls == 0
    assert len(private.sent[0]) > TURNS


@MATRIX
async def test_each_interleaved_session_sends_exactly_what_a_private_stack_sends(kind: Kind, stream: bool) -> None:
    private = await played("private", kind)
    shared = await played("interleaved", kind, stream)
    assert shared.most_in_flight > 1, "the sessions never overlapped"
    assert sorted(shared.sent) == list(range(SESSIONS))
    for label in range(SESSIONS):
        mine, theirs = shared.sent[label], private.sent[0]
        first = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
        assert first is None, f"session {label} request {first} differs from the private stack's"
        assert len(mine) == len(theirs)


@MATRIX
async def test_interleaved_sessions_repeat_no_summarizer_or_describe_call(kind: Kind, stream: bool) -> None:
    private = await played("private", kind)
    shared = await played("interleaved", kind, stream)
    assert shared.summarizer_calls == SESSIONS * private.summarizer_calls
    assert shared.describe_calls == SESSIONS * private.describe_calls


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cache_of_one_stack_rebuilds_stacks_and_loses_nothing(kind: Kind) -> None:
    """The streaming interleaved run caches one stack for three sessions: stacks are evicted and rebuilt."""
    shared = await played("interleaved", kind, True)
    everything = await played("interleaved", kind, False)
    assert everything.stacks_built == SESSIONS
    assert shared.stacks_built > SESSIONS
    assert shared.extra["cached"] == 1
    assert shared.sent == everything.sent


@MATRIX
async def test_a_session_moved_between_replicas_continues_with_byte_identical_requests(
    kind: Kind, stream: bool
) -> None:
    private = await played("private", kind)
    moved = await played("replicas", kind, stream)
    assert moved.replicas == -(-TURNS // REPLICA_TURNS)
    mine, theirs = moved.sent[0], private.sent[0]
    first = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
    assert first is None, f"request {first} differs from the private stack's"
    assert len(mine) == len(theirs)


@MATRIX
async def test_a_session_moved_between_replicas_repeats_no_summarizer_or_describe_call(
    kind: Kind, stream: bool
) -> None:
    private = await played("private", kind)
    moved = await played("replicas", kind, stream)
    assert moved.summarizer_calls == private.summarizer_calls
    assert moved.describe_calls == private.describe_calls
    if kind == "composition":
        # A later replica compacts the history the earlier ones summarized: it could have asked again.
        asked: list[tuple[int, int]] = moved.extra["asked"]
        assert sum(s for s, _ in asked[:-1]) > 0, f"no summary before the last move: {asked}"
        assert sum(d for _, d in asked[:-1]) > 0, f"no description before the last move: {asked}"


@MATRIX
async def test_every_request_fits_the_window(kind: Kind, stream: bool) -> None:
    runs = [
        await played("private", kind),
        await played("interleaved", kind, stream),
        await played("replicas", kind, stream),
    ]
    over = [(c.kind, c.input_tokens) for run in runs for c in run.calls if c.over_window or c.input_tokens > WINDOW]
    assert not over, f"requests over the {WINDOW:,}-token window: {over}"


@MATRIX
async def test_the_provider_compacts_each_sessions_stored_history_as_the_private_stack_does(
    kind: Kind, stream: bool
) -> None:
    """``after_run`` compacts stored history: every session's (and the moved one's) equals the private stack's."""
    private = await played("private", kind)
    shared = await played("interleaved", kind, stream)
    moved = await played("replicas", kind, stream)
    expected = private.stored[0]
    assert any(line.startswith("excluded") for line in expected), "the private stack excluded nothing"
    for label in range(SESSIONS):
        assert shared.stored[label] == expected, f"session {label}'s stored history differs"
    assert moved.stored[0] == expected


@pytest.mark.parametrize("kind", KINDS)
async def test_the_session_entry_carries_the_readmes_state_and_bounds_remembered_answers(kind: Kind) -> None:
    """The snapshot carries record decisions, the recall flags and the gate; the composition adds the chain's wait,
    replacements and sheds and the user half's answers (at most ``remembered_requests``), descriptions and counts."""
    shared = await played("interleaved", kind, False)
    for label in range(SESSIONS):
        stored = shared.entries[label]
        assert stored["kind"] == "session_compaction"
        assert stored["version"] == VERSION
        assert set(stored) == {"kind", "version", "configuration", "strategy", "state"}, "one flat entry, one header"
        assert stored["strategy"] == kind
        state = stored["state"]
        assert isinstance(state["recall"]["armed"], bool)
        assert {"settled", "ask"} <= set(state["records"])
        assert {"next_pin", "awaiting_record", "route", "ignored_streak"} <= set(state["recall"])
        if kind == "composition":
            assert {"wait_since", "declined_behind", "shed"} <= set(state["chain"])
            assert {"answers", "compactions", "folds"} <= set(state)
            answers = [a for a in state["answers"] if a["kind"] in ("summary", "fold")]
            descriptions = [a for a in state["answers"] if a["kind"] == "media"]
            assert 0 < len(answers) <= 2, "remembered_requests=2 bounds the remembered answers"
            assert len(descriptions) == 1, "the chart's description"
            assert state["compactions"] > 0
        first = shared.entries[0]
        assert (stored["strategy"], state) == (first["strategy"], first["state"]), (
            "identical sessions must store identical state"
        )
