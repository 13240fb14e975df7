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

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, TypeAlias, cast

from .grouping import Grouping, regroup
from .model import History, MessageRecord, conversation_indices
from .protocol import sent_tokens

RECALL_TOOL_NAME: Final = "recall_earlier_tool_results"
#: The recall tool's one parameter: the record the model writes.
RECALL_ARGUMENT: Final = "values"
#: The conversation's recall calls: each call id with the call's text (its name and arguments; the record it
#: carries: :func:`call_values`).
RecallCalls: TypeAlias = Mapping[str, str]


def find_recall_calls(history: Iterable[MessageRecord]) -> RecallCalls:
    """Every ``recall_earlier_tool_results`` call in ``history``: its call id, with its text."""
    return MappingProxyType(
        {
            part.call_id: part.text
            for record in history
            if record.has_tool_call and RECALL_TOOL_NAME in record.call_names
            for part in record.parts
            if part.call_id and part.name == RECALL_TOOL_NAME
        }
    )


def call_values(text: str) -> str:
    """The record a recall call's text (its name and arguments, :func:`~.counting.call_text`) carries.

    The ``values`` argument when the arguments are the JSON object the tool takes; otherwise the arguments as
    they stand (a provider that sent something else: the model still reads it as written).
    """
    arguments = text.removeprefix(RECALL_TOOL_NAME).strip()
    try:
        parsed: object = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict):
        value = cast("dict[str, object]", parsed).get(RECALL_ARGUMENT)
        if isinstance(value, str):
            return value
    return arguments


@dataclass(frozen=True, slots=True)
class View:
    """The derived facts of one history.

    Attributes:
        history: The history they were derived from.
        indices: Indices of the conversation in ``history`` (neither injected nor a note).
        records: The conversation's records, in order (``history[i]`` for each index).
        grouping: The conversation's grouping; group members index ``records``.
        recall_calls: The conversation's recall calls (:func:`find_recall_calls`).
        sent: The sent prompt's size (:func:`~.protocol.sent_tokens` of ``history``).
    """

    history: History
    indices: tuple[int, ...]
    records: tuple[MessageRecord, ...]
    grouping: Grouping
    recall_calls: RecallCalls
    sent: int


def view(history: History, previous: View | Grouping | None = None) -> View:
    """The view of ``history``, reusing ``previous`` (a view or a grouping of a similar history) where it holds."""
    if isinstance(previous, View) and previous.history is history:
        return previous
    indices = conversation_indices(history)
    records = tuple(history[i] for i in indices)
    grouping = regroup(records, previous.grouping if isinstance(previous, View) else previous)
    return View(history, indices, records, grouping, find_recall_calls(records), sent_tokens(history))
