"""The composition: records for tool results, summaries for user turns, and a chain that can still make room.

Records cannot touch user turns and narration; user-turn summaries cannot touch tool
results. Past about twice the window neither half alone fits, so one pass runs both,
then, only while the prompt is over the budget, a last-resort chain:

1. **Record half**: the record rules (coverage, holds, asks; :mod:`.records`), without
   their own fallback.
2. **User half** (:mod:`.user_summaries`), unless it is waiting for a record that is
   due: a record about to be written would change what the summary must carry. Only a
   pass that fits the budget waits (over it the user half makes room now). The wait
   lasts at most two model responses, never starts again behind the same record, and
   is dropped when the conversation's clock goes back (a restore). Every break of the
   cached prefix is paid again by the next request, so the user half asks where a break
   costs least (:func:`_user_pass`): on the pass where a record newly excludes tool
   groups (its break is paid anyway, so the user half's trigger and break-even gate do
   not apply), and alone only when the room is needed, that is when the conversation's
   largest step (its largest group) would no longer fit beside the prompt. At that
   point the composition first asks for a record of the tool groups no record holds
   yet, so the user half waits for it and rides on its break.
3. **Record replacements**: the records are merged into one written record, then
   rewritten harder (about 60%, then 36% of the length), each through the user half's
   summarizer and bounded by its ``max_summary_input_tokens``. A replacement is kept only
   when it is smaller than what it replaces AND quotes every distinctive value of it;
   otherwise it is refused (and never asked for again). A request that failed (the
   summarizer raised or answered nothing) is not a refusal: like the user half's, the
   failure stands until the next user turn, when it is asked again; while it stands
   the chain asks for nothing else. Kept replacements are state: they replay on both
   lists and after a restore, whatever the prompt's size.
4. **Emergency folds**: still over the budget, the oldest standing user summaries that
   fit one request (two at least, bounded by ``max_summary_input_tokens``) are folded into
   one with the user half's fold prompt, without the fold mode's profitability gate. A fold
   is kept only when it is smaller than the summaries it replaces AND quotes every
   distinctive value of them; it is judged, kept, refused and replayed like a record
   replacement (and fails the same way: asked again after the next user turn).
5. **Fallback with holds**: every tool group not yet covered is held, and the anchored
   rules shed narration only.
6. **Overflow policy**: ``"shed"`` removes whole unrecorded tool groups, oldest band
   position first, each leaving a removal note the model sees (the shell names every
   lost message in a WARNING); the sheds are watermarks in the state, so they replay on
   both lists and after a restore. ``"raise"`` keeps uncovered results, and under it a group
   counts as covered only when the records quote every one of its values: nothing leaves
   the prompt unquoted.

When what must stay (anchors, records, protected messages, and under ``"raise"`` the
uncovered results) does not fit, the pass answers ``Failure(CompactionBudgetExceeded)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal, TypeAlias, cast

from pyrsistent import pvector
from returns.result import Failure, Success

from . import anchored, records, user_summaries
from .anchored import AnchoredConfig, Report
from .checks import require_int
from .counting import MESSAGE_OVERHEAD_TOKENS
from .effects import Request, Summarize, answered, identity, remember
from .envelope import Count, Positive, Text, convert, distinct, error, inner, opened
from .errors import CompactionBudgetExceeded, SnapshotError
from .model import History, MessageRecord, Part, flagged
from .protocol import Done, Needs, StepResult, sent_tokens
from .records import HOLD_RECORD, RECORD_PREFIX, RecordConfig, RecordReport, RecordState
from .snapshot import AnchoredSnapshot
from .user_snapshot import UserSummarySnapshot
from .user_summaries import UserReport, UserSummaryConfig
from .values import distinctive_values, word_set
from .view import View, view

OverflowPolicy: TypeAlias = Literal["shed", "raise"]
OVERFLOW_POLICIES: Final = ("shed", "raise")
#: Model responses a user half waits for a due record, at most.
RECORD_WAIT_RESPONSES: Final = 2
#: A shed result keeps nothing: sheds remove whole groups, they never shorten.
_NO_SHORTENING: Final = 2**31 - 1
#: The holds the shed policy may release: every hold but a record's own.
_SHEDDABLE: Final = records.HOLD_REASONS - {HOLD_RECORD}
#: Why the records a kept replacement stands for are excluded.
MERGED_REASON: Final = "record_replaced"
REPLACEMENT_ID_PREFIX: Final = "record_replacement_"
_REPLACEMENT_ID: Final = re.compile(rf"{REPLACEMENT_ID_PREFIX}(0|[1-9][0-9]*)")
#: The ids of emergency folds: user summaries, apart from the user half's own (``user_summary_<n>``,
#: ``user_summary_fold_<n>``), which it allocates without seeing the chain's.
EMERGENCY_FOLD_ID_PREFIX: Final = "user_summary_emergency_fold_"
_EMERGENCY_FOLD_ID: Final = re.compile(rf"{EMERGENCY_FOLD_ID_PREFIX}(0|[1-9][0-9]*)")
ReplacementKind: TypeAlias = Literal["merge", "rewrite", "fold"]

DEFAULT_MERGE_PROMPT: Final = (
    "The numbered texts below are compaction records: each lists values from earlier tool results that are no "
    "longer in the conversation. Write one record that replaces all of them. Copy every identifier, code, number, "
    "date, name and exact value verbatim from every record; never paraphrase, round, abbreviate or drop one. Cut "
    "repetition and wording, not values. Reply with the record only."
)


def harder_prompt(attempt: int) -> str:
    """The instructions of harder rewrite ``attempt`` (1, 2, ...): about 60%, then 36% of the length."""
    share = round(100 * 0.6**attempt)
    return (
        "The numbered text below is a compaction record: it lists values from earlier tool results that are no "
        f"longer in the conversation. Rewrite it as one record of at most about {share}% of its current length. "
        "Copy every identifier, code, number, date, name and exact value verbatim; never paraphrase, round, "
        "abbreviate or drop one. Cut repetition and wording, not values. Reply with the record only."
    )


@dataclass(frozen=True, slots=True)
class CompositionConfig:
    """Parameters of the composition; invalid values raise ``ValueError``.

    Attributes:
        records: The record half's parameters, with its anchored fallback.
        users: The user half's parameters (its trigger is the composition's user trigger).
        overflow_policy: ``"shed"`` or ``"raise"`` (see the module docstring); under
            ``"raise"`` records must quote every value of a group (:attr:`record_rules`).
        merge_prompt: The instructions for merging records.
        harder_attempts: Harder rewrites of the merged record the chain may ask for.
    """

    records: RecordConfig
    users: UserSummaryConfig
    overflow_policy: OverflowPolicy = "shed"
    merge_prompt: str = DEFAULT_MERGE_PROMPT
    harder_attempts: int = 2

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
        require_int("harder_attempts", self.harder_attempts, minimum=0)

    @property
    def max_input_tokens(self) -> int:
        """The budget both halves share."""
        return self.records.max_input_tokens

    @property
    def record_rules(self) -> RecordConfig:
        """The record half's rules as the composition runs them.

        Under ``"raise"`` nothing may leave the prompt unquoted, so a tool group leaves only
        when the records quote every one of its distinct values (``coverage_share`` 1.0);
        a group quoted in part stays and is asked for once more, then settled and held.
        """
        if self.overflow_policy == "raise":
            return replace(self.records, coverage_share=1.0)
        return self.records

    @property
    def shed(self) -> AnchoredConfig:
        """The anchored rules the shed policy uses: whole tool groups only, never a shortened result."""
        fallback = self.records.fallback
        assert fallback is not None
        return replace(fallback, keep_tokens=_NO_SHORTENING, collapse_assistant_text=False)


@dataclass(frozen=True, slots=True)
class Replacement:
    """A record replacement (or an emergency fold of user summaries) the chain asked for and judged.

    Attributes:
        identity: The request's identity (prompt and numbered transcript, digested).
        sources: How many records it replaces.
        text: The summarizer's answer, judged on every pass (kept, or refused for good);
            ``None`` when the request failed.
        replacement_id: The id of the written record (or, for a fold, the user summary)
            that stands for them.
        kind: ``"merge"``, ``"rewrite"`` (a harder rewrite) or ``"fold"`` (an emergency
            fold of the oldest user summaries).
        turns: For a failure, the user turns the conversation had when it failed: it
            stands for that conversation state only, and a later one asks again.
    """

    identity: Text
    sources: Positive
    text: Text | None
    replacement_id: Text
    kind: ReplacementKind = "merge"
    turns: Count | None = None

    def stands(self, turns: int) -> bool:
        """This judgement applies to a conversation with ``turns`` user turns (a failure only to its own)."""
        return self.text is not None or self.turns is None or self.turns >= turns


@dataclass(frozen=True, slots=True)
class ChainDecisions:
    """The composition's own decisions that history cannot show.

    Attributes:
        wait_since: The conversation clock when the user half began waiting for a due
            record, or ``None``.
        declined_behind: The record count a wait ended behind: no new wait behind it.
        shed: The shed policy's decisions (watermarks over band tool groups).
        replacements: Record replacements and emergency folds judged so far, kept and
            refused, in order.
    """

    wait_since: int | None = None
    declined_behind: int | None = None
    shed: AnchoredSnapshot = field(default_factory=AnchoredSnapshot)
    replacements: tuple[Replacement, ...] = ()

    def judged(self, request_identity: str) -> Replacement | None:
        """The judged replacement for ``request_identity``, if any."""
        for replacement in self.replacements:
            if replacement.identity == request_identity:
                return replacement
        return None

    def to_dict(self) -> dict[str, object]:
        """The chain's decisions as a JSON-safe, kind-tagged, versioned dict (see :func:`chain_to_dict`)."""
        return chain_to_dict(self)

    @classmethod
    def from_dict(cls, data: object, *, keep_head_groups: int | None = None) -> ChainDecisions:
        """Read :meth:`to_dict`'s output strictly (``SnapshotError`` naming the field)."""
        return chain_from_dict(data, keep_head_groups=keep_head_groups)


@dataclass(frozen=True, slots=True)
class CompositionState:
    """The one state value of a conversation the composition serves."""

    records: RecordState = field(default_factory=RecordState)
    users: UserSummarySnapshot = field(default_factory=UserSummarySnapshot)
    chain: ChainDecisions = field(default_factory=ChainDecisions)

    def to_dict(self) -> dict[str, object]:
        """The whole state as one JSON-safe, kind-tagged, versioned dict (see :func:`state_to_dict`)."""
        return state_to_dict(self)

    @classmethod
    def from_dict(cls, data: object, *, keep_head_groups: int | None = None) -> CompositionState:
        """Read :meth:`to_dict`'s output strictly (see :func:`state_from_dict`)."""
        return state_from_dict(data, keep_head_groups=keep_head_groups)


_CHAIN_FIELDS: Final = ("wait_since", "declined_behind", "shed", "replacements")
#: Version 2 dates failures (``turns``); a version-1 failure has none, so it stands for ever, as it did.
#: Version 3 adds emergency folds (``kind: "fold"``); the fields are those of version 2.
CHAIN_VERSION: Final = 3
#: Version 1 counted the records a merge replaced out of an ask's and a wait's record
#: count, and a merged record as a model response; version 2 counts records written and
#: model responses only. The two agree unless a merge was kept (see state_from_dict).
COMPOSITION_VERSION: Final = 2
_COMPOSITION_FIELDS: Final = (*records.RECORD_STATE_FIELDS, "users", "chain")


def chain_to_dict(chain: ChainDecisions) -> dict[str, object]:
    """The chain's decisions as a JSON-safe, kind-tagged, versioned dict."""
    return {
        "kind": "chain",
        "version": CHAIN_VERSION,
        "wait_since": chain.wait_since,
        "declined_behind": chain.declined_behind,
        "shed": chain.shed.to_dict(),
        "replacements": [
            {
                "identity": r.identity,
                "sources": r.sources,
                "text": r.text,
                "replacement_id": r.replacement_id,
                "kind": r.kind,
                "turns": r.turns,
            }
            for r in chain.replacements
        ],
    }


def chain_from_dict(data: object, *, keep_head_groups: int | None = None) -> ChainDecisions:
    """Read :func:`chain_to_dict`'s output strictly (``SnapshotError`` naming the field)."""
    fields = opened("chain", (1, 2, 3), data, _CHAIN_FIELDS)
    entries = fields["replacements"]
    if fields["version"] == 1 and isinstance(entries, list):  # no turns: a version-1 failure stands for ever
        upgraded: list[object] = []
        for index, entry in enumerate(cast("list[object]", entries)):
            if isinstance(entry, dict) and "turns" in entry:
                raise SnapshotError(f"unknown snapshot field(s) 'replacements[{index}].turns'")
            upgraded.append({**cast("dict[str, object]", entry), "turns": None} if isinstance(entry, dict) else entry)
        entries = upgraded
    replacements: tuple[Replacement, ...] = convert(entries, tuple[Replacement, ...], "replacements")
    for index, r in enumerate(replacements):
        here = f"replacements[{index}]"
        if r.kind == "fold" and cast("int", fields["version"]) < 3:
            raise error(f"{here}.kind", "must be one of 'merge', 'rewrite', got 'fold'")
        if r.text is not None and r.turns is not None:
            raise error(f"{here}.turns", f"an answer with text carries no turns, got {r.turns}")
        fold = r.kind == "fold"
        prefix, pattern = (
            (EMERGENCY_FOLD_ID_PREFIX, _EMERGENCY_FOLD_ID) if fold else (REPLACEMENT_ID_PREFIX, _REPLACEMENT_ID)
        )
        if pattern.fullmatch(r.replacement_id) is None:
            raise error(f"{here}.replacement_id", f"must be {prefix}<n>, got {r.replacement_id!r}")
        if fold and r.sources < 2:
            raise error(f"{here}.sources", f"must be an integer in [2, {2**31 - 1}], got {r.sources}")
    distinct("replacements", [r.identity for r in replacements], what="identity")
    counts = convert({k: fields[k] for k in ("wait_since", "declined_behind")}, _ChainCounts)
    return ChainDecisions(
        wait_since=counts.wait_since,
        declined_behind=counts.declined_behind,
        shed=AnchoredSnapshot.from_dict(inner(fields, "shed"), keep_head_groups=keep_head_groups),
        replacements=replacements,
    )


@dataclass(frozen=True, slots=True)
class _ChainCounts:
    wait_since: Count | None
    declined_behind: Count | None


def state_to_dict(state: CompositionState) -> dict[str, object]:
    """The composition's whole state (both halves, the recall protocol, the chain) as one JSON-safe dict."""
    return {
        "kind": "composition",
        "version": COMPOSITION_VERSION,
        **records.record_state_fields(state.records),
        "users": state.users.to_dict(),
        "chain": chain_to_dict(state.chain),
    }


def state_from_dict(data: object, *, keep_head_groups: int | None = None) -> CompositionState:
    """Read :func:`state_to_dict`'s output strictly; ``keep_head_groups`` checks the anchored positions."""
    fields = opened("composition", (1, 2), data, _COMPOSITION_FIELDS)
    state = CompositionState(
        records=records.record_state_from_fields(fields, keep_head_groups=keep_head_groups),
        users=UserSummarySnapshot.from_dict(inner(fields, "users")),
        chain=chain_from_dict(inner(fields, "chain"), keep_head_groups=keep_head_groups),
    )
    chain = state.chain
    merged = any(r.text is not None for r in chain.replacements)
    counted = (
        state.records.decisions.ask is not None or chain.wait_since is not None or chain.declined_behind is not None
    )
    if fields["version"] == 1 and merged and counted:
        raise error(
            "records",
            "a version-1 snapshot with a kept record merge counts an outstanding ask or wait in records and responses "
            "this version counts differently; it cannot be read without guessing (start the conversation's "
            "compaction state afresh)",
        )
    return state


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
        over_budget: The pass ends over the budget while still making progress (a summary or
            a replacement applied): the next pass continues from it instead of failing.
        replaced: Kept record replacements applied on this pass (fresh or replayed).
        folded: Kept emergency folds applied on this pass (fresh or replayed).
        refused: Identities of the replacements and folds this pass found refused (not
            smaller, or a value of what they replace missing): never asked for again.
        failed: Identities of replacement requests whose failure stands on this pass
            (asked again after the next user turn).
    """

    tokens_before: int
    tokens_after: int
    records: RecordReport
    over_budget: bool = False
    users: UserReport | None = None
    waited: bool = False
    fallback: Report | None = None
    shed: Report | None = None
    replaced: int = 0
    folded: int = 0
    refused: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()


def step(
    config: CompositionConfig,
    state: CompositionState,
    history: History,
    measure: anchored.Measure,
    *,
    memo: object = None,
) -> StepResult[CompositionState, CompositionReport]:
    """One composed pass (see the module docstring); ``memo`` is the last ``Done.memo`` (the record rules')."""
    budget = config.max_input_tokens
    record_memo = memo if isinstance(memo, records.RecordMemo) else None
    seen = view(history, record_memo.view if record_memo else None)
    tokens_before = seen.sent
    passed = records.rules(config.record_rules, seen, state.records.decisions, measure, memo=record_memo)
    memo = passed.memo
    assert isinstance(memo, records.RecordMemo)
    assert memo.view is not None
    seen, output = memo.view, passed.history
    record_state = replace(state.records, decisions=passed.state)
    # When the room is needed (the conversation's largest step would no longer fit beside
    # the prompt), ask for a record of what no record holds yet, before a summary of its own
    # or a shed: the recall middleware pins the next request for it, and the user half waits.
    roomy = _roomy(config, seen)
    if not roomy and not record_state.recall.pin_disabled:
        record_state = replace(record_state, decisions=records.ask_for_pending(seen, record_state.decisions))
    chain, waiting = _wait(
        state.chain,
        records.responses(seen.records),
        due=records.record_due(record_state),
        count=records.records_written(seen.records),
    )
    # Waiting is only for passes that fit: over the budget the user half makes room now.
    waiting = waiting and seen.sent <= budget
    user_report: UserReport | None = None
    users = state.users
    if not waiting:
        answer = _user_pass(config, state.users, output, measure, breaking=bool(passed.report.dropped), roomy=roomy)
        if isinstance(answer, Needs):
            # The state to absorb into is the input state: the next step recomputes the rest.
            return Success(Needs(answer.requests, replace(state, users=answer.state)))
        output, users, user_report = answer.history, answer.state, answer.report
    elif (replayed := _replayed(config, state.users, output, measure)) is not None:
        # A wait holds back new requests only: a summary the other list made replays here too.
        output, users, user_report = replayed.history, replayed.state, replayed.report
    replaced = _Replaced(view(output, seen), chain)
    _replay(config, replaced, measure)
    if replaced.seen.sent > budget:
        request = _next_replacement(config, replaced, measure)
        if request is None and not replaced.failed:
            request = _next_fold(config, replaced, measure)
        if request is not None:
            # The next step recomputes everything from the input state and the absorbed answer.
            return Success(Needs((request,), state))
    output, chain = replaced.output, replaced.chain
    fallback_report = shed_report = None
    fallback_state, shed_state = state.records.fallback, chain.shed
    band = record_memo.band if record_memo else None  # the anchored runs' band, reused by the next run
    # Decisions already made replay on every pass, whatever the size (so both lists and a
    # copy agree); new ones are made only over the budget.
    if replaced.seen.sent > budget or _decided(fallback_state):
        fallback_config = config.records.fallback
        assert fallback_config is not None
        output = records.hold_unrecorded(replaced.seen)
        ran = records.run_with_holds(fallback_config, fallback_state, output, measure, memo=band)
        output, fallback_state, fallback_report, band = ran.history, ran.state, ran.report, ran.memo
    if config.overflow_policy == "shed" and (sent_tokens(output) > budget or _decided(shed_state)):
        ran = records.run_with_holds(config.shed, shed_state, output, measure, releasable=_SHEDDABLE, memo=band)
        output, shed_state, shed_report, band = ran.history, ran.state, ran.report, ran.memo
    tokens_after = sent_tokens(output)
    # The user half makes one bounded request per pass: when it made progress the next pass
    # continues from it (failing now would keep its summary off the list for ever).
    progressed = user_report is not None and bool(user_report.replaced)
    if tokens_after > budget and (not progressed or _protected_tokens(output) > budget):
        kept = "anchors, records and protected messages"
        if config.overflow_policy == "raise":
            kept += " and the uncovered results overflow_policy='raise' keeps"
        refused, failed = tuple(sorted(replaced.refused)), tuple(sorted(replaced.failed))
        return Failure(
            CompactionBudgetExceeded(
                f"the prompt is {tokens_after} tokens after every step, over the {budget}-token budget: "
                f"the {kept} alone do not fit{_chain_outcome(refused, failed)}",
                needed=tokens_after,
                budget=budget,
                refused=refused,
                failed=failed,
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
        over_budget=tokens_after > budget,
        records=passed.report,
        users=user_report,
        waited=waiting,
        fallback=fallback_report,
        shed=shed_report,
        replaced=replaced.applied,
        folded=replaced.folded,
        refused=tuple(sorted(replaced.refused)),
        failed=tuple(sorted(replaced.failed)),
    )
    return Success(Done(history=output, state=new_state, report=report, memo=replace(memo, band=band)))


def _chain_outcome(refused: Sequence[str], failed: Sequence[str]) -> str:
    """What the chain could not use on a failing pass, for the error's message (nothing is lost silently)."""
    said = [f"{len(refused)} record replacement(s) or emergency fold(s) refused"] if refused else []
    if failed:
        said.append(f"{len(failed)} failed (asked again after the next user turn)")
    return f" ({'; '.join(said)})" if said else ""


_APPLIED: Final = frozenset({user_summaries.Outcome.SUMMARIZED, user_summaries.Outcome.FOLDED})


def _user_pass(
    config: CompositionConfig,
    users: UserSummarySnapshot,
    output: History,
    measure: anchored.Measure,
    *,
    breaking: bool,
    roomy: bool,
) -> user_summaries.UserNeeds | user_summaries.UserDone:
    """The user half's pass within the composition: when it may ask, and what it replays.

    - **Replays** of answers the state remembers apply on every pass, whatever the size,
      so both lists and a restored copy agree.
    - **Riding on a record's break**: when the record half newly excludes groups on this
      pass (``breaking``), the cached prefix breaks right after the head anyway, so a
      summary asked for on the same pass costs no break of its own: the user half's size
      trigger and break-even gate do not apply to it (its band must still be worth a call).
    - **Alone**, while the prompt fits, a summary breaks the prefix for itself, and each
      later call pays about a tenth of what it saves, so it is asked for only when the
      room is needed: when the largest group the conversation has seen (a lookup, a long
      turn) would no longer fit beside the prompt, so the next step like it would
      overflow. Over the budget the user half asks as it would alone.
    """
    if not breaking and roomy:
        return _replayed(config, users, output, measure) or _declined(users, output)
    answer = user_summaries.pass_(config.users, users, output, measure)
    if isinstance(answer, Needs) or answer.report.outcome in _APPLIED:
        return answer
    if breaking:
        # The gates off: this pass asks, or applies a remembered answer, if anything can.
        free = user_summaries.pass_(config.users, users, output, measure, gates=False)
        return free if isinstance(free, Needs) or free.report.outcome in _APPLIED else answer
    return _replayed(config, users, output, measure) or answer


def _replayed(
    config: CompositionConfig, users: UserSummarySnapshot, output: History, measure: anchored.Measure
) -> user_summaries.UserDone | None:
    """A remembered summary this list does not show yet, applied whatever the gates; else ``None``."""
    if not _unreplayed(users, output):
        return None
    free = user_summaries.pass_(config.users, users, output, measure, gates=False)
    return free if isinstance(free, Done) and free.report.outcome in _APPLIED else None


def _unreplayed(users: UserSummarySnapshot, output: History) -> bool:
    """A remembered summary is not in ``output`` yet (this list has not replayed it)."""
    present = {r.message_id for r in output if r.summary}
    return any(a.text is not None and a.summary_id not in present for a in users.answers)


def _declined(users: UserSummarySnapshot, output: History) -> user_summaries.UserDone:
    tokens = sent_tokens(output)
    report = UserReport(tokens_before=tokens, tokens_after=tokens, outcome=user_summaries.Outcome.DECLINED)
    return Done(history=output, state=users, report=report)


def _roomy(config: CompositionConfig, seen: View) -> bool:
    """The largest step the conversation has taken (its largest group, excluded ones too) still fits."""
    conversation = seen.records
    largest = max((sum(conversation[i].tokens for i in g.members) for g in seen.grouping.all), default=0)
    return seen.sent + largest <= config.max_input_tokens


#: The request kinds the chain asks for, and the kind of replacement each judges.
_CHAIN_KINDS: Final[Mapping[str, ReplacementKind]] = {"merge": "merge", "rewrite": "rewrite", "emergency_fold": "fold"}


def absorb(state: CompositionState, answers: Sequence[tuple[Request, str | None]]) -> CompositionState:
    """Record replacements and emergency folds go to the chain (judged on the next step); the rest to the user half."""
    mine = [(r, a) for r, a in answers if isinstance(r, Summarize) and r.kind in _CHAIN_KINDS]
    others = [(r, a) for r, a in answers if (r, a) not in mine]
    chain = state.chain
    for request, text in mine:
        assert isinstance(request, Summarize)
        a = answered(request, text)
        judged = Replacement(
            a.identity, request.sources, a.text, request.summary_id, _CHAIN_KINDS[request.kind], a.turns
        )
        chain = replace(chain, replacements=remember(chain.replacements, judged))
    return replace(state, users=user_summaries.absorb(state.users, others) if others else state.users, chain=chain)


def check(config: CompositionConfig, state: CompositionState, history: History) -> str | None:
    """Why a restored ``state`` cannot belong to ``history``, or ``None``."""
    return (
        records.check(config.records, state.records, history)
        or anchored.check(config.shed, state.chain.shed, history)
        or user_summaries.colliding_summary_id(state.users, history, field="users.answers")
    )


@dataclass(slots=True)
class _Replaced:
    """Working state of the record-replacement step (local to :func:`step`)."""

    seen: View  # of the output so far
    chain: ChainDecisions
    applied: int = 0
    folded: int = 0
    refused: set[str] = field(default_factory=set[str])
    failed: set[str] = field(default_factory=set[str])
    records: tuple[View, list[_Record]] | None = None

    @property
    def output(self) -> History:
        return self.seen.history

    def put(self, output: History) -> None:
        """Continue from ``output`` (a replacement or a fold applied)."""
        self.seen = view(output, self.seen)

    def active(self, measure: anchored.Measure) -> list[_Record]:
        """:func:`_active_records` of the output so far (derived once per output)."""
        if self.records is None or self.records[0] is not self.seen:
            self.records = (self.seen, _active_records(self.seen, measure))
        return self.records[1]


@dataclass(frozen=True, slots=True)
class _Record:
    index: int  # into the history
    text: str  # the record's values, without the record prefix
    tokens: int  # as a written record message
    run: int = 0  # records form one run: any prefix of them may be replaced together


def _active_records(seen: View, measure: anchored.Measure) -> list[_Record]:
    """The conversation's active records that a replacement may stand for, oldest first.

    Only records whose group holds nothing else (a recall call and its result, or a
    written record): a replacement excludes the whole group, and a tool call made beside
    the recall call has a result no replacement quotes.
    """
    output, indices, conversation, recall_ids = seen.history, seen.indices, seen.records, seen.recall_ids
    mixed: set[int] = set()
    for group in seen.grouping.all:
        for member in group.members:
            record = conversation[member]
            calls_other = any(name != records.RECALL_TOOL_NAME for name in record.call_names)
            answers_other = any(p.kind == "function_result" and p.call_id not in recall_ids for p in record.parts)
            if calls_other or answers_other:
                mixed.update(indices[m] for m in group.members)
                break
    found: list[_Record] = []
    for index, record in enumerate(output):
        if record.injected or record.note or index in mixed:
            continue
        text = records.record_text(record, recall_ids)
        if not text:
            continue
        body = text.split(records.RECORD_MARKER, 1)[-1].removeprefix(" " + records.RECORD_PREAMBLE).strip()
        found.append(_Record(index, body, _written_tokens(body, measure)))
    return found


def _written_text(body: str) -> str:
    return f"{RECORD_PREFIX}\n{body.strip()}"


def _written_tokens(body: str, measure: anchored.Measure) -> int:
    return MESSAGE_OVERHEAD_TOKENS + measure(_written_text(body))


def _prompts(config: CompositionConfig) -> list[tuple[Literal["merge", "rewrite"], str]]:
    """(kind, prompt) of every replacement the chain may ask for: the merge, then each harder rewrite."""
    prompts: list[tuple[Literal["merge", "rewrite"], str]] = [("merge", config.merge_prompt)]
    for attempt in range(1, config.harder_attempts + 1):
        prompts.append(("rewrite", harder_prompt(attempt)))
    return prompts


def _request(
    kind: Literal["merge", "rewrite"], prompt: str, items: Sequence[_Record], replacement_id: str, turns: int = 0
) -> Summarize:
    return _chain_request("record_replacement", kind, prompt, items, replacement_id, turns=turns)


def _chain_request(
    label: str,
    kind: Literal["merge", "rewrite", "emergency_fold"],
    prompt: str,
    items: Sequence[_Record] | Sequence[_Summary],
    replacement_id: str,
    *,
    turns: int,
) -> Summarize:
    """A chain step's summarizer request (record merge or rewrite, emergency fold), keyed by what it replaces."""
    transcript = user_summaries.numbered(items)
    return Summarize(
        identity=identity(label, prompt, len(items), transcript),
        prompt=prompt,
        transcript=transcript,
        sources=len(items),
        summary_id=replacement_id,
        kind=kind,
        turns=turns,
    )


def _acceptable(text: str | None, items: Sequence[_Record], measure: anchored.Measure) -> bool:
    """Kept only when smaller than what it replaces (like for like) AND every distinctive value survives."""
    if not text:
        return False
    if _written_tokens(text, measure) >= sum(i.tokens for i in items):
        return False
    quoted = word_set(text)
    return all(value in quoted for i in items for value in distinctive_values(i.text))


def _replay(config: CompositionConfig, work: _Replaced, measure: anchored.Measure) -> None:
    """Apply every kept replacement whose records are in the conversation, in the order they were kept."""
    for judged in work.chain.replacements:
        if judged.text is None:
            continue  # a failure, not a refusal: :func:`_next_replacement` decides when to ask again
        if judged.kind == "fold":
            _replay_fold(config, work, judged, measure)
            continue
        items = work.active(measure)[: judged.sources]
        if len(items) < judged.sources:
            continue
        if not any(
            _request(kind, prompt, items, judged.replacement_id).identity == judged.identity
            for kind, prompt in _prompts(config)
        ):
            continue
        if _acceptable(judged.text, items, measure):
            work.put(_apply_replacement(work.seen, items, judged, measure))
            work.applied += 1
        else:
            work.refused.add(judged.identity)


def _next_number(output: History, prefix: str, kept: int) -> int:
    """The number of the next id with ``prefix``: past the ``kept`` decisions of its kind and every such id in use."""
    used = [r.message_id[len(prefix) :] for r in output if r.message_id and r.message_id.startswith(prefix)]
    return max([kept, *(int(suffix) + 1 for suffix in used if suffix.isdigit())])


def _next_replacement(config: CompositionConfig, work: _Replaced, measure: anchored.Measure) -> Summarize | None:
    """The next replacement to ask for while over the budget, or ``None``.

    The merge of the oldest records that fit the request bound (two at least), then the
    harder rewrites (at most ``harder_attempts`` since the last kept merge); an identity
    once judged (kept or refused) is never asked for again. Kept ones were applied by
    :func:`_replay`; refused ones are counted in ``work.refused``. A failure stands until
    the next user turn, and while it stands nothing more is asked on this pass (the
    summarizer just failed: no retry storm); after it, the same request is asked again.
    """
    items = work.active(measure)
    limit = config.users.summary_input_limit
    turns = user_summaries.user_turns(work.output)
    kept = sum(1 for r in work.chain.replacements if r.text is not None and r.kind != "fold")
    number = _next_number(work.output, REPLACEMENT_ID_PREFIX, kept)
    rewrites = 0  # harder rewrites kept since the last merge: at most harder_attempts
    for judged in reversed(work.chain.replacements):
        if judged.kind == "merge" and judged.text is not None:
            break
        rewrites += judged.kind == "rewrite" and judged.text is not None
    for kind, prompt in _prompts(config):
        if kind == "rewrite" and rewrites >= config.harder_attempts:
            break
        selected = user_summaries.select(prompt, items, limit, measure, minimum=2 if kind == "merge" else 1)
        if not selected:
            continue
        request = _request(kind, prompt, selected, f"{REPLACEMENT_ID_PREFIX}{number}", turns)
        judged = work.chain.judged(request.identity)
        if judged is None or not judged.stands(turns):
            return request
        if judged.text is None:
            work.failed.add(judged.identity)
            return None
        if not _acceptable(judged.text, selected, measure):
            work.refused.add(judged.identity)  # refused once: never asked for again
    return None


@dataclass(frozen=True, slots=True)
class _Summary:
    """A standing user summary an emergency fold may stand for."""

    index: int  # into the history
    text: str  # the summary's body, without the marker
    tokens: int
    run: int = 0  # folds take any prefix of the standing summaries, like the user half's own


def _standing_summaries(output: History) -> list[_Summary]:
    """The conversation's standing user summaries (ours, folds included), oldest first."""
    return [
        _Summary(index, user_summaries.summary_body(record), record.tokens)
        for index, record in enumerate(output)
        if record.summary and record.role == "user" and not record.excluded and not record.injected
    ]


def _fold_request(prompt: str, items: Sequence[_Summary], fold_id: str, turns: int = 0) -> Summarize:
    return _chain_request("emergency_fold", "emergency_fold", prompt, items, fold_id, turns=turns)


def _fold_acceptable(text: str | None, items: Sequence[_Summary], fold_id: str, measure: anchored.Measure) -> bool:
    """Kept only when smaller than the summaries it replaces AND every distinctive value of theirs survives."""
    if not text or not text.strip():
        return False
    if user_summaries.summary_record(text, fold_id, measure).tokens >= sum(i.tokens for i in items):
        return False
    quoted = word_set(text)
    return all(value in quoted for i in items for value in distinctive_values(i.text))


def _replay_fold(config: CompositionConfig, work: _Replaced, judged: Replacement, measure: anchored.Measure) -> None:
    """Apply a kept emergency fold when the oldest standing summaries are the ones it folded."""
    items = _standing_summaries(work.output)[: judged.sources]
    if len(items) < judged.sources:
        return
    if _fold_request(config.users.fold_prompt, items, judged.replacement_id).identity != judged.identity:
        return
    if _fold_acceptable(judged.text, items, judged.replacement_id, measure):
        work.put(_apply_fold(work.output, items, judged, measure))
        work.folded += 1
    else:
        work.refused.add(judged.identity)


def _next_fold(config: CompositionConfig, work: _Replaced, measure: anchored.Measure) -> Summarize | None:
    """The emergency fold to ask for while still over the budget, or ``None``.

    The oldest standing user summaries whose fold request fits ``max_summary_input_tokens``
    (two at least). An identity once judged is never asked for again (a kept one was
    applied by :func:`_replay`); a failure stands until the next user turn.
    """
    items = _standing_summaries(work.output)
    prompt = config.users.fold_prompt
    selected = user_summaries.select(prompt, items, config.users.summary_input_limit, measure, minimum=2)
    if not selected:
        return None
    turns = user_summaries.user_turns(work.output)
    kept = sum(1 for r in work.chain.replacements if r.kind == "fold" and r.text is not None)
    number = _next_number(work.output, EMERGENCY_FOLD_ID_PREFIX, kept)
    request = _fold_request(prompt, selected, f"{EMERGENCY_FOLD_ID_PREFIX}{number}", turns)
    judged = work.chain.judged(request.identity)
    if judged is None or not judged.stands(turns):
        return request
    if judged.text is None:
        work.failed.add(judged.identity)
    elif not _fold_acceptable(judged.text, selected, judged.replacement_id, measure):
        work.refused.add(judged.identity)
    return None


def _apply_fold(output: History, items: Sequence[_Summary], judged: Replacement, measure: anchored.Measure) -> History:
    """Exclude the folded summaries (linked to the fold); insert the fold where the first stood."""
    assert judged.text is not None
    rebuilt = list(output)
    replaced_ids: list[str] = []
    for item in items:
        record = rebuilt[item.index]
        rebuilt[item.index] = replace(
            record, excluded=True, reason=user_summaries.FOLD_EXCLUDE_REASON, replaced_by=judged.replacement_id
        )
        if record.message_id:
            replaced_ids.append(record.message_id)
    fold = user_summaries.summary_record(judged.text, judged.replacement_id, measure)
    fold = replace(fold, replaces=tuple(replaced_ids))
    rebuilt.insert(items[0].index, fold)
    return pvector(rebuilt)


def _apply_replacement(seen: View, items: Sequence[_Record], judged: Replacement, measure: anchored.Measure) -> History:
    """Exclude the replaced records with their groups; insert the written record where the first stood."""
    assert judged.text is not None
    conversation = seen.indices
    position = {index: k for k, index in enumerate(conversation)}
    targets = {position[i.index] for i in items}
    members = sorted(conversation[m] for g in seen.grouping.all if targets & set(g.members) for m in g.members)
    rebuilt = list(seen.history)
    replaced_ids: list[str] = []
    for index in members:
        record = rebuilt[index]
        if not record.excluded:
            rebuilt[index] = flagged(record, excluded=True, reason=MERGED_REASON, replaced_by=judged.replacement_id)
            if record.message_id:
                replaced_ids.append(record.message_id)
    text = _written_text(judged.text)
    text_tokens = measure(text)
    written = MessageRecord(
        role="assistant",
        parts=(Part(kind="text", text=text, tokens=text_tokens),),
        tokens=MESSAGE_OVERHEAD_TOKENS + text_tokens,
        message_id=judged.replacement_id,
        written_record=True,
        held=HOLD_RECORD,
        replaces=tuple(replaced_ids),
    )
    rebuilt.insert(members[0], written)
    return pvector(rebuilt)


def _protected_tokens(output: History) -> int:
    """What no step may remove: records, host-preserved messages and injected context."""
    return sum(r.tokens for r in output if not r.excluded and (r.held == HOLD_RECORD or r.preserved or r.injected))


def _decided(state: AnchoredSnapshot) -> bool:
    """The anchored rules have shed or committed something that must replay."""
    return bool(state.tools_shed or state.texts_shed or state.shortened)


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
