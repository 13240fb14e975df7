"""``ToolResultAnchoredSummarizationCompactionStrategy``: records replace tool results.

A thin adapter over :mod:`maf_compaction.core.records` on the generic shell loop
(:mod:`.loop`). The conversation's one state value (the record decisions, the default
fallback's decisions, the recall protocol's state, the records written over the cached
prefix) lives in the strategy's :class:`~.conversation.Conversation`, which the recall
middleware wired to :meth:`take_reforce` and the gate hold too: they read and write one
value and never call into each other.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import ClassVar

from agent_framework import CharacterEstimatorTokenizer, CompactionStrategy, Message

from ..core import records as core
from ..core.anchored import DEFAULT_KEEP_HEAD_GROUPS, DEFAULT_KEEP_TAIL_GROUPS, AnchoredConfig
from ..core.checks import Fraction, require, require_async_callable
from ..core.protocol import Done, sent_tokens
from ..core.records import Fallback, RecordConfig, RecordReport
from ..core.state import State
from .anchored import AnchoredCompactionStrategy, log_anchored
from .convert import to_history
from .counting import MediaTokenEstimator, PartCounter, Tokenizer
from .loop import NOTE_KIND, CompactionAdapter
from .recall import ToolResultRecallMiddleware

logger = logging.getLogger("maf_compaction")


class ToolResultAnchoredSummarizationCompactionStrategy(CompactionAdapter[RecordConfig, State, RecordReport]):
    """Let tool results leave the prompt once a record quotes their exact values.

    Past ``trigger_fraction`` of the budget the recall middleware asks the model for a
    record (a ``recall_earlier_tool_results`` call that quotes every value that cannot
    be reconstructed). On each pass with a record, a tool group after the head that ends
    before the newest record leaves the prompt when the records quote at least
    ``coverage_share`` of its distinct distinctive values (words of four or more
    characters with a digit, compared with case); a group quoted in part keeps a remnant,
    the lines with the values the records do not quote. Uncovered groups are held, so nothing
    unrecorded is lost, and asked for again once (:attr:`take_reforce`); a batch asked
    for without success is settled: held until a later record quotes it. A result larger
    than ``record_target_tokens`` may instead release the Markdown table rows a record
    quotes verbatim under the same headings. Records stay in the prompt.

    Without a record the strategy waits, and past ``fallback_fraction`` runs
    ``fallback`` with nothing held. With a record, if the prompt is still over the
    budget, every remaining tool group is held and the fallback may shed only
    narration; if that cannot fit the budget a WARNING says so.

    Pass the same instance as ``before_compaction_strategy`` and
    ``after_compaction_strategy``; register :func:`make_recall_tool` and install a
    :class:`ToolResultRecallMiddleware` with ``reforce=strategy.take_reforce``.

    Args:
        max_input_tokens: The input budget: context window minus output reservation.
        tokenizer: Any ``count_tokens(text) -> int`` tokenizer; use the same one for the
            middleware.
        keep_head_groups: Groups at the start that are never judged or changed.
        keep_tail_groups: The tail the default fallback keeps.
        trigger_fraction: The middleware asks for a record above this share of the budget,
            in (0, 1]; once a record exists it applies whatever the size.
        fallback_fraction: Without a record, the fallback runs from this share on; in
            (trigger_fraction, 1].
        coverage_share: Share of a group's distinct values the records must quote, in (0, 1].
        record_target_tokens: Set it to the recall tool's ``target_tokens``. Larger groups
            may release quoted table rows; ``None`` disables that and the
            :attr:`groups_held_unreachable_coverage` estimate.
        record_payoff_share: A record is asked for a tool group only when its expected size
            (the group's distinct values and a little prose) is at most this share of the
            group's tokens, in (0, 1]: on value-dense results (logs, metrics, tables, JSON) a
            record would be nearly as large as what it replaces and cost more at the output
            price than it saves. Such a group is held like a settled one and left to the
            fallback (:attr:`groups_declined`). ``None`` (default) asks for every group; the
            README's composition uses 0.2 (``maf_compaction.core.records.PAYOFF_SHARE``). Give the
            middleware the same value.
        fallback: Any ``CompactionStrategy`` (an async callable), run on the list after the
            pass; by default the anchored rules with the same budget, head and tail, run
            within the pass on the same converted history (the held messages protected).

    Attributes:
        last_report: What the last pass did, or ``None`` before the first pass.
        passes: Passes run, over both lists.
        records_found: 1 once a record has been seen, else 0.
        records_in_conversation: The most records seen in one conversation state.
        groups_covered: Tool groups records have covered so far (they left the prompt).
        groups_kept_uncovered: Groups held uncovered on the last pass with a record.
        groups_preserved_uncovered: Of those, the settled ones (held for good).
        groups_declined: Of those, the groups whose record would not pay (never asked for).
        groups_held_unreachable_coverage: Held groups on the last pass with a record whose
            cheapest sufficient values alone exceed ``record_target_tokens`` (an estimate:
            the token counts of the cheapest ``ceil(values * coverage_share)`` distinct
            values, standalone, without labels or formatting).
        rows_released: Table rows released by partial records, over all passes.
        fallbacks_used: Passes that ran the fallback without a record.
        fallbacks_after_record: Passes whose fallback behind a record changed something.
        fallbacks_held_after_record: Passes that held unrecorded groups for the fallback.
        overflows: Passes that ended over the budget behind a record.
        prefix_requests: Records asked over the cached prefix (with ``ToolResultRecallMiddleware(
            record_request="cached_prefix")``, or once pins are disabled).
        failed_prefix_requests: Of those, requests that failed or came back without text.
    """

    needs_recall = True

    core: ClassVar[object] = core
    state_type = State

    def __init__(
        self,
        *,
        max_input_tokens: int,
        tokenizer: Tokenizer,
        keep_head_groups: int = DEFAULT_KEEP_HEAD_GROUPS,
        keep_tail_groups: int = DEFAULT_KEEP_TAIL_GROUPS,
        trigger_fraction: float = core.DEFAULT_TRIGGER_FRACTION,
        fallback_fraction: float = core.DEFAULT_FALLBACK_FRACTION,
        coverage_share: float = core.DEFAULT_COVERAGE_SHARE,
        record_target_tokens: int | None = core.DEFAULT_RECORD_TARGET_TOKENS,
        record_payoff_share: float | None = None,
        fallback: CompactionStrategy | None = None,
    ) -> None:
        require("record_payoff_share", record_payoff_share, Fraction | None)
        in_pass = None
        if fallback is None:
            in_pass = AnchoredConfig(
                max_input_tokens=max_input_tokens, keep_head_groups=keep_head_groups, keep_tail_groups=keep_tail_groups
            )
        else:
            require_async_callable("fallback", fallback, kind="a CompactionStrategy or None")
        config = RecordConfig(
            max_input_tokens=max_input_tokens,
            keep_head_groups=keep_head_groups,
            keep_tail_groups=keep_tail_groups,
            trigger_fraction=trigger_fraction,
            fallback_fraction=fallback_fraction,
            coverage_share=coverage_share,
            record_target_tokens=record_target_tokens,
            payoff_share=record_payoff_share,
            fallback=in_pass,
        )
        self._setup(config, tokenizer, State(), holds=core.HOLD_REASONS)
        self._fallback = fallback
        self._default_fallback: AnchoredCompactionStrategy | None = None
        self._overflowing = False
        self._fallback_overflowing = False
        self.last_report: RecordReport | None = None
        self.passes = 0
        self.records_found = 0
        self.records_in_conversation = 0
        self._covered: set[int] = set()  # ordinals of covered groups, for the counter
        self.groups_covered = 0
        self.groups_kept_uncovered = 0
        self.groups_preserved_uncovered = 0
        self.groups_declined = 0
        self.groups_held_unreachable_coverage = 0
        self.rows_released = 0
        self.fallbacks_used = 0
        self.fallbacks_after_record = 0
        self.fallbacks_held_after_record = 0
        self.overflows = 0

    # -- configuration -------------------------------------------------------------------

    @property
    def trigger_fraction(self) -> float:
        """The share of the budget above which a record is asked for (pass it to the middleware)."""
        return self._config.trigger_fraction

    @property
    def fallback_fraction(self) -> float:
        """Without a record, the fallback runs from this share of the budget on."""
        return self._config.fallback_fraction

    @property
    def coverage_share(self) -> float:
        """Share of a group's distinct values the records must quote."""
        return self._config.coverage_share

    @property
    def record_payoff_share(self) -> float | None:
        """A record is asked for a group only when expected at most this share of it (pass it to the middleware)."""
        return self._config.payoff_share

    @property
    def record_target_tokens(self) -> int | None:
        """The record size the recall tool asks for; larger groups may release table rows."""
        return self._config.record_target_tokens

    @property
    def fallback(self) -> CompactionStrategy:
        """The fallback: the host's strategy, or the default anchored one.

        The default's rules run within the record pass, on the same converted history
        (so its own counters stay at zero); the host's runs on the list after the pass.
        """
        if self._fallback is not None:
            return self._fallback
        if self._default_fallback is None:  # the same budget, head and tail as the rules run within the pass
            config = self._config
            self._default_fallback = AnchoredCompactionStrategy(
                max_input_tokens=config.max_input_tokens,
                tokenizer=self._tokenizer,
                keep_head_groups=config.keep_head_groups,
                keep_tail_groups=config.keep_tail_groups,
            )
        return self._default_fallback

    @property
    def host_fallback(self) -> CompactionStrategy | None:
        """The fallback strategy the host gave, or ``None`` when the default anchored rules run within the pass."""
        return self._fallback

    # -- the recall middleware's seams -------------------------------------------------------

    def take_reforce(self) -> bool:
        """Take the outstanding ask for an uncovered batch for one pinned request: True once per ask.

        Wire it as the middleware's ``reforce``: the middleware then shares this strategy's conversation.
        """
        conversation = self.conversation
        taken, conversation.value = core.take_reforce(conversation.value)
        if taken:
            ask = conversation.value.records.ask
            logger.info("Asking again for a record of %d uncovered tool group(s)", len(ask.targets) if ask else 0)
        return taken

    def reforce_pending(self) -> bool:
        """An ask is outstanding and not yet taken (a preview: nothing is consumed)."""
        return core.reforce_pending(self.conversation.value.records)

    def bind_recall(self, recall: ToolResultRecallMiddleware) -> None:
        """Share this strategy's conversation with ``recall`` (when its ``reforce`` wraps :meth:`take_reforce`).

        A middleware given :meth:`take_reforce` itself shares it already.
        """
        recall.share(self.conversation, self._config)

    def record_expected(self) -> bool:
        """Is a record expected: asked for, or about to be? (Consumes nothing.)

        True while an ask is outstanding, or when the recall protocol decided to pin the
        next request. A composition waits on this before summarising user turns.
        """
        return core.record_expected(self.conversation.value)

    # -- the pass ------------------------------------------------------------------------

    async def _after(self, messages: list[Message], done: Done[State, RecordReport], changed: bool) -> bool:
        """Run the host's own fallback on the applied list, when the pass calls for it."""
        report = done.report
        if self._fallback is None or report.fallback is Fallback.NONE:
            return changed
        ran = bool(await self._fallback(messages))
        if report.fallback is Fallback.BEHIND_RECORD:
            if ran:
                self.fallbacks_after_record += 1
            tokens = sent_tokens(self._histories.history(messages, note_kind=NOTE_KIND))
            self._warn_overflow(tokens > self._config.max_input_tokens, tokens)
        return ran or changed

    # -- bookkeeping -------------------------------------------------------------------------

    def _observe(self, report: RecordReport, asked: set[str]) -> None:
        self.passes += 1
        self.last_report = report
        if report.records:
            self.records_found = 1
            self.records_in_conversation = max(self.records_in_conversation, report.records)
            self._covered.update(report.covered)
            self.groups_covered = len(self._covered)
            self.groups_kept_uncovered = len(report.uncovered)
            self.groups_preserved_uncovered = len(report.settled)
            self.groups_declined = len(report.declined)
            self.groups_held_unreachable_coverage = report.unreachable
            self.rows_released += report.rows_released
        self._log(report)
        fallback = report.fallback_report
        if report.fallback is Fallback.PLAIN:
            self.fallbacks_used += 1
        elif report.fallback is Fallback.BEHIND_RECORD:
            if report.held_unrecorded:
                self.fallbacks_held_after_record += 1
            if fallback is not None:
                if fallback.changed:
                    self.fallbacks_after_record += 1
                self._warn_overflow(report.overflow, fallback.tokens_after)
        else:
            self._overflowing = False
        if fallback is not None:
            log_anchored(fallback, overflowing=self._fallback_overflowing)
            self._fallback_overflowing = fallback.overflow

    def _warn_overflow(self, over: bool, tokens: int) -> None:
        if over:
            self.overflows += 1
        if over and not self._overflowing:
            logger.warning(
                "The prompt is %d tokens, over the %d-token budget, behind a record: the head, the records "
                "and the tool groups held because no record quotes them do not fit. Nothing recorded is lost; "
                "a larger budget or a fuller record is needed.",
                tokens,
                self._config.max_input_tokens,
            )
        self._overflowing = over

    def _log(self, report: RecordReport) -> None:
        if report.fallback is Fallback.PLAIN:
            logger.info(
                "No record at %d of %d tokens: running the fallback %s",
                report.tokens_before,
                self._config.max_input_tokens,
                type(self._fallback).__name__ if self._fallback is not None else "(anchored rules)",
            )
        if report.rows_released:
            logger.info("Released %d table row(s) that a record quotes verbatim", report.rows_released)
        if report.asked:
            logger.info("%d tool group(s) are not covered by a record; asking for one", len(report.asked))
        if report.declined:
            logger.debug(
                "%d tool group(s) are not covered by a record, and a record of them would not pay: held, not asked for",
                len(report.declined),
            )
        if report.unreachable:
            logger.warning(
                "%d held tool group(s) need more value text than the record target of %s tokens "
                "(estimate); they stay in the prompt",
                report.unreachable,
                self._config.record_target_tokens,
            )


#: Reads messages for :func:`record_text` (the record rule needs no exact counts).
_READER = PartCounter(MediaTokenEstimator(CharacterEstimatorTokenizer()))


def record_text(message: Message, messages: Sequence[Message] | None = None) -> str:
    """The record text ``message`` carries, or "" when it carries none: the strategy's own rule.

    A written record (compaction's own) is its whole text. Otherwise the message must be
    a tool message whose results carry the record marker and answer a
    ``recall_earlier_tool_results`` call: pass the conversation as ``messages`` to check
    the call there, as the strategy does; without it, the message's own call ids are
    taken as recall calls. The recall tool's result is a receipt and the record is its
    call's ``values``, so without ``messages`` such a record reads as its prefix alone
    (a result of an earlier release, which repeated the record, reads in full). An
    excluded message carries no record.

    Raises:
        TypeError: ``message`` is not a ``Message``.
    """
    if not isinstance(message, Message):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"message must be an agent_framework Message, got {message!r}")
    record = to_history([message], _READER, note_kind=NOTE_KIND)[0]
    if messages is None:
        recall_calls: core.RecallCalls = {p.call_id: "" for p in record.parts if p.call_id}
    else:
        recall_calls = core.find_recall_calls(to_history(messages, _READER, note_kind=NOTE_KIND))
    return core.record_text(record, recall_calls)
