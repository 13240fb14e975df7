"""Property: however phases of many sessions interleave, each session sends what a private stack sends.

Agents built by ``create_harness_agent`` with the README's session wiring
(``SessionCompactionRegistry`` + ``SessionCompactionProvider(before=False)`` moved right
after the history provider + ``SessionToolResultRecallMiddleware(compact_before=True)`` +
``make_session_recall_tool``) serve 2 to 4 conversations at once. Each conversation runs
in its own task; every model call and every summarizer call is a point where the task
stops (inside the session's open phase), and so is the start of each turn; hypothesis
draws what happens next: which session moves on, which replica evicts which session's
cached stack (``registry.forget``, on top of the LRU of a ``max_cached_sessions`` drawn
from 0 to 3), which session between turns is replaced by its JSON round trip
(``AgentSession.from_dict(json.loads(json.dumps(session.to_dict())))``), which replica
each turn is routed to (up to three replicas, each its own registry and agent, sharing
nothing but the builder's configuration; a session goes to another replica as its JSON,
and a replica that served it before may still cache its stack, now stale), and when a
replica restarts (its sessions finish their open turns and continue from their JSON on a
fresh registry and agent).

Each conversation must then send exactly what it sends alone, through a private stack
wired directly (``before_compaction_strategy``/``after_compaction_strategy``, the recall
middleware and ``make_recall_tool``): the same text in every model call, turn by turn,
with the same pin; the same summarizer requests, none of them twice; and the state in
its session at the end equals the private stack's state after as many turns.

The conversations are the bench's generated workload on an 8K window (fill 1.5, three
lookups): within its first 10 turns the composition asks for records, waits for a due
record across a turn boundary (the chain's wait) and summarizes user turns twice; the
record strategy carries a pending pin across a turn boundary, records, and sheds. Distinct
sessions play distinct conversations (two seeds) or the same one at another pace; the
bench's scripted model and tools answer each request from its own conversation (a
context variable of the session's task names it). Each private transcript is computed
once per (kind, conversation, streaming) and cached; a session plays a prefix of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import pytest
from agent_framework import (
    AgentSession,
    ChatResponse,
    ChatResponseUpdate,
    FunctionTool,
    Message,
    ResponseStream,
    create_harness_agent,
    tool,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from maf_compaction import (
    CompactionStack,
    SessionCompactionProvider,
    SessionCompactionRegistry,
    SessionToolResultRecallMiddleware,
    make_recall_tool,
    make_session_recall_tool,
)
from maf_compaction.bench.client import SimulatedChatClient
from maf_compaction.bench.model import ModelOptions, ScriptedModel, context_text, pinned_function
from maf_compaction.bench.provider import SimulatedProvider
from maf_compaction.bench.runner import Settings, load_scenario, run_turn
from maf_compaction.bench.scenario import LOOKUP_TOOL, RECALL_TOOL, Scenario
from maf_compaction.bench.sessions import make_builder
from maf_compaction.bench.simulator import get_profile
from maf_compaction.core.envelope import VERSION
from maf_compaction.core.stack import session_entry_from_dict
from maf_compaction.core.state import RequestKind
from offline_tokenizers import offline_tiktoken

Kind = Literal["records", "composition"]
KINDS: Final[tuple[Kind, ...]] = ("records", "composition")

SETTINGS: Final = Settings(context_window=8_192, max_output_tokens=1_024, tool_turns=3, markers_per_tool=4)
FILL: Final = 1.5
SEEDS: Final = (1, 2)
SCENARIOS: Final[Mapping[int, Scenario]] = {seed: load_scenario(SETTINGS, FILL, seed) for seed in SEEDS}
TOKENIZER: Final = offline_tiktoken()
#: The harness defaults (todo, mode and file memory on); the simulated provider has no web search.
HARNESS: Final[Mapping[str, Any]] = {"disable_web_search": True}
STATE_KEY: Final = "maf_compaction"
#: Turns a session plays at least: the first record, the first summary and the chain's wait come by then.
MIN_TURNS: Final = 6
#: Turns a session plays at most: the second summary and the record strategy's sheds come by then; the
#: closing probes after them add time, not decisions.
MAX_TURNS: Final = 10
#: Replica restarts per example at most, and replicas alive at once (each builds an agent).
MAX_RESTARTS: Final = 2
MAX_REPLICAS: Final = 3
#: The stored kinds of the user half's summarizer answers (the old ``users.answers``).
USER_SUMMARY_KINDS: Final = (RequestKind.SUMMARY.value, RequestKind.FOLD.value)

#: One model request: its text and the function its tool choice pins, if any.
Request = tuple[str, str | None]


@dataclass
class Lane:
    """One conversation's traffic, recorded as it arrives (the session task's context variable).

    Attributes:
        index: The session's number in its example.
        seed: Which conversation it plays.
        sent: Per turn, the model requests.
        summarized: Per turn, the summarizer requests' text.
    """

    index: int
    seed: int
    sent: list[list[Request]] = field(default_factory=list[list[Request]])
    summarized: list[list[str]] = field(default_factory=list[list[str]])

    def begin_turn(self) -> None:
        self.sent.append([])
        self.summarized.append([])


LANE: ContextVar[Lane | None] = ContextVar("test_sessions_lane", default=None)


def current_lane() -> Lane:
    lane = LANE.get()
    if lane is None:
        raise AssertionError("a request arrived outside any conversation's task")
    return lane


Pause = Callable[[str], Awaitable[None]]


class LaneClient(SimulatedChatClient):
    """The bench's in-process client: records each request in its conversation's lane and, when given
    ``pause``, stops before answering so another session can run."""

    def __init__(self, *, pause: Pause | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pause = pause
        self._responses = itertools.count(1)

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        lane = current_lane()
        if self.kind == "summarizer":
            lane.summarized[-1].append(context_text(messages))
        else:
            lane.sent[-1].append((context_text(messages), pinned_function(options.get("tool_choice"))))
        return super()._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)

    async def _respond(self, messages: Sequence[Message], options: Mapping[str, Any]) -> ChatResponse:
        """The scripted model's answer, unbilled.

        The simulated provider's billing renders every tool's JSON schema for each request
        (most of this file's time); this property is about what is sent, not what it costs.
        """
        if self.pause is not None:
            await self.pause(self.kind)
        validated = await self._validate_options(options)
        reply = self.model.respond(
            messages,
            tool_choice=validated.get("tool_choice"),
            max_tokens=validated.get("max_tokens"),
            summarizer=self.kind == "summarizer",
        )
        return ChatResponse(messages=[reply], response_id=f"resp_{next(self._responses)}", model="scripted")


class LaneModel(ScriptedModel):
    """The bench's scripted model, playing the conversation of the calling session."""

    def __init__(self) -> None:
        super().__init__(SCENARIOS[SEEDS[0]], ModelOptions(seed=1))
        self._models = {seed: ScriptedModel(scenario, ModelOptions(seed=1)) for seed, scenario in SCENARIOS.items()}

    def respond(
        self,
        messages: Sequence[Message],
        *,
        tool_choice: object = None,
        max_tokens: int | None = None,
        summarizer: bool = False,
    ) -> Message:
        model = self._models[current_lane().seed]
        return model.respond(messages, tool_choice=tool_choice, max_tokens=max_tokens, summarizer=summarizer)


#: The scripted result of each (conversation, lookup).
RESULTS: Final[Mapping[tuple[int, int], str]] = {
    (seed, int(call.arguments["lookup"])): call.result
    for seed, scenario in SCENARIOS.items()
    for turn in scenario.turns
    for call in turn.calls
}


def lookup_tool() -> FunctionTool:
    """The scenarios' lookup tool, answering from the calling session's conversation."""

    async def lookup_records(lookup: int) -> str:
        return RESULTS.get((current_lane().seed, lookup), f"No records for lookup {lookup}.")

    spec = SCENARIOS[SEEDS[0]].tools[0]
    return tool(lookup_records, name=LOOKUP_TOOL, description=spec.description, approval_mode="never_require")


def build_stack(kind: Kind, summarizer: Any) -> CompactionStack:
    """The builder's configuration: every replica and every private run builds its stacks this way."""
    return make_builder(kind, SETTINGS.budget, TOKENIZER, summarizer)()


def clients(pause: Pause | None) -> tuple[LaneClient, LaneClient]:
    """The agent's client and the summarizer's, over one scripted model.

    The client class requires a simulated provider; :meth:`LaneClient._respond` never bills it.
    """
    provider = SimulatedProvider(encoder=TOKENIZER, window=SETTINGS.context_window, profile=get_profile("default"))
    model = LaneModel()
    return (
        LaneClient(model=model, provider=provider, pause=pause),
        LaneClient(model=model, provider=provider, kind="summarizer", pause=pause),
    )


@contextlib.contextmanager
def scratch_directory() -> Iterator[None]:
    """The harness writes file memory under the working directory: a fresh one per run."""
    with tempfile.TemporaryDirectory() as directory, contextlib.chdir(directory):
        yield


# -- the private stack -------------------------------------------------------------------


@dataclass(frozen=True)
class Transcript:
    """A conversation played alone, per turn: model requests, summarizer requests, the stack's state after it."""

    sent: tuple[tuple[Request, ...], ...]
    summarized: tuple[tuple[str, ...], ...]
    states: tuple[Any, ...]


async def _play_alone(kind: Kind, seed: int, stream: bool) -> Transcript:
    client, summarizer = clients(None)
    stack = build_stack(kind, summarizer)
    agent = create_harness_agent(
        client,
        agent_instructions=SCENARIOS[seed].system,
        tools=[lookup_tool(), make_recall_tool(stack.gate)],
        middleware=[stack.recall],
        max_context_window_tokens=SETTINGS.context_window,
        max_output_tokens=SETTINGS.max_output_tokens,
        tokenizer=TOKENIZER,
        before_compaction_strategy=stack.strategy,
        after_compaction_strategy=stack.strategy,
        **HARNESS,
    )
    lane = Lane(0, seed)
    LANE.set(lane)
    session = agent.create_session()
    states: list[Any] = []
    for turn in SCENARIOS[seed].turns[:MAX_TURNS]:
        lane.begin_turn()
        await run_turn(agent, turn.user, session=session, stream=stream)
        states.append(json.loads(json.dumps(stack.to_dict())))
    return Transcript(
        tuple(tuple(requests) for requests in lane.sent),
        tuple(tuple(requests) for requests in lane.summarized),
        tuple(states),
    )


_PRIVATE: dict[tuple[Kind, int, bool], Transcript] = {}


def private(kind: Kind, seed: int, stream: bool) -> Transcript:
    """The conversation through a private stack (computed once per kind, conversation and streaming)."""
    key = (kind, seed, stream)
    if key not in _PRIVATE:
        with scratch_directory():
            _PRIVATE[key] = asyncio.run(_play_alone(kind, seed, stream))
    return _PRIVATE[key]


# -- many sessions on shared replicas ----------------------------------------------------


@dataclass
class Replica:
    """One serving process: a registry and the agent wired to it as the README shows."""

    registry: SessionCompactionRegistry
    agent: Any


def replica(kind: Kind, max_cached_sessions: int, pause: Pause) -> Replica:
    client, summarizer = clients(pause)
    registry = SessionCompactionRegistry(
        lambda: build_stack(kind, summarizer), max_cached_sessions=max_cached_sessions, state_key=STATE_KEY
    )
    compaction = SessionCompactionProvider(registry, tokenizer=TOKENIZER, before=False)
    agent = create_harness_agent(
        client,
        name="shared-assistant",
        agent_instructions=SCENARIOS[SEEDS[0]].system,
        tools=[lookup_tool(), make_session_recall_tool(registry)],
        middleware=[SessionToolResultRecallMiddleware(registry, compact_before=True)],
        disable_compaction=True,
        context_providers=[compaction],
        max_context_window_tokens=SETTINGS.context_window,
        max_output_tokens=SETTINGS.max_output_tokens,
        tokenizer=TOKENIZER,
        **HARNESS,
    )
    agent.context_providers.remove(compaction)
    agent.context_providers.insert(1, compaction)
    return Replica(registry, agent)


def round_trip(session: AgentSession) -> AgentSession:
    """The session as another process loads it from a store."""
    return AgentSession.from_dict(json.loads(json.dumps(session.to_dict())))


@dataclass(frozen=True)
class Conversation:
    """What one session plays: a conversation, how many of its turns, streamed or not."""

    seed: int
    turns: int
    stream: bool


class World:
    """The sessions, the live replicas and the scheduler that interleaves the sessions' tasks.

    A task stops at the start of each turn (between phases) and at each model or
    summarizer call (inside an open phase); when every unfinished task has stopped, the
    draw decides the next action: a session moves on (a new turn is routed to any live
    replica or a new one, up to ``MAX_REPLICAS``; to another replica, the session goes
    as its JSON); a replica forgets a session's stack; a session between turns is stored
    and loaded again on its replica; a replica restarts (its sessions finish their turns,
    then continue from their JSON on a fresh registry and agent with nothing cached).
    """

    def __init__(self, kind: Kind, max_cached_sessions: int, conversations: Sequence[Conversation]) -> None:
        self.kind: Kind = kind
        self.cache = max_cached_sessions
        self.conversations = conversations
        self.lanes = [Lane(i, c.seed) for i, c in enumerate(conversations)]
        self.waiting: dict[int, tuple[str, asyncio.Future[None]]] = {}
        self.replicas = [self.new_replica()]
        self.on = [0 for _ in conversations]
        self.sessions = [self.replicas[0].agent.create_session() for _ in conversations]
        self.restarts = 0
        self.actions: list[str] = []

    def new_replica(self) -> Replica:
        return replica(self.kind, self.cache, self.pause)

    async def pause(self, where: str) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[current_lane().index] = (where, future)
        await future

    async def converse(self, index: int) -> None:
        lane = self.lanes[index]
        LANE.set(lane)
        conversation = self.conversations[index]
        for turn in SCENARIOS[conversation.seed].turns[: conversation.turns]:
            await self.pause("turn")
            lane.begin_turn()
            agent = self.replicas[self.on[index]].agent
            await run_turn(agent, turn.user, session=self.sessions[index], stream=conversation.stream)

    async def settle(self, tasks: Sequence[asyncio.Task[None]]) -> list[int]:
        """Run until every unfinished task has stopped; the unfinished ones."""
        while True:
            for task in tasks:
                error = task.exception() if task.done() else None
                if error is not None:
                    raise error
            running = [i for i, task in enumerate(tasks) if not task.done()]
            if all(i in self.waiting for i in running):
                return running
            await asyncio.sleep(0)

    def step(self, index: int) -> None:
        where, future = self.waiting.pop(index)
        self.actions.append(f"{index}:{where}")
        future.set_result(None)

    def move(self, index: int, target: int) -> None:
        """Session ``index`` is stored, loaded again and continues on replica ``target`` (past the end: a new one)."""
        if target == len(self.replicas):
            self.replicas.append(self.new_replica())
        self.actions.append(f"{'restore' if target == self.on[index] else 'move'} {index} on {target}")
        self.sessions[index] = round_trip(self.sessions[index])
        self.on[index] = target

    def restart(self, target: int) -> None:
        """Replica ``target`` starts afresh; its sessions continue from their JSON."""
        self.actions.append(f"restart {target}")
        self.replicas[target] = self.new_replica()
        for index, on in enumerate(self.on):
            if on == target:
                self.sessions[index] = round_trip(self.sessions[index])
        self.restarts += 1

    async def run(self, data: st.DataObject) -> None:
        tasks = [asyncio.create_task(self.converse(i)) for i in range(len(self.conversations))]
        restarting: int | None = None
        try:
            while running := await self.settle(tasks):
                at_turn = [i for i in running if self.waiting[i][0] == "turn"]
                if restarting is not None:
                    inside = [i for i in running if i not in at_turn and self.on[i] == restarting]
                    if inside:  # the replica's open turns end first
                        self.step(data.draw(st.sampled_from(inside), label="drain"))
                        continue
                    self.restart(restarting)
                    restarting = None
                choices = ["step", "step", "step", "forget", "restore"]
                if self.restarts < MAX_RESTARTS:
                    choices.append("restart")
                action = data.draw(st.sampled_from(choices), label="action")
                if action == "step":
                    index = data.draw(st.sampled_from(running), label="session")
                    if index in at_turn:  # each turn is routed, as by a load balancer: any replica, or a new one
                        target = data.draw(st.integers(0, min(len(self.replicas), MAX_REPLICAS - 1)), label="route")
                        if target != self.on[index]:
                            self.move(index, target)
                    self.step(index)
                elif action == "forget":
                    index = data.draw(st.integers(0, len(self.sessions) - 1), label="session")
                    target = data.draw(st.integers(0, len(self.replicas) - 1), label="replica")
                    self.actions.append(f"forget {index} on {target}")
                    self.replicas[target].registry.forget(self.sessions[index].session_id)
                elif action == "restore" and at_turn:
                    index = data.draw(st.sampled_from(at_turn), label="session")
                    self.move(index, self.on[index])
                elif action == "restart":
                    restarting = data.draw(st.integers(0, len(self.replicas) - 1), label="replica")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def stored_state(session: AgentSession) -> object:
    """The stack dict a session carries (its fields, under the stack's header as ``CompactionStack.to_dict()``)."""
    _, fields = session_entry_from_dict(session.state[STATE_KEY])
    return json.loads(json.dumps({"kind": "stack", "version": VERSION, **fields}))


conversations = st.lists(
    st.builds(
        Conversation,
        seed=st.sampled_from(SEEDS),
        turns=st.integers(MIN_TURNS, MAX_TURNS),
        stream=st.booleans(),
    ),
    min_size=2,
    max_size=4,
)


#: An example plays 12 to 40 turns through the whole harness (about 0.1 s each): a tenth of the
#: profile's examples (at least 8) per kind keeps this file near 30 s of CPU under the default
#: profile (40 -> 8); ``make test-long`` plays 100 per kind.
EXAMPLES: Final = max(8, settings().max_examples // 10)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=EXAMPLES)
@given(data=st.data(), plays=conversations, cache=st.integers(0, 3))
def test_any_interleaving_gives_each_session_its_private_requests(
    kind: Kind, data: st.DataObject, plays: list[Conversation], cache: int
) -> None:
    """Each session's model and summarizer requests, turn by turn, and its final state are its private stack's."""
    expected = [private(kind, c.seed, c.stream) for c in plays]
    with scratch_directory():
        world = World(kind, cache, plays)
        asyncio.run(world.run(data))
    for index, (play, lane, alone) in enumerate(zip(plays, world.lanes, expected, strict=True)):
        where = f"session {index} ({play}; actions {world.actions})"
        for turn in range(play.turns):
            assert lane.sent[turn] == list(alone.sent[turn]), f"{where}: model requests of turn {turn} differ"
            assert lane.summarized[turn] == list(alone.summarized[turn]), f"{where}: summarizer requests of turn {turn}"
        flat = [text for turn in lane.summarized for text in turn]
        assert len(flat) == len(set(flat)), f"{where}: a summarizer request was sent twice"
        assert stored_state(world.sessions[index]) == alone.states[play.turns - 1], f"{where}: final state differs"


@pytest.mark.parametrize("kind", KINDS)
def test_each_conversation_reaches_records_summaries_and_waits_within_its_shortest_play(kind: Kind) -> None:
    """The property is as strong as what the conversations reach: within ``MIN_TURNS`` turns a record
    is forced and made, a decision is pending across a turn boundary (the recall pin; for the
    composition also the chain's wait for a due record) and the composition asks for a summary; the
    record strategy alone sheds later in the conversation."""
    for seed in SEEDS:
        alone = private(kind, seed, stream=False)
        states = [entry["state"] for entry in alone.states[:MIN_TURNS]]
        assert any(pin == RECALL_TOOL for turn in alone.sent[:MIN_TURNS] for _, pin in turn)
        assert states[-1]["recall"]["seen"]["records"] >= 1
        assert any(state["recall"]["next_pin"] is not None for state in states)
        if kind == "composition":
            assert any(alone.summarized[:MIN_TURNS])
            assert any(state["chain"]["wait_since"] is not None for state in states)
            summaries = [a for a in alone.states[-1]["state"]["answers"] if a["kind"] in USER_SUMMARY_KINDS]
            assert len(summaries) >= 2
        else:
            assert alone.states[-1]["state"]["fallback"]["tools_shed"] > 0
