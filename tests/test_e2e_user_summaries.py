"""End to end: the user-turn strategy inside ``create_harness_agent``, judged by what was sent and stored.

The user-heavy workload (``runner.load_scenario(Settings(tool_share=0.2), fill, 1)``: the
requirements R1-R3 in turns 1-2, a correction a third of the way in, six lookups between
filler turns of about 2,000 tokens, then closing probes) is played at fill 1.5 and 3.0 on
a 32K window by the scripted model behind the simulated provider. The agent is built by
``create_harness_agent`` with the harness defaults (todo, mode and file memory on, in a
temporary directory; web search off, the simulated provider has none) and once with
``disable_todo=True, disable_mode=True``. The strategy is built as a user builds it,
``UserTurnAnchoredSummarizationCompactionStrategy(max_input_tokens=budget,
tokenizer=<o200k_base>, client=<summarizer>)``, one instance for both phases, in each of
the three modes.

Both clients are the bench's in-process ``SimulatedChatClient`` (the summarizer with
``kind="summarizer"``, answering with ``ScriptedModel.summary``), subclassed only to record
every request as it arrives, with the strategy's counters at that moment. Nothing in the
framework is mocked.

Known failure, marked ``xfail(strict=True)`` with the exact scenario: at fill 3.0 the last requests exceed the
window (the strategy's floor plus the harness overhead the strategy cannot see).

Terms: the *before pass* is the strategy run on the in-call copy before a model request;
the *after-run pass* is the one the harness runs on stored history after the run. Counter
deltas between the last model request of a turn and the end of the turn belong to the
after-run pass.

The framework counts its own token annotations with a memoized o200k_base tokenizer (same
counts; it re-counts every loaded message on every pass, which would otherwise dominate the
runtime). The strategy gets the plain o200k_base tokenizer.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import tempfile
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
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

from maf_compaction.adapters.convert import (
    EXCLUDED_KEY,
    SUMMARIZED_BY_KEY,
    SUMMARY_KEY,
    SUMMARY_OF_KEY,
    is_summary,
)
from maf_compaction.adapters.user_summaries import (
    EXCLUDE_REASON,
    FOLD_EXCLUDE_REASON,
    UserTurnAnchoredSummarizationCompactionStrategy,
)
from maf_compaction.bench.client import SimulatedChatClient, scenario_tools
from maf_compaction.bench.model import ModelOptions, ScriptedModel, context_text
from maf_compaction.bench.provider import CallRecord, SimulatedProvider
from maf_compaction.bench.rendering import render_instructions, render_message
from maf_compaction.bench.runner import Settings, load_scenario, run_turn, stored_messages
from maf_compaction.bench.scenario import LOOKUP_TOOL, Scenario
from maf_compaction.bench.simulator import get_profile
from maf_compaction.core.user_summaries import USER_SUMMARY_MARKER, SummaryMode
from offline_tokenizers import offline_tiktoken

SETTINGS: Final = Settings(tool_share=0.2)  # a 32,000-token window, 2,048 output tokens: the user-heavy workload
WINDOW: Final = SETTINGS.context_window
BUDGET: Final = SETTINGS.budget
FILLS: Final = (1.5, 3.0)
SEED: Final = 1
MODES: Final[tuple[SummaryMode, ...]] = ("recompact", "boundary", "fold")
SCENARIOS: Final[Mapping[float, Scenario]] = {fill: load_scenario(SETTINGS, fill, SEED) for fill in FILLS}
OUR_KEYS: Final = (SUMMARY_KEY, SUMMARY_OF_KEY, SUMMARIZED_BY_KEY)
REJECTED: Final = re.compile(r"Rejected .* compaction summary message\(s\)")

#: The harness defaults (todo, mode and file memory on; web search off) and the variant without todo and mode.
HARNESSES: Final[Mapping[str, Mapping[str, Any]]] = {
    "harness-defaults": {"disable_web_search": True},
    "no-todo-no-mode": {"disable_web_search": True, "disable_todo": True, "disable_mode": True},
}
MATRIX = pytest.mark.parametrize(
    ("harness", "fill", "mode"),
    [(h, f, m) for h in HARNESSES for f in FILLS for m in MODES],
    ids=[f"{h}-{f}-{m}" for h in HARNESSES for f in FILLS for m in MODES],
)

TOKENIZER: Final = offline_tiktoken()


class MemoizedTokenizer:
    """o200k_base with a memo, for the framework's own token annotations only (same counts)."""

    def __init__(self) -> None:
        self.count_tokens = functools.lru_cache(maxsize=None)(TOKENIZER.count_tokens)


HARNESS_TOKENIZER: Final = MemoizedTokenizer()


# --- recording clients -----------------------------------------------------------------------


@dataclass(frozen=True)
class Counters:
    """The strategy's counters at one moment."""

    calls: int = 0
    replayed: int = 0
    compactions: int = 0
    folds: int = 0
    failures: int = 0

    @classmethod
    def of(cls, strategy: UserTurnAnchoredSummarizationCompactionStrategy | None) -> Counters:
        if strategy is None:
            return cls()
        return cls(
            calls=strategy.summarizer_calls,
            replayed=strategy.user_summaries_replayed,
            compactions=strategy.user_compactions,
            folds=strategy.user_folds,
            failures=strategy.user_summary_failures,
        )

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            calls=self.calls - other.calls,
            replayed=self.replayed - other.replayed,
            compactions=self.compactions - other.compactions,
            folds=self.folds - other.folds,
            failures=self.failures - other.failures,
        )

    @property
    def accepted(self) -> int:
        return self.compactions + self.folds


@dataclass(frozen=True)
class Sent:
    """One model request as the client received it (after the before pass).

    Attributes:
        turn: 1-based scenario turn.
        entries: The instructions entry and one canonical entry per message (what the provider bills).
        summaries: Our summaries in the request: (id, index into ``entries``, entry), in order.
        counters: The strategy's counters when the request arrived.
        corrupt: What was wrong with stored history at that moment (empty when nothing).
        tools: Names of the tools the request declares.
        stream: The call was a streaming call.
    """

    turn: int
    entries: tuple[str, ...]
    summaries: tuple[tuple[str, int, str], ...]
    counters: Counters
    corrupt: tuple[str, ...]
    tools: frozenset[str]
    stream: bool


@dataclass(frozen=True)
class Asked:
    """One summarizer request: its turn, the model requests sent before it, and its two messages."""

    turn: int
    model_requests_before: int
    system: str
    transcript: str


@dataclass(frozen=True)
class Saved:
    """A session saved while a model request was in flight, with the strategy's decisions."""

    turn: int
    request: int  # index of the in-flight model request
    asked: int  # summarizer requests sent before it
    session: dict[str, Any]
    decisions: dict[str, Any]


class ModelClient(SimulatedChatClient):
    """The agent's client: keeps every request, the replies, and (if asked) in-flight saves."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sent: list[Sent] = []
        self.replies: list[str] = []
        self.strategy: UserTurnAnchoredSummarizationCompactionStrategy | None = None
        self.session: AgentSession | None = None
        self.summarizer: SummarizerClient | None = None
        self.saves: list[Saved] = []
        self.save_in_flight = False

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        turn = self.provider.turn
        stored = stored_messages(self.session) if self.session is not None else []
        entries = (render_instructions(options) or "", *(render_message(m) for m in messages))
        summaries = tuple(
            (m.message_id or "", index + 1, entries[index + 1]) for index, m in enumerate(messages) if is_summary(m)
        )
        first_of_turn = not self.sent or self.sent[-1].turn != turn
        if (
            self.save_in_flight
            and len(self.saves) < 2
            and first_of_turn
            and self.session is not None
            and self.strategy is not None
        ):
            stored_ids = {m.message_id for m in stored}
            if any(is_summary(m) and m.message_id not in stored_ids for m in messages):
                # A summary the before pass just wrote into the in-call copy: save here, as if the
                # process died before the reply arrived.
                self.saves.append(
                    Saved(
                        turn=turn,
                        request=len(self.sent),
                        asked=len(self.summarizer.asked) if self.summarizer is not None else 0,
                        session=json.loads(json.dumps(self.session.to_dict())),
                        decisions=json.loads(json.dumps(self.strategy.decision_state().to_dict())),
                    )
                )
        self.sent.append(
            Sent(
                turn=turn,
                entries=entries,
                summaries=summaries,
                counters=Counters.of(self.strategy),
                corrupt=tuple(_corruption(stored)),
                tools=frozenset(str(getattr(t, "name", t)) for t in options.get("tools") or ()),
                stream=stream,
            )
        )
        return super()._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)

    async def _respond(self, messages: Sequence[Message], options: Mapping[str, Any]) -> ChatResponse:
        response = await super()._respond(messages, options)
        self.replies.extend(render_message(m) for m in response.messages)
        return response


class SummarizerClient(SimulatedChatClient):
    """The summarizer (``kind="summarizer"``): keeps every request; raises on the first ``fail_first`` calls.

    A raising call is recorded and never reaches the provider (its provider is down).
    """

    def __init__(self, *, model_client: ModelClient, fail_first: int = 0, **kwargs: Any) -> None:
        super().__init__(kind="summarizer", **kwargs)
        self.asked: list[Asked] = []
        self.fail_first = fail_first
        self._model_client = model_client

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        system = "\n".join(m.text for m in messages if m.role == "system")
        transcript = "\n".join(m.text for m in messages if m.role != "system")
        self.asked.append(Asked(self.provider.turn, len(self._model_client.sent), system, transcript))
        if len(self.asked) <= self.fail_first:
            raise RuntimeError("the summarizer's provider is down")
        return super()._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)


# --- stored history ---------------------------------------------------------------------------


def _excluded(message: Message) -> bool:
    return bool(message.additional_properties.get(EXCLUDED_KEY))


def _summary_of(message: Message) -> list[str]:
    ids: object = message.additional_properties.get(SUMMARY_OF_KEY)
    return [str(i) for i in ids] if isinstance(ids, list) else []  # pyright: ignore[reportUnknownVariableType]


def _corruption(stored: Sequence[Message]) -> list[str]:
    """Everything wrong with the summaries, their links and the exclusions in ``stored``."""
    problems: list[str] = []
    by_id = {m.message_id: (i, m) for i, m in enumerate(stored) if m.message_id}
    summaries = {m.message_id: (i, m) for i, m in enumerate(stored) if SUMMARY_KEY in m.additional_properties}
    for summary_id, (index, summary) in summaries.items():
        where = f"summary {summary_id} (stored {index})"
        if not is_summary(summary):
            problems.append(f"{where} is not a well-formed summary (user role, id, links, marker)")
        if summary.role != "user" or not summary.text.startswith(USER_SUMMARY_MARKER):
            problems.append(f"{where}: role {summary.role!r}, text starts {summary.text[:60]!r}")
        replaced = _summary_of(summary)
        if not replaced:
            problems.append(f"{where} names no replaced message")
        for replaced_id in replaced:
            if replaced_id not in by_id:
                problems.append(f"{where} names {replaced_id}, which is not in stored history")
                continue
            at, message = by_id[replaced_id]
            if message.role != "user" or not _excluded(message):
                problems.append(f"{where} replaced {replaced_id} (stored {at}), which is {message.role} and included")
            if message.additional_properties.get(SUMMARIZED_BY_KEY) != summary_id:
                problems.append(f"{replaced_id} (stored {at}) does not link back to {where}")
        if replaced and replaced[0] in by_id and by_id[replaced[0]][0] != index + 1:
            problems.append(f"{where} does not stand where its first replaced turn {replaced[0]} stood")
    for index, message in enumerate(stored):
        props = message.additional_properties
        where = f"stored {index} ({message.role}, {message.message_id})"
        if message.role != "user":
            if _excluded(message) or any(key in props for key in OUR_KEYS):
                problems.append(f"{where} was touched: excluded={_excluded(message)}, keys {sorted(props)}")
            continue
        if not _excluded(message):
            continue
        if props.get(EXCLUDE_REASON_KEY) not in (EXCLUDE_REASON, FOLD_EXCLUDE_REASON):
            problems.append(f"{where} is excluded for {props.get(EXCLUDE_REASON_KEY)!r}")
        # Follow the links to an included summary.
        current = message
        seen: set[str] = set()
        while _excluded(current):
            by = current.additional_properties.get(SUMMARIZED_BY_KEY)
            if not isinstance(by, str) or by not in summaries or by in seen:
                problems.append(f"{where} is excluded but not linked to an included summary (link {by!r})")
                break
            seen.add(by)
            current = summaries[by][1]
    return problems


def _included_text(stored: Sequence[Message]) -> str:
    return context_text([m for m in stored if not _excluded(m)])


def _requirement_lines(scenario: Scenario) -> dict[str, str]:
    """label -> the user's line that states each requirement and the correction."""
    lines: dict[str, str] = {}
    for fact in scenario.facts:
        if fact.scope != "requirements":
            continue
        for turn in scenario.turns:
            for line in turn.user.splitlines():
                if fact.value in line and not turn.probe:
                    lines[fact.label] = line.strip()
    return lines


# --- the runs ----------------------------------------------------------------------------------


@dataclass
class Run:
    """One conversation (or its continuation) through the harness."""

    scenario: Scenario
    mode: SummaryMode
    model: ModelClient
    summarizer: SummarizerClient
    strategy: UserTurnAnchoredSummarizationCompactionStrategy
    session: AgentSession
    stored: list[Message]
    replies: dict[int, str]  # turn -> final reply text
    turn_end: dict[int, Counters]  # turn -> the strategy's counters once the run (and its after-run pass) ended
    logs: list[logging.LogRecord] = field(default_factory=list[logging.LogRecord])

    @property
    def sent(self) -> list[Sent]:
        return self.model.sent

    @property
    def calls(self) -> list[CallRecord]:
        return self.model.provider.calls

    def summaries(self) -> list[Message]:
        return [m for m in self.stored if SUMMARY_KEY in m.additional_properties]

    def after_run(self, turn: int) -> tuple[Counters, Counters]:
        """(before passes, after-run pass) counter deltas of ``turn``."""
        previous = self.turn_end.get(turn - 1, Counters())
        last = [s for s in self.sent if s.turn == turn][-1].counters
        return last - previous, self.turn_end[turn] - last

    def describe(self) -> str:
        s = self.strategy
        return (
            f"{len(self.sent)} model requests, {len(self.summarizer.asked)} summarizer requests, "
            f"{s.user_compactions} summaries + {s.user_folds} folds fresh, {s.user_summaries_replayed} replayed, "
            f"{s.user_summaries_in_conversation} standing, {s.user_summary_failures} failures"
        )


async def play(
    scenario: Scenario,
    mode: SummaryMode,
    harness: str,
    *,
    stream: bool = False,
    fail_first: int = 0,
    save_in_flight: bool = False,
    resume: Saved | None = None,
) -> Run:
    """Play ``scenario`` (from ``resume.turn`` on a restored session and strategy, if given)."""
    # The harness's default file memory writes under the working directory: give each run its own.
    with tempfile.TemporaryDirectory(prefix="maf-e2e-user-") as directory, contextlib.chdir(directory):
        provider = SimulatedProvider(
            encoder=TOKENIZER, window=WINDOW, profile=get_profile(SETTINGS.profile), cache=SETTINGS.cache
        )
        model = ScriptedModel(scenario, ModelOptions(seed=SEED).without_losses())
        client = ModelClient(model=model, provider=provider)
        summarizer = SummarizerClient(model_client=client, fail_first=fail_first, model=model, provider=provider)
        strategy = UserTurnAnchoredSummarizationCompactionStrategy(
            max_input_tokens=BUDGET, tokenizer=TOKENIZER, client=summarizer, summary_mode=mode
        )
        if resume is not None:
            strategy.restore_decisions(resume.decisions)
        agent = create_harness_agent(
            client,
            agent_instructions=scenario.system,
            tools=scenario_tools(scenario),
            max_context_window_tokens=WINDOW,
            max_output_tokens=SETTINGS.max_output_tokens,
            tokenizer=HARNESS_TOKENIZER,
            before_compaction_strategy=strategy,
            after_compaction_strategy=strategy,
            **HARNESSES[harness],
        )
        session = agent.create_session() if resume is None else AgentSession.from_dict(resume.session)
        client.strategy, client.session, client.summarizer = strategy, session, summarizer
        client.save_in_flight = save_in_flight
        replies: dict[int, str] = {}
        turn_end: dict[int, Counters] = {}
        first = 1 if resume is None else resume.turn
        if resume is not None:
            turn_end[first - 1] = Counters.of(strategy)
        for number in range(first, len(scenario.turns) + 1):
            provider.turn = number
            text = scenario.turns[number - 1].user
            response = await run_turn(agent, text, session=session, stream=stream)
            replies[number] = response.text
            turn_end[number] = Counters.of(strategy)
    return Run(
        scenario=scenario,
        mode=mode,
        model=client,
        summarizer=summarizer,
        strategy=strategy,
        session=session,
        stored=stored_messages(session),
        replies=replies,
        turn_end=turn_end,
    )


_RUNS: dict[tuple[str, float, str, bool], Run] = {}


async def run(
    harness: str, fill: float, mode: SummaryMode, caplog: pytest.LogCaptureFixture, *, stream: bool = False
) -> Run:
    """Play the matrix cell once per session of tests (runs are deterministic); logs captured with ``caplog``."""
    key = (harness, fill, mode, stream)
    if key not in _RUNS:
        caplog.set_level(logging.WARNING, logger="agent_framework")
        caplog.set_level(logging.WARNING, logger="maf_compaction")
        start = len(caplog.records)
        result = await play(SCENARIOS[fill], mode, harness, stream=stream, save_in_flight=not stream)
        result.logs = list(caplog.records[start:])
        _RUNS[key] = result
    return _RUNS[key]


def _stored_bytes(stored: Sequence[Message]) -> list[tuple[str, str | None, str, list[tuple[str, str]]]]:
    """Every stored message as the provider sees it, with its id and our (and the exclusion) properties."""
    keys = (EXCLUDED_KEY, EXCLUDE_REASON_KEY, *OUR_KEYS)
    return [
        (
            str(m.role),
            m.message_id,
            render_message(m),
            [(k, json.dumps(m.additional_properties[k])) for k in keys if k in m.additional_properties],
        )
        for m in stored
    ]


def _summary_bytes(stored: Sequence[Message]) -> list[tuple[str, str | None, str, list[tuple[str, str]]]]:
    """The summaries and the messages they replaced, as :func:`_stored_bytes` shows them."""
    return [
        entry
        for m, entry in zip(stored, _stored_bytes(stored), strict=True)
        if SUMMARY_KEY in m.additional_properties or SUMMARIZED_BY_KEY in m.additional_properties
    ]


def _no_request_exceeds_the_window(result: Run) -> None:
    over = [(i, c.kind, c.input_tokens) for i, c in enumerate(result.calls) if c.over_window]
    assert not over, f"requests over the {WINDOW:,}-token window (index, kind, tokens), i.e. DQ {len(over)}: {over}"


def _user_turns(result: Run) -> dict[str, list[int]]:
    """Scenario user text -> stored indices of the messages carrying it."""
    found: dict[str, list[int]] = {t.user: [] for t in result.scenario.turns}
    for index, message in enumerate(result.stored):
        if message.role == "user" and message.text in found:
            found[message.text].append(index)
    return found


# --- the tests -------------------------------------------------------------------------------


async def test_the_two_harness_variants_differ_in_the_todo_and_mode_providers(caplog: pytest.LogCaptureFixture) -> None:
    defaults = await run("harness-defaults", 1.5, "recompact", caplog)
    quiet = await run("no-todo-no-mode", 1.5, "recompact", caplog)
    tools = defaults.sent[0].tools
    assert LOOKUP_TOOL in tools
    assert LOOKUP_TOOL in quiet.sent[0].tools
    assert any(n.startswith("todos_") for n in tools), f"the todo provider should be on: {sorted(tools)}"
    assert any(n.startswith("mode_") for n in tools), f"the mode provider should be on: {sorted(tools)}"
    assert not any(n.startswith(("todos_", "mode_")) for n in quiet.sent[0].tools)


@MATRIX
async def test_the_summarizer_is_called_within_its_bound_and_no_request_is_sent_twice(
    harness: str, fill: float, mode: SummaryMode, caplog: pytest.LogCaptureFixture
) -> None:
    result = await run(harness, fill, mode, caplog)
    strategy, asked = result.strategy, result.summarizer.asked
    print(f"{harness} fill {fill} {mode}: {result.describe()}")
    assert asked, "the summarizer was never called"
    assert strategy.summarizer_calls == len(asked), (
        f"summarizer_calls {strategy.summarizer_calls} but the summarizer received {len(asked)} requests"
    )
    billed = sum(1 for c in result.calls if c.kind == "summarizer")
    assert billed == len(asked), f"{len(asked)} summarizer requests, {billed} reached the provider"
    limit = strategy.config.summary_input_limit
    assert limit == BUDGET // 2, f"max_summary_input_tokens should default to half the budget, got {limit}"
    count = strategy.tokenizer.count_tokens
    over = [(i, count(a.system) + count(a.transcript)) for i, a in enumerate(asked)]
    over = [(i, tokens) for i, tokens in over if tokens > limit]
    assert not over, f"summarizer requests over max_summary_input_tokens={limit} (index, tokens): {over}"

    # Never twice for the same conversation state: no summarizer request and no model request repeats.
    payloads = [(a.system, a.transcript) for a in asked]
    repeated = [(i, a.turn) for i, a in enumerate(asked) if payloads.index(payloads[i]) != i]
    assert not repeated, f"summarizer requests sent again (index, turn): {repeated}"
    entries = [s.entries for s in result.sent]
    repeated = [(i, s.turn) for i, s in enumerate(result.sent) if entries.index(entries[i]) != i]
    assert not repeated, f"model requests sent twice (index, turn): {repeated}"

    # The after-run pass replays the summary its turn's before pass wrote; it never asks again.
    after_calls: list[int] = []
    for turn in sorted(result.turn_end):
        before, after = result.after_run(turn)
        if after.calls:
            after_calls.append(turn)
        if before.accepted:
            assert after.calls == 0, (
                f"turn {turn}: the before pass accepted {before.accepted} fresh summary(ies); the after-run pass "
                f"asked the summarizer {after.calls} time(s) instead of replaying"
            )
            assert after.replayed >= before.accepted, (
                f"turn {turn}: the before pass accepted {before.accepted} fresh summary(ies); the after-run pass "
                f"replayed {after.replayed}"
            )
    assert not after_calls, f"after-run passes called the summarizer in turns {after_calls}"
    fresh = strategy.user_compactions + strategy.user_folds
    assert fresh >= 1
    assert strategy.user_summaries_replayed >= fresh, (
        f"{fresh} summaries written in-call, only {strategy.user_summaries_replayed} replayed on stored history"
    )


@MATRIX
async def test_stored_history_holds_linked_summaries_and_leaves_assistant_and_tool_messages_alone(
    harness: str, fill: float, mode: SummaryMode, caplog: pytest.LogCaptureFixture
) -> None:
    result = await run(harness, fill, mode, caplog)
    summaries = result.summaries()
    standing = [m for m in summaries if not _excluded(m)]
    print(f"{harness} fill {fill} {mode}: {len(summaries)} summaries stored, {len(standing)} standing")
    assert summaries, "stored history holds no summary"
    problems = _corruption(result.stored)
    assert not problems, "stored history at the end:\n" + "\n".join(problems)
    during = [(i, s.turn, s.corrupt) for i, s in enumerate(result.sent) if s.corrupt]
    assert not during, f"stored history was inconsistent while requests were sent: {during[:3]}"
    assert len(standing) == result.strategy.user_summaries_in_conversation
    if mode == "recompact":
        assert len(standing) == 1, f"recompact keeps one standing summary, found {len(standing)}"
    if mode == "boundary":
        assert len(standing) == len(summaries), "boundary mode never replaces a standing summary"

    # Every user turn is stored once; the ones summarised are excluded and linked (checked above).
    turns = _user_turns(result)
    counts = {text[:40]: len(at) for text, at in turns.items() if len(at) != 1}
    assert not counts, f"user turns stored other than once: {counts}"
    replaced = [at[0] for at in turns.values() if _excluded(result.stored[at[0]])]
    assert replaced, "no user turn was replaced"
    assert all(SUMMARIZED_BY_KEY in result.stored[i].additional_properties for i in replaced)

    # Assistant messages are the model's replies, in order and as sent; tool results are the scripted ones.
    assistant = [render_message(m) for m in result.stored if m.role == "assistant"]
    assert assistant == result.model.replies, "stored assistant messages differ from the model's replies"
    for index, message in enumerate(result.stored):
        for content in message.contents:
            if content.type != "function_result":
                continue
            assert message.role == "tool"
            match = re.fullmatch(r"call_(\d+)_(\d+)", content.call_id or "")
            assert match, f"unexpected call id {content.call_id!r} at stored {index}"
            turn, step = int(match.group(1)), int(match.group(2))
            scripted = result.scenario.turns[turn - 1].calls[step].result
            assert content.result == scripted, f"the tool result at stored {index} was changed"


@pytest.mark.parametrize("harness", list(HARNESSES))
@pytest.mark.parametrize("fill", FILLS)
async def test_boundary_summaries_are_byte_identical_once_written(
    harness: str, fill: float, caplog: pytest.LogCaptureFixture
) -> None:
    result = await run(harness, fill, "boundary", caplog)
    stored = {m.message_id or "": render_message(m) for m in result.summaries()}
    assert len(stored) >= (2 if fill > 2 else 1), f"expected several boundary summaries, got {len(stored)}"
    first: dict[str, int] = {}
    previous: list[str] = []
    for index, sent in enumerate(result.sent):
        ids = [summary_id for summary_id, _, _ in sent.summaries]
        assert ids[: len(previous)] == previous, (
            f"request {index} carries summaries {ids}; the request before carried {previous}: one moved or vanished"
        )
        previous = ids
        for summary_id, at, entry in sent.summaries:
            first.setdefault(summary_id, index)
            assert entry == stored.get(summary_id), (
                f"request {index} carries summary {summary_id} in other bytes than stored history keeps"
            )
            if harness == "no-todo-no-mode":
                # Nothing before a standing summary changes either: the cached prefix survives. (With the
                # defaults the todo provider puts its "### Current todo list" message at the head of some
                # requests and not others, which moves the prefix on its own.)
                head = result.sent[first[summary_id]]
                written_at = next(a for s, a, _ in head.summaries if s == summary_id)
                assert sent.entries[: at + 1] == head.entries[: written_at + 1], (
                    f"request {index}: the prompt up to summary {summary_id} differs from request {first[summary_id]}"
                )
    assert set(first) == set(stored), f"summaries never sent: {sorted(set(stored) - set(first))}"


@MATRIX
async def test_every_requirement_and_the_correction_stay_answerable(
    harness: str, fill: float, mode: SummaryMode, caplog: pytest.LogCaptureFixture
) -> None:
    result = await run(harness, fill, mode, caplog)
    scenario = result.scenario
    included = _included_text(result.stored)
    lines = _requirement_lines(scenario)
    assert set(lines) == {"R1", "R2", "R3", "correction"}
    missing = [label for label, line in lines.items() if line not in included]
    assert not missing, f"requirement/correction lines absent from the included stored messages: {missing}"
    summarised = [label for label, line in lines.items() if line in _included_text(result.summaries())]
    assert summarised, "no requirement or correction was carried by a summary (the scenario should summarise them)"
    lost = [f.label for f in scenario.facts if f.value not in included]
    assert not lost, f"planted values absent from the included stored messages: {lost}"
    probes = [(n, t) for n, t in enumerate(scenario.turns, start=1) if t.probe is not None]
    assert probes
    for number, turn in probes:
        assert turn.probe is not None
        unquoted = [v for v in turn.probe.expected if v not in result.replies[number]]
        assert not unquoted, f"the probe {turn.probe.scope!r} reply misses {unquoted}: {result.replies[number]!r}"


OVER_THE_WINDOW_AT_3X: Final = (
    "Limitation, not a regression: at fill 3.0 the last turns' requests exceed the 32K window (DQ 4 with the "
    "harness defaults, 1-2 without todo/mode) in every mode. The strategy is at its floor (every user turn "
    "between the anchors summarised, ~80-350 summary tokens; last pass DECLINED at 27.2-27.5K conversation "
    "tokens, under the 29,952 budget): the rest is tool results and assistant replies, which it never touches, "
    "plus the harness instructions, tool declarations and injected context (~5-6.5K), which it cannot see. The "
    "bench's quiet harness (file memory off) stays under the window (max 30.6-30.8K), which is what "
    "docs/user-summaries.md measured."
)


@pytest.mark.parametrize(
    ("harness", "fill", "mode"),
    [
        pytest.param(h, f, m, marks=[pytest.mark.xfail(strict=True, reason=OVER_THE_WINDOW_AT_3X)] if f > 2 else [])
        for h in HARNESSES
        for f in FILLS
        for m in MODES
    ],
    ids=[f"{h}-{f}-{m}" for h in HARNESSES for f in FILLS for m in MODES],
)
async def test_no_request_exceeds_the_window(
    harness: str, fill: float, mode: SummaryMode, caplog: pytest.LogCaptureFixture
) -> None:
    result = await run(harness, fill, mode, caplog)
    model = [c.input_tokens for c in result.calls if c.kind == "model"]
    print(f"{harness} fill {fill} {mode}: largest model request {max(model):,} tokens")
    _no_request_exceeds_the_window(result)


#: The user half's honest WARNING when what it may not shorten leaves the prompt over the budget.
STILL_OVER: Final = re.compile(r"^After summary \S+ the prompt is still \d+ tokens, over the \d+-token budget")


@MATRIX
async def test_the_framework_rejects_no_summary(
    harness: str, fill: float, mode: SummaryMode, caplog: pytest.LogCaptureFixture
) -> None:
    result = await run(harness, fill, mode, caplog)
    framework = [r for r in result.logs if r.name.startswith("agent_framework") and r.levelno >= logging.WARNING]
    rejected = [r.getMessage() for r in framework if REJECTED.search(r.getMessage())]
    assert not rejected, f"the framework rejected our summaries {len(rejected)} time(s): {rejected[:2]}"
    ours = [r.getMessage() for r in result.logs if r.name.startswith("maf_compaction") and r.levelno >= logging.WARNING]
    # A model's summaries carry prose: past three times the window the user half alone may end a pass over the
    # budget, and says so (it keeps what it cannot shorten); nothing else is warned about in this run.
    ours = [text for text in ours if not STILL_OVER.search(text)]
    assert not ours, f"the strategy warned during a healthy run: {ours[:3]}"


async def test_streaming_stores_the_same_summaries(caplog: pytest.LogCaptureFixture) -> None:
    blocking = await run("no-todo-no-mode", 3.0, "boundary", caplog)
    streaming = await run("no-todo-no-mode", 3.0, "boundary", caplog, stream=True)
    assert all(s.stream for s in streaming.sent), "the streaming run made a non-streaming model call"
    assert not any(s.stream for s in blocking.sent)
    assert streaming.summaries(), "the streaming run stored no summary"
    assert _summary_bytes(streaming.stored) == _summary_bytes(blocking.stored)
    assert [a.transcript for a in streaming.summarizer.asked] == [a.transcript for a in blocking.summarizer.asked]
    assert [s.entries for s in streaming.sent] == [s.entries for s in blocking.sent]
    assert streaming.replies == blocking.replies


RESTORE_FILL: Final = 1.5


@pytest.mark.parametrize("mode", MODES)
async def test_a_restored_session_replays_the_in_flight_summary_and_continues_with_the_same_bytes(
    mode: SummaryMode, caplog: pytest.LogCaptureFixture
) -> None:
    # The original run saved its session and the strategy's decisions, JSON round-tripped, while the
    # first request of a turn was in flight carrying a summary its before pass had just written (the
    # second such moment): as if the process died before the reply came back. A fresh agent with a
    # fresh strategy restores both and the user sends that turn again.
    original = await run("harness-defaults", RESTORE_FILL, mode, caplog)
    assert original.model.saves, "no first request of a turn carried a summary written by its before pass"
    saved = original.model.saves[-1]
    restored = await play(SCENARIOS[RESTORE_FILL], mode, "harness-defaults", resume=saved)
    print(f"{mode}: restored at turn {saved.turn} (request {saved.request}); {restored.describe()}")

    first = restored.sent[0]
    assert first.counters.calls == 0, f"the restored strategy asked the summarizer again for turn {saved.turn}"
    assert first.counters.replayed == 1, "the restored strategy should replay the remembered summary"
    assert first.summaries == original.sent[saved.request].summaries, "the replayed summary differs in bytes"
    later = [(a.turn, a.system, a.transcript) for a in original.summarizer.asked[saved.asked :]]
    asked = [(a.turn, a.system, a.transcript) for a in restored.summarizer.asked]
    assert asked == later, (
        f"the restored run asked the summarizer {len(asked)} time(s); the original asked {len(later)} time(s) "
        "after the save"
    )
    assert restored.strategy.summarizer_calls == original.strategy.summarizer_calls - saved.asked
    sent = [s.entries for s in restored.sent]
    expected = [s.entries for s in original.sent[saved.request :]]
    differing = [i for i, (a, b) in enumerate(zip(sent, expected, strict=False)) if a != b]
    assert len(sent) == len(expected), f"{len(sent)} requests after the restore against {len(expected)}"
    assert not differing, f"requests after the restore differ in bytes at {differing[:5]}"
    assert _stored_bytes(restored.stored) == _stored_bytes(original.stored), "stored history differs in bytes"
    assert restored.replies == {t: r for t, r in original.replies.items() if t >= saved.turn}
    assert not _corruption(restored.stored)


ALWAYS: Final = 1_000_000


async def test_a_failing_summarizer_changes_nothing_and_is_not_retried_on_the_other_list(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="maf_compaction")
    result = await play(SCENARIOS[1.5], "recompact", "harness-defaults", fail_first=ALWAYS)
    strategy, asked = result.strategy, result.summarizer.asked
    print(f"failing summarizer: {result.describe()}")
    assert len(result.replies) == len(result.scenario.turns), "the run did not complete"
    assert asked, "the strategy never asked the (failing) summarizer"
    assert strategy.user_summary_failures == strategy.summarizer_calls == len(asked), (
        f"user_summary_failures {strategy.user_summary_failures}, summarizer_calls {strategy.summarizer_calls}, "
        f"requests received {len(asked)}"
    )
    assert not any(c.kind == "summarizer" for c in result.calls), "a failed request reached the provider"
    assert strategy.user_compactions == strategy.user_summaries_replayed == 0

    # History is never corrupted: nothing summarised, nothing excluded, every user turn stored once and included.
    assert not result.summaries()
    assert not [i for i, m in enumerate(result.stored) if _excluded(m)]
    assert not _corruption(result.stored)
    assert not [(i, s.corrupt) for i, s in enumerate(result.sent) if s.corrupt]
    assert all(len(at) == 1 for at in _user_turns(result).values())

    # A failure stands for its conversation state: the after-run pass (and a later model call of the same
    # turn) replays it instead of asking again; a new user turn is a new state and may ask again.
    per_state = [(a.turn, a.system, a.transcript) for a in asked]
    again = [(i, a.turn) for i, a in enumerate(asked) if per_state.index(per_state[i]) != i]
    assert not again, f"a failing request was sent again in the same turn (index, turn): {again}"
    for turn in sorted(result.turn_end):
        before, after = result.after_run(turn)
        assert not (before.calls and after.calls), (
            f"turn {turn}: the after-run pass asked again ({after.calls}) after the before pass's failure"
        )
        assert before.calls <= 1, f"turn {turn}: {before.calls} summarizer calls for one conversation state"
    failed = [r for r in caplog.records if r.name == "maf_compaction" and "summarizer failed" in r.getMessage()]
    assert len(failed) == len(asked), f"{len(asked)} failures, {len(failed)} WARNINGs"


async def test_a_summarizer_that_failed_once_is_asked_again_once_the_conversation_moves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Regression (fixed in d15f1b4): the band outgrows max_summary_input_tokens, so later passes build the
    # same request (the oldest items that fit); a remembered failure used to stand for every later state,
    # so one transient error stopped compaction for good (1 call, no summary, 19 requests over the window).
    caplog.set_level(logging.WARNING, logger="maf_compaction")
    result = await play(SCENARIOS[1.5], "recompact", "no-todo-no-mode", fail_first=1)
    strategy = result.strategy
    over = sum(c.over_window for c in result.calls)
    print(f"summarizer down for one call: {result.describe()}, DQ {over}")
    assert strategy.summarizer_calls >= 2, (
        f"after one failed call (turn {result.summarizer.asked[0].turn}) the summarizer was never asked again, "
        f"through turn {len(result.scenario.turns)}"
    )
    assert strategy.user_summary_failures == 1
    failed = [r for r in caplog.records if r.name == "maf_compaction" and "summarizer failed" in r.getMessage()]
    assert len(failed) == 1, f"{len(failed)} failure WARNINGs for one failed call"
    assert strategy.user_compactions >= 1, "no summary was written after the summarizer recovered"
    assert not _corruption(result.stored)
    included = _included_text(result.stored)
    assert all(line in included for line in _requirement_lines(result.scenario).values())
    assert over == 0, f"{over} requests over the window"
