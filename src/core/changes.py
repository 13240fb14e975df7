"""What one pass changed, in figures every strategy shares (for telemetry: nothing decides from them).

A pass's answer is a history whose records carry the ``origin`` of the message each stands
for, and whose exclusions carry the reason the core gave. :func:`changes` reads the two
histories of a pass and says what the next request carries differently: how many messages
were shortened, shed, replaced by a record or summarised, and where in the list the first
change is. :func:`kept_prefix` says how much of one pass's prompt the next pass's prompt
sends again unchanged at its start: a provider's prompt cache matches on an exact prefix,
so that is what stays cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from . import anchored, records, user_summaries
from .model import History, MessageRecord, Part

#: The change each exclusion reason stands for.
_KIND_OF_REASON: Final[dict[str, str]] = {
    anchored.EXCLUDE_REASON: "shed",
    records.EXCLUDE_REASON: "recorded",
    records.REPLACED_REASON: "recorded",
    user_summaries.EXCLUDE_REASON: "summarised",
    user_summaries.FOLD_EXCLUDE_REASON: "summarised",
}


@dataclass(frozen=True, slots=True)
class Changes:
    """What a pass changed in its list.

    Attributes:
        changed: Messages whose inclusion or content the pass changed, plus the messages it created or
            dropped (notes, records, summaries).
        shortened: Included messages whose content the pass cut (tool results shortened or distilled).
        shed: Messages the pass newly excluded to fit the budget (with a note in their place).
        recorded: Messages the pass newly excluded because a record quotes them (or a record replacement).
        summarised: Messages the pass newly excluded because a user-turn summary (or a fold) replaces them.
        first: Index, in the list handed to the pass, of the first message the pass changed, dropped or
            inserted a message before (``len(before)`` for a message appended); ``None`` when it changed nothing.
    """

    changed: int = 0
    shortened: int = 0
    shed: int = 0
    recorded: int = 0
    summarised: int = 0
    first: int | None = None


@dataclass(frozen=True, slots=True)
class Prefix:
    """How much of one prompt the next one sends unchanged at its start (a provider's cache matches that much).

    Attributes:
        messages: Messages of the earlier prompt sent again, unchanged and in place, at the start of the later one.
        tokens: Their tokens.
        stable: All of them: the later prompt only appends to the earlier one.
    """

    messages: int
    tokens: int
    stable: bool


def changes(before: History, after: History) -> Changes:
    """What ``after`` (the core's answer to ``before``) changes, by kind, and where in the list it first does."""
    counts = {"shortened": 0, "shed": 0, "recorded": 0, "summarised": 0}
    changed = 0
    first: int | None = None
    carried = [False] * len(before)
    created: list[MessageRecord] = []
    pending = False  # a message was created: it stands before the next carried one
    for record in after:
        origin = record.origin
        if origin is None:
            created.append(record)
            pending = True
            continue
        carried[origin] = True
        if pending:
            first = _earlier(first, origin)
            pending = False
        source = before[origin]
        if record is source:
            continue
        kind = _change(source, record)
        if kind is None:
            continue
        changed += 1
        first = _earlier(first, origin)
        if kind in counts:
            counts[kind] += 1
    if pending:
        first = _earlier(first, len(before))
    if created or not all(carried):
        # A note the answer re-made with the text it had is the same message, neither created nor dropped.
        old = {_note_key(before[i]) for i in range(len(before)) if not carried[i] and before[i].note}
        new = {_note_key(record) for record in created if record.note}
        changed += sum(1 for record in created if not (record.note and _note_key(record) in old))
        dropped = [
            i for i in range(len(before)) if not carried[i] and not (before[i].note and _note_key(before[i]) in new)
        ]
        changed += len(dropped)
        if dropped:
            first = _earlier(first, dropped[0])
    return Changes(changed=changed, first=first, **counts)


def prompt(history: History) -> tuple[MessageRecord, ...]:
    """The conversation's part of the prompt ``history`` sends: its included messages, the context other
    providers inject for one call aside (not ours to keep stable)."""
    return tuple(record for record in history if not (record.excluded or record.injected))


def kept_prefix(earlier: Sequence[MessageRecord], later: Sequence[MessageRecord]) -> Prefix:
    """How much of the prompt ``earlier`` the prompt ``later`` sends again, unchanged, at its start."""
    kept = 0
    for old, new in zip(earlier, later, strict=False):
        if not _same(old, new):
            break
        kept += 1
    return Prefix(kept, sum(record.tokens for record in earlier[:kept]), kept == len(earlier))


def _change(source: MessageRecord, record: MessageRecord) -> str | None:
    """What the pass did to one message: its kind of change, ``"other"``, or ``None`` for nothing."""
    if record.excluded and not source.excluded:
        return _KIND_OF_REASON.get(record.reason or "", "other")
    if record.parts is not source.parts and _sent(record) != _sent(source):
        return "shortened" if not record.excluded else "other"
    if record.excluded != source.excluded:
        return "other"
    return None


def _earlier(first: int | None, index: int) -> int:
    return index if first is None else min(first, index)


_Sent = tuple[tuple[str, str, str | None, str | None, str | None], ...]


def _note_key(record: MessageRecord) -> tuple[str | None, _Sent]:
    """A note's id and what it sends."""
    return record.message_id, _sent(record)


def _same(old: MessageRecord, new: MessageRecord) -> bool:
    """The two records send the same message (its role and parts: ids are ours and the framework's, and the two
    lists of a conversation may give one message different ids)."""
    if old is new:
        return True
    if old.role != new.role or len(old.parts) != len(new.parts):
        return False
    pairs = zip(old.parts, new.parts, strict=True)
    return old.parts is new.parts or all(a is b or _part(a) == _part(b) for a, b in pairs)


def _part(part: Part) -> tuple[str, str, str | None, str | None, str | None]:
    """What the model is sent of a part (not how we counted it, nor the text an earlier pass cut)."""
    return part.kind, part.text, part.call_id, part.name, part.ref


def _sent(record: MessageRecord) -> _Sent:
    """What the model is sent of a record's parts (not how we counted them, nor the text an earlier pass cut)."""
    return tuple(_part(p) for p in record.parts)
