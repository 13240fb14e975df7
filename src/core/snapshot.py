"""The anchored strategy's decisions, as a versioned, JSON-safe value.

Every decision is a watermark or a short list over band positions, so the snapshot
stays small however long the conversation grows, and the same snapshot means the same
sheds on the in-call copies, on the stored history and after a restore.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final

from .envelope import Count, Pair, Schema, distinct, dump, error, exactly, load, names
from .errors import SnapshotError

SNAPSHOT_KIND: Final = "anchored"
SNAPSHOT_VERSION: Final = 2


@dataclass(frozen=True, slots=True)
class AnchoredSnapshot:
    """Every decision the anchored strategy has made, as watermarks over band positions.

    Attributes:
        tools_shed: Band tool groups at positions below this are shed...
        texts_shed: ...and band assistant replies at positions below this.
        shortened: Band tool groups at positions below this are committed to being
            shortened (the minimum-gain floor accepted them; it never takes that back).
        spared_tools: Positions below ``tools_shed`` a shed passed over because they
            were preserved at the time; they are never shed later by replay.
        spared_texts: The same for assistant replies.
        shed_sizes: ``(position, members)`` of each shed tool group when it was shed.
            A group that grows since (a result arriving for a shed call, a tool message
            joining its run) is shed whole again, and the newcomers are reported.
        distilled: Positions of band tool groups whose results were cut to the lines
            that carry their distinctive values (:mod:`.distill`): groups no record
            covered, distilled over the budget before any shed was considered.
        keep_head_groups: The head size the positions were counted under (``None``
            before the first pass); positions mean nothing under another head.
    """

    tools_shed: Count = 0
    texts_shed: Count = 0
    shortened: Count = 0
    spared_tools: tuple[Count, ...] = ()
    spared_texts: tuple[Count, ...] = ()
    shed_sizes: tuple[Pair, ...] = ()
    distilled: tuple[Count, ...] = ()
    keep_head_groups: Count | None = None

    def to_dict(self) -> dict[str, object]:
        """A JSON-safe dict in the one snapshot envelope (``kind``, ``version``, then the fields)."""
        return dump(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object], *, keep_head_groups: int | None = None) -> AnchoredSnapshot:
        """Read a snapshot written by :meth:`to_dict`, strictly.

        Every field must be present, typed, in range and consistent with the others (see
        :func:`_check`). Pass the restoring strategy's ``keep_head_groups`` to also refuse
        a snapshot made under another head (see :meth:`config_error`); restores do.

        Raises:
            SnapshotVersionError: It was written by a newer or unknown schema version.
            SnapshotError: It is malformed, inconsistent, or made under another head.
        """
        return load(cls, data, keep_head_groups=keep_head_groups)

    def config_error(self, *, keep_head_groups: int) -> SnapshotError | None:
        """Why this snapshot cannot be restored into a strategy with ``keep_head_groups``, or ``None``.

        Of the anchored parameters only the head changes what a position names: band
        positions count from the first group after the head, so under another head every
        watermark and spared position would name other groups (and shed the wrong ones).
        The tail only moves where the band ends, and the budget, ``band_share`` and
        ``keep_tokens`` only change how much a position keeps, not which group it is, so
        they are not checked. A snapshot made before the first pass names no head
        (``None``) and holds no decisions (:func:`_check` refuses one that does), so it
        fits any head.
        """
        made = self.keep_head_groups
        if made is None or made == keep_head_groups:
            return None
        return SnapshotError(
            f"snapshot field 'keep_head_groups': the snapshot was made with keep_head_groups={made}, this "
            f"strategy has keep_head_groups={keep_head_groups}; positions would name other groups"
        )


def _check(snapshot: AnchoredSnapshot, _version: int, keep_head_groups: int | None) -> AnchoredSnapshot:
    """The invariants :func:`~maf_compaction.core.anchored.step` keeps, refused when broken; positions sorted.

    - A position list is a set: no duplicates (order carries nothing).
    - A spared position is one a shed passed over, so it lies below its lane's watermark.
    - A size is recorded only for a tool group that was shed: below ``tools_shed`` and
      not spared.
    - Positions are counted under a head, so a snapshot holding any decision names it, and
      it is refused under another ``keep_head_groups`` (see :meth:`AnchoredSnapshot.config_error`).
    """
    distinct("spared_tools", snapshot.spared_tools)
    distinct("spared_texts", snapshot.spared_texts)
    distinct("shed_sizes", [p for p, _ in snapshot.shed_sizes])
    distinct("distilled", snapshot.distilled)
    snapshot = replace(
        snapshot,
        distilled=tuple(sorted(snapshot.distilled)),
        spared_tools=tuple(sorted(snapshot.spared_tools)),
        spared_texts=tuple(sorted(snapshot.spared_texts)),
        shed_sizes=tuple(sorted(snapshot.shed_sizes)),
    )
    for name, spared, shed, watermark in (
        ("spared_tools", snapshot.spared_tools, snapshot.tools_shed, "tools_shed"),
        ("spared_texts", snapshot.spared_texts, snapshot.texts_shed, "texts_shed"),
    ):
        beyond = [p for p in spared if p >= shed]
        if beyond:
            raise error(name, f"position {beyond[0]} is not below {watermark}={shed}")
    spared_tools = set(snapshot.spared_tools)
    for position, _ in snapshot.shed_sizes:
        if position >= snapshot.tools_shed:
            raise error("shed_sizes", f"position {position} is not below tools_shed={snapshot.tools_shed}")
        if position in spared_tools:
            raise error("shed_sizes", f"position {position} is spared, so it was never shed")
    decided = snapshot.tools_shed or snapshot.texts_shed or snapshot.shortened or snapshot.distilled
    if snapshot.keep_head_groups is None and decided:
        raise error(
            "keep_head_groups",
            "null, but the snapshot holds decisions; their positions mean nothing without the head they were "
            "counted under",
        )
    refused = None if keep_head_groups is None else snapshot.config_error(keep_head_groups=keep_head_groups)
    if refused is not None:
        raise refused
    return snapshot


def _undistilled(stored: Mapping[str, object]) -> Mapping[str, object]:
    """Version 1 had no distillation: nothing was distilled."""
    return {**exactly(stored, [n for n in names(AnchoredSnapshot) if n != "distilled"]), "distilled": []}


ANCHORED_SCHEMA: Final = Schema(
    SNAPSHOT_KIND, SNAPSHOT_VERSION, AnchoredSnapshot, older={1: _undistilled}, check=_check
)
