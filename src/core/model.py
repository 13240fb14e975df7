"""The values the core works on: message records, parts, groups and the history.

Everything here is frozen. The shell converts framework ``Message`` objects into
these records once per pass (memoizing what it can) and applies the core's answer
back; the core never sees a framework type.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Literal, NamedTuple, TypeAlias

from pyrsistent import PVector, pvector

GroupKind: TypeAlias = Literal["system", "user", "assistant_text", "tool_call"]

#: Content types that declare a tool call. Mirrors the framework's set exactly, because
#: grouping must agree with ``agent_framework._compaction.group_messages``.
TOOL_CALL_KINDS: frozenset[str] = frozenset(
    {
        "function_call",
        "computer_tool_call",
        "mcp_server_tool_call",
        "code_interpreter_tool_call",
        "shell_tool_call",
        "image_generation_tool_call",
    }
)

#: Result content types the framework links to their declaration across non-adjacent spans, with that declaration's.
CALL_KIND_FOR_RESULT: dict[str, str] = {
    "function_result": "function_call",
    "computer_tool_result": "computer_tool_call",
}
LINKABLE_CALL_KINDS: frozenset[str] = frozenset(CALL_KIND_FOR_RESULT.values())

MEDIA_KINDS: frozenset[str] = frozenset({"data", "uri", "hosted_file"})


@dataclass(frozen=True, slots=True)
class Part:
    """One content part as the core sees it.

    Attributes:
        kind: The framework content type (``"text"``, ``"function_result"``, ...).
        text: The text the model sees for this part, on the counting basis of
            :mod:`maf_compaction.core.counting` (text, clear-text reasoning, a call's
            name and arguments, a result's text). Opaque payloads and media bytes are
            never part of it.
        tokens: Tokens of this part: ``measure(text)`` plus ``media_tokens``.
        media_tokens: The media estimate within ``tokens`` (an image part, or media
            items inside a tool result); text rewrites keep it.
        call_id: The tool call id, for calls and results.
        name: The tool name, for calls.
        structured: A result that is not a plain string: it carries media items, or its
            text is a JSON object or array. Partial records never rewrite such a result.
        original: For a result an earlier pass rewrote (shortened, or table rows
            released), the text it had before; ``None`` otherwise. Rules that must see
            every loaded result as it was (a table row repeated across results) read it.
        ref: A stable reference to a media part's bytes (its URI, a digest of its inline
            data, or a hosted file id) with its media type: media descriptions are keyed
            by it, so different media never share a description.
    """

    kind: str
    text: str = ""
    tokens: int = 0
    media_tokens: int = 0
    call_id: str | None = None
    name: str | None = None
    structured: bool = False
    original: str | None = None
    ref: str | None = None


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """One message of the conversation, as a value.

    Attributes:
        role: ``"system"``, ``"user"``, ``"assistant"`` or ``"tool"``.
        parts: The message's content parts, in order.
        tokens: Counted tokens of the whole message (parts plus per-message overhead).
        message_id: The message id, when the message has one.
        excluded: The message is excluded from the prompt.
        preserved: Another component asked that the message is never made smaller.
        injected: A context provider added the message for this call only (a todo
            list, memory context). It is not conversation history: it never counts as
            a group, never shifts positions and is never changed.
        note: One of our own notes (a shed marker). Notes never count as groups.
        held: The record strategy holds this message in the prompt (an uncovered or
            unrecorded tool group), with this reason; ``None`` when not held. A hold is
            ours to release, unlike ``preserved``, which another component set.
        written_record: A record compaction wrote (an assistant message carrying the
            written-record metadata), as opposed to a recall-tool result.
        summary: One of our user-turn summaries (a user message with our summary
            metadata, the framework's summary links and the summary marker), never a
            user's own words.
        origin: Index of the message this record stands for in the list the shell
            converted; ``None`` for a message the core created (a note). The core
            carries it through untouched so the shell can apply the answer in place.
        reason: Why a strategy excluded this message (written on the message when the
            shell applies the exclusion); ``None`` for a message it did not exclude.
        replaces: On a summary the core created: the ids of the messages it replaces.
        replaced_by: On a message a summary replaced: that summary's id.
    """

    role: str
    parts: tuple[Part, ...] = ()
    tokens: int = 0
    message_id: str | None = None
    excluded: bool = False
    preserved: bool = False
    injected: bool = False
    note: bool = False
    held: str | None = None
    written_record: bool = False
    summary: bool = False
    origin: int | None = None
    reason: str | None = None
    replaces: tuple[str, ...] = ()
    replaced_by: str | None = None
    # Derived from role and parts once, when the record is made (grouping reads them on
    # every pass, and the shell reuses records across passes).
    is_reasoning_only: bool = field(init=False, compare=False, repr=False)
    """An assistant message holding nothing but reasoning."""
    has_tool_call: bool = field(init=False, compare=False, repr=False)
    """A message holding at least one tool-call declaration."""
    has_reasoning: bool = field(init=False, compare=False, repr=False)
    """A message holding at least one reasoning part."""
    links: tuple[tuple[str, str, bool], ...] = field(init=False, compare=False, repr=False)
    """``(call kind, call id, is_declaration)`` of each linkable call or result part."""
    call_names: tuple[str, ...] = field(init=False, compare=False, repr=False)
    """Tool names of the message's call declarations, in order."""

    @property
    def in_conversation(self) -> bool:
        """Part of the conversation: neither context injected for one call nor one of our notes (the one test)."""
        return not self.injected and not self.note

    longest_result_text: int = field(init=False, compare=False, repr=False)
    """Text tokens (media excluded) of the largest function result part; 0 without one."""

    @property
    def inserted(self) -> bool:
        """A message compaction inserted into the conversation (a user summary or a written record).

        It is never a group of the head or the band: inserting one must not move a position.
        """
        return self.summary or self.written_record

    def __post_init__(self) -> None:
        kinds = [p.kind for p in self.parts]
        reasoning_only = self.role == "assistant" and bool(kinds) and all(k == "text_reasoning" for k in kinds)
        object.__setattr__(self, "is_reasoning_only", reasoning_only)
        object.__setattr__(self, "has_tool_call", any(k in TOOL_CALL_KINDS for k in kinds))
        object.__setattr__(self, "has_reasoning", "text_reasoning" in kinds)
        object.__setattr__(self, "links", _links(self.role, self.parts))
        names = tuple(p.name for p in self.parts if p.name and p.kind in TOOL_CALL_KINDS)
        object.__setattr__(self, "call_names", names)
        longest = max((p.tokens - p.media_tokens for p in self.parts if p.kind == "function_result"), default=0)
        object.__setattr__(self, "longest_result_text", longest)


def _links(role: str, parts: tuple[Part, ...]) -> tuple[tuple[str, str, bool], ...]:
    if role not in ("assistant", "tool"):
        return ()
    found: list[tuple[str, str, bool]] = []
    for part in parts:
        if part.call_id and role == "assistant" and part.kind in LINKABLE_CALL_KINDS:
            found.append((part.kind, part.call_id, True))
        elif part.call_id and part.kind in CALL_KIND_FOR_RESULT:
            found.append((CALL_KIND_FOR_RESULT[part.kind], part.call_id, False))
    return tuple(found)


_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(MessageRecord))


def flagged(record: MessageRecord, **flags: object) -> MessageRecord:
    """``record`` with flags changed (``excluded``, ``preserved``, ``held``, ``reason``, ``replaced_by``).

    What ``dataclasses.replace`` answers, at less than half its cost: the fields derived
    from role and parts are copied, not derived again (a pass changes thousands of flags).
    """
    new = object.__new__(MessageRecord)
    for name in _FIELDS:
        object.__setattr__(new, name, getattr(record, name))
    for name, value in flags.items():
        object.__setattr__(new, name, value)
    return new


History: TypeAlias = PVector[MessageRecord]


def history(records: Iterable[MessageRecord] = ()) -> History:
    """Build a :data:`History` from any iterable of records."""
    return pvector(records)


def conversation_indices(records: Sequence[MessageRecord]) -> tuple[int, ...]:
    """Indices of the conversation in ``records``: every record that is neither injected nor a note."""
    return tuple(i for i, r in enumerate(records) if r.in_conversation)


def conversation_records(records: Iterable[MessageRecord]) -> list[MessageRecord]:
    """The conversation in ``records`` (see :func:`conversation_indices`), in order."""
    return [r for r in records if r.in_conversation]


class Group(NamedTuple):
    """A group of messages that are kept or removed together.

    Attributes:
        kind: The framework group kind.
        members: Indices into the history, ascending. A linked tool group (a call and
            a result that is not adjacent to it) has non-contiguous members.
        has_reasoning: Any member holds reasoning.
        spans: The contiguous runs of members, as ``(start, end)`` inclusive pairs.
    """

    kind: GroupKind
    members: tuple[int, ...]
    has_reasoning: bool = False
    spans: tuple[tuple[int, int], ...] = ()

    @property
    def start(self) -> int:
        """Index of the group's first member."""
        return self.members[0]
