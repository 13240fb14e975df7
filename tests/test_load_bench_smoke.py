"""``bench load`` runs end to end on a tiny size: every configuration, its checks, the table and the JSON.

Speed figures come from the bench itself (docs/sessions-bench.md); this only proves the command measures what it
says (each session holds its turns, the registry's entry is in each registry session) and reports every row.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_framework import AgentSession

from maf_compaction.bench import load
from maf_compaction.bench.__main__ import main as bench_main


def test_the_load_bench_reports_every_configuration_in_one_run(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "load.json"
    args = ["load", "--sessions", "3", "--turns", "2", "--repeats", "2", "--redis-url", redis_url, "--json", str(out)]
    assert bench_main(args) == 0
    printed = capsys.readouterr().out
    for configuration in load.CONFIGURATIONS:
        assert f"\n{configuration} " in printed
    document = json.loads(out.read_text())
    assert sorted({r["configuration"] for r in document["runs"]}) == sorted(load.CONFIGURATIONS)
    assert len(document["runs"]) == 2 * len(load.CONFIGURATIONS)
    assert all(r["turns_per_s"] > 0 and r["sessions"] == 3 and r["turns"] == 2 for r in document["runs"])
    baselines = {row["configuration"]: row["of_baseline"] for row in document["summary"]}
    assert baselines["baseline"] == baselines["baseline+redis"] == 1.0


def test_without_redis_only_the_in_memory_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert load.main(["--sessions", "2", "--turns", "1", "--repeats", "1", "--no-redis"]) == 0
    printed = capsys.readouterr().out
    assert "\nregistry " in printed
    assert "+redis " not in printed.split("(a +redis")[0]


async def test_a_run_that_loses_a_turn_is_refused() -> None:
    """The check the bench runs after each run fails when a session lacks its turns or the registry's entry."""
    session = AgentSession(session_id="s")
    with pytest.raises(AssertionError, match="holds 0 messages"):
        load._check("baseline", session, 1, None)  # pyright: ignore[reportPrivateUsage]
    run = await load.run_once("registry", sessions=1, turns=1, redis_url=None, prefix="t")
    assert run.turns_per_second > 0


@pytest.mark.parametrize("option", ["--sessions", "--turns", "--repeats"])
def test_sizes_below_one_are_refused(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load.main([option, "0", "--no-redis"])
    assert f"{option} must be an integer >= 1" in capsys.readouterr().err
