"""A replica for the lease tests: an agent whose turns run on a shared session under the Redis lease.

``python tests/lease_worker.py URL SESSION_ID NAME TURNS`` plays ``TURNS`` turns of session ``SESSION_ID`` as replica
``NAME``. Each turn holds the lease through ``leased_session``, loads the session, runs one real ``Agent`` turn (an
offline echo client, the framework's ``InMemoryHistoryProvider``), saves and releases. On entering and leaving a
turn it appends ``enter NAME TOKEN`` / ``exit NAME TOKEN`` to the Redis list ``JOURNAL``, so the test can prove that
no two turns overlapped. It starts when the test pushes to the ``GO`` list, so two replicas really compete.
"""

from __future__ import annotations

import asyncio
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


async def play(url: str, session_id: str, name: str, turns: int) -> None:
    """Play ``turns`` turns of ``session_id`` as replica ``name``, journaling each turn's lease token."""
    client = aioredis.Redis.from_url(url)
    try:
        leases = RedisSessionLeases(client, ttl_ms=5_000, wait_timeout_s=30.0, poll_interval_ms=2)
        store = RedisSessionStore(client)
        agent = make_agent(EchoClient())
        await client.rpush(READY, name)
        await client.blpop([GO], timeout=30)
        for turn in range(turns):
            async with leased_session(session_id, leases=leases, store=store) as session:
                token = await leases.fencing_token(session_id)
                await client.rpush(JOURNAL, f"enter {name} {token}")
                await agent.run(f"{name} turn {turn}", session=session)
                await asyncio.sleep(0.005)  # widen the window an overlap would need
                await client.rpush(JOURNAL, f"exit {name} {token}")
    finally:
        await client.aclose()


def main(argv: Sequence[str]) -> int:
    url, session_id, name, turns = argv
    asyncio.run(play(url, session_id, name, int(turns)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
