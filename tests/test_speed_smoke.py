"""Smoke test of the speed benchmark: it runs end to end and writes every figure.

No timing is asserted; the benchmark's figures are for people to read.
"""

from __future__ import annotations

import json
from pathlib import Path

from maf_compaction.bench import speed


def test_speed_benchmark_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "s.json"

    status = speed.main(["--sizes", "40", "--repeats", "2", "--json", str(out)])

    assert status == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["benchmark"] == "speed"
    assert data["warm_repeats"] == 2
    assert [w["size"] for w in data["workloads"]] == [40]
    assert data["workloads"][0]["budget"] < data["workloads"][0]["tokens"]
    rows = {(r["strategy"], r["mode"]): r for r in data["results"]}
    assert set(rows) == {(name, mode) for name in speed.STRATEGIES for mode in speed.MODES}
    for row in rows.values():
        assert row["size"] == 40
        assert len(row["samples_ms"]) == row["repeats"] == 2
        assert len(row["strategy_samples_ms"]) == 2
        assert 0 <= row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert row["messages_per_ms"] > 0
    # Both real strategies compacted: fewer messages reach the model than were given.
    assert rows[(speed.OURS, speed.COLD)]["messages_out"] < 40
    assert rows[(speed.FRAMEWORK, speed.COLD)]["messages_out"] < 40
    assert rows[(speed.BASELINE, speed.COLD)]["messages_out"] == 40
    # A single size measures no growth and cannot judge the 1,600-message targets.
    assert data["growth"] == []
    assert {t["kind"] for t in data["targets"]} == {"issue", "context"}
    assert all(t["met"] is None for t in data["targets"])


def test_history_is_deterministic_and_realistic() -> None:
    first, second = speed.build_history(8), speed.build_history(8)

    assert [m.message_id for m in first] == [m.message_id for m in second]
    assert [m.text for m in first] == [m.text for m in second]
    assert [str(m.role) for m in first] == ["user", "assistant", "tool", "assistant"] * 2
    result = first[2].contents[0].result
    assert isinstance(result, str)
    assert len(result) >= 300
    assert "code_1_1=TL-" in result  # a code the scenario generator planted in lookup 1
    assert any(c.type == "text_reasoning" and c.protected_data for c in first[5].contents)
