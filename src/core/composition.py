"""The composition: records for tool results, summaries for user turns, and a chain that can still make room.

Records cannot touch user turns and narration; user-turn summaries cannot touch tool
results. Past about twice the window neither half alone fits, so one pass runs both,
then, only while the prompt is over the budget, a last-resort chain:

1. **Record half**: the record rules (coverage, holds, asks; :mod:`.records`), without
   their own fallback.
2. **User half** (:mod:`.user_summaries`), unless it is waiting for a record that is
   expected: a record about to be written would change what the summary must carry. Only a
   pass that fits the budget waits (over it the user half makes room now). The wait
   lasts at most two model responses from the ask it waits for, never starts again behind the same record, and
   is dropped when the conversation's clock goes back (a restore). Every break of the
   cached prefix is paid again by the next request, so the user half asks where a break
   costs least (:func:`_user_pass`): on the pass where a record newly excludes tool
   groups (its break is paid anyway, so the user half's trigger and break-even gate do
   not apply) or where the safety net cuts groups in a record's place (no route to a
   record left: its first cut, and later cuts once a step like the largest would pass
   the record trigger), and alone only when the room is needed, that is when the
   conversation's largest step (its largest group; a tool step with room for a record's
   instruction when records go over the cached prefix) would no longer fit beside the
   prompt. At that point the composition first asks for a record of the tool groups no
   record holds yet, so the user half waits for it and rides on its break; when no record
   would pay for them, the shed policy makes the room and the summary rides on its break.
   The short user turns right after the head, before the first summary, stay verbatim
   (:attr:`.user_summaries.UserSummaryConfig.keep_short_turns`, which the composition sets).
3. **Record replacements**: the records are merged into one written record, then
   rewritten harder (about 60%, then 36% of the length), each through the user half's
   summarizer and bounded by its ``max_summary_input_tokens``. A replacement is kept only
   when it is smaller than what it replaces AND quotes every distinctive value of it;
   otherwise it is refused (and never asked for again); one that asks no less of records a
   lossy answer stood for is not asked at all (:func:`_skipped`). A request that failed (the
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
5. **Fallback with holds**: every tool group not yet covered is held, the safety net cuts
   the band's to their value lines, and the anchored rules shed narration only. With no
   route to a record left, the net cuts past the record trigger in the record's place, and
   keeps pace after its first cut (:func:`.records.net_ceiling`).
6. **Overflow policy**: ``"shed"`` removes whole unrecorded tool groups, oldest band
   position first, each leaving a removal note the model sees (the shell names every
   lost message in a WARNING); the sheds are watermarks in the state, so they replay on
   both lists and after a restore. It also sheds before the budget, down to
   :data:`ROOM_LOW_WATER_FRACTION` of it, when the room a step like the largest needs can
   come from nothing else (no record is expected to make it, or the pass began over the
   budget: its break is paid now, an expected record comes on a break of its own, and the
   groups left are ones no record would pay for): the user half's summary for that room rides
   on its break (:func:`_room_to_shed`). When only the newest tool group
   could be shed, or the prompt is under the low water, the summary waits for the next
   step's pass: over the budget then, the summary and any shed share one break.
   ``"raise"`` keeps uncovered results, and under it a group counts as covered only when
   the records quote every one of its values: nothing leaves the prompt unquoted.

When what must stay (anchors, records, protected messages, and under ``"raise"`` the
uncovered results) does not fit, the pass raises :class:`~.errors.CompactionBudgetExceeded`.

The pass reads and writes the conversation's one :class:`~.state.State`; it is a
configuration of one :mod:`.pipeline`: each step above is a sub-step
(``_record_rules``, ``_users``, ``_replay`` and ``_ask`` for the replacements and folds,
``_fallback``, ``_shed``) speaking ``Needs | Done`` over the pass's view, in the order of
``_STEPS`` for the overflow policy; the budget verdict and the report close it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal, TypeAlias, cast

from msgspec.structs import replace as evolve
from pyrsistent import pvector

from . import anchored, pipeline, records, user_summaries
from .anchored import AnchoredConfig, Report
from .checks import AtLeastOne, AtLeastZero, NonEmpty, validate
from .effects import Request, standing
from .errors import CompactionBudgetExceeded
from .fingerprint import FINGERPRINT
from .model import History, MessageRecord
from .protocol import Done, Needs, Step, sent_tokens
from .recall import no_route, records_over_prefix
from .records import HOLD_RECORD, RecordConfig, RecordReport
from .state import CHAIN_KINDS, Answer, ChainDecisions, RecallState, RecordRoute, RequestKind, State
from .summary_check import omissions
from .user_summaries import UserReport, UserSummaryConfig
from .values import distinctive_values, word_set
from .view import View, view

OverflowPolicy: TypeAlias = Literal["shed", "raise"]
DEFAULT_OVERFLOW_POLICY: Final[OverflowPolicy] = "shed"
#: Model responses a user half waits for an expected record, at most.
RECORD_WAIT_RESPONSES: Final = 2
#: The holds the shed policy may release: every hold but a record's own.
_SHEDDABLE: Final = records.HOLD_REASONS - {HOLD_RECORD}
#: Why the records a kept replacement stands for are excluded.
MERGED_REASON: Final = records.REPLACED_REASON
REPLACEMENT_ID_PREFIX: Final = records.REPLACEMENT_ID_PREFIX
#: The ids of emergency folds: user summaries, apart from the user half's own (``user_summary_<n>``,
#: ``user_summary_fold_<n>``), which it allocates without seeing the chain's.
EMERGENCY_FOLD_ID_PREFIX: Final = "user_summary_emergency_fold_"
#: How the user half's summaries are asked for (:attr:`CompositionConfig.summary_request`).
SummaryRequest: TypeAlias = Literal["summarizer", "cached_prefix"]
DEFAULT_HARDER_ATTEMPTS: Final = 2
#: How far the shed policy sheds, as a share of the budget, at most (the fallback's low water when lower). A shed
#: removes whole tool groups and breaks the cached prefix whatever it removes; going deeper than the fallback's
#: shortening leaves room for the next steps before the next break (measured on value-dense results, where no record
#: pays and the shed carries the conversation: docs/composition.md, "Overflow policy").
SHED_LOW_WATER_FRACTION: Final = 0.6
#: How far a shed made for room before the budget goes (:func:`_room_to_shed`), as a share of the budget, judged on
#: the prompt before the summary that rides on it. Shallower than an over-budget shed: the step it makes room for
#: may never come, and what it sheds is lost for good (measured on number-dense logs and reads of the standard
#: library, seeds 1-3: 0.6 kept fewer facts than the framework's default at 1.5x the window; docs/composition.md).
ROOM_LOW_WATER_FRACTION: Final = 0.7

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
        summary_request: How the user half's summaries and folds are asked for:
            ``"summarizer"`` sends the summarizer ``[system(prompt), user(transcript)]``;
            ``"cached_prefix"`` sends the conversation's own request plus one instruction
            that names the items by their opening words (read from the provider's cache),
            through the agent's client, falling back to the summarizer when that cannot be
            sent (no request seen yet, or an item outside what fits the budget).
        answer_tokens: The most an answer over the cached prefix may hold: the output cap of the request it
            repeats, less the thinking budget spent before the answer (``None``: no cap known). Not a
            parameter of the strategy: the shell sets it on each pass from the conversation's last request
            (:func:`_with_summary` reads it).
    """

    records: RecordConfig
    users: UserSummaryConfig
    overflow_policy: OverflowPolicy = DEFAULT_OVERFLOW_POLICY
    merge_prompt: NonEmpty = DEFAULT_MERGE_PROMPT
    harder_attempts: AtLeastZero = DEFAULT_HARDER_ATTEMPTS
    summary_request: SummaryRequest = "summarizer"
    answer_tokens: AtLeastOne | None = field(default=None, metadata={FINGERPRINT: False})

    def __post_init__(self) -> None:
        validate(self)
        if self.records.max_input_tokens != self.users.max_input_tokens:
            raise ValueError(
                "tool_results and user_turns must have the same max_input_tokens, got "
                f"{self.records.max_input_tokens} and {self.users.max_input_tokens}"
            )
        if self.records.fallback is None:
            raise ValueError("the record half's fallback must be the anchored rules within the pass")

    @property
    def max_input_tokens(self) -> int:
        """The budget both halves share."""
        return self.records.max_input_tokens

    @property
    def record_rules(self) -> RecordConfig:
        """The record half's rules as the composition runs them.

        Under ``"raise"`` nothing may leave the prompt unquoted, so a tool group leaves only
        when the records quote every one of its distinct values (``coverage_share`` 1.0);
        a group quoted in part stays whole (it is not cut to its value lines) and is asked
        for once more, then settled and held.
        """
        return replace(self.records, coverage_share=1.0) if self.overflow_policy == "raise" else self.records


@dataclass(frozen=True, slots=True)
class CompositionReport:
    """What a pass did.

    Attributes:
        tokens_before: The prompt's size before the pass.
        tokens_after: After it.
        records: The record half's report.
        users: The user half's report, or ``None`` when it waited (or was not reached).
        waited: The user half waited for an expected record.
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
        skipped: Identities of record replacements not asked on this pass: an answer over records
            they stand for already left one of their values out (:func:`_next`).
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
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Pass:
    """The working state one composed pass threads through its sub-steps.

    Attributes:
        state: The state after the sub-steps so far.
        report: The report so far (its token counts and verdict are set at the end).
        memo: The record rules' memo (the input's, then their answer's).
        band: The anchored runs' band, handed run to run.
        roomy: A step like the conversation's largest still fits beside the prompt
            (:func:`_after_next_step`).
        netting: The safety net breaks on this pass (judged on the prompt before the user
            half's summary): the fallback distills whatever the summary leaves.
        room: Tokens the shed policy frees on this pass before the prompt is over the budget
            (judged on the prompt before the user half's summary, :func:`_room_to_shed`); 0 when it waits.
        given: The history handed to the pass (a summary asked over the cached prefix repeats it, with
            the records written before this request placed: :func:`_over_prefix`).
    """

    state: State
    report: CompositionReport
    memo: records.RecordMemo | None
    band: object = None
    roomy: bool = True
    netting: bool = False
    room: int = 0
    given: History = field(default_factory=pvector)


_Answer: TypeAlias = Needs | Done[_Pass, None]


def step(
    config: CompositionConfig, state: State, history: History, measure: anchored.Measure, *, memo: object = None
) -> Step[State, CompositionReport]:
    """One composed pass (see the module docstring); ``memo`` is the last ``Done.memo`` (the record rules')."""
    budget = config.max_input_tokens
    record_memo = memo if isinstance(memo, records.RecordMemo) else None
    # An exclusion whose replacement the list lost is undone first: the replay puts a kept one back.
    given = user_summaries.relinked(history)
    history = records.place_written(given, records.written(state), measure)
    seen = view(history, record_memo.view if record_memo else None)
    # The record half's report is a placeholder until its sub-step runs.
    report = CompositionReport(seen.sent, seen.sent, records=RecordReport(seen.sent, seen.sent))
    work = _Pass(state, report, record_memo, record_memo.band if record_memo else None, given=given)
    ran = pipeline.run(_STEPS[config.overflow_policy], config, work, seen, measure)
    if isinstance(ran, Needs):
        return ran
    output, done = ran
    tokens_after = sent_tokens(output)
    report = replace(done.report, tokens_after=tokens_after, over_budget=tokens_after > budget)
    # The user half makes one bounded request per pass: when it made progress the next pass
    # continues from it (failing now would keep its summary off the list for ever).
    progressed = report.users is not None and bool(report.users.replaced)
    if tokens_after > budget and (not progressed or _protected_tokens(output) > budget):
        kept = "anchors, records and protected messages"
        if config.overflow_policy == "raise":
            kept += " and the uncovered results overflow_policy='raise' keeps"
        raise CompactionBudgetExceeded(
            f"the prompt is {tokens_after} tokens after every step, over the {budget}-token budget: "
            f"the {kept} alone do not fit{_chain_outcome(report)}",
            needed=tokens_after,
            budget=budget,
            refused=report.refused,
            failed=report.failed,
            skipped=report.skipped,
        )
    assert done.memo is not None
    return Done(history=output, state=done.state, report=report, memo=replace(done.memo, band=done.band))


def _summaries_over_prefix(config: CompositionConfig, recall_state: RecallState) -> bool:
    """The user half's summaries go over the cached prefix: configured so, neither that route nor the
    records' was given up, and it does not rest after failures."""
    return (
        config.summary_request == "cached_prefix"
        and recall_state.route is not RecordRoute.NONE
        and not recall_state.summaries_to_summarizer
        and recall_state.resting == 0
    )


def _over_prefix(
    config: CompositionConfig, state: State, given: History, measure: anchored.Measure, needs: Needs
) -> Needs:
    """``needs`` with the user half's summaries and folds sent over the cached prefix, when configured.

    The prefix is the prompt as it stands: the history handed to the pass (``given``) with the
    records written before this request placed (one asked on this request, which stands before
    the conversation's newest group, is not in the cached request yet), cut between groups to
    what the last request sent (:meth:`.records.RecordConfig.prefix_tokens`); a request whose
    items it does not hold stays with the summarizer.
    """
    if not _summaries_over_prefix(config, state.recall):
        return needs
    here = records.record_place(given)
    prompt = records.place_written(given, [w for w in records.written(state) if w.after != here], measure)

    def sent(request: Request) -> Request | None:
        if request.kind not in (RequestKind.SUMMARY, RequestKind.FOLD):
            return None
        size = measure(request.prompt) + sum(measure(o) for o in request.openings) + 64
        fitting = records.fitting_prefix(prompt, config.records.prefix_tokens(state.recall, size))
        return None if fitting is None else user_summaries.over_prefix(request, fitting)

    return Needs(tuple(sent(request) or request for request in needs.requests))


def _with_summary(
    config: CompositionConfig, state: State, seen: View, asked: Request, measure: anchored.Measure
) -> Request:
    """``asked`` (a record over the cached prefix) asking in the same request for the summary the user half will
    want on this pass, when summaries go over the cached prefix too.

    The record's break is the user half's to ride, so it summarises on this pass (its gates off); its items
    are the user turns, which the record does not change, so the summary it asks for once the record is in
    is, as a rule, the one guessed here over the prompt as it stands: then its answer is already known. When
    it is not (or the answer came without a summary part), the pass asks as it would have. ``seen`` is the
    view of the prompt as it stands, the one the record was asked over.
    """
    if not _summaries_over_prefix(config, state.recall):
        return asked
    ran = _user_pass(config, state, seen.history, measure, breaking=True, roomy=True)
    if not isinstance(ran, Needs):
        return asked
    wanted = [r for r in ran.requests if r.kind is RequestKind.SUMMARY]
    sent = user_summaries.over_prefix(wanted[0], asked.view) if wanted and asked.view is not None else None
    if sent is None or asked.view is None:
        return asked
    both = records.with_summary(asked, sent)
    # The view was cut for the record's instruction alone: both must still fit what the request may send.
    limit = config.records.prefix_tokens(state.recall, records.instruction_tokens(measure, both.instruction))
    return both if sent_tokens(asked.view) <= limit and _answer_fits(config, seen, both, measure) else asked


def _answer_fits(config: CompositionConfig, seen: View, both: Request, measure: anchored.Measure) -> bool:
    """Whether the answer ``both`` asks for (a record, the section line, a summary) is expected to fit the output
    cap it will be sent with (:attr:`CompositionConfig.answer_tokens`; any answer fits when none is known).

    One cap bounds the whole answer. Past it the provider cuts the answer, and the
    summary written last is what the cut takes (:func:`.answers.cut_answer` keeps the
    complete lines). A model that rations its answer to the cap instead shortens that
    summary until the summary check refuses it. Either way the summary is asked again
    alone. Asked alone from the start, the record gets the whole cap and the summary
    goes in a request of its own over the same cached prefix (it rides on the record's
    break all the same). The record is expected to quote its results' values with the
    prose the conversation's records carried (:func:`.records.expected_record_tokens`); the summary,
    to carry what the summary check asks of it with a sentence or two per item.
    """
    if config.answer_tokens is None:
        return True
    assert both.also is not None
    record = records.expected_record_tokens(both, seen, measure)
    summary = user_summaries.expected_summary_tokens(both.also, measure)
    return record + measure(f"\n{records.SUMMARY_SECTION}\n") + summary <= config.answer_tokens


def _record_rules(config: CompositionConfig, work: _Pass, seen: View, measure: anchored.Measure) -> _Answer:
    """The record rules; when the room is needed, an ask for a record of what no record holds yet.

    The ask comes before a summary of the user half's own or a shed: the recall middleware
    pins the next request for it, and the user half waits (:func:`_users`).
    """
    rules, cut_thin = config.record_rules, config.overflow_policy != "raise"
    passed = records.rules(rules, seen, work.state.records, measure, memo=work.memo, cut_thin=cut_thin)
    memo = passed.memo
    assert isinstance(memo, records.RecordMemo)
    assert memo.view is not None
    # A record due on this request is asked over the prompt as it stands (every record applied: the last request
    # and what came since), before anything new is decided; else at the pass's end (:func:`_record_over_prefix`).
    asked = records.ask_over(config.records, work.state, passed.history, measure)
    if asked is not None:
        return Needs((_with_summary(config, work.state, memo.view, asked, measure),))
    # The largest step the conversation has taken still fits beside the prompt; when it does not, what no record
    # holds yet is asked for (pinned, or asked over the cached prefix once pinning is given up).
    roomy = _after_next_step(memo.view, work.state.recall, measure) <= config.max_input_tokens
    decisions = passed.state if roomy else records.ask_for_pending(memo.view, passed.state, rules, measure)
    state = evolve(work.state, records=decisions)
    report = replace(work.report, records=passed.report)
    return Done(passed.history, replace(work, state=state, report=report, memo=memo, roomy=roomy), None, memo.view)


def _users(config: CompositionConfig, work: _Pass, seen: View, measure: anchored.Measure) -> _Answer:
    """The user half, unless it waits for an expected record (only a pass that fits waits)."""
    ask, wait_since = work.state.records.ask, work.state.chain.wait_since
    count = records.records_written(seen.records)
    # A chain that goes on after a partial record: a new ask, made once a record arrived since the wait began.
    renewed = ask is not None and wait_since is not None and ask.responses_at_ask > wait_since
    arrived = renewed and count > records.written_by(seen.records, cast("int", wait_since))
    chain, waiting = _wait(
        work.state.chain,
        records.responses(seen.records),
        expected=records.record_expected(work.state),
        count=count,
        asked_at=ask.responses_at_ask if arrived and ask is not None else None,
    )
    waiting = waiting and seen.sent <= config.max_input_tokens
    state, report = evolve(work.state, chain=chain), replace(work.report, waited=waiting)
    if not waiting:
        # The record half's own break this pass: groups newly excluded, or cut to what stays of them.
        passed = work.report.records
        breaking = bool(passed.dropped or passed.remnants or passed.distilled)
        if not breaking:
            work = replace(work, netting=_net_breaks(config, work, seen, measure))
            breaking = work.netting
        # Judged whatever else breaks on this pass: a replay of this pass (the other list) breaks for nothing else.
        room, later = _room_to_shed(config, work, seen, measure)
        work = replace(work, room=room)
        breaking = breaking or room > 0
        # While the prompt fits and the shed has something to take when the next step comes, a summary alone waits
        # for that step's pass (over the budget, the user half asks as it would alone).
        roomy = work.roomy or (later and seen.sent <= config.max_input_tokens)
        answer = _user_pass(config, state, seen.history, measure, breaking=breaking, roomy=roomy)
        if isinstance(answer, Needs):
            return _over_prefix(config, state, work.given, measure, answer)
    else:  # a wait holds back new requests only: a summary the other list made replays here too
        answer = user_summaries.replayed(config.users, state, seen.history, measure)
    if answer is None:
        return Done(seen.history, replace(work, state=state, report=report), None)
    state, report = answer.state, replace(report, users=answer.report)
    return Done(answer.history, replace(work, state=state, report=report), None)


def _replay(config: CompositionConfig, work: _Pass, seen: View, measure: anchored.Measure) -> _Answer:
    """Apply every kept replacement whose items lead the conversation's, in the order they were kept."""
    kept, refused = Counter[str](), set[str]()
    found: dict[object, list[user_summaries.Item]] = {}  # each kind's items in the output so far, by finder
    for answer in work.state.answers:
        if answer.kind not in CHAIN_KINDS or answer.text is None or answer.sources is None:
            continue  # a failure, not a refusal: :func:`_ask` decides when to ask again
        kind = _KINDS[answer.kind]
        items = found.get(kind.items)
        if items is None:
            items = found[kind.items] = kind.items(seen, measure)
        stood = _stood_for(config, answer, items)
        if stood is None:
            continue
        items = stood
        message = _kept(kind, answer, items, measure)
        if message is None:
            refused.add(answer.identity)
        else:
            applied = user_summaries.apply(seen.history, (m for i in items for m in i.members), kind.reason, message)
            seen, found = view(applied, seen), {}
            kept[kind.prefix] += 1
    report = replace(
        work.report,
        replaced=kept[REPLACEMENT_ID_PREFIX],
        folded=kept[EMERGENCY_FOLD_ID_PREFIX],
        refused=tuple(sorted(refused)),
    )
    return Done(seen.history, replace(work, report=report), None, seen)


def _ask(config: CompositionConfig, work: _Pass, seen: View, measure: anchored.Measure) -> _Answer:
    """Over the budget, ask for the chain's next replacement (:func:`_next`), if any."""
    if seen.sent <= config.max_input_tokens:
        return Done(seen.history, work, None)
    found = _next(config, work.state, seen, measure)
    if found.request is not None:
        # The next step recomputes everything from the state with the absorbed answer.
        return Needs((found.request,))
    refused = tuple(sorted({*work.report.refused, *found.refused}))
    report = replace(work.report, refused=refused, failed=found.failed, skipped=found.skipped)
    return Done(seen.history, replace(work, report=report), None)


def _fallback(config: CompositionConfig, work: _Pass, seen: View, measure: anchored.Measure) -> _Answer:
    """The fallback with holds: every tool group not yet covered held, the anchored rules shed narration only.

    Decisions already made replay on every pass, whatever the size (so both lists and a
    copy agree); new ones are made only over the budget, or, once no route to a record is
    left, where the safety net takes the record's place (:func:`.records.net_ceiling`; on a
    pass whose net break the user half rode, whatever that summary left: ``_Pass.netting``).
    """
    netting = work.netting or _netting(config, work, seen)
    if seen.sent <= config.max_input_tokens and not work.state.fallback.decided and not netting:
        # Under the budget (the user half brought it there): the record rules' holds for it go too.
        return Done(records.release_unrecorded(seen), work, None)
    ran = _run_fallback(config, work, seen, measure)
    new = evolve(work.state, fallback=ran.state)
    report = replace(work.report, fallback=ran.report)
    return Done(ran.history, replace(work, state=new, report=report, band=ran.memo), None)


def _run_fallback(
    config: CompositionConfig, work: _Pass, seen: View, measure: anchored.Measure
) -> anchored.AnchoredDone:
    """The fallback's rules over ``seen``, every tool group no record covers held (distilled by the safety net)."""
    fallback = records.fallback_for(config.records, work.state)
    assert fallback is not None
    return records.run_with_holds(
        fallback,
        work.state.fallback,
        records.hold_unrecorded(seen),
        measure,
        memo=work.band,
        distillable=records.DISTILLABLE,
        # The net's break judged before the user half's summary stands (the summary rode on it).
        distill_ceiling=0 if work.netting else records.net_ceiling(config.records, work.state),
    )


def _netting(config: CompositionConfig, work: _Pass, seen: View) -> bool:
    """The safety net distills on this pass in the record's place (:func:`.records.net_ceiling`)."""
    ceiling = records.net_ceiling(config.records, work.state)
    return ceiling is not None and seen.sent > ceiling


def _net_breaks(config: CompositionConfig, work: _Pass, seen: View, measure: anchored.Measure) -> bool:
    """The safety net newly distills a group on this pass, a break the user half may ride as it rides a record's.

    Its first cut (past the record trigger), always. A cut made keeping pace (each group as
    it stops being the newest, :func:`.records.net_ceiling`) only when a step like the largest
    would take the prompt past the trigger: room is soon needed, and a summary costs less on
    this break than alone a few turns later. Further from the trigger, every such cut would
    ask for a summary of the newest turns alone, however small the prompt.
    """
    if not _netting(config, work, seen):
        return False
    if work.state.fallback.distilled and (
        _after_next_step(seen, work.state.recall, measure) <= config.records.trigger_tokens
    ):
        return False
    return bool(_run_fallback(config, work, seen, measure).report.distilled)


def shed_rules(config: CompositionConfig, state: State) -> AnchoredConfig:
    """The anchored rules the shed policy runs for ``state``: whole tool groups only (run without shortening,
    :func:`_shed`), over the band of the fallback in effect (:func:`.records.fallback_for`), down to
    :data:`SHED_LOW_WATER_FRACTION` of the budget.

    The same band as the fallback's, because both read the notes of earlier sheds by band
    position: once no route to a record is left, the fallback's tail keeps one group, and a
    shed run keeping the configured tail would find the notes of the fallback's sheds past
    its own band, take the positions for untrustworthy (``Report.misplaced``), and shed
    nothing, so a prompt the safety net's value lines cannot bring under the budget (value-dense
    results) raised :class:`~.errors.CompactionBudgetExceeded`.
    """
    fallback = records.fallback_for(config.records, state)
    assert fallback is not None
    low_water = min(fallback.low_water_fraction, SHED_LOW_WATER_FRACTION)
    return replace(fallback, collapse_assistant_text=False, low_water_fraction=low_water)


def _shed_early(rules: AnchoredConfig, sent: int, room: int) -> AnchoredConfig:
    """``rules`` made to free ``room`` tokens of a prompt of ``sent`` (all the band's unrecorded groups, when they
    hold less): the groups shed are the same whatever else the prompt carries (context injected into one list)."""
    ceiling = max(1, sent - 1)
    target = max(1, sent - room)
    # Half a token over the target, so the rules' floor of ceiling x fraction lands on it whatever the rounding.
    return replace(rules, max_input_tokens=ceiling, low_water_fraction=min(1.0, (target + 0.5) / ceiling))


def _room_to_shed(config: CompositionConfig, work: _Pass, seen: View, measure: anchored.Measure) -> tuple[int, bool]:
    """Tokens the shed policy frees on this pass while the prompt still fits (0 when it waits), and whether
    it waits with something to take (``later``): the newest tool group, or groups under the low water.

    When a step like the conversation's largest would no longer fit beside the prompt and no
    record is expected to make the room (none would pay; with no route to one left, the
    safety net cuts in the record's place and keeps pace, so this rule stands aside), or the
    pass began over the budget (its break is paid now; an expected record comes with the
    next request on a break of its own, and the step after it would break the prefix a
    third time for the room: an emergency fold, a shed) and all it would shed is groups whose
    record would not pay (:func:`.records.unpaying`; a group whose record is still to come keeps
    its values), the
    unrecorded groups are what the shed will remove for that step, a pass or two later, on a
    break of its own, after the user half's summary made its own break for the same room.
    Shedding them now, down to :data:`ROOM_LOW_WATER_FRACTION` of the budget, puts both on
    one break: the summary rides on the shed's, as on a record's. Judged on the prompt before
    the summary (like the safety net's cut), and judged again by :func:`_shed` on a pass that
    made no such room before its other steps (one that began over the budget), so a pass over
    a pass's output finds no room left to make. Only under the ``"shed"`` policy, and only when
    the shed removes something and spares the conversation's newest tool group, the result
    the conversation is working with.

    A shed that would need that group, or a prompt under the low water, waits for the next
    step. The user half's summary, which would break the prefix alone now for the same room,
    waits too (``later``): when that step comes and the prompt no longer fits, its pass asks
    for the summary and sheds what it must on one break; a step that still fits needs no
    break at all. A lone summary and then a shed were two breaks for one step.
    """
    expected = records.record_expected(work.state)
    began_over = work.report.tokens_before > config.max_input_tokens
    if config.overflow_policy != "shed" or no_route(work.state.recall) or (expected and not began_over):
        return 0, False  # with no route left, the safety net cuts in the record's place and keeps pace
    # Of the conversation's own tokens: context injected into one list only must not tip the decision.
    own = sent_tokens(r for r in seen.history if not r.injected)
    low = int(config.max_input_tokens * ROOM_LOW_WATER_FRACTION)
    need = own + _after_next_step(seen, work.state.recall, measure) - seen.sent - config.max_input_tokens
    if need <= 0 or own > config.max_input_tokens:
        return 0, False
    room = max(0, own - low)
    # To the low water; under it, only what the step needs: whether the shed has anything to take.
    rules = _shed_early(shed_rules(config, work.state), seen.sent, room or need)
    ran = records.run_with_holds(
        rules, work.state.chain.shed, seen.history, measure, releasable=_SHEDDABLE, memo=work.band, shorten=False
    )
    if not ran.report.shed or (
        expected and not set(ran.report.shed) <= records.unpaying(seen, config.records, measure)
    ):
        return 0, False
    if not room:
        return 0, True
    lookups = [
        g
        for g in seen.grouping.all
        if g.kind == "tool_call" and not records.is_recall_group(seen.records, g, seen.recall_calls)
    ]
    newest = {seen.records[i].origin for i in lookups[-1].members} if lookups else set[int | None]()
    return (room, False) if newest.isdisjoint(ran.report.shed) else (0, True)


def _shed(config: CompositionConfig, work: _Pass, seen: View, measure: anchored.Measure) -> _Answer:
    """The shed policy: whole unrecorded tool groups leave, oldest band position first (replayed likewise);
    before the prompt is over the budget too, when room for the next large step must come from it
    (:func:`_room_to_shed`: judged before the user half's summary, else judged here, on the prompt the other
    steps left, so a pass over this pass's output finds no room left to make)."""
    state = work.state.chain.shed
    room = (work.room or _room_to_shed(config, work, seen, measure)[0]) if seen.sent <= config.max_input_tokens else 0
    if seen.sent <= config.max_input_tokens and not state.decided and not room:
        return Done(seen.history, work, None)
    rules = shed_rules(config, work.state)
    if room:
        rules = _shed_early(rules, seen.sent, room)
    ran = records.run_with_holds(
        rules, state, seen.history, measure, releasable=_SHEDDABLE, memo=work.band, shorten=False
    )
    new = evolve(work.state, chain=evolve(work.state.chain, shed=ran.state))
    report = replace(work.report, shed=ran.report)
    return Done(ran.history, replace(work, state=new, report=report, band=ran.memo), None)


def _record_over_prefix(config: CompositionConfig, work: _Pass, seen: View, measure: anchored.Measure) -> _Answer:
    """A record still due at the pass's end (the prompt as it stands showed nothing unrecorded within what the
    last request sent), asked over this pass's output cut the same way (:func:`.records.ask_over`)."""
    asked = records.ask_over(config.records, work.state, seen.history, measure)
    if asked is None:
        return Done(seen.history, work, None)
    return Needs((_with_summary(config, work.state, seen, asked, measure),))


#: The composed pass, by overflow policy: the record rules, the user half, the chain's
#: replacements (replayed, then asked for), the fallback with holds, the shed policy, and
#: last (over the output every other sub-step made) a record asked over the cached prefix.
_STEPS: Final[Mapping[OverflowPolicy, tuple[pipeline.SubStep[CompositionConfig, _Pass, None], ...]]] = {
    "shed": (_record_rules, _users, _replay, _ask, _fallback, _shed, _record_over_prefix),
    "raise": (_record_rules, _users, _replay, _ask, _fallback, _record_over_prefix),
}


def _chain_outcome(report: CompositionReport) -> str:
    """What the chain could not use on a failing pass, for the error's message (nothing is lost silently)."""
    said = [f"{len(report.refused)} record replacement(s) or emergency fold(s) refused"] if report.refused else []
    if report.failed:
        said.append(f"{len(report.failed)} failed (asked again after the next user turn)")
    if report.skipped:
        said.append(f"{len(report.skipped)} not asked (an answer over their records already left a value out)")
    return f" ({'; '.join(said)})" if said else ""


def _user_pass(
    config: CompositionConfig, state: State, output: History, measure: anchored.Measure, *, breaking: bool, roomy: bool
) -> Needs | user_summaries.UserDone:
    """The user half's pass within the composition: when it may ask, and what it replays.

    - **Replays** of answers the state remembers apply on every pass, whatever the size,
      so both lists and a restored copy agree.
    - **Riding on a record's break**: when the record half newly excludes groups on this
      pass, the cached prefix breaks right after the head anyway, so a summary asked for on
      the same pass costs no break of its own: the user half's size trigger and break-even
      gate do not apply to it (its band must still be worth a call). The safety net's cut in
      a record's place (:func:`_net_breaks`) counts alike (``breaking``); its break sits where
      the cut group stood, and the summary's just before it, over the turns since the last
      summary, so the summary costs little more than its own request.
    - **Alone**, while the prompt fits, a summary breaks the prefix for itself, and each
      later call pays about a tenth of what it saves, so it is asked for only when the
      room is needed: when the largest group the conversation has seen (a lookup, a long
      turn) would no longer fit beside the prompt, so the next step like it would
      overflow, and the shed will not make that room on the pass the next step arrives
      (``roomy`` is true then: :func:`_room_to_shed`). Over the budget the user half asks
      as it would alone.
    """
    if not breaking and roomy:
        return user_summaries.replayed(config.users, state, output, measure) or _declined(state, output)
    answer = user_summaries.pass_(config.users, state, output, measure)
    if isinstance(answer, Needs) or answer.report.outcome in user_summaries.APPLIED:
        return answer
    if breaking:
        # The gates off: this pass asks, or applies a remembered answer, if anything can.
        free = user_summaries.pass_(config.users, state, output, measure, gates=False)
        return free if isinstance(free, Needs) or free.report.outcome in user_summaries.APPLIED else answer
    return user_summaries.replayed(config.users, state, output, measure) or answer


def _declined(state: State, output: History) -> user_summaries.UserDone:
    tokens = sent_tokens(output)
    report = UserReport(tokens_before=tokens, tokens_after=tokens, outcome=user_summaries.Outcome.DECLINED)
    return Done(history=output, state=state, report=report)


def _after_next_step(seen: View, recall_state: RecallState, measure: anchored.Measure) -> int:
    """The prompt after a step like the largest the conversation has taken (its largest group, excluded ones too);
    a tool step with room beside it for the instruction of a record asked over the cached prefix, when the next
    record would be asked that way (:func:`.recall.records_over_prefix`; a pinned record sends no instruction).

    A record of the newest tool group can be asked over the cached prefix only while the
    prompt and the instruction fit the budget together: when they would not, the record
    could cover only what stands before that group, and a second record (a second break)
    would follow for it. Asking one step earlier puts the break on the request that sends
    the new group, which the provider reads uncached whatever we do.
    """
    reserve = records.instruction_tokens(measure) if records_over_prefix(recall_state) else 0
    largest = max(
        (
            sum(seen.records[i].tokens for i in g.members) + (reserve if g.kind == "tool_call" else 0)
            for g in seen.grouping.all
        ),
        default=0,
    )
    return seen.sent + largest


def check(config: CompositionConfig, state: State, history: History) -> str | None:
    """Why a restored ``state`` cannot belong to ``history``, or ``None``."""
    return (
        records.check(config.records, state, history)
        or anchored.check(records.net_rules(shed_rules(config, state)), state.chain.shed, history)
        or user_summaries.check(config.users, state, history)
    )


@dataclass(frozen=True, slots=True)
class _Kind:
    """One kind of replacement the chain asks for; every kind follows one rule.

    The kind's items, oldest first; the prefix of them whose request fits
    ``max_summary_input_tokens`` (``minimum`` at least); a request keyed by its identity;
    the answer kept only when smaller than what it replaces AND quoting every distinctive
    value of it (:func:`_kept`), else refused for good, and a failure standing until the
    next user turn; a kept answer applied by excluding what its items stand for (linked
    to it, with ``reason``) and inserting its message where the first stood
    (:func:`.user_summaries.apply`).
    """

    request: RequestKind
    prefix: str  # of the ids it allocates
    minimum: int
    items: Callable[[View, anchored.Measure], list[user_summaries.Item]]
    prompts: Callable[[CompositionConfig], list[str]]
    message: Callable[[str, str, anchored.Measure], MessageRecord]  # (answer, id, measure)
    reason: str


def _active_records(seen: View, measure: anchored.Measure) -> list[user_summaries.Item]:
    """The conversation's active records that a replacement may stand for, oldest first.

    Only records whose group holds nothing else (a recall call and its result, or a
    written record): a replacement excludes the whole group, and a tool call made beside
    the recall call has a result no replacement quotes.
    """
    output, indices, conversation, recall_calls = seen.history, seen.indices, seen.records, seen.recall_calls
    groups: dict[int, tuple[int, ...]] = {}  # history index -> its whole group, for groups of records only
    for group in seen.grouping.all:
        members = [conversation[m] for m in group.members]
        calls_other = any(name != records.RECALL_TOOL_NAME for r in members for name in r.call_names)
        answers_other = any(
            p.kind == "function_result" and p.call_id not in recall_calls for r in members for p in r.parts
        )
        if not calls_other and not answers_other:
            whole = tuple(indices[m] for m in group.members)
            groups.update(dict.fromkeys(whole, whole))
    found: list[user_summaries.Item] = []
    for index in sorted(groups):
        text = records.record_text(output[index], recall_calls)
        if text:
            body = text.split(records.RECORD_MARKER, 1)[-1].removeprefix(" " + records.RECORD_PREAMBLE).strip()
            found.append(
                user_summaries.Item(index, body, records.written_record(body, "", measure).tokens, groups[index])
            )
    return found


def _standing_summaries(seen: View, measure: anchored.Measure) -> list[user_summaries.Item]:
    """The conversation's standing user summaries (ours, folds included), oldest first."""
    del measure  # a summary's size is its message's
    return [
        user_summaries.Item(index, user_summaries.summary_body(record), record.tokens, (index,))
        for index, record in enumerate(seen.history)
        if record.summary and record.role == "user" and not record.excluded and not record.injected
    ]


def _kept(
    kind: _Kind, answer: Answer, items: Sequence[user_summaries.Item], measure: anchored.Measure
) -> MessageRecord | None:
    """The message ``answer`` becomes if kept: smaller than ``items`` (like for like) AND quoting all their values (a
    fold of user summaries: AND carrying all they say by the summary coverage rule, :mod:`.summary_check`)."""
    if not answer.text or not answer.text.strip() or answer.message_id is None:
        return None
    message = kind.message(answer.text, answer.message_id, measure)
    if message.tokens >= sum(i.tokens for i in items):
        return None
    if kind.request is RequestKind.EMERGENCY_FOLD:
        return None if omissions([i.text for i in items], answer.text) else message
    return None if _lossy(answer, items) else message


def _lossy(answer: Answer, items: Sequence[user_summaries.Item]) -> bool:
    """``answer`` leaves out a distinctive value of ``items`` (whatever its size)."""
    quoted = word_set(answer.text or "")
    return any(value not in quoted for i in items for value in distinctive_values(i.text))


def _lossy_records(
    config: CompositionConfig, state: State, records: Sequence[user_summaries.Item]
) -> tuple[tuple[RequestKind, frozenset[int]], ...]:
    """Each record replacement refused for leaving one of its records' values out: its kind, and the records (by
    index) it stood for, among those still standing (a replacement stands for the oldest ``records``,
    :attr:`.state.Answer.sources` of them)."""
    gone: list[tuple[RequestKind, frozenset[int]]] = []
    for answer in state.answers:
        if answer.kind not in _REPLACEMENTS or answer.text is None or answer.sources is None:
            continue
        items = _stood_for(config, answer, records)
        if items is not None and _lossy(answer, items):  # refused: a replacement must quote every value
            gone.append((answer.kind, frozenset(item.index for item in items)))
    return tuple(gone)


def _skipped(name: RequestKind, covered: frozenset[int], lossy: Sequence[tuple[RequestKind, frozenset[int]]]) -> bool:
    """A replacement of kind ``name`` standing for the records ``covered`` would leave out values as a lossy one
    did: it stands for all of that one's records and asks no less of them (a merge keeps its records' length, a
    harder rewrite asks for a shorter one, so a lossy merge spares both and a lossy rewrite only rewrites)."""
    return name in _REPLACEMENTS and any(
        covered >= records and (name is RequestKind.REWRITE or kind is RequestKind.MERGE) for kind, records in lossy
    )


def _stood_for(
    config: CompositionConfig, answer: Answer, items: Sequence[user_summaries.Item]
) -> Sequence[user_summaries.Item] | None:
    """The leading ``items`` a chain ``answer`` was asked over (:attr:`.state.Answer.sources` of them), or ``None``
    when they no longer lead the conversation's items."""
    kind, stood = _KINDS[answer.kind], items[: answer.sources]
    if len(stood) < (answer.sources or 0) or all(
        user_summaries.request(kind.request, prompt, stood, "", 0).identity != answer.identity
        for prompt in kind.prompts(config)
    ):
        return None
    return stood


def _rewrites(state: State) -> int:
    """Harder rewrites answered (kept or refused) since the last merge answered: ``harder_attempts`` at most."""
    count = 0
    for answer in reversed(state.answers):  # newest first, back to the last merge answered
        if answer.text is not None and answer.kind is RequestKind.MERGE:
            break
        count += answer.text is not None and answer.kind is RequestKind.REWRITE
    return count


@dataclass(frozen=True, slots=True)
class _Next:
    """What :func:`_next` found: the request to ask (or ``None``), the refusals, the failure standing, and the
    replacements not asked because an answer over records they stand for already left a value out."""

    request: Request | None = None
    refused: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


def _next(config: CompositionConfig, state: State, seen: View, measure: anchored.Measure) -> _Next:
    """The next replacement to ask for while over the budget (or none), the refusals found, the failure standing.

    Each kind in turn: the merge of the oldest records that fit the request bound (two
    at least), the harder rewrites (at most ``harder_attempts`` since the last kept
    merge), then the emergency fold of the oldest standing user summaries (two at least,
    without the fold mode's profitability gate). An identity once judged (kept or
    refused) is never asked for again: kept ones were applied by :func:`_replay`; refused
    ones are reported. A failure stands until the next user turn, and while it stands
    nothing more is asked on this pass (the summarizer just failed: no retry storm);
    after it, the same request is asked again.

    A replacement is not asked for (``skipped``) when it stands for every record of one whose
    answer left a value of theirs out (on this pass or an earlier one, while those records
    stand) and asks no less of them (:func:`_skipped`): a harder rewrite asks for a shorter
    answer over the same values, and a merge of them with more records for one answer over
    more values, so either would leave out as much, and be refused after it was paid for.
    The chain moves on to the next kind.
    """
    turns, limit = user_summaries.user_turns(seen.history), config.users.summary_input_limit
    refused: list[str] = []
    skipped: list[str] = []
    found: dict[object, list[user_summaries.Item]] = {}  # each kind's items, by finder
    lossy = _lossy_records(config, state, found.setdefault(_MERGE.items, _MERGE.items(seen, measure)))
    for name, kind in _KINDS.items():
        if name is RequestKind.REWRITE and _rewrites(state) >= config.harder_attempts:
            continue
        items = found.get(kind.items)
        if items is None:
            items = found[kind.items] = kind.items(seen, measure)
        kept = sum(
            1 for a in state.answers if a.kind in _KINDS and a.text is not None and _KINDS[a.kind].prefix == kind.prefix
        )
        summary_id = user_summaries.next_id(kind.prefix, kept, seen.history)
        for prompt in kind.prompts(config):
            selected = user_summaries.select(prompt, items, limit, measure, minimum=kind.minimum)
            if not selected:
                continue
            request = user_summaries.request(kind.request, prompt, selected, summary_id, turns)
            answer = standing(state.answers, request.identity, turns)
            if answer is None and _skipped(name, frozenset(item.index for item in selected), lossy):
                skipped.append(request.identity)
                continue
            if answer is None:
                return _Next(request, skipped=tuple(skipped))
            if answer.text is None:
                return _Next(refused=tuple(refused), failed=(answer.identity,), skipped=tuple(skipped))
            if _kept(kind, answer, selected, measure) is None:
                refused.append(answer.identity)  # refused once: never asked for again (and in ``lossy`` if it was)
    return _Next(refused=tuple(refused), skipped=tuple(skipped))


_MERGE: Final = _Kind(
    request=RequestKind.MERGE,
    prefix=REPLACEMENT_ID_PREFIX,
    minimum=2,
    items=_active_records,
    prompts=lambda config: [config.merge_prompt],
    message=records.written_record,
    reason=MERGED_REASON,
)


def _harder_prompts(config: CompositionConfig) -> list[str]:
    return [harder_prompt(attempt) for attempt in range(1, config.harder_attempts + 1)]


#: A harder rewrite is a merge of one record at least, each prompt asking for a shorter one.
_REWRITE: Final = replace(_MERGE, request=RequestKind.REWRITE, minimum=1, prompts=_harder_prompts)
_FOLD: Final = _Kind(
    request=RequestKind.EMERGENCY_FOLD,
    prefix=EMERGENCY_FOLD_ID_PREFIX,
    minimum=2,
    items=_standing_summaries,
    prompts=lambda config: [config.users.fold_prompt],
    message=user_summaries.summary_record,
    reason=user_summaries.FOLD_EXCLUDE_REASON,
)
#: The kinds that replace records (a merge, a harder rewrite).
_REPLACEMENTS: Final = frozenset({RequestKind.MERGE, RequestKind.REWRITE})
#: The chain's kinds, in the order it asks for them.
_KINDS: Final[Mapping[RequestKind, _Kind]] = {kind.request: kind for kind in (_MERGE, _REWRITE, _FOLD)}


def _protected_tokens(output: History) -> int:
    """What no step may remove: records, host-preserved messages and injected context."""
    return sum(r.tokens for r in output if not r.excluded and (r.held == HOLD_RECORD or r.preserved or r.injected))


def _wait(
    chain: ChainDecisions, clock: int, *, expected: bool, count: int, asked_at: int | None = None
) -> tuple[ChainDecisions, bool]:
    """Whether the user half waits for an expected record on this pass, and the chain's wait state after it.

    ``asked_at`` is the clock when the outstanding ask was made, given when a record arrived since the wait
    began: a chain that goes on for the rest of its batch after a record covered part of it makes a new ask,
    and the wait lasts two responses from that ask (the record it waits for is a new one), so the summary
    still rides on that record's break. An ask merely renewed after one that failed does not extend it.
    """
    if chain.wait_since is not None and clock < chain.wait_since:
        chain = evolve(chain, wait_since=None)  # the clock went back: a restore of an earlier state
    if not expected or chain.declined_behind == count:
        return evolve(chain, wait_since=None), False
    if chain.wait_since is None:
        return evolve(chain, wait_since=clock), True
    since = chain.wait_since if asked_at is None or asked_at > clock else max(chain.wait_since, asked_at)
    if clock - since >= RECORD_WAIT_RESPONSES:
        return evolve(chain, wait_since=None, declined_behind=count), False
    return chain, True
