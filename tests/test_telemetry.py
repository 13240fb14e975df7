"""Telemetry (issue 36, item 8): the spans and metrics of compaction passes and requests, read with the SDK.

Every test drives real framework classes (``Agent``, its sessions, the function-invocation
loop, ``create_harness_agent``) over a scripted chat client built from the framework's own
client layers (the telemetry layer included, so the framework's ``invoke_agent`` and
``chat`` spans are real), and reads what was emitted with the OpenTelemetry SDK's
``InMemorySpanExporter`` and ``InMemoryMetricReader``.

OpenTelemetry's global providers can be set once per process: this module sets them on
first use in its worker (``--dist loadfile`` keeps the module on one worker), behind a
sampler that records only while one of its tests runs, and each test starts with an empty
exporter and fresh (delta) metric points.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from agent_framework import (
    Agent,
    AgentSession,
    BaseChatClient,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    Message,
    ResponseStream,
    UsageDetails,
    create_harness_agent,
    tool,
)
from agent_framework import observability as framework_observability
from agent_framework._compaction import EXCLUDE_REASON_KEY, EXCLUDED_KEY, CharacterEstimatorTokenizer
from agent_framework._middleware import ChatMiddlewareLayer
from agent_framework._tools import FunctionInvocationLayer
from agent_framework.observability import ChatTelemetryLayer
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import Counter as CounterInstrument
from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import StatusCode

from maf_compaction import (
    AnchoredCompactionStrategy,
    CompactionBudgetExceeded,
    CompactionStack,
    ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
    UserTurnAnchoredSummarizationCompactionStrategy,
    make_recall_tool,
)
from maf_compaction.adapters import telemetry
from maf_compaction.core import anchored as anchored_rules
from maf_compaction.core import records as record_rules
from maf_compaction.core import user_summaries as user_rules
from maf_compaction.core.anchored import Report
from maf_compaction.core.changes import Changes, Prefix, changes, kept_prefix, prompt
from maf_compaction.core.effects import Request, Route
from maf_compaction.core.model import MessageRecord, Part, flagged, history
from maf_compaction.core.records import RECORD_INSTRUCTION
from maf_compaction.core.state import RequestKind
from maf_compaction.core.values import distinctive_values

ROOT: Final = Path(__file__).resolve().parents[1]
TOKENIZER: Final = CharacterEstimatorTokenizer()
FILLER: Final = "the service answered within its window and nothing else of note happened"
#: The record stack's budget (four characters a token): a record is asked for in the fourth turn.
RECORD_BUDGET: Final = 2_000
TURNS: Final = 8


# --- the SDK, once per process ------------------------------------------------------------------------


class _Switch(Sampler):
    """Records while a test of this module runs; drops every span otherwise (other modules on this worker)."""

    on = False

    def should_sample(  # noqa: PLR0917 - the SDK's signature
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        del parent_context, trace_id, name, kind, links
        if not self.on:
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, trace_state)

    def get_description(self) -> str:
        return "maf_compaction tests: on while a telemetry test runs"


@dataclass
class Telemetry:
    """What the SDK captured during one test."""

    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [span for span in self.spans() if span.name.startswith(prefix)]

    def parent(self, span: ReadableSpan) -> ReadableSpan | None:
        by_id = {s.context.span_id: s for s in self.spans() if s.context is not None}
        return by_id.get(span.parent.span_id) if span.parent is not None else None

    def root(self, span: ReadableSpan) -> ReadableSpan:
        while (parent := self.parent(span)) is not None:
            span = parent
        return span

    def points(self) -> dict[str, list[tuple[dict[str, Any], float, int]]]:
        """Our instruments' points since the last read: (attributes, sum or value, count)."""
        found: dict[str, list[tuple[dict[str, Any], float, int]]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                if scope.scope.name != telemetry.SCOPE:
                    continue
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        value = getattr(point, "sum", None)
                        value = getattr(point, "value", 0) if value is None else value
                        count = getattr(point, "count", 1)
                        found.setdefault(metric.name, []).append((dict(point.attributes or {}), value, count))
        return found


_SDK: dict[str, Any] = {}
_SWITCH: Final = _Switch()


def _providers() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    if not _SDK:
        exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider(sampler=_SWITCH)
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
        reader = InMemoryMetricReader(
            preferred_temporality={
                CounterInstrument: AggregationTemporality.DELTA,
                HistogramInstrument: AggregationTemporality.DELTA,
            }
        )
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        assert trace.get_tracer_provider() is tracer_provider, "another module set the tracer provider first"
        _SDK.update(exporter=exporter, reader=reader)
    return _SDK["exporter"], _SDK["reader"]


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    """The SDK's in-memory exporter and reader, emptied, recording for the length of the test."""
    exporter, reader = _providers()
    assert framework_observability.OBSERVABILITY_SETTINGS.ENABLED
    exporter.clear()
    reader.get_metrics_data()  # delta points: start from nothing
    _SWITCH.on = True
    try:
        yield Telemetry(exporter, reader)
    finally:
        _SWITCH.on = False


# --- the scripted provider --------------------------------------------------------------------------


Reply = Callable[[Sequence[Message]], list[Content]]


def lookup_result(n: int) -> str:
    """Twenty lines, four with a code."""
    lines = [f"# lookup of item {n}"]
    lines += [f"code_{i}=XR-{n:02d}{i:02d}" if i % 5 == 0 else FILLER for i in range(20)]
    return "\n".join(lines)


def agent_reply(messages: Sequence[Message]) -> list[Content]:
    """The agent's model: a record quoting every value when asked for one, a lookup per question, then an answer."""
    last = messages[-1]
    if last.role == "user" and (last.text or "").startswith(RECORD_INSTRUCTION):
        values = [
            value
            for m in messages
            for c in m.contents
            if c.type == "function_result"
            for value in distinctive_values(str(c.result))
        ]
        return [Content.from_text("lookup values: " + " ".join(dict.fromkeys(values)))]
    if last.role == "user":
        return [Content.from_function_call(f"call_{len(messages)}", "lookup", arguments={"n": len(messages)})]
    return [Content.from_text(f"done after {len(messages)} messages")]


def summary_reply(messages: Sequence[Message]) -> list[Content]:
    """The summarizer: the transcript's codes."""
    return [Content.from_text("Summary: " + " ".join(distinctive_values(" ".join(m.text or "" for m in messages))))]


class Scripted(FunctionInvocationLayer, ChatMiddlewareLayer, ChatTelemetryLayer, BaseChatClient):
    """The framework's client layers (telemetry included) over a scripted model; each answer reports usage."""

    OTEL_PROVIDER_NAME = "scripted"

    def __init__(self, reply: Reply, *, delay: float = 0.0) -> None:
        super().__init__()
        self.reply = reply
        self.delay = delay
        self.calls = 0
        self.usage: list[UsageDetails] = []
        #: The ids of every message the model was sent.
        self.sent_ids: set[str] = set()

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Any:
        self.calls += 1
        self.sent_ids |= {m.message_id for m in messages if m.message_id}
        usage = UsageDetails(input_token_count=10 * len(messages) + self.calls, output_token_count=7)
        self.usage.append(usage)
        response = ChatResponse(
            messages=[Message("assistant", self.reply(messages))],
            response_id=f"r{self.calls}",
            model="scripted",
            usage_details=usage,
        )

        async def whole() -> ChatResponse:
            await asyncio.sleep(self.delay)
            return response

        if not stream:
            return whole()

        async def updates() -> Any:
            answer = await whole()
            for message in answer.messages:
                yield ChatResponseUpdate(
                    role="assistant", contents=list(message.contents), response_id=f"r{self.calls}"
                )
            yield ChatResponseUpdate(contents=[Content.from_usage(usage)])

        return ResponseStream(updates(), finalizer=ChatResponse.from_updates)


@tool(approval_mode="never_require")
def lookup(n: int) -> str:
    """Look up an item's rollout codes."""
    return lookup_result(n)


def question(n: int) -> str:
    return f"question {n}: what does the lookup of item {n} say about the rollout? " + "Context. " * 10


async def ask(agent: Any, session: AgentSession, text: str, *, stream: bool) -> None:
    if stream:
        run = agent.run(text, session=session, stream=True)
        async for _ in run:
            pass
        await run.get_final_response()
    else:
        await agent.run(text, session=session)


def record_agent(*, harness: bool) -> tuple[Any, CompactionStack, Scripted]:
    """The README's record stack (records asked over the cached prefix) on a plain Agent or the harness."""
    stack = CompactionStack.build(
        max_input_tokens=RECORD_BUDGET, tokenizer=TOKENIZER, keep_head_groups=1, keep_tail_groups=1
    )
    client = Scripted(agent_reply)
    tools = [lookup, make_recall_tool(stack.gate)]
    if harness:
        agent = create_harness_agent(
            client,
            agent_instructions="Answer from the lookups.",
            tools=tools,
            middleware=[stack.recall],
            before_compaction_strategy=stack.strategy,
            after_compaction_strategy=stack.strategy,
            tokenizer=TOKENIZER,
            disable_web_search=True,
            disable_file_memory=True,
            disable_todo=True,
            disable_mode=True,
        )
    else:
        agent = Agent(
            client,
            "Answer from the lookups.",
            tools=tools,
            middleware=[stack.recall],
            compaction_strategy=stack.strategy,
            tokenizer=TOKENIZER,
        )
    return agent, stack, client


async def play_records(*, harness: bool = False, stream: bool = False) -> tuple[CompactionStack, Scripted]:
    agent, stack, client = record_agent(harness=harness)
    session = agent.create_session()
    for n in range(TURNS):
        await ask(agent, session, question(n), stream=stream)
    return stack, client


def requirement(n: int) -> str:
    """A long user turn with one exact value."""
    return f"requirement {n}: the rollout must keep code RQ-{n:03d}-ALPHA. " + " ".join([FILLER] * 6)


async def play_summaries(
    summarizer: Scripted, turns: int = 8, **options: Any
) -> tuple[UserTurnAnchoredSummarizationCompactionStrategy, Scripted]:
    """User turns that outgrow a small budget on a plain Agent, summarised by ``summarizer``; the agent's model."""
    strategy = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=1_200, tokenizer=TOKENIZER, client=summarizer, **options
    )
    model = Scripted(lambda m: [Content.from_text("noted")])
    agent = Agent(model, "Keep every requirement.", compaction_strategy=strategy)
    session = agent.create_session()
    for n in range(turns):
        await agent.run(requirement(n), session=session)
    return strategy, model


def whole(value: object) -> int:
    """An attribute that must be an integer."""
    assert isinstance(value, int)
    return value


# --- spans nest under the framework's --------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["blocking", "streamed"])
@pytest.mark.parametrize("harness", [False, True], ids=["agent", "harness"])
async def test_every_pass_is_a_child_of_the_frameworks_chat_or_agent_span_and_every_request_of_its_pass(
    otel: Telemetry, harness: bool, stream: bool
) -> None:
    stack, _ = await play_records(harness=harness, stream=stream)

    passes = otel.named("compaction_pass ")
    assert len(passes) == stack.strategy.passes > 0
    parents = Counter(parent.name.split(" ")[0] for span in passes if (parent := otel.parent(span)) is not None)
    assert sum(parents.values()) == len(passes), "a pass without a parent span"
    if harness:  # the harness compacts before and after each run (the agent's span) and per model call (chat)
        assert set(parents) == {"chat", "invoke_agent"}
    else:  # the chat client's layers run the strategy inside the chat span
        assert set(parents) == {"chat"}
    for span in passes:  # and every chat span is the agent's: each pass belongs to an agent run
        assert otel.root(span).name.startswith("invoke_agent ")
    for span in passes:
        assert span.name == f"compaction_pass {type(stack.strategy).__name__}"
        assert span.attributes is not None
        assert span.attributes[telemetry.STRATEGY] == type(stack.strategy).__name__
    requests = otel.named("compaction_request ")
    assert len(requests) == stack.strategy.prefix_requests > 0
    for span in requests:
        parent = otel.parent(span)
        assert parent is not None
        assert parent.name.startswith("compaction_pass ")
        assert span.attributes is not None
        assert span.attributes[telemetry.KIND] == "record"
        assert span.attributes[telemetry.ROUTE] == "cached_prefix"
        assert span.attributes[telemetry.KEPT] is True
        assert parent.attributes is not None
        assert whole(parent.attributes[telemetry.PASS_REQUESTS]) >= 1


async def test_a_summary_request_is_a_child_of_its_pass_and_the_summarizers_chat_span_a_child_of_the_request(
    otel: Telemetry,
) -> None:
    summarizer = Scripted(summary_reply)
    strategy, model = await play_summaries(summarizer)

    requests = otel.named("compaction_request ")
    assert len(requests) == strategy.summarizer_calls == summarizer.calls > 0
    answers = {a.identity: a for a in strategy.decision_state().answers}
    for span, usage in zip(requests, summarizer.usage, strict=True):
        attributes = span.attributes
        assert attributes is not None
        assert span.name == "compaction_request summary"
        pass_span = otel.parent(span)
        assert pass_span is not None
        assert pass_span.name == f"compaction_pass {type(strategy).__name__}"
        chats = [s for s in otel.named("chat ") if (p := otel.parent(s)) is not None and p.context == span.context]
        assert len(chats) == 1, "the summarizer's own chat span nests under the request"
        assert attributes[telemetry.KIND] == RequestKind.SUMMARY.value
        assert attributes[telemetry.ROUTE] == "summarizer"
        identity = attributes[telemetry.IDENTITY]
        assert identity in answers  # the identity the state keeps the answer under
        assert attributes[telemetry.MESSAGE_ID] == answers[str(identity)].message_id
        assert attributes[telemetry.OUTCOME] == "answered"
        assert attributes[telemetry.KEPT] is True
        assert attributes[telemetry.MESSAGE_ID] in model.sent_ids
        assert attributes[telemetry.INPUT_TOKENS] == usage.get("input_token_count")
        assert attributes[telemetry.OUTPUT_TOKENS] == usage.get("output_token_count")
        assert span.status.status_code is StatusCode.UNSET


# --- what a pass did -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One pass as the framework's list shows it: what it excluded (by reason) and cut, and where it first changed."""

    shed: int
    shortened: int
    first: int | None
    prompt: tuple[str, ...]  # the included messages, rendered


def _state(message: Message) -> tuple[bool, str | None, str]:
    props = message.additional_properties
    excluded = bool(props.get(EXCLUDED_KEY))
    return excluded, props.get(EXCLUDE_REASON_KEY) if excluded else None, json.dumps(message.to_dict()["contents"])


def seen(before: Sequence[tuple[Message, tuple[bool, str | None, str]]], after: Sequence[Message]) -> Seen:
    """Read one pass off the list: ``before`` is each message with its state as handed in, ``after`` the list after."""
    index = {id(message): i for i, (message, _) in enumerate(before)}
    shed = shortened = 0
    changed: list[int] = []
    inserted = False
    for message in after:
        if id(message) not in index:
            inserted = True
            continue
        i = index[id(message)]
        if inserted:
            changed.append(i)
            inserted = False
        old, new = before[i][1], _state(message)
        if new == old:
            continue
        changed.append(i)
        if new[0] and not old[0]:
            shed += new[1] == "anchored_compaction"
        elif new[2] != old[2] and not new[0]:
            shortened += 1
    if inserted:
        changed.append(len(before))
    kept = {id(m) for m in after}
    changed += [i for i, (m, _) in enumerate(before) if id(m) not in kept]
    prompt = tuple(json.dumps([m.role, m.message_id, m.to_dict()["contents"]]) for m in after if not _state(m)[0])
    return Seen(shed, shortened, min(changed, default=None), prompt)


class ReportingAnchored(AnchoredCompactionStrategy):
    """The anchored strategy, keeping each pass's report and what the pass did to the framework's list, in order."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reports: list[Report] = []
        self.seen: list[Seen] = []

    def compact_to(self, messages: list[Message], *, ceiling: int) -> bool:
        handed = [(message, _state(message)) for message in messages]
        changed = super().compact_to(messages, ceiling=ceiling)
        self.seen.append(seen(handed, messages))
        return changed

    def _observe(self, report: Report, asked: set[str]) -> None:
        super()._observe(report, asked)
        self.reports.append(report)


async def test_pass_attributes_say_what_the_pass_did_as_its_report_and_the_list_say(otel: Telemetry) -> None:
    strategy = ReportingAnchored(max_input_tokens=1_500, tokenizer=TOKENIZER, keep_head_groups=1, keep_tail_groups=1)
    agent = Agent(Scripted(agent_reply), "Answer from the lookups.", tools=[lookup], compaction_strategy=strategy)
    session = agent.create_session()
    for n in range(TURNS):
        await agent.run(question(n), session=session)

    passes = otel.named("compaction_pass ")
    assert len(passes) == len(strategy.reports) == len(strategy.seen) == strategy.passes
    previous: tuple[str, ...] | None = None
    for span, report, list_says in zip(passes, strategy.reports, strategy.seen, strict=True):
        attributes = span.attributes
        assert attributes is not None
        # The report's own figures.
        assert attributes[telemetry.TOKENS_BEFORE] == report.tokens_before
        assert attributes[telemetry.TOKENS_AFTER] == report.tokens_after
        assert attributes[telemetry.BUDGET] == 1_500
        assert attributes[telemetry.CHANGED] is report.changed
        assert whole(attributes[telemetry.SHED]) >= len(
            {*report.shed, *report.joined}
        )  # newly shed, and sheds replayed
        # What the pass did to the list it was handed.
        assert attributes[telemetry.SHED] == list_says.shed
        assert attributes[telemetry.SHORTENED] == list_says.shortened
        assert attributes.get(telemetry.FIRST_CHANGED) == list_says.first
        assert attributes[telemetry.RECORDED] == attributes[telemetry.SUMMARISED] == 0
        assert attributes[telemetry.PROMPT_MESSAGES] == len(list_says.prompt)
        # Whether it kept the last pass's prompt as its prefix, byte for byte.
        if previous is None:
            assert telemetry.PREFIX_STABLE not in attributes  # the first pass has no prompt to keep
        else:
            kept = next((i for i, (a, b) in enumerate(zip(previous, list_says.prompt, strict=False)) if a != b), None)
            kept = min(len(previous), len(list_says.prompt)) if kept is None else kept
            assert attributes[telemetry.PREFIX_MESSAGES] == kept
            assert attributes[telemetry.PREFIX_STABLE] is (kept == len(previous))
        previous = list_says.prompt
    assert any(span.attributes and span.attributes[telemetry.SHORTENED] for span in passes), "nothing was shortened"
    assert any(span.attributes and span.attributes[telemetry.SHED] for span in passes), "nothing was shed"
    broken = [s for s in passes if s.attributes and s.attributes.get(telemetry.PREFIX_STABLE) is False]
    stable = [s for s in passes if s.attributes and s.attributes.get(telemetry.PREFIX_STABLE) is True]
    assert broken
    assert stable


# --- metrics ---------------------------------------------------------------------------------------------


def total(points: Mapping[str, list[tuple[dict[str, Any], float, int]]], name: str, **where: Any) -> float:
    """The sum of ``name``'s points whose attributes include ``where`` (keys with ``__`` for ``.``)."""
    wanted = {key.replace("__", "."): value for key, value in where.items()}
    return sum(value for attributes, value, _ in points.get(name, []) if wanted.items() <= attributes.items())


def count(points: Mapping[str, list[tuple[dict[str, Any], float, int]]], name: str) -> int:
    """How many values a histogram recorded."""
    return sum(n for _, _, n in points.get(name, []))


async def test_pass_metrics_match_the_strategys_own_counters_and_reports(otel: Telemetry) -> None:
    strategy = ReportingAnchored(max_input_tokens=1_500, tokenizer=TOKENIZER, keep_head_groups=1, keep_tail_groups=1)
    agent = Agent(Scripted(agent_reply), "Answer from the lookups.", tools=[lookup], compaction_strategy=strategy)
    session = agent.create_session()
    for n in range(TURNS):
        await agent.run(question(n), session=session)

    points = otel.points()
    name = type(strategy).__name__
    assert total(points, "maf_compaction.passes", maf_compaction__strategy=name) == strategy.passes > 0
    assert total(points, "maf_compaction.passes", maf_compaction__pass__changed=True) == sum(
        r.changed for r in strategy.reports
    )
    assert count(points, "maf_compaction.pass.duration") == strategy.passes
    saved = sum(max(0, r.tokens_before - r.tokens_after) for r in strategy.reports)
    assert total(points, "maf_compaction.tokens.saved", maf_compaction__strategy=name) == saved > 0
    changed = "maf_compaction.messages.changed"
    assert total(points, changed, maf_compaction__change="shed") == sum(s.shed for s in strategy.seen) > 0
    assert total(points, changed, maf_compaction__change="shortened") == sum(s.shortened for s in strategy.seen) > 0
    assert total(points, changed, maf_compaction__change="recorded") == 0
    assert "maf_compaction.requests" not in points  # the anchored strategy asks for nothing


async def test_request_metrics_match_the_strategys_own_counters(otel: Telemetry) -> None:
    summarizer = Scripted(summary_reply)
    strategy, _ = await play_summaries(summarizer)
    stack, _ = await play_records()

    points = otel.points()
    requests = "maf_compaction.requests"
    assert total(points, requests, maf_compaction__request__kind="summary") == strategy.summarizer_calls > 0
    assert total(points, requests, maf_compaction__request__kind="summary", maf_compaction__request__kept=True) == (
        strategy.user_compactions
    )
    assert total(points, requests, maf_compaction__request__kind="record") == stack.strategy.prefix_requests > 0
    assert total(points, requests, maf_compaction__request__route="cached_prefix") == stack.strategy.prefix_requests
    assert total(points, requests, maf_compaction__request__outcome="failed") == 0
    assert (
        count(points, "maf_compaction.request.duration") == strategy.summarizer_calls + stack.strategy.prefix_requests
    )
    tokens = "maf_compaction.request.tokens"
    inputs = sum(u.get("input_token_count") or 0 for u in summarizer.usage)
    assert total(points, tokens, maf_compaction__request__kind="summary", gen_ai__token__type="input") == inputs
    outputs = sum(u.get("output_token_count") or 0 for u in summarizer.usage)
    assert total(points, tokens, maf_compaction__request__kind="summary", gen_ai__token__type="output") == outputs


# --- kept, refused, timed out --------------------------------------------------------------------------


async def test_a_refused_summary_is_marked_not_kept_and_says_why(otel: Telemetry) -> None:
    bloated = Scripted(lambda messages: [Content.from_text(f"{summary_reply(messages)[0].text} {FILLER * 200}")])
    strategy, model = await play_summaries(bloated)

    requests = otel.named("compaction_request ")
    assert strategy.user_summaries_refused > 0
    assert len(requests) == strategy.summarizer_calls
    refused = [s for s in requests if s.attributes and s.attributes[telemetry.KEPT] is False]
    assert len(refused) == strategy.user_summaries_refused
    for span in refused:
        assert span.attributes is not None
        assert span.attributes[telemetry.OUTCOME] == "answered"
        assert span.attributes[telemetry.REFUSED] == "not_smaller"
        assert span.attributes[telemetry.MESSAGE_ID] not in model.sent_ids


class CutSummarizer(Scripted):
    """A summarizer whose every answer runs on until the provider cuts it at the request's output cap."""

    def __init__(self) -> None:
        super().__init__(summary_reply)
        #: The output cap of each request, as sent.
        self.caps: list[int] = []

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Any:
        self.caps.append(int(options["max_tokens"]))
        text = " ".join(["again"] * self.caps[-1])

        async def cut() -> ChatResponse:
            return ChatResponse(messages=[Message("assistant", [Content.from_text(text)])], finish_reason="length")

        return cut()


async def test_an_answer_cut_at_its_output_cap_is_marked_cut_with_the_cap_and_not_kept(otel: Telemetry) -> None:
    summarizer = CutSummarizer()
    strategy, _ = await play_summaries(summarizer)

    requests = otel.named("compaction_request ")
    assert strategy.answers_cut == len(summarizer.caps) == len(requests) > 0
    for span, cap in zip(requests, summarizer.caps, strict=True):
        assert span.attributes is not None
        assert span.attributes[telemetry.OUTCOME] == telemetry.CUT
        assert span.attributes[telemetry.MAX_TOKENS] == cap
        assert span.attributes[telemetry.KEPT] is False
        assert span.attributes[telemetry.REFUSED] == telemetry.CUT
        assert span.status.status_code is not StatusCode.ERROR  # an answer, not an error
    points = otel.points()
    assert total(points, "maf_compaction.requests", maf_compaction__request__outcome=telemetry.CUT) == len(requests)


def test_an_answer_cut_at_the_agents_own_cap_is_kept_when_its_complete_lines_were_placed() -> None:
    """An answer over the cached prefix cut at the agent's own cap is judged by its complete lines: it counts as
    kept when its message was placed, and as not placed otherwise (never as refused for the cut)."""
    asked = Request("r", RequestKind.RECORD, Route.CACHED_PREFIX, message_id="rec_1")
    verdict = telemetry._verdict  # pyright: ignore[reportPrivateUsage]
    assert verdict(asked, telemetry.CUT_JUDGED, frozenset({"rec_1"}), {}) == (True, None)
    assert verdict(asked, telemetry.CUT_JUDGED, frozenset(), {}) == (False, telemetry.NOT_PLACED)
    assert verdict(asked, telemetry.CUT, frozenset({"rec_1"}), {}) == (False, telemetry.CUT)


async def test_a_summary_past_its_time_limit_is_marked_timed_out_with_error_status(otel: Telemetry) -> None:
    slow = Scripted(summary_reply, delay=30)
    strategy = UserTurnAnchoredSummarizationCompactionStrategy(max_input_tokens=1_200, tokenizer=TOKENIZER, client=slow)
    strategy.request_timeout_s = 0.05
    agent = Agent(Scripted(lambda m: [Content.from_text("noted")]), "Keep it.", compaction_strategy=strategy)
    session = agent.create_session()
    for n in range(8):
        await agent.run(requirement(n), session=session)

    requests = otel.named("compaction_request ")
    assert strategy.timed_out_requests > 0
    timed_out = [s for s in requests if s.attributes and s.attributes[telemetry.OUTCOME] == "timed_out"]
    assert len(timed_out) == strategy.timed_out_requests
    for span in timed_out:
        assert span.attributes is not None
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes[telemetry.ERROR_TYPE] == "TimeoutError"
        assert span.attributes[telemetry.TIMEOUT] == 0.05
        assert span.attributes[telemetry.KEPT] is False
        assert span.attributes[telemetry.REFUSED] == "timed_out"
        assert span.events == ()  # the exception itself only with the framework's sensitive data on
        assert span.end_time is not None
        assert span.start_time is not None
        assert (span.end_time - span.start_time) / 1e9 < 5  # ended at the limit, not when the provider answered
    points = otel.points()
    outcome = {"maf_compaction__request__outcome": "timed_out"}
    assert total(points, "maf_compaction.requests", **outcome) == strategy.timed_out_requests


class ProviderDown(RuntimeError):
    """The scripted provider refused a record request."""


def refusing_records(messages: Sequence[Message]) -> list[Content]:
    """The agent's model, whose provider fails every record request (the conversation's own calls go through)."""
    last = messages[-1]
    if last.role == "user" and (last.text or "").startswith(RECORD_INSTRUCTION):
        raise ProviderDown("503")
    return agent_reply(messages)


async def test_a_failed_record_request_is_marked_failed_and_counted_as_the_strategy_counts_it(otel: Telemetry) -> None:
    stack = CompactionStack.build(
        max_input_tokens=RECORD_BUDGET, tokenizer=TOKENIZER, keep_head_groups=1, keep_tail_groups=1
    )
    agent = Agent(
        Scripted(refusing_records),
        "Answer from the lookups.",
        tools=[lookup, make_recall_tool(stack.gate)],
        middleware=[stack.recall],
        compaction_strategy=stack.strategy,
        tokenizer=TOKENIZER,
    )
    session = agent.create_session()
    for n in range(TURNS):
        await agent.run(question(n), session=session)

    records = stack.tool_results
    failed = [s for s in otel.named("compaction_request record") if s.attributes]
    assert len(failed) == records.failed_prefix_requests == records.prefix_requests > 0
    for span in failed:
        assert span.attributes is not None
        assert span.attributes[telemetry.ROUTE] == "cached_prefix"
        assert span.attributes[telemetry.OUTCOME] == "failed"
        assert span.attributes[telemetry.KEPT] is False
        assert span.attributes[telemetry.REFUSED] == "failed"
        assert span.attributes[telemetry.ERROR_TYPE] == "ProviderDown"
        assert span.status.status_code is StatusCode.ERROR
    points = otel.points()
    assert total(points, "maf_compaction.requests", maf_compaction__request__outcome="failed") == len(failed)


async def test_a_pass_that_raises_is_marked_failed_with_the_errors_type(otel: Telemetry) -> None:
    stack = CompactionStack.build(
        max_input_tokens=300,
        tokenizer=TOKENIZER,
        client=Scripted(summary_reply),
        keep_head_groups=1,
        keep_tail_groups=1,
        overflow_policy="raise",
    )
    agent = Agent(
        Scripted(agent_reply),
        "Keep every requirement.",
        tools=[lookup, make_recall_tool(stack.gate)],
        middleware=[stack.recall],
        compaction_strategy=stack.strategy,
        tokenizer=TOKENIZER,
    )
    session = agent.create_session()

    async def turns() -> None:
        for n in range(TURNS):
            await agent.run(requirement(n), session=session)

    with pytest.raises(CompactionBudgetExceeded):
        await turns()

    failed = [s for s in otel.named("compaction_pass ") if s.status.status_code is StatusCode.ERROR]
    composed = stack.strategy
    assert isinstance(composed, ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy)
    assert len(failed) == composed.budget_failures == 1
    (span,) = failed
    assert span.attributes is not None
    assert span.attributes[telemetry.ERROR_TYPE] == "CompactionBudgetExceeded"
    assert telemetry.TOKENS_AFTER not in span.attributes  # no figures for a pass that did not finish
    points = otel.points()
    assert total(points, "maf_compaction.passes", error__type="CompactionBudgetExceeded") == 1


# --- the switch, and the cost --------------------------------------------------------------------------


async def test_the_frameworks_instrumentation_switched_off_turns_ours_off_too(otel: Telemetry) -> None:
    framework_observability.disable_instrumentation()
    try:
        strategy = ReportingAnchored(
            max_input_tokens=1_500, tokenizer=TOKENIZER, keep_head_groups=1, keep_tail_groups=1
        )
        agent = Agent(Scripted(agent_reply), "Answer from the lookups.", tools=[lookup], compaction_strategy=strategy)
        session = agent.create_session()
        for n in range(TURNS):
            await agent.run(question(n), session=session)
        assert not telemetry.enabled()
    finally:
        framework_observability.enable_instrumentation(force=True)
    assert strategy.passes > 0
    assert any(s.shed for s in strategy.seen)
    assert otel.spans() == []  # neither the framework's spans nor ours
    assert otel.points() == {}
    assert telemetry.enabled()


NO_SDK: Final = textwrap.dedent(
    """
    import asyncio, sys, warnings
    warnings.simplefilter("ignore")
    sys.path.insert(0, sys.argv[1])
    from opentelemetry import trace
    import test_telemetry as scenario
    from maf_compaction.adapters import telemetry

    class Spent(Exception):
        pass

    def spent(*args, **kwargs):
        raise Spent("a pass did telemetry work without an SDK")

    # Every piece of telemetry work a pass could do raises: a span, a pass or request trace, the figures.
    telemetry._TRACER.start_span = spent
    telemetry.PassTrace = spent
    telemetry.changes = spent
    telemetry.PASSES.add = spent

    async def main():
        strategy = scenario.ReportingAnchored(
            max_input_tokens=1_500, tokenizer=scenario.TOKENIZER, keep_head_groups=1, keep_tail_groups=1
        )
        agent = scenario.Agent(
            scenario.Scripted(scenario.agent_reply), "Answer.", tools=[scenario.lookup], compaction_strategy=strategy
        )
        session = agent.create_session()
        for n in range(scenario.TURNS):
            await agent.run(scenario.question(n), session=session)
        summarizer = scenario.Scripted(scenario.summary_reply)
        users, _ = await scenario.play_summaries(summarizer)
        print(json.dumps({
            "enabled": telemetry.enabled(), "tracing": telemetry.tracing(), "metering": telemetry.metering(),
            "passes": strategy.passes, "shed": sum(s.shed for s in strategy.seen),
            "summaries": users.summarizer_calls,
        }))

    import json
    asyncio.run(main())
    """
)


def test_without_an_sdk_a_pass_does_no_telemetry_work(tmp_path: Path) -> None:
    """The API alone (no provider configured), the framework's instrumentation on: passes and requests run with
    every telemetry step made to raise, so any telemetry work would fail them."""
    script = tmp_path / "no_sdk.py"
    script.write_text(NO_SDK, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ENABLE_"))}
    completed = subprocess.run(
        [sys.executable, str(script), str(ROOT / "tests")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["enabled"]
    assert not result["tracing"]
    assert not result["metering"]
    assert result["passes"] > 0
    assert result["shed"] > 0
    assert result["summaries"] > 0


# --- the figures, on core values -----------------------------------------------------------------------


def _record(index: int, text: str, **flags: Any) -> MessageRecord:
    return MessageRecord("user", (Part("text", text, tokens=len(text)),), tokens=len(text) + 4, origin=index, **flags)


def test_the_figures_of_a_pass_count_each_change_by_the_reason_the_core_gave_and_find_the_first() -> None:
    before = history(_record(i, f"message {i}") for i in range(6))
    after = history(
        [
            before[0],
            flagged(before[1], excluded=True, reason=anchored_rules.EXCLUDE_REASON),
            MessageRecord("assistant", (Part("text", "[a note]"),), note=True, message_id="note_0"),
            flagged(before[2], excluded=True, reason=record_rules.EXCLUDE_REASON),
            MessageRecord("user", (Part("text", "message 3, cut"),), origin=3),
            before[4],
            flagged(before[5], excluded=True, reason=user_rules.EXCLUDE_REASON),
        ]
    )

    assert changes(before, after) == Changes(changed=5, shortened=1, shed=1, recorded=1, summarised=1, first=1)
    assert changes(before, before) == Changes()


def test_a_prompt_that_only_appends_keeps_the_last_one_as_its_prefix_and_a_change_breaks_it_there() -> None:
    earlier = prompt(history(_record(i, f"message {i}") for i in range(4)))
    appended = prompt(history([*earlier, _record(4, "message 4")]))
    assert kept_prefix(earlier, appended) == Prefix(4, sum(r.tokens for r in earlier), stable=True)
    recounted = tuple(MessageRecord(r.role, r.parts, r.tokens, message_id="another id") for r in earlier)
    assert kept_prefix(earlier, recounted).stable  # ids are not sent: the same bytes
    cut = (*earlier[:2], _record(2, "message 2, cut"), earlier[3])
    assert kept_prefix(earlier, cut) == Prefix(2, earlier[0].tokens + earlier[1].tokens, stable=False)
    excluded = history([earlier[0], flagged(earlier[1], excluded=True), *earlier[2:]])
    assert kept_prefix(earlier, prompt(excluded)) == Prefix(1, earlier[0].tokens, stable=False)
