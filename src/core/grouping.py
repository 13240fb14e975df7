"""Grouping: which messages are kept or removed together.

The rules are the framework's (``agent_framework._compaction.group_messages``), restated
over records so the core never imports the framework; a hypothesis differential test
holds the two to the same answer:

- each system message and each user message is a group of its own;
- an assistant message with a tool call, any reasoning-only assistant messages right
  before or after it, and the run of tool messages that follows form one ``tool_call``
  group;
- a run of tool messages with no call in front is a ``tool_call`` group too;
- any other message is ``assistant_text``;
- a function (or computer) result that is not adjacent to its call joins the call's
  group when the pairing is unambiguous, so one group may have non-contiguous members.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from .model import Group, GroupKind, MessageRecord

_Span = tuple[GroupKind, int, int, bool]
_Key = tuple[str, str]
#: Roles whose every message is a group of its own kind (any other lone message is ``assistant_text``).
_OWN_KINDS: dict[str, GroupKind] = {"system": "system", "user": "user"}


@dataclass(frozen=True, slots=True)
class Grouping:
    """A grouped history, kept as a value so the next pass regroups only what changed.

    Attributes:
        records: The records that were grouped (compared by shape on the next pass: :func:`same_shape`).
        all: Every group, in order of its first member.
        linked: Some group joins non-contiguous spans (a late result linked to its call).
        declarations: ``(index, (call kind, call id))`` of every linkable declaration.
    """

    records: tuple[MessageRecord, ...]
    all: tuple[Group, ...]
    linked: bool
    declarations: tuple[tuple[int, _Key], ...]

    def groups(
        self, *, skip_head: int = 0, skip_tail: int = 0, kinds: frozenset[GroupKind] | None = None
    ) -> tuple[Group, ...]:
        """The groups, in order of each group's first member.

        ``skip_head`` and ``skip_tail`` leave out the first and last groups, and ``kinds``
        keeps only groups of those kinds.
        """
        middle = self.all[skip_head : max(len(self.all) - skip_tail, 0)]
        return middle if kinds is None else tuple(g for g in middle if g.kind in kinds)


def group_records(
    records: Sequence[MessageRecord],
    *,
    skip_head: int = 0,
    skip_tail: int = 0,
    kinds: frozenset[GroupKind] | None = None,
) -> tuple[Group, ...]:
    """Group ``records`` by the framework's rules (see :meth:`Grouping.groups`)."""
    return regroup(records).groups(skip_head=skip_head, skip_tail=skip_tail, kinds=kinds)


def regroup(records: Sequence[MessageRecord], previous: Grouping | None = None) -> Grouping:
    """Group ``records``, reusing ``previous`` for the prefix they share with it.

    The answer is always the same as grouping from scratch; ``previous`` only saves
    work. Records are compared by :func:`same_shape`, so the shell's reuse of unchanged
    records across passes, and a sub-step that changes only flags (exclusions, holds),
    keep the shared prefix long. The regrouped suffix starts at
    the earliest group the new records could extend (a call's group gains its results,
    a run of reasoning-only messages joins a call that follows it). Any linking across
    spans, or a suffix call id the prefix already declared, falls back to a full pass.
    """
    records = tuple(records)
    start = _reusable_prefix(records, previous)
    if previous is None or start == 0:
        return _full(records)
    prior = previous.declarations[: bisect_left(previous.declarations, start, key=lambda declaration: declaration[0])]
    declared = {key for _, key in prior}
    suffix = records[start:]
    if any((kind, call_id) in declared for r in suffix for kind, call_id, _ in r.links):
        return _full(records)
    local = _spans(suffix)
    if _link(suffix, local) is not None:
        return _full(records)
    kept = previous.all[: bisect_left(previous.all, start, key=_last_member)]
    fresh = tuple(_group((kind, first + start, last + start, reasoning)) for kind, first, last, reasoning in local)
    return Grouping(records, kept + fresh, False, prior + tuple(_declarations(suffix, start)))


def _reusable_prefix(records: tuple[MessageRecord, ...], previous: Grouping | None) -> int:
    """Index where regrouping must start: 0 when nothing of ``previous`` can be reused."""
    if previous is None or previous.linked or not previous.all:
        return 0
    alike = list(map(same_shape, records, previous.records))  # stops at the shorter of the two
    same = alike.index(False) if False in alike else len(alike)
    if same == 0:
        return 0
    groups = previous.all
    cut = bisect_left(groups, same - 1, key=_last_member)
    while cut > 0 and groups[cut - 1].kind == "assistant_text" and records[groups[cut - 1].start].is_reasoning_only:
        cut -= 1
    return groups[cut].start if cut < len(groups) else len(records)


def same_shape(a: MessageRecord, b: MessageRecord) -> bool:
    """``a`` and ``b`` group alike: only what grouping reads (role, calls, links, reasoning) counts.

    A record that differs only in flags (excluded, held, a reason) or in a result's text
    has the same shape, so a regrouping after such a change reuses the whole grouping.
    """
    if a is b or (a.parts is b.parts and a.role == b.role):
        return True
    return (
        a.role == b.role
        and a.links == b.links
        and a.has_tool_call == b.has_tool_call
        and a.is_reasoning_only == b.is_reasoning_only
        and a.has_reasoning == b.has_reasoning
    )


def _last_member(group: Group) -> int:
    return group.members[-1]


def _group(span: _Span) -> Group:
    kind, start, end, reasoning = span
    return Group(kind=kind, members=tuple(range(start, end + 1)), has_reasoning=reasoning, spans=((start, end),))


def _full(records: tuple[MessageRecord, ...]) -> Grouping:
    spans = _spans(records)
    roots = _link(records, spans)
    groups = tuple(map(_group, spans)) if roots is None else tuple(_merged(spans, roots))
    return Grouping(records, groups, roots is not None, tuple(_declarations(records, 0)))


def _declarations(records: Sequence[MessageRecord], offset: int) -> list[tuple[int, _Key]]:
    return [
        (index + offset, (kind, call_id))
        for index, record in enumerate(records)
        for kind, call_id, declaration in record.links
        if declaration
    ]


def _merged(spans: Sequence[_Span], roots: Sequence[int]) -> list[Group]:
    joined: dict[int, list[_Span]] = {}  # each root's spans, in order
    for span, root in zip(spans, roots, strict=True):
        joined.setdefault(root, []).append(span)
    return [
        Group(
            kind=spans[root][0],
            members=tuple(sorted(m for _, start, end, _ in runs for m in range(start, end + 1))),
            has_reasoning=any(reasoning for *_, reasoning in runs),
            spans=tuple((start, end) for _, start, end, _ in runs),
        )
        for root, runs in sorted(joined.items())
    ]


def _spans(records: Sequence[MessageRecord]) -> list[_Span]:
    spans: list[_Span] = []
    i = 0
    while i < len(records):
        current = records[i]
        # A tool call, with the reasoning-only assistants around it and the tool messages after it.
        call = _past_reasoning(records, i) if current.is_reasoning_only else i
        if call < len(records) and records[call].role == "assistant" and records[call].has_tool_call:
            after = _past_reasoning(records, call + 1)
            end = _past_tools(records, after)
            spans.append(("tool_call", i, end - 1, call > i or after > call + 1 or records[call].has_reasoning))
        elif current.role == "tool":
            end = _past_tools(records, i + 1)
            spans.append(("tool_call", i, end - 1, False))
        else:
            end = i + 1
            spans.append((_OWN_KINDS.get(current.role, "assistant_text"), i, i, current.has_reasoning))
        i = end
    return spans


def _past_reasoning(records: Sequence[MessageRecord], start: int) -> int:
    """Index one past the run of reasoning-only messages from ``start``."""
    while start < len(records) and records[start].is_reasoning_only:
        start += 1
    return start


def _past_tools(records: Sequence[MessageRecord], start: int) -> int:
    """Index one past the run of tool messages from ``start``."""
    while start < len(records) and records[start].role == "tool":
        start += 1
    return start


def _unambiguous_pairs(records: Sequence[MessageRecord]) -> list[tuple[int, int]]:
    """(declaration index, result index) pairs whose call id matches exactly one open declaration."""
    open_declarations: dict[tuple[str, str], list[int]] = {}
    pairs: list[tuple[int, int]] = []
    for index, record in enumerate(records):
        for call_kind, call_id, declaration in record.links:
            key = (call_kind, call_id)
            if declaration:
                open_declarations.setdefault(key, []).append(index)
            elif len(open_declarations.get(key, ())) == 1:
                pairs.append((open_declarations[key].pop(), index))
    return pairs


def _link(records: Sequence[MessageRecord], spans: list[_Span]) -> list[int] | None:
    """Union-find over spans: a result span joins its declaration's (earlier) span.

    Returns each span's root span, or ``None`` when no result links two spans (the
    common case: every result sits in its call's span).
    """
    starts = [start for _, start, _, _ in spans]
    parents = list(range(len(spans)))

    def find(index: int) -> int:
        while parents[index] != index:
            parents[index] = parents[parents[index]]
            index = parents[index]
        return index

    linked = False
    for declaration, result in _unambiguous_pairs(records):
        left, right = bisect_right(starts, declaration) - 1, bisect_right(starts, result) - 1
        if left < right:  # the result sits in a later span than its declaration
            a, b = find(left), find(right)
            parents[max(a, b)] = min(a, b)
            linked = True
    return [find(index) for index in range(len(spans))] if linked else None
