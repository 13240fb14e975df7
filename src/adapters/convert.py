"""Framework messages in, core records out, and the core's answer applied back in place.

Nothing here decides what to compact. It reads flags (excluded, preserved, injected,
our notes), converts, and writes exclusions, shortened results and notes onto the list
the framework handed us. Loaded copies share their ``contents`` lists and nested dicts
with stored history, so every write here assigns new objects and never mutates a
shared one.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeAlias, cast

from agent_framework import Content, HistoryProvider, Message
from agent_framework._compaction import EXCLUDE_REASON_KEY, EXCLUDED_KEY

from ..core.checks import describe_value
from ..core.counting import message_tokens, result_text
from ..core.model import History, MessageRecord, Part, history
from ..core.user_summaries import USER_SUMMARY_MARKER
from .counting import PartCounter

PRESERVED_KEY = "_preserved"
ATTRIBUTION_KEY = "_attribution"
#: Marks a message maf-compaction inserted; the value names the strategy.
NOTE_KEY = "_maf_compaction_note"
#: Keeps a shortened result's original (its text, or its JSON value) on the message, so nothing is lost.
ORIGINALS_KEY = "_maf_compaction_original_results"
#: Names why the record strategy holds a message (it also sets ``_preserved``).
HOLD_KEY = "_maf_compaction_hold"
#: Marks a record compaction wrote (an assistant message starting with the record prefix).
WRITTEN_RECORD_KEY = "maf_compaction_written_record"
#: Marks one of our user-turn summaries; the value is the summary id.
SUMMARY_KEY = "_maf_compaction_summary"
#: On a summary: the ids of the messages it replaces.
SUMMARY_OF_KEY = "_maf_compaction_summary_of"
#: On a replaced message: the id of the summary that replaced it.
SUMMARIZED_BY_KEY = "_maf_compaction_summarized_by"


def to_history(messages: Sequence[Message], counter: PartCounter, *, note_kind: str) -> History:
    """Records for ``messages``, each carrying its index as ``origin``."""
    return HistoryCache(counter).history(messages, note_kind=note_kind)


class HistoryCache:
    """Converts messages to a ``History`` of message records, reusing what an earlier pass already converted.

    The harness hands a strategy fresh shallow copies of stored history on every model
    call; the copies share their ``contents`` lists and ``Content`` objects with the
    stored messages. A message whose contents list holds the same ``Content`` objects as
    on the previous pass has the same parts and tokens, so only new or rewritten messages
    are converted and counted, and a record is rebuilt only when a flag, the id or the
    position changed. Like the framework, this treats a ``Content`` in history as a
    value: code that changes one replaces it (as this package does), rather than editing
    its fields in place. Shell state: the core never sees it.
    """

    def __init__(self, counter: PartCounter, *, holds: frozenset[str] = frozenset()) -> None:
        self._counter = counter
        self._holds = holds  # hold reasons that are this strategy's own: read as holds, not preserves
        self._entries: list[_Entry] = []  # one per message of the previous pass, in order

    def history(self, messages: Sequence[Message], *, note_kind: str) -> History:
        """Records for ``messages``, each carrying its index as ``origin``."""
        # A message's entry, wherever it moved: an entry holds its contents list, so its id names that list only.
        by_contents = {id(e.contents): e for e in self._entries}
        current: list[_Entry] = []
        records: list[MessageRecord] = []
        providers = _class_names(HistoryProvider)
        # This loop runs once per message per pass: it is written for speed. Malformed
        # input raises a TypeError naming the index and the field before anything is
        # written: the type checks here are the cheap ones (one per message), the
        # contents are checked where they are converted (only when they changed).
        for index, message in enumerate(messages):
            if not isinstance(message, Message):
                raise TypeError(f"messages[{index}] must be an agent_framework Message, got {describe_value(message)}")
            props = message.additional_properties
            if not isinstance(props, dict):
                raise TypeError(f"messages[{index}].additional_properties must be a dict, got {describe_value(props)}")
            contents = message.contents
            entry = by_contents.get(id(contents))
            if entry is None or entry.probe != contents:
                # New, or its list now holds other contents (equal values count as the same).
                parts = _with_originals(
                    self._counter.parts(message, where=f"messages[{index}]"), props.get(ORIGINALS_KEY)
                )
                entry = _Entry(contents, parts, message_tokens(p.tokens for p in parts))
            excluded = bool(props.get(EXCLUDED_KEY))
            # Why it is excluded, as the strategy that excluded it wrote (the record rules read a replaced record's).
            reason = props.get(EXCLUDE_REASON_KEY) if excluded else None
            reason = reason if isinstance(reason, str) else None
            replaced_by = props.get(SUMMARIZED_BY_KEY) if excluded else None
            replaced_by = replaced_by if isinstance(replaced_by, str) else None
            held = props.get(HOLD_KEY)
            held = held if isinstance(held, str) and held in self._holds else None
            preserved = bool(props.get(PRESERVED_KEY)) and held is None
            injected = ATTRIBUTION_KEY in props and is_injected(message, providers)
            note = props.get(NOTE_KEY) == note_kind
            written = props.get(WRITTEN_RECORD_KEY) is True
            summary = is_summary(message)
            # Everything a record copies besides the parts: it is rebuilt only when one of them changed.
            role = message.role
            flags = (
                role, message.message_id, excluded, reason, replaced_by, preserved, injected, note, held, written,
                summary,
            )  # fmt: skip
            if entry.record is None or entry.record.origin != index or entry.flags != flags:
                _check_identity(message, index)
                entry.flags = flags
                entry.record = MessageRecord(
                    role=str(role),
                    parts=entry.parts,
                    tokens=entry.tokens,
                    message_id=message.message_id,
                    excluded=excluded,
                    reason=reason,
                    replaced_by=replaced_by,
                    preserved=preserved,
                    injected=injected,
                    note=note,
                    held=held,
                    written_record=written,
                    summary=summary,
                    origin=index,
                )
            current.append(entry)
            records.append(entry.record)
        self._entries = current
        return history(records)


def _check_identity(message: Message, index: int) -> None:
    """The role and id a record copies are strings (the id may be absent)."""
    role: object = message.role
    if not isinstance(role, str) or not role:
        raise TypeError(f"messages[{index}].role must be a non-empty string, got {describe_value(role)}")
    message_id: object = message.message_id
    if message_id is not None and not isinstance(message_id, str):
        raise TypeError(f"messages[{index}].message_id must be a string or None, got {describe_value(message_id)}")


def _with_originals(parts: tuple[Part, ...], originals: object) -> tuple[Part, ...]:
    """Parts with the original text of each result an earlier pass rewrote (see ``original_results``).

    A non-string original (a dict or list the tool returned) is read back as the text the
    model saw for it, and its part stays ``structured``: the shortened text is not JSON,
    but the result was, so partial records still leave it alone.
    """
    if not originals or not isinstance(originals, dict):
        return parts
    stored = cast("dict[object, object]", originals)
    ids = [p.call_id for p in parts]
    out = list(parts)
    for index, part in enumerate(parts):
        value = stored.get(_result_key(ids, index)) if part.kind == "function_result" else None
        if isinstance(value, str):
            out[index] = replace(part, original=value)
        elif value is not None:
            structured = part.structured or isinstance(value, (dict, list))
            out[index] = replace(part, original=result_text(value), structured=structured)
    return tuple(out)


def _result_key(call_ids: Sequence[str | None], index: int) -> str:
    """How the original of the result at ``index`` is keyed: its call id, ``"<call id>#<index>"`` if not unique."""
    call_id = call_ids[index]
    return call_id if call_id and call_ids.count(call_id) == 1 else f"{call_id}#{index}"


class _Entry:
    """A converted message: its contents (held, so their ids stay unique) and its record."""

    __slots__ = ("contents", "flags", "parts", "probe", "record", "tokens")

    def __init__(self, contents: list[Content], parts: tuple[Part, ...], tokens: int) -> None:
        self.contents = contents
        self.probe = list(contents)  # the Content objects it held when converted
        self.parts = parts
        self.tokens = tokens
        self.flags: tuple[object, ...] = ()  # what the record was made from besides the parts
        self.record: MessageRecord | None = None


def is_summary(message: Message) -> bool:
    """One of our user-turn summaries: a user message with our summary id, its links and the marker.

    Text alone never makes a summary, so a user (or a summarizer) who writes the marker
    does not create one.
    """
    props = message.additional_properties
    summary_id = props.get(SUMMARY_KEY)
    return (
        message.role == "user"
        and isinstance(summary_id, str)
        and summary_id == message.message_id
        and isinstance(props.get(SUMMARY_OF_KEY), list)
        and message.text.startswith(USER_SUMMARY_MARKER)
    )


def is_injected(message: Message, history_names: frozenset[str] | None = None) -> bool:
    """A context provider added this message for one call; it is not history.

    Such messages carry an ``_attribution`` that does not name a history provider: the
    harness's todo list and mode notices, file memory, background tasks. A history
    provider always attributes what it loads with its own class (``source_type``);
    providers that attribute with a bare ``source_id`` string are context providers.
    Messages without attribution are conversation history.
    """
    attribution = message.additional_properties.get(ATTRIBUTION_KEY)
    if not isinstance(attribution, dict):
        return False
    source_type = attribution.get("source_type")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return not isinstance(source_type, str) or source_type not in (
        _class_names(HistoryProvider) if history_names is None else history_names
    )


def _class_names(cls: type) -> frozenset[str]:
    """Names of ``cls`` and of every subclass of it defined so far."""
    return frozenset({cls.__name__}).union(*map(_class_names, cls.__subclasses__()))


def set_hold(message: Message, reason: str | None) -> None:
    props = message.additional_properties
    if reason is not None:
        props[HOLD_KEY] = reason
        props[PRESERVED_KEY] = True
    elif props.pop(HOLD_KEY, None) is not None:
        props.pop(PRESERVED_KEY, None)


def rewrite_results(message: Message, old: tuple[Part, ...], new: tuple[Part, ...]) -> None:
    """Swap in shortened result contents; keep each original result on the message.

    The model sees the shortened text: clients send a string ``result`` as it is (the
    Responses API) and a result's text ``items`` joined (Chat Completions), so both are
    set to it. A string original is kept as its text; any other result (a dict, a list,
    a ``Content``) is kept as its value, JSON-safe (see :func:`original_results`).
    """
    contents = list(message.contents)
    originals = dict(message.additional_properties.get(ORIGINALS_KEY) or {})
    call_ids = [c.call_id for c in contents]
    for index, (before, after) in enumerate(zip(old, new, strict=True)):
        if after.text is before.text:
            continue
        content = contents[index]
        key = _result_key(call_ids, index)
        if key not in originals:
            result: object = content.result
            originals[key] = before.text if isinstance(result, str) or result is None else json_value(result)
        contents[index] = _with_result(content, after.text)
    message.contents = contents
    message.additional_properties[ORIGINALS_KEY] = originals


def _with_result(content: Content, text: str) -> Content:
    shortened = copy.copy(content)
    shortened.result = text
    shortened.items = [Content.from_text(text), *(item for item in content.items or () if item.type != "text")]
    if shortened.additional_properties is not None:
        shortened.additional_properties = dict(shortened.additional_properties)
    return shortened


#: A JSON value: what :func:`original_results` returns for each shortened result.
JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"


def json_value(value: object) -> JsonValue:
    """``value`` as JSON data, so a session that stores the message can serialize it.

    Dicts and lists stay dicts and lists (tuples become lists, keys strings, as JSON makes
    them); a ``Content`` anywhere inside becomes its ``to_dict()``; anything else JSON
    cannot hold becomes its ``str``, as the model's text does. A value JSON cannot encode
    at all (a circular structure, a tuple key) is kept as the text the model saw.
    """
    try:
        encoded = json.dumps(value, default=lambda v: v.to_dict() if isinstance(v, Content) else str(v), allow_nan=True)
    except (TypeError, ValueError):
        return result_text(value)
    return cast("JsonValue", json.loads(encoded))


def original_results(message: Message) -> dict[str, JsonValue]:
    """The original results maf-compaction shortened, keyed by call id.

    A result whose call id is not unique within its message is keyed ``"<call id>#<index>"``
    by its position among the message's contents.

    A string result comes back as its original text. Any other result comes back as its
    original value in JSON form: a dict or list as itself (tuples as lists, keys as
    strings), a ``Content`` as its ``to_dict()`` (``Content.from_dict`` rebuilds it), a
    value JSON cannot hold as its ``str``. Each call returns fresh copies: changing
    them does not change what the message keeps.

    Raises:
        TypeError: ``message`` is not a ``Message``.
    """
    if not isinstance(message, Message):
        raise TypeError(f"message must be an agent_framework Message, got {describe_value(message)}")
    props: object = message.additional_properties
    stored = props.get(ORIGINALS_KEY) if isinstance(props, dict) else None
    if not isinstance(stored, dict):
        return {}
    return {str(k): copy.deepcopy(v) for k, v in cast("dict[object, JsonValue]", stored).items()}
