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
from dataclasses import dataclass, replace
from typing import Final

from .envelope import Count, Schema, distinct, dump, error, load

DECISIONS_KIND: Final = "records"
DECISIONS_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class Ask:
    """An outstanding request for a record of an uncovered batch.

    Attributes:
        targets: Ordinals of the tool groups the ask is for: the batch that was
            uncovered when it was made. Groups that arrive later wait for the next ask.
        records_at_ask: Records the model had written when the ask was made
            (:func:`~.records.records_written`: replaced ones count); a higher count
            later means the asked-for record arrived.
        responses_at_ask: Model responses when the ask was made (:func:`~.records.responses`);
            two more without a new record mean the ask failed.
        taken: The recall middleware has taken the ask (``take_reforce``): each ask pins
            one request at most.
    """

    targets: tuple[Count, ...]
    records_at_ask: Count
    responses_at_ask: Count
    taken: bool = False


@dataclass(frozen=True, slots=True)
class RecordDecisions:
    """Every decision of the record strategy that history cannot show.

    Attributes:
        settled: Ordinals of uncovered groups held for good: an ask for them ended
            without covering any of them. A later record that quotes them releases them.
        ask: The outstanding ask, if any.
    """

    settled: tuple[Count, ...] = ()
    ask: Ask | None = None

    def to_dict(self) -> dict[str, object]:
        """A JSON-safe dict in the one snapshot envelope (``kind``, ``version``, then the fields)."""
        return dump(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RecordDecisions:
        """Read decisions written by :meth:`to_dict`, strictly (every field present, typed, consistent).

        No configuration is checked, because none changes what the decisions mean: a
        group is named by its ordinal among *all* the conversation's tool groups, the
        head included, so ``keep_head_groups`` does not shift it (a settled group that a
        larger head now covers is simply never judged), and the counts at the ask are
        counts of the conversation, not of a parameter.

        Raises:
            SnapshotVersionError: They were written by a newer or unknown schema version.
            SnapshotError: They are malformed or inconsistent.
        """
        return load(cls, data)


def _check(decisions: RecordDecisions, _version: int, _head: int | None) -> RecordDecisions:
    """Stored decisions, checked against the invariants the ask chain keeps; positions sorted.

    Settled groups are a set. An ask is made for the uncovered groups that are not
    settled, and continued for the rest of its own batch only, so it names at least one
    group and none that is settled (a settled group is never asked for again).
    """
    distinct("settled", decisions.settled)
    ask = decisions.ask
    if ask is not None:
        distinct("ask.targets", ask.targets)
        if not ask.targets:
            raise error("ask.targets", "must name at least one group")
        overlap = sorted(set(ask.targets) & set(decisions.settled))
        if overlap:
            raise error("ask.targets", f"position {overlap[0]} is also settled (a settled group is never asked for)")
        ask = replace(ask, targets=tuple(sorted(ask.targets)))
    return RecordDecisions(tuple(sorted(decisions.settled)), ask)


DECISIONS_SCHEMA: Final = Schema(DECISIONS_KIND, DECISIONS_VERSION, RecordDecisions, check=_check)
