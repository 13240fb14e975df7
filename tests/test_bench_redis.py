"""The Redis round-trip bench (``python -m maf_compaction.bench redis``), small, against the test redis-server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from agent_framework import AgentSession, Message

from maf_compaction.bench.__main__ import main as bench_main
from maf_compaction.bench.sessions_redis import PHASES, redis_round_trip, session_payload


def test_the_session_payload_is_a_real_session_of_the_asked_size() -> None:
    session = session_payload("s", messages=200, state_kb=4)
    restored = AgentSession.from_dict(json.loads(json.dumps(session.to_dict())))
    history = restored.state["in_memory"]["messages"]
    assert len(history) == 200
    assert all(isinstance(m, Message) for m in history)
    assert [m.role for m in history[:4]] == ["user", "assistant", "tool", "assistant"]
    assert 4 * 1_024 <= len(json.dumps(restored.state["maf_compaction"])) < 6 * 1_024
    with pytest.raises(ValueError, match="messages must be an integer >= 1"):
        session_payload("s", messages=0, state_kb=4)


async def test_round_trip_times_every_phase_and_leaves_no_key(redis_url: str) -> None:
    result = await redis_round_trip(redis_url, sessions=2, repeats=3, messages=12, state_kb=1)
    assert set(result["phases"]) == set(PHASES)
    for phase, figures in result["phases"].items():
        assert figures["n"] == 6, phase
        assert 0 < figures["median_ms"] <= figures["p95_ms"] <= figures["max_ms"], phase
    phases = result["phases"]
    # Each round trip is the sum of its phases, and each load contains its decode: so are the order statistics.
    for part in ("acquire", "load", "save", "release"):
        assert phases["round_trip"]["median_ms"] >= phases[part]["median_ms"]
    assert phases["load"]["median_ms"] >= phases["decode"]["median_ms"]
    assert phases["save"]["median_ms"] >= phases["encode"]["median_ms"]
    assert phases["round_trip"]["median_ms"] >= phases["excl_codec"]["median_ms"]
    assert result["payload_bytes"] > 1_024
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.dbsize() == 0
    finally:
        client.close()
    with pytest.raises(ValueError, match="sessions must be an integer >= 1"):
        await redis_round_trip(redis_url, sessions=0)


def test_the_command_prints_the_table_and_writes_json(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "redis.json"
    argv = ["redis", "--url", redis_url, "--sessions", "1", "--repeats", "2", "--messages", "8", "--json", str(out)]
    assert bench_main(argv) == 0
    table = capsys.readouterr().out
    assert "round_trip" in table
    assert "1 sessions x 2 repeats" in table
    assert json.loads(out.read_text())["phases"]["round_trip"]["n"] == 2


def test_without_a_url_the_command_starts_its_own_server(
    redis_server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Needs the binary the fixture found (skipped, or failed under CI, without one); a second server is started.
    assert bench_main(["redis", "--sessions", "1", "--repeats", "1", "--messages", "4", "--state-kb", "0"]) == 0
    assert f"on {redis_server_url}" not in capsys.readouterr().out


def test_without_the_redis_client_the_command_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "from maf_compaction.bench.__main__ import main\n"
        "sys.exit(main(['redis']))"
    )
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "pip install '.[redis]' in a checkout of this project" in result.stderr
    assert "maf-compaction[redis]" not in result.stderr
