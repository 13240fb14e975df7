"""The anchored strategy: a fixed head and tail, and a band changed only by position.

A prompt cache matches on an exact prefix, so a compaction that rewrites early history
re-bills everything behind the edit. This strategy decides from a group's *position*,
never from the conversation's current size:

- The first ``keep_head_groups`` groups and the last ``keep_tail_groups`` groups are the
  anchors and are never touched. The band is what lies between them.
- A tool result at band position ``p`` (oldest tool group = 0) keeps
  ``band_share * max_input_tokens / (p + 1)`` tokens (at least 150), head and tail,
  with a marker line between. Positions never move as the conversation grows, so a
  result is shortened once, when it ages into the band, and to the same bytes on every
  later pass: each turn changes only the suffix that newly aged into the band.
- Only when the prompt is over the ceiling are whole groups shed, oldest first, each
  leaving a note the model can see. One shed goes down to a low-water mark below the
  ceiling, so it frees room for several later turns and the prefix breaks once per
  batch, not every turn. Sheds are remembered as watermarks in the snapshot, so every
  later pass, and the other list (the in-call copies or the stored history), applies
  exactly the same ones.
- User and system turns, injected context, preserved messages and notes are never
  changed. When the anchors alone exceed the ceiling the pass ends over it and says so
  (honest overflow) rather than losing anything silently.

``MinimumGainAnchoredCompactionStrategy`` adds the break-even floor: a collapse that
would remove less than ``min_gain_fraction`` of the tokens behind its first edit is
declined while the prompt still fits, because re-billing the suffix would cost more
than the removal saves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from pyrsistent import pvector
from returns.result import Result, Success

from .counting import MESSAGE_OVERHEAD_TOKENS, Measure
from .errors import CompactionBudgetExceeded, SnapshotError, SnapshotVersionError
from .grouping import group_records
from .model import TOOL_CALL_KINDS, Group, History, MessageRecord, Part
from .shorten import shorten

DEFAULT_KEEP_HEAD_GROUPS: Final = 3
DEFAULT_KEEP_TAIL_GROUPS: Final = 4
DEFAULT_BAND_SHARE: Final = 0.25
#: The smallest allowance any band position keeps.
DEFAULT_KEEP_TOKENS: Final = 150
#: Share of the ceiling a shed goes down to. A quarter of the budget freed per shed
#: means one prefix break per several turns instead of one per turn.
DEFAULT_LOW_WATER_FRACTION: Final = 0.75
#: The break-even share at a 10x cached discount and about 20 turns left:
#: R > B(p - c)/(p + T c) with p = 1, c = 0.1, T = 20 gives 0.29 of B.
DEFAULT_MIN_GAIN_FRACTION: Final = 0.29

TOOL_NOTE_PREFIX: Final = "[compacted: an earlier tool call and its result"
TEXT_NOTE: Final = "[compacted: an earlier assistant reply]"

SNAPSHOT_KIND: Final = "anchored"
SNAPSHOT_VERSION: Final = 1
SUPPORTED_SNAPSHOT_VERSIONS: Final = (1,)


@dataclass(frozen=True, slots=True)
class AnchoredConfig:
    """Parameters of the anchored strategy; invalid values raise ``ValueError``.

    Attributes:
        max_input_tokens: The input budget (window minus output reservation).
        keep_head_groups: Groups at the start that are never touched.
        keep_tail_groups: Groups at the end that are never touched.
        keep_tokens: A fixed allowance for every band position, instead of the
            harmonic ``band_share`` rule.
        band_share: Share of the budget the oldest band result keeps.
        collapse_assistant_text: Also shed band assistant replies when shedding tool
            groups is not enough.
        low_water_fraction: A shed goes down to this share of the ceiling.
        min_gain_fraction: Decline a collapse that removes less than this share of the
            tokens behind its first edit (0 never declines).
    """

    max_input_tokens: int
    keep_head_groups: int = DEFAULT_KEEP_HEAD_GROUPS
    keep_tail_groups: int = DEFAULT_KEEP_TAIL_GROUPS
    keep_tokens: int | None = None
    band_share: float = DEFAULT_BAND_SHARE
    collapse_assistant_text: bool = True
    low_water_fraction: float = DEFAULT_LOW_WATER_FRACTION
    min_gain_fraction: float = 0.0

    def __post_init__(self) -> None:
        _require_int("max_input_tokens", self.max_input_tokens, minimum=1)
        _require_int("keep_head_groups", self.keep_head_groups, minimum=0)
        _require_int("keep_tail_groups", self.keep_tail_groups, minimum=0)
        if self.keep_tokens is not None:
            _require_int("keep_tokens", self.keep_tokens, minimum=0)
        if not _is_number(self.band_share) or not 0 < self.band_share <= 1:
            raise ValueError(f"band_share must be in (0, 1], got {self.band_share!r}")
        if not _is_number(self.low_water_fraction) or not 0 < self.low_water_fraction <= 1:
            raise ValueError(f"low_water_fraction must be in (0, 1], got {self.low_water_fraction!r}")
        if not _is_number(self.min_gain_fraction) or not 0 <= self.min_gain_fraction < 1:
            raise ValueError(f"min_gain_fraction must be in [0, 1), got {self.min_gain_fraction!r}")

    def allowance(self, position: int) -> int:
        """Tokens a tool result at band position ``position`` keeps."""
        if self.keep_tokens is not None:
            return self.keep_tokens
        return max(int(self.max_input_tokens * self.band_share / (position + 1)), DEFAULT_KEEP_TOKENS)


@dataclass(frozen=True, slots=True)
class AnchoredSnapshot:
    """Every decision the anchored strategy has made, as watermarks over band positions.

    Attributes:
        tools_shed: Band tool groups at positions below this are shed.
        texts_shed: Band assistant replies at positions below this are shed.
        shortened: Band tool groups at positions below this are committed to being
            shortened (the minimum-gain floor accepted them; it never takes that back).
    """

    tools_shed: int = 0
    texts_shed: int = 0
    shortened: int = 0

    def to_dict(self) -> dict[str, object]:
        """A JSON-safe dict with an explicit kind and version."""
        return {
            "kind": SNAPSHOT_KIND,
            "version": SNAPSHOT_VERSION,
            "tools_shed": self.tools_shed,
            "texts_shed": self.texts_shed,
            "shortened": self.shortened,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> AnchoredSnapshot:
        """Read a snapshot written by :meth:`to_dict`; refuses newer or malformed ones."""
        if not isinstance(data, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise SnapshotError(f"an anchored snapshot must be a mapping, got {type(data).__name__}")
        version = data.get("version")
        if version not in SUPPORTED_SNAPSHOT_VERSIONS:
            raise SnapshotVersionError(version, SUPPORTED_SNAPSHOT_VERSIONS)
        if data.get("kind") != SNAPSHOT_KIND:
            raise SnapshotError(f"expected an {SNAPSHOT_KIND!r} snapshot, got kind {data.get('kind')!r}")
        values: dict[str, int] = {}
        for name in ("tools_shed", "texts_shed", "shortened"):
            value = data.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SnapshotError(f"snapshot field {name!r} must be a non-negative integer, got {value!r}")
            values[name] = value
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Report:
    """What a pass did, for the shell to log and count.

    Attributes:
        tokens_before: Included tokens of the input.
        tokens_after: Included tokens of the output.
        ceiling: The ceiling the pass compacted to.
        changed: Any message's inclusion or content changed, or notes changed.
        shed: Origins of the messages this pass shed (newly, not replayed).
        shortened: Number of results shortened on this pass (newly or replayed).
        declined: The minimum-gain floor declined this pass's collapse.
        overflow: The output is still over the ceiling: the anchors alone exceed it.
    """

    tokens_before: int
    tokens_after: int
    ceiling: int
    changed: bool
    shed: tuple[int, ...] = ()
    shortened: int = 0
    declined: bool = False
    overflow: bool = False


@dataclass(frozen=True, slots=True)
class Done:
    """The pass's answer: the new history, the new snapshot and a report."""

    history: History
    snapshot: AnchoredSnapshot
    report: Report


@dataclass(frozen=True, slots=True)
class _Band:
    """The conversation's groups, by band position."""

    tools: tuple[Group, ...]
    texts: tuple[Group, ...]


@dataclass(slots=True)
class _Plan:
    """Working state of one pass (local to :func:`step`, never escapes it)."""

    records: list[MessageRecord]
    shed_tools: int
    shed_texts: int
    newly_shed: list[int] = field(default_factory=list[int])


def step(
    config: AnchoredConfig,
    history: History,
    snapshot: AnchoredSnapshot,
    measure: Measure,
    *,
    ceiling: int | None = None,
) -> Result[Done, CompactionBudgetExceeded]:
    """One anchored pass over ``history``.

    ``ceiling`` (default ``max_input_tokens``) bounds only how far shedding goes;
    shortening never reads it. The anchored strategy never fails: when the anchors alone
    exceed the ceiling it answers with ``report.overflow`` set.
    """
    limit = config.max_input_tokens if ceiling is None else ceiling
    records = [r for r in history if not r.note]
    tokens_before = _included_tokens(history)
    band = _band(config, records)

    plan = _Plan(records=records, shed_tools=snapshot.tools_shed, shed_texts=snapshot.texts_shed)
    _replay_sheds(plan, band)
    committed = min(snapshot.shortened, len(band.tools))
    shortened, declined, committed = _shorten_band(
        config, plan, band, committed=committed, measure=measure, limit=limit
    )
    _shed_to_low_water(config, plan, band, measure, limit)

    output = _with_notes(plan, band, measure)
    tokens_after = _included_tokens(output)
    new_snapshot = AnchoredSnapshot(tools_shed=plan.shed_tools, texts_shed=plan.shed_texts, shortened=committed)
    report = Report(
        tokens_before=tokens_before,
        tokens_after=tokens_after,
        ceiling=limit,
        changed=_differs(history, output),
        shed=tuple(plan.newly_shed),
        shortened=shortened,
        declined=declined,
        overflow=tokens_after > limit,
    )
    return Success(Done(history=pvector(output), snapshot=new_snapshot, report=report))


def band_groups(config: AnchoredConfig, history: Sequence[MessageRecord]) -> tuple[Group, ...]:
    """The band's groups (indices into ``history``), for tests and diagnostics."""
    band = _band(config, [r for r in history if not r.note])
    return tuple(sorted((*band.tools, *band.texts), key=lambda g: g.start))


def _band(config: AnchoredConfig, records: Sequence[MessageRecord]) -> _Band:
    """Band groups by kind, positions oldest first; indices refer to ``records``."""
    conversation = [i for i, r in enumerate(records) if not r.injected]
    groups = group_records([records[i] for i in conversation])
    end = len(groups) - config.keep_tail_groups
    if end <= config.keep_head_groups:
        return _Band(tools=(), texts=())
    band = [_reindex(g, conversation) for g in groups[config.keep_head_groups : end]]
    return _Band(
        tools=tuple(g for g in band if g.kind == "tool_call"),
        texts=tuple(g for g in band if g.kind == "assistant_text"),
    )


def _reindex(group: Group, indices: Sequence[int]) -> Group:
    return replace(
        group,
        members=tuple(indices[m] for m in group.members),
        spans=tuple((indices[a], indices[b]) for a, b in group.spans),
    )


def _replay_sheds(plan: _Plan, band: _Band) -> None:
    """Apply the sheds the snapshot already holds; ``newly_shed`` is not touched."""
    for group in band.tools[: plan.shed_tools]:
        _exclude(plan, group, record_new=False)
    for group in band.texts[: plan.shed_texts]:
        _exclude(plan, group, record_new=False)


def _shorten_band(
    config: AnchoredConfig,
    plan: _Plan,
    band: _Band,
    *,
    committed: int,
    measure: Measure,
    limit: int,
) -> tuple[int, bool, int]:
    """Shorten band results by position; returns (count, declined, new commitment)."""
    edits: dict[int, MessageRecord] = {}
    saved_by_position: dict[int, int] = {}
    first_edit: dict[int, int] = {}
    for position, group in enumerate(band.tools):
        if position < plan.shed_tools:
            continue
        allowance = config.allowance(position)
        for index in group.members:
            record = plan.records[index]
            if record.excluded or record.preserved:
                continue
            shortened = _shorten_record(record, allowance, measure)
            if shortened is not record:
                edits[index] = shortened
                saved_by_position[position] = saved_by_position.get(position, 0) + record.tokens - shortened.tokens
                first_edit.setdefault(position, index)
    pending = [p for p in saved_by_position if p >= committed]
    declined = False
    if pending and config.min_gain_fraction > 0 and _included_tokens(plan.records) <= limit:
        start = min(first_edit[p] for p in pending)
        behind = sum(r.tokens for r in plan.records[start:] if not r.excluded)
        saved = sum(saved_by_position[p] for p in pending)
        declined = saved < int(behind * config.min_gain_fraction)
    applied = 0
    for position, group in enumerate(band.tools):
        if declined and position >= committed:
            break
        for index in group.members:
            if index in edits:
                plan.records[index] = edits[index]
                applied += 1
    if not declined:
        committed = len(band.tools)
    return applied, declined, committed


def _shorten_record(record: MessageRecord, allowance: int, measure: Measure) -> MessageRecord:
    parts: list[Part] = []
    changed = False
    for part in record.parts:
        text = shorten(part.text, allowance, measure, tokens=part.tokens) if part.kind == "function_result" else ""
        if text and text is not part.text:
            parts.append(replace(part, text=text, tokens=measure(text)))
            changed = True
        else:
            parts.append(part)
    if not changed:
        return record
    tokens = record.tokens - sum(p.tokens for p in record.parts) + sum(p.tokens for p in parts)
    return replace(record, parts=tuple(parts), tokens=tokens)


def _shed_to_low_water(config: AnchoredConfig, plan: _Plan, band: _Band, measure: Measure, limit: int) -> None:
    """Shed whole groups oldest first, down to the low-water mark, only when over ``limit``."""
    total = _included_tokens(plan.records)
    if total <= limit:
        return
    low_water = math.floor(limit * config.low_water_fraction)
    kinds: list[tuple[tuple[Group, ...], str]] = [(band.tools, "tools")]
    if config.collapse_assistant_text:
        kinds.append((band.texts, "texts"))
    for groups, which in kinds:
        position = plan.shed_tools if which == "tools" else plan.shed_texts
        while total > low_water and position < len(groups):
            group = groups[position]
            position += 1
            if any(plan.records[i].preserved for i in group.members):
                continue
            freed = sum(plan.records[i].tokens for i in group.members if not plan.records[i].excluded)
            _exclude(plan, group, record_new=True)
            total -= freed - _note_tokens(_note_text([plan.records[i] for i in group.members], group.kind), measure)
        if which == "tools":
            plan.shed_tools = position
        else:
            plan.shed_texts = position


def _exclude(plan: _Plan, group: Group, *, record_new: bool) -> None:
    if any(plan.records[i].preserved for i in group.members):
        return
    for index in group.members:
        record = plan.records[index]
        if not record.excluded:
            plan.records[index] = replace(record, excluded=True)
            if record_new and record.origin is not None:
                plan.newly_shed.append(record.origin)


def _with_notes(plan: _Plan, band: _Band, measure: Measure) -> list[MessageRecord]:
    """The records with a note before each shed group's first member."""
    notes: dict[int, MessageRecord] = {}
    for groups, count, tag in ((band.tools, plan.shed_tools, "tool"), (band.texts, plan.shed_texts, "reply")):
        for position, group in enumerate(groups[:count]):
            members = [plan.records[i] for i in group.members]
            if any(r.preserved or not r.excluded for r in members):
                continue
            text = _note_text(members, group.kind)
            notes[group.start] = MessageRecord(
                role="assistant",
                parts=(Part(kind="text", text=text, tokens=measure(text)),),
                tokens=_note_tokens(text, measure),
                message_id=f"anchored_{tag}_{position}",
                note=True,
            )
    output: list[MessageRecord] = []
    for index, record in enumerate(plan.records):
        note = notes.get(index)
        if note is not None:
            output.append(note)
        output.append(record)
    return output


def _note_text(members: Sequence[MessageRecord], kind: str) -> str:
    """The note a shed group leaves; it names the tools so the model knows what was there."""
    if kind != "tool_call":
        return TEXT_NOTE
    names = sorted({p.name for r in members for p in r.parts if p.name and p.kind in TOOL_CALL_KINDS})
    if not names:
        return TOOL_NOTE_PREFIX + "]"
    return f"{TOOL_NOTE_PREFIX} ({', '.join(names)})]"


def _note_tokens(text: str, measure: Measure) -> int:
    return MESSAGE_OVERHEAD_TOKENS + measure(text)


def _included_tokens(records: Sequence[MessageRecord]) -> int:
    return sum(r.tokens for r in records if not r.excluded)


def _differs(before: Sequence[MessageRecord], after: Sequence[MessageRecord]) -> bool:
    if len(before) != len(after):
        return True
    return any(
        a.note != b.note or a.excluded != b.excluded or a.parts != b.parts for a, b in zip(before, after, strict=True)
    )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _require_int(name: str, value: object, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
