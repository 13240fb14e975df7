"""The record strategy's decisions, as a versioned, JSON-safe value.

Coverage itself is recomputed from the history and its records on every pass, so the
only decisions to remember are the ones history cannot show: which uncovered tool
groups were *settled* (asked for twice without success, held for good until a later
record quotes them) and the one outstanding *ask* for a record of an uncovered batch.
Groups are named by their ordinal among the conversation's tool groups, which is the
same on the in-call copies, on the stored history and after a restore.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, cast

from .errors import SnapshotError, SnapshotVersionError
from .snapshot import count_field, positions_field

DECISIONS_KIND: Final = "records"
DECISIONS_VERSION: Final = 1
SUPPORTED_DECISIONS_VERSIONS: Final = (1,)


@dataclass(frozen=True, slots=True)
class Ask:
    """An outstanding request for a record of an uncovered batch.

    Attributes:
        targets: Ordinals of the tool groups the ask is for: the batch that was
            uncovered when it was made. Groups that arrive later wait for the next ask.
        records_at_ask: Records in the conversation when the ask was made; a higher
            count later means the asked-for record arrived.
        responses_at_ask: Assistant responses in the conversation when the ask was made;
            two more without a new record mean the ask failed.
        taken: The recall middleware has taken the ask (``take_reforce``): each ask pins
            one request at most.
    """

    targets: tuple[int, ...]
    records_at_ask: int
    responses_at_ask: int
    taken: bool = False


@dataclass(frozen=True, slots=True)
class RecordDecisions:
    """Every decision of the record strategy that history cannot show.

    Attributes:
        settled: Ordinals of uncovered groups held for good: an ask for them ended
            without covering any of them. A later record that quotes them releases them.
        ask: The outstanding ask, if any.
    """

    settled: tuple[int, ...] = ()
    ask: Ask | None = None

    def to_dict(self) -> dict[str, object]:
        """A JSON-safe dict with an explicit kind and version."""
        ask = self.ask
        return {
            "kind": DECISIONS_KIND,
            "version": DECISIONS_VERSION,
            "settled": list(self.settled),
            "ask": None
            if ask is None
            else {
                "targets": list(ask.targets),
                "records_at_ask": ask.records_at_ask,
                "responses_at_ask": ask.responses_at_ask,
                "taken": ask.taken,
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RecordDecisions:
        """Read decisions written by :meth:`to_dict`; refuses newer or malformed ones."""
        if not isinstance(data, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise SnapshotError(f"record decisions must be a mapping, got {type(data).__name__}")
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version not in SUPPORTED_DECISIONS_VERSIONS:
            raise SnapshotVersionError(version, SUPPORTED_DECISIONS_VERSIONS)
        if data.get("kind") != DECISIONS_KIND:
            raise SnapshotError(f"expected a {DECISIONS_KIND!r} snapshot, got kind {data.get('kind')!r}")
        raw_ask = data.get("ask")
        ask: Ask | None = None
        if raw_ask is not None:
            if not isinstance(raw_ask, Mapping):
                raise SnapshotError(f"snapshot field 'ask' must be a mapping or null, got {raw_ask!r}")
            fields = cast("Mapping[str, object]", raw_ask)
            taken = fields.get("taken", False)
            if not isinstance(taken, bool):
                raise SnapshotError(f"snapshot field 'ask.taken' must be a boolean, got {taken!r}")
            targets = positions_field(fields, "targets")
            if not targets:
                raise SnapshotError("snapshot field 'ask.targets' must name at least one group")
            ask = Ask(
                targets=targets,
                records_at_ask=count_field(fields, "records_at_ask"),
                responses_at_ask=count_field(fields, "responses_at_ask"),
                taken=taken,
            )
        return cls(settled=positions_field(data, "settled"), ask=ask)
