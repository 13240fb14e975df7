"""A replica for the lease tests: an agent whose turns run on shared sessions under the Redis lease.

``python tests/lease_worker.py URL S1,S2,... NAME TURNS SEED`` plays ``TURNS`` turns as replica ``NAME``, each on a
session drawn at random (seeded) from the list. Each turn holds the lease through ``leased_session``, loads the
session, runs one real ``Agent`` turn (an offline echo client, the framework's ``InMemoryHistoryProvider``), saves
and releases. On entering and leaving a turn it appends ``enter NAME TOKEN TURN`` / ``exit NAME TOKEN TURN`` to the
session's Redis list ``JOURNAL:S``, so the test can prove that no two turns of a session overlapped. It starts when
the test pushes to the ``GO`` list, so the replicas really compete.
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

import redis.asyncio as aioredis
from agent_framework import Agent, BaseChatClient, ChatResponse, InMemoryHistoryProvider, Message
from agent_framework._middleware import ChatMiddlewareLayer
from agent_framework._tools import FunctionInvocationLayer

from maf_compaction.adapters.leases import leased_session
from maf_compaction.redis import RedisSessionLeases, RedisSessionStore

JOURNAL: Final = "test:journal"
READY: Final = "test:ready"
GO: Final = "test:go"


class EchoClient(FunctionInvocationLayer, ChatMiddlewareLayer, BaseChatClient):
    """Answers ``echo: <last user text>`` and keeps the texts of every request it receives."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[list[str]] = []

    def _inner_get_response(self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **_: Any):
        async def respond() -> ChatResponse:
            await self._validate_options(options)
            self.requests.append([m.text for m in messages])
            last_user = next(m.text for m in reversed(messages) if m.role == "user")
            return ChatResponse(messages=[Message("assistant", [f"echo: {last_user}"])], response_id="r")

        return respond()


def make_agent(client: EchoClient) -> Agent:
    """A plain agent that keeps its history in the session through the framework's in-memory history provider."""
    return Agent(client, "You are terse.", context_providers=[InMemoryHistoryProvider()])


async def play(url: str, session_ids: Sequence[str], name: str, turns: int, seed: int) -> None:
    """Play ``turns`` turns as replica ``name``, each on a session drawn from ``session_ids`` (seeded), journaled.

    The journal of session ``S`` is the Redis list ``JOURNAL:S``: ``enter NAME TOKEN TURN`` and ``exit NAME TOKEN
    TURN`` around each turn, ``TOKEN`` being the session's fencing token while this replica holds it.
    """
    rng = random.Random(seed)
    client = aioredis.Redis.from_url(url)
    try:
        leases = RedisSessionLeases(client, ttl_ms=5_000, wait_timeout_s=30.0, poll_interval_ms=2)
        store = RedisSessionStore(client)
        agent = make_agent(EchoClient())
        await client.rpush(READY, name)
        await client.blpop([GO], timeout=30)
        for turn in range(turns):
            session_id = rng.choice(session_ids)
            async with leased_session(session_id, leases=leases, store=store, create=True) as session:
                token = await leases.fencing_token(session_id)
                await client.rpush(f"{JOURNAL}:{session_id}", f"enter {name} {token} {turn}")
                await agent.run(f"{name} turn {turn}", session=session)
                await asyncio.sleep(0.005)  # widen the window an overlap would need
                await client.rpush(f"{JOURNAL}:{session_id}", f"exit {name} {token} {turn}")
    finally:
        await client.aclose()


def main(argv: Sequence[str]) -> int:
    """``URL SESSION_IDS NAME TURNS SEED``, ``SESSION_IDS`` comma-separated."""
    url, session_ids, name, turns, seed = argv
    asyncio.run(play(url, session_ids.split(","), name, int(turns), int(seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
