"""The state of a whole compaction stack, as one JSON-safe value a session can carry.

A *stack* is what one conversation needs to compact with records: a strategy (the record
strategy alone, or the composition of records and user-turn summaries), the recall gate
and the recall middleware. Every decision of the stack lives in one state value (the
strategy's, which holds the recall protocol's state too) plus the gate's one-shot
permission, so the stack's whole behavioural state is::

    {"kind": "stack", "version": 2,
     "strategy": "records" | "composition",   # which state "state" is
     "state": {...}}                          # a "record_state" or a "composition" snapshot

The gate's one-shot permission is part of the recall protocol's state
(``state.recall.armed``), so the one value carries everything. Version 1 stored it beside
the state (``"gate": {"armed": ...}``); it is still read.

A session stores it under its registry's key inside one more envelope that carries the
fingerprint of the configuration that wrote it (:class:`StackConfiguration`,
:func:`session_entry_to_dict`): any registry whose builder makes a stack with the same
fingerprint continues the session, whichever instance (or process) wrote it, and one
whose builder differs is refused with :class:`StackConfigurationError` naming the
parameters that differ.

Every reader is strict (see :mod:`.envelope`): a malformed entry raises
:class:`~.errors.SnapshotError` naming the field, a newer one
:class:`~.errors.SnapshotVersionError`, and a stack of another kind than the one the
builder makes raises :class:`StackKindError` naming both kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, cast

from .composition import CompositionState
from .envelope import Schema, Text, convert, dump, error, inner, load, opened
from .errors import SnapshotError
from .fingerprint import Parameters, Scalar, differences, digest, is_parameters
from .records import RecordState

StackKind = Literal["records", "composition"]
STACK_KINDS: Final[tuple[StackKind, ...]] = ("records", "composition")

STACK_FIELDS: Final = {1: ("strategy", "state", "gate"), 2: ("strategy", "state")}
#: Version 1 named the writing registry instance instead of its configuration; it is still read (unchecked).
SESSION_FIELDS: Final = {1: ("registry", "stack"), 2: ("configuration", "stack")}


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
        more = len(self.differing) - 5
        if more > 0:
            shown += f"; and {more} more"
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


@dataclass(frozen=True, slots=True)
class StackState:
    """A stack's whole behavioural state: one value (the gate's permission is in its recall state).

    Attributes:
        kind: Which strategy the state belongs to.
        state: The strategy's one state value (the recall protocol's state, the gate's
            permission included, is inside it).
    """

    kind: StackKind
    state: RecordState | CompositionState

    def __post_init__(self) -> None:
        actual: StackKind = "composition" if isinstance(self.state, CompositionState) else "records"
        if self.kind != actual:
            raise ValueError(f"kind must name the state's strategy ({actual!r}), got {self.kind!r}")

    @classmethod
    def of(cls, kind: StackKind, state: RecordState | CompositionState, armed: bool) -> StackState:
        """The stack state with the gate's permission set to ``armed``."""
        return cls(kind, with_armed(state, armed))

    @property
    def armed(self) -> bool:
        """The gate's one-shot permission to record (``recall.armed`` of the state)."""
        state = self.state
        return (state.records if isinstance(state, CompositionState) else state).recall.armed

    def to_dict(self) -> dict[str, object]:
        """The whole state as one JSON-safe, kind-tagged, versioned dict."""
        return dump(self)

    @classmethod
    def from_dict(cls, data: object, *, kind: StackKind, keep_head_groups: int | None = None) -> StackState:
        """Read :meth:`to_dict`'s output strictly into a stack of ``kind`` (version 1 too).

        Raises:
            StackKindError: The snapshot holds another kind of stack.
            SnapshotVersionError: It (or a state inside it) was written by a newer schema.
            SnapshotError: It is malformed; the message names the field.
        """
        fields = opened("stack", STACK_FIELDS, data)
        stored = fields["strategy"]
        if stored not in STACK_KINDS:
            raise error("strategy", f"must be one of {', '.join(STACK_KINDS)}, got {stored!r}")
        if stored != kind:
            raise StackKindError(str(stored), kind)
        state_type = CompositionState if kind == "composition" else RecordState
        value: RecordState | CompositionState = load(state_type, fields["state"], keep_head_groups=keep_head_groups)
        if fields["version"] == 1:  # the gate's permission was stored beside the state
            return cls.of(kind, value, convert(inner(fields, "gate"), _Gate, "gate").armed)
        return cls(kind, value)


#: Written by :func:`~.envelope.dump`; read by :meth:`StackState.from_dict`, which reads the state the builder makes.
STACK_SCHEMA: Final = Schema("stack", 2, StackState, rename={"kind": "strategy"})


def with_armed(state: RecordState | CompositionState, armed: bool) -> RecordState | CompositionState:
    """``state`` with the gate's one-shot permission (``recall.armed``) set to ``armed``."""
    if isinstance(state, CompositionState):
        return replace(state, records=replace(state.records, recall=replace(state.records.recall, armed=armed)))
    return replace(state, recall=replace(state.recall, armed=armed))


@dataclass(frozen=True, slots=True)
class _Gate:
    armed: bool


@dataclass(frozen=True, slots=True)
class _Configuration:
    digest: Text
    parameters: dict[str, str | int | float | bool | None]


def session_entry_to_dict(configuration: StackConfiguration, stack: Mapping[str, object]) -> dict[str, object]:
    """What a registry stores in a session: the stack's dict and the fingerprint of the configuration that wrote it."""
    return {"kind": "session_compaction", "version": 2, "configuration": configuration.to_dict(), "stack": dict(stack)}


def session_entry_from_dict(data: object) -> tuple[StackConfiguration | None, Mapping[str, object]]:
    """``(configuration, stack dict)`` of a stored entry; the stack dict is read by :meth:`StackState.from_dict`.

    The configuration is ``None`` for a version 1 entry, which named its writer instead.
    """
    fields = opened("session_compaction", SESSION_FIELDS, data)
    stack = inner(fields, "stack")
    if fields["version"] == 1:
        convert(fields["registry"], Text, "registry")
        return None, stack
    stored = convert(inner(fields, "configuration"), _Configuration, "configuration")
    parameters = stored.parameters
    if not is_parameters(parameters):
        raise error("configuration.parameters", "must be an object of parameter names to JSON scalars")
    try:
        found = StackConfiguration.of(cast("Parameters", parameters))
    except ValueError as failure:  # a non-finite number: not JSON
        raise error("configuration.parameters", f"must hold JSON scalars only: {failure}") from failure
    if stored.digest != found.digest:
        # The digest is compared first when a registry checks an entry: one that does not match its
        # parameters would let an entry of another configuration through.
        raise error(
            "configuration.digest", f"must be the digest of the parameters ({found.digest}), got {stored.digest!r}"
        )
    return found, stack
