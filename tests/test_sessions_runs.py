"""A phase ends when its run ends, however it ends; overlapping runs are refused before they write anything.

Found by a hostile host: a streamed response its client stopped reading (closed, dropped,
its task cancelled) locked its session for good; a second run of a session started while
the first was inside a slow tool was not refused on a plain ``Agent`` and, under the
harness, only at its second model call, after its user turn and tool call were stored.
Both agents here are the README's wiring: a plain ``Agent`` and ``create_harness_agent``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from agent_framework import Agent, AgentSession, create_harness_agent

from maf_compaction import (
    SessionCompactionProvider,
    SessionCompactionRegistry,
    SessionToolResultRecallMiddleware,
    make_session_recall_tool,
)
from maf_compaction.bench.runner import stored_messages
from test_sessions import KEY, TOKENIZER, Model, converse, lookup, question, records_stack, stack_dict

Wiring = Callable[[SessionCompactionRegistry, Model, list[Any]], Any]


def plain(registry: SessionCompactionRegistry, client: Model, tools: list[Any]) -> Agent:
    """The plain-Agent wiring: provider compacts before and after, the middleware pins."""
    return Agent(
        client,
        "Be terse.",
        tools=[*tools, make_session_recall_tool(registry)],
        middleware=[SessionToolResultRecallMiddleware(registry)],
        context_providers=[SessionCompactionProvider(registry, tokenizer=TOKENIZER)],
    )


def harness(registry: SessionCompactionRegistry, client: Model, tools: list[Any]) -> Any:
    """The README's shared agent under create_harness_agent (todo and mode on, as by default)."""
    compaction = SessionCompactionProvider(registry, tokenizer=TOKENIZER, before=False)
    agent = create_harness_agent(
        client,
        name="shared-assistant",
        agent_instructions="Be terse.",
        tools=[*tools, make_session_recall_tool(registry)],
        middleware=[SessionToolResultRecallMiddleware(registry, compact_before=True)],
        disable_compaction=True,
        context_providers=[compaction],
        max_output_tokens=200,
        tokenizer=TOKENIZER,
        disable_web_search=True,
        disable_file_memory=True,
    )
    agent.context_providers.remove(compaction)
    agent.context_providers.insert(1, compaction)
    return agent


WIRINGS: list[tuple[str, Wiring]] = [("plain-agent", plain), ("harness", harness)]


def setup(wiring: Wiring, tools: list[Any] | None = None) -> tuple[SessionCompactionRegistry, Model, Any]:
    registry = SessionCompactionRegistry(records_stack)
    client = Model()
    return registry, client, wiring(registry, client, tools if tools is not None else [lookup])


def snapshot(session: AgentSession) -> str:
    """Everything the session stores, as JSON (the history and every provider's state)."""
    return json.dumps(session.to_dict(), sort_keys=True, default=str)


# --- abandoned streams ----------------------------------------------------------------------------------


async def _start_and_abandon(agent: Any, session: AgentSession, how: str) -> None:
    """Read the first update of a streamed run, then leave it as a disconnected client would."""
    if how == "cancelled":
        reading = asyncio.Event()

        async def consume() -> None:
            async for _ in agent.run(question(0), session=session, stream=True):
                reading.set()
                await asyncio.sleep(3600)  # the client stops reading; its request handler is cancelled

        task = asyncio.create_task(consume())
        await reading.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return
    run = agent.run(question(0), session=session, stream=True)
    updates = aiter(run)
    await anext(updates)
    if how == "closed":
        await run.close()
    # "dropped": the references go with this frame; nobody calls gc.collect()


@pytest.mark.parametrize("how", ["closed", "dropped", "cancelled"])
@pytest.mark.parametrize(("name", "wiring"), WIRINGS, ids=[w[0] for w in WIRINGS])
async def test_an_abandoned_stream_releases_its_session(name: str, wiring: Wiring, how: str) -> None:
    """A client that stops reading a streamed response (closes it, drops it, or has its task cancelled) does not
    lock the session: the next turns run, streamed or not, and the abandoned phase's state was written."""
    registry, _client, agent = setup(wiring)
    session = agent.create_session()
    await converse(agent, session, 1)
    await _start_and_abandon(agent, session, how)
    await converse(agent, session, 2)
    await converse(agent, session, 1, stream=True)
    with registry.phase(session) as stack:
        assert stack.to_dict() == stack_dict(session.state[KEY])


async def test_a_dropped_stream_is_ended_at_the_registrys_next_phase_not_inside_garbage_collection() -> None:
    """Garbage collection may run a stream's finalizer inside any operation of the registry: the finalizer only
    marks the phase, and the registry writes its state when it next opens a phase (of any session)."""
    registry, _client, agent = setup(plain)
    session, other = agent.create_session(), agent.create_session()
    await converse(agent, session, 1)
    run = agent.run(question(0), session=session, stream=True)
    await anext(aiter(run))
    before = snapshot(session)
    del run
    gc.collect()  # the finalizer runs here
    assert snapshot(session) == before, "the finalizer wrote the session during garbage collection"
    await converse(agent, other, 1)  # the registry's next phase ends the dropped one
    with registry.phase(session) as stack:
        assert stack.to_dict() == stack_dict(session.state[KEY])
    await converse(agent, session, 1)


@pytest.mark.parametrize(("name", "wiring"), WIRINGS, ids=[w[0] for w in WIRINGS])
async def test_a_stream_still_being_read_refuses_a_second_run_before_it_writes(name: str, wiring: Wiring) -> None:
    _registry, _client, agent = setup(wiring)
    session = agent.create_session()
    await converse(agent, session, 1)
    run = agent.run(question(1), session=session, stream=True)
    updates = aiter(run)
    await anext(updates)
    before = len(stored_messages(session))
    with pytest.raises(RuntimeError, match="overlaps"):
        await agent.run(question(2), session=session)
    assert len(stored_messages(session)) == before, "the refused run wrote to the stored history"
    async for _ in updates:
        pass
    await run.get_final_response()
    await converse(agent, session, 1)


async def consume(run: Any) -> None:
    async for _ in run:
        pass


# --- overlapping runs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "wiring"), WIRINGS, ids=[w[0] for w in WIRINGS])
@pytest.mark.parametrize("stream", [False, True], ids=["run", "streamed"])
async def test_a_run_started_while_another_is_in_a_slow_tool_is_refused_before_it_writes(
    name: str, wiring: Wiring, stream: bool
) -> None:
    """The first run waits inside a slow tool; a second run of the session (another request handler) is refused
    at once, and nothing of it reaches the stored history or the provider."""
    inside, release = asyncio.Event(), asyncio.Event()

    async def slow_lookup(q: str) -> str:
        """Look up the code of an item, slowly."""
        inside.set()
        await release.wait()
        return lookup(q)

    slow_lookup.__name__ = "lookup"  # the tool the scripted model calls
    _registry, client, agent = setup(wiring, [slow_lookup])
    session = agent.create_session()
    first = asyncio.create_task(agent.run(question(0), session=session))
    await asyncio.wait_for(inside.wait(), timeout=30)
    stored, requests = snapshot(session), len(client.requests)
    with pytest.raises(RuntimeError, match="overlaps"):
        await (
            consume(agent.run(question(1), session=session, stream=True))
            if stream
            else agent.run(question(1), session=session)
        )
    assert snapshot(session) == stored, "the refused run wrote into the session"
    assert len(client.requests) == requests, "the refused run sent a request"
    assert question(1) not in snapshot(session)
    release.set()
    await first
    await converse(agent, session, 1)  # the first run ended: the session is free


@pytest.mark.parametrize(("name", "wiring"), WIRINGS, ids=[w[0] for w in WIRINGS])
async def test_a_run_that_raised_before_its_after_run_does_not_hold_the_session(name: str, wiring: Wiring) -> None:
    """A run whose model call raised never reaches after_run: the next run (same task or another) is served."""
    _registry, client, agent = setup(wiring)
    session = agent.create_session()
    client.fail = lambda options: True
    with pytest.raises(Exception, match="failed"):
        await agent.run(question(0), session=session)
    client.fail = None
    await converse(agent, session, 1)

    async def in_another_task() -> None:
        client.fail = lambda options: True
        with pytest.raises(Exception, match="failed"):
            await agent.run(question(1), session=session)
        client.fail = None

    await asyncio.create_task(in_another_task())
    await asyncio.create_task(converse(agent, session, 1))


@pytest.mark.parametrize("how", ["raised", "dropped stream"])
@pytest.mark.parametrize(("name", "wiring"), WIRINGS, ids=[w[0] for w in WIRINGS])
async def test_a_run_that_ended_in_a_task_that_lives_on_does_not_hold_the_session(
    name: str, wiring: Wiring, how: str
) -> None:
    """A worker task that serves many sessions (a queue consumer, a websocket handler) outlives each run: a run of
    it that raised, or whose stream it dropped, has ended, so the session's next run in another task is served."""
    _registry, client, agent = setup(wiring)
    session = agent.create_session()
    ended, finish = asyncio.Event(), asyncio.Event()

    async def worker() -> None:
        if how == "raised":
            client.fail = lambda options: True
            with pytest.raises(Exception, match="failed"):
                await agent.run(question(0), session=session)
            client.fail = None
        else:
            await _start_and_abandon(agent, session, "dropped")
        ended.set()
        await finish.wait()  # the worker goes on serving other sessions

    task = asyncio.create_task(worker())
    await ended.wait()
    try:
        await converse(agent, session, 1)
    finally:
        finish.set()
        await task


@pytest.mark.parametrize(("name", "wiring"), WIRINGS, ids=[w[0] for w in WIRINGS])
async def test_distinct_sessions_still_run_concurrently(name: str, wiring: Wiring) -> None:
    _registry, client, agent = setup(wiring)
    sessions = [agent.create_session() for _ in range(4)]
    await asyncio.gather(*(converse(agent, s, 3, label=i) for i, s in enumerate(sessions)))
    assert client.most_in_flight > 1


async def test_a_run_that_raised_keeps_no_task_alive() -> None:
    """The registry remembers a run that never reached after_run only weakly: its task (and what its frames held)
    is not kept alive by the registry."""
    _registry, client, agent = setup(plain)
    client.fail = lambda options: True
    session = agent.create_session()

    async def failing() -> None:
        with pytest.raises(Exception, match="failed"):
            await agent.run(question(0), session=session)

    task = asyncio.create_task(failing())
    await task
    for _ in range(3):  # let the loop run the callbacks that still refer to the finished task
        await asyncio.sleep(0)
    gone = weakref.ref(task)
    del task
    gc.collect()
    assert gone() is None, "the registry keeps the task of a run that raised alive"
