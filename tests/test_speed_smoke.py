"""Smoke test of the speed benchmark: it runs end to end and writes every figure.

No timing is asserted; the benchmark's figures are for people to read.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from maf_compaction import ToolResultAnchoredSummarizationCompactionStrategy
from maf_compaction.bench import speed
from maf_compaction.core.records import RECALL_TOOL_NAME, RECORD_RECEIPT
from maf_compaction.core.values import distinctive_values, words


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
        assert row["summarizer_calls"] >= 0
    # Every real strategy compacted: fewer messages reach the model than were given.
    for name in (speed.OURS, speed.RECORDS, speed.COMPOSED, speed.FRAMEWORK):
        assert rows[(name, speed.COLD)]["messages_out"] < 40, name
    assert rows[(speed.BASELINE, speed.COLD)]["messages_out"] == 40
    assert set(data["strategies"]) == set(speed.STRATEGIES)
    # A single size measures no growth and cannot judge the 1,600-message targets.
    assert data["growth"] == []
    assert {t["kind"] for t in data["targets"]} == {"issue", "context"}
    assert all(t["met"] is None for t in data["targets"])
    # One verdict per strategy of ours against the framework's warm pass.
    versus = [t for t in data["targets"] if t["kind"] == "issue" and "strategy" in t]
    assert [t["strategy"] for t in versus] == list(speed.RACED)


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


def test_the_history_carries_records_that_the_record_strategy_applies() -> None:
    history = speed.build_history(4 * speed.RECORD_EVERY)
    record = history[-2]  # the last turn is the first record: the tool's receipt, the record in its call
    assert record.contents[0].result == RECORD_RECEIPT
    call = history[-3].contents[0]
    assert call.name == RECALL_TOOL_NAME
    # It quotes every value of the lookups before it but one.
    arguments = call.parse_arguments()
    assert arguments is not None
    quoted = set(words(str(arguments["values"])))
    lookups = [history[4 * turn + 2].contents[0].result for turn in range(speed.RECORD_EVERY - 1)]
    unquoted = [turn for turn, text in enumerate(lookups) if not set(distinctive_values(str(text))) <= quoted]
    assert unquoted == [speed.UNRECORDED_IN_BATCH]
    tokenizer = speed.load_tokenizer("chars")
    strategy = speed.make_strategy(speed.RECORDS, 1_000_000, tokenizer)
    assert isinstance(strategy, ToolResultAnchoredSummarizationCompactionStrategy)
    asyncio.run(strategy(history))
    # Lookup 1 is in the head (three groups), and one lookup is left out of the record.
    assert strategy.groups_covered == speed.RECORD_EVERY - 3
    assert strategy.groups_kept_uncovered == 1
