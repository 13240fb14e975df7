"""End to end: the composition inside ``create_harness_agent``, judged by what the provider received.

The bench's generated workload (``runner.load_scenario(Settings(), fill, 1)``: lookups of
planted codes between filler turns, then closing probes) is played at fill 1.5 and 3.0 on
a 32K window by the bench's scripted model behind the simulated provider. The agent is
built by ``create_harness_agent`` with the README wiring of the composition: a record half
and a user half (``summary_mode="boundary"``, ``remembered_requests=2``) composed by
``ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy``, one instance in both
compaction phases, the recall tool ``make_recall_tool(gate)``, and
``ToolResultRecallMiddleware`` wired with ``reforce=records.take_reforce``. It runs with
the harness defaults on (todo, mode and file memory in a temporary directory; web search
off, the simulated provider has none) and off (``disable_todo=True, disable_mode=True``),
streaming and not.

Both clients are the bench's in-process ``SimulatedChatClient`` (the framework's chat
client layers over a scripted model), the model client subclassed only to record every
request as it arrives. Nothing in the framework is mocked.
"""

from __future__ import annotations

import contextlib
import logging
import re
import tempfile
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import pytest
from agent_framework import ChatResponse, ChatResponseUpdate, Message, ResponseStream, create_harness_agent
from agent_framework._compaction import EXCLUDE_REASON_KEY

from maf_compaction import (
    CompactionBudgetExceeded,
    RecallGate,
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
    ToolResultRecallMiddleware,
    UserTurnAnchoredSummarizationCompactionStrategy,
    make_recall_tool,
)
from maf_compaction.adapters.convert import EXCLUDED_KEY
from maf_compaction.bench.client import SimulatedChatClient, scenario_tools
from maf_compaction.bench.model import ModelOptions, ScriptedModel, context_text
from maf_compaction.bench.provider import CallRecord, SimulatedProvider
from maf_compaction.bench.runner import Settings, load_scenario, run_turn, stored_messages
from maf_compaction.bench.scenario import Scenario
from maf_compaction.bench.simulator import get_profile
from maf_compaction.core.anchored import TOOL_NOTE_PREFIX
from maf_compaction.core.composition import OverflowPolicy
from offline_tokenizers import offline_tiktoken

SETTINGS: Final = Settings()  # a 32,000-token window, 2,048 output tokens
WINDOW: Final = SETTINGS.context_window
BUDGET: Final = SETTINGS.budget
FILLS: Final = (1.5, 3.0)
SEED: Final = 1
SCENARIOS: Final[Mapping[float, Scenario]] = {fill: load_scenario(SETTINGS, fill, SEED) for fill in FILLS}
REJECTED: Final = re.compile(r"Rejected .* compaction summary", re.IGNORECASE)
TOKENIZER: Final = offline_tiktoken()
#: Exclusions a marker the model sees links to (a user summary); the others must be named in a WARNING.
LINKED: Final = frozenset({"user_turn_summarized", "user_summaries_folded", "record_replaced"})

#: The harness defaults (todo, mode and file memory on; web search off) and the variant without todo and mode.
HARNESSES: Final[Mapping[str, Mapping[str, Any]]] = {
    "harness-defaults": {"disable_web_search": True},
    "no-todo-no-mode": {"disable_web_search": True, "disable_todo": True, "disable_mode": True},
}
#: ``min_groups_before_repeat`` of the recall middleware: the README's default (4) and the bench row's (2).
WIRINGS: Final[Mapping[str, int]] = {"readme": 4, "bench": 2}
CELLS: Final = [(w, h, f, s) for w in WIRINGS for h in HARNESSES for f in FILLS for s in (False, True)]
IDS: Final = [f"{w}-{h}-{f}-{'stream' if s else 'blocking'}" for w, h, f, s in CELLS]
MATRIX = pytest.mark.parametrize(("wiring", "harness", "fill", "stream"), CELLS, ids=IDS)


class ModelClient(SimulatedChatClient):
    """The bench's in-process client, keeping the text of every request as it arrives."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sent: list[str] = []
        self.streamed: list[bool] = []

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        self.sent.append(context_text(messages))
        self.streamed.append(stream)
        return super()._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)


@dataclass
class Run:
    """One conversation through the harness."""

    scenario: Scenario
    client: ModelClient
    strategy: ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy
    recall: ToolResultRecallMiddleware
    stored: list[Message]
    replies: list[str]
    logs: list[logging.LogRecord] = field(default_factory=list[logging.LogRecord])

    @property
    def calls(self) -> list[CallRecord]:
        return self.client.provider.calls


def readme_wiring(
    summarizer: Any,
    *,
    min_groups_before_repeat: int,
    overflow_policy: OverflowPolicy = "shed",
    budget: int = BUDGET,
) -> tuple[ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy, ToolResultRecallMiddleware, Any]:
    """The README's composition: both halves, the gate, the recall tool and its middleware."""
    records = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=budget, tokenizer=TOKENIZER)
    users = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=budget,
        tokenizer=TOKENIZER,
        client=summarizer,
        summary_mode="boundary",
        remembered_requests=2,
    )
    strategy = ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
        tokenizer=TOKENIZER, tool_results=records, user_turns=users, overflow_policy=overflow_policy
    )
    gate = RecallGate()
    recall = ToolResultRecallMiddleware(
        max_input_tokens=budget,
        tokenizer=TOKENIZER,
        arm=gate.arm,
        disarm=gate.disarm,
        trigger_fraction=records.trigger_fraction,
        record_max_tokens=4_000,
        min_groups_before_repeat=min_groups_before_repeat,
        reforce=records.take_reforce,
    )
    return strategy, recall, make_recall_tool(gate, target_tokens=2_000)


async def _overhead(agent: Any) -> Any:
    from maf_compaction import measure_agent_overhead

    return measure_agent_overhead(agent, TOKENIZER)


async def _play(
    scenario: Scenario,
    harness: Mapping[str, Any],
    *,
    stream: bool,
    repeat: int,
    policy: OverflowPolicy = "shed",
    record_quality: float = 1.0,
) -> Run:
    provider = SimulatedProvider(
        encoder=TOKENIZER, window=WINDOW, profile=get_profile(SETTINGS.profile), cache=SETTINGS.cache
    )
    model = ScriptedModel(scenario, ModelOptions(seed=SEED, record_quality=record_quality).without_losses())
    client = ModelClient(model=model, provider=provider)
    summarizer = SimulatedChatClient(model=model, provider=provider, kind="summarizer")
    # As the README says: the budget counts messages only, so measure what the harness sends beside them.
    probe = create_harness_agent(
        client,
        agent_instructions=scenario.system,
        tools=[*scenario_tools(scenario), make_recall_tool(RecallGate(), target_tokens=2_000)],
        max_context_window_tokens=WINDOW,
        max_output_tokens=SETTINGS.max_output_tokens,
        tokenizer=TOKENIZER,
        **harness,
    )
    budget = (await _overhead(probe)).budget(WINDOW, SETTINGS.max_output_tokens, margin=200)
    strategy, recall, recall_tool = readme_wiring(
        summarizer, min_groups_before_repeat=repeat, overflow_policy=policy, budget=budget
    )
    agent = create_harness_agent(
        client,
        agent_instructions=scenario.system,
        tools=[*scenario_tools(scenario), recall_tool],
        middleware=[recall],
        max_context_window_tokens=WINDOW,
        max_output_tokens=SETTINGS.max_output_tokens,
        tokenizer=TOKENIZER,
        before_compaction_strategy=strategy,
        after_compaction_strategy=strategy,
        **harness,
    )
    session = agent.create_session()
    replies: list[str] = []
    for number, turn in enumerate(scenario.turns, start=1):
        provider.turn = number
        response = await run_turn(agent, turn.user, session=session, stream=stream)
        replies.append(response.text)
    assert all(s is stream for s in client.streamed)
    return Run(scenario, client, strategy, recall, stored_messages(session), replies)


_RUNS: dict[tuple[str, str, float, bool], Run] = {}


async def run(wiring: str, harness: str, fill: float, stream: bool, caplog: pytest.LogCaptureFixture) -> Run:
    """Play one cell once per session of tests (runs are deterministic), its logs captured."""
    key = (wiring, harness, fill, stream)
    if key not in _RUNS:
        caplog.set_level(logging.WARNING, logger="agent_framework")
        caplog.set_level(logging.WARNING, logger="maf_compaction")
        start = len(caplog.records)
        # The harness's default file memory writes under the working directory: give each run its own.
        with tempfile.TemporaryDirectory(prefix="maf-e2e-composition-") as directory, contextlib.chdir(directory):
            result = await _play(SCENARIOS[fill], HARNESSES[harness], stream=stream, repeat=WIRINGS[wiring])
        result.logs = list(caplog.records[start:])
        _RUNS[key] = result
    return _RUNS[key]


@MATRIX
async def test_both_halves_work_in_the_run(
    wiring: str, harness: str, fill: float, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    result = await run(wiring, harness, fill, stream, caplog)
    strategy = result.strategy
    assert strategy.passes > 0
    assert strategy.tool_results.records_in_conversation > 0, "the model wrote no record"
    assert strategy.tool_results.groups_covered > 0, "no record covered a tool group"
    assert result.recall.forced_calls > 0
    assert strategy.budget_failures == 0
    if fill > 2:
        assert strategy.user_turns.user_compactions > 0, "past twice the window the user half must summarise"


@MATRIX
async def test_every_request_fits_the_window(
    wiring: str, harness: str, fill: float, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    result = await run(wiring, harness, fill, stream, caplog)
    over = [(i, c.kind, c.input_tokens) for i, c in enumerate(result.calls) if c.over_window]
    assert not over, f"requests over the {WINDOW:,}-token window (index, kind, tokens): {over}"
    assert max(c.input_tokens for c in result.calls) <= WINDOW


@MATRIX
async def test_every_planted_code_is_answered(
    wiring: str, harness: str, fill: float, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    result = await run(wiring, harness, fill, stream, caplog)
    probes = [(t, r) for t, r in zip(result.scenario.turns, result.replies, strict=True) if t.probe is not None]
    assert probes, "the scenario has no probe"
    missing = [(t.probe.scope, v) for t, r in probes if t.probe is not None for v in t.probe.expected if v not in r]
    assert not missing, f"{len(missing)} planted value(s) not answered: {missing[:6]}"


@MATRIX
async def test_the_framework_rejects_no_summary(
    wiring: str, harness: str, fill: float, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    result = await run(wiring, harness, fill, stream, caplog)
    framework = [r.getMessage() for r in result.logs if r.name.startswith("agent_framework")]
    framework = [m for m in framework if REJECTED.search(m)]
    assert not framework, f"the framework rejected our summaries: {framework[:2]}"


@pytest.mark.parametrize("fill", FILLS)
async def test_streaming_sends_the_same_requests(fill: float, caplog: pytest.LogCaptureFixture) -> None:
    blocking = await run("readme", "no-todo-no-mode", fill, False, caplog)
    streaming = await run("readme", "no-todo-no-mode", fill, True, caplog)
    assert streaming.client.sent == blocking.client.sent
    assert streaming.replies == blocking.replies


@MATRIX
async def test_whatever_left_the_prompt_unrecorded_and_unsummarized_is_named_in_a_warning(
    wiring: str, harness: str, fill: float, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    result = await run(wiring, harness, fill, stream, caplog)
    named = {
        word
        for r in result.logs
        if r.name == "maf_compaction" and r.levelno >= logging.WARNING
        for word in re.findall(r"[\w.-]+", r.getMessage())
    }
    silent = [
        m.message_id
        for m in result.stored
        if m.additional_properties.get(EXCLUDED_KEY)
        and m.additional_properties.get(EXCLUDE_REASON_KEY) not in LINKED
        and m.message_id not in named
    ]
    assert not silent, f"excluded without a WARNING naming them: {silent}"
    if result.strategy.shed_events:
        notes = [m for m in result.stored if m.text.startswith(TOOL_NOTE_PREFIX)]
        assert notes or any(TOOL_NOTE_PREFIX in s for s in result.client.sent), "a shed left no note the model sees"


async def test_raise_reaches_the_host_through_the_harness_where_shed_would_shed() -> None:
    """README wiring, fill 3.0, records that quote 70% of the values: ``"raise"`` keeps the partly quoted lookups
    until they no longer fit and ends the run with the error; with faithful records fill 3.0 completes.

    The lookups are number-dense logs (a value on every line), so the safety net, which cuts an uncovered
    result to its value lines, cannot make room either (on the default lookups it does: see
    tests/test_safety_net.py).
    """
    dense = load_scenario(replace(SETTINGS, results="dense"), 3.0, SEED)
    with tempfile.TemporaryDirectory(prefix="maf-e2e-composition-") as directory, contextlib.chdir(directory):
        with pytest.raises(CompactionBudgetExceeded) as raised:
            await _play(dense, HARNESSES["no-todo-no-mode"], stream=False, repeat=4, policy="raise", record_quality=0.7)
        fits = await _play(SCENARIOS[3.0], HARNESSES["no-todo-no-mode"], stream=False, repeat=4, policy="raise")
    assert raised.value.needed > raised.value.budget
    assert fits.strategy.budget_failures == 0
    assert len(fits.replies) == len(SCENARIOS[3.0].turns)
