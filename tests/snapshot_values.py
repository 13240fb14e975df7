"""Hypothesis generators of *valid* snapshots: every kind, respecting the invariants its writer keeps.

Shared by the envelope tests and the strategies' own property tests, so "valid" means one
thing everywhere: what ``step``/``absorb`` can write.
"""

from __future__ import annotations

from typing import Literal

from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, SearchStrategy

from maf_compaction import AnchoredSnapshot, Ask, RecordDecisions, UserSummarySnapshot
from maf_compaction.core.composition import ChainDecisions, ReplacementKind
from maf_compaction.core.effects import Answer
from maf_compaction.core.envelope import MAX_COUNT

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


@st.composite
def answers(draw: DrawFn, *, description: bool) -> Answer:
    """An answer ``absorb`` could write: ``turns`` only on a failure; a description is no summary."""
    text = draw(st.none() | texts)
    turns = None if text is not None else draw(st.none() | counts)
    if description:
        return Answer(draw(texts), text, turns=turns)
    ids = st.integers(0, MAX_COUNT).map(lambda n: f"user_summary_{n}")
    summary_id = draw(st.none() | ids | st.integers(0, 99).map(lambda n: f"user_summary_fold_{n}"))
    sources = draw(st.none() | st.integers(1, 12) | st.integers(1, MAX_COUNT))
    return Answer(draw(texts), text, summary_id=summary_id, sources=sources, turns=turns)


def _answer_lists(*, description: bool) -> SearchStrategy[tuple[Answer, ...]]:
    return st.lists(answers(description=description), max_size=4, unique_by=lambda a: a.identity).map(tuple)


user_snapshots = st.builds(
    UserSummarySnapshot,
    answers=_answer_lists(description=False),
    descriptions=_answer_lists(description=True),
    compactions=counts,
    folds=counts,
)


@st.composite
def replacements(draw: DrawFn) -> tuple[ReplacementKind, Answer]:
    """A judged record replacement or emergency fold ``absorb`` could write: ``turns`` only on a failure."""
    text = draw(st.none() | texts)
    turns = None if text is not None else draw(st.none() | counts)
    kind: Literal["merge", "rewrite", "fold"] = draw(st.sampled_from(("merge", "rewrite", "fold")))
    prefix = "user_summary_emergency_fold_" if kind == "fold" else "record_replacement_"
    replacement_id = draw(st.integers(0, MAX_COUNT).map(lambda n: f"{prefix}{n}"))
    sources = draw(st.integers(2 if kind == "fold" else 1, max(2, MAX_COUNT)))
    return kind, Answer(draw(texts), text, replacement_id, sources, turns)


chain_decisions = st.builds(
    ChainDecisions,
    wait_since=st.none() | counts,
    declined_behind=st.none() | counts,
    shed=anchored_snapshots(),
    replacements=st.lists(replacements(), max_size=4, unique_by=lambda r: r[1].identity).map(tuple),
)
