"""Smoke test of the session registry benchmark: it runs end to end, in its regimes, and writes every figure.

No timing is asserted; the benchmark's figures are for people to read. What is asserted
is that each row ran the regime it names (the registry's own build and restore counters
over the timed phases), that the played sessions hold real state, and the Redis hook.
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from maf_compaction.bench import __main__ as bench_main
from maf_compaction.bench import sessions

SIZES = (2, 3)
MIN_PHASES = 6


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sessions-bench") / "s.json"
    status = sessions.main(
        [
            "--sessions",
            ",".join(map(str, SIZES)),
            "--min-phases",
            str(MIN_PHASES),
            "--pass-repeats",
            "2",
            "--fill",
            "1.5",
            "--json",
            str(out),
        ]
    )
    assert status == 0
    data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return data


def test_every_row_is_written_and_ran_its_regime(report: dict[str, Any]) -> None:
    assert report["benchmark"] == "sessions"
    rows = {(r["kind"], r["sessions"], r["regime"]): r for r in report["results"]}
    assert set(rows) == {(k, n, g) for k in sessions.KINDS for n in SIZES for g in sessions.REGIMES}
    for (_, size, regime), row in rows.items():
        # Whole rounds over the sessions, at least MIN_PHASES phases.
        assert row["phases"] >= MIN_PHASES
        assert row["phases"] % size == 0
        assert len(row["read_us"]) == len(row["write_us"]) == len(row["cpu_us"]) == len(row["gc_us"]) == row["phases"]
        assert all(value > 0 for value in row["read_us"] + row["write_us"] + row["cpu_us"])
        # Collection time is part of the phase it ran in.
        assert all(0 <= gc <= r + w for gc, r, w in zip(row["gc_us"], row["read_us"], row["write_us"], strict=True))
        assert (row["collections"] == 0) == (row["gc_share"] == 0)
        for name in ("phase", "cpu", "read", "write"):
            assert 0 < row[f"{name}_median_us"] <= row[f"{name}_p95_us"]
        assert row["as_intended"] is True
        if regime == sessions.MISS:
            assert row["max_cached_sessions"] == size // 2
            assert row["stacks_built"] == row["states_restored"] == row["phases"]
        else:
            assert row["max_cached_sessions"] == size
            assert row["stacks_built"] == 0
        if regime == sessions.HIT:
            assert row["states_restored"] == 0


def test_the_played_sessions_hold_real_state(report: dict[str, Any]) -> None:
    played = {item["kind"]: item for item in report["played"]}
    assert set(played) == set(sessions.KINDS)
    for item in played.values():
        assert item["model_calls"] > item["turns"] > 0
        assert item["contents"]["records_seen"] > 0
        assert 0 < item["state_bytes"] < item["session_bytes"]
    # The composition remembers the summarizer's answers; the record strategy alone has no summarizer.
    assert played["composition"]["summarizer_calls"] > 0
    assert played["composition"]["contents"]["remembered_summaries"] > 0
    assert played["records"]["summarizer_calls"] == 0
    assert played["records"]["contents"]["remembered_summaries"] == 0


def test_the_warm_pass_is_timed_without_a_summarizer_call(report: dict[str, Any]) -> None:
    passes = {item["kind"]: item for item in report["passes"]}
    assert set(passes) == set(sessions.KINDS)
    for item in passes.values():
        assert len(item["samples_us"]) == 2
        assert item["messages"] > 0
        assert item["summarizer_calls"] == 0
        assert item["state_unchanged"] is True


def test_the_state_counts_come_from_the_entry() -> None:
    entry = {
        "kind": "session_compaction",
        "version": 1,
        "strategy": "composition",
        "state": {
            "records": {"settled": [4, 5], "ask": {"targets": [6]}},
            "recall": {"seen": {"records": 3}},
            "fallback": {"tools_shed": 1, "texts_shed": 2},
            # Two summarizer answers and a description (the user half's), one replacement (the chain's) and a
            # record written over the cached prefix (the record half's: counted in none of these).
            "answers": [
                {"kind": "summary"},
                {"kind": "fold"},
                {"kind": "media"},
                {"kind": "merge"},
                {"kind": "record"},
            ],
            "chain": {
                "wait_since": 7,
                "declined_behind": None,
                "shed": {"tools_shed": 2, "texts_shed": 0},
            },
        },
    }
    assert sessions.state_contents(entry) == {
        "records_seen": 3,
        "settled_groups": 2,
        "outstanding_asks": 1,
        "remembered_summaries": 3,
        "chain_decisions": 4,
        "fallback_sheds": 3,
    }


def test_the_command_is_listed() -> None:
    assert bench_main.COMMANDS["sessions"][0] == "sessions"


@pytest.mark.parametrize("text", ["1", "0,10", "ten", ""])
def test_a_session_count_below_two_is_refused(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        sessions.main(["--sessions", text])
    assert exit_info.value.code == 2
    assert "--sessions" in capsys.readouterr().err


def test_percentile_is_nearest_rank() -> None:
    samples = [float(n) for n in range(1, 101)]
    assert sessions.percentile(samples, 0.95) == 95.0
    assert sessions.percentile(samples, 0.5) == 50.0
    assert sessions.percentile([3.0], 0.95) == 3.0


def test_a_json_path_without_a_directory_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(sessions, "play", no_work)
    for target in (tmp_path, tmp_path / "missing" / "s.json"):
        assert sessions.main(["--sessions", "2", "--json", str(target)]) == 2
        assert f"--json {target}: give a file name in an existing directory" in capsys.readouterr().err


# -- the Redis hook ------------------------------------------------------------------------------


def test_without_the_redis_module_redis_url_is_refused_before_any_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, sessions.REDIS_MODULE, None)  # an import of it fails as if absent

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(sessions, "play", no_work)
    assert sessions.main(["--sessions", "2", "--redis-url", "redis://127.0.0.1:1"]) == 2
    assert f"this build has no {sessions.REDIS_MODULE}" in capsys.readouterr().err


def test_the_redis_hook_calls_redis_round_trip_per_session_count(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int, int]] = []

    async def redis_round_trip(url: str, *, sessions: int, repeats: int) -> Mapping[str, Any]:
        calls.append((url, sessions, repeats))
        return {"url": url, "payload_bytes": 100, "phases": {"round_trip": {"median_ms": 0.5, "p95_ms": 0.9}}}

    module = types.ModuleType(sessions.REDIS_MODULE)
    module.redis_round_trip = redis_round_trip  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, sessions.REDIS_MODULE, module)

    function = sessions.load_redis_round_trip()
    assert function is redis_round_trip
    assert function is not None
    url = "redis://127.0.0.1:6399"
    results = asyncio.run(sessions.redis_figures(function, url, [10, 100], 30))
    # Whole rounds over the sessions making at least 30 round trips.
    assert calls == [(url, 10, 3), (url, 100, 1)]
    assert [r["sessions"] for r in results] == [10, 100]
    assert results[0]["phases"] == {"round_trip": {"median_ms": 0.5, "p95_ms": 0.9}}
    text = sessions.render_redis(results)
    assert f"10 sessions: url {url}, payload_bytes 100" in text
    assert "phases.round_trip: median_ms 0.500, p95_ms 0.900" in text
