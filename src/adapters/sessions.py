"""Serving many sessions with one agent: a compaction stack per session, its state in the session.

A strategy, its gate and its recall middleware keep one conversation's decisions (see
:mod:`.loop`). A service that runs one agent for many users needs one such *stack* per
session, and a replica that picks a session up needs the decisions the last one made.
This module gives both:

- :class:`CompactionStack` bundles a record strategy or a composition with its gate and
  recall middleware, and reads and writes their whole behavioural state as one
  JSON-safe value (:mod:`maf_compaction.core.stack`).
- :class:`SessionCompactionRegistry` builds a fresh stack per session (a bounded LRU
  cache of them) and keeps each session's state in ``AgentSession.state[state_key]``:
  read at the start of every *phase* (even on a cache hit: another replica may have
  moved it), written at its end (exceptional exits included). A phase is one hook run:
  a provider's ``before_run`` or ``after_run``, one model call through the middleware,
  one recall tool call. The stack in the cache is a convenience; the session is the truth.
- :class:`SessionCompactionProvider`, :class:`SessionToolResultRecallMiddleware` and
  :func:`make_session_recall_tool` are the one provider, middleware and tool an agent
  registers; each resolves the session from what the framework hands it (the hook's
  ``session`` argument, ``ChatContext.session``, ``FunctionInvocationContext.session``),
  never from a model-supplied argument, and refuses to run without one.

Runs of one session must not overlap in one process (the host serializes a session's
requests; across replicas, a lease does: see :mod:`maf_compaction.redis`). The provider's
``before_run`` claims the session for its run, so a second run of a session that starts
while another is in progress raises ``RuntimeError`` before anything of it is written; a
second, independent phase for a session that is in a phase raises too. The claims are per
session id in the process, shared by every registry (``_SessionGuard``): a registry built
per request, two registries configured alike and registries under other state keys refuse
each other's overlapping runs and phases as one registry refuses its own. Distinct sessions
run concurrently. A phase nested in another phase of the same session in the same task (a
context variable marks it) shares the outer phase's stack and leaves the reading and
writing to it; nested in another registry's phase, it reads and writes its own entry under
the outer phase's claim.

A phase ends when its run ends, however it ends: a streamed call's phase when its stream
is consumed, closed or garbage-collected, any phase when its task is done; a run ends at
its ``after_run``, when its task is done, or when the framework no longer holds its
``SessionContext`` (a run that raised never reaches ``after_run``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

from agent_framework import (
    AgentSession,
    ChatContext,
    ChatMiddleware,
    CompactionProvider,
    ContextProvider,
    FunctionInvocationContext,
    FunctionTool,
    HistoryProvider,
    ResponseStream,
    SessionContext,
)

from ..core.anchored import DEFAULT_KEEP_HEAD_GROUPS, DEFAULT_KEEP_TAIL_GROUPS
from ..core.checks import AtLeastZero, NonEmpty, require, require_sync_callable, require_tokenizer
from ..core.composition import OverflowPolicy, SummaryRequest
from ..core.fingerprint import differences
from ..core.recall import DEFAULT_MIN_GROUPS_BEFORE_REPEAT, DEFAULT_TRIGGER_FRACTION
from ..core.records import DEFAULT_FALLBACK_FRACTION, RECALL_TOOL_NAME
from ..core.stack import (
    StackConfiguration,
    StackConfigurationError,
    StackKind,
    StackKindError,
    StackState,
    session_entry_from_dict,
    session_entry_to_dict,
)
from ..core.user_summaries import SummaryMode
from .composition import ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy
from .conversation import NamedSets
from .counting import Tokenizer
from .fingerprint import stack_parameters
from .recall import (
    DEFAULT_TARGET_TOKENS,
    RecallGate,
    RecordRequest,
    ToolResultRecallMiddleware,
    make_recall_tool,
    recall_tool,
    record_reply,
)
from .records import ToolResultAnchoredSummarizationCompactionStrategy
from .user_summaries import DescribeMediaHook, UserTurnAnchoredSummarizationCompactionStrategy

logger = logging.getLogger("maf_compaction")

#: The key a registry stores its sessions' state under, unless given another.
DEFAULT_STATE_KEY: Final = "maf_compaction"
#: Sessions whose named exclusions a registry remembers at least (see ``CompactionAdapter.share_named``).
_NAMED_SESSIONS: Final = 1_024
#: Event-loop steps a new run waits for a dropped stream's generators to be closed (see ``begin_run``).
_SETTLE_STEPS: Final = 8
#: Runs the process-wide guard holds before it sweeps out those that ended without their ``after_run``.
_SWEEP_AT: Final = 1_024
#: The history provider's ``source_id`` when the agent shows none (the framework's default).
_DEFAULT_HISTORY_SOURCE: Final = "in_memory"

Strategy = (
    ToolResultAnchoredSummarizationCompactionStrategy | ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy
)


class CompactionStack:
    """One conversation's compaction: a strategy, its recall gate, its recall middleware and its recall tool.

    Every part reads and writes the conversation's one state value (the record strategy's
    :class:`~.conversation.Conversation`). :meth:`build` makes them together in one call;
    the constructor joins parts built one by one: the strategy is a
    :class:`ToolResultAnchoredSummarizationCompactionStrategy` or a
    :class:`ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy`; the middleware
    must share the record strategy's conversation (``reforce=records.take_reforce``, or
    ``records.bind_recall(recall)``) and arm ``gate`` (``arm=gate.arm``).

    Args:
        strategy: The record strategy or the composition.
        gate: The gate the recall tool spends.
        recall: The recall middleware wired to the strategy's record half and the gate.

    Raises:
        ValueError: A part has the wrong type, or the middleware is not wired to this
            strategy's record half or to this gate.
    """

    def __init__(self, strategy: Strategy, gate: RecallGate, recall: ToolResultRecallMiddleware) -> None:
        if isinstance(strategy, ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy):
            records, kind, halves = strategy.tool_results, "composition", strategy.strategies
        elif isinstance(strategy, ToolResultAnchoredSummarizationCompactionStrategy):
            records, kind, halves = strategy, "records", ()
        else:
            raise ValueError(
                "strategy must be a ToolResultAnchoredSummarizationCompactionStrategy or a "
                f"ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy, got {strategy!r}"
            )
        if not isinstance(gate, RecallGate):
            raise ValueError(f"gate must be a RecallGate, got {gate!r}")
        if not isinstance(recall, ToolResultRecallMiddleware):
            raise ValueError(f"recall must be a ToolResultRecallMiddleware, got {recall!r}")
        if not recall.shares(records.conversation):
            raise ValueError(
                "recall must share the record strategy's state: build it with reforce=records.take_reforce "
                "(or call records.bind_recall(recall)), where records is the strategy's record half"
            )
        if not recall.arms(gate):
            raise ValueError("recall must arm this gate: build it with arm=gate.arm and disarm=gate.disarm")
        gate.attach(records.conversation)  # its permission is part of the one state value from now on
        #: The record strategy or the composition.
        self.strategy: Strategy = strategy
        #: The record strategy (the composition's record half, or the strategy itself).
        self.tool_results = records
        #: The recall gate.
        self.gate = gate
        #: The recall middleware.
        self.recall = recall
        #: ``"records"`` or ``"composition"``: which state the stack's snapshot holds.
        self.kind: StackKind = kind
        self._halves: tuple[object, ...] = halves

    @classmethod
    def build(
        cls,
        *,
        max_input_tokens: int,
        tokenizer: Tokenizer,
        client: Any = None,
        keep_head_groups: int = DEFAULT_KEEP_HEAD_GROUPS,
        keep_tail_groups: int = DEFAULT_KEEP_TAIL_GROUPS,
        trigger_fraction: float = DEFAULT_TRIGGER_FRACTION,
        fallback_fraction: float = DEFAULT_FALLBACK_FRACTION,
        record_target_tokens: int | None = DEFAULT_TARGET_TOKENS,
        min_groups_before_repeat: int = DEFAULT_MIN_GROUPS_BEFORE_REPEAT,
        repeat_fraction: float | None = None,
        record_payoff_share: float | None = None,
        record_request: RecordRequest = "cached_prefix",
        summary_request: SummaryRequest = "cached_prefix",
        summary_mode: SummaryMode = "boundary",
        remembered_requests: int = 2,
        overflow_policy: OverflowPolicy = "shed",
        describe_media: DescribeMediaHook | None = None,
    ) -> CompactionStack:
        """One conversation's compaction in one call: the wiring the README recommends.

        With a summarizer ``client``, the composition of records and user-turn summaries;
        without one, the record strategy alone. Records (and summaries) are asked over the
        conversation's cached prefix unless ``record_request`` (``summary_request``) says
        ``"pinned"`` (``"summarizer"``). Give the agent ``stack.strategy`` as its before and
        after compaction strategy, ``stack.tool`` among its tools and ``stack.recall`` among its
        middleware; or build one per session in a :class:`SessionCompactionRegistry`.

        Args:
            max_input_tokens: The input budget.
            tokenizer: Any ``count_tokens(text) -> int`` tokenizer, for every part.
            client: The user half's summarizer (any framework chat client), or ``None``.
            keep_head_groups: Groups at the start never judged or changed.
            keep_tail_groups: The tail the fallback keeps.
            trigger_fraction: A record is asked for above this share of the budget.
            fallback_fraction: Without a record, the fallback runs from this share on.
            record_target_tokens: The record size the recall tool asks for (``None``: no size).
            min_groups_before_repeat: New tool groups a later record waits for (the middleware's).
            repeat_fraction: Share of the budget at which the tool groups since the newest record
                make the next record due at once (the middleware's; ``None``, the default, keeps
                the configuration sessions stored by earlier releases have; 0.3 measured cheaper
                with records over the cached prefix: docs/records.md, "When a later record is
                due").
            record_payoff_share: A record is asked for a tool group only when expected at most this
                share of the group (the record strategy's and the middleware's; ``None``, the default,
                asks for every group and keeps the configuration sessions stored by earlier releases
                have; 0.2 measured cheaper on value-dense results: docs/records.md, "Records that pay").
            record_request: ``"cached_prefix"`` or ``"pinned"``.
            summary_request: ``"cached_prefix"`` or ``"summarizer"`` (with a ``client``).
            summary_mode: The user half's mode (with a ``client``).
            remembered_requests: Summary answers the state keeps (with a ``client``; 2 at least
                in the boundary and fold modes).
            overflow_policy: ``"shed"`` or ``"raise"`` (with a ``client``).
            describe_media: The user half's media hook (with a ``client``).

        Raises:
            ValueError: A parameter is outside its range (the message names it).
        """
        records = ToolResultAnchoredSummarizationCompactionStrategy(
            max_input_tokens=max_input_tokens,
            tokenizer=tokenizer,
            keep_head_groups=keep_head_groups,
            keep_tail_groups=keep_tail_groups,
            trigger_fraction=trigger_fraction,
            fallback_fraction=fallback_fraction,
            record_target_tokens=record_target_tokens,
            record_payoff_share=record_payoff_share,
        )
        strategy: Strategy = records
        if client is not None:
            users = UserTurnAnchoredSummarizationCompactionStrategy(
                max_input_tokens=max_input_tokens,
                tokenizer=tokenizer,
                client=client,
                summary_mode=summary_mode,
                remembered_requests=remembered_requests,
                describe_media=describe_media,
            )
            strategy = ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
                tokenizer=tokenizer,
                tool_results=records,
                user_turns=users,
                overflow_policy=overflow_policy,
                summary_request=summary_request,
            )
        gate = RecallGate()
        recall = ToolResultRecallMiddleware(
            max_input_tokens=max_input_tokens,
            tokenizer=tokenizer,
            arm=gate.arm,
            disarm=gate.disarm,
            trigger_fraction=trigger_fraction,
            min_groups_before_repeat=min_groups_before_repeat,
            repeat_fraction=repeat_fraction,
            record_payoff_share=record_payoff_share,
            reforce=records.take_reforce,
            record_request=record_request,
        )
        return cls(strategy, gate, recall)

    @cached_property
    def tool(self) -> FunctionTool:
        """The recall tool, spending this stack's gate (sized for the record strategy's ``record_target_tokens``).

        For an agent serving one conversation; an agent serving many registers
        :func:`make_session_recall_tool` instead.
        """
        return make_recall_tool(self.gate, target_tokens=self.tool_results.record_target_tokens)

    def state(self) -> StackState:
        """The stack's whole behavioural state (an immutable value)."""
        return StackState(kind=self.kind, state=self.tool_results.conversation.value)  # the conversation's one value

    def restore(self, state: StackState) -> None:
        """Continue from ``state``; the next pass checks it against its history.

        Raises:
            ValueError: ``state`` belongs to another kind of stack.
        """
        if state.kind != self.kind:
            raise ValueError(f"state is a {state.kind!r} stack's, this stack is a {self.kind!r} stack")
        self.strategy.restore_state(state.state)  # pyright: ignore[reportArgumentType]  (the kinds match: checked above)

    def to_dict(self) -> dict[str, object]:
        """The whole behavioural state as one JSON-safe, versioned dict.

        It holds every decision (record decisions and outstanding asks, the chain's wait,
        kept replacements, sheds and refusals, remembered user-summary answers and media
        descriptions, the recall protocol's pending pin, awaiting flag and provider
        verdict) and the gate's one-shot permission. Counters are local diagnostics and
        are not in it. Remembered answers and descriptions quote the conversation: keep
        the dict under the same storage and retention policy as the history.
        """
        return self.state().to_dict()

    def from_dict(self, data: Mapping[str, object]) -> CompactionStack:
        """Continue from :meth:`to_dict`'s output (read strictly); returns the stack itself.

        Use it on a freshly built stack: ``stack = build_compaction().from_dict(data)``.

        Raises:
            StackKindError: ``data`` is another kind of stack's state.
            SnapshotVersionError: It was written by a newer schema.
            SnapshotError: It is malformed (the message names the field).
        """
        head = self.tool_results.config.keep_head_groups
        self.restore(StackState.from_dict(data, kind=self.kind, keep_head_groups=head))
        return self

    def restore_fields(self, fields: Mapping[str, object]) -> None:
        """Continue from a stack's fields without their header (a session entry's); read strictly."""
        head = self.tool_results.config.keep_head_groups
        self.restore(StackState.read_fields(fields, kind=self.kind, keep_head_groups=head))

    def configuration(self) -> StackConfiguration:
        """The fingerprint of this stack's configuration: its kind and every parameter that changes a decision.

        Read from the configured values (the strategy's config, a host fallback's, the
        recall middleware's pin rule, the tokenizer's identity), so two stacks built alike
        have equal fingerprints in any process.
        """
        return StackConfiguration.of(
            stack_parameters(self.kind, self.strategy, self.tool_results.host_fallback, self.recall)
        )

    def parts(self) -> tuple[object, ...]:
        """Every stateful instance of the stack (a builder must make fresh ones for each stack)."""
        return (self.strategy, *self._halves, self.gate, self.recall)


@dataclass(slots=True)
class _Entry:
    """A cached stack and the session entry it last wrote (``None``: none yet)."""

    stack: CompactionStack
    written: Mapping[str, object] | None = None


@dataclass(slots=True)
class _Phase:
    """One open phase: whose session, what runs, the entry it reads and writes."""

    registry: SessionCompactionRegistry
    session: AgentSession
    name: str
    entry: _Entry
    parent: _Phase | None
    nested: bool = False
    closed: bool = False
    task: asyncio.Task[Any] | None = None
    streaming: bool = False
    #: Why the phase's stream was dropped (set by its finalizer; the phase is ended at the next safe point).
    dropped: str | None = None
    token: Token[_Phase | None] | None = None

    def __enter__(self) -> _Phase:
        """Mark this phase as the current task's, so a phase nested in it (same session, same task) shares it."""
        self.token = _CURRENT.set(self)
        return self

    def __exit__(self, *_: object) -> None:
        """Unmark it (in the same task) and close it, unless its stream holds it open (see ``watch_stream``)."""
        assert self.token is not None
        _CURRENT.reset(self.token)
        if not self.streaming:
            self.registry.close(self)


@dataclass(slots=True)
class _Run:
    """One agent run of a session, from the provider's ``before_run``: the task that runs it (weakly: a run that
    raised before its ``after_run`` must not keep its task, and what the task's frames hold, alive)."""

    name: str
    task: weakref.ReferenceType[asyncio.Task[Any]] | None
    #: The run's own ``SessionContext`` (the framework makes one per run and holds it while the run is in
    #: progress): once it is gone, the run has ended, even if its task lives on (a worker serving other sessions).
    context: weakref.ReferenceType[Any] | None = None

    def alive(self) -> asyncio.Task[Any] | None:
        """The run's task while the run is in progress (``None``: it has ended, or ran outside a task)."""
        task = None if self.task is None else self.task()
        if task is None or _ended(task):
            return None
        return None if self.context is not None and self.context() is None else task


#: The phase the current task is in (innermost), so a nested phase of the same session is told
#: from an independent one.
_CURRENT: ContextVar[_Phase | None] = ContextVar("maf_compaction_session_phase", default=None)


def _current_task() -> asyncio.Task[Any] | None:
    """The running task, or ``None`` outside an event loop."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def _ended(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` is done, or can never run again (its event loop, perhaps another thread's, is closed)."""
    return task.done() or task.get_loop().is_closed()


class _SessionGuard:
    """Which sessions of this process are in a phase or a run: one record shared by every registry.

    The overlap rules hold per session id, whichever registry opened the phase or began the run: a registry built
    per request, two registries configured alike (a blue/green reload) and registries under other state keys all
    see each other's phases and runs, so a second request of a session is refused as one registry refuses it. A
    lock makes each check-and-claim atomic for hosts that run event loops in several threads; nothing is awaited
    while it is held. What it holds ends with the phase or run: a closed phase leaves it at once, a phase whose
    stream was dropped at the next phase any registry opens, and runs that ended without their ``after_run`` (a
    run that raised) are swept out whenever the runs double past :data:`_SWEEP_AT`.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._open: dict[str, _Phase] = {}
        self._runs: dict[str, _Run] = {}
        #: Phases whose stream was dropped, not yet ended (filled by finalizers, which take no lock).
        self._dropped: list[_Phase] = []
        self._sweep_at = _SWEEP_AT

    def sessions(self) -> int:
        """Entries held now: open phases and runs (a diagnostic for the bound)."""
        return len(self._open) + len(self._runs)

    def in_phase(self, session_id: str) -> bool:
        """Whether a phase of the session is open in this process."""
        return session_id in self._open

    # -- phases -------------------------------------------------------------------------------------

    def claim(self, phase: _Phase) -> None:
        """Make ``phase`` its session's open phase (the caller refused an overlap under the lock)."""
        self._open[phase.session.session_id] = phase

    def release(self, phase: _Phase) -> None:
        """The phase has ended: its session is free (if the phase still holds it)."""
        with self.lock:
            if self._open.get(phase.session.session_id) is phase:
                del self._open[phase.session.session_id]

    def refuse_overlap(self, session_id: str, name: str) -> None:
        """Raise if a phase of the session is open and alive; end an open phase whose run has ended.

        A phase whose task is done (a cancelled or finished task that never closed it) has
        ended. A streamed model call's phase ends when its stream is consumed, closed or
        garbage-collected: on a conflict, unreachable streams are collected first, so a
        stream the client abandoned releases its session at once.
        """
        busy = self._open.get(session_id)
        if busy is None:
            return
        if busy.task is not None and _ended(busy.task):
            self.abandon(busy, "its task ended without closing it")
            return
        if busy.streaming:
            gc.collect()  # an abandoned stream's finalizer marks its phase dropped
            if busy.dropped is not None:
                self.abandon(busy, busy.dropped)
            if busy.closed:
                return
        raise RuntimeError(
            f"{name} for session {session_id!r} overlaps its {busy.name}: requests of one session must run one "
            "at a time (a streamed response holds its session until it is consumed, closed or dropped)"
        )

    @staticmethod
    def abandon(phase: _Phase, why: str) -> None:
        """End a phase whose run ended without ending it (its state is written, as on any exit)."""
        if phase.closed:
            return
        logger.warning(
            "Session %r: ended its %s, which was left open (%s); its state is written as on any exit",
            phase.session.session_id,
            phase.name,
            why,
        )
        try:
            phase.registry.close(phase)
        except Exception:  # a finalizer must not raise; the phase is ended either way
            logger.exception("Session %r: writing the state of an abandoned phase failed", phase.session.session_id)

    def drop(self, phase: _Phase, why: str) -> None:
        """Mark a phase whose stream was garbage-collected. A finalizer: it may run inside any operation, on any
        thread, so it only marks; the next phase opened ends it, state written (:meth:`end_dropped`)."""
        if phase.closed:
            return  # its stream was consumed or closed, and then collected
        phase.dropped = why
        self._dropped.append(phase)

    def end_dropped(self) -> None:
        """End every open phase whose stream was dropped (its state written, as on any exit)."""
        while self._dropped:
            try:
                phase = self._dropped.pop()
            except IndexError:  # another thread ended the last one
                return
            self.abandon(phase, phase.dropped or "")

    # -- runs ---------------------------------------------------------------------------------------

    async def begin_run(self, session_id: str, name: str, context: object) -> None:
        """Claim the session for a run in the current task (see :meth:`SessionCompactionRegistry.begin_run`)."""
        task = _current_task()
        busy = self._runs.get(session_id)
        if busy is not None and busy.context is not None and busy.alive() not in (None, task):
            # A run that raised, or whose stream was dropped, in a task that lives on: its context is unreachable
            # garbage, or held by a dropped stream's generators until the loop has run their aclose().
            for _ in range(_SETTLE_STEPS):
                gc.collect()
                if busy.alive() is None:
                    break
                await asyncio.sleep(0)
        self._refuse_run(session_id, name, task)
        if _CURRENT.get() is None:
            busy_phase = self._open.get(session_id)
            if busy_phase is not None and busy_phase.streaming:
                # A dropped stream whose async generators the event loop closes: collect them and let the
                # loop run their aclose() (it closes the stream, whose cleanup ends the phase).
                gc.collect()
                for _ in range(_SETTLE_STEPS):
                    if busy_phase.closed or busy_phase.dropped is not None:
                        break
                    await asyncio.sleep(0)
        with self.lock:  # the checks again (another task may have claimed meanwhile), and the claim, in one step
            self._refuse_run(session_id, name, task)
            if _CURRENT.get() is None:
                self.refuse_overlap(session_id, name)
            self._runs[session_id] = _Run(
                name, None if task is None else weakref.ref(task), None if context is None else weakref.ref(context)
            )
            if len(self._runs) > self._sweep_at:  # runs that raised before their after_run
                for ended in [key for key, run in self._runs.items() if run.alive() is None and key != session_id]:
                    del self._runs[ended]
                self._sweep_at = max(_SWEEP_AT, 2 * len(self._runs))

    def _refuse_run(self, session_id: str, name: str, task: asyncio.Task[Any] | None) -> None:
        """Raise if a run of the session is alive in another task."""
        busy = self._runs.get(session_id)
        running = None if busy is None else busy.alive()
        if busy is not None and running is not None and running is not task:
            raise RuntimeError(
                f"{name}: this run of session {session_id!r} overlaps its {busy.name} run, still in progress: "
                "requests of one session must run one at a time (serialize them, for example with leased_session)"
            )

    def end_run(self, session_id: str) -> None:
        """Mark the end of the session's run started in this task."""
        with self.lock:
            busy = self._runs.get(session_id)
            if busy is not None and busy.alive() in (None, _current_task()):
                del self._runs[session_id]


#: The one guard of this process: every registry's phases and runs, by session id.
_GUARD: Final = _SessionGuard()


class SessionCompactionRegistry:
    """A compaction stack per session, its state kept in the session.

    ``builder`` is called for each session the registry serves (and again after a cached
    stack was evicted); it must return a :class:`CompactionStack` of fresh strategy, gate
    and middleware instances with the same configuration every time and on every replica.
    Clients, tools and tokenizers can be shared.

    Every phase (see the module docstring) reads ``session.state[state_key]`` first, even
    when the stack is cached, and writes it at its end, exceptional exits included. So the
    session carries every decision: cache eviction (and ``max_cached_sessions=0``, which
    caches nothing) drops only the cached stack, and a session saved with
    ``AgentSession.to_dict()`` and restored on another replica continues there with the
    same requests and no repeated summarizer call. Removing the entry resets the
    session's stack. A stored entry of another kind of stack, or of a newer version,
    raises instead of being dropped.

    The entry carries the fingerprint of the configuration that wrote it
    (:meth:`CompactionStack.configuration`). A registry serves every session whose
    fingerprint matches its own builder's, whichever registry instance wrote it: a registry
    built per request, a second one in the same process, another replica. An entry written
    under another configuration raises :class:`StackConfigurationError` naming the
    parameters that differ; :meth:`migrate` carries it over on purpose. Whichever registry
    serves a session, its phases and runs are guarded per session id in the process, not
    per registry: a run of a session through one registry refuses an overlapping run of it
    through any other, as one registry refuses a second run of its own.

    Args:
        builder: Makes one stack: ``() -> CompactionStack``.
        max_cached_sessions: Stacks kept in memory, least recently used first out; 0 or more.
        state_key: The key in ``AgentSession.state``. Registries configured alike may share
            it; two differently configured registries that serve the same sessions side by
            side need one key each.

    Raises:
        ValueError: A parameter is outside its range (the message names it).
    """

    def __init__(
        self,
        builder: Callable[[], CompactionStack],
        *,
        max_cached_sessions: int = 128,
        state_key: str = DEFAULT_STATE_KEY,
    ) -> None:
        require_sync_callable("builder", builder, kind="a callable returning a CompactionStack")
        require("max_cached_sessions", max_cached_sessions, AtLeastZero)
        require("state_key", state_key, NonEmpty)
        self._builder = builder
        self._max = max_cached_sessions
        self._key = state_key
        self._configuration: StackConfiguration | None = None
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._parts: weakref.WeakSet[object] = weakref.WeakSet()
        # What each session's stacks named in log lines, so a rebuilt stack does not name it again
        # (diagnostics only, bounded: at least _NAMED_SESSIONS sessions, more with a larger cache).
        self._named: OrderedDict[str, NamedSets] = OrderedDict()
        self.stacks_built = 0
        self.states_restored = 0

    @property
    def state_key(self) -> str:
        """The key in ``AgentSession.state``."""
        return self._key

    @property
    def max_cached_sessions(self) -> int:
        """Stacks kept in memory."""
        return self._max

    @property
    def cached_sessions(self) -> int:
        """Stacks in memory now."""
        return len(self._cache)

    def forget(self, session_id: str) -> None:
        """Drop a session's cached stack (its state stays in the session)."""
        self._cache.pop(session_id, None)

    @property
    def configuration(self) -> StackConfiguration:
        """The fingerprint of the stacks the builder makes (it calls the builder once if no stack was built yet)."""
        if self._configuration is None:
            self._build(None)
        assert self._configuration is not None
        return self._configuration

    def migrate(self, session: AgentSession) -> bool:
        """Carry a session's stored compaction state over to this registry's configuration, on purpose.

        For a deliberate configuration change (a larger budget, another tail): the stored
        decisions are read strictly into a stack this builder makes and written back under
        this registry's fingerprint; the next pass checks them against the history. Returns
        whether there was an entry to migrate.

        Raises:
            ValueError: ``session`` is missing.
            RuntimeError: A phase of the session is open in this process.
            StackKindError: The entry holds another kind of stack (records vs composition):
                delete the entry instead, which starts the session's compaction afresh.
            SnapshotVersionError, SnapshotError: The entry cannot be read.
        """
        if not isinstance(session, AgentSession):
            raise ValueError(f"migrate needs an AgentSession, got {session!r}")
        if _GUARD.in_phase(session.session_id):
            raise RuntimeError(f"session {session.session_id!r} is in a phase: migrate it between requests")
        stored = session.state.get(self._key)
        if stored is None:
            return False
        _, data = session_entry_from_dict(stored)
        entry = _Entry(self._build(session.session_id))
        entry.stack.restore_fields(data)
        self._save(session, entry)
        logger.info("Migrated the compaction state of session %r to the registry's configuration", session.session_id)
        return True

    @contextmanager
    def phase(self, session: AgentSession | None, name: str = "phase") -> Iterator[CompactionStack]:
        """Run one phase for ``session``: its stack, read from the session and written back on exit.

        Use it to inspect a session's stack (its counters, ``to_dict()``) the way the
        provider, middleware and tool do.

        Raises:
            ValueError: ``session`` is missing.
            RuntimeError: Another phase of the same session is open in this process.
            StackKindError, SnapshotVersionError, SnapshotError: The stored state cannot
                be read (nothing is written then).
        """
        with self.open(session, name) as opened:
            yield opened.entry.stack

    def open(self, session: AgentSession | None, name: str) -> _Phase:
        """Open a phase (see :meth:`phase`); use it as a context manager, or :meth:`close` it exactly once."""
        if not isinstance(session, AgentSession):
            raise ValueError(
                f"{name} needs the run's AgentSession (got {session!r}): pass session=... to agent.run; a session "
                "is never taken from a tool argument"
            )
        session_id = session.session_id
        outer = _CURRENT.get()
        task = _current_task()
        inside = False  # this task runs a phase of the session through another registry (which holds the session)
        scope = outer
        while scope is not None:
            if scope.session.session_id == session_id and not scope.closed:
                if scope.task is not task:
                    # A child task inherits the context variable, but running beside its parent is an overlap,
                    # not a nesting.
                    break
                if scope.registry is self:
                    return _Phase(self, session, name, scope.entry, outer, nested=True, task=task)
                inside = True  # another registry's phase: its own entry, under the outer phase's hold
            scope = scope.parent
        with _GUARD.lock:
            _GUARD.end_dropped()
            if not inside:
                _GUARD.refuse_overlap(session_id, name)
            opened = _Phase(self, session, name, self._load(session), outer, task=task)
            if not inside:
                _GUARD.claim(opened)
        return opened

    def watch_stream(self, phase: _Phase, stream: object) -> None:
        """Keep ``phase`` open while ``stream`` is alive: it ends when the stream is consumed or closed (the
        caller's cleanup hook) or garbage-collected (abandoned by its consumer)."""
        phase.streaming = True
        # Garbage collection may run the finalizer inside any operation of any registry (or on another thread), so
        # it only marks the phase; it is ended, state written, at the next safe point: the next phase any registry
        # opens, of any session.
        finalizer = weakref.finalize(stream, _GUARD.drop, phase, "its stream was dropped before it was consumed")
        finalizer.atexit = False  # at interpreter exit there is no session left to write

    async def begin_run(self, session: AgentSession | None, name: str, context: object = None) -> None:
        """Mark the start of an agent run of ``session``; refuse it while another run of the session is alive.

        Called from the provider's ``before_run``, before anything of the run is written. A
        run is alive until its ``after_run`` (:meth:`end_run`), until its task is done, or
        until its ``context`` (the run's ``SessionContext``, which the framework holds while
        the run is in progress) is gone: a run that raised before its ``after_run`` in a task
        that lives on (a worker serving other sessions) ends when its context is collected.
        A new run in the task that ran the previous one means the previous one ended (it
        raised before its ``after_run``). An open phase of the session is checked as in
        :meth:`open` (a stream still being read refuses the run).

        Raises:
            ValueError: ``session`` is missing.
            RuntimeError: Another run of the session is alive in this process.
        """
        if not isinstance(session, AgentSession):
            raise ValueError(f"{name} needs the run's AgentSession (got {session!r}): pass session=... to agent.run")
        await _GUARD.begin_run(session.session_id, name, context)

    def end_run(self, session: AgentSession | None) -> None:
        """Mark the end of the session's run started in this task (from the provider's ``after_run``)."""
        if isinstance(session, AgentSession):
            _GUARD.end_run(session.session_id)

    def close(self, phase: _Phase) -> None:
        """Write the phase's state into its session and end it (idempotent; a nested phase writes nothing)."""
        if phase.closed:
            return
        phase.closed = True
        if phase.nested:
            return  # the outer phase writes
        try:
            self._save(phase.session, phase.entry)
        finally:
            _GUARD.release(phase)

    # -- reading and writing -----------------------------------------------------------------

    def _load(self, session: AgentSession) -> _Entry:
        session_id = session.session_id
        entry = self._cache.get(session_id)
        if entry is not None:
            self._cache.move_to_end(session_id)
        stored = session.state.get(self._key)
        if stored is None:
            if entry is None or entry.written is not None:  # new, or its entry was removed: a fresh stack
                entry = _Entry(self._build(session_id))
            return entry
        if entry is not None and (stored is entry.written or stored == entry.written):
            return entry  # the session holds what this stack wrote last
        configuration, data = session_entry_from_dict(stored)
        if entry is None:
            entry = _Entry(self._build(session_id))
        self._check(configuration)
        entry.stack.restore_fields(data)
        entry.written = stored
        self.states_restored += 1
        return entry

    def _check(self, stored: StackConfiguration) -> None:
        """Refuse an entry written under another configuration (the kind first: its own error)."""
        own = self._configuration
        assert own is not None  # a stack was built before an entry is checked
        if stored.digest == own.digest:
            return
        kind, built = stored.parameters.get("kind"), own.parameters.get("kind")
        if kind != built:
            raise StackKindError(str(kind), str(built))
        if differences(stored.parameters, own.parameters):
            raise StackConfigurationError(stored.parameters, own.parameters, state_key=self._key)

    def _save(self, session: AgentSession, entry: _Entry) -> None:
        assert self._configuration is not None  # the entry's stack was built by this registry
        payload = session_entry_to_dict(self._configuration, entry.stack.state())
        session.state[self._key] = payload
        entry.written = payload
        if self._max == 0:
            return
        self._cache[session.session_id] = entry
        self._cache.move_to_end(session.session_id)
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)

    def _build(self, session_id: str | None) -> CompactionStack:
        stack = self._builder()
        if not isinstance(stack, CompactionStack):
            raise TypeError(f"the registry's builder must return a CompactionStack, got {stack!r}")
        first = self._configuration
        if first is not None and stack.kind != first.parameters["kind"]:
            raise ValueError(
                f"the registry's builder made a {stack.kind!r} stack after a {first.parameters['kind']!r} one: it "
                "must make the same kind of stack, with the same configuration, every time"
            )
        configuration = stack.configuration()
        if first is None:
            self._configuration = configuration
        elif configuration.digest != first.digest:
            differing = ", ".join(name for name, _, _ in differences(first.parameters, configuration.parameters))
            raise ValueError(
                f"the registry's builder made a stack configured differently from its first one ({differing}): it "
                "must make the same configuration every time"
            )
        shared = [type(p).__name__ for p in stack.parts() if p in self._parts]
        if shared:
            raise ValueError(
                f"the registry's builder returned a stack that shares {', '.join(shared)} with an earlier stack: it "
                "must create fresh strategy, gate and middleware instances on every call"
            )
        self._parts.update(stack.parts())
        self.stacks_built += 1
        if session_id is not None:
            named = self._named.pop(session_id, None)
            self._named[session_id] = named = OrderedDict() if named is None else named
            while len(self._named) > max(self._max, _NAMED_SESSIONS):
                self._named.popitem(last=False)
            stack.strategy.share_named(named)
        return stack


class SessionCompactionProvider(ContextProvider):
    """The context provider that compacts each session with its own stack.

    ``before_run`` compacts the context messages earlier providers loaded (on copies, as
    the framework's ``CompactionProvider`` does); ``after_run`` compacts the stored
    history in place. Under ``create_harness_agent``, history loads per model call, so
    use ``before=False`` and let :class:`SessionToolResultRecallMiddleware` with
    ``compact_before=True`` compact each call; place this provider right after the
    history provider.

    Args:
        registry: The session registry.
        tokenizer: The tokenizer the framework annotates with (the stacks' own).
        before: Compact in ``before_run``.
        after: Compact the stored history in ``after_run``.
        source_id: This provider's ``source_id``.

    Raises:
        ValueError: A parameter has the wrong type.
    """

    after_run_once_per_turn = CompactionProvider.after_run_once_per_turn

    def __init__(
        self,
        registry: SessionCompactionRegistry,
        *,
        tokenizer: Tokenizer,
        before: bool = True,
        after: bool = True,
        source_id: str = "maf_compaction_sessions",
    ) -> None:
        if not isinstance(registry, SessionCompactionRegistry):
            raise ValueError(f"registry must be a SessionCompactionRegistry, got {registry!r}")
        require_tokenizer("tokenizer", tokenizer)
        require("before", before, bool)
        require("after", after, bool)
        super().__init__(source_id)
        self._registry = registry
        self._tokenizer = tokenizer
        self.before = before
        self.after = after

    async def before_run(
        self, *, agent: Any, session: AgentSession | None, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Start the session's run (refused while another run of it is alive), then compact the loaded context
        messages with the session's stack (when ``before``).

        Raises:
            ValueError: The run has no session.
            RuntimeError: Another run of the session is in progress in this process.
        """
        await self._registry.begin_run(session, f"{type(self).__name__}.before_run", context)
        if self.before:
            await self._run(agent, session, context, state, "before_run")

    async def after_run(
        self, *, agent: Any, session: AgentSession | None, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Compact the session's stored history with its stack (when ``after``), then end the session's run."""
        try:
            if self.after:
                await self._run(agent, session, context, state, "after_run")
        finally:
            self._registry.end_run(session)

    async def _run(
        self, agent: Any, session: AgentSession | None, context: SessionContext, state: dict[str, Any], hook: str
    ) -> None:
        with self._registry.phase(session, f"SessionCompactionProvider.{hook}") as stack:
            before = hook == "before_run"
            inner = CompactionProvider(
                before_strategy=stack.strategy if before else None,
                after_strategy=None if before else stack.strategy,
                tokenizer=self._tokenizer,  # pyright: ignore[reportArgumentType]
                source_id=self.source_id,
                history_source_id=_history_source(agent),
            )
            await getattr(inner, hook)(agent=agent, session=session, context=context, state=state)


def _history_source(agent: Any) -> str:
    """The ``source_id`` of the agent's history provider that loads messages (the framework's default if none)."""
    histories = (p for p in getattr(agent, "context_providers", None) or () if isinstance(p, HistoryProvider))
    return next((p.source_id for p in histories if p.load_messages), _DEFAULT_HISTORY_SOURCE)


class SessionToolResultRecallMiddleware(ChatMiddleware):
    """The chat middleware that runs each session's recall middleware (and, optionally, its strategy).

    Each model call is one phase of its session (``ChatContext.session``): the session's
    stack is read, its :class:`ToolResultRecallMiddleware` pins the call when a record is
    due, and the state is written back when the call's response is complete (a streamed
    response when it has been consumed). With ``compact_before=True`` the session's
    strategy is handed to the chat client for this call
    (``context.kwargs["compaction_strategy"]``), so it compacts the whole loaded history
    right before the request is sent: the wiring for ``create_harness_agent``, which
    loads history per model call.

    Args:
        registry: The session registry.
        compact_before: Hand the session's strategy to the chat client for each call.

    Raises:
        ValueError: A parameter has the wrong type.
    """

    def __init__(self, registry: SessionCompactionRegistry, *, compact_before: bool = False) -> None:
        if not isinstance(registry, SessionCompactionRegistry):
            raise ValueError(f"registry must be a SessionCompactionRegistry, got {registry!r}")
        require("compact_before", compact_before, bool)
        self._registry = registry
        self.compact_before = compact_before

    async def process(self, context: ChatContext, call_next: Callable[[], Awaitable[None]]) -> None:
        """Run the session's recall middleware around this model call.

        Raises:
            ValueError: The call has no session.
            RuntimeError: Another phase of the session is open in this process.
        """
        registry = self._registry
        with registry.open(context.session, "SessionToolResultRecallMiddleware") as opened:
            stack = opened.entry.stack
            if self.compact_before:
                context.kwargs["compaction_strategy"] = stack.strategy
            await stack.recall.process(context, call_next)
            result = context.result
            if isinstance(result, ResponseStream):
                # The recall middleware judges a forced stream as it is consumed: the phase
                # (and the session) stays open until then, and the state is written at its end.
                context.result = result.with_cleanup_hook(lambda: registry.close(opened))  # pyright: ignore[reportUnknownMemberType]
                registry.watch_stream(opened, result)


def make_session_recall_tool(
    registry: SessionCompactionRegistry, *, target_tokens: int | None = DEFAULT_TARGET_TOKENS
) -> FunctionTool:
    """The ``recall_earlier_tool_results`` tool for a registry's sessions.

    Like :func:`make_recall_tool`, but each call spends the gate of the calling session's
    stack, found from the framework-injected ``FunctionInvocationContext.session``; the
    session is never a tool argument the model supplies.

    Args:
        registry: The session registry.
        target_tokens: The record size the description asks for (match the record
            strategy's ``record_target_tokens``); ``None`` states no size.

    Raises:
        ValueError: A parameter is outside its range.
    """
    if not isinstance(registry, SessionCompactionRegistry):
        raise ValueError(f"registry must be a SessionCompactionRegistry, got {registry!r}")

    async def recall_earlier_tool_results(values: str, ctx: FunctionInvocationContext) -> str:
        del values  # the record is the call's argument: the strategy reads it there
        # A coroutine, so the phase opens and closes on the event loop, never in a worker thread.
        with registry.phase(ctx.session, RECALL_TOOL_NAME) as stack:
            return record_reply(stack.gate)

    return recall_tool(recall_earlier_tool_results, target_tokens)
