"""End to end: the anchored strategy inside ``create_harness_agent``, judged by what the provider received.

A scripted provider (``maf_compaction.bench.scripted``) records every request after the
harness loaded history and the strategy compacted it. A 44-turn, tool-heavy conversation
grows to over three times the budget; each request is then checked against the one before
it, on a canonical rendering counted with tiktoken's ``o200k_base`` (offline vocabulary).

Terms: an *event* is a request that is not a prefix extension of the previous one (the
prompt cache breaks there). The *band* starts at conversation group ``keep_head_groups``
and ends where the last ``keep_tail_groups`` groups begin; groups are found with the
framework's own ``group_messages``, leaving out injected context and our notes.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_framework import AgentSession, Message
from agent_framework._compaction import group_messages

from maf_compaction import AnchoredCompactionStrategy, MediaTokenEstimator, original_results
from maf_compaction.adapters.convert import EXCLUDED_KEY, NOTE_KEY
from maf_compaction.bench.demo import MEASURED_HARNESS_OPTIONS, RowName, build_agent, run_workload
from maf_compaction.bench.measure import CallMeasure, PromptMeter, RenderedRequest, measure_calls, summarize
from maf_compaction.bench.scripted import ScriptedChatClient
from maf_compaction.bench.workload import build_workload, lookup_result
from maf_compaction.core.shorten import is_shortened
from offline_tokenizers import offline_tiktoken

TURNS = 44
WINDOW = 24_000
OUTPUT_TOKENS = 2_000
BUDGET = WINDOW - OUTPUT_TOKENS
KEEP_HEAD_GROUPS = 3  # the strategy's defaults, which the harness wiring keeps
KEEP_TAIL_GROUPS = 4
TODO_SOURCE_ID = "todo"
OURS: RowName = "anchored (ours)"
DEFAULT: RowName = "framework default"

MODES = pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])


@dataclass(frozen=True)
class Run:
    """One conversation through the harness, and what the provider received."""

    client: ScriptedChatClient
    session: AgentSession
    requests: list[list[Message]]
    stored: list[Message]
    turn_of_call: list[int]
    measures: list[CallMeasure]
    strategy: AnchoredCompactionStrategy | None
    warnings: list[str]

    def first_calls(self) -> set[int]:
        """0-based indices of the calls that open a turn."""
        return {i for i, turn in enumerate(self.turn_of_call) if i == 0 or self.turn_of_call[i - 1] != turn}


_RUNS: dict[tuple[RowName, bool, bool], Run] = {}


async def run(row: RowName, *, stream: bool, harness_defaults: bool = False) -> Run:
    """Run the workload through ``row`` once per session of tests (the runs are deterministic)."""
    key = (row, stream, harness_defaults)
    if key not in _RUNS:
        _RUNS[key] = await _run(row, stream=stream, harness_defaults=harness_defaults)
    return _RUNS[key]


async def _run(row: RowName, *, stream: bool, harness_defaults: bool) -> Run:
    tokenizer = offline_tiktoken()
    workload = build_workload(TURNS)
    client = ScriptedChatClient(meter=PromptMeter(tokenizer))
    # With the harness defaults on, only web search stays off: the scripted client has none.
    options: dict[str, Any] = {"disable_web_search": True} if harness_defaults else dict(MEASURED_HARNESS_OPTIONS)
    agent = build_agent(
        row, client, workload, window=WINDOW, output_tokens=OUTPUT_TOKENS, tokenizer=tokenizer, **options
    )
    strategy = agent.compaction_strategy if row == OURS else None
    assert strategy is None or isinstance(strategy, AnchoredCompactionStrategy)
    warnings: list[str] = []
    handler = _ListHandler(warnings)
    logger = logging.getLogger("maf_compaction")
    logger.addHandler(handler)
    try:
        conversation = await run_workload(agent, client, workload, stream=stream)
    finally:
        logger.removeHandler(handler)
    assert all(request.stream is stream for request in client.requests)
    requests = [(r.messages, r.options) for r in client.requests]
    return Run(
        client=client,
        session=conversation.session,
        requests=[list(r.messages) for r in client.requests],
        stored=list(conversation.session.state["in_memory"]["messages"]),
        turn_of_call=conversation.turn_of_call,
        measures=measure_calls(requests, PromptMeter(tokenizer), MediaTokenEstimator(tokenizer)),
        strategy=strategy,
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


def events(result: Run) -> tuple[list[tuple[int, CallMeasure]], list[tuple[int, CallMeasure]]]:
    """The run's events, split into sheds (a note is the first change) and the rest."""
    found = [(i, m) for i, m in enumerate(result.measures) if m.breaks]
    sheds = [(i, m) for i, m in found if is_note(result.requests[i][m.first_change or 0])]
    return sheds, [event for event in found if event not in sheds]


def describe(result: Run, label: str) -> str:
    s = summarize(result.measures, BUDGET)
    deep = sum(m.breaks and m.reuse_share < 0.5 for m in result.measures)
    sheds = result.strategy.shed_events if result.strategy is not None else "-"
    return (
        f"{label}: {s.model_calls} calls, prefix reuse {s.reuse_share:.1%}, {s.breaks} events "
        f"({deep} keeping under half the prompt), sheds {sheds}, max prompt {s.max_prompt:,}/{BUDGET:,}, "
        f"over budget {s.over_budget}"
    )


# --- the anchored strategy, both modes ------------------------------------------------------


@MODES
async def test_between_events_every_request_extends_the_previous_one(stream: bool) -> None:
    result = await run(OURS, stream=stream)
    print(describe(result, f"ours ({'streaming' if stream else 'non-streaming'})"))
    rendered = [RenderedRequest.of(r.messages, r.options).entries for r in result.client.requests]
    for index, measure in enumerate(result.measures[1:], start=1):
        previous, current = rendered[index - 1], rendered[index]
        assert measure.breaks == (current[: len(previous)] != previous)
    # Only a shed (the prompt passed the budget, possibly on a tool result mid-turn) breaks
    # the prefix inside a turn; the tool loop's later calls never re-decide anything else.
    _, others = events(result)
    first_calls = result.first_calls()
    assert all(index in first_calls for index, _ in others)
    assert len({result.turn_of_call[i] for i, _ in others}) == len(others), "at most one band entry per turn"


@MODES
async def test_events_happen_and_only_sheds_cut_deep(stream: bool) -> None:
    result = await run(OURS, stream=stream)
    assert result.strategy is not None
    sheds, others = events(result)
    kept = sorted(m.reuse_share for _, m in others)
    print(
        f"{len(result.measures)} requests, {len(sheds) + len(others)} events: {len(sheds)} shed(s) keeping "
        f"{[f'{m.reuse_share:.0%}' for _, m in sheds]} of the prompt, {len(others)} band entries keeping "
        f"{kept[0]:.0%} to {kept[-1]:.0%} (median {kept[len(kept) // 2]:.0%})"
    )
    # Each shed reaches the provider as exactly one event, and sheds are rare: one frees a
    # quarter of the budget, and shortening by position keeps later growth small.
    assert len(sheds) == result.strategy.shed_events >= 1
    assert len(sheds) * 20 <= len(result.measures)
    # Every other event is the band entry of a result that just left the tail: it is
    # shortened, once, to the bytes it keeps from then on, and most of the prompt stays cached.
    assert others
    for index, measure in others:
        changed = result.requests[index][measure.first_change or 0]
        assert changed.role == "tool"
        assert all(is_shortened(str(c.result)) for c in changed.contents if c.type == "function_result")
        assert measure.reuse_share >= 0.5


@MODES
async def test_each_event_starts_in_the_band(stream: bool) -> None:
    result = await run(OURS, stream=stream)
    for index, measure in enumerate(result.measures):
        if not measure.breaks:
            continue
        previous = result.requests[index - 1]
        starts = group_starts(previous)
        band_start, tail_start = starts[KEEP_HEAD_GROUPS], starts[-KEEP_TAIL_GROUPS]
        assert measure.first_change is not None
        assert measure.first_change >= band_start, f"call {index + 1} changed the head"
        if not is_note(result.requests[index][measure.first_change]):
            # Not a shed: only what the previous request still had in its tail changed.
            assert measure.first_change >= tail_start, f"call {index + 1} re-decided an older band group"


@MODES
async def test_no_request_exceeds_the_budget(stream: bool) -> None:
    result = await run(OURS, stream=stream)
    basis = MediaTokenEstimator(offline_tiktoken())
    largest = max(sum(map(basis.count_message_tokens, request)) for request in result.requests)
    print(f"largest request on the strategy's basis: {largest:,} of {BUDGET:,}")
    assert largest <= BUDGET
    results = sum(basis.count_tokens(lookup_result(t.service)) for t in build_workload(TURNS).turns if t.service)
    assert results > 3 * BUDGET, f"the conversation should outgrow the budget three times, got {results:,}"


@MODES
async def test_prefix_reuse_beats_the_framework_default(stream: bool) -> None:
    ours, default = await run(OURS, stream=stream), await run(DEFAULT, stream=stream)
    print(describe(ours, "ours"))
    print(describe(default, "framework default"))
    ours_summary, default_summary = summarize(ours.measures, BUDGET), summarize(default.measures, BUDGET)
    assert ours_summary.reuse_share > default_summary.reuse_share
    assert ours_summary.over_budget == 0
    # The default cuts from the front of the prompt at nearly every event; ours at its sheds only.
    deep = [sum(m.breaks and m.reuse_share < 0.5 for m in r.measures) for r in (ours, default)]
    assert deep[0] < deep[1]


@MODES
async def test_nothing_is_lost_silently(stream: bool) -> None:
    result = await run(OURS, stream=stream)
    workload = build_workload(TURNS)
    services = {c.call_id: c.arguments for m in result.stored for c in m.contents if c.type == "function_call"}
    results = [(m, c) for m in result.stored for c in m.contents if c.type == "function_result"]
    assert len(results) == workload.lookups, "every tool result stays in stored history"
    for message, content in results:
        arguments = services[content.call_id]
        assert isinstance(arguments, dict)
        original = original_results(message).get(content.call_id or "", content.result)
        assert original == lookup_result(str(arguments["service"]))  # pyright: ignore[reportUnknownArgumentType]
    excluded = [i for i, m in enumerate(result.stored) if m.additional_properties.get(EXCLUDED_KEY)]
    assert excluded, "the shed groups stay stored, excluded"
    for index in excluded:
        message = result.stored[index]
        if message.role == "assistant" and any(c.type == "function_call" for c in message.contents):
            assert is_note(result.stored[index - 1]), f"shed group at {index} has no note"
        assert any(str(message.message_id) in w for w in result.warnings), f"{message.message_id} shed silently"


async def test_streaming_and_non_streaming_send_the_same_requests() -> None:
    blocking, streaming = await run(OURS, stream=False), await run(OURS, stream=True)
    assert [RenderedRequest.of(r.messages, r.options) for r in blocking.client.requests] == [
        RenderedRequest.of(r.messages, r.options) for r in streaming.client.requests
    ]


# --- the harness defaults: todo and mode providers on -----------------------------------------


async def test_with_harness_defaults_the_todo_message_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # the default file memory writes under the working directory
    result = await run(OURS, stream=False, harness_defaults=True)
    plain = await run(OURS, stream=False)
    print(describe(result, "ours, harness defaults on"))
    print(
        f"largest rendered prompt with the harness's instructions and {len(result.client.requests[0].options['tools'])}"
        f" tool declarations: {max(m.prompt_tokens for m in result.measures):,} tokens; window {WINDOW:,}"
    )
    basis = MediaTokenEstimator(offline_tiktoken())
    assert all(sum(map(basis.count_message_tokens, request)) <= BUDGET for request in result.requests)

    # The todo provider injects its message at position 0 on each turn's first call only;
    # it reaches the provider every time, unexcluded and byte-identical.
    first_calls = result.first_calls()
    todo = [[m for m in request if is_todo(m)] for request in result.requests]
    assert [len(t) for t in todo] == [int(i in first_calls) for i in range(len(todo))]
    injected = [t[0] for t in todo if t]
    assert all(request[0] is t[0] for request, t in zip(result.requests, todo, strict=True) if t)
    assert not any(m.additional_properties.get(EXCLUDED_KEY) for m in injected)
    assert len({RenderedRequest.of([m], {}).messages for m in injected}) == 1

    # It does not shift decisions: without it, every request is what the run without the
    # todo and mode providers sent, and every event still starts in the band.
    conversation = [[m for m in request if not is_todo(m)] for request in result.requests]
    assert [RenderedRequest.of(r, {}) for r in conversation] == [RenderedRequest.of(r, {}) for r in plain.requests]
    measures = measure_calls([(r, {}) for r in conversation], PromptMeter(offline_tiktoken()), basis)
    for index, measure in enumerate(measures):
        if measure.breaks:
            assert measure.first_change is not None
            assert measure.first_change >= group_starts(conversation[index - 1])[KEEP_HEAD_GROUPS]


# --- restore ------------------------------------------------------------------------------------


async def test_a_restored_session_keeps_the_notes_of_earlier_sheds() -> None:
    result = await run(OURS, stream=False)
    shed_notes = sum(map(is_note, result.stored))
    assert shed_notes > 0
    # A new process (or replica) restores the session and builds the agent again, as direct
    # wiring does; the stored history still holds the shed groups, excluded, behind their notes.
    restored = AgentSession.from_dict(result.session.to_dict())
    tokenizer = offline_tiktoken()
    client = ScriptedChatClient(meter=PromptMeter(tokenizer))
    workload = build_workload(TURNS + 1)
    agent = build_agent(
        OURS,
        client,
        workload,
        window=WINDOW,
        output_tokens=OUTPUT_TOKENS,
        tokenizer=tokenizer,
        **MEASURED_HARNESS_OPTIONS,
    )
    await agent.run(workload.turns[-1].text, session=restored)
    stored = restored.state["in_memory"]["messages"]
    assert sum(m.role == "tool" and bool(m.additional_properties.get(EXCLUDED_KEY)) for m in stored) > 0
    assert [sum(map(is_note, r.messages)) for r in client.requests] == [shed_notes] * len(client.requests)
    assert sum(map(is_note, stored)) == shed_notes
