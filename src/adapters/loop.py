"""The one shell loop every strategy runs: convert once, step, perform, absorb, apply once, log.

A strategy adapter supplies its config, its core (a module with ``step`` and ``absorb``,
see :mod:`maf_compaction.core.protocol`), the effects it can perform and its public
counters. Everything else is here, the same for every strategy:

- The conversation's one state value lives in a :class:`~.conversation.Conversation` the
  strategy shares with its recall middleware and gate (a composition with its record half).
  Each step reads the value as it is then, and answers go into it as they come back (an
  insert, :func:`~maf_compaction.core.answers.absorb`), so what the middleware changed while a
  pass awaited an answer is never lost. Direct wiring serves one conversation per instance.
- The instance binds to the first conversation it sees and refuses another one loudly;
  concurrent passes on one instance are serialized, never interleaved.
- Every message a pass newly excludes is named once per distinct set: a WARNING for
  removals, INFO where a marker the model sees links to what it replaced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Final, Generic, TypeVar, cast

from agent_framework import Message
from msgspec import Meta

from ..core.answers import absorb
from ..core.breakpoints import StrategyConfig
from ..core.checks import require, require_tokenizer
from ..core.distill import newly_distilled
from ..core.effects import Request, Route
from ..core.envelope import Stored
from ..core.errors import SnapshotError
from ..core.model import History
from ..core.ownership import provider_increment
from ..core.protocol import CoreStrategy, Done, Needs, differs
from ..core.recall import route_news
from ..core.state import RequestKind, State
from . import telemetry
from .aligned import ask_over_prefix
from .apply import apply, render
from .breakpoints import publish
from .conversation import STORE_FALSE_HINT, Conversation, NamedSets
from .convert import HistoryCache
from .counting import MediaTokenEstimator, Tokenizer, as_estimator
from .telemetry import PassTrace

logger = logging.getLogger("maf_compaction")
#: Seconds a compaction request may take before it counts as failed (:attr:`CompactionAdapter.request_timeout_s`).
DEFAULT_REQUEST_TIMEOUT_S: Final = 120.0
#: A time limit: above zero, at most a day.
Seconds = Annotated[float, Meta(gt=0, le=86_400)]

#: The note kind of every strategy's notes (they are ours, not conversation history).
NOTE_KIND = "anchored"
#: (reason, message) pairs remembered as named, per conversation (each message is named once per reason).
_NAMED_MESSAGES = 1_024

S = TypeVar("S")
R = TypeVar("R")


ConfigT = TypeVar("ConfigT", bound=StrategyConfig)


def describe(before: History, messages: Sequence[Message], origin: int) -> str:
    """Name a message in a log line: its id, or a description that stays true when notes move it."""
    message = messages[origin]
    if message.message_id:
        return message.message_id
    ordinal = sum(1 for r in before[:origin] if r.in_conversation and not r.summary)
    calls = [c.call_id for c in message.contents if c.call_id]
    suffix = f", call {', '.join(calls)}" if calls else ""
    return f"<{message.role} message {ordinal + 1} of the conversation{suffix}>"


class CompactionAdapter(Generic[ConfigT, S, R]):
    """The framework's ``CompactionStrategy`` over one core strategy (the generic shell).

    Subclasses set ``core`` and call :meth:`_setup`; they may override :meth:`_perform`
    (effects), :meth:`_observe` (counters and strategy-specific logs) and :meth:`_after`
    (work the framework list needs after applying, such as a host's own fallback).
    """

    core: ClassVar[Any]
    #: The type of the conversation's state value (``decision_state()``), read strictly by ``restore_decisions``.
    state_type: ClassVar[type[Stored]]
    #: Linked from a marker the model sees: exclusions with these reasons log at INFO.
    linked_reasons: ClassVar[frozenset[str]] = frozenset()
    #: Records are asked for by a recall middleware sharing the conversation: a pass without one is refused.
    needs_recall: ClassVar[bool] = False

    def _setup(self, config: ConfigT, tokenizer: Tokenizer, state: S, *, holds: frozenset[str] = frozenset()) -> None:
        require_tokenizer("tokenizer", tokenizer)
        self._config = config
        self._tokenizer = tokenizer
        self._estimator: MediaTokenEstimator = as_estimator(tokenizer)
        self._counter = self._estimator.parts
        self._histories = HistoryCache(self._counter, holds=holds)
        self.conversation: Conversation[S] = Conversation(state)
        self._memo: object = None  # the last pass's memo: saves work, never decides
        self._restored = False  # the state came from outside: check it against the first history it meets
        #: Requests sent over the cached prefix (records asked that way), and those that failed or got no text.
        self.prefix_requests = 0
        self.failed_prefix_requests = 0
        #: Compaction requests that took longer than ``request_timeout_s`` (counted as failed).
        self.timed_out_requests = 0
        #: Answers the provider cut at their request's output cap (:func:`~maf_compaction.core.max_answer_tokens`):
        #: never kept, each named in a WARNING.
        self.answers_cut = 0
        self._request_timeout_s = DEFAULT_REQUEST_TIMEOUT_S

    @property
    def request_timeout_s(self) -> float:
        """Seconds one compaction request (a record, a summary, a media description) may take; past it the
        request counts as failed, as one the provider refused (default :data:`DEFAULT_REQUEST_TIMEOUT_S`)."""
        return self._request_timeout_s

    @request_timeout_s.setter
    def request_timeout_s(self, value: float) -> None:
        require("request_timeout_s", value, Seconds)
        self._request_timeout_s = float(value)

    @property
    def config(self) -> ConfigT:
        """The validated parameters."""
        return self._config

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer given at construction (the framework reads it for its own logs)."""
        return self._tokenizer

    @property
    def max_input_tokens(self) -> int:
        """The input budget."""
        return self._config.max_input_tokens

    # -- the pass -----------------------------------------------------------------------------

    async def __call__(self, messages: list[Message]) -> bool:
        """Compact ``messages`` in place; True if anything changed.

        A list the chat client's server owns (it starts with a tool result whose call it
        lacks: see :mod:`maf_compaction.core.ownership`) changes nothing; a WARNING says so
        once, naming the setting that fixes it, and later passes change nothing either.
        """
        if not messages:
            return False
        async with self.conversation.lock:
            before = self._open(messages)
            if before is None:
                return False
            with telemetry.compaction_pass(type(self).__name__) as traced:
                return await self._pass(messages, before, traced)

    async def _pass(self, messages: list[Message], before: History, traced: PassTrace | None) -> bool:
        """One pass over the converted list: step, perform, absorb, step again, apply once."""
        fresh: set[tuple[str, Route]] = set()
        riders: set[str] = set()
        done = self._step(before)
        rounds = 0
        while isinstance(done, Needs):
            rounds += 1
            # A request over the cached prefix and the same request to the summarizer are two attempts.
            asked = {(r.identity, r.route) for r in done.requests}
            # Every round must ask something new (identities are finite: media parts, then
            # one summary), so the loop ends; asking again for an answer it has is a bug.
            if asked <= fresh:
                kinds = ", ".join(sorted({r.kind.value for r in done.requests}))
                raise RuntimeError(
                    f"maf_compaction: {type(self).__name__} asked again for an answer it already has ({kinds}) "
                    f"after {rounds - 1} round(s); this is a bug, please report it"
                )
            answers = [(request, await self._answer(request, messages, before, traced)) for request in done.requests]
            fresh |= asked
            # A summary asked within a record's request is answered in this pass too (it is not part of
            # the guard: when the answer lacked it, the pass asks for it alone next).
            riders |= {r.also.identity for r in done.requests if r.also is not None}
            # Answers are facts whatever the pass decides or raises next (a budget failure, a tokenizer that
            # cannot count an answer): they go into the state now, as it is after the awaits.
            previous: Any = self.conversation.value
            current = absorb(previous, answers)
            self.conversation.value = cast("S", current)
            tell_route(type(self).__name__, previous, current)
            done = self._step(before)
        changed = self._finish(messages, before, done, {identity for identity, _ in fresh} | riders, traced)
        return await self._after(messages, done, changed)

    def _run_sync(self, messages: list[Message], **options: object) -> bool:
        """One pass of a strategy that needs no effects (no awaits, so nothing interleaves)."""
        before = self._open(messages) if messages else None
        if before is None:
            return False
        with telemetry.compaction_pass(type(self).__name__) as traced:
            done = self._step(before, options=options)
            if isinstance(done, Needs):
                raise RuntimeError(f"{type(self).__name__} needs effects; await it instead")
            return self._finish(messages, before, done, set(), traced)

    def _open(self, messages: Sequence[Message]) -> History | None:
        """The list converted once for the pass, bound to this conversation; ``None`` when the server owns it.

        A list the chat client's server keeps is said once per conversation: once handed a
        provider's increment, the strategy stays out of the way for good (the next increment
        may be a lone user message, which would otherwise look like another conversation).
        """
        conversation = self.conversation
        if conversation.provider_owned:
            return None
        if self.needs_recall:
            self._check_recall(conversation)
        history = self._histories.history(messages, note_kind=NOTE_KIND)
        orphans = provider_increment(history)
        if not orphans:
            conversation.bind(messages, type(self).__name__)
            return history
        conversation.provider_owned = True
        logger.warning(
            "%s was handed a provider's increment of the conversation, not the conversation: it starts with the "
            "result of tool call(s) %s without the call. The chat client keeps the conversation on the server and "
            "sends only new messages, so there is nothing to compact and this strategy changes nothing from now on; "
            "%s. (A host that cut its own history between a call and its result gets this too: keep a call and "
            "its result together.)",
            type(self).__name__,
            ", ".join(orphans),
            STORE_FALSE_HINT,
        )
        return None

    def share_named(self, named: NamedSets) -> None:
        """Remember what was named in ``named`` (kept by the caller across instances of one conversation).

        Every excluded set is named once per conversation; the session registry hands each
        stack it builds for a session the same memory, so a stack rebuilt after an eviction
        does not name again what an earlier one named.
        """
        self.conversation.named = named

    def decision_state(self) -> S:
        """Every decision the conversation's history cannot show: its whole state (an immutable value; see
        ``to_dict``)."""
        return self.conversation.value

    def restore_decisions(self, state: S | Mapping[str, object]) -> None:
        """Continue from a state (a value or its ``to_dict()``), read strictly; the first pass checks it against its
        history.

        Raises:
            SnapshotVersionError: Another build's version wrote it.
            SnapshotError: It is malformed or inconsistent, or was made under another ``keep_head_groups`` (its
                positions would name other groups).
        """
        # A value is read back through its dict, so it is checked exactly like a stored one.
        self.restore_state(
            self._read(state.to_dict() if isinstance(state, Stored) else cast("Mapping[str, object]", state))
        )

    def _read(self, data: Mapping[str, object]) -> S:
        """``data`` read strictly as this strategy's state (its positions checked against its head)."""
        head = getattr(self._config, "keep_head_groups", None)
        return cast("S", self.state_type.from_dict(data, keep_head_groups=head))

    def restore_state(self, state: S) -> None:
        """Continue from ``state`` (already read strictly); the first pass checks it against its history."""
        self.conversation.value = state
        self._memo = None
        self._restored = True

    def _check_recall(self, conversation: Conversation[Any]) -> None:
        """A record strategy's recall middleware: refuse a pass that no middleware shares; name, once, a shared one
        that sees no model request.

        The middleware runs before the pass of each model call it sees; only an agent-level pass (the harness's,
        before a run) comes first. A second pass with no request seen: it is not in the agent's middleware.
        """
        if not conversation.recall_shared:
            name = type(self).__name__
            raise RuntimeError(
                f"{name} has no recall middleware: no ToolResultRecallMiddleware shares its state, so no record could "
                "ever be asked for and its tool results would only be trimmed. Add "
                "ToolResultRecallMiddleware(max_input_tokens, tokenizer, reforce=records.take_reforce, ...) to the "
                "agent's middleware and make_recall_tool(...) to its tools, where records is this strategy (or a "
                "composition's record half, find_nested_strategy); a middleware whose reforce wraps take_reforce "
                "needs records.bind_recall(middleware). CompactionStack.build(...) wires all of it in one call."
            )
        conversation.recall_passes += 1
        if conversation.recall_passes == 2 and not conversation.requests_seen:
            logger.warning(
                "%s has compacted twice, but its ToolResultRecallMiddleware has seen no model request: if it "
                "is not in the agent's middleware (stack.recall, or SessionToolResultRecallMiddleware for a "
                "registry), no record is ever asked for and tool results are only trimmed.",
                type(self).__name__,
            )

    def _step(self, before: History, *, options: Mapping[str, object] | None = None) -> Needs | Done[S, R]:
        core: CoreStrategy[ConfigT, S, R] = self.core
        current = self.conversation.value
        if self._restored:
            problem = core.check(self._config, current, before)
            if problem is not None:
                raise SnapshotError(
                    f"{type(self).__name__}: the restored state does not fit this conversation: {problem}"
                )
            self._restored = False
        config = self._pass_config()
        return core.step(config, current, before, self._counter.measure, memo=self._memo, **(options or {}))

    def _pass_config(self) -> ConfigT:
        """The configuration this pass runs with: the strategy's own (a subclass adds what the host's last
        request says)."""
        return self._config

    def _finish(
        self, messages: list[Message], before: History, done: Done[S, R], fresh: set[str], traced: PassTrace | None
    ) -> bool:
        self.conversation.value = done.state
        self._memo = done.memo
        changed = differs(before, done.history)
        self._observe(done.report, fresh)
        if traced is not None:
            conversation = self.conversation
            conversation.last_prompt = traced.finish(
                before,
                done.history,
                done.report,
                budget=self._config.max_input_tokens,
                refusals=self._refusals(done.report),
                previous=conversation.last_prompt,
            )
        if changed:
            self._name_exclusions(before, done.history, messages)  # named as the list was handed in
            apply(messages, before, done.history, note_kind=NOTE_KIND)
        publish(messages, done.history, self._config)  # where cache_breakpoints marks the request that follows
        return changed

    async def _answer(
        self, request: Request, messages: list[Message], before: History, traced: PassTrace | None = None
    ) -> str | None:
        """Perform one effect request within ``request_timeout_s``, traced; ``None`` for a failure (a time-out too)."""
        if traced is None:
            return await self._bounded(request, messages, before)
        with traced.request(request, self._route(request), self._request_timeout_s) as asked:
            text = await self._bounded(request, messages, before)
            asked.answered(text)
            return text

    def _route(self, request: Request) -> str:
        """The route ``request`` is sent by here (a summary over the cached prefix goes to the summarizer until a
        request of the conversation has been seen sent)."""
        if self._over_prefix(request):
            return Route.CACHED_PREFIX.value
        return Route.SUMMARIZER.value if request.route is Route.CACHED_PREFIX else request.route.value

    async def _bounded(self, request: Request, messages: list[Message], before: History) -> str | None:
        """Perform one effect request within ``request_timeout_s``; ``None`` for a failure (a time-out too)."""
        try:
            async with asyncio.timeout(self._request_timeout_s):
                return await self._send(request, messages, before)
        except asyncio.CancelledError:
            if self._over_prefix(request):
                # The host cut the turn while the provider had not answered: a failure all the same (toward the
                # route's rest), so a request that hangs past every turn's deadline is not sent on every turn.
                self.conversation.value = cast("S", absorb(cast("Any", self.conversation.value), [(request, None)]))
            raise
        except TimeoutError as error:
            telemetry.note_failure(error, telemetry.TIMED_OUT)
            self.timed_out_requests += 1
            self.failed_prefix_requests += self._over_prefix(request)
            logger.warning(
                "%s: a %s request took longer than request_timeout_s=%g s and counts as failed; nothing changes",
                type(self).__name__,
                request.kind.value,
                self._request_timeout_s,
            )
            return None

    async def _send(self, request: Request, messages: list[Message], before: History) -> str | None:
        """Perform one effect request: over the cached prefix here, any other through :meth:`_perform`."""
        if not self._over_prefix(request):
            return await self._perform(request, messages)  # a summary goes to the summarizer until a request is seen
        assert request.view is not None
        self.prefix_requests += 1
        sent = render(messages, before, request.view, note_kind=NOTE_KIND)
        text = await ask_over_prefix(
            self.conversation.head, sent, request, type(self).__name__, self._counter.measure, on_cut=self._count_cut
        )
        self.failed_prefix_requests += text is None
        return text

    def _count_cut(self) -> None:
        """An answer the provider cut at its request's output cap (the WARNING names it)."""
        self.answers_cut += 1

    def _over_prefix(self, request: Request) -> bool:
        """``request`` is sent over the cached prefix here (a summary goes to the summarizer until a request of the
        conversation has been seen sent)."""
        routed = request.route is Route.CACHED_PREFIX
        return routed and (request.kind is RequestKind.RECORD or self.conversation.head is not None)

    # -- what subclasses supply -------------------------------------------------------------

    async def _perform(self, request: Request, messages: Sequence[Message]) -> str | None:
        """Perform one effect request; ``None`` records a failure."""
        raise NotImplementedError(f"{type(self).__name__} performs no {request.kind.value} request")

    def _observe(self, report: R, asked: set[str]) -> None:
        """Update counters and log what the report says (``asked``: the requests this pass asked; the loop names
        every exclusion)."""

    def _refusals(self, report: R) -> Mapping[str, str]:
        """Why the report refused answers of this pass, by request identity (for telemetry; none by default)."""
        del report
        return {}

    async def _after(self, messages: list[Message], done: Done[S, R], changed: bool) -> bool:
        """Work on the applied list after the pass; returns whether anything changed."""
        del messages, done
        return changed

    # -- naming what left the prompt ---------------------------------------------------------------

    def _name_exclusions(self, before: History, after: History, messages: Sequence[Message]) -> None:
        by_reason: dict[str, list[int]] = {}
        for record in after:
            if record.origin is not None and record.excluded and not before[record.origin].excluded:
                by_reason.setdefault(record.reason or "", []).append(record.origin)
        for reason, origins in by_reason.items():
            names = self._unnamed(reason, [describe(before, messages, origin) for origin in origins])
            if not names:
                continue
            logger.log(
                logging.INFO if reason in self.linked_reasons else logging.WARNING,
                "%s excluded %d message(s) (%s); they stay in stored history, excluded: %s",
                type(self).__name__,
                len(names),
                EXCLUSION_CAUSES.get(reason, reason or "no reason given"),
                ", ".join(names),
            )
        distilled = self._unnamed("distilled", [describe(before, messages, o) for o in newly_distilled(before, after)])
        if distilled:
            logger.warning(
                "%s cut %d tool result(s) that no record covers to their first line and the lines that carry "
                "distinctive values, verbatim (a record quoted too few of their values, no record can be asked for, "
                "or the prompt must fit the budget; a marker in each says how many lines were left out; the full "
                "text stays on the message, see original_results): %s",
                type(self).__name__,
                len(distilled),
                ", ".join(distilled),
            )

    def _unnamed(self, reason: str, names: Sequence[str]) -> list[str]:
        """The messages of ``names`` not yet named for this reason in this conversation: each is named once, though
        both lists exclude it and a copy rebuilt from stored history on every call excludes it again."""
        named = self.conversation.named
        fresh = [name for name in names if (reason, name) not in named]
        named.update(dict.fromkeys((reason, name) for name in fresh))
        while len(named) > _NAMED_MESSAGES:
            named.popitem(last=False)
        return fresh


#: What each exclusion reason means, for the log line that names the messages.
EXCLUSION_CAUSES: dict[str, str] = {
    "anchored_compaction": "shed to fit the budget, or to keep earlier sheds whole, with a note in their place",
    # A group quoted in part (at least coverage_share) keeps a remnant with the values the records do not quote.
    "tool_summary_anchored": "records quote every distinct value of each group (or name its tool, for a group "
    "without values), or the message completes a group they cover",
    "user_turn_summarized": "replaced by a user-turn summary that links to them",
    "user_summaries_folded": "folded into a newer summary that links to them",
    "record_replaced": "replaced by a written record that quotes every value and links to them",
}


def tell_route(owner: str, before: State, after: State) -> None:
    """Say at WARNING how asking for records and summaries changed between two states (the core words it)."""
    news = route_news(before.recall, after.recall)
    if news is not None:
        logger.warning("%s: %s", owner, news)
