"""One pass's view of a history: the facts every sub-step reads, derived once.

A pass runs several sub-steps over one conversation (the record rules, the user half,
the chain's replacements, the fallbacks), and each reads the same derived facts: which
records are conversation (neither injected nor a note), how they group, which calls are
recall calls, and how large the sent prompt is. A :class:`View` holds them for one
history; :func:`view` derives the next one from the last, so a sub-step that changed
only flags (an exclusion, a hold) costs no regrouping (:func:`~.grouping.same_shape`).
A view is a value: it never changes an answer, only saves work.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from .grouping import Grouping, regroup
from .model import History, MessageRecord, conversation_indices
from .protocol import sent_tokens

RECALL_TOOL_NAME: Final = "recall_earlier_tool_results"


def recall_call_ids(history: Iterable[MessageRecord]) -> frozenset[str]:
    """Call ids of every ``recall_earlier_tool_results`` call in ``history``."""
    return frozenset(
        part.call_id
        for record in history
        if record.has_tool_call and RECALL_TOOL_NAME in record.call_names
        for part in record.parts
        if part.call_id and part.name == RECALL_TOOL_NAME
    )


@dataclass(frozen=True, slots=True)
class View:
    """The derived facts of one history.

    Attributes:
        history: The history they were derived from.
        indices: Indices of the conversation in ``history`` (neither injected nor a note).
        records: The conversation's records, in order (``history[i]`` for each index).
        grouping: The conversation's grouping; group members index ``records``.
        recall_ids: Call ids of the conversation's recall calls.
        sent: The sent prompt's size (:func:`~.protocol.sent_tokens` of ``history``).
    """

    history: History
    indices: tuple[int, ...]
    records: tuple[MessageRecord, ...]
    grouping: Grouping
    recall_ids: frozenset[str]
    sent: int


def view(history: History, previous: View | Grouping | None = None) -> View:
    """The view of ``history``, reusing ``previous`` (a view or a grouping of a similar history) where it holds."""
    if isinstance(previous, View) and previous.history is history:
        return previous
    indices = conversation_indices(history)
    records = tuple(history[i] for i in indices)
    grouping = regroup(records, previous.grouping if isinstance(previous, View) else previous)
    return View(history, indices, records, grouping, recall_call_ids(records), sent_tokens(history))
