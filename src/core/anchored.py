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
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from pyrsistent import pvector

from .checks import AtLeastOne, AtLeastZero, Floor, Fraction, validate
from .counting import Measure
from .distill import distill
from .grouping import Grouping, regroup
from .model import Group, History, MessageRecord, Part, flagged
from .protocol import Done, differs, sent_tokens
from .shorten import shorten
from .state import AnchoredSnapshot
from .user_summaries import message

DEFAULT_KEEP_HEAD_GROUPS: Final = 3
DEFAULT_KEEP_TAIL_GROUPS: Final = 4
DEFAULT_BAND_SHARE: Final = 0.25
#: The smallest allowance any band position keeps.
DEFAULT_KEEP_TOKENS: Final = 150
#: Share of the ceiling a shed goes down to. A quarter of the budget freed per shed
#: means one prefix break per several turns instead of one per turn.
DEFAULT_LOW_WATER_FRACTION: Final = 0.75
#: The break-even share at a 10x cached discount and about 20 turns left:
#: R > B(p - c)/(p + T c) with p = 1, c = 0.1 and T = 21 (about 20 turns) gives 0.29 of B.
DEFAULT_MIN_GAIN_FRACTION: Final = 0.29

#: Why a message the anchored strategy shed is excluded (written on the message).
EXCLUDE_REASON: Final = "anchored_compaction"
TOOL_NOTE_PREFIX: Final = "[compacted: an earlier tool call and its result"
TEXT_NOTE: Final = "[compacted: an earlier assistant reply]"

_NOTE_ID: Final = re.compile(r"anchored_(tool|reply)_(\d+)")


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

    max_input_tokens: AtLeastOne
    keep_head_groups: AtLeastZero = DEFAULT_KEEP_HEAD_GROUPS
    keep_tail_groups: AtLeastZero = DEFAULT_KEEP_TAIL_GROUPS
    keep_tokens: AtLeastZero | None = None
    band_share: Fraction = DEFAULT_BAND_SHARE
    collapse_assistant_text: bool = True
    low_water_fraction: Fraction = DEFAULT_LOW_WATER_FRACTION
    min_gain_fraction: Floor = 0.0

    def __post_init__(self) -> None:
        validate(self)

    def allowance(self, position: int) -> int:
        """Tokens a tool result at band position ``position`` keeps."""
        if self.keep_tokens is not None:
            return self.keep_tokens
        return max(int(self.max_input_tokens * self.band_share / (position + 1)), DEFAULT_KEEP_TOKENS)


@dataclass(frozen=True, slots=True)
class Report:
    """What a pass did, for the shell to log and count.

    Attributes:
        tokens_before: Included tokens of the input with earlier passes' sheds replayed (their notes in place:
            a list that kept their exclusions but not their notes, as a step within a composition sees it,
            counts as the prompt the last pass sent), so ``tokens_after - tokens_before`` is this pass's own
            change.
        tokens_after: Included tokens of the output.
        ceiling: The ceiling the pass compacted to.
        changed: Any message's inclusion or content changed, or notes changed.
        shed: Origins of the messages this pass shed (newly, not replayed).
        joined: Origins of messages excluded to keep an earlier shed whole: a result that
            arrived for a shed call, or the rest of a tool group found half-excluded.
        shortened: Number of results shortened on this pass (newly or replayed).
        declined: The minimum-gain floor declined this pass's collapse.
        overflow: The output is still over the ceiling: the anchors alone exceed it.
        misplaced: Notes of earlier sheds stand where the group at their position is
            not excluded: the list lost messages (a history provider that drops excluded
            messages). Positions cannot be trusted, so the pass neither replayed nor shed.
        distilled: Origins of the results this pass newly cut to the lines that carry
            their distinctive values (the safety net under the records; see :func:`run`).
    """

    tokens_before: int
    tokens_after: int
    ceiling: int
    changed: bool
    shed: tuple[int, ...] = ()
    joined: tuple[int, ...] = ()
    shortened: int = 0
    declined: bool = False
    overflow: bool = False
    misplaced: int = 0
    distilled: tuple[int, ...] = ()


AnchoredDone = Done[AnchoredSnapshot, Report]


@dataclass(frozen=True, slots=True)
class Band:
    """The conversation's band groups by kind, positions oldest first, with what they were derived from.

    A pass hands it to the next run as its memo (:func:`run`): a run over records that
    group alike at the same positions reuses the groups it shares with it (the whole band
    when nothing moved, the prefix when turns were added). It never changes an answer.
    """

    tools: tuple[Group, ...]
    texts: tuple[Group, ...]
    grouping: Grouping
    conversation: tuple[int, ...]  # indices into the records of the grouped ones
    keep: tuple[int, int]  # keep_head_groups, keep_tail_groups
    ordered: tuple[Group, ...]  # the band, members indexing the records (tools and texts are its parts)


@dataclass(slots=True)
class _Lane:
    """The shed state of one kind of band group (tool groups, or assistant replies).

    ``groups`` are the band's, then (only when earlier decisions reach past the band) the
    tail's up to the furthest decided position: positions count from the head, so a
    decision made over a wider band (the record fallback's while no route to a record is
    left, :func:`.records.fallback_for`) names the same group once the tail is wider again,
    and is replayed there. New decisions are made only within the band: the first ``open``.
    """

    groups: tuple[Group, ...]
    open: int
    tag: str
    shed: int
    spared: set[int]
    sizes: dict[int, int] = field(default_factory=dict[int, int])

    def decided(self) -> list[tuple[int, Group]]:
        """Groups a shed has already reached and did not spare, with their positions."""
        return [(p, g) for p, g in enumerate(self.groups[: self.shed]) if p not in self.spared]


@dataclass(slots=True)
class _Plan:
    """Working state of one pass (local to :func:`step`, never escapes it)."""

    records: list[MessageRecord]
    tools: _Lane
    texts: _Lane
    newly_shed: list[int] = field(default_factory=list[int])
    newly_joined: list[int] = field(default_factory=list[int])
    #: The notes of the current sheds; dropped whenever an exclusion changes them.
    notes: dict[int, MessageRecord] | None = None
    #: Notes the input already holds, by id: reused when still right.
    existing_notes: dict[str, MessageRecord] = field(default_factory=dict[str, MessageRecord])
    #: Holds that do not protect; ``None``: no hold protects (see :func:`run`).
    releasable: frozenset[str] | None = None
    #: Holds whose groups may be distilled over the budget, ``None`` for no hold (see :func:`run`).
    distillable: frozenset[str | None] = frozenset()
    #: Band tool positions distilled (replayed or new).
    distilled: set[int] = field(default_factory=set[int])
    newly_distilled: list[int] = field(default_factory=list[int])

    def shields(self, record: MessageRecord) -> bool:
        """``record`` may not be made smaller: preserved, or held by a hold that protects."""
        releasable = self.releasable
        return record.preserved or (
            releasable is not None and record.held is not None and record.held not in releasable
        )

    def protected(self, group: Group) -> bool:
        return any(self.shields(self.records[i]) for i in group.members)


def run(
    config: AnchoredConfig,
    state: AnchoredSnapshot,
    history: History,
    measure: Measure,
    *,
    ceiling: int | None = None,
    memo: object = None,
    releasable: frozenset[str] | None = None,
    distillable: frozenset[str | None] = frozenset(),
    distill_ceiling: int | None = None,
    shorten: bool = True,
) -> AnchoredDone:
    """One anchored pass over ``history`` (:func:`step`); compositions call it with their holds (``shorten=False``:
    band results are never shortened, groups only shed whole).

    ``ceiling`` (default ``max_input_tokens``) bounds only how far shedding goes;
    shortening never reads it. ``memo`` is the previous pass's ``Done.memo``, a band
    that saves work and never changes the answer. The anchored strategy never fails and
    never needs an effect: when the anchors alone exceed the ceiling it answers with
    ``report.overflow`` (honest overflow).

    With ``releasable``, a held message is protected like a preserved one unless its
    hold is in ``releasable`` (the record rules' holds; see :func:`.records.run_with_holds`).

    With ``distillable`` (hold reasons of groups no record covers; ``None`` for groups
    not held at all, where no record exists), the safety net: over
    the ceiling, such groups are distilled oldest first, down to the low-water mark,
    before any group is shed. A distilled result keeps its title and every line with a
    distinctive value, verbatim, under a marker (:func:`.distill.distill`); the position
    is remembered and replayed like a shed, so every list and every later pass gives the
    same bytes. With ``distill_ceiling`` as well (once no record can be asked for: the record
    trigger, then 0 once the net has cut, see :func:`.records.net_ceiling`), over that ceiling
    every such band group is distilled at once, where a record would have covered them all in
    one break; shedding still waits for the ceiling.
    """
    limit = config.max_input_tokens if ceiling is None else ceiling
    records = [r for r in history if not r.note]
    existing_notes = {r.message_id: r for r in history if r.note and r.message_id}
    band = _band(config, records, memo if isinstance(memo, Band) else None)
    noted = _noted_positions(existing_notes)
    reach = _reach(state, noted)
    tools_reached, texts_reached = _reached(band, len(records), reach)
    tools = _Lane(
        tools_reached, len(band.tools), "tool", state.tools_shed, set(state.spared_tools), dict(state.shed_sizes)
    )
    texts = _Lane(texts_reached, len(band.texts), "reply", state.texts_shed, set(state.spared_texts))
    for lane in (tools, texts):
        _recover(lane, noted, records)
    plan = _Plan(records, tools, texts, existing_notes=existing_notes, releasable=releasable, distillable=distillable)
    misplaced = _misplaced_notes(plan, noted)
    if misplaced:  # positions cannot be trusted: nothing past the band is touched
        tools.groups, texts.groups = tools.groups[: tools.open], texts.groups[: texts.open]
    tokens_before = sent_tokens(history)
    if not misplaced:
        _replay_sheds(plan)
        if len(_notes(plan, measure)) > len(existing_notes):  # earlier sheds' notes placed afresh
            tokens_before = sent_tokens(_with_notes(plan, measure))
    shortened, declined, committed = _shorten_band(
        config, plan, committed=state.shortened, measure=measure, limit=limit, shorten=shorten
    )
    if not misplaced:
        for position in (p for p in state.distilled if p < len(tools.groups)):
            _distill_group(plan, tools.groups[position], measure, into=None)
            plan.distilled.add(position)
        if distill_ceiling is not None and _prompt_tokens(plan, measure) > distill_ceiling:
            _distill_to_low_water(config, plan, measure, distill_ceiling, low_water=0)
        _distill_to_low_water(config, plan, measure, limit)
        _shed_to_low_water(config, plan, measure, limit)

    output = _with_notes(plan, measure)
    tokens_after = sent_tokens(output)
    new_snapshot = AnchoredSnapshot(
        tools_shed=plan.tools.shed,
        texts_shed=plan.texts.shed,
        shortened=committed,
        spared_tools=tuple(sorted(plan.tools.spared)),
        spared_texts=tuple(sorted(plan.texts.spared)),
        shed_sizes=tuple(sorted(plan.tools.sizes.items())),
        distilled=tuple(sorted(plan.distilled)),
        keep_head_groups=config.keep_head_groups,
    )
    report = Report(
        tokens_before=tokens_before,
        tokens_after=tokens_after,
        ceiling=limit,
        changed=differs(history, output),
        shed=tuple(plan.newly_shed),
        joined=tuple(plan.newly_joined),
        shortened=shortened,
        declined=declined,
        overflow=tokens_after > limit,
        misplaced=misplaced,
        distilled=tuple(plan.newly_distilled),
    )
    return Done(history=pvector(output), state=new_snapshot, report=report, memo=band)


#: The shell's entry (:mod:`.loop`) is the pass itself.
step = run


def _misplaced_notes(plan: _Plan, noted: set[tuple[str, int]]) -> int:
    """Notes whose band position now holds a live group (or no group at all).

    The note's own group starts excluded; a member that arrived later (a late result)
    may not be, and is shed on replay, so only the first member is checked.
    """
    lanes = {"tool": plan.tools.groups, "reply": plan.texts.groups}
    return sum(
        position >= len(lanes[tag]) or not plan.records[lanes[tag][position].start].excluded for tag, position in noted
    )


def _reach(state: AnchoredSnapshot, noted: set[tuple[str, int]]) -> tuple[int, int]:
    """How far earlier decisions reach, tool positions and reply positions: every group below is decided
    (shed, spared, shortened or distilled, by the snapshot or by a note in the history)."""
    tools = max(state.tools_shed, state.shortened, max(state.distilled, default=-1) + 1)
    texts = state.texts_shed
    for tag, position in noted:
        if tag == "tool":
            tools = max(tools, position + 1)
        else:
            texts = max(texts, position + 1)
    return tools, texts


def _reached(band: Band, records: int, reach: tuple[int, int]) -> tuple[tuple[Group, ...], tuple[Group, ...]]:
    """The band's tool groups and replies, each followed by the tail's up to ``reach`` (see :class:`_Lane`).

    Within one configuration the band only grows, so decisions never reach past it; only a
    tail that was narrower when they were made (or a list that lost messages) does.
    """
    if reach[0] <= len(band.tools) and reach[1] <= len(band.texts):
        return band.tools, band.texts
    groups = band.grouping.all
    tail = groups[max(band.keep[0], len(groups) - band.keep[1]) :]
    if len(band.conversation) != records:
        tail = tuple(_reindex(group, band.conversation) for group in tail)
    tools = tuple(g for g in tail if g.kind == "tool_call")[: max(0, reach[0] - len(band.tools))]
    texts = tuple(g for g in tail if g.kind == "assistant_text")[: max(0, reach[1] - len(band.texts))]
    return band.tools + tools, band.texts + texts


def _noted_positions(notes: Mapping[str, MessageRecord]) -> set[tuple[str, int]]:
    """(lane tag, position) of every note, by its id: evidence of sheds already made."""
    matches = (_NOTE_ID.fullmatch(message_id) for message_id in notes)
    return {(match.group(1), int(match.group(2))) for match in matches if match is not None}


def _recover(lane: _Lane, noted: set[tuple[str, int]], records: Sequence[MessageRecord]) -> None:
    """Move ``lane`` on to the sheds the history's notes show when its snapshot does not know them.

    A fresh instance (a restored session, a restarted process, another replica) starts
    from an empty snapshot, but the stored history carries the notes of earlier sheds.
    Positions below the newest note that have no note were passed over (spared).
    """
    shed, tag = lane.shed, lane.tag
    evidence = max((p + 1 for t, p in noted if t == tag), default=0)
    if evidence <= shed:
        return
    lane.spared |= {p for p in range(shed, evidence) if (tag, p) not in noted}
    # Recovered sheds are sized by what is excluded now: a member that arrives later
    # (a result for a shed call) is then reported when it is shed with its group.
    recovered = {
        p: sum(1 for i in lane.groups[p].members if records[i].excluded)
        for p in range(shed, min(evidence, len(lane.groups)))
        if (tag, p) in noted
    }
    lane.shed, lane.sizes = evidence, {**recovered, **lane.sizes}


def check(config: AnchoredConfig, state: AnchoredSnapshot, history: History) -> str | None:
    """Why ``state`` cannot be this conversation's, or ``None``: its counts must fit what the history holds.

    Watermarks only ever reach band positions that existed when they were set, and the
    band only grows as the conversation does, so a watermark past the band's groups
    names groups this conversation never had (a forged or foreign snapshot). When the
    history shows notes of earlier sheds, positions are judged by them instead (a list
    that lost messages; see ``Report.misplaced``).
    """
    if any(r.note for r in history):
        return None
    band = _band(config, [r for r in history if not r.note], None)
    for name, count, limit in (
        ("tools_shed", state.tools_shed, len(band.tools)),
        ("shortened", state.shortened, len(band.tools)),
        ("texts_shed", state.texts_shed, len(band.texts)),
    ):
        if count > limit:
            return f"snapshot field {name!r} is {count}, but this conversation's band holds {limit} such group(s)"
    beyond = [p for p in state.distilled if p >= len(band.tools)]
    if beyond:
        return f"snapshot field 'distilled' names band position {beyond[0]}, but the band holds {len(band.tools)}"
    return None


def band_groups(config: AnchoredConfig, history: Sequence[MessageRecord]) -> tuple[Group, ...]:
    """The band's groups, with member indices into ``history``, for tests and diagnostics."""
    kept = [i for i, r in enumerate(history) if not r.note]
    band = _band(config, [history[i] for i in kept], None)
    return tuple(sorted((_reindex(g, kept) for g in (*band.tools, *band.texts)), key=lambda g: g.start))


def _band(config: AnchoredConfig, records: Sequence[MessageRecord], previous: Band | None) -> Band:
    """Band groups by kind, positions oldest first; indices refer to ``records``."""
    # Our own inserts (user-turn summaries, written records) are not groups either: an
    # inserted summary must not move the band's positions, or saved sheds would replay
    # onto other groups.
    conversation = tuple(i for i, r in enumerate(records) if not r.injected and not r.inserted)
    everything = len(conversation) == len(records)
    grouping = regroup(
        records if everything else [records[i] for i in conversation], None if previous is None else previous.grouping
    )
    keep = (config.keep_head_groups, config.keep_tail_groups)
    band = grouping.groups(skip_head=keep[0], skip_tail=keep[1])
    if not everything:
        # A group the previous band held (the same object at the same position, over the
        # same indices) is reindexed alike: reuse it.
        known: tuple[Group, ...] = ()
        before: tuple[Group, ...] = ()
        if previous is not None and previous.keep == keep and _extends(conversation, previous.conversation):
            known, before = previous.ordered, previous.grouping.all[keep[0] :]
        band = tuple(
            known[k] if k < len(known) and k < len(before) and before[k] is group else _reindex(group, conversation)
            for k, group in enumerate(band)
        )
    tools = tuple(g for g in band if g.kind == "tool_call")
    texts = tuple(g for g in band if g.kind == "assistant_text")
    return Band(tools, texts, grouping, conversation, keep, band)


def _extends(indices: tuple[int, ...], prefix: tuple[int, ...]) -> bool:
    return indices[: len(prefix)] == prefix


def _reindex(group: Group, indices: Sequence[int]) -> Group:
    members = tuple([indices[m] for m in group.members])
    return Group(group.kind, members, group.has_reasoning, tuple([(indices[a], indices[b]) for a, b in group.spans]))


def _replay_sheds(plan: _Plan) -> None:
    """Apply the sheds the snapshot already holds.

    A replayed shed is not news, except where a shed call's result arrived since: it is
    excluded with its call (a call without its result is refused by providers), and
    reported like a new shed, so nothing disappears without a WARNING.
    """
    for lane in (plan.tools, plan.texts):
        for position, group in lane.decided():
            if plan.protected(group):
                continue
            known = lane.sizes.get(position)
            grew = known is not None and len(group.members) > known
            _exclude(plan, group, into=plan.newly_joined if grew else None)
            if grew:
                lane.sizes[position] = len(group.members)
    # Tool integrity: a call is never sent without its result. A band tool group that
    # arrives partly excluded (a run that stopped between the two lists' passes, or
    # another component's exclusion) is excluded whole, and reported.
    for group in plan.tools.groups[: max(plan.tools.open, plan.tools.shed)]:
        if _half_excluded(plan.records, group.members) and not plan.protected(group):
            _exclude(plan, group, into=plan.newly_joined)


# These two run once per band group per pass. A plain loop is about three times as fast
# as all()/any() over a generator, which matters at thousands of messages.
def _all_excluded(records: Sequence[MessageRecord], members: tuple[int, ...]) -> bool:
    for index in members:  # noqa: SIM110
        if not records[index].excluded:
            return False
    return True


def _half_excluded(records: Sequence[MessageRecord], members: tuple[int, ...]) -> bool:
    first = records[members[0]].excluded
    for index in members:  # noqa: SIM110
        if records[index].excluded != first:
            return True
    return False


def _unanswered(records: Sequence[MessageRecord], group: Group) -> bool:
    """The group declares a call whose result is not (yet) in it."""
    declared = {(k, i) for m in group.members for k, i, d in records[m].links if d}
    answered = {(k, i) for m in group.members for k, i, d in records[m].links if not d}
    return bool(declared - answered)


def _shorten_band(
    config: AnchoredConfig, plan: _Plan, *, committed: int, measure: Measure, limit: int, shorten: bool = True
) -> tuple[int, bool, int]:
    """Shorten band results by position (none without ``shorten``); returns (count, declined, new commitment).

    Positions below ``committed`` are always shortened. The minimum-gain floor judges
    only the positions above it, and only while the prompt fits.
    """
    records = plan.records
    edits: list[tuple[int, int, MessageRecord, MessageRecord]] = []  # (position, index, record, shortened)
    lane = plan.tools
    # Past the band only committed positions (decided over a wider band) are shortened: replayed, never judged.
    for position, group in enumerate(lane.groups[: max(lane.open, committed)] if shorten else ()):
        # A group no record covers is the safety net's: cut to its value lines over the budget, never
        # shortened by position (which would cut values from its middle).
        if plan.distillable and _distillable(plan, group):
            continue
        allowance = config.allowance(position)
        for index in group.members:
            record = records[index]
            if record.longest_result_text > allowance and not plan.shields(record):
                # An excluded result is shortened too (the model never sees it either way), so
                # the same state gives the same stored bytes on any copy of the conversation,
                # whether a shed or the shortening reached it first. Only included ones count.
                shortened = _with_parts(record, tuple(_shortened(p, allowance, measure) for p in record.parts))
                if shortened is not record:
                    edits.append((position, index, record, shortened))

    def apply(judged: bool) -> None:
        for position, index, _, shortened in edits:
            if (position >= committed) == judged:
                records[index] = shortened

    # Committed positions first, so the floor judges the same state on every list (the
    # stored history already holds them shortened; fresh copies do not yet).
    apply(judged=False)
    pending = [(i, r.tokens - s.tokens) for position, i, r, s in edits if position >= committed and not r.excluded]
    declined = False
    if pending and config.min_gain_fraction > 0 and _prompt_tokens(plan, measure) <= limit:
        behind = sum(r.tokens for r in records[min(i for i, _ in pending) :] if not r.excluded)
        declined = sum(saved for _, saved in pending) < int(behind * config.min_gain_fraction)
    if not declined:
        apply(judged=True)
    applied = sum(
        sum(1 for a, b in zip(shortened.parts, record.parts, strict=True) if a is not b)
        for _, index, record, shortened in edits
        if records[index] is shortened and not shortened.excluded
    )
    return applied, declined, committed if declined else max(committed, lane.open)


def _shortened(part: Part, allowance: int, measure: Measure) -> Part:
    """A result cut to ``allowance`` by :func:`.shorten.shorten`, when that changes it; else ``part`` itself."""
    if part.kind != "function_result":
        return part
    text = shorten(part.text, allowance, measure, tokens=part.tokens - part.media_tokens)
    return (
        replace(part, text=text, tokens=measure(text) + part.media_tokens) if text and text is not part.text else part
    )


def _with_parts(record: MessageRecord, parts: tuple[Part, ...]) -> MessageRecord:
    """``record`` with ``parts``, its size moved by theirs; ``record`` itself when no part changed."""
    if all(a is b for a, b in zip(parts, record.parts, strict=True)):
        return record
    tokens = record.tokens - sum(p.tokens for p in record.parts) + sum(p.tokens for p in parts)
    return replace(record, parts=parts, tokens=tokens)


def _shed_to_low_water(config: AnchoredConfig, plan: _Plan, measure: Measure, limit: int) -> None:
    """Shed whole groups oldest first, down to the low-water mark, only when over ``limit``."""
    total = _prompt_tokens(plan, measure)
    if total <= limit:
        return
    low_water = math.floor(limit * config.low_water_fraction)
    lanes = [plan.tools, plan.texts] if config.collapse_assistant_text else [plan.tools]
    for lane in lanes:
        while total > low_water and lane.shed < lane.open:
            position, group = lane.shed, lane.groups[lane.shed]
            lane.shed += 1
            if plan.protected(group) or _all_excluded(plan.records, group.members):
                # Preserved, or already removed by someone else: not ours to shed or to mark.
                lane.spared.add(position)
                continue
            freed = sum(plan.records[i].tokens for i in group.members if not plan.records[i].excluded)
            note = _note(plan, group, lane.tag, position, measure)
            if freed <= note.tokens and not _unanswered(plan.records, group):
                # Its note would cost as much as it frees, and a complete group never grows:
                # shedding it cannot help, now or later. (A call still waiting for its result
                # is shed anyway: the result will come, and go with it.)
                lane.spared.add(position)
                continue
            _exclude(plan, group, into=plan.newly_shed)
            if lane is plan.tools:
                lane.sizes[position] = len(group.members)
            total -= freed - note.tokens


def _distill_to_low_water(
    config: AnchoredConfig, plan: _Plan, measure: Measure, limit: int, *, low_water: int | None = None
) -> None:
    """Distill the groups no record covers, oldest first, down to the low-water mark (``low_water``, by default
    ``limit``'s), only when over ``limit``."""
    total = _prompt_tokens(plan, measure) if plan.distillable else 0
    if total <= limit:
        return
    low_water = math.floor(limit * config.low_water_fraction) if low_water is None else low_water
    for position, group in enumerate(plan.tools.groups[: plan.tools.open]):
        if total <= low_water:
            return
        if position in plan.distilled or not _distillable(plan, group) or _all_excluded(plan.records, group.members):
            continue
        freed = _distill_group(plan, group, measure, into=plan.newly_distilled)
        if freed:
            plan.distilled.add(position)
            total -= freed


def _distillable(plan: _Plan, group: Group) -> bool:
    """Every member's hold (or ``None``) is in ``plan.distillable``, and none is preserved."""
    return all(plan.records[i].held in plan.distillable and not plan.records[i].preserved for i in group.members)


def _distill_group(plan: _Plan, group: Group, measure: Measure, *, into: list[int] | None) -> int:
    """Distill the group's plain-text results; returns the included tokens freed.

    Excluded members are distilled too, so a state gives the same stored bytes on every
    copy of the conversation. Origins of changed included members go ``into`` a report list.
    """
    freed = 0
    for index in group.members:
        record = plan.records[index]
        distilled = plan.records[index] = _with_parts(record, tuple(_distilled(p, measure) for p in record.parts))
        if distilled is not record and not record.excluded:
            freed += record.tokens - distilled.tokens
            if into is not None and record.origin is not None:
                into.append(record.origin)
    return freed


def _distilled(part: Part, measure: Measure) -> Part:
    """A plain-text result cut to its value lines, when that makes it smaller; else ``part`` itself."""
    if part.kind != "function_result" or part.structured:
        return part
    text = distill(part.text)
    if text is part.text:
        return part
    tokens = measure(text) + part.media_tokens
    return replace(part, text=text, tokens=tokens) if tokens < part.tokens else part


def _exclude(plan: _Plan, group: Group, *, into: list[int] | None) -> None:
    """Exclude every member of ``group``; origins of newly excluded members go ``into`` a report list."""
    for index in group.members:
        record = plan.records[index]
        if not record.excluded:
            plan.notes = None
            plan.records[index] = flagged(record, excluded=True, reason=EXCLUDE_REASON)
            if into is not None and record.origin is not None:
                into.append(record.origin)


def _notes(plan: _Plan, measure: Measure) -> dict[int, MessageRecord]:
    """The note each shed group leaves, keyed by the index of the group's first member."""
    if plan.notes is None:
        # A shed group keeps its note while it stays excluded, even if it is marked
        # preserved later: the model must still see that something was there.
        plan.notes = {
            group.start: _note(plan, group, lane.tag, position, measure)
            for lane in (plan.tools, plan.texts)
            for position, group in lane.decided()
            if _all_excluded(plan.records, group.members)
        }
    return plan.notes


def _note(plan: _Plan, group: Group, tag: str, position: int, measure: Measure) -> MessageRecord:
    text = _note_text([plan.records[i] for i in group.members], group.kind)
    message_id = f"anchored_{tag}_{position}"
    found = plan.existing_notes.get(message_id)
    if found is not None and len(found.parts) == 1 and found.parts[0].text == text and not found.excluded:
        return found
    return message("assistant", text, message_id, measure, note=True)


def _prompt_tokens(plan: _Plan, measure: Measure) -> int:
    """Included tokens of the plan's records plus the notes its sheds leave."""
    return sent_tokens(plan.records) + sum(n.tokens for n in _notes(plan, measure).values())


def _with_notes(plan: _Plan, measure: Measure) -> list[MessageRecord]:
    """The records with a note before each shed group's first member."""
    notes = _notes(plan, measure)
    output: list[MessageRecord] = []
    start = 0
    for index in sorted(notes):
        output.extend(plan.records[start:index])
        output.append(notes[index])
        start = index
    output.extend(plan.records[start:])
    return output


def _note_text(members: Sequence[MessageRecord], kind: str) -> str:
    """The note a shed group leaves; it names the tools so the model knows what was there."""
    if kind != "tool_call":
        return TEXT_NOTE
    names = sorted({name for r in members for name in r.call_names})
    return f"{TOOL_NOTE_PREFIX} ({', '.join(names)})]" if names else TOOL_NOTE_PREFIX + "]"
