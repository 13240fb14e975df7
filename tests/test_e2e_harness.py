"""End to end: the anchored strategy inside ``create_harness_agent``, judged by what the provider received.

The bench harness plays a lookup-heavy session: the generated workload
(:func:`maf_compaction.bench.runner.load_scenario`, 28 lookups of about 2,500 tokens each)
without its filler turns, so that tool results grow the conversation to over three times
the budget. The scripted model behind the simulated provider
(:class:`~maf_compaction.bench.client.SimulatedChatClient`) answers every request, and the
agent is wired as the grid wires a cell (the row's factory, ``QUIET_HARNESS``, the
scenario's tools): a run here bills exactly what :func:`~maf_compaction.bench.runner.run_cell`
bills (tested), and records every request as the provider received it, after the harness
loaded history and the strategy compacted it. Each request is then checked against the
one before it, on the canonical rendering the provider tokenizes (o200k_base, offline
vocabulary); reuse is the provider's cached share (OpenAI rules: 128-token steps).

Terms: an *event* is a request that is not a prefix extension of the previous one (the
prompt cache breaks there). The *band* starts at conversation group ``keep_head_groups``
and ends where the last ``keep_tail_groups`` groups begin; groups are found with the
framework's own ``group_messages``, leaving out injected context and our notes.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from agent_framework import (
    Agent,
    AgentSession,
    ChatResponse,
    ChatResponseUpdate,
    Message,
    ResponseStream,
    create_harness_agent,
)
from agent_framework._compaction import GROUP_ANNOTATION_KEY, group_messages

from maf_compaction import AnchoredCompactionStrategy, MediaTokenEstimator, original_results
from maf_compaction.adapters.convert import EXCLUDED_KEY, NOTE_KEY
from maf_compaction.bench.client import SimulatedChatClient, scenario_tools
from maf_compaction.bench.model import ScriptedModel
from maf_compaction.bench.provider import CallRecord, SimulatedProvider
from maf_compaction.bench.rendering import RenderedRequest, common_prefix
from maf_compaction.bench.rows import ROWS, RowContext, setup_of
from maf_compaction.bench.runner import (
    QUIET_HARNESS,
    Cell,
    CellResult,
    Settings,
    load_scenario,
    run_cell,
    stored_messages,
)
from maf_compaction.bench.scenario import Scenario
from maf_compaction.bench.simulator import get_profile
from maf_compaction.core.shorten import is_shortened
from offline_tokenizers import offline_tiktoken

WINDOW = 24_000
OUTPUT_TOKENS = 2_000
BUDGET = WINDOW - OUTPUT_TOKENS
#: No think time between turns: the recorded runs below play the turns back to back, as the grid's cell then does.
SETTINGS = Settings(
    context_window=WINDOW, max_output_tokens=OUTPUT_TOKENS, tool_share=0.85, tool_turns=28, think_time=0.0
)
FILL = 3.5
SEED = 1
KEEP_HEAD_GROUPS = 3  # the strategy's defaults, which the anchored row keeps
KEEP_TAIL_GROUPS = 4
TODO_SOURCE_ID = "todo"
OURS = "anchored"
DEFAULT = "context_window"  # exactly what create_harness_agent builds when given the window and output

MODES = pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])


def lookup_heavy() -> Scenario:
    """The generated workload without its filler turns: requirements, correction, lookups, probes."""
    generated = load_scenario(SETTINGS, FILL, SEED)
    values = [f.value for f in generated.facts]
    turns = tuple(t for t in generated.turns if t.calls or t.probe or any(v in t.user for v in values))
    return replace(generated, name="lookup-heavy", turns=turns)


SCENARIO = lookup_heavy()


@dataclass(frozen=True)
class Sent:
    """One request as the provider received it.

    Attributes:
        messages: Copies taken on arrival, so later compaction of stored history cannot
            change them (contents are shared, never mutated).
        rendered: The canonical rendering the provider tokenizes.
        stream: The call was a streaming call.
    """

    messages: list[Message]
    rendered: RenderedRequest
    stream: bool


def _snapshot(message: Message) -> Message:
    """A copy of ``message`` that later in-place edits of the original cannot reach."""
    copied = copy.copy(message)
    copied.contents = list(message.contents)
    props = dict(message.additional_properties)
    group = props.get(GROUP_ANNOTATION_KEY)
    if isinstance(group, dict):
        props[GROUP_ANNOTATION_KEY] = dict(group)  # pyright: ignore[reportUnknownArgumentType]
    copied.additional_properties = props
    return copied


class RecordingClient(SimulatedChatClient):
    """The bench's in-process client, keeping every request it receives."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sent: list[Sent] = []
        self._stream = False

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        self._stream = stream
        return super()._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)

    async def _respond(self, messages: Sequence[Message], options: Mapping[str, Any]) -> ChatResponse:
        rendered = RenderedRequest.of(messages, await self._validate_options(options))
        self.sent.append(Sent([_snapshot(m) for m in messages], rendered, self._stream))
        return await super()._respond(messages, options)


@dataclass(frozen=True)
class Run:
    """One conversation through the harness, and what the provider received."""

    client: RecordingClient
    session: AgentSession
    stored: list[Message]
    strategy: AnchoredCompactionStrategy | None
    warnings: list[str]

    @property
    def requests(self) -> list[list[Message]]:
        return [s.messages for s in self.client.sent]

    @property
    def calls(self) -> list[CallRecord]:
        return self.client.provider.calls

    def first_calls(self) -> set[int]:
        """0-based indices of the calls that open a turn."""
        turns = [c.turn for c in self.calls]
        return {i for i, turn in enumerate(turns) if i == 0 or turns[i - 1] != turn}

    def reuse(self, index: int) -> float:
        """Share of call ``index``'s prompt the provider served from its cache."""
        call = self.calls[index]
        return call.cached_tokens / call.input_tokens

    def first_change(self, index: int) -> int:
        """Index of the first message of request ``index`` that differs from the previous request's.

        ``0`` when the instructions or tools changed, since everything after them is re-billed.
        """
        previous, current = self.client.sent[index - 1].rendered, self.client.sent[index].rendered
        return common_prefix(previous.messages, current.messages) if previous.preamble == current.preamble else 0

    def describe(self, label: str) -> str:
        events = [i for i, c in enumerate(self.calls) if c.broke]
        deep = sum(self.reuse(i) < 0.5 for i in events)
        hit = sum(c.cached_tokens for c in self.calls) / sum(c.input_tokens for c in self.calls)
        sheds = self.strategy.shed_events if self.strategy is not None else "-"
        largest = max(c.input_tokens for c in self.calls)
        return (
            f"{label}: {len(self.calls)} calls, cached {hit:.1%}, {len(events)} events ({deep} keeping under half "
            f"the prompt), sheds {sheds}, max prompt {largest:,}/{BUDGET:,}"
        )


def build_agent(row: str, client: SimulatedChatClient, harness: Mapping[str, Any]) -> tuple[Agent, Any]:
    """The harness agent of ``row`` as the grid builds a cell's, and the row's strategy."""
    tokenizer = offline_tiktoken()
    context = RowContext(
        budget=BUDGET, window=WINDOW, output_tokens=OUTPUT_TOKENS, tokenizer=tokenizer, summarizer=None
    )
    setup = setup_of(ROWS[row], context)
    agent = create_harness_agent(
        client,
        agent_instructions=SCENARIO.system,
        tools=scenario_tools(SCENARIO),
        max_context_window_tokens=WINDOW,
        max_output_tokens=OUTPUT_TOKENS,
        tokenizer=tokenizer,
        before_compaction_strategy=setup.before,
        after_compaction_strategy=setup.after,
        **harness,
    )
    return agent, setup.before


def recording_client() -> RecordingClient:
    provider = SimulatedProvider(
        encoder=offline_tiktoken(),
        window=WINDOW,
        profile=get_profile(SETTINGS.profile),
        cache=SETTINGS.cache,
        ttl=SETTINGS.cache_ttl,
    )
    return RecordingClient(model=ScriptedModel(SCENARIO, SETTINGS.model_options(SEED)), provider=provider)


_RUNS: dict[tuple[str, bool, bool], Run] = {}
_CELLS: dict[tuple[str, bool], CellResult] = {}


async def cell(row: str, *, stream: bool) -> CellResult:
    """The grid's cell of ``row`` for the scenario, once per session of tests."""
    key = (row, stream)
    if key not in _CELLS:
        _CELLS[key] = await run_cell(Cell(row, FILL, SEED), replace(SETTINGS, stream=stream), scenario=SCENARIO)
    return _CELLS[key]


async def run(row: str, *, stream: bool, harness_defaults: bool = False) -> Run:
    """Run the scenario through ``row`` once per session of tests (the runs are deterministic)."""
    key = (row, stream, harness_defaults)
    if key not in _RUNS:
        _RUNS[key] = await _run(row, stream=stream, harness_defaults=harness_defaults)
    return _RUNS[key]


async def _run(row: str, *, stream: bool, harness_defaults: bool) -> Run:
    client = recording_client()
    # With the harness defaults on, only web search stays off: the simulated provider has none.
    harness = {"disable_web_search": True} if harness_defaults else QUIET_HARNESS
    agent, strategy = build_agent(row, client, harness)
    assert row != OURS or isinstance(strategy, AnchoredCompactionStrategy)
    warnings: list[str] = []
    handler = _ListHandler(warnings)
    logger = logging.getLogger("maf_compaction")
    logger.addHandler(handler)
    session = agent.create_session()
    try:
        for number, turn in enumerate(SCENARIO.turns, start=1):
            client.provider.turn = number
            if stream:
                updates = agent.run(turn.user, session=session, stream=True)
                async for _ in updates:
                    pass
                await updates.get_final_response()
            else:
                await agent.run(turn.user, session=session)
    finally:
        logger.removeHandler(handler)
    assert all(sent.stream is stream for sent in client.sent)
    assert all(call.kind == "model" for call in client.provider.calls)
    assert len(client.sent) == len(client.provider.calls)
    return Run(
        client=client,
        session=session,
        stored=stored_messages(session),
        strategy=strategy if isinstance(strategy, AnchoredCompactionStrategy) else None,
        warnings=warnings,
    )


class _ListHandler(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.WARNING)
        self._sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self._sink.append(record.getMessage())


def is_todo(message: Message) -> bool:
    attribution = message.additional_properties.get("_attribution") or {}
    return attribution.get("source_id") == TODO_SOURCE_ID


def is_note(message: Message) -> bool:
    return bool(message.additional_properties.get(NOTE_KEY))


def group_starts(messages: Sequence[Message]) -> list[int]:
    """Index of each conversation group's first message, by the framework's grouping."""
    kept = [i for i, m in enumerate(messages) if not is_todo(m) and not is_note(m)]
    spans = group_messages([copy.copy(messages[i]) for i in kept])
    return [kept[span["start_index"]] for span in spans]


def events(result: Run) -> tuple[list[int], list[int]]:
    """The run's events (call indices), split into sheds (a note is the first change) and the rest."""
    found = [i for i, call in enumerate(result.calls) if call.broke]
    sheds = [i for i in found if is_note(result.requests[i][result.first_change(i)])]
    return sheds, [i for i in found if i not in sheds]


def basis_tokens(messages: Sequence[Message]) -> int:
    """The request's messages on the strategy's own counting basis."""
    return sum(map(MediaTokenEstimator(offline_tiktoken()).count_message_tokens, messages))


# --- the run is the grid's cell -----------------------------------------------------------


@MODES
async def test_a_recorded_run_bills_what_the_grids_cell_bills(stream: bool) -> None:
    result, grid = await run(OURS, stream=stream), await cell(OURS, stream=stream)
    assert grid.error is None
    assert [c.input_tokens for c in result.calls] == grid.prompts
    assert [c.cached_tokens for c in result.calls] == grid.cached
    assert sum(c.broke for c in result.calls) == grid.breaks


# --- the anchored strategy, both modes ------------------------------------------------------


@MODES
async def test_between_events_every_request_extends_the_previous_one(stream: bool) -> None:
    result = await run(OURS, stream=stream)
    print(result.describe(f"ours ({'streaming' if stream else 'non-streaming'})"))
    rendered = [s.rendered.entries for s in result.client.sent]
    for index, call in enumerate(result.calls[1:], start=1):
        previous, current = rendered[index - 1], rendered[index]
        assert call.broke == (current[: len(previous)] != previous)
    # Only a shed (the prompt passed the budget, possibly on a tool result mid-turn) breaks
    # the prefix inside a turn; the tool loop's later calls never re-decide anything else.
    _, others = events(result)
    first_calls = result.first_calls()
    assert all(index in first_calls for index in others)
    assert len({result.calls[i].turn for i in others}) == len(others), "at most one band entry per turn"


@MODES
async def test_events_happen_and_only_sheds_cut_deep(stream: bool) -> None:
    result = await run(OURS, stream=stream)
    assert result.strategy is not None
    sheds, others = events(result)
    kept = sorted(result.reuse(i) for i in others)
    print(
        f"{len(result.calls)} requests, {len(sheds) + len(others)} events: {len(sheds)} shed(s) keeping "
        f"{[f'{result.reuse(i):.0%}' for i in sheds]} of the prompt, {len(others)} band entries keeping "
        f"{kept[0]:.0%} to {kept[-1]:.0%} (median {kept[len(kept) // 2]:.0%})"
    )
    # Each shed reaches the provider as exactly one event, and sheds are rare: one frees a
    # quarter of the budget, and shortening by position keeps later growth small.
    assert len(sheds) == result.strategy.shed_events >= 1
    assert len(sheds) * 20 <= len(result.calls)
    # Every other event is the band entry of a result that just left the tail: it is
    # shortened, once, to the bytes it keeps from then on, and most of the prompt stays cached.
    assert others
    for index in others:
        changed = result.requests[index][result.first_change(index)]
        assert changed.role == "tool"
        assert all(is_shortened(str(c.result)) for c in changed.contents if c.type == "function_result")
        assert result.reuse(index) >= 0.5


@MODES
async def test_each_event_starts_in_the_band(stream: bool) -> None:
    result = await run(OURS, stream=stream)
    for index, call in enumerate(result.calls):
        if not call.broke:
            continue
        starts = group_starts(result.requests[index - 1])
        band_start, tail_start = starts[KEEP_HEAD_GROUPS], starts[-KEEP_TAIL_GROUPS]
        first_change = result.first_change(index)
        assert first_change >= band_start, f"call {index + 1} changed the head"
        if not is_note(result.requests[index][first_change]):
            # Not a shed: only what the previous request still had in its tail changed.
            assert first_change >= tail_start, f"call {index + 1} re-decided an older band group"


@MODES
async def test_no_request_exceeds_the_budget(stream: bool) -> None:
    result = await run(OURS, stream=stream)
    largest = max(map(basis_tokens, result.requests))
    print(f"largest request on the strategy's basis: {largest:,} of {BUDGET:,}")
    assert largest <= BUDGET
    assert not any(call.over_window for call in result.calls)
    counter = MediaTokenEstimator(offline_tiktoken())
    results = sum(counter.count_tokens(c.result) for t in SCENARIO.turns for c in t.calls)
    assert results > 3 * BUDGET, f"the conversation should outgrow the budget three times, got {results:,}"


@MODES
async def test_prefix_reuse_beats_the_framework_default(stream: bool) -> None:
    ours, default = await cell(OURS, stream=stream), await cell(DEFAULT, stream=stream)
    for name, result in (("ours", ours), ("framework default", default)):
        print(
            f"{name}: {result.model_calls} calls, cached {result.hit:.1%}, {result.breaks} events, cost "
            f"{result.cost:.4f}, max prompt {result.max_prompt:,}, facts kept {result.facts_kept}/{result.facts_total}"
        )
    assert ours.hit > default.hit
    assert ours.cost < default.cost
    assert ours.dq == 0
    # The default cuts from the front of the prompt at nearly every event; ours at its sheds only.
    deep = [sum(c < 0.5 * p for p, c in zip(r.prompts, r.cached, strict=True)) for r in (ours, default)]
    assert deep[0] < deep[1]


@MODES
async def test_nothing_is_lost_silently(stream: bool) -> None:
    result = await run(OURS, stream=stream)
    scripted = {c.arguments["lookup"]: c.result for t in SCENARIO.turns for c in t.calls}
    arguments = {c.call_id: c.arguments for m in result.stored for c in m.contents if c.type == "function_call"}
    results = [(m, c) for m in result.stored for c in m.contents if c.type == "function_result"]
    assert len(results) == len(scripted), "every tool result stays in stored history"
    for message, content in results:
        called = arguments[content.call_id]
        assert isinstance(called, dict)
        original = original_results(message).get(content.call_id or "", content.result)
        assert original == scripted[called["lookup"]]
    excluded = [i for i, m in enumerate(result.stored) if m.additional_properties.get(EXCLUDED_KEY)]
    assert excluded, "the shed groups stay stored, excluded"
    for index in excluded:
        message = result.stored[index]
        if message.role == "assistant" and any(c.type == "function_call" for c in message.contents):
            assert is_note(result.stored[index - 1]), f"shed group at {index} has no note"
        assert any(str(message.message_id) in w for w in result.warnings), f"{message.message_id} shed silently"


async def test_streaming_and_non_streaming_send_the_same_requests() -> None:
    blocking, streaming = await run(OURS, stream=False), await run(OURS, stream=True)
    assert [s.rendered for s in blocking.client.sent] == [s.rendered for s in streaming.client.sent]


# --- the harness defaults: todo and mode providers on -----------------------------------------


async def test_with_harness_defaults_the_todo_message_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # the default file memory writes under the working directory
    result = await run(OURS, stream=False, harness_defaults=True)
    plain = await run(OURS, stream=False)
    print(result.describe("ours, harness defaults on"))
    print(
        f"largest rendered prompt with the harness's instructions and tool declarations: "
        f"{max(c.input_tokens for c in result.calls):,} tokens; window {WINDOW:,}"
    )
    assert all(basis_tokens(request) <= BUDGET for request in result.requests)

    # The todo provider injects its message at position 0 on each turn's first call only;
    # it reaches the provider every time, unexcluded and byte-identical.
    first_calls = result.first_calls()
    todo = [[m for m in request if is_todo(m)] for request in result.requests]
    assert [len(t) for t in todo] == [int(i in first_calls) for i in range(len(todo))]
    injected = [t[0] for t in todo if t]
    assert all(is_todo(request[0]) for request, t in zip(result.requests, todo, strict=True) if t)
    assert not any(m.additional_properties.get(EXCLUDED_KEY) for m in injected)
    assert len({RenderedRequest.of([m], {}).messages for m in injected}) == 1

    # It does not shift decisions: without it, every request is what the run without the
    # todo and mode providers sent, and every event still starts in the band.
    conversation = [[m for m in request if not is_todo(m)] for request in result.requests]
    assert [RenderedRequest.of(r, {}) for r in conversation] == [RenderedRequest.of(r, {}) for r in plain.requests]
    rendered = [RenderedRequest.of(r, {}).messages for r in conversation]
    for index in range(1, len(rendered)):
        previous, current = rendered[index - 1], rendered[index]
        if current[: len(previous)] != previous:
            assert common_prefix(previous, current) >= group_starts(conversation[index - 1])[KEEP_HEAD_GROUPS]


# --- restore ------------------------------------------------------------------------------------


async def test_a_restored_session_keeps_the_notes_of_earlier_sheds() -> None:
    result = await run(OURS, stream=False)
    shed_notes = sum(map(is_note, result.stored))
    assert shed_notes > 0
    # A new process (or replica) restores the session and builds the agent again, as direct
    # wiring does; the stored history still holds the shed groups, excluded, behind their notes.
    restored = AgentSession.from_dict(result.session.to_dict())
    client = recording_client()
    agent, _ = build_agent(OURS, client, QUIET_HARNESS)
    await agent.run("One more question before we finish: which lookups did we run?", session=restored)
    stored = stored_messages(restored)
    assert sum(m.role == "tool" and bool(m.additional_properties.get(EXCLUDED_KEY)) for m in stored) > 0
    assert client.sent
    assert [sum(map(is_note, sent.messages)) for sent in client.sent] == [shed_notes] * len(client.sent)
    assert sum(map(is_note, stored)) == shed_notes
