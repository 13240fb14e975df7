"""What a host with its own agent loop needs beside a strategy's ``step``: messages as the core counts them, the
prompt a pass leaves, the recall protocol's two events around a model request, and the state read back.

The framework adapters do all of this for Agent Framework; a host with another loop (a plain OpenAI-format
message list, another framework, a server that keeps history in its own database) does it with these functions.
Each is pure: values in, a value out, ``measure`` (the host's token counter, a pure function of text) injected.

A host's turn, for a record strategy or the composition (see docs/core.md):

1. ``state = request_starting(rule, state)``: the recall protocol decides whether this request asks for a record;
2. build the :data:`~.model.History` of its list with :func:`message` and the part builders, every message
   carrying its index as ``origin``;
3. ``step``; while it answers :class:`~.protocol.Needs`, perform each request by its route and
   ``state = absorb(state, answers)``, then step again;
4. apply the :class:`~.protocol.Done`: send :func:`prompt` of its history (a record whose ``origin`` names a message
   it left :func:`unchanged` is the host's own message; any other is rendered from its parts), keep its state;
5. ``state = request_sent(rule, state, done.history, measure)`` once the request has gone out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final, cast

from .checks import AtLeastOne, AtLeastZero, Fraction, describe_value, require
from .composition import CompositionConfig
from .counting import (
    MESSAGE_OVERHEAD_TOKENS,
    Measure,
    arguments_text,
    call_text,
    clear_reasoning_text,
    is_json_container,
    result_text,
)
from .model import MEDIA_KINDS, History, MessageRecord, Part
from .recall import DEFAULT_MIN_GROUPS_BEFORE_REPEAT, HistorySeen, PinRule, RequestStarting, repeat_tokens
from .records import RecordConfig, on_recall, recall_status
from .state import AnchoredSnapshot, State

#: The roles a message may have.
ROLES: Final = frozenset({"system", "user", "assistant", "tool"})


def _text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {describe_value(value)}")
    return value


def _measured(measure: Measure, text: str) -> int:
    if not text:
        return 0
    count = measure(text)
    if type(count) is not int or count < 0:
        raise TypeError(f"measure must return an integer >= 0, got {describe_value(count)} for {describe_value(text)}")
    return count


def text_part(text: str, measure: Measure) -> Part:
    """A text part (a user's words, an assistant's reply, a system prompt), counted with ``measure``."""
    text = _text("text", text)
    return Part(kind="text", text=text, tokens=_measured(measure, text))


def call_part(call_id: str, name: str, arguments: str | Mapping[str, object], measure: Measure) -> Part:
    """A function call: its id, its tool's name and its arguments (a JSON string or a mapping).

    The model sees the name and the arguments, so both count.
    """
    _text("call_id", call_id)
    _text("name", name)
    text = call_text(name, arguments_text(arguments))
    return Part(kind="function_call", text=text, tokens=_measured(measure, text), call_id=call_id, name=name)


def result_part(call_id: str, result: object, measure: Measure, *, media_tokens: int = 0) -> Part:
    """A function result: the call id it answers and its value (a string as is, anything else as JSON).

    Args:
        call_id: The id of the call it answers.
        result: The result as the model is sent it.
        measure: The host's token counter.
        media_tokens: The estimate of media items the result carries (0 for none); such a
            result is never rewritten in part.
    """
    _text("call_id", call_id)
    require("media_tokens", media_tokens, AtLeastZero)
    text = result_text(result)
    return Part(
        kind="function_result",
        text=text,
        tokens=_measured(measure, text) + media_tokens,
        media_tokens=media_tokens,
        call_id=call_id,
        structured=media_tokens > 0 or is_json_container(text),
    )


def reasoning_part(text: str, measure: Measure, *, opaque: str | None = None) -> Part:
    """Reasoning: its clear text, and an opaque provider payload (``encrypted_content``, a ``signature``, a
    base64 blob) that never counts; only clear text inside a JSON payload does."""
    text = _text("text", text) + clear_reasoning_text(opaque)
    return Part(kind="text_reasoning", text=text, tokens=_measured(measure, text))


def media_part(ref: str, tokens: int, *, kind: str = "uri") -> Part:
    """A media part (an image, a document) at the host's estimate ``tokens``.

    Args:
        ref: A stable reference to its bytes (a URI, a digest of inline data, a file id) with
            its media type: media descriptions are keyed by it.
        tokens: The estimate it counts at (1,024 is the package's default).
        kind: ``"uri"``, ``"data"`` or ``"hosted_file"``.
    """
    _text("ref", ref)
    require("tokens", tokens, AtLeastZero)
    if kind not in MEDIA_KINDS:
        raise ValueError(f"kind must be one of {sorted(MEDIA_KINDS)}, got {describe_value(kind)}")
    return Part(kind=kind, tokens=tokens, media_tokens=tokens, ref=ref)


def message(
    role: str,
    parts: Iterable[Part],
    *,
    message_id: str | None = None,
    origin: int | None = None,
    preserved: bool = False,
    injected: bool = False,
) -> MessageRecord:
    """One message of the host's list as the core sees it, counted as its parts plus the per-message overhead.

    Args:
        role: ``"system"``, ``"user"``, ``"assistant"`` or ``"tool"``.
        parts: Its parts, in order (:func:`text_part`, :func:`call_part`, ...).
        message_id: Its id, when it has one.
        origin: Its index in the host's list: the answer names it so the host applies it.
        preserved: Never make this message smaller.
        injected: Context added for this request only (never history: never changed or counted as a turn).

    Raises:
        ValueError: An unknown role.
        TypeError: A part that is not a :class:`~.model.Part`.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {sorted(ROLES)}, got {describe_value(role)}")
    given = tuple(cast("Iterable[object]", parts))  # a host may hand anything: each part is checked
    for index, part in enumerate(given):
        if not isinstance(part, Part):
            raise TypeError(f"parts[{index}] must be a Part, got {describe_value(part)}")
    if message_id is not None:
        _text("message_id", message_id)
    if origin is not None:
        require("origin", origin, AtLeastZero)
    checked = cast("tuple[Part, ...]", given)
    return MessageRecord(
        role,
        checked,
        MESSAGE_OVERHEAD_TOKENS + sum(part.tokens for part in checked),
        message_id,
        preserved=preserved,
        injected=injected,
        origin=origin,
    )


def prompt(history: Iterable[MessageRecord]) -> tuple[MessageRecord, ...]:
    """What the next request carries, in order: every message the pass did not exclude (the host's own, and the
    notes, records and summaries the pass inserted, whose ``origin`` is ``None``)."""
    return tuple(record for record in history if not record.excluded)


def unchanged(record: MessageRecord, given: Sequence[MessageRecord]) -> bool:
    """``record`` is the host's message at its ``origin`` in ``given`` (the history it stepped), as it was: the host
    sends its own message. Otherwise the pass made it (``origin`` is ``None``) or rewrote its parts (a tool result
    shortened or cut to its value lines), and the host renders it from ``record.parts``."""
    return record.origin is not None and given[record.origin].parts == record.parts


def record_rule(
    config: RecordConfig | CompositionConfig,
    *,
    max_groups_before_record: int | None = None,
    repeat_records: bool = True,
    min_groups_before_repeat: int = DEFAULT_MIN_GROUPS_BEFORE_REPEAT,
    repeat_fraction: float | None = None,
) -> PinRule:
    """When a record is due, for a host that asks for records over the cached prefix (its request, plus one
    instruction; :attr:`~.effects.Route.CACHED_PREFIX`): above the record trigger of ``config``, or once
    ``max_groups_before_record`` tool groups wait for one; later records after ``min_groups_before_repeat`` new
    tool groups, or at once when the new ones send ``repeat_fraction`` of the budget (as
    :class:`~maf_compaction.ToolResultRecallMiddleware` takes them)."""
    records = config.records if isinstance(config, CompositionConfig) else config
    if max_groups_before_record is not None:
        require("max_groups_before_record", max_groups_before_record, AtLeastOne)
    require("repeat_fraction", repeat_fraction, Fraction | None)
    return PinRule(
        trigger_tokens=records.trigger_tokens,
        max_groups_before_record=max_groups_before_record,
        repeat_records=repeat_records,
        min_groups_before_repeat=min_groups_before_repeat,
        repeat_tokens=repeat_tokens(records.max_input_tokens, repeat_fraction),
        aligned=True,
        payoff_share=records.payoff_share,
    )


def request_starting(rule: PinRule, state: State) -> State:
    """``state`` as a model request of the conversation is about to be built: a record due is asked for by the pass
    that compacts this request (its ``step`` answers :class:`~.protocol.Needs` with it). A host forces no tool call,
    so under any ``rule`` a record due is asked for over the cached prefix, never pinned."""
    return on_recall(rule, state, RequestStarting(forcible=False))[0]


def request_sent(rule: PinRule, state: State, sent: History, measure: Measure | None = None) -> State:
    """``state`` once the request of ``sent`` (the pass's ``Done.history``) has gone out: the recall protocol reads
    its size and the tool groups no record holds, and decides whether the next request asks for a record.

    With a payoff share (``rule.payoff_share``) only groups whose record would pay count
    (:func:`~.records.record_pays`), measured with ``measure`` (the host's token counter).

    Raises:
        TypeError: The rule has a payoff share and no ``measure`` was given.
    """
    if rule.payoff_share is not None and measure is None:
        raise TypeError("request_sent needs the host's measure when the rule has a payoff_share")
    status, _ = recall_status(sent, measure=measure, payoff_share=rule.payoff_share)
    return on_recall(rule, state, HistorySeen(status))[0]


def read_state(config: object, data: object) -> State:
    """The state a host stored (``state.to_dict()``, through JSON or not), read strictly under ``config``.

    Raises:
        SnapshotVersionError: Another version wrote it.
        SnapshotError: It is malformed or inconsistent (the error names the field).
    """
    return State.from_dict(data, keep_head_groups=_head_groups(config))


def read_snapshot(config: object, data: object) -> AnchoredSnapshot:
    """The anchored strategy's stored snapshot (``snapshot.to_dict()``), read strictly under ``config``.

    Raises:
        SnapshotVersionError: Another version wrote it.
        SnapshotError: It is malformed or inconsistent (the error names the field).
    """
    return AnchoredSnapshot.from_dict(data, keep_head_groups=_head_groups(config))


def _head_groups(config: object) -> int | None:
    """The head ``config`` keeps (``keep_head_groups``), which a stored value's positions must respect; ``None``
    for a configuration without one."""
    head = getattr(config, "keep_head_groups", None)
    return head if isinstance(head, int) else None
