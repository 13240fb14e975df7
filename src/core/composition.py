"""The composition: records for tool results, summaries for user turns, and a chain that can still make room.

Records cannot touch user turns and narration; user-turn summaries cannot touch tool
results. Past about twice the window neither half alone fits, so one pass runs both,
then, only while the prompt is over the budget, a last-resort chain:

1. **Record half**: the record rules (coverage, holds, asks; :mod:`.records`), without
   their own fallback.
2. **User half** (:mod:`.user_summaries`), unless it is waiting for a record that is
   due: a record about to be written would change what the summary must carry. The
   wait lasts at most two model responses, never starts again behind the same record,
   and is dropped when the conversation's clock goes back (a restore).
3. **Fallback with holds**: every tool group not yet covered is held, and the anchored
   rules shed narration only.
4. **Overflow policy**: ``"shed"`` removes whole unrecorded tool groups, oldest band
   position first, each leaving a removal note the model sees (the shell names every
   lost message in a WARNING); the sheds are watermarks in the state, so they replay on
   both lists and after a restore. ``"raise"`` keeps uncovered results.

When what must stay (anchors, records, protected messages, and under ``"raise"`` the
uncovered results) does not fit, the pass answers ``Failure(CompactionBudgetExceeded)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal, TypeAlias

from pyrsistent import pvector
from returns.result import Failure, Success

from . import anchored, records, user_summaries
from .anchored import AnchoredConfig, Report
from .checks import is_number, require_int
from .effects import Request
from .errors import CompactionBudgetExceeded
from .model import History, MessageRecord
from .protocol import Done, Needs, StepResult, sent_tokens
from .records import HOLD_RECORD, RecordConfig, RecordReport, RecordState
from .snapshot import AnchoredSnapshot
from .user_snapshot import UserSummarySnapshot
from .user_summaries import UserReport, UserSummaryConfig

OverflowPolicy: TypeAlias = Literal["shed", "raise"]
OVERFLOW_POLICIES: Final = ("shed", "raise")
#: Model responses a user half waits for a due record, at most.
RECORD_WAIT_RESPONSES: Final = 2
#: A shed result keeps nothing: sheds remove whole groups, they never shorten.
_NO_SHORTENING: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class CompositionConfig:
    """Parameters of the composition; invalid values raise ``ValueError``.

    Attributes:
        records: The record half's parameters, with its anchored fallback.
        users: The user half's parameters (its trigger is the composition's user trigger).
        overflow_policy: ``"shed"`` or ``"raise"`` (see the module docstring).
    """

    records: RecordConfig
    users: UserSummaryConfig
    overflow_policy: OverflowPolicy = "shed"

    def __post_init__(self) -> None:
        if self.records.max_input_tokens != self.users.max_input_tokens:
            raise ValueError(
                "tool_results and user_turns must have the same max_input_tokens, got "
                f"{self.records.max_input_tokens} and {self.users.max_input_tokens}"
            )
        if self.records.fallback is None:
            raise ValueError("the record half's fallback must be the anchored rules within the pass")
        if self.overflow_policy not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow_policy must be 'shed' or 'raise', got {self.overflow_policy!r}")

    @property
    def max_input_tokens(self) -> int:
        """The budget both halves share."""
        return self.records.max_input_tokens

    @property
    def shed(self) -> AnchoredConfig:
        """The anchored rules the shed policy uses: whole tool groups only, never a shortened result."""
        fallback = self.records.fallback
        assert fallback is not None
        return replace(fallback, keep_tokens=_NO_SHORTENING, collapse_assistant_text=False)


@dataclass(frozen=True, slots=True)
class ChainDecisions:
    """The composition's own decisions that history cannot show.

    Attributes:
        wait_since: The conversation clock when the user half began waiting for a due
            record, or ``None``.
        declined_behind: The record count a wait ended behind: no new wait behind it.
        shed: The shed policy's decisions (watermarks over band tool groups).
    """

    wait_since: int | None = None
    declined_behind: int | None = None
    shed: AnchoredSnapshot = field(default_factory=AnchoredSnapshot)


@dataclass(frozen=True, slots=True)
class CompositionState:
    """The one state value of a conversation the composition serves."""

    records: RecordState = field(default_factory=RecordState)
    users: UserSummarySnapshot = field(default_factory=UserSummarySnapshot)
    chain: ChainDecisions = field(default_factory=ChainDecisions)


@dataclass(frozen=True, slots=True)
class CompositionReport:
    """What a pass did.

    Attributes:
        tokens_before: The prompt's size before the pass.
        tokens_after: After it.
        records: The record half's report.
        users: The user half's report, or ``None`` when it waited (or was not reached).
        waited: The user half waited for a due record.
        fallback: The fallback-with-holds step's report, when it ran.
        shed: The shed policy's report, when it ran.
    """

    tokens_before: int
    tokens_after: int
    records: RecordReport
    users: UserReport | None = None
    waited: bool = False
    fallback: Report | None = None
    shed: Report | None = None


def step(
    config: CompositionConfig,
    state: CompositionState,
    history: History,
    measure: anchored.Measure,
    *,
    memo: object = None,
) -> StepResult[CompositionState, CompositionReport]:
    """One composed pass (see the module docstring)."""
    del memo
    budget = config.max_input_tokens
    tokens_before = sent_tokens(history)
    passed = records.rules(config.records, history, state.records.decisions, measure)
    output = passed.history
    record_state = replace(state.records, decisions=passed.decisions)
    chain, waiting = _wait(
        state.chain, _clock(output), due=records.record_due(record_state), count=passed.report.records
    )
    user_report: UserReport | None = None
    users = state.users
    if not waiting:
        answer = user_summaries.pass_(config.users, state.users, output, measure)
        if isinstance(answer, Needs):
            # The state to absorb into is the input state: the next step recomputes the rest.
            return Success(Needs(answer.requests, replace(state, users=answer.state)))
        output, users, user_report = answer.history, answer.state, answer.report
    fallback_report = shed_report = None
    fallback_state, shed_state = state.records.fallback, chain.shed
    if sent_tokens(output) > budget:
        fallback_config = config.records.fallback
        assert fallback_config is not None
        output = records.hold_unrecorded(output)
        output, fallback_state, fallback_report = _anchored(fallback_config, fallback_state, output, measure, set())
    if config.overflow_policy == "shed" and sent_tokens(output) > budget:
        output, shed_state, shed_report = _anchored(config.shed, shed_state, output, measure, {HOLD_RECORD})
    tokens_after = sent_tokens(output)
    if tokens_after > budget:
        kept = "anchors, records and protected messages"
        if config.overflow_policy == "raise":
            kept += " and the uncovered results overflow_policy='raise' keeps"
        return Failure(
            CompactionBudgetExceeded(
                f"the prompt is {tokens_after} tokens after every step, over the {budget}-token budget: "
                f"the {kept} alone do not fit",
                needed=tokens_after,
                budget=budget,
            )
        )
    new_state = CompositionState(
        records=replace(record_state, fallback=fallback_state),
        users=users,
        chain=replace(chain, shed=shed_state),
    )
    report = CompositionReport(
        tokens_before=tokens_before,
        tokens_after=tokens_after,
        records=passed.report,
        users=user_report,
        waited=waiting,
        fallback=fallback_report,
        shed=shed_report,
    )
    return Success(Done(history=output, state=new_state, report=report))


def absorb(state: CompositionState, answers: Sequence[tuple[Request, str | None]]) -> CompositionState:
    """Answers are the user half's (summaries, media descriptions)."""
    return replace(state, users=user_summaries.absorb(state.users, answers))


def check(config: CompositionConfig, state: CompositionState, history: History) -> str | None:
    """Why a restored ``state`` cannot belong to ``history``, or ``None``."""
    return records.check(config.records, state.records, history) or anchored.check(
        config.shed, state.chain.shed, history
    )


def _anchored(
    config: AnchoredConfig,
    state: AnchoredSnapshot,
    output: History,
    measure: anchored.Measure,
    shed_holds: set[str],
) -> tuple[History, AnchoredSnapshot, Report]:
    """Run the anchored rules with every held message protected, except holds in ``shed_holds``' complement.

    ``shed_holds`` empty: every hold protects (the fallback with holds). Otherwise only
    the named holds protect, so the rules may shed the other held groups whole.
    """
    keep = {r.origin: r.held for r in output if r.held is not None}

    def protect(record: MessageRecord) -> MessageRecord:
        if record.held is None or (shed_holds and record.held not in shed_holds):
            return record if record.held is None else replace(record, held=None)
        return replace(record, held=None, preserved=True)

    ran = anchored.run(config, state, pvector(protect(r) for r in output), measure)
    restored = pvector(
        replace(r, held=keep[r.origin], preserved=False) if r.origin in keep and not r.excluded else r
        for r in ran.history
    )
    return restored, ran.state, ran.report


def _clock(history: History) -> int:
    """Assistant responses in the conversation (our notes and written records aside): it only grows."""
    return sum(1 for r in history if r.role == "assistant" and not r.note and not r.written_record and not r.injected)


def _wait(chain: ChainDecisions, clock: int, *, due: bool, count: int) -> tuple[ChainDecisions, bool]:
    """Whether the user half waits for a due record on this pass, and the chain's wait state after it."""
    if chain.wait_since is not None and clock < chain.wait_since:
        chain = replace(chain, wait_since=None)  # the clock went back: a restore of an earlier state
    if not due or chain.declined_behind == count:
        return replace(chain, wait_since=None), False
    if chain.wait_since is None:
        return replace(chain, wait_since=clock), True
    if clock - chain.wait_since >= RECORD_WAIT_RESPONSES:
        return replace(chain, wait_since=None, declined_behind=count), False
    return chain, True


def validate(*, harder_attempts: object, chain_gain_fraction: object) -> None:
    """The chain parameters' ranges (``ValueError`` naming the parameter)."""
    require_int("harder_attempts", harder_attempts, minimum=0)
    if not is_number(chain_gain_fraction) or not 0 <= float(chain_gain_fraction) < 1:  # pyright: ignore[reportArgumentType]
        raise ValueError(f"chain_gain_fraction must be in [0, 1), got {chain_gain_fraction!r}")
