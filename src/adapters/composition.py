"""``ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy``: both halves and a last-resort chain.

A thin adapter over :mod:`maf_compaction.core.composition` on the generic shell loop.
The composition and its record half hold one :class:`~.conversation.Conversation` (the
half's, which the recall middleware wired to its ``take_reforce`` and the gate hold too):
one value describes the conversation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from agent_framework import Message

from ..core import composition as core
from ..core import records as records_core
from ..core import user_summaries
from ..core.anchored import DEFAULT_MIN_GAIN_FRACTION
from ..core.checks import Floor, Fraction, validate
from ..core.composition import CompositionConfig, CompositionReport, OverflowPolicy, SummaryRequest
from ..core.effects import Request
from ..core.errors import CompactionBudgetExceeded
from ..core.records import RecordConfig
from ..core.state import CHAIN_KINDS, State
from .aligned import head_answer_room
from .anchored import AnchoredCompactionStrategy, log_anchored
from .counting import Tokenizer
from .loop import CompactionAdapter
from .records import ToolResultAnchoredSummarizationCompactionStrategy
from .user_summaries import UserTurnAnchoredSummarizationCompactionStrategy

logger = logging.getLogger("maf_compaction")
#: Why a record replacement or an emergency fold was not kept (telemetry): not smaller, or a value missing.
REFUSED_REPLACEMENT = "not_smaller_or_value_missing"


def _record_rules(
    tool_results: ToolResultAnchoredSummarizationCompactionStrategy, tokenizer: Tokenizer
) -> RecordConfig:
    """The record half's parameters with the anchored fallback the composition runs within its pass.

    The default fallback is already in the record half's config. An explicit anchored
    fallback contributes its parameters (tail, band share, low-water mark, ...); the
    composition never calls the instance, since its rules must run with the record half's
    holds on the same converted history.
    """
    config = tool_results.config
    if config.fallback is not None:
        return config
    fallback = tool_results.fallback
    if not isinstance(fallback, AnchoredCompactionStrategy):
        raise ValueError(
            "tool_results' fallback must be its default or an AnchoredCompactionStrategy (or "
            "MinimumGainAnchoredCompactionStrategy): the composition runs the anchored rules itself, with the "
            f"record half's holds, using that fallback's parameters; got {fallback!r}"
        )
    anchored = fallback.config
    for name, why in (("max_input_tokens", ""), ("keep_head_groups", ": the head is one for every rule")):
        theirs, ours = getattr(anchored, name), getattr(config, name)
        if theirs != ours:
            raise ValueError(f"tool_results' fallback must have the record half's {name} ({ours}){why}, got {theirs}")
    _require_same_tokenizer("tool_results' fallback", fallback.tokenizer, tokenizer)
    return replace(config, fallback=anchored)


def _require_same_tokenizer(name: str, theirs: Tokenizer, tokenizer: Tokenizer) -> None:
    """Every size rule compares counts of one tokenizer: ``name``'s must be the composition's."""
    if not (theirs is tokenizer or theirs == tokenizer):
        raise ValueError(
            f"tokenizer must be the same tokenizer as {name}'s (every size rule compares counts of one tokenizer), "
            f"got {tokenizer!r} and {name}.tokenizer {theirs!r}"
        )


@dataclass(frozen=True, slots=True)
class _Chain:
    """The composition's own shares, checked under their names before they become the user half's."""

    user_trigger_fraction: Fraction
    chain_gain_fraction: Floor


class ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
    CompactionAdapter[CompositionConfig, State, CompositionReport]
):
    """Records for tool results and summaries for user turns, in one pass, with a chain that can still make room.

    Each pass runs the record half (records replace the tool results they quote), then
    the user half (summaries replace earlier user turns) unless it is waiting for a
    record that is expected (at most two model responses; only a pass that fits the budget
    waits). A summary is asked for where its prefix break costs least: on the pass a
    record newly excludes tool groups (that break is paid anyway), or, while the prompt
    fits, only when the conversation's largest step would no longer fit beside it; then a
    record of the unrecorded tool groups is asked for first and the summary rides on its
    break. The short user turns right after the head (each no larger than its summary would
    be) stay verbatim before the first summary. Only while the prompt is over the
    budget it then merges and rewrites the records, folds the oldest user summaries into
    one (an emergency fold: kept only when smaller and quoting every value), holds every
    uncovered tool group and lets the anchored rules shed narration, and then applies
    ``overflow_policy``: ``"shed"`` removes whole
    unrecorded tool groups, oldest first, each leaving a removal note the model sees and
    named in a WARNING; ``"raise"`` keeps uncovered results. When what must stay does not
    fit, the pass raises :class:`CompactionBudgetExceeded` and leaves the list untouched:
    the host reduces protected context or chooses a larger budget.

    Wire the recall middleware to the record half (``reforce=tool_results.take_reforce``,
    or find it with :func:`find_nested_strategy`). Pass the same instance as the
    harness's before and after strategy.

    Args:
        tokenizer: The tokenizer; the same as both halves' (another one raises ``ValueError``).
        tool_results: The record half, with its default fallback or an explicit
            :class:`AnchoredCompactionStrategy` (or :class:`MinimumGainAnchoredCompactionStrategy`)
            of the same budget, ``keep_head_groups`` and tokenizer: the composition runs the
            anchored rules itself (with the record half's holds) and its fallback and shed
            steps use that fallback's parameters. Another kind of fallback raises ``ValueError``.
        user_turns: The user half; ``remembered_requests >= 2`` unless it recompacts.
        user_trigger_fraction: The user half's trigger, in (0, 1]; ``None`` uses the record half's.
        harder_attempts: Harder rewrites of the merged record the chain may ask for after
            each merge (about 60%, then 36% of the length), at least 0.
        merge_prompt: The instructions for record merges (a default is provided).
        chain_gain_fraction: The break-even share, in [0, 1): while the prompt fits, the user
            half alone is not asked for a summary whose turns are fewer tokens than this share
            of everything behind them (its prefix break would cost more than it saves). A
            summary that rides on a record's break is not gated.
        overflow_policy: ``"shed"`` (default) or ``"raise"``.
        summary_request: How the user half's summaries and folds are asked for:
            ``"summarizer"`` (default) sends ``user_turns``' client the items;
            ``"cached_prefix"`` sends the conversation's own request (read from the
            provider's cache) plus one instruction naming the items, through the agent's
            chat client, as the recall middleware saw it sent (the summarizer client is
            used while no request has been seen, or when an item is outside what fits).

    Attributes:
        tool_results: The record half.
        user_turns: The user half.
        passes: Passes run, over both lists.
        user_passes_waited: Passes whose user half waited for an expected record.
        fallbacks_after_record: Passes whose fallback with holds changed something.
        shed_events: Passes whose overflow policy shed something new.
        records_replaced: Passes that applied a kept record merge or rewrite (fresh or replayed).
        emergency_folds: Passes that applied a kept emergency fold of user summaries (fresh
            or replayed).
        replacements_refused: Distinct replacements and emergency folds refused: not smaller,
            or a value of what they replace missing (each is never asked for again).
        refused_answer_tokens: Output tokens of the refused answers the conversation's state held when they
            were refused: what the refusals cost (the WARNING says it too).
        replacements_skipped: Distinct record merges and rewrites not asked for because an answer
            over records they stand for (a merge of fewer, or a gentler rewrite) already left one of
            their values out: they would be refused too, so they are not paid for.
        replacements_failed: Replacement and emergency-fold requests that failed (the
            summarizer raised or answered nothing); a failure stands until the next user turn,
            then the request is asked again.
        budget_failures: Passes that raised ``CompactionBudgetExceeded``.
        prefix_requests: Records and summaries asked over the cached prefix.
        failed_prefix_requests: Of those, requests that failed or came back without text.
        last_report: What the last pass did, or ``None``.
    """

    needs_recall = True

    core: ClassVar[object] = core
    state_type = State
    linked_reasons: ClassVar[frozenset[str]] = frozenset(
        {user_summaries.EXCLUDE_REASON, user_summaries.FOLD_EXCLUDE_REASON, core.MERGED_REASON}
    )

    def __init__(
        self,
        *,
        tokenizer: Tokenizer,
        tool_results: ToolResultAnchoredSummarizationCompactionStrategy,
        user_turns: UserTurnAnchoredSummarizationCompactionStrategy,
        user_trigger_fraction: float | None = None,
        harder_attempts: int = core.DEFAULT_HARDER_ATTEMPTS,
        merge_prompt: str | None = None,
        chain_gain_fraction: float = DEFAULT_MIN_GAIN_FRACTION,
        overflow_policy: OverflowPolicy = core.DEFAULT_OVERFLOW_POLICY,
        summary_request: SummaryRequest = "summarizer",
    ) -> None:
        for name, half, kind in (
            ("tool_results", tool_results, ToolResultAnchoredSummarizationCompactionStrategy),
            ("user_turns", user_turns, UserTurnAnchoredSummarizationCompactionStrategy),
        ):
            if not isinstance(half, kind):
                raise ValueError(f"{name} must be a {kind.__name__}, got {half!r}")
        users = user_turns.config
        if users.summary_mode != "recompact" and users.remembered_requests < 2:
            raise ValueError(
                "user_turns must keep remembered_requests >= 2 in the boundary and fold modes (a composed pass "
                f"asks for a summary on one list and replays it on the other), got {users.remembered_requests}"
            )
        _require_same_tokenizer("tool_results", tool_results.tokenizer, tokenizer)
        _require_same_tokenizer("user_turns", user_turns.tokenizer, tokenizer)
        trigger = tool_results.trigger_fraction if user_trigger_fraction is None else user_trigger_fraction
        validate(_Chain(trigger, chain_gain_fraction))
        config = CompositionConfig(
            records=_record_rules(tool_results, tokenizer),
            users=replace(
                users, trigger_fraction=trigger, min_gain_fraction=chain_gain_fraction, keep_short_turns=True
            ),
            overflow_policy=overflow_policy,
            merge_prompt=core.DEFAULT_MERGE_PROMPT if merge_prompt is None else merge_prompt,
            harder_attempts=harder_attempts,
            summary_request=summary_request,
        )
        self._setup(config, tokenizer, tool_results.conversation.value, holds=records_core.HOLD_REASONS)
        self.conversation = tool_results.conversation  # one conversation: the record half's (its middleware's, gate's)
        self.tool_results = tool_results
        self.user_turns = user_turns
        self.harder_attempts = harder_attempts
        self.merge_prompt = merge_prompt
        self.chain_gain_fraction = float(chain_gain_fraction)
        self.overflow_policy: OverflowPolicy = overflow_policy
        self.summary_request: SummaryRequest = summary_request
        self.passes = 0
        self.user_passes_waited = 0
        self.fallbacks_after_record = 0
        self.shed_events = 0
        self.records_replaced = 0
        self.emergency_folds = 0
        self._refused: set[str] = set()
        self.replacements_refused = 0
        self.refused_answer_tokens = 0
        self._skipped: set[str] = set()
        self.replacements_skipped = 0
        self.replacements_failed = 0
        self.budget_failures = 0
        self.last_report: CompositionReport | None = None

    @property
    def strategies(self) -> tuple[object, object]:
        """The two halves, for :func:`find_nested_strategy`."""
        return (self.tool_results, self.user_turns)

    @property
    def groups_held_unreachable_coverage(self) -> int:
        """The record half's estimate (see the record strategy)."""
        return self.tool_results.groups_held_unreachable_coverage

    def _read(self, data: Mapping[str, object]) -> State:
        return State.from_dict(data, keep_head_groups=self._config.records.keep_head_groups)

    def _pass_config(self) -> CompositionConfig:
        """The configuration with the output cap an answer over the cached prefix would be sent with."""
        room = head_answer_room(self.conversation.head)
        return self._config if room == self._config.answer_tokens else replace(self._config, answer_tokens=room)

    async def __call__(self, messages: list[Message]) -> bool:
        """Compact ``messages`` in place; True if anything changed.

        Raises:
            CompactionBudgetExceeded: What must stay does not fit the budget (the list is untouched).
        """
        try:
            return await super().__call__(messages)
        except CompactionBudgetExceeded as error:
            self.budget_failures += 1
            self._count_refusals(error.refused)  # counted and warned about as on any pass
            self._count_skipped(error.skipped)
            raise

    async def _perform(self, request: Request, messages: Sequence[Message]) -> str | None:
        cut = self.user_turns.answers_cut
        answer = await self.user_turns._perform(request, messages)  # pyright: ignore[reportPrivateUsage]
        self.answers_cut += self.user_turns.answers_cut - cut  # a request of this composition's, sent by its half
        if request.kind in CHAIN_KINDS and answer is None:
            self.replacements_failed += 1  # the user half's WARNING says why; it is asked again after a new turn
        return answer

    def _refusals(self, report: CompositionReport) -> Mapping[str, str]:
        users = report.users
        refusals = self.user_turns._refusals(users) if users is not None else {}  # pyright: ignore[reportPrivateUsage]
        return {**refusals, **dict.fromkeys(report.refused, REFUSED_REPLACEMENT)}

    def _observe(self, report: CompositionReport, asked: set[str]) -> None:
        self.passes += 1
        self.last_report = report
        self.tool_results._observe(report.records, asked)  # pyright: ignore[reportPrivateUsage]
        if report.users is not None:
            self.user_turns._observe(report.users, asked)  # pyright: ignore[reportPrivateUsage]
        self.user_passes_waited += report.waited
        if report.over_budget:
            logger.warning(
                "The prompt is still %d tokens, over the %d-token budget, after this pass; a summary or record "
                "replacement made progress, so the next pass continues from it",
                report.tokens_after,
                self._config.max_input_tokens,
            )
        if report.fallback is not None:
            self.fallbacks_after_record += report.fallback.changed
            log_anchored(report.fallback, overflowing=True)
        self.shed_events += report.shed is not None and bool(report.shed.shed)
        self.records_replaced += bool(report.replaced)
        self.emergency_folds += bool(report.folded)
        self._count_refusals(report.refused)
        self._count_skipped(report.skipped)

    def _count_skipped(self, skipped: Sequence[str]) -> None:
        """Count and log the replacements not asked for, not seen before (each once)."""
        if fresh := _first_seen(self._skipped, skipped):
            self.replacements_skipped = len(self._skipped)
            logger.info(
                "Did not ask for %d record merge(s) or rewrite(s): an answer over records they stand for already "
                "left one of their values out",
                len(fresh),
            )

    def _count_refusals(self, refused: Sequence[str]) -> None:
        """Count and warn about the refusals not seen before (each once, whatever its pass's outcome), with what their
        answers cost in output tokens (those the conversation's state holds)."""
        if fresh := _first_seen(self._refused, refused):
            self.replacements_refused = len(self._refused)
            answers = {answer.identity: answer.text for answer in self.conversation.value.answers}
            paid = sum(self._counter.measure(text) for identity in fresh if (text := answers.get(identity)))
            self.refused_answer_tokens += paid
            logger.warning(
                "Refused %d record replacement(s) or emergency fold(s): not smaller than the records or user "
                "summaries they would replace, or a value of theirs missing; those stay as they are (their answers, "
                "%d output token(s), were paid for and dropped)",
                len(fresh),
                paid,
            )


def _first_seen(known: set[str], identities: Sequence[str]) -> set[str]:
    """Add ``identities`` to ``known``; those of them that were new."""
    fresh = set(identities) - known
    known |= fresh
    return fresh
