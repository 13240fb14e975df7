"""How a state value is stored: ``{"kind": K, "version": 5, ...its fields}``, read strictly by msgspec.

Every state value is a frozen ``msgspec.Struct`` (:class:`Stored`); its annotations are its
schema (:data:`Count`, :data:`Text`...). Stored alone it carries a header: its *kind*, so a
value handed to the wrong reader is refused instead of misread, and one *version*, at the
top only (nested values have none), so a value written by another build is refused with
:class:`SnapshotVersionError` instead of being guessed at; an older release's (:data:`READS`) is
upgraded as it is read, each field it lacked set to what that release decided without it.

Reading is strict because a stored state *is* decisions: a field that is missing, mistyped,
out of range, unknown, duplicated or inconsistent would be replayed as a decision nobody
made, on every copy of the conversation. msgspec checks the types and ranges; every field
must be present (:func:`present`); each value's ``checked`` refuses what its type cannot say.
Every refusal is a :class:`SnapshotError` that names the field path, e.g.
``snapshot field 'records.ask.targets': duplicate position 3``.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping, Sequence
from typing import Annotated, Any, ClassVar, Final, Self, TypeVar, cast

import msgspec
from msgspec import Meta

from . import fingerprint
from .checks import shown
from .errors import SnapshotError, SnapshotVersionError

T = TypeVar("T")

#: The format this build writes. It started at 1 with the first release's format; 5 adds
#: ``recall.ignored_summaries`` and ``recall.seen.pending_tokens`` (2 to 4 were pre-release builds' formats, which
#: no release reads: their entries are refused with a :class:`SnapshotVersionError` naming their version).
VERSION: Final = 5
#: The versions this build reads: an older one is upgraded as it is read (:func:`_upgraded`).
READS: Final = (1, VERSION)
#: The largest count or position a snapshot may hold: no conversation reaches two billion groups, messages,
#: turns or summaries, so a larger number is corruption (and never reaches a ``range``).
MAX_COUNT: Final = 2**31 - 1

#: A count or position: an integer (never a bool) in ``[0, MAX_COUNT]``.
Count = Annotated[int, Meta(ge=0, le=MAX_COUNT)]
#: A count of at least one.
Positive = Annotated[int, Meta(ge=1, le=MAX_COUNT)]
#: A string with at least one non-space character.
Text = Annotated[str, Meta(pattern=r"\S")]
#: A ``[position, count]`` pair.
Pair = tuple[Count, Count]


class Stored(msgspec.Struct, frozen=True, kw_only=True):
    """A state value that can be stored alone (``to_dict``) and read back strictly (``from_dict``)."""

    KIND: ClassVar[str] = ""

    def to_dict(self) -> dict[str, object]:
        """The value as JSON-safe data under its header (``kind``, ``version``, then the fields)."""
        fields = cast("dict[str, object]", msgspec.json.decode(msgspec.json.encode(self)))
        return {"kind": self.KIND, "version": VERSION, **fields}

    @classmethod
    def from_dict(cls, data: object, *, keep_head_groups: int | None = None) -> Self:
        """Read :meth:`to_dict`'s output strictly (``keep_head_groups``: the head anchored positions must have).

        Raises:
            SnapshotVersionError: Another build's version wrote it.
            SnapshotError: Anything else is wrong; the message names the field.
        """
        return read(cls, body(cls.KIND, data), keep_head_groups=keep_head_groups)

    def checked(self, *, path: str = "", keep_head_groups: int | None = None) -> Self:
        """The value once read, refused when inconsistent (``path`` prefixes field names); normalised."""
        del path, keep_head_groups
        return self


S = TypeVar("S", bound=Stored)


def body(kind: str, data: object) -> dict[str, object]:
    """The fields of a stored value of ``kind``: its header checked (a mapping, the kind, then the version)."""
    if not isinstance(data, Mapping):
        raise SnapshotError(f"{_a(kind)} snapshot must be a mapping, got {type(data).__name__}")
    mapping = cast("Mapping[str, object]", data)
    if mapping.get("kind") != kind:
        got = "no kind" if "kind" not in mapping else f"kind {shown(mapping.get('kind'))}"
        raise SnapshotError(f"expected {_a(kind)} snapshot, got {got}")
    if "version" not in mapping:
        raise SnapshotError(f"snapshot field 'version' is missing ({_a(kind)} snapshot names its version)")
    version = mapping["version"]
    if type(version) is not int or version not in READS:
        raise SnapshotVersionError(version, READS, kind=kind)
    fields = {k: v for k, v in mapping.items() if k not in ("kind", "version")}
    return fields if version == VERSION else cast("dict[str, object]", _upgraded(fields))


#: :data:`.recall.IGNORED_LIMIT`: the streak at which summaries go to the summarizer for good (what version 1's
#: ``summaries_to_summarizer`` meant).
_GIVEN_UP_STREAK: Final = 2


#: Configuration parameters version 5 added: by the parameter each stands beside, its name there and the value
#: that decides as version 1 did.
_ADDED_PARAMETERS: Final = {".pin_rule.min_groups_before_repeat": (".pin_rule.repeat_tokens", None)}


def _upgraded_configuration(fields: dict[str, object]) -> dict[str, object]:
    """A stored configuration (``digest``, ``parameters``) of version 1 with the parameters version 5 added, at the
    values that decide as version 1 did, and its digest for them; one whose digest does not match its parameters is
    left as stored, for the reader to refuse."""
    parameters = dict(cast("Mapping[str, fingerprint.Scalar]", fields["parameters"]))
    try:
        if fields["digest"] != fingerprint.digest(parameters):
            return fields
    except (TypeError, ValueError):  # not JSON scalars: the reader names it
        return fields
    for name in list(parameters):
        for beside, (added, value) in _ADDED_PARAMETERS.items():
            if name.endswith(beside):
                new = name.removesuffix(beside) + added
                if new in parameters:
                    raise SnapshotError(f"unknown configuration parameter {new!r}: version 1 has no such parameter")
                parameters[new] = value
    return {**fields, "parameters": parameters, "digest": fingerprint.digest(parameters)}


def _upgraded(data: object) -> object:
    """``data`` of version 1 as version 5 writes it, at what version 1 decided without the fields it lacked, wherever
    the values are nested: every recall state (the only value that holds ``summaries_to_summarizer``) gains
    ``ignored_summaries`` (summaries sent to the summarizer stayed there for good: the streak at its limit; else 0),
    and every last request seen (the only value that holds ``pending_groups``) ``pending_tokens``, 0 (no record was
    due by size alone; the next request seen counts them); a session entry's configuration gains the parameters
    version 5 added (:func:`_upgraded_configuration`)."""
    if isinstance(data, Mapping):
        fields = {k: _upgraded(v) for k, v in cast("Mapping[str, object]", data).items()}
        for marker, added in (("summaries_to_summarizer", "ignored_summaries"), ("pending_groups", "pending_tokens")):
            if marker in fields and added in fields:
                raise SnapshotError(f"unknown snapshot field(s) {added!r}: version 1 has no such field")
        if "summaries_to_summarizer" in fields:
            fields["ignored_summaries"] = _GIVEN_UP_STREAK if fields["summaries_to_summarizer"] is True else 0
        if "pending_groups" in fields:
            fields["pending_tokens"] = 0
        if isinstance(fields.get("parameters"), Mapping) and isinstance(fields.get("digest"), str):
            return _upgraded_configuration(fields)
        return fields
    if isinstance(data, list):
        return [_upgraded(item) for item in cast("list[object]", data)]
    return data


def read(cls: type[S], data: object, *, path: str = "", keep_head_groups: int | None = None) -> S:
    """``data`` (a value's fields) read strictly as ``cls``, then checked."""
    return convert(data, cls, path).checked(path=path, keep_head_groups=keep_head_groups)


def convert(data: object, kind: Any, path: str = "") -> Any:
    """``data`` read strictly as ``kind``: every field present, types and ranges by msgspec."""
    present(data, msgspec.inspect.type_info(kind), path)
    try:
        return msgspec.convert(data, kind, strict=True)
    except msgspec.ValidationError as failure:
        raise _translated(failure, data, path, kind) from None


def present(data: object, info: Any, path: str) -> None:
    """Refuse ``data`` when a Struct it is read as misses a field (msgspec would fill in its default) or has fields
    it does not know (all of them are named; msgspec names the first)."""
    if isinstance(info, msgspec.inspect.UnionType):
        for option in info.types:
            present(data, option, path)
    elif isinstance(info, msgspec.inspect.StructType) and isinstance(data, Mapping):
        fields = cast("Mapping[str, object]", data)
        known = [f.encode_name for f in info.fields]
        missing = [repr(_field(path, name)) for name in known if name not in fields]
        if missing:
            many = len(missing) > 1
            raise SnapshotError(
                f"snapshot field{'s' if many else ''} {', '.join(missing)} {'are' if many else 'is'} missing"
            )
        unknown = [repr(_field(path, name)) for name in fields if name not in known]
        if unknown:
            raise SnapshotError(f"unknown snapshot field(s) {', '.join(unknown)}")
        for f in info.fields:
            present(fields[f.encode_name], f.type, _field(path, f.encode_name))
    elif isinstance(info, msgspec.inspect.VarTupleType | msgspec.inspect.ListType) and isinstance(data, list | tuple):
        for index, item in enumerate(cast("Sequence[object]", data)):
            present(item, info.item_type, f"{path}[{index}]")


_PROBLEMS: Final = (
    ("Expected `int` >= 1", f"an integer in [1, {MAX_COUNT}]"),
    ("Expected `int", f"an integer in [0, {MAX_COUNT}]"),
    ("Expected `bool", "true or false"),
    ("Expected `str", "a non-empty string"),
    ("Expected `object", "an object"),
    ("Expected `array` of length 2", "a [position, count] pair"),
    ("Expected `array", "a list"),
)


def _translated(failure: msgspec.ValidationError, data: object, prefix: str, kind: Any) -> SnapshotError:
    """msgspec's error as a :class:`SnapshotError` naming the field the way every reader does."""
    problem, _, where = str(failure).partition(" - at `$")
    where = where.rstrip("`").lstrip(".")
    path = f"{prefix}{'.' if prefix and where[:1] != '[' else ''}{where}" if where else prefix
    unknown = re.fullmatch(r"Object contains unknown field `(.+)`", problem)
    if unknown is not None:
        return SnapshotError(f"unknown snapshot field(s) {_field(path, unknown[1])!r}")
    value = data
    for key in re.findall(r"[^.\[\]]+", where):
        value = cast("Any", value)[int(key) if key.isdigit() and isinstance(value, list | tuple) else key]
    words = next((w for p, w in _PROBLEMS if problem.startswith(p)), None)
    if problem.startswith("Invalid enum value"):
        words = _choices(kind, where)
    said = f"must be {words}, got {shown(value)}" if words else f"{problem} (got {shown(value)})"
    return SnapshotError(f"snapshot field {path!r}: {said}")


def _choices(kind: Any, path: str) -> str | None:
    """The values the choice field at ``path`` of ``kind`` allows, in a list ("null, 'a' or 'b'"), or ``None``."""
    info: Any = msgspec.inspect.type_info(kind)
    for key in re.findall(r"[^.\[\]]+", path):
        if isinstance(info, msgspec.inspect.UnionType):
            info = next(t for t in info.types if not isinstance(t, msgspec.inspect.NoneType))
        if isinstance(info, msgspec.inspect.StructType):
            info = next(f.type for f in info.fields if f.encode_name == key)
        elif isinstance(info, msgspec.inspect.TupleType):
            info = info.item_types[int(key)]
        else:
            info = getattr(info, "item_type", info)
    options = info.types if isinstance(info, msgspec.inspect.UnionType) else (info,)
    if not any(isinstance(t, msgspec.inspect.LiteralType | msgspec.inspect.EnumType) for t in options):
        return None
    said: list[str] = []
    for option in options:
        if isinstance(option, msgspec.inspect.NoneType):
            said.append("null")
        elif isinstance(option, msgspec.inspect.EnumType):
            said += [repr(member.value) for member in option.cls]
        else:
            said += [repr(v) for v in getattr(option, "values", ())]
    return said[0] if len(said) == 1 else f"{', '.join(said[:-1])} or {said[-1]}"


def error(path: str, problem: str) -> SnapshotError:
    """A :class:`SnapshotError` about the field at ``path``; for a value's consistency checks."""
    return SnapshotError(f"snapshot field {path!r}: {problem}")


def distinct(path: str, values: Sequence[Hashable], *, what: str = "position") -> None:
    """Refuse a repeated value: a duplicate would otherwise merge or shadow silently."""
    seen: set[Hashable] = set()
    for value in values:
        if value in seen:
            raise error(path, f"duplicate {what} {shown(value)}")
        seen.add(value)


def _field(path: str, name: str) -> str:
    """The path of field ``name`` of the value at ``path``."""
    return f"{path}.{name}" if path else name


def _a(kind: str) -> str:
    """``a 'records'``, ``an 'anchored'``."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind!r}"
