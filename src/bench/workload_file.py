"""Scenarios from files: the workload JSON format (:func:`load_workload`) and session exports (:func:`load_session`).

The format, its errors (``FILE: WHERE: PROBLEM``) and how a session's messages become turns:
``docs/workload-format.md``. The format's objects are ``msgspec`` structs; what msgspec
reports is reworded here, and the checks across fields are made after it.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import json
import logging
import os
import re
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final, NoReturn, TypeAlias, TypeVar, cast

import msgspec
from agent_framework import AgentSession, Content, InMemoryHistoryProvider, Message
from agent_framework._compaction import EXCLUDED_KEY, GROUP_ANNOTATION_KEY, SUMMARY_OF_MESSAGE_IDS_KEY
from msgspec import UNSET, UnsetType

from ..adapters.convert import NOTE_KEY, ORIGINALS_KEY
from .scenario import RECALL_TOOL, Fact, Media, Probe, Scenario, ToolCall, ToolSpec, Turn

logger = logging.getLogger("maf_compaction")
_T = TypeVar("_T")

#: The workload format version this module reads (and the only one so far).
SUPPORTED_VERSION: Final = 1
#: The ``version`` a ``FileSessionStore`` JSON snapshot carries; ``to_dict()`` writes none.
SESSION_SNAPSHOT_VERSION: Final = "1.0"
#: ``message_id`` prefixes of the summaries the framework's strategies insert.
SUMMARY_ID_PREFIXES: Final = ("summary_", "tool_summary_")
#: What a planted value looks like in the generated workloads (``TL-3FA9C2``, ``RQ-…``).
PLANTED_VALUE: Final = re.compile(r"\b[A-Z]{2}-[0-9A-F]{6}\b")
#: The media type given to a ``uri`` part that declares none.
UNKNOWN_MEDIA_TYPE: Final = "application/octet-stream"

_MIME_PATTERN: Final = r"^[\w.+-]+/[\w.+-]+(\s*;\s*[\w.+-]+=[^;]+)*$"
_SHOWN_CHARS: Final = 40


class WorkloadError(ValueError):
    """A workload or session file that cannot be loaded, and why.

    The message reads ``FILE: WHERE: PROBLEM`` (``workload.json: turns[3].calls[0].result:
    expected a string, got 12``), or ``FILE: PROBLEM`` when the problem is the whole file.

    Attributes:
        file: The path as it was given.
        where: The JSON path of the offending value (``turns[3].user``), or ``""``.
        problem: What is wrong with it.
    """

    def __init__(self, file: str, where: str, problem: str) -> None:
        self.file = file
        self.where = where
        self.problem = problem
        super().__init__(f"{file}: {where}: {problem}" if where else f"{file}: {problem}")


# ----------------------------------------------------------------------------------------
# Reading JSON
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Fail:
    """Raises the :class:`WorkloadError` of one file."""

    file: str

    def __call__(self, where: str, problem: str) -> NoReturn:
        raise WorkloadError(self.file, where, problem)


class _Repeated(dict[str, Any]):
    """A JSON object that gave ``key`` twice (``json`` would keep the last one silently)."""

    __slots__ = ("key",)

    def __init__(self, pairs: list[tuple[str, Any]], key: str) -> None:
        super().__init__(pairs)
        self.key = key


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return _Repeated(pairs, key)
        seen.add(key)
    return dict(pairs)


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"invalid JSON: {name} is not a JSON value")


def _repeated_key(value: object, where: str) -> str | None:
    """The JSON path of the first key given twice in one object, if any."""
    if isinstance(value, _Repeated):
        return _join(where, value.key)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in cast(Iterable[tuple[str | int, object]], items):
        if (found := _repeated_key(item, _join(where, key))) is not None:
            return found
    return None


def _read_json(file: str) -> object:
    """The parsed content of ``file`` as plain dicts and lists; every failure is a :class:`WorkloadError`."""
    fail = _Fail(file)
    try:
        text = Path(file).read_bytes().decode("utf-8-sig")
        data = json.loads(text, object_pairs_hook=_object, parse_constant=_reject_constant)
    except OSError as exc:
        fail("", f"cannot read the file: {exc.strerror or exc}")
    except UnicodeDecodeError as exc:
        fail("", f"not UTF-8 text (invalid byte at offset {exc.start})")
    except json.JSONDecodeError as exc:
        fail("", f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}")
    except ValueError as exc:  # a NaN or Infinity constant
        fail("", str(exc))
    if (repeated := _repeated_key(data, "")) is not None:
        fail(repeated, "key given twice in the same object")
    return data


def _shown(value: object) -> str:
    """``value`` as JSON, cut short, for an error message."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _join(where: str, key: str | int) -> str:
    """``where`` extended by a list index or an object key, as a JSON path."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    if key.isidentifier():
        return f"{where}.{key}" if where else key
    return f"{where}[{json.dumps(key, ensure_ascii=False)}]"


# ----------------------------------------------------------------------------------------
# The workload format, as msgspec structs (field order: required first, as documented)
# ----------------------------------------------------------------------------------------

#: A string with a non-blank character.
_NonEmpty: TypeAlias = Annotated[str, msgspec.Meta(pattern=r"\S")]


class _Object(msgspec.Struct, forbid_unknown_fields=True):
    """An object of the format: an unknown key is refused, and no field accepts ``null``."""


class _Media(_Object):
    media_type: Annotated[str, msgspec.Meta(pattern=_MIME_PATTERN)]
    uri: _NonEmpty | UnsetType = UNSET
    data: _NonEmpty | UnsetType = UNSET


class _Call(_Object):
    name: _NonEmpty
    result: str
    arguments: dict[str, Any] = {}
    media: list[_Media] = []


class _Probe(_Object):
    scope: _NonEmpty
    expected: list[_NonEmpty]


class _Turn(_Object):
    user: _NonEmpty
    media: list[_Media] = []
    calls: list[_Call] = []
    reply: str = ""
    probe: _Probe | UnsetType = UNSET


class _Tool(_Object):
    name: _NonEmpty
    description: str = ""
    parameters: dict[str, Any] | UnsetType = UNSET


class _Fact(_Object):
    label: _NonEmpty
    value: _NonEmpty
    scope: str


class _Workload(_Object):
    version: int
    turns: list[_Turn]
    name: _NonEmpty | UnsetType = UNSET
    system: str = ""
    tools: list[_Tool] = []
    facts: list[_Fact] | UnsetType = UNSET


#: The struct a path ending in this key holds (for the keys an "unknown key" error lists).
_STRUCT_UNDER: Final[Mapping[str, type[_Object]]] = {
    "turns": _Turn,
    "calls": _Call,
    "media": _Media,
    "probe": _Probe,
    "tools": _Tool,
    "facts": _Fact,
}
_TYPE_NAMES: Final = {"str": "a string", "int": "an integer", "array": "a list", "object": "an object"}
_VALIDATION: Final = re.compile(r"(?P<text>.*?)(?: - at `\$(?P<path>[^`]*)`)?", re.DOTALL)
_SEGMENT: Final = re.compile(r"([A-Za-z_]\w*)|\[(\d+)\]")


def _value_at(data: object, path: str) -> object:
    for name, index in _SEGMENT.findall(path):
        data = cast(Any, data)[name] if name else cast(Any, data)[int(index)]
    return data


def _convert(file: str, data: object, kind: type[_T], root: type[_Object]) -> _T:
    """``data`` as ``kind``; a validation error becomes a :class:`WorkloadError` worded for the format."""
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as error:
        match = _VALIDATION.fullmatch(str(error))
        text, path = (match["text"], (match["path"] or "").removeprefix(".")) if match else (str(error), "")
    fail = _Fail(file)
    if found := re.fullmatch(r"Object missing required field `(.+)`", text):
        fail(_join(path, found[1]), "required field is missing")
    if found := re.fullmatch(r"Object contains unknown field `(.+)`", text):
        names = re.findall(r"[A-Za-z_]\w*", path)
        allowed = (_STRUCT_UNDER[names[-1]] if names else root).__struct_fields__
        close = difflib.get_close_matches(found[1], allowed, n=1)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        kind_of_key = "unknown key" if path else "unknown top-level key"
        fail(_join(path, found[1]), f"{kind_of_key}{hint}; allowed keys: {', '.join(allowed)}")
    value = _value_at(data, path)
    if found := re.fullmatch(r"Expected `(\w+)`, got `\w+`", text):
        fail(path, f"expected {_TYPE_NAMES.get(found[1], found[1])}, got {_shown(value)}")
    if "matching regex" in text:
        if path.endswith("media_type") and str(value).strip():
            fail(path, f"expected a MIME type like image/png, got {_shown(value)}")
        fail(path, "must not be empty")
    raise WorkloadError(file, path, text)  # any other finding of the validator, in its own words


def load_workload(path: str | os.PathLike[str]) -> Scenario:
    """Read and validate a workload file (format: ``docs/workload-format.md``).

    Args:
        path: The JSON file.

    Returns:
        The scenario it describes. ``name`` defaults to the file's stem, ``system`` to
        ``""``; without a ``facts`` list, the facts are the probes' expected values
        (label = value, scope = the probe's scope). ``meta`` records the source file.

    Raises:
        WorkloadError: The file cannot be read, is not JSON, or breaks the format; the
            message names the file, the JSON path and the problem.
    """
    file = os.fspath(path)
    fail = _Fail(file)
    data = _read_json(file)
    if isinstance(data, dict):
        top = cast(dict[str, object], data)
        if "session_id" in top and "state" in top and "turns" not in top:
            fail("", "this is an AgentSession export, not a workload file; load it with --session (load_session)")
        _check_version(fail, top)
    spec = _convert(file, data, _Workload, _Workload)
    tools = _tools(fail, spec.tools)
    declared = [t.name for t in tools]
    if not spec.turns:
        fail("turns", "must list at least one turn")
    turns: list[Turn] = []
    first_seen: dict[str, int] = {}
    for index, turn in enumerate(spec.turns):
        where = f"turns[{index}]"
        if turn.user in first_seen:
            problem = f"repeats the text of turns[{first_seen[turn.user]}].user; user texts must be unique"
            fail(f"{where}.user", problem)
        first_seen[turn.user] = index
        turns.append(_turn(fail, turn, where, declared))
    facts = _facts_of_probes(turns) if isinstance(spec.facts, UnsetType) else _facts(fail, spec.facts, "facts")
    try:
        return Scenario(
            name=Path(file).stem if isinstance(spec.name, UnsetType) else spec.name,
            system=spec.system,
            tools=tuple(tools),
            turns=tuple(turns),
            facts=tuple(facts),
            meta={"source": "workload", "file": file, "version": spec.version},
        )
    except ValueError as exc:  # the checks above should have caught it first
        raise WorkloadError(file, "", str(exc)) from exc


def load_facts(path: str | os.PathLike[str]) -> tuple[Fact, ...]:
    """Read a facts file: a JSON list of ``{"label", "value", "scope"}`` objects.

    Raises:
        WorkloadError: As for :func:`load_workload`, with paths like ``[2].value``.
    """
    file = os.fspath(path)
    return tuple(_facts(_Fail(file), _convert(file, _read_json(file), list[_Fact], _Fact), ""))


def _check_version(fail: _Fail, top: Mapping[str, object]) -> None:
    supported = f"this loader reads version {SUPPORTED_VERSION}"
    if "version" not in top:
        fail("version", f"required field is missing ({supported})")
    version = top["version"]
    if not isinstance(version, int) or isinstance(version, bool):
        fail("version", f"expected an integer, got {_shown(version)} ({supported})")
    if version > SUPPORTED_VERSION:
        fail("version", f"{version} is newer than this loader supports; {supported}")
    if version < SUPPORTED_VERSION:
        fail("version", f"{version} is not a version of the format; {supported}")


def _tools(fail: _Fail, specs: Sequence[_Tool]) -> list[ToolSpec]:
    tools: list[ToolSpec] = []
    seen: dict[str, int] = {}
    for index, spec in enumerate(specs):
        where = f"tools[{index}]"
        if spec.name in seen:
            fail(
                f"{where}.name", f"repeats tools[{seen[spec.name]}].name {_shown(spec.name)}; tool names must be unique"
            )
        if spec.name == RECALL_TOOL:
            fail(f"{where}.name", f"{_shown(spec.name)} is reserved for the harness's record tool")
        seen[spec.name] = index
        if isinstance(spec.parameters, UnsetType):
            tools.append(ToolSpec(spec.name, spec.description))
            continue
        kind = spec.parameters.get("type", "object")
        if kind != "object":
            problem = f'the parameters schema must have "type": "object", got {_shown(kind)}'
            fail(f"{where}.parameters.type", problem)
        tools.append(ToolSpec(spec.name, spec.description, spec.parameters))
    return tools


def _facts(fail: _Fail, specs: Sequence[_Fact], where: str) -> list[Fact]:
    seen: dict[str, int] = {}
    for index, spec in enumerate(specs):
        if spec.label in seen:
            problem = f"repeats {_join(where, seen[spec.label])}.label; fact labels must be unique"
            fail(_join(_join(where, index), "label"), problem)
        seen[spec.label] = index
    return [Fact(spec.label, spec.value, spec.scope) for spec in specs]


def _facts_of_probes(turns: Sequence[Turn]) -> list[Fact]:
    """One fact per distinct expected value, in probe order: label = value, scope = the probe's."""
    facts: dict[str, Fact] = {}
    for turn in turns:
        if turn.probe is not None:
            for value in turn.probe.expected:
                facts.setdefault(value, Fact(value, value, turn.probe.scope))
    return list(facts.values())


def _turn(fail: _Fail, spec: _Turn, where: str, declared: Sequence[str]) -> Turn:
    calls: list[ToolCall] = []
    for number, call in enumerate(spec.calls):
        if call.name not in declared:
            known = ", ".join(declared) if declared else "none"
            fail(
                f"{where}.calls[{number}].name", f"{_shown(call.name)} is not a declared tool (declared tools: {known})"
            )
        media = _media(fail, call.media, f"{where}.calls[{number}].media")
        calls.append(ToolCall(name=call.name, arguments=call.arguments, result=call.result, media=media))
    probe: Probe | None = None
    if not isinstance(spec.probe, UnsetType):
        if not spec.probe.expected:
            fail(f"{where}.probe.expected", "must list at least one value a correct answer quotes")
        for index, value in enumerate(spec.probe.expected):
            if value in spec.probe.expected[:index]:
                fail(f"{where}.probe.expected[{index}]", f"lists {_shown(value)} twice")
        if spec.reply:
            problem = (
                "a probe turn has no scripted reply (the model answers it from its context); remove reply or probe"
            )
            fail(f"{where}.reply", problem)
        probe = Probe(scope=spec.probe.scope, expected=tuple(spec.probe.expected))
    media = _media(fail, spec.media, f"{where}.media")
    return Turn(user=spec.user, calls=tuple(calls), reply=spec.reply, probe=probe, media=media)


def _media(fail: _Fail, specs: Sequence[_Media], where: str) -> tuple[Media, ...]:
    media: list[Media] = []
    for index, spec in enumerate(specs):
        at = f"{where}[{index}]"
        if isinstance(spec.uri, UnsetType) == isinstance(spec.data, UnsetType):
            fail(at, 'give exactly one of "uri" and "data"' + ("" if isinstance(spec.uri, UnsetType) else ", not both"))
        if not isinstance(spec.uri, UnsetType):
            media.append(Media(spec.media_type, uri=spec.uri))
            continue
        data = "".join(cast(str, spec.data).split())
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            fail(f"{at}.data", f"not valid base64 ({exc})")
        media.append(Media(spec.media_type, data=data))
    return tuple(media)


# ----------------------------------------------------------------------------------------
# Session exports
# ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _DraftCall:
    name: str
    arguments: Mapping[str, Any]
    result: str = ""
    media: list[Media] = field(default_factory=list[Media])
    answered: bool = False


@dataclass(slots=True)
class _DraftTurn:
    user: str
    media: list[Media] = field(default_factory=list[Media])
    calls: list[_DraftCall] = field(default_factory=list[_DraftCall])
    reply: str = ""
    pending: dict[str, _DraftCall] = field(default_factory=dict[str, _DraftCall])


@dataclass(slots=True)
class _Tally:
    """What the session reader skipped, kept or changed; it ends up in ``Scenario.meta``."""

    skipped_notes: int = 0
    skipped_summaries: int = 0
    skipped_before_first_user: int = 0
    skipped_recall_calls: int = 0
    excluded_replayed: int = 0
    restored_results: int = 0
    orphan_results: int = 0
    unanswered_calls: int = 0
    dropped_contents: int = 0
    renamed_turns: int = 0

    def worth_a_log(self) -> bool:
        """Whether anything was skipped, left unmatched or renamed (reported at INFO)."""
        return any(
            v for k, v in asdict(self).items() if k not in ("excluded_replayed", "restored_results", "dropped_contents")
        )


def load_session(
    path: str | os.PathLike[str],
    facts_path: str | os.PathLike[str] | None = None,
    *,
    source_id: str | None = None,
) -> Scenario:
    """Turn the messages stored in an ``AgentSession.to_dict()`` export into a scenario.

    Accepts what ``json.dumps(session.to_dict())`` writes and ``FileSessionStore`` JSON snapshots;
    how messages become turns, what is skipped and what ``meta`` counts: ``docs/workload-format.md``,
    "Session exports".

    Args:
        path: The export.
        facts_path: A facts file (:func:`load_facts`); without one, the planted-looking values
            (``TL-3FA9C2``) found in user texts and tool results.
        source_id: The history provider whose messages to read; needed only when the export
            holds several and none is ``in_memory``.

    Raises:
        WorkloadError: Not a session export, an unknown snapshot version, no stored messages,
            or a bad facts file; the message names the file.
    """
    file = os.fspath(path)
    fail = _Fail(file)
    session = _session(fail, _read_json(file))
    source, messages = _history(fail, session, source_id)
    tally = _Tally()
    system: list[str] = []
    drafts = _drafts(messages, tally, system)
    if not drafts:
        fail(f"state.{source}.messages", "no user message found: nothing to replay")
    tools: dict[str, ToolSpec] = {}
    turns: list[Turn] = []
    for draft, user in zip(drafts, _unique_texts([d.user for d in drafts], tally), strict=True):
        calls: list[ToolCall] = []
        for call in draft.calls:
            tally.unanswered_calls += not call.answered
            tools.setdefault(call.name, ToolSpec(call.name, f"A tool the recorded session called ({call.name})."))
            calls.append(ToolCall(call.name, call.arguments, call.result, tuple(call.media)))
        turns.append(Turn(user=user, calls=tuple(calls), reply=draft.reply, media=tuple(draft.media)))
    if facts_path is not None:
        facts, facts_source = load_facts(facts_path), "file"
    else:
        facts, facts_source = _found_facts(turns), "found"
    meta: dict[str, Any] = {
        "source": "session",
        "file": file,
        "session_id": session.session_id,
        "history": source,
        "messages": len(messages),
        "facts_source": facts_source,
    }
    meta |= asdict(tally)
    if tally.worth_a_log():
        logger.info(
            "Session %s: %d turns; %s", file, len(turns), ", ".join(f"{k}={v}" for k, v in asdict(tally).items())
        )
    try:
        return Scenario(
            name=Path(file).stem,
            system="\n\n".join(system),
            tools=tuple(tools.values()),
            turns=tuple(turns),
            facts=facts,
            meta=meta,
        )
    except ValueError as exc:  # unique texts and declared tools are ensured above
        raise WorkloadError(file, "", str(exc)) from exc


def _session(fail: _Fail, data: object) -> AgentSession:
    """The session in an export, restored by the framework."""
    not_export = (
        'not an AgentSession export (expected an object with "type": "session", "session_id" and "state", '
        "as json.dumps(session.to_dict()) writes)"
    )
    if not isinstance(data, dict):
        fail("", f"{not_export}; got {_shown(data)}")
    top = cast(dict[str, object], data)
    if "turns" in top and "state" not in top:
        fail("", "this is a workload file, not a session export; load it with --workload (load_workload)")
    if top.get("type", "session") != "session" or not isinstance(top.get("session_id"), str):
        fail("", not_export)
    if not isinstance(top.get("state"), dict):
        fail("state", f"expected an object, got {_shown(top.get('state'))}")
    version = top.get("version")
    if version is not None and version != SESSION_SNAPSHOT_VERSION:
        fail(
            "version",
            f"unknown session schema version {_shown(version)}; this loader reads AgentSession.to_dict() exports "
            f'and FileSessionStore snapshots of version "{SESSION_SNAPSHOT_VERSION}"',
        )
    try:
        return AgentSession.from_dict(dict(top))
    except Exception as exc:  # a damaged export: whatever the framework's decoders raise
        fail("", f"the framework cannot restore this session export: {exc}")


def _history(fail: _Fail, session: AgentSession, source_id: str | None) -> tuple[str, list[Message]]:
    """The source id and the stored messages of the history provider to replay."""
    found = {
        key: cast(list[object], value["messages"])
        for key, value in session.state.items()
        if isinstance(value, dict) and isinstance(value.get("messages"), list)
    }
    if source_id is not None:
        if source_id not in found:
            others = ", ".join(found) or "none"
            fail(f"state.{source_id}", f"no stored messages for this source id (histories found: {others})")
        chosen = source_id
    elif not found:
        fail(
            "state",
            "no stored messages found: no history provider kept a messages list in this session "
            "(service-side sessions and FileHistoryProvider keep messages outside the export)",
        )
    elif len(found) == 1:
        chosen = next(iter(found))
    elif InMemoryHistoryProvider.DEFAULT_SOURCE_ID in found:
        chosen = InMemoryHistoryProvider.DEFAULT_SOURCE_ID
    else:
        fail("state", f"several histories hold messages ({', '.join(found)}); choose one with source_id")
    messages: list[Message] = []
    for index, item in enumerate(found[chosen]):
        where = f"state.{chosen}.messages[{index}]"
        if isinstance(item, Message):
            messages.append(item)
            continue
        if not isinstance(item, dict):
            fail(where, f"expected a message object, got {_shown(item)}")
        try:
            messages.append(Message.from_dict(cast(dict[str, Any], item)))
        except Exception as exc:  # the framework's own decoder decides what a message is
            fail(where, f"not a message the framework can read: {exc}")
    if not messages:
        fail(f"state.{chosen}.messages", "no messages found: the list is empty")
    return chosen, messages


def _is_summary(message: Message) -> bool:
    """A summary a framework strategy inserted (assistant role, its own id prefix, links to originals)."""
    if message.role == "user":
        return False
    if message.message_id is not None and message.message_id.startswith(SUMMARY_ID_PREFIXES):
        return True
    group = message.additional_properties.get(GROUP_ANNOTATION_KEY)
    return isinstance(group, dict) and SUMMARY_OF_MESSAGE_IDS_KEY in group


def _drafts(messages: Sequence[Message], tally: _Tally, system: list[str]) -> list[_DraftTurn]:
    """Group the original conversation into turns."""
    drafts: list[_DraftTurn] = []
    recall_ids: set[str] = set()
    for message in messages:
        props = message.additional_properties
        if props.get(NOTE_KEY):
            tally.skipped_notes += 1
            continue
        if _is_summary(message):
            tally.skipped_summaries += 1
            continue
        tally.excluded_replayed += bool(props.get(EXCLUDED_KEY))
        if message.role == "system":
            if message.text:
                system.append(message.text)
            continue
        media = [m for m in map(_media_of, message.contents) if m is not None]
        if message.role == "user" and (message.text or media):
            drafts.append(_DraftTurn(user=message.text, media=media))
            tally.dropped_contents += sum(c.type not in ("text", "data", "uri") for c in message.contents)
            continue
        if not drafts:
            tally.skipped_before_first_user += 1
            continue
        _add_to_turn(drafts[-1], message, tally, recall_ids)
    return drafts


def _add_to_turn(turn: _DraftTurn, message: Message, tally: _Tally, recall_ids: set[str]) -> None:
    for index, content in enumerate(message.contents):
        if content.type == "function_call":
            if content.name == RECALL_TOOL:
                tally.skipped_recall_calls += 1
                recall_ids.add(content.call_id or "")
                continue
            if not content.name:
                tally.dropped_contents += 1
                continue
            call = _DraftCall(content.name, content.parse_arguments() or {})
            turn.calls.append(call)
            if content.call_id:
                turn.pending[content.call_id] = call
        elif content.type == "function_result":
            if content.call_id in recall_ids:
                continue
            call = turn.pending.pop(content.call_id or "", None)
            if call is None:
                tally.orphan_results += 1
                continue
            call.result, restored = _result_text(content, message, index)
            tally.restored_results += restored
            call.media = [m for m in map(_media_of, content.items or ()) if m is not None]
            call.answered = True
        elif content.type not in ("text", "usage"):
            tally.dropped_contents += 1
    if message.role == "assistant" and message.text.strip():
        turn.reply = message.text


def _result_text(content: Content, message: Message, index: int) -> tuple[str, bool]:
    """The result's text, the original one when maf-compaction shortened it in place."""
    originals = message.additional_properties.get(ORIGINALS_KEY)
    if isinstance(originals, dict) and content.call_id:
        for key in (content.call_id, f"{content.call_id}#{index}"):
            original = cast(dict[str, object], originals).get(key)
            if isinstance(original, str):
                return original, True
    result = content.result
    if isinstance(result, str):
        return result, False
    if result is None:
        return "\n".join(c.text for c in content.items or () if c.type == "text" and c.text), False
    return json.dumps(result, default=str, ensure_ascii=False), False


def _media_of(content: Content) -> Media | None:
    """A ``data`` or ``uri`` part as :class:`Media`; ``None`` for anything else."""
    if content.type == "uri" and content.uri:
        return Media(content.media_type or UNKNOWN_MEDIA_TYPE, uri=content.uri)
    if content.type != "data" or not content.uri or not content.uri.startswith("data:"):
        return None
    header, _, payload = content.uri[len("data:") :].partition(",")
    params = header.split(";")
    media_type = content.media_type or params[0] or UNKNOWN_MEDIA_TYPE
    if "base64" in params[1:]:
        return Media(media_type, data=payload)
    return Media(media_type, data=base64.b64encode(urllib.parse.unquote_to_bytes(payload)).decode("ascii"))


def _unique_texts(texts: Sequence[str], tally: _Tally) -> Iterator[str]:
    """The turns' user texts made unique: later repeats get `` (turn N)``, empty ones ``(turn N)``."""
    originals = set(texts)
    used: set[str] = set()
    for number, text in enumerate(texts, start=1):
        candidate = text if text.strip() else f"(turn {number})"
        if candidate in used or (candidate != text and candidate in originals):
            candidate = f"{text} (turn {number})" if text.strip() else candidate
            extra = 2
            base = candidate
            while candidate in used or candidate in originals:
                candidate = f"{base} #{extra}"
                extra += 1
        if candidate != text:
            tally.renamed_turns += 1
        used.add(candidate)
        yield candidate


def _found_facts(turns: Sequence[Turn]) -> tuple[Fact, ...]:
    """Planted-looking values in user texts and tool results, first sighting wins."""
    facts: dict[str, Fact] = {}
    for number, turn in enumerate(turns, start=1):
        texts = [turn.user, *(c.result for c in turn.calls)]
        for text in texts:
            for value in PLANTED_VALUE.findall(text):
                facts.setdefault(value, Fact(value, value, f"turn {number}"))
    return tuple(facts.values())
