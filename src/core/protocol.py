"""The one protocol every strategy's core speaks, in the shape of h11's sans-I/O core.

A strategy's core is a pure function over one immutable *state* value per conversation
(:class:`~.state.State`; the anchored strategy's :class:`~.state.AnchoredSnapshot`):

- ``step(config, state, history, measure) -> Needs | Done`` reads the conversation and
  either answers (:class:`Done`: the new history, the new state, a report) or asks for
  effects first (:class:`Needs`: records, summaries, media descriptions, each with the
  route the core chose for it), and
- every answer goes into the state's one table of answers, keyed by its request's
  identity (:func:`~.answers.absorb`, an insert), so the next ``step`` (on this list, the
  other list, a restored session or another replica) finds it instead of asking again.

A pass that runs several rules is an ordered tuple of sub-steps speaking the same
``Needs | Done`` over one view of the history (:mod:`.pipeline`).

The shell's loop is the same for every strategy: convert once, step, perform what is
needed, absorb, step again, apply once, log (:mod:`maf_compaction.adapters.loop`).

The only failure is :class:`~.errors.CompactionBudgetExceeded` (what must stay in the
prompt does not fit), raised by the composition's step: no caller handles it as data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeAlias, TypeVar

from .effects import Request
from .model import History, MessageRecord

Measure: TypeAlias = Callable[[str], int]

ConfigT_contra = TypeVar("ConfigT_contra", contravariant=True)
StateT = TypeVar("StateT")
ReportT = TypeVar("ReportT")


@dataclass(frozen=True, slots=True)
class Needs:
    """The pass cannot finish before these requests are answered (into the state it was given; then it steps again).

    Attributes:
        requests: The effect requests, each with a stable identity and its route.
    """

    requests: tuple[Request, ...]


@dataclass(frozen=True, slots=True)
class Done(Generic[StateT, ReportT]):
    """The pass's answer.

    Attributes:
        history: The new history: exclusions, rewritten results, inserted notes, records
            and summaries. Records keep their ``origin`` so the shell applies it in place.
        state: The state after the pass: every decision made so far.
        report: What the pass did, for the shell to log and count.
        memo: Work the next step may reuse (a grouping); it never changes an answer, so
            a shell may drop it at any time.
    """

    history: History
    state: StateT
    report: ReportT
    memo: object = field(default=None, compare=False, repr=False)


Step: TypeAlias = Needs | Done[StateT, ReportT]


class CoreStrategy(Protocol[ConfigT_contra, StateT, ReportT]):
    """What a strategy's core module provides: one pure step, and a check of a restored state."""

    def step(
        self, config: ConfigT_contra, state: StateT, history: History, measure: Measure, *, memo: object = None
    ) -> Step[StateT, ReportT]:  # pragma: no cover - a protocol
        """One pass over ``history`` under ``state`` (``memo``: the last ``Done.memo``)."""
        ...

    def check(self, config: ConfigT_contra, state: StateT, history: History) -> str | None:  # pragma: no cover
        """Why a restored ``state`` cannot belong to ``history`` (a count past what it holds), or ``None``."""
        ...


def sent_tokens(history: Iterable[MessageRecord]) -> int:
    """The one definition of the prompt's size: everything the next request carries.

    Included messages, our notes, records and summaries, and the context other
    providers injected for this call. Every rule that compares against the budget (or a
    share of it) counts this; nothing else.
    """
    return sum(record.tokens for record in history if not record.excluded)


def differs(before: Sequence[MessageRecord], after: Sequence[MessageRecord]) -> bool:
    """Whether ``after`` changes what ``before`` holds: a message added or removed, or one's
    inclusion, hold or parts (records the core left alone are the same objects)."""
    return len(before) != len(after) or any(
        a is not b and (a.note != b.note or a.excluded != b.excluded or a.held != b.held or a.parts != b.parts)
        for a, b in zip(before, after, strict=True)
    )
