"""A replica process for the multi-process session test: the README's shared agent, sessions leased from Redis.

``python tests/replica_worker.py URL NAME`` builds the README's session wiring (a ``SessionCompactionRegistry`` of
composition stacks, ``SessionCompactionProvider``, ``SessionToolResultRecallMiddleware(compact_before=True)``,
``make_session_recall_tool``) under ``create_harness_agent``, over the bench's scripted model behind an in-process
client, and serves turns from the shared Redis list ``WORK`` (items ``SESSION TURN``) as a load balancer would:
whichever replica pops an item first serves it, several at a time.

Each turn runs inside ``leased_session`` (``RedisSessionLeases`` + ``RedisSessionStore``; ``create=False`` after a
session's first turn): lease, load, one agent turn, save, release. The replica journals ``enter NAME TOKEN TURN`` /
``exit NAME TOKEN TURN`` to ``JOURNAL:S`` around the turn, and pushes the session's next turn to ``WORK`` *before*
the session is saved and the lease released: the next turn may start on the other replica at once and must wait for
the lease, or it would load the session without this turn and send other requests than a private stack.

The session counts its served turns (``session.state[TURN_KEY]``). A turn that loads a session that has not reached
it yet (the previous turn's save was refused) goes back to ``WORK``; one the session is already past (a duplicate)
is dropped. A turn whose save is refused (``StaleLeaseError``: its lease was lost to a store reset) is reported to
``REFUSED`` (``SESSION TURN TOKEN``), its requests and summarizer calls are struck from the journal (its session
never got them), and it goes back to ``WORK`` to be served again.

Every model request and summarizer call is attributed to its session and turn (a context variable set by the task
that serves the turn) and reported as a SHA-256 of the request's text: ``RESULT:NAME`` holds the JSON
``{"requests": {S: {TURN: [digest, ...]}}, "summarizer": {S: count}}`` when the replica stops.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, Final

import redis.asyncio as aioredis
from agent_framework import ChatResponse, ChatResponseUpdate, Message, ResponseStream, create_harness_agent

from maf_compaction import (
    CompactionStack,
    SessionCompactionRegistry,
    SessionLease,
    StaleLeaseError,
    leased_session,
    make_recall_tool,
)
from maf_compaction.bench.client import SimulatedChatClient, scenario_tools
from maf_compaction.bench.model import ModelOptions, ScriptedModel, context_text
from maf_compaction.bench.provider import SimulatedProvider
from maf_compaction.bench.runner import Settings, load_scenario
from maf_compaction.bench.scenario import Scenario
from maf_compaction.bench.sessions import make_builder, shared_agent
from maf_compaction.bench.simulator import get_profile
from maf_compaction.redis import RedisSessionLeases, RedisSessionStore
from offline_tokenizers import offline_tiktoken

WORK: Final = "test:work"
DONE: Final = "test:done"
JOURNAL: Final = "test:journal"
RESULT: Final = "test:result"
ERRORS: Final = "test:errors"
REFUSED: Final = "test:refused"
STOP: Final = "stop"
#: Where a session counts the turns served into it.
TURN_KEY: Final = "test_turns"
SETTINGS: Final = Settings()  # a 32,000-token window
#: Turns per session: past the first records and the first two user-turn summaries at fill 3.0.
TURNS: Final = 15
BUDGET: Final = 26_000
#: Turns one replica serves at a time.
CONCURRENCY: Final = 4
TOKENIZER: Final = offline_tiktoken()
HARNESS: Final[Mapping[str, Any]] = {"disable_web_search": True}

#: ``(session id, turn)`` of the turn the current task serves.
CURRENT: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar("replica_turn", default=None)
#: The fencing token of the lease the current task holds (read from the lease, not from the store, which a reset
#: may have emptied meanwhile).
HELD: contextvars.ContextVar[int] = contextvars.ContextVar("replica_token", default=0)


class JournaledLeases:
    """``RedisSessionLeases`` that tell the task the token of the lease it holds."""

    def __init__(self, inner: RedisSessionLeases) -> None:
        self.inner = inner

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[SessionLease]:
        async with self.inner.hold(session_id) as lease:
            HELD.set(lease.token)
            yield lease


def scenario() -> Scenario:
    """The bench's fill-3.0 conversation (seed 1), cut to :data:`TURNS` turns."""
    full = load_scenario(SETTINGS, 3.0, 1)
    return replace(full, turns=full.turns[:TURNS])


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Journal:
    """Request digests and summarizer calls per (session, turn), from the task that serves the turn."""

    def __init__(self) -> None:
        self.requests: dict[str, dict[int, list[str]]] = {}
        self.summarizer: dict[str, int] = {}
        self._attempt: dict[tuple[str, int], int] = {}

    def request(self, text: str) -> None:
        session, turn = self._current()
        self.requests.setdefault(session, {}).setdefault(turn, []).append(digest(text))

    def summarized(self) -> None:
        session, turn = self._current()
        self.summarizer[session] = self.summarizer.get(session, 0) + 1
        self._attempt[session, turn] = self._attempt.get((session, turn), 0) + 1

    def strike(self, session: str, turn: int) -> None:
        """Forget an attempt whose save was refused: its session never got its requests' answers."""
        self.requests.get(session, {}).pop(turn, None)
        self.summarizer[session] = self.summarizer.get(session, 0) - self._attempt.pop((session, turn), 0)

    @staticmethod
    def _current() -> tuple[str, int]:
        current = CURRENT.get()
        if current is None:
            raise RuntimeError("a model call outside a served turn")
        return current


class ModelClient(SimulatedChatClient):
    """The bench's in-process client, journaling every request it receives."""

    def __init__(self, journal: Journal, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.journal = journal

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        if self.kind == "summarizer":
            self.journal.summarized()
        else:
            self.journal.request(context_text(messages))
        return super()._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)


def clients(journal: Journal, conversation: Scenario) -> tuple[ModelClient, ModelClient]:
    """The model client and the summarizer client (the scripted model behind a provider nobody bills)."""
    provider = SimulatedProvider(
        encoder=TOKENIZER, window=SETTINGS.context_window, profile=get_profile(SETTINGS.profile)
    )
    model = ScriptedModel(conversation, ModelOptions(seed=1))
    return (
        ModelClient(journal, model=model, provider=provider),
        ModelClient(journal, model=model, provider=provider, kind="summarizer"),
    )


def build_compaction(summarizer_client: Any) -> CompactionStack:
    """The README's builder: a composition stack with fresh parts on every call."""
    return make_builder("composition", BUDGET, TOKENIZER, summarizer_client)()


def replica_agent(client: Any, summarizer: Any, conversation: Scenario) -> Any:
    """The README's shared agent over a registry of :func:`build_compaction` stacks."""
    registry = SessionCompactionRegistry(lambda: build_compaction(summarizer), max_cached_sessions=128)
    return shared_agent(
        client, registry, conversation, tokenizer=TOKENIZER, max_output_tokens=SETTINGS.max_output_tokens
    )


async def private_baseline() -> tuple[dict[int, list[str]], int]:
    """What one conversation sends with the README's single-session wiring: digests per turn, summarizer calls."""
    journal = Journal()
    conversation = scenario()
    client, summarizer = clients(journal, conversation)
    stack = build_compaction(summarizer)
    agent = create_harness_agent(
        client,
        agent_instructions=conversation.system,
        tools=[*scenario_tools(conversation), make_recall_tool(stack.gate)],
        middleware=[stack.recall],
        max_context_window_tokens=SETTINGS.context_window,
        max_output_tokens=SETTINGS.max_output_tokens,
        tokenizer=TOKENIZER,
        before_compaction_strategy=stack.strategy,
        after_compaction_strategy=stack.strategy,
        **HARNESS,
    )
    session = agent.create_session()
    for number, turn in enumerate(conversation.turns):
        token = CURRENT.set(("private", number))
        try:
            await agent.run(turn.user, session=session)
        finally:
            CURRENT.reset(token)
    return journal.requests.get("private", {}), journal.summarizer.get("private", 0)


async def serve(url: str, name: str) -> None:
    """Serve turns from :data:`WORK` until a :data:`STOP` item arrives; then publish the journal."""
    redis = aioredis.Redis.from_url(url)
    journal = Journal()
    conversation = scenario()
    client, summarizer = clients(journal, conversation)
    agent = replica_agent(client, summarizer, conversation)
    leases = JournaledLeases(RedisSessionLeases(redis, ttl_ms=10_000, wait_timeout_s=60.0, poll_interval_ms=2))
    store = RedisSessionStore(redis)

    async def turn(session_id: str, number: int) -> None:
        CURRENT.set((session_id, number))  # this task's own context
        token = 0
        try:
            async with leased_session(session_id, leases=leases, store=store, create=number == 0) as session:
                reached = int(session.state.get(TURN_KEY, 0))
                if reached != number:
                    raise NotYet(reached > number)
                token = HELD.get()
                await redis.rpush(f"{JOURNAL}:{session_id}", f"enter {name} {token} {number}")
                await agent.run(conversation.turns[number].user, session=session)
                session.state[TURN_KEY] = number + 1
                if number + 1 < TURNS:  # handed on before the save: the other replica must wait for the lease
                    await redis.rpush(WORK, f"{session_id} {number + 1}")
                await redis.rpush(f"{JOURNAL}:{session_id}", f"exit {name} {token} {number}")
        except NotYet as early:
            if not early.args[0]:  # not reached yet: serve it later; already past it: a duplicate, dropped
                await asyncio.sleep(0.01)
                await redis.rpush(WORK, f"{session_id} {number}")
            return
        except StaleLeaseError:
            journal.strike(session_id, number)
            await redis.rpush(REFUSED, f"{session_id} {number} {token}")
            await redis.rpush(WORK, f"{session_id} {number}")
            return
        await redis.incr(DONE)

    slots = asyncio.Semaphore(CONCURRENCY)
    running: set[asyncio.Task[None]] = set()
    try:
        while True:
            await slots.acquire()
            popped = await redis.blpop([WORK], timeout=120)
            if popped is None:
                raise TimeoutError("no work for 120 s")
            value: bytes | str = popped[1]
            item = value.decode() if isinstance(value, bytes) else value
            if item == STOP:
                slots.release()
                break
            session_id, number = item.split()

            async def run(session_id: str = session_id, number: int = int(number)) -> None:
                try:
                    await turn(session_id, number)
                except Exception as error:
                    await redis.rpush(ERRORS, f"{name} {session_id} turn {number}: {error!r}")
                    raise
                finally:
                    slots.release()

            task = asyncio.create_task(run())
            running.add(task)
            task.add_done_callback(running.discard)
        await asyncio.gather(*running)
        await redis.set(
            f"{RESULT}:{name}", json.dumps({"requests": journal.requests, "summarizer": journal.summarizer})
        )
    finally:
        await redis.aclose()


class NotYet(Exception):
    """The session is not at this turn (``args[0]``: it is already past it)."""


def main(argv: Sequence[str]) -> int:
    """``URL NAME``."""
    url, name = argv
    asyncio.run(serve(url, name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
