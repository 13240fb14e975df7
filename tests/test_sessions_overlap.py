"""Overlapping runs of one session are refused per session in the process, not per registry (issue 36, item 2).

Found by a hostile run: a web app that builds its agent and registry per request (as the README's "Serving many
sessions" allows) let two overlapping requests of one session both go through, each registry seeing only its own
run, and the stored history became user, assistant(call), user, assistant(call), tool, ..., which providers
reject. Two live registries configured alike (a blue/green reload) did the same, and so did two registries under
different state keys. Here every registry is the README's wiring over real framework classes (a plain ``Agent``
and ``create_harness_agent`` over the scripted client of ``test_sessions``), built the way a request handler
builds it: the second request's run must be refused exactly as one registry refuses it, before it writes or
sends anything, and the session must stay well formed. Runs that do not overlap, runs of other sessions and runs
that ended without closing (a dropped stream, a cancelled handler, a run that raised) must not be refused.

With leases (``leased_session``), overlapping requests of one session wait for each other instead: in one process
across registries built per request (here) as across processes (``test_redis_leases.py`` and
``test_multiprocess_sessions.py``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis
from agent_framework import AgentSession, Message

from maf_compaction import SessionCompactionRegistry, leased_session
from maf_compaction.adapters import sessions as sessions_module
from maf_compaction.bench.runner import stored_messages
from maf_compaction.redis import RedisSessionLeases, RedisSessionStore
from test_sessions import KEY, Model, converse, lookup, question, records_stack
from test_sessions_runs import WIRINGS, Wiring, _start_and_abandon, consume, plain

#: The single-registry guard's wording for a run that overlaps another (``SessionCompactionRegistry.begin_run``).
OVERLAPPING_RUN = r"this run of session .* overlaps its .* run, still in progress: requests of one session must run"


class SlowLookup:
    """The ``lookup`` tool the scripted model calls; once ``armed``, its next call waits for ``release``."""

    def __init__(self) -> None:
        self.armed = False
        self.inside = asyncio.Event()
        self.release = asyncio.Event()

    def tool(self) -> Callable[[str], Awaitable[str]]:
        async def slow_lookup(q: str) -> str:
            """Look up the code of an item."""
            if self.armed:
                self.armed = False
                self.inside.set()
                await self.release.wait()
            return lookup(q)

        slow_lookup.__name__ = "lookup"
        return slow_lookup


def one_request(wiring: Wiring, client: Model, tools: list[Any], state_key: str = KEY) -> Any:
    """What a request handler builds: a registry of the README's records stacks and the agent wired to it."""
    return wiring(SessionCompactionRegistry(records_stack, state_key=state_key), client, tools)


def saved(session: AgentSession) -> str:
    """The session as a host stores it between requests."""
    return json.dumps(session.to_dict())


def written(session: AgentSession) -> str:
    """What the session holds that a run writes (``snapshot``), less the empty function-invocation budget that the
    harness's tool-approval middleware puts into a session before any context provider runs."""
    data = session.to_dict()
    state = {k: v for k, v in data["state"].items() if (k, v) != ("_function_invocation_budget_state", {})}
    return json.dumps({**data, "state": state}, sort_keys=True, default=str)


def restored(payload: str) -> AgentSession:
    """The session a request handler restores from what the host stored."""
    return AgentSession.from_dict(json.loads(payload))


def assert_well_formed(messages: Sequence[Message]) -> None:
    """Every function call is answered by its result before the next user message, and every result answers an
    earlier call: what a provider accepts."""
    roles = [f"{m.role}({','.join(c.type for c in m.contents)})" for m in messages]
    pending: list[str] = []
    for message in messages:
        assert message.role != "user" or not pending, f"a user message between calls and their results: {roles}"
        for content in message.contents:
            if content.type == "function_call":
                pending.append(str(content.call_id))
            elif content.type == "function_result":
                assert str(content.call_id) in pending, f"a result answers no earlier call: {roles}"
                pending.remove(str(content.call_id))
    assert not pending, f"calls without results: {roles}"
    assert any(m.role == "user" for m in messages), "nothing was stored"


async def run_or_stream(agent: Any, text: str, session: AgentSession, stream: bool) -> None:
    if stream:
        await consume(agent.run(text, session=session, stream=True))
    else:
        await agent.run(text, session=session)


# --- a registry per request ------------------------------------------------------------------------------


@pytest.mark.parametrize("restore", [False, True], ids=["same-session-object", "restored-session"])
@pytest.mark.parametrize("stream", [False, True], ids=["run", "streamed"])
@pytest.mark.parametrize(("name", "wiring"), WIRINGS, ids=[w[0] for w in WIRINGS])
async def test_a_registry_built_per_request_refuses_a_run_overlapping_another_requests_run(
    name: str, wiring: Wiring, stream: bool, restore: bool
) -> None:
    """Request 1's run waits in a slow tool; request 2 builds its own registry and agent and runs the same session
    (the same ``AgentSession``, or one restored from what the host stored, with the same id): it is refused with the
    one-registry wording, before it writes into its session or sends a request, and the session stays well formed
    and free for the next request once request 1 has ended."""
    slow, client = SlowLookup(), Model()
    first = one_request(wiring, client, [slow.tool()])
    session = first.create_session()
    await converse(first, session, 1)
    stored = saved(session)
    slow.armed = True
    running = asyncio.create_task(first.run(question(1), session=session))
    await asyncio.wait_for(slow.inside.wait(), 30)

    other = restored(stored) if restore else session
    second = one_request(wiring, client, [slow.tool()])
    before, requests = written(other), len(client.requests)
    with pytest.raises(RuntimeError, match=OVERLAPPING_RUN):
        await run_or_stream(second, question(2), other, stream)
    assert written(other) == before, "the refused run wrote into its session"
    assert len(client.requests) == requests, "the refused run sent a request"

    slow.release.set()
    await running
    assert_well_formed(stored_messages(session))
    following = restored(saved(session))
    await run_or_stream(one_request(wiring, client, [slow.tool()]), question(3), following, stream)
    assert_well_formed(stored_messages(following))


@pytest.mark.parametrize(("name", "wiring"), WIRINGS, ids=[w[0] for w in WIRINGS])
async def test_a_stream_still_being_read_through_one_registry_refuses_a_run_through_another(
    name: str, wiring: Wiring
) -> None:
    client = Model()
    first = one_request(wiring, client, [lookup])
    session = first.create_session()
    await converse(first, session, 1)
    run = first.run(question(1), session=session, stream=True)
    updates = aiter(run)
    await anext(updates)
    before = len(stored_messages(session))
    with pytest.raises(RuntimeError, match="overlaps"):
        await one_request(wiring, client, [lookup]).run(question(2), session=session)
    assert len(stored_messages(session)) == before, "the refused run wrote to the stored history"
    async for _ in updates:
        pass
    await run.get_final_response()
    await converse(one_request(wiring, client, [lookup]), session, 1)
    assert_well_formed(stored_messages(session))


# --- two live registries on one session ----------------------------------------------------------------------


@pytest.mark.parametrize("keys", [(KEY, KEY), ("blue", "green")], ids=["one-state-key", "two-state-keys"])
@pytest.mark.parametrize(("name", "wiring"), WIRINGS, ids=[w[0] for w in WIRINGS])
async def test_blue_and_green_registries_take_turns_and_refuse_an_overlap(
    name: str, wiring: Wiring, keys: tuple[str, str]
) -> None:
    """Two live registries (a blue/green reload under one state key, or two side by side under a key each) take
    turns on one session without a false refusal; the one run that overlaps the other's is refused."""
    slow, client = SlowLookup(), Model()
    blue, green = (one_request(wiring, client, [slow.tool()], state_key=key) for key in keys)
    session = blue.create_session()
    for number in range(4):
        await (blue, green)[number % 2].run(question(number), session=session)
    slow.armed = True
    running = asyncio.create_task(blue.run(question(4), session=session))
    await asyncio.wait_for(slow.inside.wait(), 30)
    before, requests = written(session), len(client.requests)
    with pytest.raises(RuntimeError, match=OVERLAPPING_RUN):
        await green.run(question(5), session=session)
    assert written(session) == before, "the refused run wrote into the session"
    assert len(client.requests) == requests, "the refused run sent a request"
    slow.release.set()
    await running
    for number in range(6, 8):
        await (blue, green)[number % 2].run(question(number), session=session)
    assert_well_formed(stored_messages(session))
    assert all(key in session.state for key in keys)


async def test_a_phase_of_another_registry_in_another_task_is_refused() -> None:
    """The phase guard is per session too: a phase open through one registry refuses another registry's phase of
    the session in another task, and its migration; nested in the same task, another registry's phase (its own
    state key) is served, as before."""
    blue, green = SessionCompactionRegistry(records_stack), SessionCompactionRegistry(records_stack)
    side = SessionCompactionRegistry(records_stack, state_key="side")
    session = AgentSession()
    copy = restored(saved(session))

    async def phase_of(registry: SessionCompactionRegistry, which: AgentSession) -> None:
        with registry.phase(which, "the other phase"):
            pass

    with blue.phase(session, "blue's phase") as stack:
        stack.gate.arm()
        for registry, which in ((green, session), (green, copy), (blue, copy)):
            with pytest.raises(RuntimeError, match=r"the other phase for session .* overlaps its blue's phase"):
                await asyncio.create_task(phase_of(registry, which))
        with pytest.raises(RuntimeError, match="is in a phase: migrate it between requests"):
            green.migrate(session)
        with side.phase(session) as nested:
            assert not nested.gate.armed
    await asyncio.create_task(phase_of(green, session))
    with green.phase(session) as stack:
        assert stack.gate.armed, "blue's phase wrote its state"
    assert "side" in session.state


# --- no false refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "wiring"), WIRINGS, ids=[w[0] for w in WIRINGS])
async def test_sequential_runs_through_registries_built_per_request_are_served(name: str, wiring: Wiring) -> None:
    client = Model()
    payload = saved(AgentSession())
    for number in range(4):
        session = restored(payload)
        await run_or_stream(one_request(wiring, client, [lookup]), question(number), session, stream=number % 2 == 1)
        payload = saved(session)
    assert_well_formed(stored_messages(restored(payload)))
    assert sum(m.role == "user" for m in stored_messages(restored(payload))) == 4


@pytest.mark.parametrize(("name", "wiring"), WIRINGS, ids=[w[0] for w in WIRINGS])
async def test_distinct_sessions_run_concurrently_through_registries_built_per_request(
    name: str, wiring: Wiring
) -> None:
    client = Model()
    sessions = [AgentSession() for _ in range(4)]

    async def requests(session: AgentSession, label: int) -> None:
        for number in range(3):
            await one_request(wiring, client, [lookup]).run(question(number, label), session=session)

    await asyncio.gather(*(requests(s, i) for i, s in enumerate(sessions)))
    assert client.most_in_flight > 1
    for session in sessions:
        assert_well_formed(stored_messages(session))


@pytest.mark.parametrize("how", ["closed", "dropped", "cancelled"])
@pytest.mark.parametrize(("name", "wiring"), WIRINGS, ids=[w[0] for w in WIRINGS])
async def test_an_abandoned_stream_does_not_hold_its_session_for_another_registry(
    name: str, wiring: Wiring, how: str
) -> None:
    client = Model()
    first = one_request(wiring, client, [lookup])
    session = first.create_session()
    await converse(first, session, 1)
    await _start_and_abandon(first, session, how)
    del first
    await converse(one_request(wiring, client, [lookup]), session, 2)
    await converse(one_request(wiring, client, [lookup]), session, 1, stream=True)


@pytest.mark.parametrize("how", ["raised", "dropped stream"])
@pytest.mark.parametrize(("name", "wiring"), WIRINGS, ids=[w[0] for w in WIRINGS])
async def test_a_run_that_ended_without_its_after_run_does_not_hold_its_session_for_another_registry(
    name: str, wiring: Wiring, how: str
) -> None:
    """A worker task that lives on (serving other sessions) ran a run that raised, or dropped its stream, through
    its registry: the next request of the session, through another registry in another task, is served."""
    client = Model()
    session = AgentSession()
    ended, finish = asyncio.Event(), asyncio.Event()

    async def worker() -> None:
        agent = one_request(wiring, client, [lookup])
        if how == "raised":
            client.fail = lambda options: True
            with pytest.raises(Exception, match="failed"):
                await agent.run(question(0), session=session)
            client.fail = None
        else:
            await _start_and_abandon(agent, session, "dropped")
        ended.set()
        await finish.wait()

    task = asyncio.create_task(worker())
    await ended.wait()
    try:
        await converse(one_request(wiring, client, [lookup]), session, 1)
    finally:
        finish.set()
        await task


async def test_the_guard_keeps_no_registry_or_session_of_an_ended_run_alive() -> None:
    """A registry built per request, and its session, are collected once the request is over, even after a run that
    raised before its after_run; and the process-wide guard does not grow with sessions served and gone."""

    async def request(number: int) -> tuple[weakref.ref[Any], weakref.ref[AgentSession]]:
        # A client per request too: the framework's client keeps its last call's middleware pipeline.
        registry, client = SessionCompactionRegistry(records_stack), Model(fail=lambda options: True)
        session = AgentSession()
        with pytest.raises(Exception, match="failed"):
            await plain(registry, client, [lookup]).run(question(number), session=session)
        return weakref.ref(registry), weakref.ref(session)

    gone = [await asyncio.create_task(request(number)) for number in range(3)]
    gc.collect()
    assert all(registry() is None and session() is None for registry, session in gone)
    for number in range(sessions_module._SWEEP_AT + 10):  # more sessions than the guard sweeps at
        await asyncio.create_task(request(number))
    assert sessions_module._GUARD.sessions() <= sessions_module._SWEEP_AT


# --- event loops in other threads ---------------------------------------------------------------------------------


def test_runs_of_one_session_in_two_event_loops_are_refused_and_nothing_crashes() -> None:
    """A host that runs an event loop per thread: a run of the session in one loop refuses the other loop's run
    of it (through another registry), the first completes, and the session then serves either loop."""
    session = AgentSession()
    inside, release = threading.Event(), threading.Event()

    async def slow_lookup(q: str) -> str:
        """Look up the code of an item."""
        inside.set()
        while not release.is_set():
            await asyncio.sleep(0.005)
        return lookup(q)

    slow_lookup.__name__ = "lookup"
    errors: list[BaseException] = []

    def first_loop() -> None:
        try:
            asyncio.run(one_request(plain, Model(), [slow_lookup]).run(question(0), session=session))
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=first_loop)
    thread.start()
    try:
        assert inside.wait(30)
        with pytest.raises(RuntimeError, match=OVERLAPPING_RUN):
            asyncio.run(one_request(plain, Model(), [lookup]).run(question(1), session=session))
    finally:
        release.set()
        thread.join(30)
    assert not errors, errors
    asyncio.run(converse(one_request(plain, Model(), [lookup]), session, 1))
    assert_well_formed(stored_messages(session))


# --- with leases: the second request waits -----------------------------------------------------------------------


async def test_requests_through_registries_built_per_request_wait_for_the_lease(redis_client: aioredis.Redis) -> None:
    """Two requests of one session in one process, each with its own registry and agent (the README's wiring),
    each inside ``leased_session``: the second waits for the first's lease instead of being refused or
    interleaving, and the stored history holds both turns, one after the other."""
    leases = RedisSessionLeases(redis_client, poll_interval_ms=2)
    store = RedisSessionStore(redis_client)
    slow, client = SlowLookup(), Model()
    async with leased_session("s", leases=leases, store=store, create=True) as session:
        await converse(one_request(plain, client, [slow.tool()]), session, 1)
    journal: list[str] = []

    async def request(name: str, text: str) -> None:
        async with leased_session("s", leases=leases, store=store, create=False) as session:
            journal.append(f"enter {name}")
            await one_request(plain, client, [slow.tool()]).run(text, session=session)
            journal.append(f"exit {name}")

    slow.armed = True
    first = asyncio.create_task(request("first", question(1)))
    await asyncio.wait_for(slow.inside.wait(), 30)
    second = asyncio.create_task(request("second", question(2)))
    await asyncio.sleep(0.2)
    assert journal == ["enter first"], "the second request did not wait for the lease"
    slow.release.set()
    await asyncio.wait_for(asyncio.gather(first, second), 30)
    assert journal == ["enter first", "exit first", "enter second", "exit second"]
    async with leased_session("s", leases=leases, store=store, create=False) as session:
        messages = stored_messages(session)
    assert_well_formed(messages)
    assert [m.text for m in messages if m.role == "user"] == [question(0), question(1), question(2)]
