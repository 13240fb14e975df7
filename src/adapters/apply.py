"""The core's answer applied back onto the framework's list, in place, once per pass.

Every strategy's answer is a history of records carrying the ``origin`` of the message
each stands for; records the core created (our notes, user-turn summaries) have none.
Applying it writes exclusions (with the reason the core gave), rewritten results, holds
and summary links onto the messages, inserts the created messages, and reorders the
list to match. Nothing here decides anything.
"""

from __future__ import annotations

import copy

from agent_framework import Message
from agent_framework._compaction import EXCLUDE_REASON_KEY, EXCLUDED_KEY

from ..core.model import History, MessageRecord
from .convert import (
    HOLD_KEY,
    NOTE_KEY,
    PRESERVED_KEY,
    SUMMARIZED_BY_KEY,
    SUMMARY_KEY,
    SUMMARY_OF_KEY,
    WRITTEN_RECORD_KEY,
    rewrite_results,
    set_hold,
)

#: The exclusion reason written when the core gave none.
DEFAULT_EXCLUDE_REASON = "maf_compaction"


def apply(messages: list[Message], before: History, after: History, *, note_kind: str) -> None:
    """Make ``messages`` match ``after`` (which the core derived from ``before``), in place."""
    notes: dict[str | None, Message] | None = None  # existing notes by id, looked up only for a created note
    updated: list[Message] = []
    for record in after:
        if record.origin is None:
            if notes is None and not (record.summary or record.written_record):
                notes = _notes(messages, before)
            created = _created(record, notes or {}, note_kind, touch=True)
            if record.excluded:  # made and replaced on one pass (a record a merge took in): stored, not sent
                _exclude(created, record)
            updated.append(created)
            continue
        message = messages[record.origin]
        source = before[record.origin]
        if record.excluded and not source.excluded:
            _exclude(message, record)
        elif source.excluded and not record.excluded and source.replaced_by is not None:
            _include(message)  # its replacement was lost: the core undid the exclusion (``relinked``)
        if record.parts is not source.parts:
            rewrite_results(message, source.parts, record.parts)
        if record.held != source.held:
            set_hold(message, record.held)
        updated.append(message)
    messages[:] = updated


def _exclude(message: Message, record: MessageRecord) -> None:
    """Mark ``message`` excluded as ``record`` says (its reason, and the replacement that took it in)."""
    props = message.additional_properties
    props[EXCLUDED_KEY] = True
    props[EXCLUDE_REASON_KEY] = record.reason or DEFAULT_EXCLUDE_REASON
    if record.replaced_by is not None:
        props[SUMMARIZED_BY_KEY] = record.replaced_by


def _include(message: Message) -> None:
    """Mark ``message`` included again (the core undid an exclusion whose replacement the list lost)."""
    props = message.additional_properties
    props[EXCLUDED_KEY] = False
    props.pop(EXCLUDE_REASON_KEY, None)
    props.pop(SUMMARIZED_BY_KEY, None)


def render(messages: list[Message], before: History, view: History, *, note_kind: str) -> list[Message]:
    """The messages a request over ``view`` sends (the included ones, in order), leaving ``messages`` untouched.

    What :func:`apply` followed by the framework's projection would send, built without
    changing a message: a message whose results ``view`` rewrites is sent as a copy.
    """
    notes = _notes(messages, before)
    sent: list[Message] = []
    for record in view:
        if record.excluded:
            continue
        if record.origin is None:
            sent.append(_created(record, notes, note_kind, touch=False))
            continue
        message = messages[record.origin]
        source = before[record.origin]
        if record.parts is not source.parts:
            message = copy.copy(message)
            message.additional_properties = dict(message.additional_properties)
            rewrite_results(message, source.parts, record.parts)
        sent.append(message)
    return sent


#: On a written record the composition made: the ids of the records (and their calls) it replaces.
RECORD_OF_KEY = "_maf_compaction_record_of"


def _notes(messages: list[Message], before: History) -> dict[str | None, Message]:
    """The notes already in ``messages``, by id."""
    return {messages[r.origin].message_id: messages[r.origin] for r in before if r.note and r.origin is not None}


def _created(record: MessageRecord, notes: dict[str | None, Message], note_kind: str, *, touch: bool) -> Message:
    """The message of a record the core created: a user-turn summary, a written record, or a note.

    A summary is a user message linked both ways to the messages it replaces. The links
    are our own keys, not the framework's ``_summary_of_message_ids`` in the group
    annotation: the framework reconciles summaries that carry those with the caller's
    messages after every model call, and under the harness (history loaded per call) it
    rejects every one of ours with a WARNING and strips exclusions it cannot root. Ours are
    not in-run summaries to reconcile; they are decisions the stored history keeps.

    A record the composition wrote (a kept merge or rewrite) is held, so no fallback sheds
    it. A note whose text is unchanged is the one already in the list (``touch``: included
    again).
    """
    text = record.parts[0].text
    if record.summary:
        props: dict[str, object] = {SUMMARY_KEY: record.message_id, SUMMARY_OF_KEY: list(record.replaces)}
        return Message("user", [text], message_id=record.message_id, additional_properties=props)
    if record.written_record:
        props = {WRITTEN_RECORD_KEY: True, RECORD_OF_KEY: list(record.replaces)}
        if record.held is not None:
            props[HOLD_KEY] = record.held
            props[PRESERVED_KEY] = True
        return Message("assistant", [text], message_id=record.message_id, additional_properties=props)
    found = notes.get(record.message_id)
    if found is not None and found.text == text:
        if touch:
            found.additional_properties[EXCLUDED_KEY] = False
        return found
    props = {NOTE_KEY: note_kind, EXCLUDED_KEY: False}
    return Message("assistant", [text], message_id=record.message_id, additional_properties=props)
