"""End to end: the record strategy inside ``create_harness_agent``, judged by what the provider received.

The generated workload at fill 1.5 on a 32K window (``runner.load_scenario(Settings(), 1.5, 1)``:
six lookups of about 4,800 tokens each between filler turns, then closing probes) is played by
the scripted model behind the simulated provider. The agent is built by
``create_harness_agent`` with the README wiring of the record strategy with its records pinned
(the bench row ``tool_summary_anchored_pinned``: the strategy in both compaction phases, the
recall tool, the gate and the recall middleware with ``record_request="pinned"``; the README's
own default, row ``tool_summary_anchored``, asks over the cached prefix), once with the harness
defaults on (todo and mode providers, file memory in a temporary directory; web search off, the
simulated provider has none) and once with ``disable_todo=True, disable_mode=True``.

The client records every request as it arrives (after the harness loaded history and the
strategy compacted it): its text as the model reads it, the call ids it carries, its options
and whether forcing was already disabled. Nothing in the framework is mocked.

Terms: a request is *pinned* when its ``tool_choice`` requires ``recall_earlier_tool_results``.
A request *asks over the cached prefix* when it ends with one user message holding
``RECORD_INSTRUCTION`` (the record strategy's own request, sent once pinning is disabled).
A record's *event* is the first request that carries the record.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pytest
from agent_framework import (
    AgentSession,
    ChatResponse,
    ChatResponseUpdate,
    Message,
    ResponseStream,
    create_harness_agent,
)
from agent_framework._compaction import EXCLUDE_REASON_KEY

from maf_compaction import (
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultRecallMiddleware,
    original_results,
    record_text,
)
from maf_compaction.adapters.convert import EXCLUDED_KEY
from maf_compaction.bench.client import SimulatedChatClient, scenario_tools
from maf_compaction.bench.model import ModelOptions, ScriptedModel, context_text
from maf_compaction.bench.provider import CallRecord, SimulatedProvider
from maf_compaction.bench.rows import ROWS, RowContext, RowSetup, setup_of
from maf_compaction.bench.runner import Settings, load_scenario, run_turn, stored_messages
from maf_compaction.bench.scenario import LOOKUP_TOOL, ToolCall
from maf_compaction.bench.simulator import get_profile
from maf_compaction.core.records import RECALL_TOOL_NAME, RECORD_INSTRUCTION, RECORD_PREFIX, RECORD_RECEIPT
from offline_tokenizers import offline_tiktoken

SETTINGS: Final = Settings()  # a 32,000-token window, 2,048 output tokens
FILL: Final = 1.5
SEED: Final = 1
SCENARIO: Final = load_scenario(SETTINGS, FILL, SEED)
ROW: Final = "tool_summary_anchored_pinned"
EXCLUDE_REASON: Final = "tool_summary_anchored"
PIN: Final = {"mode": "required", "required_function_name": RECALL_TOOL_NAME}
RECORD_MAX_TOKENS: Final = 4_000  # the README wiring's cap on the forced response
MIN_COVERED_LOOKUPS: Final = 4

#: The harness defaults (todo, mode and file memory on; web search off) and the variant without todo and mode.
HARNESSES: Final[Mapping[str, Mapping[str, Any]]] = {
    "harness-defaults": {"disable_web_search": True},
    "no-todo-no-mode": {"disable_web_search": True, "disable_todo": True, "disable_mode": True},
}
HARNESS = pytest.mark.parametrize("harness", list(HARNESSES))

#: The scripted result of each lookup call, by its lookup number.
SCRIPTED: Final[Mapping[int, ToolCall]] = {
    int(c.arguments["lookup"]): c for t in SCENARIO.turns for c in t.calls if c.name == LOOKUP_TOOL
}


def carries(sent: Sent, record: str) -> bool:
    """``sent`` carries ``record``: a written record as it stands, a recall record as its call's ``values`` (the
    body after the prefix), which a request carries in the call's JSON arguments."""
    body = json.dumps(record.removeprefix(RECORD_PREFIX).strip(), ensure_ascii=False)[1:-1]
    return record in sent.text or body in sent.text


@dataclass(frozen=True)
class Sent:
    """One request as the client received it, captured on arrival.

    Attributes:
        text: Everything the model can read in the request's messages.
        call_ids: Call ids of every function call and result in the request.
        options: The request's options (a copy).
        stream: The call was a streaming call.
        pin_disabled: The recall middleware had already disabled forcing when it arrived.
        wire: Each message's role and contents, serialized on arrival (what the provider reads).
        injected: Indices in ``wire`` of the context the agent's context providers added to this run
            (the todo list), which is not conversation history.
    """

    text: str
    call_ids: frozenset[str]
    options: Mapping[str, Any]
    stream: bool
    pin_disabled: bool
    wire: tuple[str, ...] = ()
    injected: tuple[int, ...] = ()

    @property
    def pinned(self) -> bool:
        return self.options.get("tool_choice") == PIN

    @property
    def asks_over_prefix(self) -> bool:
        """The request ends with one user message that holds the record instruction, and nothing else."""
        return self.wire[-1:] == _wire([Message("user", [RECORD_INSTRUCTION])])

    @property
    def conversation(self) -> tuple[str, ...]:
        """``wire`` without the run's injected context."""
        return tuple(w for k, w in enumerate(self.wire) if k not in self.injected)

    @property
    def context(self) -> tuple[tuple[int, str], ...]:
        """The run's injected context, with its positions."""
        return tuple((k, self.wire[k]) for k in self.injected)

    @property
    def head(self) -> tuple[object, ...]:
        """What the provider reads of the options: instructions, tool names, tool_choice and max_tokens."""
        tools = tuple(str(getattr(t, "name", t)) for t in self.options.get("tools") or ())
        return (
            self.options.get("instructions"),
            tools,
            self.options.get("tool_choice"),
            self.options.get("max_tokens"),
        )


#: The history provider's source id: messages attributed to any other source are a run's injected context.
HISTORY_SOURCE: Final = "in_memory"


def _injected(message: Message) -> bool:
    source = (message.additional_properties.get("_attribution") or {}).get("source_id")
    return source is not None and source != HISTORY_SOURCE


def _wire(messages: Sequence[Message]) -> tuple[str, ...]:
    return tuple(
        json.dumps({"role": m.role, "contents": [c.to_dict() for c in m.contents]}, sort_keys=True, default=str)
        for m in messages
    )


class RecordingClient(SimulatedChatClient):
    """The bench's in-process client, keeping every request it receives."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sent: list[Sent] = []
        self.recall: ToolResultRecallMiddleware | None = None

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        self.sent.append(
            Sent(
                text=context_text(messages),
                call_ids=frozenset(c.call_id for m in messages for c in m.contents if c.call_id),
                options=dict(options),
                stream=stream,
                pin_disabled=self.recall is not None and self.recall.pin_disabled,
                wire=_wire(messages),
                injected=tuple(k for k, m in enumerate(messages) if _injected(m)),
            )
        )
        return super()._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)


@dataclass(frozen=True)
class Run:
    """One conversation through the harness, what the provider received, and what was stored."""

    client: RecordingClient
    session: AgentSession
    stored: list[Message]
    replies: list[str]
    strategy: ToolResultAnchoredSummarizationCompactionStrategy
    recall: ToolResultRecallMiddleware

    @property
    def sent(self) -> list[Sent]:
        return self.client.sent

    @property
    def calls(self) -> list[CallRecord]:
        return self.client.provider.calls

    @property
    def pinned(self) -> list[int]:
        """0-based indices of the pinned requests."""
        return [i for i, s in enumerate(self.sent) if s.pinned]

    def records(self) -> list[tuple[int, str]]:
        """(stored index, record text) of every record in stored history, in order."""
        recall_ids = {
            c.call_id
            for m in self.stored
            for c in m.contents
            if c.type == "function_call" and c.name == RECALL_TOOL_NAME and c.call_id
        }
        found: list[tuple[int, str]] = []
        for index, message in enumerate(self.stored):
            if any(c.type == "function_result" and c.call_id in recall_ids for c in message.contents):
                text = record_text(message, self.stored)
                if text:
                    found.append((index, text))
        return found

    def event(self, record: str) -> int:
        """Index of the first request that carries ``record``."""
        return next(i for i, s in enumerate(self.sent) if carries(s, record))

    def covered_lookups(self) -> dict[str, tuple[int, int]]:
        """Lookup groups excluded by the record strategy: call id -> (lookup number, stored index of its result)."""
        covered: dict[str, tuple[int, int]] = {}
        calls = {
            c.call_id: (index, c)
            for index, m in enumerate(self.stored)
            for c in m.contents
            if c.type == "function_call" and c.name == LOOKUP_TOOL and c.call_id
        }
        for index, message in enumerate(self.stored):
            for content in message.contents:
                if content.type != "function_result" or content.call_id not in calls:
                    continue
                call_index, call = calls[content.call_id]
                group = (self.stored[call_index], message)
                if all(_excluded_by_records(m) for m in group):
                    covered[content.call_id] = (_lookup_number(call.arguments), index)
        return covered


def _excluded_by_records(message: Message) -> bool:
    props = message.additional_properties
    return bool(props.get(EXCLUDED_KEY)) and props.get(EXCLUDE_REASON_KEY) == EXCLUDE_REASON


def _included_text(stored: Sequence[Message]) -> str:
    return context_text([m for m in stored if not m.additional_properties.get(EXCLUDED_KEY)])


_RUNS: dict[tuple[str, bool, bool], Run] = {}


async def run(harness: str, *, stream: bool = False, ignore_pin: bool = False) -> Run:
    """Play the scenario once per session of tests (the runs are deterministic)."""
    key = (harness, stream, ignore_pin)
    if key not in _RUNS:
        # The harness's default file memory writes under the working directory: give each run its own.
        with tempfile.TemporaryDirectory(prefix="maf-e2e-records-") as directory, contextlib.chdir(directory):
            _RUNS[key] = await _run(HARNESSES[harness], stream=stream, ignore_pin=ignore_pin)
    return _RUNS[key]


async def _run(harness: Mapping[str, Any], *, stream: bool, ignore_pin: bool) -> Run:
    tokenizer = offline_tiktoken()
    provider = SimulatedProvider(
        encoder=tokenizer, window=SETTINGS.context_window, profile=get_profile(SETTINGS.profile), cache=SETTINGS.cache
    )
    model = ScriptedModel(SCENARIO, ModelOptions(ignore_pin=ignore_pin, seed=SEED))
    client = RecordingClient(model=model, provider=provider)
    context = RowContext(
        budget=SETTINGS.budget,
        window=SETTINGS.context_window,
        output_tokens=SETTINGS.max_output_tokens,
        tokenizer=tokenizer,
        summarizer=None,
    )
    setup: RowSetup = setup_of(ROWS[ROW], context)
    strategy, (recall,) = setup.before, setup.middleware
    assert isinstance(strategy, ToolResultAnchoredSummarizationCompactionStrategy)
    assert setup.after is strategy, "the README wiring gives one instance to both phases"
    assert isinstance(recall, ToolResultRecallMiddleware)
    client.recall = recall
    agent = create_harness_agent(
        client,
        agent_instructions=SCENARIO.system,
        tools=[*scenario_tools(SCENARIO), *setup.tools],
        middleware=list(setup.middleware),
        max_context_window_tokens=SETTINGS.context_window,
        max_output_tokens=SETTINGS.max_output_tokens,
        tokenizer=tokenizer,
        before_compaction_strategy=strategy,
        after_compaction_strategy=strategy,
        **harness,
    )
    session = agent.create_session()
    replies: list[str] = []
    for number, turn in enumerate(SCENARIO.turns, start=1):
        provider.turn = number
        response = await run_turn(agent, turn.user, session=session, stream=stream)
        replies.append(response.text)
    assert all(s.stream is stream for s in client.sent)
    assert len(client.sent) == len(provider.calls)
    assert all(call.kind == "model" for call in provider.calls)
    return Run(
        client=client,
        session=session,
        stored=stored_messages(session),
        replies=replies,
        strategy=strategy,
        recall=recall,
    )


def _no_request_exceeds_the_window(result: Run) -> None:
    over = [(i, c.input_tokens) for i, c in enumerate(result.calls) if c.over_window]
    assert not over, f"requests over the {SETTINGS.context_window:,}-token window (index, tokens): {over}"
    largest = max(c.input_tokens for c in result.calls)
    assert largest <= SETTINGS.context_window


def _tool_names(sent: Sent) -> set[str]:
    return {str(getattr(t, "name", t)) for t in sent.options.get("tools") or ()}


async def test_the_two_harness_variants_differ_in_the_todo_and_mode_providers() -> None:
    defaults, quiet = await run("harness-defaults"), await run("no-todo-no-mode")
    for result in (defaults, quiet):
        assert {LOOKUP_TOOL, RECALL_TOOL_NAME} <= _tool_names(result.sent[0])
    assert any(n.startswith("todos_") for n in _tool_names(defaults.sent[0])), "the todo provider should be on"
    assert any(n.startswith("mode_") for n in _tool_names(defaults.sent[0])), "the mode provider should be on"
    assert not any(n.startswith(("todos_", "mode_")) for n in _tool_names(quiet.sent[0]))


# --- the pin ---------------------------------------------------------------------------------


@HARNESS
async def test_the_model_is_pinned_and_only_the_pinned_request_is_capped(harness: str) -> None:
    result = await run(harness)
    pinned = result.pinned
    print(f"{harness}: {len(result.sent)} requests, pinned at {pinned}")
    assert pinned, "no request was pinned to recall_earlier_tool_results"
    assert len(pinned) == result.recall.forced_calls, "every forced call reached the client pinned, and only those"
    for index in pinned:
        options = result.sent[index].options
        assert options.get("max_tokens") == RECORD_MAX_TOKENS, (
            f"pinned request {index} has max_tokens {options.get('max_tokens')!r}, expected {RECORD_MAX_TOKENS}"
        )
        assert 0 < index < len(result.sent) - 1, f"pinned request {index} has no neighbour on both sides"
        for neighbour in (index - 1, index + 1):
            around = result.sent[neighbour].options
            assert around.get("tool_choice") != PIN, f"request {neighbour}, next to pinned {index}, is pinned too"
            assert around.get("max_tokens") == SETTINGS.max_output_tokens, (
                f"request {neighbour}, next to pinned {index}, has max_tokens {around.get('max_tokens')!r}: "
                f"the {RECORD_MAX_TOKENS} cap must apply to the forced request only"
            )
    unpinned_caps = {s.options.get("max_tokens") for s in result.sent if not s.pinned}
    assert unpinned_caps == {SETTINGS.max_output_tokens}, f"unpinned requests carried caps {unpinned_caps}"
    assert result.recall.ignored_forced_calls == 0
    assert not result.recall.pin_disabled


# --- the record ------------------------------------------------------------------------------


@HARNESS
async def test_the_model_writes_a_record_into_stored_history(harness: str) -> None:
    result = await run(harness)
    records = result.records()
    assert records, "stored history holds no recall_earlier_tool_results result carrying a record"
    assert len(records) == len(result.pinned), "each pinned request should yield exactly one record"
    assert result.strategy.records_in_conversation == len(records)
    for index, text in records:
        message = result.stored[index]
        (content,) = [c for c in message.contents if c.type == "function_result"]
        assert isinstance(content.result, str)
        assert content.result == RECORD_RECEIPT, f"stored result {index} is not the recall tool's receipt"
        (call,) = [
            c for m in result.stored for c in m.contents if c.type == "function_call" and c.call_id == content.call_id
        ]
        values = call.parse_arguments()
        assert values is not None
        assert text == f"{RECORD_PREFIX}\n{values['values']}", "record_text must return the record its call carries"
        assert not message.additional_properties.get(EXCLUDED_KEY), f"record at {index} is excluded"
    # The record quotes what the model was shown: the planted codes of the lookups before it.
    first_index, first = records[0]
    before = [n for n, (_, at) in _lookup_positions(result).items() if at < first_index]
    assert before
    for lookup in before:
        missing = [f.value for f in SCENARIO.facts if f.scope == f"lookup {lookup}" and f.value not in first]
        assert not missing, f"the first record misses codes of lookup {lookup}: {missing}"


def _lookup_positions(result: Run) -> dict[int, tuple[str, int]]:
    """Lookup number -> (call id, stored index of its result)."""
    calls = {
        c.call_id: _lookup_number(c.arguments)
        for m in result.stored
        for c in m.contents
        if c.type == "function_call" and c.name == LOOKUP_TOOL and c.call_id
    }
    return {
        calls[c.call_id]: (c.call_id, index)
        for index, m in enumerate(result.stored)
        for c in m.contents
        if c.type == "function_result" and c.call_id in calls
    }


def _lookup_number(arguments: object) -> int:
    assert isinstance(arguments, dict), f"lookup arguments should be a dict, got {arguments!r}"
    return int(arguments["lookup"])  # pyright: ignore[reportUnknownArgumentType]


# --- covered lookups -------------------------------------------------------------------------


@HARNESS
async def test_covered_lookups_leave_the_prompt_and_stay_stored(harness: str) -> None:
    result = await run(harness)
    covered = result.covered_lookups()
    print(f"{harness}: lookups covered by records: {sorted(n for n, _ in covered.values())}")
    assert len(covered) >= MIN_COVERED_LOOKUPS, (
        f"{len(covered)} lookup group(s) excluded with reason {EXCLUDE_REASON!r}, expected at least "
        f"{MIN_COVERED_LOOKUPS}"
    )
    assert result.strategy.groups_covered >= len(covered)
    records = result.records()
    for call_id, (lookup, at) in covered.items():
        scripted = SCRIPTED[lookup].result
        (content,) = [c for c in result.stored[at].contents if c.type == "function_result"]
        original = original_results(result.stored[at]).get(call_id, content.result)
        assert original == scripted, f"lookup {lookup}'s original result is not intact in stored history"
        # The record that covers it is the first one after it; from that record's event on the
        # lookup is gone from every request, while the pinned request that wrote it still saw it.
        record = next((text for index, text in records if index > at), None)
        assert record is not None, f"lookup {lookup} is excluded but no record follows it"
        event = result.event(record)
        assert result.sent[event - 1].pinned, f"record event {event} does not follow its pinned request"
        assert scripted in result.sent[event - 1].text, (
            f"the pinned request before {event} did not show lookup {lookup}"
        )
        for index in range(event, len(result.sent)):
            sent = result.sent[index]
            assert call_id not in sent.call_ids, f"request {index} (after event {event}) still carries {call_id}"
            assert scripted not in sent.text, (
                f"request {index} (after event {event}) still has lookup {lookup}'s result"
            )


# --- nothing planted is lost -----------------------------------------------------------------


@HARNESS
async def test_every_planted_value_stays_answerable(harness: str) -> None:
    result = await run(harness)
    included = _included_text(result.stored)
    missing = [f.label for f in SCENARIO.facts if f.value not in included]
    assert not missing, f"planted values absent from the included stored messages (records count): {missing}"
    probes = [(t, r) for t, r in zip(SCENARIO.turns, result.replies, strict=True) if t.probe is not None]
    assert probes
    for turn, reply in probes:
        assert turn.probe is not None
        unquoted = [v for v in turn.probe.expected if v not in reply]
        assert not unquoted, f"the probe {turn.probe.scope!r} reply misses {unquoted}: {reply!r}"
    _no_request_exceeds_the_window(result)
    assert result.strategy.overflows == 0


@HARNESS
async def test_records_stay_in_every_later_prompt(harness: str) -> None:
    result = await run(harness)
    records = result.records()
    assert records
    for _, record in records:
        event = result.event(record)
        lacking = [i for i in range(event, len(result.sent)) if not carries(result.sent[i], record)]
        assert not lacking, f"requests after the record event {event} lack the record: {lacking}"


# --- streaming -------------------------------------------------------------------------------


async def test_streaming_stores_the_same_record_and_exclusions() -> None:
    blocking, streaming = await run("harness-defaults"), await run("harness-defaults", stream=True)

    def exclusions(result: Run) -> list[tuple[str, list[str], object]]:
        return [
            (m.role, sorted(c.call_id or "" for c in m.contents), m.additional_properties.get(EXCLUDE_REASON_KEY))
            for m in result.stored
            if m.additional_properties.get(EXCLUDED_KEY)
        ]

    assert streaming.records(), "the streaming run wrote no record"
    assert [t for _, t in streaming.records()] == [t for _, t in blocking.records()]
    assert exclusions(streaming) == exclusions(blocking)
    assert streaming.pinned == blocking.pinned
    assert [s.text for s in streaming.sent] == [s.text for s in blocking.sent]
    assert streaming.replies == blocking.replies


# --- a route that ignores the pin ------------------------------------------------------------


@HARNESS
async def test_an_ignored_pin_disables_forcing_after_two_forced_requests(harness: str) -> None:
    result = await run(harness, ignore_pin=True)
    recall, strategy = result.recall, result.strategy
    pinned = result.pinned
    asked = [i for i, s in enumerate(result.sent) if s.asks_over_prefix]
    print(f"{harness}, pin ignored: {len(result.sent)} requests, pinned at {pinned}, asked over the prefix at {asked}")
    assert recall.pin_disabled, "forcing should be disabled after two ignored pins"
    assert recall.forced_calls == 2, f"forced_calls {recall.forced_calls}, expected 2"
    assert recall.ignored_forced_calls == 2, f"ignored_forced_calls {recall.ignored_forced_calls}, expected 2"
    assert len(pinned) == 2, f"pinned requests at {pinned}, expected exactly 2"
    # The verdict falls on the second forced response: forcing is on until then, off from then on.
    second = pinned[1]
    on = [i for i in range(second + 1) if result.sent[i].pin_disabled]
    off = [i for i in range(second + 1, len(result.sent)) if not result.sent[i].pin_disabled]
    assert not on, f"forcing was already disabled at requests {on}"
    assert not off, f"forcing was not disabled yet at requests {off}, after the second forced request {second}"
    assert second < len(result.sent) - 1, "the run should go on after forcing is disabled"
    assert not result.records(), "no recall call may record anything when the route ignores the pin"
    assert not any(RECALL_TOOL_NAME in (c.name or "") for m in result.stored for c in m.contents)

    # From then on every due record is asked over the cached prefix, never pinned.
    assert asked, "no record was asked over the cached prefix after forcing was disabled"
    assert all(i > second for i in asked), f"asked over the prefix at {asked}, before forcing was disabled"
    assert (strategy.prefix_requests, strategy.failed_prefix_requests) == (len(asked), 0)
    for i in asked:
        request, last, following = result.sent[i], result.sent[i - 1], result.sent[i + 1]
        assert not last.asks_over_prefix
        assert not following.asks_over_prefix
        # The prompt as it stands (the conversation's last request byte for byte, then what arrived since: its
        # answer and the new user turn), cut between groups so that it sends no more than the last request did,
        # then the instruction alone: a prefix of what the provider cached ...
        body, before = request.conversation[:-1], last.conversation
        shared = min(len(body), len(before))
        assert body[:shared] == before[:shared], f"request {i} is not a prefix of the prompt as it stands"
        arrived = [json.loads(m)["role"] for m in body[len(before) :]]
        assert arrived in ([], ["assistant"], ["assistant", "user"]), f"request {i} adds {arrived} to request {i - 1}"
        assert json.loads(request.conversation[-1])["role"] == "user"
        # ... with this run's injected context (the todo list, with the harness defaults) where the conversation's
        # next request has it, and the head of the last request: its options, the caller's own.
        assert request.context == following.context
        assert request.options == last.options, f"request {i} does not repeat the head of request {i - 1}"
        assert request.head == following.head
        assert request.options.get("tool_choice") == "auto"
        assert request.options.get("max_tokens") == SETTINGS.max_output_tokens

    # Each answer is a written record in stored history (included), quoting the planted codes of the newest lookup
    # its request showed, and carried by every request from the conversation's next one on.
    written = [(k, text) for k, m in enumerate(result.stored) if m.role == "assistant" and (text := record_text(m))]
    assert len(written) == len(asked), f"{len(written)} written record(s) for {len(asked)} request(s)"
    lookups = {call_id: n for n, (call_id, _) in _lookup_positions(result).items()}
    for (index, text), i in zip(written, asked, strict=True):
        assert text.startswith(RECORD_PREFIX)
        assert not result.stored[index].additional_properties.get(EXCLUDED_KEY), f"written record {index} is excluded"
        shown = [
            lookups[c["call_id"]]
            for m in result.sent[i].wire
            for c in json.loads(m)["contents"]
            if c["type"] == "function_result" and c.get("call_id") in lookups
        ]
        assert shown, f"request {i} shows no lookup result"
        lookup = shown[-1]
        missing = [f.value for f in SCENARIO.facts if f.scope == f"lookup {lookup}" and f.value not in text]
        assert not missing, f"the record asked at request {i} misses codes of lookup {lookup}: {missing}"
        body = text.removeprefix(RECORD_PREFIX).strip()
        lacking = [k for k in range(i + 1, len(result.sent)) if body not in result.sent[k].text]
        assert not lacking, f"requests after {i} lack the record written from it: {lacking}"
    assert not any(RECORD_INSTRUCTION in (m.text or "") for m in result.stored), "the instruction entered history"
    assert strategy.records_found == 1
    assert len(result.covered_lookups()) >= MIN_COVERED_LOOKUPS
    # Before the first record the anchored fallback kept the prompt in the window.
    assert strategy.fallbacks_used > 0, "without a record the anchored fallback must keep the prompt in the window"
    _no_request_exceeds_the_window(result)
