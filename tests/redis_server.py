"""A real ``redis-server`` for the tests: started once per test session on a free loopback port.

``redis_server_url`` starts ``redis-server --port P --bind 127.0.0.1 --save "" --appendonly no`` as a subprocess
(``maf_compaction.bench.local_redis``), which answers PING before the fixture yields its URL, and kills it at the end
of the test session. ``redis_url`` hands a test that URL after ``FLUSHALL``, so every test starts from an empty
server; ``redis_client`` an asyncio client connected to it.

The binary is ``$MAF_COMPACTION_REDIS_SERVER`` when set, else ``redis-server`` on ``PATH``. When there is none, the
tests that use the fixture are skipped with a message that says how to enable them; under ``CI=true`` a missing
server fails them instead, so CI never passes without running them.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import NoReturn

import pytest
import redis
import redis.asyncio as aioredis

from maf_compaction.bench.local_redis import RedisServerUnavailable, find_redis_server, local_redis_server


def _missing(reason: str) -> NoReturn:
    message = f"the Redis lease and store tests need a real redis-server: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: a missing server is a failure)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    """The URL of a redis-server this fixture started (killed at the end of the test session)."""
    try:
        binary = find_redis_server()
    except RedisServerUnavailable as missing:
        _missing(str(missing))
    with local_redis_server(binary) as url:
        yield url


@pytest.fixture
def redis_url(redis_server_url: str) -> str:
    """The server's URL, emptied (FLUSHALL) before the test."""
    client = redis.Redis.from_url(redis_server_url)
    try:
        client.flushall()
    finally:
        client.close()
    return redis_server_url


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """An asyncio client of the emptied server, closed after the test."""
    connection = aioredis.Redis.from_url(redis_url)
    try:
        yield connection
    finally:
        await connection.aclose()
