"""OpenTelemetry spans and metrics of compaction passes and requests, by the framework's conventions.

The framework traces agent runs (``invoke_agent``) and model calls (``chat``) through
``agent_framework.observability``; a compaction pass runs inside them (within the chat
client's layers, or a context provider's turn), so its span is their child:

- ``compaction_pass <Strategy>``: one per pass, with what the pass did (the tokens before and
  after, the messages it shortened, shed, replaced by a record or summarised, where the
  prompt first differs and whether its prefix stayed byte-stable);
- ``compaction_request <kind>``: one per record, summary or media description the pass
  asks for, a child of its pass (a summarizer's own ``chat`` span nests under it), with its
  route, identity, usage, outcome and whether the pass kept its answer (or why not).

Metrics (the same instruments whatever the strategy): :data:`PASSES`, :data:`PASS_DURATION`,
:data:`TOKENS_SAVED`, :data:`MESSAGES_CHANGED`, :data:`REQUESTS`, :data:`REQUEST_DURATION` and
:data:`REQUEST_TOKENS`.

It follows the framework's switch: with its instrumentation off (``ENABLE_INSTRUMENTATION=false``,
``disable_instrumentation()``) nothing is traced or counted here either. Without an
OpenTelemetry SDK (only the API's no-op providers) a pass does no telemetry work at all: no
span is started, no attribute built, no figure computed. Nothing here is message text; an
exception's message is recorded only when the framework's sensitive-data setting is on, as
the framework does.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Final

from agent_framework import observability
from opentelemetry import metrics, trace
from opentelemetry.trace import Span, StatusCode

from ..core.changes import Changes, Prefix, changes, kept_prefix, prompt
from ..core.effects import Request
from ..core.model import History, MessageRecord

#: The instrumentation scope of every span and instrument here.
SCOPE: Final = "maf_compaction"
#: Attribute names (a ``maf_compaction.`` prefix; usage and errors under the framework's GenAI names).
STRATEGY: Final = "maf_compaction.strategy"
TOKENS_BEFORE: Final = "maf_compaction.pass.tokens_before"
TOKENS_AFTER: Final = "maf_compaction.pass.tokens_after"
BUDGET: Final = "maf_compaction.pass.budget"
CHANGED: Final = "maf_compaction.pass.changed"
MESSAGES: Final = "maf_compaction.pass.messages_changed"
SHORTENED: Final = "maf_compaction.pass.shortened"
SHED: Final = "maf_compaction.pass.shed"
RECORDED: Final = "maf_compaction.pass.recorded"
SUMMARISED: Final = "maf_compaction.pass.summarised"
FIRST_CHANGED: Final = "maf_compaction.pass.first_changed_index"
PREFIX_STABLE: Final = "maf_compaction.pass.prefix_stable"
PREFIX_MESSAGES: Final = "maf_compaction.pass.prefix_messages"
PREFIX_TOKENS: Final = "maf_compaction.pass.prefix_tokens"
PASS_REQUESTS: Final = "maf_compaction.pass.requests"
PROMPT_MESSAGES: Final = "maf_compaction.pass.prompt_messages"
KIND: Final = "maf_compaction.request.kind"
ROUTE: Final = "maf_compaction.request.route"
IDENTITY: Final = "maf_compaction.request.identity"
MESSAGE_ID: Final = "maf_compaction.request.message_id"
OUTCOME: Final = "maf_compaction.request.outcome"
KEPT: Final = "maf_compaction.request.kept"
REFUSED: Final = "maf_compaction.request.refused_reason"
TIMEOUT: Final = "maf_compaction.request.timeout_s"
ALSO_IDENTITY: Final = "maf_compaction.request.also_identity"
ALSO_KEPT: Final = "maf_compaction.request.also_kept"
CHANGE: Final = "maf_compaction.change"
MAX_TOKENS: Final = "gen_ai.request.max_tokens"
INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
TOKEN_TYPE: Final = "gen_ai.token.type"
_USAGE: Final = {"input": INPUT_TOKENS, "output": OUTPUT_TOKENS}
ERROR_TYPE: Final = "error.type"

#: A request's outcome: answered with text, answered with none, failed, past ``request_timeout_s``, cancelled, or
#: answered with a text the provider cut at the request's output cap.
ANSWERED: Final = "answered"
EMPTY: Final = "empty"
FAILED: Final = "failed"
TIMED_OUT: Final = "timed_out"
CANCELLED: Final = "cancelled"
CUT: Final = "cut_at_cap"
#: Cut at the agent's own output cap, below what a kept answer may hold: its complete lines are judged as an answer.
CUT_JUDGED: Final = "cut_at_own_cap"
#: Why an answered request was not kept, when the pass's report does not say: its message is not in the prompt.
NOT_PLACED: Final = "not_placed"


def _version() -> str:
    try:
        return metadata.version("maf-compaction")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a tree that is not installed
        return "unknown"


_TRACER = observability.get_tracer(SCOPE, _version())
_METER = observability.get_meter(SCOPE, _version())

PASSES = _METER.create_counter(
    "maf_compaction.passes", unit="{pass}", description="Compaction passes, by strategy and what they changed"
)
PASS_DURATION = _METER.create_histogram(
    "maf_compaction.pass.duration", unit="s", description="Duration of a compaction pass, its requests included"
)
TOKENS_SAVED = _METER.create_counter(
    "maf_compaction.tokens.saved", unit="{token}", description="Prompt tokens a compaction pass took out of the prompt"
)
MESSAGES_CHANGED = _METER.create_counter(
    "maf_compaction.messages.changed",
    unit="{message}",
    description="Messages a compaction pass shortened, shed, replaced by a record or summarised",
)
REQUESTS = _METER.create_counter(
    "maf_compaction.requests", unit="{request}", description="Compaction requests, by kind, route and outcome"
)
REQUEST_DURATION = _METER.create_histogram(
    "maf_compaction.request.duration", unit="s", description="Duration of a compaction request"
)
REQUEST_TOKENS = _METER.create_histogram(
    "maf_compaction.request.tokens", unit="{token}", description="Tokens a compaction request used, by token type"
)

#: The proxies and no-op providers the API hands out while no SDK is configured.
_NO_TRACING: Final = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_NO_METRICS: Final = frozenset({"_ProxyMeterProvider", "NoOpMeterProvider", "_DefaultMeterProvider"})

_CURRENT: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar("maf_compaction_request", default=None)


def enabled() -> bool:
    """The framework's instrumentation is on (``OBSERVABILITY_SETTINGS``; ``ENABLE_INSTRUMENTATION``)."""
    return observability.OBSERVABILITY_SETTINGS.ENABLED


def tracing() -> bool:
    """A tracer provider is configured (not the API's proxy or no-op one)."""
    return not isinstance(trace.get_tracer_provider(), _NO_TRACING)


def metering() -> bool:
    """A meter provider is configured (not the API's proxy or no-op one)."""
    return type(metrics.get_meter_provider()).__name__ not in _NO_METRICS


def _sensitive() -> bool:
    return observability.OBSERVABILITY_SETTINGS.SENSITIVE_DATA_ENABLED


def _capture_error(span: Span, error: BaseException) -> None:
    """Mark ``span`` failed as the framework does: the type always, the exception only with sensitive data on."""
    span.set_attribute(ERROR_TYPE, type(error).__name__)
    if _sensitive():
        span.record_exception(error)
        span.set_status(StatusCode.ERROR, repr(error))
    else:
        span.set_status(StatusCode.ERROR)


@dataclass(slots=True)
class RequestTrace:
    """One compaction request being traced: its span (``None`` when only metrics are on) and what came back."""

    request: Request
    route: str
    span: Span | None
    metered: bool
    started: float = field(default_factory=time.perf_counter)
    ended: float | None = None
    ended_ns: int | None = None
    outcome: str = ANSWERED
    text: str | None = None
    usage: dict[str, int] = field(default_factory=dict[str, int])  # by token type: "input", "output"

    def response(self, response: object) -> None:
        """Note the usage a chat response reports (input and output tokens, when it has them)."""
        details: Any = getattr(response, "usage_details", None)
        if not isinstance(details, Mapping):
            return
        for kind, key in (("input", "input_token_count"), ("output", "output_token_count")):
            value: object = details.get(key)  # pyright: ignore[reportUnknownMemberType]
            if isinstance(value, int):
                self.usage[kind] = value

    def failed(self, error: BaseException, outcome: str = FAILED) -> None:
        """The request failed (``outcome``: failed, timed out or cancelled)."""
        self.outcome = outcome
        if self.span is not None:
            _capture_error(self.span, error)

    def answered(self, text: str | None) -> None:
        """The request's answer (``None`` for a failure) has come back: its duration ends here."""
        self.ended, self.ended_ns = time.perf_counter(), time.time_ns()
        self.text = text
        if self.outcome == ANSWERED and text is None:
            self.outcome = FAILED
        elif self.outcome == ANSWERED and not text.strip():  # pyright: ignore[reportOptionalMemberAccess]
            self.outcome = EMPTY

    def settle(self, placed: frozenset[str], refusals: Mapping[str, str]) -> None:
        """End the span with the pass's verdict: the answer kept (its message in the prompt), or why not."""
        if self.ended is None:  # the pass ended (raised, or was cancelled) before the answer came back
            self.answered(None)
        kept, reason = _verdict(self.request, self.outcome, placed, refusals)
        if self.metered:
            attributes = {KIND: self.request.kind.value, ROUTE: self.route, OUTCOME: self.outcome, KEPT: kept}
            REQUESTS.add(1, attributes)
            REQUEST_DURATION.record((self.ended or self.started) - self.started, attributes)
            for kind, value in self.usage.items():
                REQUEST_TOKENS.record(value, {KIND: self.request.kind.value, ROUTE: self.route, TOKEN_TYPE: kind})
        span = self.span
        if span is None:
            return
        if span.is_recording():
            span.set_attributes({OUTCOME: self.outcome, KEPT: kept})
            span.set_attributes({_USAGE[kind]: value for kind, value in self.usage.items()})
            if reason is not None:
                span.set_attribute(REFUSED, reason)
            also = self.request.also
            if also is not None:
                span.set_attribute(ALSO_IDENTITY, also.identity)
                span.set_attribute(ALSO_KEPT, also.message_id is not None and also.message_id in placed)
        span.end(end_time=self.ended_ns)


def _verdict(
    request: Request, outcome: str, placed: frozenset[str], refusals: Mapping[str, str]
) -> tuple[bool, str | None]:
    if outcome not in (ANSWERED, EMPTY, CUT_JUDGED):
        return False, outcome
    if request.message_id is None:  # a media description: the answer is used as it is
        return outcome == ANSWERED, None if outcome == ANSWERED else EMPTY
    if request.message_id in placed:
        return True, None
    return False, refusals.get(request.identity, EMPTY if outcome == EMPTY else NOT_PLACED)


@dataclass(slots=True)
class PassTrace:
    """One compaction pass being traced: its span (``None`` when only metrics are on) and its requests."""

    strategy: str
    span: Span | None
    metered: bool
    started: float = field(default_factory=time.perf_counter)
    requests: list[RequestTrace] = field(default_factory=list[RequestTrace])
    finished: bool = False

    @contextlib.contextmanager
    def request(self, request: Request, route: str, timeout_s: float) -> Iterator[RequestTrace]:
        """Trace one request of this pass: a child span, current while the request is sent (so the summarizer's
        ``chat`` span nests under it); it ends when the pass settles what became of the answer."""
        span: Span | None = None
        if self.span is not None:
            span = _TRACER.start_span(f"compaction_request {request.kind.value}")
            if span.is_recording():
                attributes: dict[str, str | float] = {
                    STRATEGY: self.strategy,
                    KIND: request.kind.value,
                    ROUTE: route,
                    IDENTITY: request.identity,
                    TIMEOUT: timeout_s,
                }
                if request.message_id is not None:
                    attributes[MESSAGE_ID] = request.message_id
                span.set_attributes(attributes)
        traced = RequestTrace(request, route, span, self.metered)
        self.requests.append(traced)
        token = _CURRENT.set(traced)
        try:
            if span is None:
                yield traced
            else:
                with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                    yield traced
        except BaseException as error:
            traced.failed(error, CANCELLED if isinstance(error, asyncio.CancelledError) else FAILED)
            traced.answered(None)
            raise
        finally:
            _CURRENT.reset(token)

    def finish(
        self,
        before: History,
        after: History,
        report: object,
        *,
        budget: int,
        refusals: Mapping[str, str],
        previous: Sequence[MessageRecord] | None,
    ) -> tuple[MessageRecord, ...]:
        """Say what the pass did and settle its requests; the prompt it leaves (for the next pass's comparison).

        ``report`` gives the tokens before and after; the two histories give the figures
        (:func:`~maf_compaction.core.changes.changes`); ``previous`` is the prompt the last
        traced pass of the conversation left, which this one keeps as its prefix or breaks.
        """
        self.finished = True
        figures = changes(before, after)
        sent = prompt(after)
        prefix = kept_prefix(previous, sent) if previous is not None else None
        tokens_before = _tokens(report, "tokens_before")
        tokens_after = _tokens(report, "tokens_after")
        placed = frozenset(r.message_id for r in after if r.message_id is not None and not r.excluded)
        for asked in self.requests:
            asked.settle(placed, refusals)
        if self.metered:
            self._count(figures, prefix, tokens_before, tokens_after)
        span = self.span
        if span is None or not span.is_recording():
            return sent
        attributes: dict[str, str | int | bool] = {
            TOKENS_BEFORE: tokens_before,
            TOKENS_AFTER: tokens_after,
            BUDGET: budget,
            CHANGED: figures.changed > 0,
            MESSAGES: figures.changed,
            SHORTENED: figures.shortened,
            SHED: figures.shed,
            RECORDED: figures.recorded,
            SUMMARISED: figures.summarised,
            PASS_REQUESTS: len(self.requests),
            PROMPT_MESSAGES: len(sent),
        }
        if figures.first is not None:
            attributes[FIRST_CHANGED] = figures.first
        if prefix is not None:
            attributes |= {PREFIX_STABLE: prefix.stable, PREFIX_MESSAGES: prefix.messages, PREFIX_TOKENS: prefix.tokens}
        span.set_attributes(attributes)
        return sent

    def _count(self, figures: Changes, prefix: Prefix | None, tokens_before: int, tokens_after: int) -> None:
        strategy = {STRATEGY: self.strategy}
        counted: dict[str, str | bool] = {**strategy, CHANGED: figures.changed > 0}
        if prefix is not None:
            counted[PREFIX_STABLE] = prefix.stable
        PASSES.add(1, counted)
        PASS_DURATION.record(time.perf_counter() - self.started, strategy)
        if tokens_before > tokens_after:
            TOKENS_SAVED.add(tokens_before - tokens_after, strategy)
        for change, count in (
            ("shortened", figures.shortened),
            ("shed", figures.shed),
            ("recorded", figures.recorded),
            ("summarised", figures.summarised),
        ):
            if count:
                MESSAGES_CHANGED.add(count, {**strategy, CHANGE: change})

    def end(self, error: BaseException | None) -> None:
        """End the pass: a pass that raised is marked failed, its requests settled as they stand."""
        if not self.finished:
            for asked in self.requests:
                asked.settle(frozenset(), {})
            if self.metered:
                PASSES.add(1, {STRATEGY: self.strategy, ERROR_TYPE: type(error).__name__ if error else "unfinished"})
                PASS_DURATION.record(time.perf_counter() - self.started, {STRATEGY: self.strategy})
        if self.span is not None:
            if error is not None:
                _capture_error(self.span, error)
            self.span.end()


def _tokens(report: object, name: str) -> int:
    value = getattr(report, name, 0)
    return value if isinstance(value, int) else 0


@contextlib.contextmanager
def compaction_pass(strategy: str) -> Iterator[PassTrace | None]:
    """Trace one pass of ``strategy`` (a child of the span current when it runs); ``None`` when nothing is on.

    Nothing is on when the framework's instrumentation is off, or when neither a tracer nor a
    meter provider is configured (the API alone): then the pass does no telemetry work.
    """
    if not enabled():
        yield None
        return
    traced, metered = tracing(), metering()
    if not (traced or metered):
        yield None
        return
    span = _TRACER.start_span(f"compaction_pass {strategy}", attributes={STRATEGY: strategy}) if traced else None
    current = PassTrace(strategy, span, metered)
    error: BaseException | None = None
    try:
        if span is None:
            yield current
        else:
            with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                yield current
    except BaseException as raised:
        error = raised
        raise
    finally:
        current.end(error)


def note_response(response: object) -> None:
    """Note a chat response's usage on the request being traced (nothing when none is)."""
    traced = _CURRENT.get()
    if traced is not None:
        traced.response(response)


def note_cap(cap: int | None) -> None:
    """Note the output cap the request being traced is sent with (``gen_ai.request.max_tokens``)."""
    traced = _CURRENT.get()
    if traced is not None and cap is not None and traced.span is not None and traced.span.is_recording():
        traced.span.set_attribute(MAX_TOKENS, cap)


def note_cut(*, kept_as_written: bool = False) -> None:
    """Note that the provider cut the answer of the request being traced at its output cap (no error: an answer);
    ``kept_as_written``: cut at the agent's own cap, its complete lines are judged as an answer."""
    traced = _CURRENT.get()
    if traced is not None:
        traced.outcome = CUT_JUDGED if kept_as_written else CUT


def note_failure(error: BaseException, outcome: str = FAILED) -> None:
    """Note that the request being traced failed (``outcome``: failed or timed out)."""
    traced = _CURRENT.get()
    if traced is not None:
        traced.failed(error, outcome)
