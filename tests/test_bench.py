"""The benchmark harness: scenario, scripted model, simulated provider, rows, runner and command line."""

from __future__ import annotations

import json
import re
import sys
import types
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
from agent_framework import Agent, Content, Message, _tools

from maf_compaction.adapters.tiktoken import TiktokenTokenizer
from maf_compaction.bench import __main__ as bench_main
from maf_compaction.bench import grid
from maf_compaction.bench.client import SimulatedChatClient, scenario_tools
from maf_compaction.bench.model import (
    MODEL_KINDS,
    ModelKind,
    ModelOptions,
    ScriptedModel,
    context_text,
    transcript_items,
)
from maf_compaction.bench.provider import SimulatedProvider
from maf_compaction.bench.rendering import RenderedRequest, common_prefix, render_message
from maf_compaction.bench.rows import (
    ROW_DESCRIPTIONS,
    ROWS,
    RowContext,
    RowSetup,
    composed_row,
    parse_strategy_option,
    resolve_rows,
)
from maf_compaction.bench.runner import (
    Cell,
    CellResult,
    Settings,
    load_scenario,
    run_cell,
    run_grid,
    seeded_framework_ids,
    summarize,
)
from maf_compaction.bench.scenario import (
    LOOKUP_TOOL,
    RECALL_TOOL,
    RESULTS_KINDS,
    Fact,
    GeneratorOptions,
    Probe,
    ResultsKind,
    Scenario,
    ToolCall,
    ToolSpec,
    Turn,
    generate,
)
from maf_compaction.bench.simulator import OpenAICache, bill, get_profile
from maf_compaction.core.tables import row_keys
from maf_compaction.core.values import distinctive_values

TOKENIZER = TiktokenTokenizer()
SMALL = GeneratorOptions(context_window=8_192, fill=1.5, tool_turns=3, markers_per_tool=4, seed=3)
SMALL_SETTINGS = Settings(context_window=8_192, max_output_tokens=1_024, tool_turns=3, markers_per_tool=4)


def _tokens(scenario: Scenario) -> int:
    return sum(
        TOKENIZER.count_tokens(t.user)
        + TOKENIZER.count_tokens(t.reply)
        + sum(TOKENIZER.count_tokens(c.result) for c in t.calls)
        for t in scenario.turns
    )


#: The minimal, perfect writer of earlier figures: the tests of its exact output use it.
ORACLE = ModelOptions(model="oracle")


# -- scenario ----------------------------------------------------------------------------


@pytest.mark.parametrize("results", RESULTS_KINDS)
@pytest.mark.parametrize("fill", [0.9, 1.5, 3.0])
def test_the_generated_conversation_is_sized_to_its_fill(fill: float, results: ResultsKind) -> None:
    scenario = generate(GeneratorOptions(fill=fill, results=results))
    assert _tokens(scenario) == pytest.approx(32_000 * fill, rel=0.1)
    tool = sum(TOKENIZER.count_tokens(c.result) for t in scenario.turns for c in t.calls)
    assert tool / _tokens(scenario) == pytest.approx(0.6, abs=0.05)


def test_the_generated_conversation_is_a_function_of_its_seed() -> None:
    assert generate(SMALL) == generate(SMALL)
    other = generate(GeneratorOptions(**{**_options_dict(SMALL), "seed": 4}))
    assert {f.value for f in other.facts}.isdisjoint({f.value for f in generate(SMALL).facts})


def _options_dict(options: GeneratorOptions) -> dict[str, object]:
    return {name: getattr(options, name) for name in options.__dataclass_fields__}


def test_planted_facts_are_unique_and_each_is_in_the_conversation() -> None:
    scenario = generate(SMALL)
    values = [f.value for f in scenario.facts]
    assert len(values) == len(set(values)) == 4 + 3 * 4
    text = "\n".join([t.user for t in scenario.turns] + [c.result for t in scenario.turns for c in t.calls])
    assert all(v in text for v in values)
    # Table rows as well as code lines carry facts.
    results = [c.result for t in scenario.turns for c in t.calls]
    assert any(line.startswith("| code_") for r in results for line in r.splitlines())
    assert any("] code_" in line for r in results for line in r.splitlines())
    probes = [t.probe for t in scenario.turns if t.probe is not None]
    assert sorted(v for p in probes for v in p.expected) == sorted(values)


def _lookups(scenario: Scenario) -> list[tuple[str, list[Fact]]]:
    """Each lookup's result with the facts of its scope."""
    calls = [c for t in scenario.turns for c in t.calls if c.name == LOOKUP_TOOL]
    return [(c.result, [f for f in scenario.facts if f.scope == f"lookup {c.arguments['lookup']}"]) for c in calls]


@pytest.mark.parametrize(
    "options",
    [GeneratorOptions(fill=0.9), GeneratorOptions(fill=3.0, seed=2), SMALL, GeneratorOptions(markers_per_tool=12)],
    ids=["fill-0.9", "fill-3.0", "small", "12-markers"],
)
def test_a_lookup_results_distinctive_values_are_its_planted_codes_and_table_labels(
    options: GeneratorOptions,
) -> None:
    """The filler lines carry no distinctive value, so a record can cover a lookup by quoting its codes."""
    for result, planted in _lookups(generate(options)):
        labels = {f.label for f in planted if f"| {f.label} | {f.value} |" in result}
        assert labels, "some codes are table rows"
        assert len(labels) == options.markers_per_tool // 3
        assert set(distinctive_values(result)) == {f.value for f in planted} | labels
        assert len(distinctive_values(result)) == len(planted) + len(labels)


def test_dense_values_fill_lookup_results_with_distinctive_values() -> None:
    plain = _lookups(generate(GeneratorOptions(fill=0.9)))
    dense = _lookups(generate(GeneratorOptions(fill=0.9, results="dense")))
    for (plain_result, planted), (dense_result, dense_planted) in zip(plain, dense, strict=True):
        assert planted == dense_planted  # the same codes, in the same places
        values = distinctive_values(dense_result)
        assert {f.value for f in planted} <= set(values)
        assert len(values) > 20 * len(distinctive_values(plain_result))
        assert [line for line in dense_result.splitlines() if "code_" in line and "|" not in line] == [
            line for line in plain_result.splitlines() if "code_" in line and "|" not in line
        ]


@pytest.mark.parametrize("argv", [["--results", "dense"], ["--dense-values"]], ids=["results", "alias"])
def test_the_dense_results_reach_the_generator(argv: list[str]) -> None:
    settings = grid.settings_from(grid.parser().parse_args(argv))
    assert settings.results == "dense"
    assert grid.settings_from(grid.parser().parse_args([])).results == "synthetic"
    scenario = load_scenario(settings, 1.5, 1)
    assert scenario.meta["results"] == "dense"
    assert all(len(distinctive_values(result)) > 100 for result, _ in _lookups(scenario))


def test_a_scenario_refuses_repeated_user_texts_and_undeclared_tools() -> None:
    tools = (ToolSpec("t", "d"),)
    with pytest.raises(ValueError, match=r"turns\[1\]\.user repeats"):
        Scenario("x", "s", tools, (Turn("same"), Turn("same")))
    with pytest.raises(ValueError, match=r"turns\[0\]\.calls\[0\]\.name: 'u' is not a declared tool"):
        Scenario("x", "s", tools, (Turn("a", calls=(ToolCall("u", {}, "r"),)),))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("context_window", 100, "context_window must be >= 4096"),
        ("fill", 0.0, r"fill must be in \(0, 10\]"),
        ("tool_share", 1.0, r"tool_share must be in \[0, 1\)"),
        ("tool_turns", 0, "tool_turns must be >= 1"),
        ("markers_per_tool", 0, "markers_per_tool must be >= 1"),
    ],
)
def test_generator_options_are_validated(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GeneratorOptions(**{field: value})  # type: ignore[arg-type]


# -- scripted model ----------------------------------------------------------------------

SCRIPT = Scenario(
    "unit",
    "system",
    (ToolSpec(LOOKUP_TOOL, "lookup"),),
    (
        Turn(
            "first",
            calls=(ToolCall(LOOKUP_TOOL, {"n": 1}, "a\ncode_1=TL-AAAAAA\nb"), ToolCall(LOOKUP_TOOL, {"n": 2}, "x")),
            reply="done",
        ),
        Turn("ask", probe=Probe("lookup", ("TL-AAAAAA", "RQ-BBBBBB"))),
    ),
)


def _call(message: Message) -> Content:
    (content,) = message.contents
    assert content.type == "function_call"
    return content


def test_the_model_makes_the_turns_calls_in_order_then_replies() -> None:
    model = ScriptedModel(SCRIPT)
    history: list[Message] = [Message("user", ["first"])]
    first = _call(model.respond(history))
    assert (first.call_id, first.name) == ("call_1_0", LOOKUP_TOOL)
    history += [
        Message("assistant", [first]),
        Message("tool", [Content.from_function_result(call_id="call_1_0", result="r")]),
    ]
    second = _call(model.respond(history))
    assert second.call_id == "call_1_1"
    history += [
        Message("assistant", [second]),
        Message("tool", [Content.from_function_result(call_id="call_1_1", result="r")]),
    ]
    assert model.respond(history).text == "done"


def test_the_model_quotes_only_values_visible_in_its_context() -> None:
    model = ScriptedModel(SCRIPT)
    seen = model.respond([Message("user", ["value code_1=TL-AAAAAA"]), Message("user", ["ask"])]).text
    assert "TL-AAAAAA" in seen
    assert "RQ-BBBBBB" not in seen
    assert "cannot see 1" in seen
    assert "TL-AAAAAA" not in model.respond([Message("user", ["ask"])]).text


def test_the_oracles_summary_keeps_value_lines_in_order_within_its_size() -> None:
    model = ScriptedModel(SCRIPT, ORACLE)
    transcript = [
        Message("system", ["Summarize TL-CCCCCC"]),
        Message("user", ["chatter\nR1 (RQ-BBBBBB): keep it\nmore chatter"]),
        Message("assistant", ["filler\ncode_1=TL-AAAAAA"]),
    ]
    summary = model.respond(transcript, summarizer=True).text
    assert summary.splitlines()[1:] == ["R1 (RQ-BBBBBB): keep it", "code_1=TL-AAAAAA"]
    assert "TL-CCCCCC" not in summary  # the summarizer's own instructions are not the conversation
    assert len(model.summary(transcript_items(transcript), max_tokens=12)) <= 12 * 4


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_lower_quality_drops_a_seeded_share_of_values(kind: ModelKind) -> None:
    lines = "\n".join(f"code_{i}=TL-{i:06X}" for i in range(200))
    items = transcript_items([Message("user", [lines])])
    options = ModelOptions(model=kind, summary_quality=0.5, seed=1, answer_tokens=100_000)
    kept = ScriptedModel(SCRIPT, options).summary(items, None)
    count = sum(line.count("TL-") for line in kept.splitlines())
    assert 70 < count < 130
    assert kept == ScriptedModel(SCRIPT, options).summary(items, None)


def test_a_pinned_request_gets_a_record_of_visible_tool_values_unless_the_pin_is_ignored() -> None:
    context = [
        Message("user", ["first"]),
        Message("assistant", [Content.from_function_call(call_id="call_1_0", name=LOOKUP_TOOL, arguments={"n": 1})]),
        Message("tool", [Content.from_function_result(call_id="call_1_0", result="a\ncode_1=TL-AAAAAA\nb")]),
    ]
    pin = {"mode": "required", "required_function_name": RECALL_TOOL}
    call = _call(ScriptedModel(SCRIPT, ORACLE).respond(context, tool_choice=pin))
    assert call.name == RECALL_TOOL
    assert call.parse_arguments() == {"values": f"Values from earlier tool results:\n{LOOKUP_TOOL}:\ncode_1=TL-AAAAAA"}
    ignored = ScriptedModel(SCRIPT, ModelOptions(ignore_pin=True)).respond(context, tool_choice=pin)
    assert _call(ignored).name == LOOKUP_TOOL


def _results_context(*results: str) -> list[Message]:
    """A context with one lookup call and result per text."""
    context = [Message("user", ["first"])]
    for number, result in enumerate(results):
        call_id = f"call_1_{number}"
        call = Content.from_function_call(call_id=call_id, name=LOOKUP_TOOL, arguments={"n": number})
        context += [
            Message("assistant", [call]),
            Message("tool", [Content.from_function_result(call_id, result=result)]),
        ]
    return context


TABLES = """# records
code_1=TL-AAAAAA
| label | value | region |
|---|---|---|
| code_2 | TL-BBBBBB | eu-west |
| probe | none | us-east |
| code_3 | TL-CCCCCC | ap-south |
no values here
| name | code |
|:--|--:|
| code_4 | TL-DDDDDD |
after the tables, code_5=TL-EEEEEE"""


def test_a_record_quotes_table_rows_under_their_headings_once_per_table() -> None:
    second = "| label | value | region |\n|---|---|---|\n| code_6 | TL-FFFFFF | eu-west |"
    record = ScriptedModel(SCRIPT, ORACLE).record(_results_context(TABLES, second))
    assert record.splitlines() == [
        "Values from earlier tool results:",
        f"{LOOKUP_TOOL}:",
        "code_1=TL-AAAAAA",
        "| label | value | region |",
        "|---|---|---|",
        "| code_2 | TL-BBBBBB | eu-west |",
        "| code_3 | TL-CCCCCC | ap-south |",
        "",  # the next table follows a row directly: kept apart
        "| name | code |",
        "|:--|--:|",
        "| code_4 | TL-DDDDDD |",
        "after the tables, code_5=TL-EEEEEE",
        "| label | value | region |",  # another result's table, under its own heading
        "|---|---|---|",
        "| code_6 | TL-FFFFFF | eu-west |",
    ]
    # Read as the record strategy reads it: every value row of the results, under the same headings.
    quoted = set(row_keys(record))
    assert quoted == {
        key for text in (TABLES, second) for key in row_keys(text) if distinctive_values("|".join(key[1]))
    }


def test_a_lower_quality_record_drops_whole_rows_and_writes_a_heading_only_with_a_row() -> None:
    result = "\n".join(
        f"| label | value | t{n} |\n|---|---|---|\n| a{n} | TL-{n:04X}A0 | x |\n| b{n} | TL-{n:04X}B0 | y |\ngap"
        for n in range(120)
    )
    model = ScriptedModel(SCRIPT, ModelOptions(model="oracle", record_quality=0.5, seed=2))
    record = model.record(_results_context(result))
    assert record == model.record(_results_context(result))
    lines = record.splitlines()
    headings = [i for i, line in enumerate(lines) if line.startswith("| label |")]
    kept = row_keys(record)
    assert 60 < len(kept) < 180
    assert set(kept) <= set(row_keys(result))  # each row verbatim, under its own table's heading
    assert len(headings) == len({heading for heading, _ in kept})  # one heading per table with a kept row
    for index in headings:
        assert lines[index + 1] == "|---|---|---|"
        assert lines[index + 2].startswith(("| a", "| b"))
    assert all(line.startswith("|") or line in ("", f"{LOOKUP_TOOL}:") for line in lines[1:])


def test_a_record_cut_to_its_size_never_ends_on_a_heading() -> None:
    model = ScriptedModel(SCRIPT, ORACLE)
    for max_tokens in range(9, 60):  # the title alone is 33 characters
        lines = model.record(_results_context(TABLES), max_tokens).splitlines()
        assert len("\n".join(lines)) <= max_tokens * 4
        assert not lines[-1].startswith(("| label |", "|---", "| name |", "|:--"))


def test_a_record_of_a_generated_lookup_quotes_every_code_and_each_table_row_with_its_heading() -> None:
    result, planted = _lookups(generate(SMALL))[0]
    record = ScriptedModel(generate(SMALL), ORACLE).record(_results_context(result))
    assert {f.value for f in planted} <= set(distinctive_values(record))
    assert set(distinctive_values(record)) == set(distinctive_values(result))
    assert set(row_keys(record)) == set(row_keys(result))


@pytest.mark.parametrize("field", ["record_quality", "summary_quality"])
def test_model_qualities_are_validated(field: str) -> None:
    with pytest.raises(ValueError, match=rf"{field} must be in \[0, 1\]"):
        ModelOptions(**{field: 1.5})  # type: ignore[arg-type]


def test_context_text_reads_results_calls_and_reasoning() -> None:
    messages = [
        Message(
            "assistant",
            [
                Content.from_text_reasoning(text="think TL-1"),
                Content.from_function_call(call_id="c", name="f", arguments={"a": 1}),
            ],
        ),
        Message("tool", [Content.from_function_result(call_id="c", result=[Content.from_text("inner TL-2")])]),
    ]
    text = context_text(messages)
    assert "think TL-1" in text
    assert '"a": 1' in text
    assert "inner TL-2" in text


# -- rendering -----------------------------------------------------------------------------


def test_rendering_keeps_what_the_model_sees_and_drops_ids_and_metadata() -> None:
    a = Message("user", ["hello"], message_id="a", additional_properties={"_group": {"index": 1}})
    b = Message("user", ["hello"], message_id="b")
    assert render_message(a) == render_message(b) == "<|user|>\nhello"
    call = Message("assistant", [Content.from_function_call(call_id="c1", name="f", arguments={"q": 1})])
    assert render_message(call) == '<|assistant|>\ncall c1 f({"q":1})'
    request = RenderedRequest.of([a, call], {"instructions": "be brief"})
    assert request.entries == ("<|system|>\nbe brief", render_message(a), render_message(call))
    assert common_prefix(["a", "b"], ["a", "c", "d"]) == 1


# -- simulated provider ------------------------------------------------------------------


def _request(*messages: str) -> RenderedRequest:
    return RenderedRequest(instructions="<|system|>\nbe brief " * 200, tools=None, messages=messages)


def test_the_provider_bills_what_the_cache_rules_say_and_flags_breaks_and_dq() -> None:
    provider = SimulatedProvider(encoder=TOKENIZER, window=2_000, profile=get_profile("default"))
    first = provider.call(_request("<|user|>\nhello"), output="hi")
    second = provider.call(_request("<|user|>\nhello", "<|assistant|>\nhi", "<|user|>\nmore " * 50), output="ok")
    third = provider.call(_request("<|user|>\nchanged"), output="ok")
    reference = OpenAICache()
    sequences = [
        [t for e in r.entries for t in TOKENIZER.encode(e)]
        for r in (
            _request("<|user|>\nhello"),
            _request("<|user|>\nhello", "<|assistant|>\nhi", "<|user|>\nmore " * 50),
            _request("<|user|>\nchanged"),
        )
    ]
    expected = [reference.lookup_and_store(s) for s in sequences]
    assert [c.cached_tokens for c in (first, second, third)] == [e.cached_tokens for e in expected]
    assert second.cached_tokens > 0
    assert [c.broke for c in (first, second, third)] == [False, False, True]
    assert first.cost == bill(get_profile("default"), expected[0], TOKENIZER.count_tokens("hi"))
    big = provider.call(_request("<|user|>\n" + "word " * 3_000), output="x")
    assert big.over_window
    assert not first.over_window


def test_anthropic_requests_write_at_their_breakpoints_and_read_later() -> None:
    provider = SimulatedProvider(encoder=TOKENIZER, window=100_000, profile=get_profile("default"), cache="anthropic")
    first = provider.call(_request("<|user|>\n" + "alpha " * 1_500), output="x")
    second = provider.call(_request("<|user|>\n" + "alpha " * 1_500, "<|user|>\nbeta"), output="x")
    assert first.cached_tokens == 0
    assert first.written_tokens > 0
    assert second.cached_tokens == first.input_tokens


def test_the_provider_refuses_unknown_settings() -> None:
    with pytest.raises(ValueError, match="cache must be one of openai, openai-free-tool-choice, anthropic"):
        SimulatedProvider(encoder=TOKENIZER, window=10, profile=get_profile("default"), cache="other")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window must be a positive integer"):
        SimulatedProvider(encoder=TOKENIZER, window=0, profile=get_profile("default"))


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
async def test_the_in_process_client_plays_a_turn_through_an_agent_and_reports_usage(stream: bool) -> None:
    provider = SimulatedProvider(encoder=TOKENIZER, window=32_000, profile=get_profile("default"))
    client = SimulatedChatClient(model=ScriptedModel(SCRIPT), provider=provider)
    instructions = "Quote values exactly. " * 300  # long enough for the prompt cache's 1,024-token minimum
    agent = Agent(client, instructions, tools=scenario_tools(SCRIPT))
    if stream:
        updates = agent.run("first", stream=True)
        async for _ in updates:
            pass
        response = await updates.get_final_response()
    else:
        response = await agent.run("first")
    assert response.text == "done"
    results = [c.result for m in response.messages for c in m.contents if c.type == "function_result"]
    assert results == ["a\ncode_1=TL-AAAAAA\nb", "x"]  # the scripted results, in order
    assert [c.kind for c in provider.calls] == ["model"] * 3  # two calls, then the reply
    usage = response.usage_details or {}
    assert usage.get("input_token_count") == sum(c.input_tokens for c in provider.calls)
    assert usage.get("cache_read_input_token_count") == sum(c.cached_tokens for c in provider.calls) > 0
    assert usage.get("output_token_count") == sum(c.output_tokens for c in provider.calls)


# -- rows and runner ---------------------------------------------------------------------


async def test_the_control_keeps_every_fact_and_never_breaks_the_prefix() -> None:
    result = await run_cell(Cell("none", 1.5, 3), SMALL_SETTINGS)
    assert result.error is None
    assert result.breaks == 0
    assert result.facts_kept == result.facts_total == 16
    assert result.accuracy == 1.0
    assert result.dq > 0  # fill 1.5 outgrows the window: the control is disqualified
    assert result.max_prompt > SMALL_SETTINGS.context_window
    assert result.model_calls == len(result.prompts)
    assert result.summarizer_calls == 0
    assert result.pass_ms == []


async def test_a_compacting_row_stays_inside_the_window_and_is_timed() -> None:
    result = await run_cell(Cell("context_window", 1.5, 3), SMALL_SETTINGS)
    assert result.dq == 0
    assert result.max_prompt <= SMALL_SETTINGS.context_window
    assert result.pass_ms
    assert all(ms >= 0 for ms in result.pass_ms)
    assert result.facts_kept < result.facts_total  # the framework default loses facts past the window


async def test_the_summarization_row_bills_its_summarizer_calls() -> None:
    result = await run_cell(Cell("summarization", 1.5, 3), SMALL_SETTINGS)
    assert result.summarizer_calls > 0
    assert result.model_calls + result.summarizer_calls > len(result.prompts)


def _without_timings(result: CellResult) -> dict[str, object]:
    data = result.to_dict()
    for key in ("seconds", "pass_ms"):
        data.pop(key)
    return data


def test_a_grid_run_is_deterministic_and_parallel_runs_agree() -> None:
    cells = [Cell(row, 1.5, 3) for row in ("none", "anchored", "truncation")]
    once = run_grid(cells, SMALL_SETTINGS, jobs=1)
    again = run_grid(cells, SMALL_SETTINGS, jobs=2)
    assert [_without_timings(r) for r in once] == [_without_timings(r) for r in again]


def test_summaries_average_over_seeds_and_compare_with_the_control_per_seed() -> None:
    def cell(row: str, seed: int, cost: float) -> CellResult:
        return CellResult(
            row=row, fill=1.0, seed=seed, cost=cost, input_tokens=100, cached_tokens=50, window=10, max_prompt=5
        )

    summaries = summarize([cell("none", 1, 2.0), cell("x", 1, 1.0), cell("none", 2, 4.0), cell("x", 2, 3.0)])
    x = next(s for s in summaries if s.row == "x")
    assert x.cost == 2.0
    assert x.vs_none == pytest.approx((0.5 + 0.75) / 2)
    assert x.hit == 0.5
    assert x.seeds == 2


def strict_truncation(context: RowContext) -> RowSetup:
    """A custom row for the --strategy test: the framework's truncation at 60% of the budget."""
    from agent_framework import TruncationStrategy

    strategy = TruncationStrategy(
        max_n=int(context.budget * 0.6), compact_to=int(context.budget * 0.4), tokenizer=context.tokenizer
    )
    return RowSetup(before=strategy, after=strategy)


def test_rows_resolve_built_ins_and_module_factories_with_clear_errors() -> None:
    extra = dict([parse_strategy_option("mine=test_bench:strict_truncation")])
    rows = resolve_rows(["anchored", "mine"], extra)
    assert rows["anchored"] is ROWS["anchored"]
    assert rows["mine"] is strict_truncation
    with pytest.raises(ValueError, match="--strategy expects NAME=module:factory"):
        parse_strategy_option("mine=module")
    with pytest.raises(ValueError, match="unknown row 'nope'"):
        resolve_rows(["nope"], {})
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        resolve_rows(["x"], {"x": "no_such_module:f"})
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        resolve_rows(["x"], {"x": "test_bench:missing"})


# -- command line ------------------------------------------------------------------------


def _run(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = bench_main.main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def test_the_command_line_lists_its_commands_and_refuses_unknown_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main.main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert "bench" in listed
    assert "speed" in listed
    assert "demo" not in listed
    assert bench_main.main(["demo"]) == 2
    assert "unknown command 'demo'" in capsys.readouterr().err


def test_the_command_line_imports_a_command_only_when_it_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[Sequence[str]] = []

    def fake_main(argv: Sequence[str]) -> int:
        seen.append(argv)
        return 7

    module = types.ModuleType("maf_compaction.bench.fake")
    module.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "maf_compaction.bench.fake", module)
    monkeypatch.setitem(bench_main.COMMANDS, "fake", ("fake", "a test command"))
    monkeypatch.setitem(bench_main.COMMANDS, "ghost", ("ghost_module_that_does_not_exist", "not installed"))
    assert bench_main.main(["fake", "--x", "1"]) == 7
    assert seen == [["--x", "1"]]
    assert bench_main.main(["ghost"]) == 2
    assert "not available" in capsys.readouterr().err
    # Without a command, or with an option first, the evaluation grid (``bench``) runs.
    monkeypatch.setitem(bench_main.COMMANDS, "bench", ("fake", "the grid"))
    assert bench_main.main([]) == 7
    assert bench_main.main(["--fill", "1.5"]) == 7
    assert seen[-2:] == [[], ["--fill", "1.5"]]


SMALL_ARGS = ["--context-window", "8192", "--max-output-tokens", "1024", "--tool-turns", "3", "--markers-per-tool", "4"]


def test_the_command_prints_the_table_and_writes_json_and_a_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report, picture = tmp_path / "out" / "r.json", tmp_path / "r.png"
    argv = ["bench", *SMALL_ARGS, "--fill", "1.5", "--seeds", "1", "--jobs", "1", "--rows", "none,anchored,mine"]
    argv += ["--strategy", "mine=test_bench:strict_truncation", "--json", str(report), "--plot", str(picture)]
    status, out, err = _run(argv, capsys)
    assert status == 0, err
    assert "fill 1.5 x 8,192-token window" in out
    assert "anchored" in out
    assert "mine" in out
    assert "cells," not in err  # no progress bar: the output is not a terminal (tests/test_cli.py)
    data = json.loads(report.read_text())
    assert {s["row"] for s in data["summaries"]} == {"none", "anchored", "mine"}
    assert data["settings"]["strategies"] == {"mine": "test_bench:strict_truncation"}
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_options_starting_the_command_line_run_the_bench(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(
        [*SMALL_ARGS, "--fill", "0.9", "--seeds", "1", "--jobs", "1", "--rows", "none", "--quiet"], capsys
    )
    assert status == 0
    assert "fill 0.9" in out
    assert grid.parser().parse_args(["--fills", "0.9,1.5"]).fill == [0.9, 1.5]  # the plural spelling too


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rows", "nope"], "unknown row 'nope'"),
        (["--strategy", "broken"], "--strategy expects NAME=module:factory"),
        (["--context-window", "4096", "--max-output-tokens", "4096"], "--max-output-tokens (4096) must be below"),
    ],
)
def test_bad_options_exit_2_with_a_message(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = _run(["bench", *argv], capsys)
    assert status == 2
    assert message in err


@pytest.mark.parametrize("argv", [["--fill", "0"], ["--seeds", "0"], ["--record-quality", "2"]])
def test_bad_values_are_refused_by_the_parser(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        grid.main(argv)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_a_step_hidden_by_compaction_is_not_made_again() -> None:
    """A strategy may exclude an earlier result of the same turn; the model moves on from the latest it sees."""
    model = ScriptedModel(SCRIPT)
    later_only = [
        Message("user", ["first"]),
        Message("assistant", [Content.from_function_call(call_id="call_1_1", name=LOOKUP_TOOL, arguments={"n": 2})]),
        Message("tool", [Content.from_function_result(call_id="call_1_1", result="x")]),
    ]
    assert model.respond(later_only).text == "done"


def test_the_command_replays_a_workload_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = {
        "version": 1,
        "name": "tiny",
        "system": "Be brief.",
        "tools": [{"name": "lookup"}],
        "turns": [
            {"user": "look it up", "calls": [{"name": "lookup", "arguments": {"n": 1}, "result": "code=TL-ABCDEF"}]},
            {"user": "what was the code?", "probe": {"scope": "lookup", "expected": ["TL-ABCDEF"]}},
        ],
    }
    path = tmp_path / "w.json"
    path.write_text(json.dumps(workload))
    report = tmp_path / "r.json"
    argv = ["--workload", str(path), "--rows", "none,anchored", "--jobs", "1", "--quiet", "--json", str(report)]
    status, out, err = _run(argv, capsys)
    assert status == 0, err
    assert f"workload 'tiny' ({path}) at a 32,000-token window" in out
    assert "1.0/1" in out  # one fact, kept
    cells = json.loads(report.read_text())["cells"]
    assert [c["accuracy"] for c in cells] == [1.0, 1.0]
    assert [c["model_calls"] for c in cells] == [3, 3]


def test_workload_and_session_errors_are_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "turns": [{"user": 12}]}')
    status, _, err = _run(["--workload", str(bad)], capsys)
    assert status == 2
    assert "bad.json: turns[0].user" in err
    status, _, err = _run(["--facts", str(bad)], capsys)
    assert status == 2
    assert "--facts goes with --session" in err


# -- the record rows (tool_summary_anchored: the README's wiring; tool_summary_anchored_pinned) ----------------

RECORD_ROW = "tool_summary_anchored"  # records asked over the cached prefix (record_request="cached_prefix")
PINNED_ROW = "tool_summary_anchored_pinned"  # records asked by pinning tool_choice (record_request="pinned")
_RECORD_CELLS: dict[tuple[str, bool], CellResult] = {}


async def _record_cell(row: str = RECORD_ROW, *, ignore_pin: bool = False) -> CellResult:
    """A record row at fill 1.5, seed 1, on the default 32K window (once per session of tests)."""
    key = (row, ignore_pin)
    if key not in _RECORD_CELLS:
        _RECORD_CELLS[key] = await run_cell(Cell(row, 1.5, 1), Settings(ignore_pin=ignore_pin))
    return _RECORD_CELLS[key]


@pytest.mark.parametrize(("row", "asked_by"), [(RECORD_ROW, "prefix_requests"), (PINNED_ROW, "forced_calls")])
async def test_the_record_row_is_built_in_and_keeps_every_fact_within_the_window(row: str, asked_by: str) -> None:
    """Each route asks for its records its own way only, and loses nothing."""
    assert row in ROWS
    assert row in ROW_DESCRIPTIONS
    assert list(ROWS) == list(ROW_DESCRIPTIONS), "every row has a description, in table order"
    result = await _record_cell(row)
    assert result.error is None, result.error
    assert result.dq == 0, f"{result.dq} request(s) over the window"
    assert result.facts_kept == result.facts_total, f"facts kept {result.facts_kept}/{result.facts_total}"
    assert result.accuracy == 1.0
    counters = result.counters
    other = "forced_calls" if asked_by == "prefix_requests" else "prefix_requests"
    assert counters[asked_by] >= 1, counters
    assert counters[other] == 0, counters
    assert counters["records"] == counters[asked_by], counters  # each ask answered with a record
    assert counters["groups_covered"] >= 4, counters
    assert counters["pin_disabled"] == 0, counters
    assert counters["failed_prefix_requests"] == 0, counters


@pytest.mark.parametrize("fill", [1.5, 3.0])
async def test_with_no_record_route_on_value_dense_results_the_composition_sheds_instead_of_raising(
    fill: float,
) -> None:
    """A model that ignores every record instruction leaves the safety net in the record's place; on value-dense
    logs its value lines are the whole result, so only shedding brings the prompt under the budget. The shed
    policy sheds whole groups, each named (it used to see the net's narration notes past its own band as
    misplaced, shed nothing, and the pass raised ``CompactionBudgetExceeded`` at turn 11 or 16)."""
    settings = Settings(results="dense", ignore_instruction=True)
    result = await run_cell(Cell("tool_and_user_summary_anchored", fill, 1), settings)
    assert result.error is None, result.error
    assert result.dq == 0, f"{result.dq} request(s) over the window"
    assert result.counters["records"] == 0, result.counters
    assert result.counters["shed_events"] >= 1, result.counters
    assert result.facts_lost > 0, "some results had to leave: nothing else fits"
    assert result.lost_unnamed - result.lost_cut_in_place == 0, "every lost value's message is named"


async def test_a_pinned_record_of_long_prose_over_value_dense_results_fits_its_budget() -> None:
    """The recall tool answers a record with a receipt: the record is the call's ``values``, carried once. When the
    result repeated it, a pinned record of long prose over number-dense logs stood in the prompt twice, and at
    fill 3.0 the composition raised ``CompactionBudgetExceeded`` (what must stay no longer fit)."""
    settings = Settings(results="dense", prose_tokens=(300, 600), answer_tokens=4_000)

    def pinned_every_record(context: RowContext) -> RowSetup:  # such records would not pay: asked for anyway
        return composed_row(context, record_request="pinned", summary_request="summarizer", record_payoff_share=None)

    cell = Cell("tool_and_user_summary_anchored_pinned", 3.0, 1)
    result = await run_cell(cell, settings, factory=pinned_every_record)
    assert result.error is None, result.error
    assert result.dq == 0, f"{result.dq} request(s) over the window"
    assert result.counters["forced_calls"] >= 1, result.counters
    assert result.counters["records"] >= 1, result.counters


async def test_on_value_dense_results_the_composition_asks_no_record_that_would_not_pay() -> None:
    """Every lookup of ``--results dense`` is number-dense logs: a record quoting its values would be about a third
    of it at the output price. The README's composition (``record_payoff_share=0.2``) asks for none and costs less
    than the same wiring asking for every record, keeping more facts than the framework's default."""
    settings = Settings(results="dense")
    results = {
        row: await run_cell(Cell(row, 1.5, 1), settings)
        for row in ("tool_and_user_summary_anchored", "tool_and_user_summary_anchored_ungated", "context_window")
    }
    gated, every, default = results.values()
    assert gated.error is None, gated.error
    assert gated.dq == 0, f"{gated.dq} request(s) over the window"
    assert not any(kind.startswith("record") for kind in gated.requests), gated.requests
    assert gated.counters["records"] == 0, gated.counters
    assert any(kind.startswith("record") for kind in every.requests), every.requests
    assert gated.cost < 0.8 * every.cost, (gated.cost, every.cost)
    assert gated.facts_kept > default.facts_kept, (gated.facts_kept, default.facts_kept)
    assert gated.lost_unnamed - gated.lost_cut_in_place == 0, "every lost value's message is named"


async def test_the_pinned_record_row_reports_a_route_that_ignores_the_pin() -> None:
    """Two ignored pins disable forcing; every later record is asked over the cached prefix, and written."""
    result = await _record_cell(PINNED_ROW, ignore_pin=True)
    assert result.error is None, result.error
    counters = result.counters
    assert counters["pin_disabled"] == 1, counters
    assert counters["ignored_forced_calls"] == 2, counters
    assert counters["forced_calls"] == 2, counters
    assert counters["prefix_requests"] >= 1, counters
    assert counters["failed_prefix_requests"] == 0, counters
    assert counters["records"] == counters["prefix_requests"], counters  # each answer kept as a record
    assert counters["groups_covered"] >= 4, counters
    # Until the first record the anchored fallback kept the prompt in the window.
    assert counters["fallbacks"] >= 1, counters
    assert result.dq == 0, f"{result.dq} request(s) over the window"


def test_the_command_writes_and_prints_the_record_rows_counters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.json"
    argv = ["bench", "--fill", "1.5", "--seeds", "1", "--jobs", "1", "--quiet", "--rows", f"none,{RECORD_ROW}"]
    status, out, err = _run([*argv, "--json", str(report)], capsys)
    assert status == 0, err
    data = json.loads(report.read_text())
    cells = {c["row"]: c for c in data["cells"]}
    counters = cells[RECORD_ROW]["counters"]
    assert counters["prefix_requests"] >= 1
    assert counters["records"] >= 1
    assert counters["groups_covered"] >= 4
    assert cells["none"]["counters"] == {}
    summary = next(s for s in data["summaries"] if s["row"] == RECORD_ROW)
    assert summary["counters"] == counters  # one seed: the mean is the cell's own
    assert "(mean per seed)" not in out  # the counters are behind --full (and in the JSON)
    status, out, err = _run([*argv, "--full"], capsys)
    assert status == 0, err
    blocks = re.findall(r"^  (\S+ \(mean per seed\): .*(?:\n    .*)*)", out, flags=re.MULTILINE)
    assert len(blocks) == 1, f"one counters block expected (the record row's), got {blocks}"
    block = " ".join(blocks[0].split())  # wrapped at 120 columns
    assert block.startswith(f"{RECORD_ROW} (mean per seed): ")
    assert f"prefix requests {counters['prefix_requests']:g}" in block
    assert f"groups covered {counters['groups_covered']:g}" in block
    assert max(len(line) for line in blocks[0].splitlines()) <= 120


def test_a_record_and_a_summary_asked_in_one_request_are_answered_in_the_order_and_form_it_names() -> None:
    """The instruction asks for the record, then a line it names, then a summary of the messages it names by their
    opening words: the scripted model answers both (as it answers each alone), split by that line; with
    ``ignore_instruction`` it goes on with the task instead."""
    from maf_compaction.core.records import RECORD_INSTRUCTION, SUMMARY_SECTION
    from maf_compaction.core.user_summaries import PREFIX_ITEMS_HEADING

    context = [
        Message("user", ["Note 1: keep ticket TK-000111 open."]),
        Message("assistant", ["Noted."]),
        *_results_context("a\ncode_1=TL-AAAAAA\nb")[1:],
    ]
    instruction = (
        f"{RECORD_INSTRUCTION}\n\nThen, after the record, write one line {SUMMARY_SECTION} and below it a summary, "
        f"as follows. Summarise the numbered items.\n\n{PREFIX_ITEMS_HEADING}\n1. \u00abNote 1: keep ticket\u00bb"
    )
    asked = [*context, Message("user", [instruction])]
    text = ScriptedModel(SCRIPT).respond(asked).text
    record, summary = text.split(f"\n{SUMMARY_SECTION}\n")
    assert record == ScriptedModel(SCRIPT).record(context, None)
    assert "TL-AAAAAA" in record
    assert "TK-000111" in summary
    assert "TL-AAAAAA" not in summary
    ignored = ScriptedModel(SCRIPT, ModelOptions(ignore_instruction=True)).respond(asked)
    assert SUMMARY_SECTION not in (ignored.text or "")


def test_a_cell_draws_the_frameworks_random_identities_from_its_seed() -> None:
    """The framework's function-call identities (``af-call-`` + ``uuid4``), which its own strategies count, repeat
    for a seed inside a cell (so a run's figures repeat: docs/bench.md), and are the framework's own draw after it."""

    def draws(seed: int) -> list[str]:
        with seeded_framework_ids(seed):
            with seeded_framework_ids(seed + 1):  # nested: the outer generator goes on
                inner = _tools._generate_function_call_occurrence_id()  # pyright: ignore[reportPrivateUsage]
            return [inner, *(_tools._generate_function_call_occurrence_id() for _ in range(2))]  # pyright: ignore[reportPrivateUsage]

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)
    assert all(d.startswith("af-call-") and len(d) == len("af-call-") + 32 for d in draws(3))
    assert _tools.uuid4 is uuid.uuid4, "the framework's own uuid4 is back after the cell"  # pyright: ignore[reportPrivateImportUsage]
