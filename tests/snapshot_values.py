"""Hypothesis generators of *valid* snapshots: every kind, respecting the invariants its writer keeps.

Shared by the envelope tests and the strategies' own property tests, so "valid" means one
thing everywhere: what ``step``/``absorb`` can write.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, SearchStrategy
from msgspec.structs import replace

from maf_compaction import AnchoredSnapshot, Answer, Ask, ChainDecisions, RecordDecisions, RecordRoute, State
from maf_compaction.core.envelope import MAX_COUNT
from maf_compaction.core.state import RecallState, RecallStatus, RequestKind, record_message_id

#: Counts near zero (where real snapshots live) and anywhere up to the bound.
counts = st.integers(0, 40) | st.integers(0, MAX_COUNT)


def _below(limit: int, *, avoid: frozenset[int] = frozenset(), max_size: int = 6) -> SearchStrategy[tuple[int, ...]]:
    """Distinct positions in ``[0, limit)`` outside ``avoid``, ascending."""
    if limit <= 64:
        free = [p for p in range(limit) if p not in avoid]
        if not free:
            return st.just(())
        element: SearchStrategy[int] = st.sampled_from(free)
    else:
        element = (st.integers(0, 40) | st.integers(0, limit - 1)).filter(lambda p: p < limit and p not in avoid)
    return st.lists(element, unique=True, max_size=max_size).map(lambda xs: tuple(sorted(xs)))


@st.composite
def anchored_snapshots(draw: DrawFn) -> AnchoredSnapshot:
    """A snapshot ``step`` could write: spared and sized positions below their watermark, sizes only for sheds."""
    head = draw(st.none() | st.integers(0, 12))
    if head is None:
        return AnchoredSnapshot()  # before the first pass: no head, no decisions
    tools_shed, texts_shed, shortened = draw(counts), draw(counts), draw(counts)
    spared_tools = draw(_below(tools_shed))
    shed = draw(_below(tools_shed, avoid=frozenset(spared_tools)))
    sizes = tuple((p, draw(st.integers(0, 12) | counts)) for p in shed)
    return AnchoredSnapshot(
        tools_shed=tools_shed,
        texts_shed=texts_shed,
        shortened=shortened,
        spared_tools=spared_tools,
        spared_texts=draw(_below(texts_shed)),
        shed_sizes=sizes,
        keep_head_groups=head,
    )


@st.composite
def record_decisions(draw: DrawFn) -> RecordDecisions:
    """Decisions the ask chain could write: an ask names at least one group, none of them settled."""
    settled = draw(st.lists(counts, unique=True, max_size=6).map(lambda xs: tuple(sorted(xs))))
    if draw(st.booleans()):
        return RecordDecisions(settled=settled)
    taken = frozenset(settled)
    targets = draw(
        st.lists(counts.filter(lambda t: t not in taken), min_size=1, max_size=5, unique=True).map(
            lambda xs: tuple(sorted(xs))
        )
    )
    ask = Ask(targets=targets, records_at_ask=draw(counts), responses_at_ask=draw(counts), taken=draw(st.booleans()))
    return RecordDecisions(settled=settled, ask=ask)


texts = st.text(min_size=1, max_size=40).filter(lambda s: bool(s.strip()))
hexes32 = st.text("0123456789abcdef", min_size=32, max_size=32)
numbers = st.integers(0, 99) | st.integers(0, MAX_COUNT)

#: The message id each kind allocates (none for a media description).
_IDS: dict[RequestKind, SearchStrategy[str | None]] = {
    RequestKind.SUMMARY: numbers.map(lambda n: f"user_summary_{n}"),
    RequestKind.FOLD: numbers.map(lambda n: f"user_summary_fold_{n}"),
    RequestKind.MERGE: numbers.map(lambda n: f"record_replacement_{n}"),
    RequestKind.REWRITE: numbers.map(lambda n: f"record_replacement_{n}"),
    RequestKind.EMERGENCY_FOLD: numbers.map(lambda n: f"user_summary_emergency_fold_{n}"),
    RequestKind.MEDIA: st.none(),
}


@st.composite
def answers(draw: DrawFn, kind: RequestKind | None = None) -> Answer:
    """An answer ``absorb`` could write: ``turns`` only on a failure, a message id of its kind's form, a place only
    for a record (which always has text: a failed record is not remembered), two sources for an emergency fold."""
    kind = draw(st.sampled_from(list(RequestKind))) if kind is None else kind
    text = draw(texts) if kind is RequestKind.RECORD else draw(st.none() | texts)
    turns = None if text is not None else draw(st.none() | counts)
    minimum = 2 if kind is RequestKind.EMERGENCY_FOLD else 1
    sources = draw(st.integers(minimum, 12) | st.integers(minimum, MAX_COUNT))
    if kind in (RequestKind.MEDIA, RequestKind.RECORD):
        sources = draw(st.none() | st.just(sources))
    key = draw(hexes32) if kind is RequestKind.RECORD else draw(texts)
    return Answer(
        identity=key,
        kind=kind,
        text=text,
        message_id=record_message_id(key) if kind is RequestKind.RECORD else draw(_IDS[kind]),
        sources=sources,
        turns=turns,
        after=draw(counts) if kind is RequestKind.RECORD else None,
    )


answer_tables = st.lists(answers(), max_size=6, unique_by=lambda a: a.identity).map(tuple)

chain_decisions = st.builds(
    ChainDecisions, wait_since=st.none() | counts, declined_behind=st.none() | counts, shed=anchored_snapshots()
)

recall_states = st.builds(
    RecallState,
    next_pin=st.sampled_from((None, "size", "reforce")),
    in_flight=st.booleans(),
    awaiting_record=st.booleans(),
    ignored_streak=counts,
    route=st.sampled_from(list(RecordRoute)),
    seen=st.none()
    | st.builds(RecallStatus, included_tokens=counts, records=counts, pending_groups=counts, pending_tokens=counts),
    armed=st.booleans(),
    asking=st.sampled_from((None, "size", "reforce")),
    ignored_instructions=counts,
    summaries_to_summarizer=st.booleans(),
    ignored_summaries=counts,
)


@st.composite
def states(draw: DrawFn) -> State:
    """A whole conversation's state ``step`` and ``absorb`` could write (the fallback and the shed policy counted
    under one head)."""
    fallback, shed = draw(anchored_snapshots()), draw(anchored_snapshots())
    if None not in (fallback.keep_head_groups, shed.keep_head_groups):
        shed = replace(shed, keep_head_groups=fallback.keep_head_groups)
    chain = draw(chain_decisions)
    return State(
        records=draw(record_decisions()),
        fallback=fallback,
        recall=draw(recall_states),
        chain=ChainDecisions(wait_since=chain.wait_since, declined_behind=chain.declined_behind, shed=shed),
        answers=draw(answer_tables),
        compactions=draw(counts),
        folds=draw(counts),
    )
