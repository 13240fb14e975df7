"""The Redis session lease and store, against a real ``redis-server`` (the ``redis_url`` fixture starts one).

Sessions are the framework's ``AgentSession`` with a real ``InMemoryHistoryProvider`` history written by a real
``Agent`` turn (an offline echo client): what a replica would load, run and save. Nothing of Redis is imitated.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from agent_framework import AgentSession, Message
from hypothesis import given
from hypothesis import strategies as st

from lease_worker import GO, JOURNAL, READY, EchoClient, make_agent
from maf_compaction.adapters.leases import (
    HeldLease,
    LeaseTimeoutError,
    SessionLeaseError,
    SessionPayloadError,
    StaleLeaseError,
    leased_session,
    restore_session,
)
from maf_compaction.redis import RedisSessionLeases, RedisSessionStore

HERE = Path(__file__).resolve().parent
SID = "conversation-1"


@pytest.fixture
def client(redis_client: aioredis.Redis) -> aioredis.Redis:
    return redis_client


def history(session: AgentSession) -> list[Message]:
    return list(session.state.get("in_memory", {}).get("messages", []))


def texts(session: AgentSession) -> list[str]:
    return [m.text for m in history(session)]


async def lease_ttl_ms(client: aioredis.Redis, session_id: str = SID) -> int:
    return int(await client.pttl(f"maf_compaction:lease:{{{session_id}}}"))


async def journal(client: aioredis.Redis, key: str = JOURNAL) -> list[str]:
    return [entry.decode() if isinstance(entry, bytes) else str(entry) for entry in await client.lrange(key, 0, -1)]


def assert_no_overlap(entries: list[str]) -> list[tuple[str, int, int]]:
    """Entries pair up as ``enter X t n`` / ``exit X t n`` with nothing between; returns (X, t, n) in order.

    The fencing tokens ``t`` strictly increase from one turn to the next.
    """
    assert len(entries) % 2 == 0, entries
    turns: list[tuple[str, int, int]] = []
    for enter, exit_ in zip(entries[::2], entries[1::2], strict=True):
        kind_in, *holder_in = enter.split()
        kind_out, *holder_out = exit_.split()
        assert (kind_in, kind_out) == ("enter", "exit"), entries
        assert holder_in == holder_out, entries
        name, token, turn = holder_in
        turns.append((name, int(token), int(turn)))
    tokens = [token for _, token, _ in turns]
    assert tokens == sorted(set(tokens)), f"fencing tokens must strictly increase: {tokens}"
    return turns


# --- the lease ----------------------------------------------------------------------------------------------------


async def test_acquire_holds_the_key_with_its_ttl_and_release_deletes_it(client: aioredis.Redis) -> None:
    leases = RedisSessionLeases(client, ttl_ms=5_000)
    assert await leases.fencing_token(SID) == 0
    async with leases.hold(SID) as lease:
        assert lease.session_id == SID
        assert lease.token >= 1
        assert 0 < await lease_ttl_ms(client) <= 5_000
        assert await leases.fencing_token(SID) == lease.token
    assert await lease_ttl_ms(client) == -2  # no such key: released
    assert await leases.fencing_token(SID) == lease.token  # the counter stays, so the next token is greater


async def test_a_second_holder_waits_and_gets_the_lease_after_release(
    client: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    first = RedisSessionLeases(client)
    second = RedisSessionLeases(client, wait_timeout_s=10.0, poll_interval_ms=5)
    entered: list[int] = []

    async def wait_for_it() -> None:
        async with second.hold(SID) as lease:
            entered.append(lease.token)

    caplog.set_level(logging.INFO, logger="maf_compaction")
    async with first.hold(SID) as held:
        waiter = asyncio.create_task(wait_for_it())
        await asyncio.sleep(0.2)
        assert entered == []  # still waiting while the first holds it
    await asyncio.wait_for(waiter, 5)
    assert len(entered) == 1
    assert entered[0] > held.token
    assert any("waiting up to 10 s" in r.getMessage() for r in caplog.records)
    assert any(
        f"Acquired the lease on session 'conversation-1' (token {entered[0]}) after waiting" in r.getMessage()
        for r in caplog.records
    )


async def test_waiting_past_the_timeout_raises_lease_timeout(client: aioredis.Redis) -> None:
    holder = RedisSessionLeases(client)
    impatient = RedisSessionLeases(client, wait_timeout_s=0.25, poll_interval_ms=10)
    async with holder.hold(SID) as held:
        started = time.monotonic()
        with pytest.raises(LeaseTimeoutError, match=r"session 'conversation-1' within 0\.25 s") as caught:
            async with impatient.hold(SID):
                pytest.fail("entered a lease another holder has")
        assert time.monotonic() - started >= 0.25
        assert isinstance(caught.value, SessionLeaseError)
        assert (caught.value.session_id, caught.value.waited_s) == (SID, 0.25)
        with pytest.raises(LeaseTimeoutError):  # 0 tries once
            async with RedisSessionLeases(client, wait_timeout_s=0).hold(SID):
                pytest.fail("entered a lease another holder has")
        assert await holder.fencing_token(SID) == held.token  # a failed attempt takes no token


async def test_renewal_keeps_the_lease_alive_past_its_ttl(client: aioredis.Redis) -> None:
    leases = RedisSessionLeases(client, ttl_ms=300, renew_every_ms=50)
    rival = RedisSessionLeases(client, wait_timeout_s=0)
    async with leases.hold(SID) as lease:
        await asyncio.sleep(0.9)  # 3 ttls
        assert await lease_ttl_ms(client) > 0
        with pytest.raises(LeaseTimeoutError):
            async with rival.hold(SID):
                pytest.fail("the renewed lease was taken")
        assert lease.token == await leases.fencing_token(SID)
    assert await lease_ttl_ms(client) == -2


async def test_release_happens_on_an_exception_and_on_cancellation(client: aioredis.Redis) -> None:
    leases = RedisSessionLeases(client)
    with pytest.raises(RuntimeError, match="boom"):
        async with leases.hold(SID):
            raise RuntimeError("boom")
    assert await lease_ttl_ms(client) == -2
    holding = asyncio.Event()

    async def hold_forever() -> None:
        async with leases.hold(SID):
            holding.set()
            await asyncio.sleep(3_600)

    task = asyncio.create_task(hold_forever())
    await holding.wait()
    assert await lease_ttl_ms(client) > 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await lease_ttl_ms(client) == -2
    before = await leases.fencing_token(SID)
    async with RedisSessionLeases(client, wait_timeout_s=0).hold(SID) as lease:
        assert lease.token > before


async def test_tokens_strictly_increase_across_holders(redis_url: str) -> None:
    # Two replicas: their own clients, their own lease objects, one Redis.
    a, b = aioredis.Redis.from_url(redis_url), aioredis.Redis.from_url(redis_url)
    try:
        replicas = [RedisSessionLeases(a), RedisSessionLeases(b)]
        tokens: list[int] = []
        for turn in range(10):
            async with replicas[turn % 2].hold(SID) as lease:
                tokens.append(lease.token)
        assert tokens == sorted(set(tokens))
        assert len(tokens) == 10
        async with replicas[0].hold("another-session") as other:
            assert other.token >= 1  # per session
        assert await replicas[1].fencing_token(SID) == tokens[-1]
    finally:
        await a.aclose()
        await b.aclose()


async def test_an_expired_lease_lets_another_holder_in_and_the_stale_save_is_refused(
    client: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A holder paused past its ttl (here: a blocked event loop, as in a long GC pause) loses the session."""
    store = RedisSessionStore(client)
    slow = RedisSessionLeases(client, ttl_ms=150, renew_every_ms=50)
    fast = RedisSessionLeases(client, wait_timeout_s=5.0, poll_interval_ms=5)
    newer_saved = asyncio.Event()

    async def newer_holder() -> None:
        async with leased_session(SID, leases=fast, store=store, create=True) as session:
            session.state["holder"] = "newer"
        newer_saved.set()

    newer: list[asyncio.Task[None]] = []

    async def lost_logged() -> None:
        while not any(r.getMessage().startswith("Lost the lease on session") for r in caplog.records):
            await asyncio.sleep(0.01)

    async def stale_turn() -> None:
        async with leased_session(SID, leases=slow, store=store, create=True) as session:
            newer.append(asyncio.create_task(newer_holder()))
            await asyncio.sleep(0.02)  # the newer holder is waiting now
            time.sleep(0.4)  # the loop is blocked: nothing renews, the lease expires in Redis
            await asyncio.wait_for(newer_saved.wait(), 5)
            await asyncio.wait_for(lost_logged(), 5)  # the stale holder's renewal notices
            session.state["holder"] = "stale"

    with pytest.raises(StaleLeaseError, match=r"lease token \d+") as caught:
        await stale_turn()
    await newer[0]
    stale = caught.value.token
    assert stale < caught.value.newest
    async with leased_session(SID, leases=fast, store=store, create=True) as session:
        assert session.state["holder"] == "newer"  # the stale write changed nothing
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"Lost the lease on session 'conversation-1' (token {stale})" in m for m in messages), messages
    assert any(f"Refused a stale write to session 'conversation-1': lease token {stale}" in m for m in messages), (
        messages
    )


async def test_a_save_under_a_lease_older_than_the_newest_token_is_refused_even_after_release(
    client: aioredis.Redis,
) -> None:
    leases, store = RedisSessionLeases(client), RedisSessionStore(client)
    async with leases.hold(SID) as old:
        pass
    async with leases.hold(SID) as current:
        await store.save(SID, {"type": "session", "session_id": SID, "state": {}}, current)
    with pytest.raises(StaleLeaseError):
        await store.save(SID, {"type": "session", "session_id": SID, "state": {"x": 1}}, old)
    with pytest.raises(StaleLeaseError, match=f"newest fencing token is {current.token}"):
        await store.save(
            SID, {"type": "session", "session_id": SID, "state": {"x": 1}}, HeldLease(SID, current.token + 1)
        )
    assert await store.load(SID, current) == {"type": "session", "session_id": SID, "state": {}}


# --- leased_session ---------------------------------------------------------------------------------------------


async def test_leased_session_round_trips_a_real_session_between_replicas(redis_url: str) -> None:
    a, b = aioredis.Redis.from_url(redis_url), aioredis.Redis.from_url(redis_url)
    try:
        first_client, second_client = EchoClient(), EchoClient()
        replicas = [
            (RedisSessionLeases(a), RedisSessionStore(a), make_agent(first_client)),
            (RedisSessionLeases(b), RedisSessionStore(b), make_agent(second_client)),
        ]
        for turn, (leases, store, agent) in enumerate(replicas * 2):
            async with leased_session(SID, leases=leases, store=store, create=True) as session:
                assert session.session_id == SID
                assert len(history(session)) == 2 * turn
                assert all(isinstance(m, Message) for m in history(session))
                await agent.run(f"turn {turn}", session=session)
        # The second replica's last request carried everything the first replica's turns stored, in order.
        assert second_client.requests[-1] == [
            "turn 0",
            "echo: turn 0",
            "turn 1",
            "echo: turn 1",
            "turn 2",
            "echo: turn 2",
            "turn 3",
        ]
        stored = await RedisSessionStore(a).load(SID, HeldLease(SID, await replicas[0][0].fencing_token(SID)))
        assert stored is not None
        restored = AgentSession.from_dict(stored)
        assert texts(restored)[-2:] == ["turn 3", "echo: turn 3"]
        assert stored == json.loads(json.dumps(restored.to_dict()))  # the payload is exactly the session's to_dict()
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_client_that_decodes_responses_works_the_same(redis_url: str) -> None:
    text_client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        leases, store, agent = RedisSessionLeases(text_client), RedisSessionStore(text_client), make_agent(EchoClient())
        seen = [await leases.fencing_token(SID)]
        for turn in range(2):
            async with leased_session(SID, leases=leases, store=store, create=True) as session:
                await agent.run(f"turn {turn}", session=session)
            seen.append(await leases.fencing_token(SID))
        assert seen == sorted(set(seen))
        async with leased_session(SID, leases=leases, store=store, create=True) as session:
            assert texts(session) == ["turn 0", "echo: turn 0", "turn 1", "echo: turn 1"]
    finally:
        await text_client.aclose()


async def test_leased_session_saves_on_an_ordinary_exception(client: aioredis.Redis) -> None:
    leases, store, agent = RedisSessionLeases(client), RedisSessionStore(client), make_agent(EchoClient())

    async def failing_turn() -> None:
        async with leased_session(SID, leases=leases, store=store, create=True) as session:
            await agent.run("hello", session=session)
            raise RuntimeError("after the model answered")

    with pytest.raises(RuntimeError, match="after the model answered"):
        await failing_turn()
    assert await lease_ttl_ms(client) == -2
    async with leased_session(SID, leases=leases, store=store, create=True) as session:
        assert texts(session) == ["hello", "echo: hello"]


async def test_leased_session_saves_nothing_when_cancelled_and_releases(client: aioredis.Redis) -> None:
    leases, store, agent = RedisSessionLeases(client), RedisSessionStore(client), make_agent(EchoClient())
    async with leased_session(SID, leases=leases, store=store, create=True) as session:
        await agent.run("kept", session=session)
    inside = asyncio.Event()

    async def unfinished_turn() -> None:
        async with leased_session(SID, leases=leases, store=store, create=True) as session:
            await agent.run("lost with the cancelled turn", session=session)
            inside.set()
            await asyncio.sleep(3_600)

    task = asyncio.create_task(unfinished_turn())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await lease_ttl_ms(client) == -2
    async with leased_session(
        SID, leases=RedisSessionLeases(client, wait_timeout_s=0), store=store, create=True
    ) as session:
        assert texts(session) == ["kept", "echo: kept"]


async def test_a_failed_save_after_an_exception_keeps_the_exception_and_says_why(
    client: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    leases, store = RedisSessionLeases(client), RedisSessionStore(client)

    async def failing_turn() -> None:
        async with leased_session(SID, leases=leases, store=store, create=True) as session:
            session.state["bad"] = object()  # not JSON-serializable: the save fails too
            raise RuntimeError("turn failed")

    with (
        pytest.raises(RuntimeError, match="turn failed") as caught,
        pytest.warns(RuntimeWarning, match="unsupported type"),  # the framework's own warning in to_dict()
    ):
        await failing_turn()
    assert any("was not saved" in note and "not JSON-serializable" in note for note in caught.value.__notes__)
    assert any("was not saved after the turn raised RuntimeError" in r.getMessage() for r in caplog.records)
    async with leases.hold(SID) as lease:
        assert await store.load(SID, lease) is None


async def test_a_new_session_when_nothing_is_stored(client: aioredis.Redis) -> None:
    async with leased_session(
        "fresh", leases=RedisSessionLeases(client), store=RedisSessionStore(client), create=True
    ) as session:
        assert session.session_id == "fresh"
        assert session.state == {}
    stored = await client.get("maf_compaction:session:{fresh}")
    assert stored is not None
    assert json.loads(stored) == {
        "type": "session",
        "session_id": "fresh",
        "service_session_id": None,
        "state": {},
    }


async def test_a_stored_payload_of_another_session_or_malformed_is_a_typed_error(client: aioredis.Redis) -> None:
    leases, store = RedisSessionLeases(client), RedisSessionStore(client)
    key = f"maf_compaction:session:{{{SID}}}"
    cases = {
        json.dumps({"type": "session", "session_id": "someone-else", "state": {}}): "belongs to session 'someone-else'",
        "{not json": "not valid JSON",
        "[1, 2]": "not a JSON object",
        json.dumps({"type": "message", "role": "user"}): "not an AgentSession.to_dict",
    }
    for raw, problem in cases.items():
        await client.set(key, raw)
        with pytest.raises(SessionPayloadError, match=problem):
            async with leased_session(SID, leases=leases, store=store, create=True):
                pytest.fail("a malformed payload was loaded")
        assert await lease_ttl_ms(client) == -2
        assert await client.get(key) == raw.encode()  # left as it was


async def test_concurrent_holders_in_one_event_loop_never_overlap_and_lose_no_turn(client: aioredis.Redis) -> None:
    leases = RedisSessionLeases(client, poll_interval_ms=2)
    store = RedisSessionStore(client)
    agent = make_agent(EchoClient())

    async def replica(name: str) -> None:
        for turn in range(3):
            async with leased_session(SID, leases=leases, store=store, create=True) as session:
                token = await leases.fencing_token(SID)
                await client.rpush(JOURNAL, f"enter {name} {token} {turn}")
                await agent.run(f"{name} turn {turn}", session=session)
                await asyncio.sleep(0.002)
                await client.rpush(JOURNAL, f"exit {name} {token} {turn}")

    names = [f"task{i}" for i in range(6)]
    await asyncio.wait_for(asyncio.gather(*(replica(n) for n in names)), 20)
    granted = assert_no_overlap(await journal(client))
    assert len(granted) == 18
    assert await leases.fencing_token(SID) == granted[-1][1]  # no acquisition after the last journaled one
    async with leased_session(SID, leases=leases, store=store, create=True) as session:
        users = [m.text for m in history(session) if m.role == "user"]
    assert sorted(users) == sorted(f"{n} turn {t}" for n in names for t in range(3))  # no lost update
    for name in names:
        assert [u for u in users if u.startswith(f"{name} ")] == [f"{name} turn {t}" for t in range(3)]


async def test_two_processes_never_overlap_and_lose_no_turn(client: aioredis.Redis, redis_url: str) -> None:
    """Two replica processes, three sessions, each turn routed at random: the lease serializes every session."""
    turns, sessions = 12, ["s-a", "s-b", "s-c"]
    command = [sys.executable, "-W", "ignore", str(HERE / "lease_worker.py"), redis_url, ",".join(sessions)]
    workers = [
        subprocess.Popen([*command, name, str(turns), str(seed)], stderr=subprocess.PIPE)
        for name, seed in (("p1", 1), ("p2", 2))
    ]
    try:
        deadline = time.monotonic() + 60
        while await client.llen(READY) < 2:
            assert time.monotonic() < deadline, "the worker processes did not start"
            assert all(w.poll() is None for w in workers), [w.communicate()[1] for w in workers]
            await asyncio.sleep(0.05)
        await client.rpush(GO, "p1", "p2")
        for worker in workers:
            _, err = await asyncio.to_thread(worker.communicate, timeout=60)
            assert worker.returncode == 0, err.decode()
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    leases, store = RedisSessionLeases(client), RedisSessionStore(client)
    played: set[tuple[str, int]] = set()
    shared = 0
    for session_id in sessions:
        granted = assert_no_overlap(await journal(client, f"{JOURNAL}:{session_id}"))
        assert await leases.fencing_token(session_id) == granted[-1][1]  # no acquisition after the last journaled
        async with leased_session(session_id, leases=leases, store=store, create=True) as session:
            users = [m.text for m in history(session) if m.role == "user"]
        # Every turn is in its session's history, in the order the lease granted them: no lost update.
        assert users == [f"{name} turn {turn}" for name, _, turn in granted]
        played |= {(name, turn) for name, _, turn in granted}
        shared += len({name for name, _, _ in granted}) == 2
    assert played == {(name, turn) for name in ("p1", "p2") for turn in range(turns)}
    assert shared > 0  # the processes did compete for sessions


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=8).filter(lambda k: k != "type"), children, max_size=4)
    ),
    max_leaves=12,
)


@given(
    session_id=st.text(min_size=1, max_size=12),
    state=st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k != "in_memory"), JSON, max_size=4),
    holds=st.integers(min_value=1, max_value=4),
)
def test_any_json_state_round_trips_under_the_newest_lease_and_never_under_an_older_one(
    redis_server_url: str, session_id: str, state: dict[str, Any], holds: int
) -> None:
    """Whatever the session id (braces, colons, any text) and JSON-safe state: saved under the newest token it loads
    back equal; a save under any older token is refused and changes nothing."""

    async def check() -> None:
        connection = aioredis.Redis.from_url(redis_server_url)
        try:
            await connection.flushall()
            leases, store = RedisSessionLeases(connection), RedisSessionStore(connection)
            held: list[HeldLease] = []
            for _ in range(holds):
                async with leases.hold(session_id) as lease:
                    held.append(HeldLease(lease.session_id, lease.token))
            payload = {"type": "session", "session_id": session_id, "service_session_id": None, "state": state}
            await store.save(session_id, payload, held[-1])
            for old in held[:-1]:
                with pytest.raises(StaleLeaseError):
                    await store.save(session_id, {**payload, "state": {}}, old)
            loaded = await store.load(session_id, held[-1])
            assert loaded == payload
            assert restore_session(session_id, loaded).to_dict() == payload
        finally:
            await connection.aclose()

    asyncio.run(check())


# --- parameters and the extra -------------------------------------------------------------------------------------

LOCAL = "redis://127.0.0.1:1/0"  # never connected to: construction and validation do no I/O


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ttl_ms": 0}, r"ttl_ms must be an integer >= 10, got 0"),
        ({"ttl_ms": True}, r"ttl_ms must be an integer >= 10, got True"),
        ({"ttl_ms": 1.5}, r"ttl_ms must be an integer >= 10"),
        (
            {"ttl_ms": 1_000, "renew_every_ms": 1_000},
            r"renew_every_ms must be an integer in \[1, ttl_ms - 1\] = \[1, 999\]",
        ),
        ({"renew_every_ms": 0}, r"renew_every_ms must be an integer >= 1 or None, got 0"),
        ({"wait_timeout_s": -1}, r"wait_timeout_s must be a finite number >= 0"),
        ({"wait_timeout_s": math.nan}, r"wait_timeout_s must be a finite number >= 0"),
        ({"wait_timeout_s": "5"}, r"wait_timeout_s must be a finite number >= 0"),
        ({"poll_interval_ms": 0}, r"poll_interval_ms must be an integer >= 1, got 0"),
        ({"prefix": ""}, r"prefix must be a non-empty string without"),
        ({"prefix": "app{1}"}, r"prefix must be a non-empty string without"),
    ],
)
async def test_bad_lease_parameters_raise_value_error_naming_them(kwargs: dict[str, Any], message: str) -> None:
    connection = aioredis.Redis.from_url(LOCAL)
    with pytest.raises(ValueError, match=message):
        RedisSessionLeases(connection, **kwargs)
    await connection.aclose()


async def test_bad_arguments_raise_value_error_naming_them() -> None:
    connection = aioredis.Redis.from_url(LOCAL)
    sync_client = redis.Redis.from_url(LOCAL)
    try:
        for bad_client in (object(), sync_client, None):
            with pytest.raises(ValueError, match="client must be an asyncio Redis client"):
                RedisSessionLeases(bad_client)  # pyright: ignore[reportArgumentType]
            with pytest.raises(ValueError, match="client must be an asyncio Redis client"):
                RedisSessionStore(bad_client)  # pyright: ignore[reportArgumentType]
        with pytest.raises(ValueError, match="prefix must be"):
            RedisSessionStore(connection, prefix=3)  # pyright: ignore[reportArgumentType]
        leases, store = RedisSessionLeases(connection), RedisSessionStore(connection)
        for bad_id in ("", None, 7):
            with pytest.raises(ValueError, match="session_id must be a non-empty string"):
                leases.hold(bad_id)  # pyright: ignore[reportArgumentType]
            with pytest.raises(ValueError, match="session_id must be a non-empty string"):
                await leases.fencing_token(bad_id)  # pyright: ignore[reportArgumentType]
            with pytest.raises(ValueError, match="session_id must be a non-empty string"):
                async with leased_session(bad_id, leases=leases, store=store, create=True):  # pyright: ignore[reportArgumentType]
                    pytest.fail("entered")
        with pytest.raises(ValueError, match="lease must be held on session 'a', got a lease on 'b'"):
            await store.save("a", {}, HeldLease("b", 1))
        with pytest.raises(ValueError, match=r"lease\.token must be an integer >= 1, got 0"):
            await store.load("a", HeldLease("a", 0))
        with pytest.raises(ValueError, match="lease must be a SessionLease"):
            await store.load("a", "a:1")  # pyright: ignore[reportArgumentType]
        with pytest.raises(SessionPayloadError, match="not a mapping"):
            await store.save("a", ["a"], HeldLease("a", 1))  # pyright: ignore[reportArgumentType]
        with pytest.raises(ValueError, match="leases must implement SessionLeases"):
            async with leased_session("a", leases=store, store=store, create=True):  # pyright: ignore[reportArgumentType]
                pytest.fail("entered")
        with pytest.raises(ValueError, match="store must implement SessionStore"):
            async with leased_session("a", leases=leases, store=leases, create=True):  # pyright: ignore[reportArgumentType]
                pytest.fail("entered")
    finally:
        await connection.aclose()
        sync_client.close()


def test_importing_without_the_redis_package_says_how_to_install_it() -> None:
    code = "import sys; sys.modules['redis'] = None\nimport maf_compaction\nimport maf_compaction.redis"
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "pip install '.[redis]' in a checkout of this project" in result.stderr


def test_a_missing_server_skips_with_how_to_enable_it_and_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    import redis_server
    from maf_compaction.bench.local_redis import ENV_BINARY, RedisServerUnavailable, find_redis_server

    monkeypatch.setenv(ENV_BINARY, "/nonexistent/redis-server")
    with pytest.raises(RedisServerUnavailable) as missing:
        find_redis_server()
    assert "apt-get install redis-server" in str(missing.value)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(
        pytest.skip.Exception, match=r"apt-get install redis-server`, or set MAF_COMPACTION_REDIS_SERVER="
    ):
        redis_server._missing(str(missing.value))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"CI=true: a missing server is a failure"):
        redis_server._missing(str(missing.value))
