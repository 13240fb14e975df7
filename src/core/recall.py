"""The recall protocol as a pure state machine: when to pin a request, and when to stop.

A compaction pass runs inside a model call, so it cannot ask the model for a record.
The ask travels as a *pin*: on its way out of one call the middleware reports what it
saw (:class:`HistorySeen`), and the machine decides whether the NEXT request is forced
to call ``recall_earlier_tool_results``. The middleware performs (it rewrites one
request's options, buffers a forced stream, retries); every decision is here, as
:func:`advance` over a closed set of events returning one action:

==================  ==========================================================  ==========
event               what changes                                                action
==================  ==========================================================  ==========
HistorySeen         the next request's pin: an outstanding re-force ask first,  TakeAsk /
                    else the pin rule (a re-force pin not yet spent stands);    Nothing
                    an ask over the cached prefix is over
RequestStarting     the decided pin is spent on this request, by the record     Pin /
                    route (:class:`.state.RecordRoute`): pinned, or asked over  Unpinned
                    the cached prefix by the pass inside it (also when the
                    request cannot be forced), or dropped when no route is
                    left
ForcedReturned      the forced call returned: its record is awaited             Nothing
ForcedResponse      the streak of pinned responses without a recall call;       Disable /
                    two in a row give pinning up                                Nothing
ForcedFailed        pinning is given up; the request is retried unpinned once   RetryUnpinned
ForcedAborted       cancellation or a middleware abort: the pin is not spent    Nothing
==================  ==========================================================  ==========

A record due on a request can instead be asked for over the cached prefix: the request is
sent as the caller asked, and the compaction pass inside it (which reads ``asking``)
sends the conversation's own request plus one instruction (:class:`.effects.Request`).
That is the route once the provider ignored two pins or a pinned request failed, and for
every record when the host chose it.

The state (:class:`.state.RecallState`) is part of the conversation's one state value,
beside the record rules' decisions (the re-force ask lives there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

from msgspec.structs import replace as evolve

from .checks import AtLeastOne, AtLeastZero, Fraction, validate
from .state import PinKind, RecallState, RecallStatus, RecordRoute, State

#: Consecutive pinned responses without a recall call after which pinning stops.
IGNORED_LIMIT: Final = 2
#: Consecutive failed requests over the cached prefix after which that route rests (a provider's outage, not its
#: verdict: the route comes back after :data:`REST_CALLS` model calls).
FAILURE_LIMIT: Final = 3
#: Model calls the cached-prefix route rests after :data:`FAILURE_LIMIT` failures in a row (doubled on each further
#: failure, up to :data:`MAX_REST_CALLS`).
REST_CALLS: Final = 8
MAX_REST_CALLS: Final = 128
#: Share of the budget above which a record is due (the record strategy's trigger too).
DEFAULT_TRIGGER_FRACTION: Final = 0.6
DEFAULT_MIN_GROUPS_BEFORE_REPEAT: Final = 4
#: The response cap of a pinned request.
DEFAULT_RECORD_MAX_TOKENS: Final = 4_000
#: The payoff share the README's composition gives its record half (``record_payoff_share``): the most a record
#: of a tool group may be expected to take, as a share of the group's tokens, for the record to be asked for
#: (:func:`.records.record_pays`). A record is written once at the output price (about 4x to 5x the input price)
#: and saves what it replaces on every later read at the cached price (about 0.1x): a record 0.2x the size of its
#: group repays its answer within about ten cached reads; a larger one (value-dense results: logs, metrics,
#: tables, JSON) takes longer than a conversation past the trigger usually runs (measured: docs/records.md).
PAYOFF_SHARE: Final = 0.2


@dataclass(frozen=True, slots=True)
class PinRule:
    """The size and tool-group bounds of the pin rule.

    Attributes:
        trigger_tokens: Pin when the prompt is over this many tokens (and no record
            exists, or enough new tool groups arrived since the newest one).
        max_groups_before_record: Pin once this many tool groups wait for a record, even
            below the trigger; ``None`` turns the bound off.
        repeat_records: Ask for later records at all.
        min_groups_before_repeat: New tool groups a later size-triggered record waits for.
        repeat_tokens: A later record is due at once, below the trigger too, once new tool
            groups send this many tokens (one large result is worth a record alone: re-read on
            every call until the trigger or more groups arrive, it costs more than the
            record); ``None`` turns it off.
        record_max_tokens: The response cap of a pinned request (``None``: the caller's).
        aligned: Ask for every record over the cached prefix (the conversation's request
            plus one instruction, asked by the compaction pass) instead of pinning. Records
            are asked for that way anyway once pinning is disabled.
        payoff_share: New tool material counts only where its record would pay
            (:func:`.records.record_pays`, :data:`PAYOFF_SHARE`): the status this rule reads is
            made with this share, and no record is due while none is pending; ``None``
            (default) counts every group.
    """

    trigger_tokens: AtLeastZero
    max_groups_before_record: AtLeastOne | None = None
    repeat_records: bool = True
    min_groups_before_repeat: AtLeastOne = DEFAULT_MIN_GROUPS_BEFORE_REPEAT
    repeat_tokens: AtLeastOne | None = None
    record_max_tokens: AtLeastOne | None = DEFAULT_RECORD_MAX_TOKENS
    aligned: bool = False
    payoff_share: Fraction | None = None

    def __post_init__(self) -> None:
        validate(self)


# -- events -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistorySeen:
    """The loaded history on the way out of an unforced call (or after a retry).

    Attributes:
        status: Size, records and new tool material of that history.
        reforce: An outstanding re-force ask can be taken for the next request.
    """

    status: RecallStatus
    reforce: bool = False


@dataclass(frozen=True, slots=True)
class RequestStarting:
    """A request is about to be sent.

    Attributes:
        forcible: The request may be forced to call a tool. Anthropic's extended thinking forbids a
            ``tool_choice`` that names a tool, so a record due on such a request is asked for over the cached
            prefix instead (pinning is not given up: the next forcible request is pinned again).
    """

    forcible: bool = True


@dataclass(frozen=True, slots=True)
class ForcedReturned:
    """The forced request returned (a stream may still be consumed later)."""


@dataclass(frozen=True, slots=True)
class ForcedResponse:
    """A complete forced response.

    Attributes:
        called_recall: It holds a ``recall_earlier_tool_results`` call.
    """

    called_recall: bool


@dataclass(frozen=True, slots=True)
class ForcedFailed:
    """A forced request raised an ordinary exception (while sent, streamed or finalized)."""


@dataclass(frozen=True, slots=True)
class ForcedAborted:
    """A forced request was cancelled or aborted by a middleware signal.

    Attributes:
        pin: The pin it carried; it was not spent.
    """

    pin: PinKind


Event: TypeAlias = HistorySeen | RequestStarting | ForcedReturned | ForcedResponse | ForcedFailed | ForcedAborted


# -- actions ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pin:
    """Force this request to call the recall tool (and arm the gate for it).

    Attributes:
        max_tokens: The response cap for this request only, or ``None``.
        kind: Why it is pinned.
    """

    max_tokens: int | None
    kind: PinKind


@dataclass(frozen=True, slots=True)
class Unpinned:
    """Send this request as the caller asked (and disarm the gate)."""


@dataclass(frozen=True, slots=True)
class TakeAsk:
    """The next request serves the outstanding re-force ask: mark the ask taken."""


@dataclass(frozen=True, slots=True)
class Disable:
    """Pinning stops for this conversation: the provider ignored two pins in a row.

    Attributes:
        streak: The pinned responses in a row without a recall call.
    """

    streak: int


@dataclass(frozen=True, slots=True)
class RetryUnpinned:
    """Pinning is disabled; retry this request once with the caller's own options."""


@dataclass(frozen=True, slots=True)
class Nothing:
    """No action."""


Action: TypeAlias = Pin | Unpinned | TakeAsk | Disable | RetryUnpinned | Nothing


def advance(rule: PinRule, state: RecallState, event: Event) -> tuple[RecallState, Action]:
    """The state after ``event`` and what the middleware must do (see the module table)."""
    if isinstance(event, (HistorySeen, RequestStarting)):
        state = _chosen(rule, state)
    if isinstance(event, HistorySeen):
        # The pass inside the request that asked over the cached prefix has run (or never will); a rest after
        # failures counts down one model call.
        state = evolve(state, asking=None, awaiting_record=False, seen=event.status, resting=max(0, state.resting - 1))
        if event.reforce:
            return evolve(state, next_pin="reforce"), TakeAsk()
        # A re-force pin stands until a request spends it: its ask is already taken, and a second
        # run's history seen meanwhile (two runs on one conversation) must not drop it.
        pin: PinKind | None = "size" if pin_due(rule, event.status) else None
        if state.next_pin == "reforce":
            pin = "reforce"
        return evolve(state, next_pin=pin), Nothing()
    if isinstance(event, RequestStarting):
        if state.next_pin is None:
            return state, Unpinned()
        unforced = not event.forcible and state.route is RecordRoute.PINNED and state.resting == 0
        if records_over_prefix(state) or unforced:  # asked by the pass inside it
            return evolve(state, next_pin=None, asking=state.next_pin), Unpinned()
        if no_route(state) or not event.forcible:
            return evolve(state, next_pin=None), Unpinned()
        return evolve(state, next_pin=None, in_flight=True), Pin(rule.record_max_tokens, state.next_pin)
    if isinstance(event, ForcedReturned):
        return evolve(state, in_flight=False, awaiting_record=True), Nothing()
    if isinstance(event, ForcedResponse):
        streak = 0 if event.called_recall else state.ignored_streak + 1
        if streak >= IGNORED_LIMIT and state.route is RecordRoute.PINNED:
            return evolve(state, ignored_streak=streak, route=RecordRoute.PINS_IGNORED), Disable(streak)
        return evolve(state, ignored_streak=streak), Nothing()
    if isinstance(event, ForcedFailed):  # pinning is given up: records are asked over the cached prefix instead
        route = RecordRoute.PINS_IGNORED if state.route is RecordRoute.PINNED else state.route
        return evolve(state, route=route, in_flight=False, awaiting_record=False), RetryUnpinned()
    return evolve(state, next_pin=event.pin, in_flight=False, awaiting_record=False), Nothing()


def _chosen(rule: PinRule, state: RecallState) -> RecallState:
    """``state`` on the route the host chose: records over the cached prefix (``rule.aligned``) or pinned,
    while neither was given up."""
    if state.route not in (RecordRoute.PINNED, RecordRoute.CACHED_PREFIX):
        return state
    return evolve(state, route=RecordRoute.CACHED_PREFIX if rule.aligned else RecordRoute.PINNED)


def pins_given_up(state: RecallState) -> bool:
    """Pinning was given up for this conversation (the provider ignored two pins, a pinned request failed),
    or no route is left at all."""
    return state.route in (RecordRoute.PINS_IGNORED, RecordRoute.NONE)


def no_route(state: RecallState) -> bool:
    """No record can be asked for now: pinning was given up (or the host asks over the cached prefix) and the
    model ignored two instructions over the cached prefix (for good), or that route rests after failing
    :data:`FAILURE_LIMIT` times in a row (for the rest's model calls).

    The record strategies then let the safety net take the record's place: past the record
    trigger, every tool group no record covers, after the head and before the newest group,
    is cut to its value lines at once.
    """
    return state.route is RecordRoute.NONE or (state.resting > 0 and state.route is not RecordRoute.PINNED)


def records_over_prefix(state: RecallState) -> bool:
    """Would the conversation's next record be asked over the cached prefix (an instruction appended to the
    request it repeats)? For a host that asks that way, or one that pins once pinning was given up, until that
    route is given up too (or while it rests)."""
    return state.route in (RecordRoute.CACHED_PREFIX, RecordRoute.PINS_IGNORED) and state.resting == 0


def failed(state: RecallState) -> RecallState:
    """``state`` after a request over the cached prefix failed (an error, a time-out, a cancellation).

    A failure says nothing of the model, only that the provider did not answer this time: the
    route is tried again on later calls, and only :data:`FAILURE_LIMIT` failures in a row set it
    to rest for :data:`REST_CALLS` model calls (each further failure doubles the rest).
    """
    count = state.failed_requests + 1
    if count < FAILURE_LIMIT:
        return evolve(state, failed_requests=count)
    return evolve(state, failed_requests=count, resting=min(REST_CALLS << (count - FAILURE_LIMIT), MAX_REST_CALLS))


def answered_over_prefix(state: RecallState) -> RecallState:
    """``state`` after a request over the cached prefix was answered (whatever the answer): the provider is
    back, so failures start counting afresh."""
    return evolve(state, failed_requests=0)


def route_news(before: RecallState, after: RecallState) -> str | None:
    """What changed in how records and summaries are asked for, worded for the WARNING the shell logs, or
    ``None``."""
    if after.resting > before.resting:
        return (
            f"{after.failed_requests} requests over the cached prefix failed in a row: that route rests for the next "
            f"{after.resting} model call(s) (the safety net keeps each tool result's value lines; summaries go to the "
            "summarizer), then it is tried again"
        )
    if before.resting > 0 and after.resting == 0 and after.route is not RecordRoute.NONE:
        return "requests over the cached prefix are tried again after their rest"
    if after.route is RecordRoute.NONE and before.route is not RecordRoute.NONE:
        return (
            f"{IGNORED_LIMIT} answers in a row ignored the record instruction over the cached prefix: no record is "
            "asked for in this conversation from now on (the safety net keeps each tool result's value lines)"
        )
    if after.ignored_summaries >= IGNORED_LIMIT > before.ignored_summaries:
        return (
            f"{IGNORED_LIMIT} answers in a row ignored the summary instruction over the cached prefix: summaries go to "
            "the summarizer from now on"
        )
    return None


def forget_pending(state: State) -> State:
    """``state`` without queued work: the pending pin, the in-flight and awaiting flags, the last history seen.

    The provider-support verdict (the record route, the ignored streak) stays: it describes
    the provider, not the queued work.
    """
    return evolve(state, recall=evolve(state.recall, next_pin=None, in_flight=False, awaiting_record=False, seen=None))


def adopted(theirs: State, mine: State) -> State:
    """``theirs`` (a record strategy's state) with the recall protocol's state of ``mine`` (a middleware's own until
    it shares the strategy's conversation); the gate's permission stays ``theirs``."""
    return evolve(theirs, recall=evolve(mine.recall, armed=theirs.recall.armed))


def judged_instruction(state: RecallState, *, followed: bool) -> RecallState:
    """``state`` after an answer to a record request over the cached prefix: two ignored in a row leave no route."""
    streak = 0 if followed else state.ignored_instructions + 1
    route = RecordRoute.NONE if streak >= IGNORED_LIMIT else state.route
    return evolve(answered_over_prefix(state), ignored_instructions=streak, route=route)


def judged_summary(state: RecallState, *, followed: bool) -> RecallState:
    """``state`` after an answer to a summary or fold request over the cached prefix: one that was no summary of its
    items sends that summary to the summarizer (:func:`summarized_aside`); :data:`IGNORED_LIMIT` in a row send every
    later summary there too."""
    if followed:
        return evolve(answered_over_prefix(state), ignored_summaries=0)
    streak = state.ignored_summaries + 1
    return evolve(answered_over_prefix(state), ignored_summaries=streak, summaries_to_summarizer=True)


def summarized_aside(state: RecallState) -> RecallState:
    """``state`` after the summarizer answered a summary: the next summary goes over the cached prefix again, unless
    :data:`IGNORED_LIMIT` answers in a row there ignored the instruction."""
    if state.summaries_to_summarizer and state.ignored_summaries < IGNORED_LIMIT:
        return evolve(state, summaries_to_summarizer=False)
    return state


def record_due(rule: PinRule, state: RecallState, *, reforce_pending: bool) -> bool:
    """Would a record be asked for on the next request (pinned, or over the cached prefix)? A preview:
    nothing is consumed.

    A pin already decided counts; an outstanding, untaken re-force ask counts; otherwise
    the pin rule on the last history seen.
    """
    if no_route(state):
        return False
    return state.next_pin is not None or (state.seen is not None and (reforce_pending or pin_due(rule, state.seen)))


def repeat_tokens(max_input_tokens: int, repeat_fraction: float | None) -> int | None:
    """:attr:`PinRule.repeat_tokens` for a budget and a ``repeat_fraction`` share of it (``None``: off)."""
    return None if repeat_fraction is None else max(1, int(max_input_tokens * repeat_fraction))


def pin_due(rule: PinRule, status: RecallStatus) -> bool:
    """The pin rule on one history (an outstanding re-force ask is checked first, elsewhere).

    The first size-triggered record is asked for at once; a later one waits for
    ``min_groups_before_repeat`` new tool groups, so the trigger re-arms on new tool
    material, not on size alone, unless new groups send ``repeat_tokens``: then it is due at
    once, below the trigger too. ``max_groups_before_record`` is a separate bound. With a payoff share
    (:class:`PinRule`), nothing is due while no group whose record would pay is pending.
    """
    if rule.payoff_share is not None and not status.pending_groups:
        return False
    if rule.max_groups_before_record is not None and status.pending_groups >= rule.max_groups_before_record:
        return True
    if status.records:
        if not rule.repeat_records:
            return False
        if rule.repeat_tokens is not None and status.pending_groups and status.pending_tokens >= rule.repeat_tokens:
            return True  # re-read on every call until a record covers it, it costs more than the record
        if status.pending_groups < rule.min_groups_before_repeat:
            return False
    return status.included_tokens > rule.trigger_tokens
