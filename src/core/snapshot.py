"""The anchored strategy's decisions, as a versioned, JSON-safe value.

Every decision is a watermark or a short list over band positions, so the snapshot
stays small however long the conversation grows, and the same snapshot means the same
sheds on the in-call copies, on the stored history and after a restore.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, cast

from .errors import SnapshotError, SnapshotVersionError

SNAPSHOT_KIND: Final = "anchored"
SNAPSHOT_VERSION: Final = 1
SUPPORTED_SNAPSHOT_VERSIONS: Final = (1,)


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
        """A JSON-safe dict with an explicit kind and version."""
        return {
            "kind": SNAPSHOT_KIND,
            "version": SNAPSHOT_VERSION,
            "tools_shed": self.tools_shed,
            "texts_shed": self.texts_shed,
            "shortened": self.shortened,
            "spared_tools": list(self.spared_tools),
            "spared_texts": list(self.spared_texts),
            "shed_sizes": [list(pair) for pair in self.shed_sizes],
            "keep_head_groups": self.keep_head_groups,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> AnchoredSnapshot:
        """Read a snapshot written by :meth:`to_dict`; refuses newer or malformed ones."""
        if not isinstance(data, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise SnapshotError(f"an anchored snapshot must be a mapping, got {type(data).__name__}")
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version not in SUPPORTED_SNAPSHOT_VERSIONS:
            raise SnapshotVersionError(version, SUPPORTED_SNAPSHOT_VERSIONS)
        if data.get("kind") != SNAPSHOT_KIND:
            raise SnapshotError(f"expected an {SNAPSHOT_KIND!r} snapshot, got kind {data.get('kind')!r}")
        return cls(
            tools_shed=count_field(data, "tools_shed"),
            texts_shed=count_field(data, "texts_shed"),
            shortened=count_field(data, "shortened"),
            spared_tools=positions_field(data, "spared_tools"),
            spared_texts=positions_field(data, "spared_texts"),
            shed_sizes=sizes_field(data, "shed_sizes"),
            keep_head_groups=None if data.get("keep_head_groups") is None else count_field(data, "keep_head_groups"),
        )


def count_field(data: Mapping[str, object], name: str) -> int:
    value = data.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SnapshotError(f"snapshot field {name!r} must be a non-negative integer, got {value!r}")
    return value


def sizes_field(data: Mapping[str, object], name: str) -> tuple[tuple[int, int], ...]:
    value = data.get(name, [])
    if not isinstance(value, (list, tuple)):
        raise SnapshotError(f"snapshot field {name!r} must be a list of [position, members] pairs, got {value!r}")
    pairs: dict[int, int] = {}
    for item in cast("Sequence[object]", value):
        numbers = list(cast("Sequence[object]", item)) if isinstance(item, (list, tuple)) else []
        if len(numbers) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
            raise SnapshotError(f"snapshot field {name!r} must hold [position, members] pairs, got {item!r}")
        pairs[cast(int, numbers[0])] = cast(int, numbers[1])
    return tuple(sorted(pairs.items()))


def positions_field(data: Mapping[str, object], name: str) -> tuple[int, ...]:
    value = data.get(name, [])
    if not isinstance(value, (list, tuple)):
        raise SnapshotError(f"snapshot field {name!r} must be a list of positions, got {value!r}")
    positions: list[int] = []
    for item in cast("Sequence[object]", value):
        if not isinstance(item, int) or isinstance(item, bool) or item < 0:
            raise SnapshotError(f"snapshot field {name!r} must hold non-negative integers, got {item!r}")
        positions.append(item)
    return tuple(sorted(set(positions)))
