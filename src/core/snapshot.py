"""The anchored strategy's decisions, as a versioned, JSON-safe value.

Every decision is a watermark or a short list over band positions, so the snapshot
stays small however long the conversation grows, and the same snapshot means the same
sheds on the in-call copies, on the stored history and after a restore.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from .envelope import Envelope, Fields
from .errors import SnapshotError

SNAPSHOT_KIND: Final = "anchored"
SNAPSHOT_VERSION: Final = 1
ANCHORED_ENVELOPE: Final = Envelope(
    SNAPSHOT_KIND,
    SNAPSHOT_VERSION,
    (
        "tools_shed",
        "texts_shed",
        "shortened",
        "spared_tools",
        "spared_texts",
        "shed_sizes",
        "keep_head_groups",
    ),
)
SUPPORTED_SNAPSHOT_VERSIONS: Final = ANCHORED_ENVELOPE.supported


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
        keep_head_groups: The head size the positions were counted under (``None``
            before the first pass); positions mean nothing under another head.
    """

    tools_shed: int = 0
    texts_shed: int = 0
    shortened: int = 0
    spared_tools: tuple[int, ...] = ()
    spared_texts: tuple[int, ...] = ()
    shed_sizes: tuple[tuple[int, int], ...] = ()
    keep_head_groups: int | None = None

    def to_dict(self) -> dict[str, object]:
        """A JSON-safe dict in the one snapshot envelope (``kind``, ``version``, then the fields)."""
        return ANCHORED_ENVELOPE.write(
            {
                "tools_shed": self.tools_shed,
                "texts_shed": self.texts_shed,
                "shortened": self.shortened,
                "spared_tools": list(self.spared_tools),
                "spared_texts": list(self.spared_texts),
                "shed_sizes": [list(pair) for pair in self.shed_sizes],
                "keep_head_groups": self.keep_head_groups,
            }
        )

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
        fields = ANCHORED_ENVELOPE.read(data)
        snapshot = cls(
            tools_shed=fields.count("tools_shed"),
            texts_shed=fields.count("texts_shed"),
            shortened=fields.count("shortened"),
            spared_tools=fields.positions("spared_tools"),
            spared_texts=fields.positions("spared_texts"),
            shed_sizes=fields.pairs("shed_sizes"),
            keep_head_groups=fields.optional("keep_head_groups", fields.count),
        )
        _check(snapshot, fields)
        error = None if keep_head_groups is None else snapshot.config_error(keep_head_groups=keep_head_groups)
        if error is not None:
            raise error
        return snapshot

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


def _check(snapshot: AnchoredSnapshot, fields: Fields) -> None:
    """The invariants :func:`~maf_compaction.core.anchored.step` keeps, refused when broken.

    - A spared position is one a shed passed over, so it lies below its lane's watermark.
    - A size is recorded only for a tool group that was shed: below ``tools_shed`` and
      not spared.
    - Positions are counted under a head, so a snapshot holding any decision names it.
    """
    for name, spared, shed, watermark in (
        ("spared_tools", snapshot.spared_tools, snapshot.tools_shed, "tools_shed"),
        ("spared_texts", snapshot.spared_texts, snapshot.texts_shed, "texts_shed"),
    ):
        beyond = [p for p in spared if p >= shed]
        if beyond:
            raise fields.error(name, f"position {beyond[0]} is not below {watermark}={shed}")
    spared_tools = set(snapshot.spared_tools)
    for position, _ in snapshot.shed_sizes:
        if position >= snapshot.tools_shed:
            raise fields.error("shed_sizes", f"position {position} is not below tools_shed={snapshot.tools_shed}")
        if position in spared_tools:
            raise fields.error("shed_sizes", f"position {position} is spared, so it was never shed")
    decided = snapshot.tools_shed or snapshot.texts_shed or snapshot.shortened
    if snapshot.keep_head_groups is None and decided:
        raise fields.error(
            "keep_head_groups",
            "null, but the snapshot holds decisions; their positions mean nothing without the head they were "
            "counted under",
        )
