"""A throwaway ``redis-server`` on a free loopback port: for the Redis bench and the tests.

:func:`local_redis_server` starts ``redis-server --port P --bind 127.0.0.1 --save "" --appendonly no`` (nothing is
persisted) in a temporary directory, waits until it answers ``PING`` and kills it when the block ends. The binary is
``$MAF_COMPACTION_REDIS_SERVER`` when set, else ``redis-server`` on ``PATH`` (:func:`find_redis_server`). It talks
to the server over a plain socket, so it needs no Redis client.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

#: The environment variable naming the redis-server binary to use instead of the one on PATH.
ENV_BINARY: Final = "MAF_COMPACTION_REDIS_SERVER"
#: How to get a server when there is none.
HOW_TO_ENABLE: Final = f"`apt-get install redis-server`, or set {ENV_BINARY}=/path/to/redis-server"
START_TIMEOUT_S: Final = 10.0


class RedisServerUnavailable(RuntimeError):
    """There is no redis-server binary to run, or the one there did not start."""


def find_redis_server() -> str:
    """The redis-server binary: ``$MAF_COMPACTION_REDIS_SERVER`` when set, else the one on ``PATH``.

    Raises:
        RedisServerUnavailable: The configured path is not an executable file, or none is on ``PATH``; the message
            says how to get one.
    """
    configured = os.environ.get(ENV_BINARY)
    if configured:
        if Path(configured).is_file() and os.access(configured, os.X_OK):
            return configured
        raise RedisServerUnavailable(f"{ENV_BINARY}={configured} is not an executable file; use {HOW_TO_ENABLE}")
    found = shutil.which("redis-server")
    if found is None:
        raise RedisServerUnavailable(f"redis-server not found on PATH; install it with {HOW_TO_ENABLE}")
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> str:
    """Kill ``process`` if it still runs; its output."""
    if process.poll() is None:
        process.kill()
    output, _ = process.communicate(timeout=10)
    return output.decode(errors="replace").strip()


@contextmanager
def local_redis_server(binary: str | None = None, *, port: int | None = None) -> Iterator[str]:
    """A running redis-server on a free 127.0.0.1 port (or on ``port``) for the block: yields its ``redis://`` URL.

    Tries three free ports, in case another process takes the free one first; a given ``port``
    is tried once (a restart on the port a stopped server used: its clients reconnect).

    Raises:
        RedisServerUnavailable: No binary (see :func:`find_redis_server`), or it did not answer ``PING``.
    """
    binary = binary or find_redis_server()
    with tempfile.TemporaryDirectory(prefix="maf-compaction-redis-") as workdir:
        problem = "no attempt"
        for _ in range(3 if port is None else 1):
            chosen = _free_port() if port is None else port
            # fmt: off
            command = [
                binary, "--port", str(chosen), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", workdir, "--daemonize", "no", "--loglevel", "warning",
            ]
            # fmt: on
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + START_TIMEOUT_S
            while process.poll() is None and time.monotonic() < deadline and not _answers_ping(chosen):
                time.sleep(0.02)
            if process.poll() is None and _answers_ping(chosen):
                try:
                    yield f"redis://127.0.0.1:{chosen}/0"
                finally:
                    _stop(process)
                return
            output = _stop(process)
            problem = f"exit status {process.returncode}, output: {output[-500:] or '(none)'}"
        raise RedisServerUnavailable(f"{binary} did not answer PING on a loopback port: {problem}")
