"""A real ``redis-server`` for the tests: started once per test session on a free loopback port.

``redis_server_url`` starts ``redis-server --port P --bind 127.0.0.1 --save "" --appendonly no`` as a subprocess,
waits until it answers PING and kills it at the end of the session. ``redis_url`` hands a test that URL after
``FLUSHALL``, so every test starts from an empty server.

The binary is ``$MAF_COMPACTION_REDIS_SERVER`` when set, else ``redis-server`` on ``PATH``. When there is none, the
tests that use the fixture are skipped with a message that says how to enable them; under ``CI=true`` a missing
server fails them instead, so CI never passes without running them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
import redis

ENV_BINARY = "MAF_COMPACTION_REDIS_SERVER"
START_TIMEOUT_S = 10.0


def _binary() -> str | None:
    configured = os.environ.get(ENV_BINARY)
    if configured:
        return configured if Path(configured).is_file() and os.access(configured, os.X_OK) else None
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _missing(reason: str) -> NoReturn:
    message = (
        f"{reason}: the Redis lease and store tests need a real redis-server. Enable them with "
        f"`apt-get install redis-server`, or set {ENV_BINARY}=/path/to/redis-server"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: a missing server is a failure)", pytrace=False)
    pytest.skip(message)


def _start(binary: str, workdir: str) -> tuple[subprocess.Popen[bytes], str]:
    """A server that answers PING, and its URL; tries a few ports in case one is taken meanwhile."""
    last_error = "no attempt"
    for _ in range(3):
        port = _free_port()
        # fmt: off
        command = [
            binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", workdir, "--daemonize", "no", "--loglevel", "warning",
        ]
        # fmt: on
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    if client.ping():
                        return process, url
                except redis.ConnectionError as error:
                    last_error = str(error)
                time.sleep(0.05)
        finally:
            client.close()
        _stop(process)
        output = process.stdout.read().decode(errors="replace") if process.stdout else ""
        last_error = f"{last_error}; exit status {process.returncode}; output: {output.strip()[-500:]}"
    raise RuntimeError(f"redis-server did not answer PING: {last_error}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    """The URL of a redis-server this fixture started (killed at the end of the test session)."""
    binary = _binary()
    if binary is None:
        configured = os.environ.get(ENV_BINARY)
        _missing(f"{ENV_BINARY}={configured} is not an executable file" if configured else "redis-server not found")
    with tempfile.TemporaryDirectory(prefix="maf-compaction-redis-") as workdir:
        process, url = _start(binary, workdir)
        try:
            yield url
        finally:
            _stop(process)
            if process.stdout:
                process.stdout.close()


@pytest.fixture
def redis_url(redis_server_url: str) -> str:
    """The server's URL, emptied (FLUSHALL) before the test."""
    client = redis.Redis.from_url(redis_server_url)
    try:
        client.flushall()
    finally:
        client.close()
    return redis_server_url
