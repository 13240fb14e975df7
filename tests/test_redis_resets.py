"""Fences that survive a store reset, sessions that vanish loudly, outages as our typed errors (real redis-server).

Found by a hostile host: after ``FLUSHALL`` or a restart without persistence the fencing
counter restarted at 1, so a holder that lost its lease to the reset (token 1) saved over a
later holder that got token 1 again; the session came back empty with no warning; a Redis
outage surfaced as ``redis.exceptions.ConnectionError``.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from lease_worker import EchoClient, make_agent
from maf_compaction import (
    SessionLeaseError,
    SessionPayloadError,
    SessionStoreError,
    SessionVanishedError,
    StaleLeaseError,
    leased_session,
)
from maf_compaction.adapters.leases import HeldLease
from maf_compaction.bench.local_redis import RedisServerUnavailable, find_redis_server, local_redis_server
from maf_compaction.redis import RedisSessionLeases, RedisSessionStore
from redis_server import _missing  # pyright: ignore[reportPrivateUsage]

SID = "conversation-1"


@pytest.fixture
def client(redis_client: aioredis.Redis) -> aioredis.Redis:
    return redis_client


@pytest.fixture
def redis_binary() -> str:
    """The redis-server binary, for a test that starts (and restarts) its own server: skipped like the fixtures'
    tests when there is none (a failure under ``CI=true``)."""
    try:
        return find_redis_server()
    except RedisServerUnavailable as missing:
        _missing(str(missing))


def payload(writer: str) -> dict[str, object]:
    return {"type": "session", "session_id": SID, "state": {"writer": writer}}


async def writer(store: RedisSessionStore, lease: HeldLease) -> object:
    loaded = await store.load(SID, lease)
    assert loaded is not None
    return loaded["state"]["writer"]  # type: ignore[index]


# --- fences that never go back ---------------------------------------------------------------------------


@pytest.mark.parametrize("reset", ["flushall", "counter-rolled-back"])
async def test_a_holder_whose_lease_was_lost_to_a_reset_never_saves_over_a_later_holder(
    client: aioredis.Redis, reset: str
) -> None:
    """A holds the session; the store is reset (FLUSHALL) or rolled back to an older snapshot (its counter goes
    back); B acquires and saves; A's late save is refused, and B's payload stays."""
    leases, store = RedisSessionLeases(client, ttl_ms=60_000), RedisSessionStore(client)
    async with leases.hold(SID) as first:
        await store.save(SID, payload("first"), first)
    older_counter = await client.get(f"maf_compaction:fence:{{{SID}}}")
    assert older_counter is not None
    a = leases.hold(SID)
    lease_a = await a.__aenter__()
    try:
        if reset == "flushall":
            await client.flushall()
        else:  # a restore from the snapshot taken before A acquired: the lease is gone, the counter is older
            await client.set(f"maf_compaction:fence:{{{SID}}}", older_counter)
            await client.delete(f"maf_compaction:lease:{{{SID}}}")
        with pytest.raises(StaleLeaseError) as lost:  # nobody holds it yet: A's save is refused already
            await store.save(SID, payload("A (stale)"), lease_a)
        # The finding: this said "another holder acquired the session" when none had.
        assert "the store lost or rolled back the session's fence while this lease was held" in str(lost.value)
        assert "another holder" not in str(lost.value)
        async with leases.hold(SID) as lease_b:
            assert lease_b.token > lease_a.token, "the fencing token went back after the reset"
            await store.save(SID, payload("B"), lease_b)
        with pytest.raises(StaleLeaseError) as refused:
            await store.save(SID, payload("A (stale)"), lease_a)
        assert "so another holder acquired the session after this lease" in str(refused.value)
        assert refused.value.token == lease_a.token
        assert refused.value.newest == lease_b.token
        assert await writer(store, HeldLease(SID, lease_b.token)) == "B"
    finally:
        await a.__aexit__(None, None, None)


async def test_tokens_keep_rising_across_a_restart_without_persistence(redis_binary: str) -> None:
    """A real restart of redis-server (no persistence) on the same port: the new holder's token is greater than
    the old one's, the old holder's save is refused, and a continued session is reported as vanished."""
    binary = redis_binary
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = None
    try:
        with local_redis_server(binary, port=port) as url:
            client = aioredis.Redis.from_url(url)
            leases, store = RedisSessionLeases(client, ttl_ms=60_000), RedisSessionStore(client)
            agent = make_agent(EchoClient())
            async with leased_session(SID, leases=leases, store=store, create=True) as session:
                await agent.run("turn 0", session=session)
            stale = HeldLease(SID, await leases.fencing_token(SID))
        with local_redis_server(binary, port=port):  # restarted: everything is gone
            await client.connection_pool.disconnect()  # the old connections died with the server
            with pytest.raises(SessionVanishedError, match="not in the session store") as vanished:
                async with leased_session(SID, leases=leases, store=store, create=False):
                    pytest.fail("a vanished session was continued")
            assert vanished.value.token > stale.token
            async with leased_session(
                SID, leases=leases, store=store, create=True
            ) as session:  # started over on purpose
                await agent.run("turn 0 again", session=session)
            assert await leases.fencing_token(SID) > stale.token
            with pytest.raises(StaleLeaseError):
                await store.save(SID, payload("stale"), stale)
    finally:
        if client is not None:
            await client.aclose()


# --- a session that vanished with the store ----------------------------------------------------------------


async def test_a_session_that_vanished_with_the_store_is_reported_not_recreated_empty(client: aioredis.Redis) -> None:
    leases, store = RedisSessionLeases(client, wait_timeout_s=0), RedisSessionStore(client)
    agent = make_agent(EchoClient())
    async with leased_session(SID, leases=leases, store=store, create=True) as session:  # the first turn creates it
        await agent.run("turn 0", session=session)
    async with leased_session(SID, leases=leases, store=store, create=False) as session:
        await agent.run("turn 1", session=session)
    await client.flushall()
    with pytest.raises(SessionVanishedError) as vanished:
        async with leased_session(SID, leases=leases, store=store):  # the default: continue, never start over
            pytest.fail("a vanished session was continued")
    assert isinstance(vanished.value, SessionLeaseError)
    assert vanished.value.session_id == SID
    assert await store.load(SID, HeldLease(SID, 1)) is None, "the refused turn wrote"
    async with leases.hold(SID):  # the lease was released (wait_timeout_s=0 would raise otherwise)
        pass
    with pytest.raises(ValueError, match="create must be True or False"):
        async with leased_session(SID, leases=leases, store=store, create=1):  # pyright: ignore[reportArgumentType]
            pass


async def test_by_default_a_session_is_continued_never_started_over_empty(client: aioredis.Redis) -> None:
    """``create`` is false unless given: the store losing a session (as src/redis.py's example runs it, with no
    ``create``) is reported on the next turn, and a new session needs ``create=True`` on its first turn."""
    leases, store = RedisSessionLeases(client, wait_timeout_s=0), RedisSessionStore(client)
    agent = make_agent(EchoClient())
    with pytest.raises(SessionVanishedError, match="use create=True for a session's first turn"):
        async with leased_session("new", leases=leases, store=store):
            pytest.fail("a session nobody created was started")
    async with leased_session(SID, leases=leases, store=store, create=True) as session:
        await agent.run("turn 0", session=session)
    async with leased_session(SID, leases=leases, store=store) as session:
        await agent.run("turn 1", session=session)
        assert len(session.state) > 0, "the second turn did not see the first"
    await client.flushall()  # the store loses everything between turns
    with pytest.raises(SessionVanishedError, match="the store lost it"):
        async with leased_session(SID, leases=leases, store=store):
            pytest.fail("a session the store lost was started over empty")
    assert await store.load(SID, HeldLease(SID, 1)) is None, "the refused turn wrote"


# --- outages -----------------------------------------------------------------------------------------------------


def _dead_url() -> str:
    with socket.socket() as probe:  # a port nobody listens on (bound, then released)
        probe.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{probe.getsockname()[1]}/0"


async def test_an_unreachable_store_raises_our_typed_error_with_the_cause_attached(client: aioredis.Redis) -> None:
    dead = aioredis.Redis.from_url(_dead_url(), socket_connect_timeout=0.5)
    try:
        with pytest.raises(SessionStoreError, match="acquiring the lease") as acquiring:
            async with leased_session(SID, leases=RedisSessionLeases(dead), store=RedisSessionStore(dead), create=True):
                pytest.fail("entered without a store")
        assert isinstance(acquiring.value.__cause__, (RedisError, OSError))
        with pytest.raises(SessionStoreError, match="reading the fencing token"):
            await RedisSessionLeases(dead).fencing_token(SID)
        # The lease engine is up, the store is down: loading and saving raise our error.
        leases, down = RedisSessionLeases(client), RedisSessionStore(dead)
        async with leases.hold(SID) as lease:
            with pytest.raises(SessionStoreError, match="loading the session") as loading:
                await down.load(SID, lease)
            with pytest.raises(SessionStoreError, match="saving the session") as saving:
                await down.save(SID, payload("x"), lease)
        for raised in (loading, saving):
            assert isinstance(raised.value.__cause__, (RedisError, OSError))
            assert raised.value.session_id == SID
    finally:
        await dead.aclose()


async def test_a_store_that_goes_down_mid_turn_fails_the_save_with_our_error(redis_url: str) -> None:
    """The server stops between load and save: the turn's save raises SessionStoreError, not a redis error."""
    binary = find_redis_server()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = None
    try:
        with local_redis_server(binary, port=port) as url:
            client = aioredis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=2)
            leases, store = RedisSessionLeases(client, ttl_ms=2_000), RedisSessionStore(client)
            turn = leased_session(SID, leases=leases, store=store, create=True)
            session = await turn.__aenter__()
        with pytest.raises(SessionStoreError, match="saving the session"):
            await turn.__aexit__(None, None, None)
        assert session.session_id == SID
    finally:
        if client is not None:
            await client.aclose()
    await asyncio.sleep(0)


# --- what another writer (or a hostile one) left in Redis: typed errors, never a bare ValueError or RecursionError ---


NOT_A_NUMBER = r"fencing token in Redis is not a whole number \('not-a-number'\)"


async def test_a_fence_that_is_not_a_number_is_a_typed_error_naming_the_way_out(client: aioredis.Redis) -> None:
    """The finding: a non-numeric fence raised a bare ValueError (from the token read, or from the save script's
    truncated reply); acquiring failed as an outage. Now each names the key's problem and the way out."""
    leases, store = RedisSessionLeases(client, ttl_ms=60_000), RedisSessionStore(client)
    fence = f"maf_compaction:fence:{{{SID}}}"
    async with leases.hold(SID) as lease:
        await store.save(SID, payload("first"), lease)
        await client.set(fence, "not-a-number")
        with pytest.raises(SessionPayloadError, match=NOT_A_NUMBER):
            await store.save(SID, payload("second"), lease)
        with pytest.raises(SessionPayloadError, match=NOT_A_NUMBER):
            await leases.fencing_token(SID)
    with pytest.raises(SessionPayloadError, match=NOT_A_NUMBER):
        await leases.hold(SID).__aenter__()
    assert await client.get(f"maf_compaction:lease:{{{SID}}}") is None  # refused before the lease was taken
    assert await writer(store, HeldLease(SID, lease.token)) == "first"  # nothing written
    await client.delete(fence)  # the way out the message names: the next token still rises
    async with leases.hold(SID) as later:
        assert later.token > lease.token
        await store.save(SID, payload("second"), later)


@pytest.mark.parametrize(
    ("stored", "problem"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply to load"),
        ('{"type": "session", "state": {"x": NaN}}', "NaN is not a JSON number"),
        ('{"type": "session", "state": {"x": -Infinity}}', "-Infinity is not a JSON number"),
    ],
    ids=["deep", "nan", "infinity"],
)
async def test_a_stored_payload_that_a_later_save_could_not_write_back_is_refused_on_load(
    client: aioredis.Redis, stored: str, problem: str
) -> None:
    """The findings: a deeply nested payload raised RecursionError; a NaN loaded, then every later save failed."""
    leases, store = RedisSessionLeases(client, ttl_ms=60_000), RedisSessionStore(client)
    await client.set(f"maf_compaction:session:{{{SID}}}", stored)
    async with leases.hold(SID) as lease:
        with pytest.raises(SessionPayloadError, match=problem):
            await store.load(SID, lease)


async def test_a_payload_nested_too_deeply_to_serialize_is_refused_before_anything_is_written(
    client: aioredis.Redis,
) -> None:
    leases, store = RedisSessionLeases(client, ttl_ms=60_000), RedisSessionStore(client)
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    async with leases.hold(SID) as lease:
        with pytest.raises(SessionPayloadError, match="nested too deeply to serialize"):
            await store.save(SID, {"type": "session", "state": {"x": deep}}, lease)
    assert await client.get(f"maf_compaction:session:{{{SID}}}") is None
