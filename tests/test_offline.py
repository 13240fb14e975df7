"""Trying an agent without a key: ``OfflineProvider`` and ``docs/examples/try_offline.py`` (run here, as in CI).

The real ``OpenAIChatClient`` talks HTTP to the loopback server on 127.0.0.1; the scripted
model plays the questions; the report is read back line by line. The same server shows what a
strategy does when the client keeps the conversation on the server (``store`` unset): it says
so once and changes nothing, instead of failing on a conversation it cannot recognise.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Agent, Message, create_harness_agent, tool
from agent_framework_openai import OpenAIChatClient

from maf_compaction import (
    AnchoredCompactionStrategy,
    CompactionStack,
    RecallGate,
    TiktokenTokenizer,
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultRecallMiddleware,
    make_recall_tool,
)
from maf_compaction.bench.offline import OfflineProvider, Question
from maf_compaction.core.model import MessageRecord, Part
from maf_compaction.core.ownership import provider_increment

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "try_offline.py"
TOKENIZER = TiktokenTokenizer()
CODE = "TL-3FA9C2"


@tool(approval_mode="never_require")
def lookup_deployment(service: str) -> str:
    """Look up the current deployment record of a service."""
    return f"service={service}\nregion=westeurope\nrelease=2026.11.3\ncode_1={CODE}"


QUESTIONS = [
    Question(f"Which release is svc-{n} on? Quote code_1.", "lookup_deployment", {"service": f"svc-{n}"}, (CODE,))
    for n in range(3)
]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the harness's file memory writes under the working directory
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")


def harness_agent(client: OpenAIChatClient[Any], strategy: Any, **kwargs: Any) -> Any:
    return create_harness_agent(
        client,
        name="assistant",
        agent_instructions="Answer from the lookups you make. Quote values exactly.",
        max_context_window_tokens=128_000,
        max_output_tokens=4_000,
        before_compaction_strategy=strategy,
        after_compaction_strategy=strategy,
        tokenizer=TOKENIZER,
        **kwargs,
    )


async def ask(agent: Any, *, stream: bool = False) -> list[str]:
    session = agent.create_session()
    replies: list[str] = []
    for question in QUESTIONS:
        if stream:
            replies.append((await agent.run(question.text, session=session, stream=True).get_final_response()).text)
        else:
            replies.append((await agent.run(question.text, session=session)).text)
    return replies


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_the_real_client_runs_turns_against_the_offline_provider(stream: bool) -> None:
    async with OfflineProvider(QUESTIONS, encoder=TOKENIZER) as offline:
        client = OpenAIChatClient(model="gpt-6-luna", api_key="sk-offline", base_url=offline.base_url)
        strategy = AnchoredCompactionStrategy(max_input_tokens=100_000, tokenizer=TOKENIZER)
        agent = harness_agent(client, strategy, tools=[lookup_deployment], default_options={"store": False})
        replies = await ask(agent, stream=stream)
        calls = offline.calls()
    assert all(CODE in reply for reply in replies), replies
    assert len(calls) == 2 * len(QUESTIONS)  # a lookup, then the answer, per question
    assert [c.number for c in calls] == list(range(1, len(calls) + 1))
    assert all(c.prompt_tokens > 0 for c in calls)
    assert calls[-1].cached_tokens > 0  # the simulated cache served the repeated prefix
    assert strategy.passes > 0


async def test_the_report_names_each_call_and_what_left_the_prompt_before_it() -> None:
    async with OfflineProvider(QUESTIONS, encoder=TOKENIZER) as offline:
        client = OpenAIChatClient(model="gpt-6-luna", api_key="sk-offline", base_url=offline.base_url)
        await client.get_response([Message("user", [QUESTIONS[0].text])], options={"store": False})
        logging.getLogger("maf_compaction").warning("a strategy excluded 2 message(s): m1, m2")
        await client.get_response([Message("user", [QUESTIONS[1].text])], options={"store": False})
        report = offline.report()
        calls = offline.calls()
    lines = report.splitlines()
    assert lines[0].startswith("call 1: prompt ")
    assert lines[0].endswith("the first call")
    assert lines[1].startswith("call 2: prompt ")
    assert lines[1].endswith("1 of the previous call's messages changed or left: " + calls[1].left[0])
    assert calls[1].left == ('user "Which release is svc-0 on? Quote code_1."',)
    assert lines[2] == "  WARNING: a strategy excluded 2 message(s): m1, m2"
    assert calls[1].compaction == ("WARNING: a strategy excluded 2 message(s): m1, m2",)
    assert calls[0].compaction == ()
    assert logging.getLogger("maf_compaction").handlers == []  # recording stopped with the server


@pytest.mark.parametrize("level", [logging.NOTSET, logging.WARNING, logging.INFO, logging.DEBUG])
async def test_the_offline_provider_records_what_the_hosts_level_lets_through_and_never_changes_it(level: int) -> None:
    logger = logging.getLogger("maf_compaction")
    before = logger.level
    logger.setLevel(level)
    try:
        async with OfflineProvider(QUESTIONS, encoder=TOKENIZER) as offline:
            assert logger.level == level
            logger.info("a decision")
            logger.warning("a shed")
            await OpenAIChatClient(model="gpt-6-luna", api_key="sk-offline", base_url=offline.base_url).get_response(
                [Message("user", [QUESTIONS[0].text])], options={"store": False}
            )
            report = offline.report()
        assert logger.level == level
        info = logger.isEnabledFor(logging.INFO)  # NOTSET: whatever the root's level says
    finally:
        logger.setLevel(before)
    assert ("  INFO: a decision" in report.splitlines()) == info
    assert "  WARNING: a shed" in report.splitlines()
    assert ("once the 'maf_compaction' logger is at INFO" in report) != info


def test_an_offline_provider_needs_a_question() -> None:
    with pytest.raises(ValueError, match=r"^questions must name at least one question"):
        OfflineProvider([])


def test_the_try_offline_example_runs_and_reports_call_by_call(tmp_path: Path) -> None:
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(EXAMPLE)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    calls = [line for line in out.splitlines() if line.startswith("call ")]
    assert len(calls) == 2 * 12  # a lookup and an answer per service
    assert "12 of 12 answers quote their code" in out
    assert any("changed or left" in line for line in calls[1:]), "no result was shortened as it aged"
    # What changed is named: the harness's todo list leaving a call inside the tool loop is not compaction's doing,
    # and a result shortened as it aged is counted by its marker.
    assert any(line.endswith('changed or left: user "### Current todo list - none yet"') for line in calls)
    assert "  1 result(s) shortened by compaction ('[... removed by compaction: N characters]')" in out.splitlines()
    shed = [line for line in out.splitlines() if line.startswith("  WARNING:") and "shed to fit the budget" in line]
    assert shed, "the example's conversation outgrows its budget: the report shows the shed"
    assert list(tmp_path.iterdir()) == []  # the example works in a temporary directory of its own


# ----------------------------------------------------------------------------- history the provider owns


async def test_a_strategy_handed_server_side_history_says_so_once_and_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``store`` unset: the framework sends only new items; the strategy says why and names ``store=False``."""
    async with OfflineProvider(QUESTIONS, encoder=TOKENIZER) as offline:
        client = OpenAIChatClient(model="gpt-6-luna", api_key="sk-offline", base_url=offline.base_url)
        strategy = AnchoredCompactionStrategy(max_input_tokens=100_000, tokenizer=TOKENIZER)
        agent = harness_agent(client, strategy, tools=[lookup_deployment])  # no default_options: store unset
        with caplog.at_level(logging.WARNING):
            await ask(agent)
        sent = offline.server.requests
    assert any(body.get("previous_response_id") for body in sent)  # the server owned the conversation
    ours = [r.getMessage() for r in caplog.records if r.name == "maf_compaction"]
    assert len(ours) == 1, ours
    assert "keeps the conversation on the server" in ours[0]
    assert "default_options={'store': False}" in ours[0]
    assert "call_1_0" in ours[0]  # the result it was handed without its call
    assert strategy.passes <= 1  # only the first turn's first call was a conversation


async def test_the_record_wiring_on_server_side_history_says_so_instead_of_a_conversation_mismatch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with OfflineProvider(QUESTIONS, encoder=TOKENIZER) as offline:
        client = OpenAIChatClient(model="gpt-6-luna", api_key="sk-offline", base_url=offline.base_url)
        strategy = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=100_000, tokenizer=TOKENIZER)
        gate = RecallGate()
        recall = ToolResultRecallMiddleware(
            max_input_tokens=100_000,
            tokenizer=TOKENIZER,
            arm=gate.arm,
            disarm=gate.disarm,
            trigger_fraction=strategy.trigger_fraction,
            reforce=strategy.take_reforce,
        )
        agent = harness_agent(client, strategy, tools=[lookup_deployment, make_recall_tool(gate)], middleware=[recall])
        with caplog.at_level(logging.WARNING):
            await ask(agent)
    ours = [r.getMessage() for r in caplog.records if r.name == "maf_compaction"]
    assert len(ours) == 1, ours
    assert "store=False" in ours[0]


def test_a_mismatch_error_names_server_side_history_as_a_cause() -> None:
    strategy = AnchoredCompactionStrategy(max_input_tokens=10_000, tokenizer=TOKENIZER)
    strategy._run_sync([Message("user", ["first conversation"], message_id="a1")])  # pyright: ignore[reportPrivateUsage]
    with pytest.raises(RuntimeError, match=r"serves one conversation .* default_options=\{'store': False\}"):
        strategy._run_sync([Message("user", ["another"], message_id="b1")])  # pyright: ignore[reportPrivateUsage]


def _result(call_id: str) -> MessageRecord:
    return MessageRecord(role="tool", parts=(Part(kind="function_result", text="ok", call_id=call_id),))


def _call(call_id: str) -> MessageRecord:
    return MessageRecord(role="assistant", parts=(Part(kind="function_call", text="f()", call_id=call_id),))


def test_a_provider_increment_starts_with_results_whose_calls_are_missing() -> None:
    user = MessageRecord(role="user", parts=(Part(kind="text", text="hi"),))
    injected = MessageRecord(role="user", parts=(Part(kind="text", text="todo"),), injected=True)
    assert provider_increment([_result("c1")]) == ("c1",)
    assert provider_increment([injected, _result("c1"), _result("c1")]) == ("c1",)
    assert provider_increment([_call("c1"), _result("c1")]) == ()  # client-side history
    assert provider_increment([_result("c1"), _call("c1")]) == ()  # its call is there
    assert provider_increment([user, _result("c9")]) == ()  # starts with a turn: a conversation
    assert provider_increment([]) == ()


def test_start_and_stop_serve_synchronous_code_on_a_thread_of_their_own() -> None:
    """The README's way: start, point a client at it, run turns with ``asyncio.run``, stop."""
    import asyncio

    offline = OfflineProvider(QUESTIONS, encoder=TOKENIZER).start()
    try:
        with pytest.raises(RuntimeError, match="already running"):
            offline.start()
        client = OpenAIChatClient(model="gpt-6-luna", api_key="sk-offline", base_url=offline.base_url)

        async def one_call() -> Any:
            return await client.get_response([Message("user", [QUESTIONS[0].text])], options={"store": False})

        reply = asyncio.run(one_call())
        assert reply.messages
        assert len(offline.calls()) == 1
    finally:
        offline.stop()
    with pytest.raises(RuntimeError, match="not running"):
        _ = offline.base_url


async def test_a_second_start_in_the_running_loop_is_refused() -> None:
    """``async with`` refuses a provider already serving, as ``start`` does (no second server, no lost handler)."""
    offline = OfflineProvider(QUESTIONS, encoder=TOKENIZER)
    async with offline:
        with pytest.raises(RuntimeError, match="already running"):
            await offline.__aenter__()
        with pytest.raises(RuntimeError, match="already running"):
            offline.start()
    async with offline:  # stopped: it starts again
        assert offline.base_url.startswith("http://127.0.0.1:")


# ----------------------------------------------------------------------------- the report's labels and totals

TICKETS = [f"INC-{4100 + n}" for n in range(8)]


@tool(approval_mode="never_require")
def incident_log(ticket: str) -> str:
    """The log of an incident ticket: a user's own values, in a format no bench pattern knows."""
    lines = [f"{ticket} step {i}: owner=ops-team state=open note routine check" for i in range(60)]
    return "\n".join([f"ticket {ticket} escalated to pager-7{ticket[-2:]}", *lines])


INCIDENTS = [
    Question(f"Open incident {t} and quote its pager.", "incident_log", {"ticket": t}, (f"pager-7{t[-2:]}",))
    for t in TICKETS
]


async def test_a_users_own_values_get_records_and_the_report_labels_requests_and_ends_with_totals() -> None:
    """The plausible model writes records of values in the user's own format (a ticket id, a pager name); the
    report names each compaction request, and its totals price the same conversation without compaction."""
    budget = 6_000
    async with OfflineProvider(INCIDENTS, encoder=TOKENIZER, window=8_000) as offline:
        client = OpenAIChatClient(model="gpt-6-luna", api_key="sk-offline", base_url=offline.base_url)
        stack = CompactionStack.build(max_input_tokens=budget, tokenizer=TOKENIZER)  # records over the cached prefix
        strategy = stack.strategy
        agent = Agent(
            client,
            instructions="Answer from the logs you open.",
            tools=[incident_log, stack.tool],
            middleware=[stack.recall],
            compaction_strategy=strategy,
            default_options={"store": False},
        )
        session = agent.create_session()
        for question in INCIDENTS:
            await agent.run(question.text, session=session)
        report = offline.report()
        totals = offline.totals()
        calls = offline.calls()
    assert totals.requests.get("record", 0) >= 1, report
    asked = [c for c in calls if c.label == "record"]
    assert [f"call {c.number} (a record request): " in report for c in asked] == [True] * len(asked)
    assert stack.tool_results.records_in_conversation > 0  # the answers quoted the user's values: kept as records
    lines = report.splitlines()
    assert lines[-2].startswith(f"total: {totals.calls} call(s) ({sum(totals.requests.values())} compaction request")
    assert lines[-1].startswith("without compaction: $")
    assert totals.calls == len(calls)
    assert totals.uncompacted_cost > 0
    assert totals.uncompacted_over_window > 0  # the uncompacted conversation outgrows the 8,000-token window


async def test_without_a_strategy_the_conversation_without_compaction_is_the_conversation() -> None:
    """The report's "without compaction" prices what the agent would have sent: with no strategy at all, that is
    exactly what it sent, the harness's todo list on each turn's first call and its absence on the next included
    (keeping that message for good priced a cached prefix the real requests never had)."""
    async with OfflineProvider(QUESTIONS, encoder=TOKENIZER) as offline:
        client = OpenAIChatClient(model="gpt-6-luna", api_key="sk-offline", base_url=offline.base_url)
        agent = harness_agent(client, None, tools=[lookup_deployment], default_options={"store": False})
        await ask(agent)
        totals = offline.totals()
        leading = [call.messages for call in offline.calls()]
    assert totals.calls == 2 * len(QUESTIONS)
    assert len(set(leading)) > 1
    assert totals.uncompacted_cost == pytest.approx(totals.cost)
    assert totals.uncompacted_cached_share == pytest.approx(totals.cached_share)


async def test_a_question_the_offline_model_was_not_given_is_named_in_the_report() -> None:
    async with OfflineProvider(QUESTIONS, encoder=TOKENIZER) as offline:
        client = OpenAIChatClient(model="gpt-6-luna", api_key="sk-offline", base_url=offline.base_url)
        agent = Agent(client, instructions="Be terse.", tools=[lookup_deployment], default_options={"store": False})
        reply = await agent.run("Hello there, what can you do?", session=agent.create_session())
        report = offline.report()
    assert reply.text == "Understood."
    assert (
        "a user message matches no Question and was answered 'Understood.': 'Hello there, what can you do?'" in report
    )
    assert offline.totals().requests == {}  # no compaction request was counted for it
