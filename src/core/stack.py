"""The state of a whole compaction stack, as one JSON-safe value a session can carry.

A *stack* is what one conversation needs to compact with records: a strategy (the record
strategy alone, or the composition of records and user-turn summaries), the recall gate
and the recall middleware. Every decision of the stack lives in the conversation's one
:class:`~.state.State` (the recall protocol's state and the gate's one-shot permission,
``state.recall.armed``, included), so the stack's whole behavioural state is::

    {"kind": "stack", "version": 5,
     "strategy": "records" | "composition",   # which strategy the state is read for
     "state": {...}}                          # the State's fields

A session stores it under its registry's key with the fingerprint of the configuration
that wrote it (:class:`StackConfiguration`, :func:`session_entry_to_dict`), one version
at the top: any registry whose builder makes a stack with the same fingerprint continues
the session, whichever instance (or process) wrote it, and one whose builder differs is
refused with :class:`StackConfigurationError` naming the parameters that differ.

Every reader is strict (see :mod:`.envelope`): a malformed entry raises
:class:`~.errors.SnapshotError` naming the field, another build's
:class:`~.errors.SnapshotVersionError`, and a stack of another kind than the one the
builder makes raises :class:`StackKindError` naming both kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

import msgspec
from msgspec.structs import replace

from .envelope import VERSION, Stored, Text, body, convert, error, read
from .errors import SnapshotError
from .fingerprint import Parameters, Scalar, differences, digest
from .state import State

StackKind = Literal["records", "composition"]
STACK_KINDS: Final[tuple[StackKind, ...]] = ("records", "composition")


class StackKindError(SnapshotError):
    """The stored stack holds another strategy's state than the one the builder makes.

    Attributes:
        stored: The kind in the snapshot.
        built: The kind of the stack it was read into.
    """

    def __init__(self, stored: str, built: str) -> None:
        self.stored = stored
        self.built = built
        super().__init__(
            f"snapshot field 'strategy': the stored stack is a {stored!r} stack but the builder makes a {built!r} "
            "stack; keep the builder's configuration stable across restores, delete the entry to start the "
            "session's compaction afresh, or give a differently configured registry its own state_key"
        )

    def _arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.stored, self.built), {}


@dataclass(frozen=True, slots=True)
class StackConfiguration:
    """The fingerprint of a stack's configuration: every parameter that changes a decision.

    Attributes:
        parameters: Each parameter by its dotted path (``strategy.records.keep_tail_groups``,
            ``tokenizer.encoding``), as a JSON scalar.
        digest: A digest of ``parameters``, compared first.
    """

    parameters: Parameters
    digest: str

    @classmethod
    def of(cls, parameters: Parameters) -> StackConfiguration:
        """The fingerprint of ``parameters``."""
        return cls(dict(parameters), digest(parameters))

    def to_dict(self) -> dict[str, object]:
        """The JSON-safe form a session entry carries."""
        return {"digest": self.digest, "parameters": dict(self.parameters)}


class StackConfigurationError(SnapshotError):
    """A session's compaction state was written under another configuration than the builder's.

    A state restored under another budget, tail, policy, mode or tokenizer would continue
    with decisions the new configuration would not make, so it is refused instead.

    Attributes:
        stored: The parameters in the session entry.
        built: The parameters of the stack the builder makes.
        state_key: The key the entry is stored under.
        differing: ``(parameter, stored value, built value)`` for each difference.
    """

    def __init__(self, stored: Parameters, built: Parameters, *, state_key: str) -> None:
        self.stored = dict(stored)
        self.built = dict(built)
        self.state_key = state_key
        self.differing = differences(stored, built)
        shown = "; ".join(
            f"{name} is {_shown(old)} in the stored entry, {_shown(new)} in this builder's stack"
            for name, old, new in self.differing[:5]
        )
        if len(self.differing) > 5:
            shown += f"; and {len(self.differing) - 5} more"
        shown = shown or "the fingerprints differ"
        super().__init__(
            f"session state under state_key {state_key!r} was written under another configuration: {shown}. "
            "Keep the builder's configuration the same on every replica and across restores; "
            "to change it on purpose, call registry.migrate(session) to carry the stored decisions over to the new "
            "configuration, or delete the entry to start this session's compaction afresh (its history stays)"
        )

    def _arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.stored, self.built), {"state_key": self.state_key}


def _shown(value: Scalar) -> str:
    return "missing" if value is None else repr(value)


class StackState(Stored, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A stack's whole behavioural state: the conversation's one value and the strategy it is read for.

    Attributes:
        kind: Which strategy the state belongs to (stored as ``strategy``).
        state: The conversation's one state value (the recall protocol's state, the gate's
            permission included, is inside it).
    """

    KIND: ClassVar[str] = "stack"

    kind: StackKind = msgspec.field(name="strategy")
    state: State

    @property
    def armed(self) -> bool:
        """The gate's one-shot permission to record (``recall.armed`` of the state)."""
        return self.state.recall.armed

    @classmethod
    def from_dict(  # pyright: ignore[reportIncompatibleMethodOverride]
        cls, data: object, *, kind: StackKind, keep_head_groups: int | None = None
    ) -> StackState:
        """Read :meth:`to_dict`'s output strictly into a stack of ``kind``.

        Raises:
            StackKindError: The snapshot holds another kind of stack.
            SnapshotVersionError: Another build's version wrote it.
            SnapshotError: It is malformed; the message names the field.
        """
        return cls.read_fields(body(cls.KIND, data), kind=kind, keep_head_groups=keep_head_groups)

    @classmethod
    def read_fields(
        cls, fields: Mapping[str, object], *, kind: StackKind, keep_head_groups: int | None = None
    ) -> StackState:
        """A stack's fields (no header) read strictly into a stack of ``kind``."""
        stored = fields.get("strategy")
        if stored in STACK_KINDS and stored != kind:
            raise StackKindError(str(stored), kind)
        return read(cls, fields, keep_head_groups=keep_head_groups)

    def checked(self, *, path: str = "", keep_head_groups: int | None = None) -> StackState:
        """The value, its state checked."""
        at = f"{path}." if path else ""
        return replace(self, state=self.state.checked(path=f"{at}state", keep_head_groups=keep_head_groups))


def with_armed(state: State, armed: bool) -> State:
    """``state`` with the gate's one-shot permission (``recall.armed``) set to ``armed``."""
    return replace(state, recall=replace(state.recall, armed=armed))


class _Configuration(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    digest: Text
    parameters: dict[str, str | int | float | bool | None]


#: The kind of a session's entry.
SESSION_KIND: Final = "session_compaction"


def session_entry_to_dict(configuration: StackConfiguration, stack: StackState) -> dict[str, object]:
    """What a registry stores in a session: the fingerprint of the configuration that wrote it and the stack's
    fields, under one header."""
    fields = stack.to_dict()
    del fields["kind"], fields["version"]
    return {"kind": SESSION_KIND, "version": VERSION, "configuration": configuration.to_dict(), **fields}


def session_entry_from_dict(data: object) -> tuple[StackConfiguration, Mapping[str, object]]:
    """``(configuration, stack fields)`` of a stored entry; the fields are read by :meth:`StackState.read_fields`."""
    fields = body(SESSION_KIND, data)
    if "configuration" not in fields:
        raise SnapshotError("snapshot field 'configuration' is missing")
    stored = convert(fields["configuration"], _Configuration, "configuration")
    try:
        found = StackConfiguration.of(stored.parameters)
    except ValueError as failure:  # a non-finite number: not JSON
        raise error("configuration.parameters", f"must hold JSON scalars only: {failure}") from failure
    if stored.digest != found.digest:
        # The digest is compared first when a registry checks an entry: one that does not match its
        # parameters would let an entry of another configuration through.
        raise error(
            "configuration.digest", f"must be the digest of the parameters ({found.digest}), got {stored.digest!r}"
        )
    return found, {k: v for k, v in fields.items() if k != "configuration"}
