"""One envelope for every strategy state, and one strict reader for it.

Every state a strategy keeps between passes (the anchored sheds, the record decisions,
the user-summary answers, and any kind added later) is written as one JSON-safe object::

    {"kind": K, "version": V, ...fields}

The *kind* says whose state it is, so a snapshot handed to the wrong strategy is refused
instead of misread. The *version* says which layout it has, so a snapshot written by a
newer build is refused with :class:`SnapshotVersionError` instead of being guessed at.

Reading is strict because a snapshot *is* decisions: a field that is missing, mistyped,
out of range, duplicated or inconsistent with its neighbours would be replayed as a
decision nobody made, on both lists and on every replica. So every reader refuses such a
snapshot with a :class:`SnapshotError` that names the field path, e.g.
``snapshot field 'ask.targets': duplicate position 3``.

Usage, for a new kind of state: declare the value once, as a frozen dataclass whose
annotations carry the constraints, and declare its envelope once with a :class:`Schema`::

    @dataclass(frozen=True, slots=True)
    class RecallState:
        ignored_streak: Count = 0
        pin_disabled: bool = False

    Schema("recall", 1, RecallState)
    dump(state)              # {"kind": "recall", "version": 1, "ignored_streak": 0, ...}
    load(RecallState, data)  # header, exactly the fields, types and ranges: msgspec

One :func:`dump` / :func:`load` pair serves every kind: a field whose type has a schema
is a nested envelope (read with its own header and field paths), any other field is read
by msgspec through a Struct derived from the annotations (:func:`wire`), so no field name
is written twice. The schema also declares what a type cannot state: the older versions
still read (each with its reader), the consistency checks run once a value is read
(distinct positions, watermarks; raising :func:`error`), and the few fields stored under
another name, inline (``flat``) or in another shape (``stored``). Values stay dataclasses
(not msgspec Structs) because logic code builds and ``dataclasses.replace``s them everywhere.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from types import UnionType
from typing import Annotated, Any, Final, Generic, TypeGuard, TypeVar, Union, cast, get_args, get_origin, get_type_hints

import msgspec
from msgspec import Meta
from pyrsistent import pmap

from .errors import SnapshotError, SnapshotVersionError

T = TypeVar("T")

#: The largest count or position a snapshot may hold (the largest signed 32-bit integer).
#: No conversation reaches two billion groups, messages, turns or summaries, so a larger
#: number is corruption. Bounding it when the snapshot is read keeps such a number from
#: reaching a watermark comparison or a ``range``; whether a count fits the history it is
#: applied to can only be checked at step time.
MAX_COUNT: Final = 2**31 - 1

_SHOWN_LIMIT: Final = 60

#: A count or position: an integer (never a bool) in ``[0, MAX_COUNT]``.
Count = Annotated[int, Meta(ge=0, le=MAX_COUNT)]
#: A count of at least one.
Positive = Annotated[int, Meta(ge=1, le=MAX_COUNT)]
#: A string with at least one non-space character.
Text = Annotated[str, Meta(pattern=r"\S")]
#: A ``[position, count]`` pair.
Pair = tuple[Count, Count]


def is_int(value: object) -> TypeGuard[int]:
    """An ``int`` that is not a ``bool`` (JSON has no booleans-as-numbers; ``True == 1`` must not pass)."""
    return isinstance(value, int) and not isinstance(value, bool)


def shown(value: object) -> str:
    """``repr(value)``, cut short: an error message must not carry a whole corrupt snapshot."""
    text = repr(value)
    return text if len(text) <= _SHOWN_LIMIT else f"{text[: _SHOWN_LIMIT - 3]}..."


def _a(kind: str) -> str:
    """``a 'records'``, ``an 'anchored'``."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind!r}"


def _listed(names: Sequence[object]) -> str:
    return ", ".join(repr(n) for n in names)


# -- msgspec: values declared once, as frozen dataclasses ------------------------------------------------
#
# State values stay frozen dataclasses (logic code builds them and ``dataclasses.replace``s them);
# their annotations (:data:`Count`, :data:`Text`, ...) are the schema. msgspec reads the plain
# ones (not enveloped) through a *wire* Struct derived from those annotations: every field
# required, unknown fields refused, strict types and constraints. A field declared with
# ``compare=False`` is a memo and is never stored.


@cache
def _wire_type(tp: Any) -> Any:
    """``tp`` with every dataclass in it replaced by its wire Struct."""
    if dataclasses.is_dataclass(tp):
        return wire(cast("type", tp))
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return Annotated[(_wire_type(args[0]), *tp.__metadata__)]  # pyright: ignore[reportUnknownMemberType]
    if origin in (Union, UnionType):
        return Union[tuple(_wire_type(a) for a in args)]  # noqa: UP007
    if origin is tuple:
        return tuple[tuple(a if a is Ellipsis else _wire_type(a) for a in args)]
    return tp


@cache
def wire(cls: type) -> Any:
    """The msgspec Struct a plain (not enveloped) dataclass ``cls`` is read through."""
    fields = [(attribute, _wire_type(hint)) for attribute, _, hint in _layout(cls)]
    return msgspec.defstruct(f"Stored{cls.__name__}", fields, forbid_unknown_fields=True, kw_only=True)


_PROBLEMS: Final = (
    ("Expected `int` >= 1", f"an integer in [1, {MAX_COUNT}]"),
    ("Expected `int", f"an integer in [0, {MAX_COUNT}]"),
    ("Expected `bool", "true or false"),
    ("Expected `str", "a non-empty string"),
    ("Expected `object", "an object"),
    ("Expected `array` of length 2", "a [position, count] pair"),
    ("Expected `array", "a list"),
)


def _choices(wire: Any, path: str) -> str | None:
    """The values the choice field at ``path`` of ``wire`` allows, said in a list ("null, 'a' or 'b'"), or ``None``."""
    info: Any = msgspec.inspect.type_info(wire)
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
    said = [
        "null" if isinstance(t, msgspec.inspect.NoneType) else repr(v)
        for t in options
        for v in (getattr(t, "values", None) or (None,))
    ]
    if not any(isinstance(t, msgspec.inspect.LiteralType) for t in options):
        return None
    return said[0] if len(said) == 1 else f"{', '.join(said[:-1])} or {said[-1]}"


def _translated(error: msgspec.ValidationError, data: object, prefix: str, wire: Any) -> SnapshotError:
    """msgspec's error as a :class:`SnapshotError` naming the field the way every reader does."""
    problem, _, where = str(error).partition(" - at `$")
    where = where.rstrip("`").lstrip(".")
    path = f"{prefix}{'.' if prefix and where[:1] != '[' else ''}{where}" if where else prefix
    named = re.fullmatch(r"Object (missing required|contains unknown) field `(.+)`", problem)
    if named is not None:
        field = f"{path}.{named[2]}" if path else named[2]
        missing = named[1] == "missing required"
        return SnapshotError(
            f"snapshot field {field!r} is missing" if missing else f"unknown snapshot field(s) {field!r}"
        )
    value = data
    for key in re.findall(r"[^.\[\]]+", where):
        value = cast("Any", value)[int(key) if key.isdigit() and isinstance(value, (list, tuple)) else key]
    words = next((w for p, w in _PROBLEMS if problem.startswith(p)), None)
    if problem.startswith("Invalid enum value"):
        words = _choices(wire, where)
    said = f"must be {words}, got {shown(value)}" if words else f"{problem} (got {shown(value)})"
    return SnapshotError(f"snapshot field {path!r}: {said}")


#: Reads an older version's header-checked envelope into the current version's fields.
Upgrade = Callable[[Mapping[str, object]], Mapping[str, object]]
#: A value's checks once read: ``(value, version, keep_head_groups) -> value`` (may normalise it).
Check = Callable[[Any, int, "int | None"], Any]
#: A field stored in another shape: ``(stored type, to stored, from stored)``.
Codec = tuple[Any, Callable[[Any], Any], Callable[[Any], Any]]
_EMPTY: Final[Mapping[Any, Any]] = pmap()


@dataclass(frozen=True, slots=True)
class Schema(Generic[T]):
    """How one kind of state value is stored: ``{"kind": kind, "version": version, ...its fields}``.

    Attributes:
        kind: The ``"kind"`` tag.
        version: The version this build writes.
        type: The frozen dataclass it stores; its annotations are the field types.
        older: Older versions this build still reads, each with its reader (``None``: the same fields).
        check: The value's consistency checks once read (see :data:`Check`).
        rename: Fields stored under another name.
        flat: A field whose value's fields are stored inline, beside this value's own.
        stored: Fields stored in another shape (see :data:`Codec`).
    """

    kind: str
    version: int
    type: type[T]
    older: Mapping[int, Upgrade | None] = _EMPTY
    check: Check | None = None
    rename: Mapping[str, str] = _EMPTY
    flat: str | None = None
    stored: Mapping[str, Codec] = _EMPTY

    def __post_init__(self) -> None:
        if self.kind:  # not the plain dataclasses' layout
            SCHEMAS[self.type] = self


#: Every enveloped value class and its schema (filled by :class:`Schema`); plain dataclasses have none.
SCHEMAS: Final[dict[type, Schema[Any]]] = {}
_PLAIN: Final[Schema[Any]] = Schema("", 0, object)


@cache
def _layout(cls: type) -> tuple[tuple[str, str, Any], ...]:
    """``(attribute, stored name, type)`` of each stored field of ``cls`` (a ``compare=False`` memo is not)."""
    schema, hints = SCHEMAS.get(cls, _PLAIN), get_type_hints(cls, include_extras=True)
    return tuple(
        (f.name, schema.rename.get(f.name, f.name), hints[f.name]) for f in dataclasses.fields(cls) if f.compare
    )


def names(cls: type) -> tuple[str, ...]:
    """The stored field names of the enveloped class ``cls``, in order (a flat field's own inline)."""
    flat = SCHEMAS[cls].flat
    return tuple(n for attribute, name, hint in _layout(cls) for n in (names(hint) if attribute == flat else (name,)))


def dump(value: object) -> Any:
    """``value`` as JSON-safe data: an enveloped dataclass as its envelope, tuples as lists."""
    if isinstance(value, (tuple, list)):
        return [dump(v) for v in cast("tuple[object, ...]", value)]
    if not dataclasses.is_dataclass(value):
        return value
    schema = SCHEMAS.get(type(value), _PLAIN)
    data: dict[str, object] = {"kind": schema.kind, "version": schema.version} if schema.kind else {}
    for attribute, name, _ in _layout(type(value)):
        item = getattr(value, attribute)
        if attribute == schema.flat:
            data |= {k: v for k, v in dump(item).items() if k not in ("kind", "version")}
        else:
            data[name] = dump(schema.stored[attribute][1](item) if attribute in schema.stored else item)
    return data


def load(cls: type[T], data: object, *, keep_head_groups: int | None = None) -> T:
    """Read the envelope ``data`` strictly as ``cls`` (``keep_head_groups`` reaches every nested check).

    Raises:
        SnapshotVersionError: The version is not one this build reads.
        SnapshotError: Anything else is wrong; the message names the field.
    """
    schema: Schema[T] = SCHEMAS[cls]
    mapping = header(schema.kind, tuple(sorted({schema.version, *schema.older})), data)
    version = cast("int", mapping["version"])
    upgrade = schema.older.get(version)
    fields = exactly(mapping, names(cls)) if upgrade is None else upgrade(mapping)
    value = _read(cls, fields, keep_head_groups)
    return value if schema.check is None else schema.check(value, version, keep_head_groups)


def _read(cls: type[T], fields: Mapping[str, object], keep_head_groups: int | None) -> T:
    schema, values = SCHEMAS[cls], dict[str, object]()
    for attribute, name, hint in _layout(cls):
        if attribute == schema.flat:
            values[attribute] = _read(hint, fields, keep_head_groups)
        elif hint in SCHEMAS:
            values[attribute] = load(hint, inner(fields, name), keep_head_groups=keep_head_groups)
        elif attribute in schema.stored:
            kind, _, into = schema.stored[attribute]
            values[attribute] = into(convert(fields[name], kind, name))
        else:
            values[attribute] = convert(fields[name], hint, name)
    return cls(**values)


def convert(data: object, kind: Any, path: str = "") -> Any:
    """``data`` read strictly as ``kind`` (a value type: dataclasses, tuples, annotated scalars)."""
    wire_type = _wire_type(kind)
    try:
        msgspec.convert(data, wire_type, strict=True)
    except msgspec.ValidationError as error:
        raise _translated(error, data, path, wire_type) from None
    return msgspec.convert(data, kind, strict=True)


def opened(kind: str, layouts: Mapping[int, Sequence[str]], data: object) -> Mapping[str, object]:
    """An envelope's fields: a mapping, a ``version`` of ``layouts``, then ``kind``, then exactly its fields.

    Raises:
        SnapshotVersionError: The version is not in ``layouts`` (a newer build wrote it,
            or it is not an integer).
        SnapshotError: Anything else about the envelope is wrong.
    """
    mapping = header(kind, tuple(sorted(layouts)), data)
    return exactly(mapping, layouts[cast("int", mapping["version"])])


def exactly(mapping: Mapping[str, object], names: Sequence[str]) -> Mapping[str, object]:
    """``mapping`` (a header-checked envelope), refused unless it holds exactly the fields ``names``."""
    missing = [n for n in names if n not in mapping]
    if len(missing) == 1:
        raise SnapshotError(f"snapshot field {missing[0]!r} is missing")
    if missing:
        raise SnapshotError(f"snapshot fields {_listed(missing)} are missing")
    unknown = [k for k in mapping if k not in {*names, "kind", "version"}]
    if unknown:
        raise SnapshotError(f"unknown snapshot field(s) {_listed(unknown)} (expected {', '.join(names)})")
    return mapping


def inner(data: Mapping[str, object], name: str) -> Mapping[str, object]:
    """The nested object ``data[name]``."""
    value = data[name]
    if not isinstance(value, Mapping):
        raise error(name, f"must be an object, got {shown(value)}")
    return cast("Mapping[str, object]", value)


def header(kind: str, supported: tuple[int, ...], data: object) -> Mapping[str, object]:
    """Check an envelope's header: a mapping, its ``kind``, then a supported ``version``.

    The kind comes first: a version counts only within its kind, so another kind's
    version says nothing about this reader's.
    """
    if not isinstance(data, Mapping):
        raise SnapshotError(f"{_a(kind)} snapshot must be a mapping, got {type(data).__name__}")
    mapping = cast("Mapping[str, object]", data)
    if mapping.get("kind") != kind:
        got = "no kind" if "kind" not in mapping else f"kind {shown(mapping.get('kind'))}"
        raise SnapshotError(f"expected {_a(kind)} snapshot, got {got}")
    if "version" not in mapping:
        raise SnapshotError(f"snapshot field 'version' is missing ({_a(kind)} snapshot names its version)")
    version = mapping["version"]
    if not is_int(version) or version not in supported:
        raise SnapshotVersionError(version, supported, kind=kind)
    return mapping


def error(path: str, problem: str) -> SnapshotError:
    """A :class:`SnapshotError` about the field at ``path``; for a reader's consistency checks."""
    return SnapshotError(f"snapshot field {path!r}: {problem}")


def distinct(path: str, values: Sequence[Hashable], *, what: str = "position") -> None:
    """Refuse a repeated value: a duplicate would otherwise merge or shadow silently."""
    seen: set[Hashable] = set()
    for value in values:
        if value in seen:
            raise error(path, f"duplicate {what} {shown(value)}")
        seen.add(value)
