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
RequestStarting     the decided pin is spent on this request: pinned, or asked  Pin /
                    over the cached prefix (``PinRule.aligned``, or pinning     Unpinned
                    disabled) by the pass inside it, unless the model ignored
                    two such instructions (then pinned, if the host pins and
                    pinning is left)
ForcedReturned      the forced call returned: its record is awaited             Nothing
ForcedResponse      the streak of pinned responses without a recall call;       Disable /
                    two in a row disable pinning                                Nothing
ForcedFailed        pinning is disabled; the request is retried unpinned once   RetryUnpinned
ForcedAborted       cancellation or a middleware abort: the pin is not spent    Nothing
==================  ==========================================================  ==========

A record due on a request can instead be asked for over the cached prefix: the request is
sent as the caller asked, and the compaction pass inside it (which reads ``asking``)
sends the conversation's own request plus one instruction (:class:`.effects.Aligned`).
That is the route once the provider ignored two pins or a pinned request failed, and for
every record when the host chose it.

The state is one small value per conversation, shared with the record strategy (the
re-force ask lives in its decisions), and persisted with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final, Literal, TypeAlias

from .checks import AtLeastOne, AtLeastZero, validate
from .envelope import Count, Schema, exactly
from .grouping import Grouping

#: Consecutive pinned responses without a recall call after which pinning stops.
IGNORED_LIMIT: Final = 2
#: Share of the budget above which a record is due (the record strategy's trigger too).
DEFAULT_TRIGGER_FRACTION: Final = 0.6
DEFAULT_MIN_GROUPS_BEFORE_REPEAT: Final = 4
#: The response cap of a pinned request.
DEFAULT_RECORD_MAX_TOKENS: Final = 4_000

PinKind: TypeAlias = Literal["size", "reforce"]


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
        record_max_tokens: The response cap of a pinned request (``None``: the caller's).
        aligned: Ask for every record over the cached prefix (the conversation's request
            plus one instruction, asked by the compaction pass) instead of pinning. Records
            are asked for that way anyway once pinning is disabled.
    """

    trigger_tokens: AtLeastZero
    max_groups_before_record: AtLeastOne | None = None
    repeat_records: bool = True
    min_groups_before_repeat: AtLeastOne = DEFAULT_MIN_GROUPS_BEFORE_REPEAT
    record_max_tokens: AtLeastOne | None = DEFAULT_RECORD_MAX_TOKENS
    aligned: bool = False

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True, slots=True)
class RecallStatus:
    """What the recall middleware needs to know about a prompt.

    Attributes:
        included_tokens: Tokens of the messages that are sent (not excluded).
        records: Active records.
        pending_groups: Tool groups (other than recall groups) after the newest record,
            or in the whole conversation without one; excluded groups do not count.
        grouping: The grouping, a memo for the next call (never changes an answer).
    """

    included_tokens: Count
    records: Count
    pending_groups: Count
    grouping: Grouping | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class RecallState:
    """Everything the recall protocol remembers about one conversation.

    Attributes:
        next_pin: The pin decided for the next request (``"reforce"`` when it serves an
            outstanding ask for uncovered groups), or ``None``.
        in_flight: A pinned request is being sent (compaction passes inside it run before
            the record it asks for exists).
        awaiting_record: The last completed call was forced; its record is not judged yet.
        ignored_streak: Consecutive pinned responses without a recall call.
        pin_disabled: The provider ignored two pins in a row, or a forced request failed:
            no more pins for this conversation (the verdict describes the provider); also set
            once asking over the cached prefix is disabled for a host that chose it (it never pins).
        seen: What the last :class:`HistorySeen` reported (for the ``record_due`` preview).
        armed: The recall gate's one-shot permission to record (the middleware arms it for a
            pinned request; the recall tool spends it). Version 1 kept it beside the state.
        asking: A record is due on this request and is asked for over the cached prefix
            (the compaction pass inside the request asks, then clears it), with why.
            Versions 1 and 2 had no such field.
        ignored_instructions: Consecutive answers to requests over the cached prefix that did
            not follow the instruction (no value of what they were asked about).
        prefix_disabled: The model ignored two such instructions for records in a row: no more
            requests over the cached prefix for this conversation (records are pinned again when
            the host pins and pinning is not disabled; summaries go to the summarizer).
        summaries_prefix_disabled: A summary asked over the cached prefix was ignored or failed:
            summaries go to the summarizer from then on (the same request at once).
        aligned: The host asks for records over the cached prefix (the recall middleware's
            ``record_request="cached_prefix"``), as its last event said. Versions 1 to 3 had
            no such field (read as ``False`` until the middleware's next event).
    """

    next_pin: PinKind | None = None
    in_flight: bool = False
    awaiting_record: bool = False
    ignored_streak: Count = 0
    pin_disabled: bool = False
    seen: RecallStatus | None = None
    armed: bool = False
    asking: PinKind | None = None
    ignored_instructions: Count = 0
    prefix_disabled: bool = False
    summaries_prefix_disabled: bool = False
    aligned: bool = False


def _v1(stored: Mapping[str, object]) -> Mapping[str, object]:
    """A version-1 state has no ``armed``: the gate's permission was stored beside it (the stack reads it)."""
    return {**exactly(stored, _RECALL_V1_FIELDS), "armed": False, **_V3_DEFAULTS, **_V4_DEFAULTS}


def _v2(stored: Mapping[str, object]) -> Mapping[str, object]:
    """A version-2 state asked for no record over the cached prefix."""
    return {**exactly(stored, (*_RECALL_V1_FIELDS, "armed")), **_V3_DEFAULTS, **_V4_DEFAULTS}


def _v3(stored: Mapping[str, object]) -> Mapping[str, object]:
    """A version-3 state did not say how the host asks for records (the middleware's next event does)."""
    return {**exactly(stored, (*_RECALL_V1_FIELDS, "armed", *_V3_DEFAULTS)), **_V4_DEFAULTS}


_RECALL_V1_FIELDS: Final = ("next_pin", "in_flight", "awaiting_record", "ignored_streak", "pin_disabled", "seen")
#: What version 3 added, as an older state had it: nothing asked or judged over the cached prefix.
_V3_DEFAULTS: Final = {
    "asking": None,
    "ignored_instructions": 0,
    "prefix_disabled": False,
    "summaries_prefix_disabled": False,
}
#: What version 4 added, as an older state had it.
_V4_DEFAULTS: Final = {"aligned": False}
RECALL_SCHEMA: Final = Schema("recall", 4, RecallState, older={1: _v1, 2: _v2, 3: _v3})


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
    """A request is about to be sent."""


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
    if isinstance(event, (HistorySeen, RequestStarting)) and state.aligned != rule.aligned:
        state = replace(state, aligned=rule.aligned)
    if isinstance(event, HistorySeen):
        # The pass inside the request that asked over the cached prefix has run (or never will).
        seen, state = replace(event.status, grouping=None), replace(state, asking=None, awaiting_record=False)
        if event.reforce:
            return replace(state, next_pin="reforce", seen=seen), TakeAsk()
        # A re-force pin stands until a request spends it: its ask is already taken, and a second
        # run's history seen meanwhile (two runs on one conversation) must not drop it.
        pin: PinKind | None = "size" if pin_due(rule, event.status) else None
        if state.next_pin == "reforce":
            pin = "reforce"
        return replace(state, next_pin=pin, seen=seen), Nothing()
    if isinstance(event, RequestStarting):
        if rule.aligned and state.prefix_disabled and not state.pin_disabled:
            # A host that asks over the cached prefix never pins: with that route disabled, neither
            # is left, and the safety net keeps what no record covers (see :func:`no_route`).
            state = replace(state, pin_disabled=True)
        if state.next_pin is None:
            return state, Unpinned()
        if records_over_prefix(state):  # asked by the pass inside it
            return replace(state, next_pin=None, asking=state.next_pin), Unpinned()
        if state.pin_disabled:  # neither route is left
            return replace(state, next_pin=None), Unpinned()
        return replace(state, next_pin=None, in_flight=True), Pin(rule.record_max_tokens, state.next_pin)
    if isinstance(event, ForcedReturned):
        return replace(state, in_flight=False, awaiting_record=True), Nothing()
    if isinstance(event, ForcedResponse):
        streak = 0 if event.called_recall else state.ignored_streak + 1
        if streak >= IGNORED_LIMIT and not state.pin_disabled:
            return replace(state, ignored_streak=streak, pin_disabled=True), Disable(streak)
        return replace(state, ignored_streak=streak), Nothing()
    if isinstance(event, ForcedFailed):
        return replace(state, in_flight=False, awaiting_record=False, pin_disabled=True), RetryUnpinned()
    return replace(state, next_pin=event.pin, in_flight=False, awaiting_record=False), Nothing()


def no_route(state: RecallState) -> bool:
    """No record can be asked for in this conversation: pinning is disabled (the provider ignored two pins, a
    pinned request failed, or the host asks over the cached prefix) and so is asking over the cached prefix.

    The record strategies then let the safety net take the record's place: past the record
    trigger, every tool group no record covers, after the head and before the newest group,
    is cut to its value lines at once.
    """
    return state.pin_disabled and state.prefix_disabled


def records_over_prefix(state: RecallState) -> bool:
    """Would the conversation's next record be asked over the cached prefix (an instruction appended to the
    request it repeats)? For a host that asks that way, or one that pins once pinning is disabled, until that
    route is disabled too."""
    return (state.aligned or state.pin_disabled) and not state.prefix_disabled


def judged_instruction(state: RecallState, *, followed: bool) -> RecallState:
    """``state`` after an answer to a request over the cached prefix: two ignored in a row disable the route."""
    streak = 0 if followed else state.ignored_instructions + 1
    return replace(state, ignored_instructions=streak, prefix_disabled=state.prefix_disabled or streak >= IGNORED_LIMIT)


def record_due(rule: PinRule, state: RecallState, *, reforce_pending: bool) -> bool:
    """Would a record be asked for on the next request (pinned, or over the cached prefix)? A preview:
    nothing is consumed.

    A pin already decided counts; an outstanding, untaken re-force ask counts; otherwise
    the pin rule on the last history seen.
    """
    if no_route(state):
        return False
    if state.next_pin is not None:
        return True
    if state.seen is None:
        return False
    return reforce_pending or pin_due(rule, state.seen)


def pin_due(rule: PinRule, status: RecallStatus) -> bool:
    """The pin rule on one history (an outstanding re-force ask is checked first, elsewhere).

    The first size-triggered record is asked for at once; a later one waits for
    ``min_groups_before_repeat`` new tool groups, so the trigger re-arms on new tool
    material, not on size alone. ``max_groups_before_record`` is a separate bound.
    """
    if rule.max_groups_before_record is not None and status.pending_groups >= rule.max_groups_before_record:
        return True
    if status.records and (not rule.repeat_records or status.pending_groups < rule.min_groups_before_repeat):
        return False
    return status.included_tokens > rule.trigger_tokens
