"""The bench's plausible model (EVALUATION.md, "Scripted model"): how it writes, what it loses, what it costs.

It copies values by a generic rule (not the workload's pattern), opens each record and summary with prose,
stops at an answer length, loses what models lose (drawn from the seed and the request), reasons on every call,
and its provider's cache expires across a user's think time.
"""

from __future__ import annotations

import asyncio
import statistics

import pytest
from agent_framework import Content, Message

from maf_compaction.bench import runner
from maf_compaction.bench.model import ModelOptions, ScriptedModel, read_instruction
from maf_compaction.bench.provider import TASK, SimulatedProvider, default_ttl
from maf_compaction.bench.rendering import RenderedRequest
from maf_compaction.bench.runner import SPEND, Cell, Settings, play_cell
from maf_compaction.bench.scenario import (
    LOOKUP_TOOL,
    GeneratorOptions,
    Scenario,
    ToolSpec,
    Turn,
    generate,
    think_seconds,
)
from maf_compaction.bench.simulator import AnthropicCache, OpenAICache, get_profile
from maf_compaction.bench.stdlib_reads import TOOLS, reads
from maf_compaction.bench.writer import (
    Losses,
    PlausibleWriter,
    Source,
    candidates,
    miscopied,
    read,
    requirement_lines,
)
from offline_tokenizers import offline_tiktoken

TOKENIZER = offline_tiktoken()
SCRIPT = Scenario("script", "", (ToolSpec(LOOKUP_TOOL, "lookup"),), (Turn("first", reply="done"),))


@pytest.fixture(autouse=True)
def _offline_bench_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_tokenizer", lambda: TOKENIZER)


def _results(*texts: str) -> list[Message]:
    context = [Message("user", ["first"])]
    for number, text in enumerate(texts):
        call_id = f"call_1_{number}"
        context += [
            Message("assistant", [Content.from_function_call(call_id, LOOKUP_TOOL, arguments={"n": number})]),
            Message("tool", [Content.from_function_result(call_id, result=text)]),
        ]
    return context


# --- the generic value rule --------------------------------------------------------------------------------


def test_the_value_rule_takes_key_value_pairs_numbers_with_units_and_identifier_like_tokens() -> None:
    line = "INC-4821 paged pager-72 at 2026-11-03: owner=ops-team latency 345 ms, see Lib/heapq.py and _siftdown_max"
    assert [c.text for c in candidates(line)] == [
        "INC-4821",
        "pager-72",
        "2026-11-03",
        "owner=ops-team",
        "345 ms",
        "Lib/heapq.py",
        "_siftdown_max",
    ]
    assert candidates("the rollout goes region by region, never more than one shard at a time") == []


def test_a_field_that_repeats_down_a_result_is_told_as_a_range_not_copied() -> None:
    log = "\n".join(f"{n:05d} eu-west-{n % 2 + 1} took={n * 7}ms code_{n}=TL-{n:06X}" for n in range(40))
    reading = read(log)
    assert any(c.startswith("the values in word 1 of each line run from 00000 to 00039") for c in reading.columns)
    assert any(c.startswith("took run from") for c in reading.columns)
    copied = {c.text for c in reading.values}
    assert {"eu-west-1", "eu-west-2"} <= copied  # few distinct values: listed
    assert "code_7=TL-000007" in copied  # a key of its own on each line: no column
    assert not any(v.startswith("took=") for v in copied)


def test_requirement_lines_are_directives_and_the_list_under_one() -> None:
    text = "Requirements for this session:\n- R1: rollouts go region by region.\n- R2: reports are daily.\n\nHello."
    assert requirement_lines(text) == [
        "Requirements for this session:",
        "- R1: rollouts go region by region.",
        "- R2: reports are daily.",
    ]
    assert requirement_lines("Correction: R2 now goes weekly, not daily.") == [
        "Correction: R2 now goes weekly, not daily."
    ]
    assert requirement_lines("Note 4: a service shard drain window.") == []


# --- records and summaries ---------------------------------------------------------------------------------


def test_a_record_opens_with_prose_per_result_then_copies_a_users_own_values() -> None:
    """Values in a format no bench pattern knows (ticket ids, pager names) are copied, after prose."""
    tickets = [f"ticket INC-{4100 + n} escalated to pager-7{n}\nstate=open\nnothing else of note" for n in range(3)]
    model = ScriptedModel(SCRIPT, ModelOptions().without_losses())
    record = model.record(_results(*tickets))
    prose, _, values = record.partition("\n")
    assert TOKENIZER.count_tokens(prose) >= 3 * 30  # a sentence or more per result covered
    for n in range(3):
        assert f"INC-{4100 + n}" in values
        assert f"pager-7{n}" in values
    assert "state=open" in values


def test_past_the_answer_length_values_are_left_out() -> None:
    dense = "\n".join(f"item_{n}=ID-{n:05d}" for n in range(2_000))  # a key of its own on each line: no column
    writer = PlausibleWriter(answer_tokens=400)
    record = writer.record([Source(dense, LOOKUP_TOOL)], None, "key")
    assert len(record) <= 400 * 4
    assert "item_1=ID-00001" in record
    assert "ID-01999" not in record
    assert len(writer.record([Source(dense, LOOKUP_TOOL)], 100, "key")) <= 100 * 4  # the request's own cap


def test_a_summary_restates_requirement_lines_and_copies_other_values() -> None:
    items = [
        Source("1. Requirements, keep them:\n- R1 (RQ-AB12CD): every rollout goes region by region."),
        Source("2. Note: the dashboard moved to dash-42.internal"),
    ]
    summary = PlausibleWriter(seed=1).summary(items, None, "key")
    assert "- R1 (RQ-AB12CD): every rollout goes region by region." in summary
    assert "dash-42.internal" in summary
    assert summary.index("Item 1") < summary.index("Requirements, constraints and corrections:")


def test_losses_are_drawn_from_the_seed_and_the_request() -> None:
    """At a 30% drop rate some requirement lines go; the same request loses the same lines, another request
    others."""
    lines = "\n".join(f"- R{n} (RQ-{n:06X}): must hold." for n in range(200))
    items = [Source(f"1. Requirements:\n{lines}")]
    writer = PlausibleWriter(seed=3, answer_tokens=100_000, losses=Losses(drop_requirements=0, miscopy=0))
    lossy = PlausibleWriter(seed=3, answer_tokens=100_000, losses=Losses(drop_requirements=0.3, miscopy=0))
    first, again, other = (lossy.summary(items, None, key) for key in ("a", "a", "b"))
    kept = sum(f"RQ-{n:06X}" in first for n in range(200))
    assert 110 < kept < 170
    assert first == again
    assert other != first
    assert sum(f"RQ-{n:06X}" in writer.summary(items, None, "a") for n in range(200)) == 200


def test_a_miscopied_value_has_one_character_changed() -> None:
    for draw in (0.0, 0.3, 0.99):
        changed = miscopied("TL-3FA9C2", draw)
        assert changed != "TL-3FA9C2"
        assert len(changed) == len("TL-3FA9C2")
        assert sum(a != b for a, b in zip(changed, "TL-3FA9C2", strict=True)) == 1


def test_a_partial_record_covers_the_first_half_of_what_it_was_asked_about() -> None:
    results = [Source(f"code_{n}=TL-{n:06X}", LOOKUP_TOOL) for n in range(4)]
    always = PlausibleWriter(losses=Losses(partial_records=1.0, miscopy=0))
    record = always.record(results, None, "key")
    assert "TL-000000" in record
    assert "TL-000001" in record
    assert "TL-000002" not in record
    assert "TL-000003" not in record


# --- telling a compaction request from a task turn, by its place --------------------------------------------


def test_an_instruction_is_read_by_its_place_and_what_it_quotes() -> None:
    context = [Message("user", ["Note 1: keep ticket TK-000111 open."]), Message("assistant", ["Noted."])]
    assert read_instruction("Please write down the values.", context).label == "record"
    summary = read_instruction("Summarise these: \u00abNote 1: keep ticket\u00bb", context)
    assert summary.label == "summary"
    assert summary.named == (context[0],)
    both = read_instruction("Record them, then a line [summary] and a summary of \u201cNote 1\u201d.", context)
    assert (both.label, both.section) == ("record+summary", "[summary]")


def test_a_request_that_is_only_an_instruction_is_a_summarizers_whatever_its_route() -> None:
    """A summarizer client pointed at the agent's own endpoint (one base URL): its request is the prompt and
    the numbered items, with no conversation before them."""
    model = ScriptedModel(SCRIPT)
    asked = [Message("system", ["Summarise."]), Message("user", ["1. Note: the key is KY-000777."])]
    reply = model.reply(asked)
    assert reply.label == "summary"
    assert "KY-000777" in (reply.message.text or "")


def test_every_call_spends_reasoning_tokens_billed_as_output() -> None:
    provider = SimulatedProvider(encoder=TOKENIZER, window=10_000, profile=get_profile("default"))
    request = RenderedRequest(None, None, ("<|user|>\nfirst",))
    plain = provider.call(request, output="done")
    thinking = provider.call(request, output="done", reasoning_tokens=256)
    assert thinking.output_tokens == plain.output_tokens + 256
    assert thinking.cost > plain.cost
    assert ModelOptions().reasoning == 256
    assert ModelOptions(model="oracle").reasoning == 0


# --- the cache expires across a user's think time -----------------------------------------------------------


def _tokens(n: int) -> list[int]:
    return list(range(1, n + 1))


def test_an_openai_prefix_expires_unused_and_a_read_keeps_it_alive() -> None:
    cache = OpenAICache(ttl=300)
    cache.lookup_and_store(_tokens(2_048), now=0)
    kept = cache.lookup_and_store(_tokens(2_048), now=250)
    assert kept.cached_tokens == 2_048
    assert cache.lookup_and_store(_tokens(2_048), now=500).cached_tokens == 2_048  # refreshed at 250
    gone = cache.lookup_and_store(_tokens(2_048), now=900)
    assert gone.cached_tokens == 0
    assert gone.without_expiry().cached_tokens == 2_048  # what an unexpired cache would have read


def test_an_anthropic_entry_expires_after_its_ttl_and_a_read_refreshes_it() -> None:
    cache = AnthropicCache(ttl=300)
    cache.lookup_and_store(_tokens(2_048), [2_048], now=0)
    assert cache.lookup_and_store(_tokens(2_100), [2_048, 2_100], now=200).cached_tokens == 2_048
    assert cache.lookup_and_store(_tokens(2_100), [2_048, 2_100], now=450).cached_tokens == 2_100
    late = cache.lookup_and_store(_tokens(2_100), [2_100], now=1_000)
    assert late.cached_tokens == 0
    assert late.written_tokens == 2_100
    assert late.without_expiry().cached_tokens == 2_100
    assert default_ttl("anthropic-1h") == 3_600
    assert default_ttl("anthropic-5m") == default_ttl("default") == 300


def test_think_times_are_drawn_per_turn_from_the_seed() -> None:
    times = [think_seconds(1, turn, 60.0) for turn in range(2, 400)]
    assert think_seconds(1, 1, 60.0) == 0.0
    assert times == [think_seconds(1, turn, 60.0) for turn in range(2, 400)]
    assert 40 < statistics.median(times) < 90
    assert 0.02 < sum(t > 300 for t in times) / len(times) < 0.12  # about one pause in twenty outlives the cache
    assert think_seconds(1, 5, 0.0) == 0.0


def test_a_cells_cost_is_split_where_it_goes() -> None:
    result, provider = asyncio.run(play_cell(Cell("tool_and_user_summary_anchored", 1.5, 1), Settings()))
    assert set(result.spend) == set(SPEND)
    parts = sum(value for name, value in result.spend.items() if name != "expiry")
    assert parts == pytest.approx(result.cost)
    assert result.spend["reasoning"] > 0
    assert result.spend["compaction output"] > 0
    assert result.spend["expiry"] > 0  # a think time outlived the cache somewhere in 30 turns
    assert sum(result.requests.values()) == sum(1 for c in provider.calls if c.compaction)
    oracle, _ = asyncio.run(play_cell(Cell("tool_and_user_summary_anchored", 1.5, 1), Settings(model="oracle")))
    assert oracle.spend["reasoning"] == oracle.spend["expiry"] == 0  # the earlier figures' model: neither


# --- the standard library workload ---------------------------------------------------------------------------


@pytest.mark.parametrize("fill", [1.5, 3.0])
def test_the_stdlib_workload_reads_real_text_and_its_facts_are_in_it_alone(fill: float) -> None:
    """A fact stands in its own lookup's result and nowhere else: not in another result, nor in any message,
    reply, tool name or call argument (a record that names the tool it read must not keep a fact by that)."""
    scenario = generate(GeneratorOptions(fill=fill, results="stdlib"))
    assert {t.name for t in scenario.tools} == {name for name, _, _ in TOOLS}
    results = {f"lookup {n}": c.result for n, c in enumerate((c for t in scenario.turns for c in t.calls), 1)}
    planted = [f for f in scenario.facts if f.scope.startswith("lookup")]
    assert len(planted) >= 40
    around = [
        text
        for t in scenario.turns
        if not t.probe
        for text in (t.user, t.reply, *(c.name for c in t.calls), *(str(c.arguments) for c in t.calls))
    ]
    for fact in planted:
        assert fact.value in results[fact.scope], fact
        others = [text for scope, text in results.items() if scope != fact.scope]
        assert not any(fact.value in text for text in others), fact
        assert not any(fact.value in text for text in around), fact
    assert generate(GeneratorOptions(fill=fill, results="stdlib")) == scenario  # deterministic
    texts = [r.text for r in reads(1, 3, 500)]
    assert any("def " in text for text in texts)  # source, as the standard library has it


def test_a_user_message_the_script_lacks_is_named_never_taken_for_an_empty_record() -> None:
    """A host's question the script was not given (a paraphrase) is no compaction request: with nothing the
    model can tell it asks for (no tool result to record, no numbered items to summarise) it is answered
    "Understood." and named; a lone message of numbered items is still a summarizer's request."""
    model = ScriptedModel(Scenario("x", "", (), (Turn("Which release is svc-a on?", reply="done"),)))
    alone = model.reply([Message("system", ["You are helpful."]), Message("user", ["Hi! Which release is svc-a on?"])])
    after = model.reply(
        [
            Message("user", ["Which release is svc-a on?"]),
            Message("assistant", ["done"]),
            Message("user", ["thanks, and svc-b?"]),
        ]
    )
    assert [(r.label, r.message.text) for r in (alone, after)] == [(TASK, "Understood."), (TASK, "Understood.")]
    assert model.unmatched == ["Hi! Which release is svc-a on?", "thanks, and svc-b?"]
    numbered = model.reply([Message("system", ["Summarise."]), Message("user", ["1. the user asked for A-1234"])])
    assert numbered.label == "summary"
    assert numbered.message.text
