"""``ToolResultAnchoredSummarizationCompactionStrategy``: records replace tool results.

A thin adapter over :mod:`maf_compaction.core.records`: convert the framework's list,
run the pure pass, apply its answer in place (exclusions, holds, released table rows),
then run the fallback the pass asks for. The decisions (the outstanding ask and the
settled groups) live on the instance: direct wiring serves one conversation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from agent_framework import CompactionStrategy, Message

from ..core import records as core
from ..core.grouping import Grouping
from ..core.model import TOOL_CALL_KINDS, History
from ..core.record_decisions import RecordDecisions
from ..core.records import Fallback, RecordConfig, RecordReport
from .anchored import NOTE_KIND as ANCHORED_NOTE_KIND
from .anchored import AnchoredCompactionStrategy
from .base import ConfiguredStrategy
from .convert import EXCLUDED_KEY, WRITTEN_RECORD_KEY, RecordCache, apply
from .counting import MediaTokenEstimator, Tokenizer, as_estimator

logger = logging.getLogger("maf_compaction")

#: Why the messages of a covered tool group are excluded.
EXCLUDE_REASON = "tool_summary_anchored"


class RecallPreview(Protocol):
    """What the strategy reads from a bound recall middleware."""

    def record_due(self) -> bool:
        """Would the next request be pinned to the recall tool? (Consumes nothing.)"""
        ...


class ToolResultAnchoredSummarizationCompactionStrategy(ConfiguredStrategy[RecordConfig]):
    """Let tool results leave the prompt once a record quotes their exact values.

    Past ``trigger_fraction`` of the budget the recall middleware asks the model for a
    record (a ``recall_earlier_tool_results`` call that quotes every value that cannot
    be reconstructed). On each pass with a record, a tool group after the head that ends
    before the newest record leaves the prompt when the records quote at least
    ``coverage_share`` of its distinct distinctive values (words of four or more
    characters with a digit, compared with case). Uncovered groups are held, so nothing
    unrecorded is lost, and asked for again once (:meth:`take_reforce`); a batch asked
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
        coverage_share: Share of a group's distinct values the records must quote, in [0, 1].
        record_target_tokens: Set it to the recall tool's ``target_tokens``. Larger groups
            may release quoted table rows; ``None`` disables that and the
            :attr:`groups_held_unreachable_coverage` estimate.
        fallback: Any ``CompactionStrategy``; by default an
            :class:`AnchoredCompactionStrategy` with the same budget, tokenizer, head and tail.

    Attributes:
        last_report: What the last pass did, or ``None`` before the first pass.
        passes: Passes run, over both lists.
        records_found: 1 once a record has been seen, else 0.
        records_in_conversation: The most records seen in one conversation state.
        groups_covered: Tool groups records have covered so far (they left the prompt).
        groups_kept_uncovered: Groups held uncovered on the last pass with a record.
        groups_preserved_uncovered: Of those, the settled ones (held for good).
        groups_held_unreachable_coverage: Held groups on the last pass with a record whose
            cheapest sufficient values alone exceed ``record_target_tokens`` (an estimate:
            the token counts of the cheapest ``ceil(values * coverage_share)`` distinct
            values, standalone, without labels or formatting).
        rows_released: Table rows released by partial records, over all passes.
        fallbacks_used: Passes that ran the fallback without a record.
        fallbacks_after_record: Passes whose fallback behind a record changed something.
        fallbacks_held_after_record: Passes that held unrecorded groups for the fallback.
        overflows: Passes that ended over the budget behind a record.
    """

    def __init__(
        self,
        *,
        max_input_tokens: int,
        tokenizer: Tokenizer,
        keep_head_groups: int = 3,
        keep_tail_groups: int = 4,
        trigger_fraction: float = core.DEFAULT_TRIGGER_FRACTION,
        fallback_fraction: float = core.DEFAULT_FALLBACK_FRACTION,
        coverage_share: float = core.DEFAULT_COVERAGE_SHARE,
        record_target_tokens: int | None = core.DEFAULT_RECORD_TARGET_TOKENS,
        fallback: CompactionStrategy | None = None,
    ) -> None:
        self._config = RecordConfig(
            max_input_tokens=max_input_tokens,
            keep_head_groups=keep_head_groups,
            keep_tail_groups=keep_tail_groups,
            trigger_fraction=trigger_fraction,
            fallback_fraction=fallback_fraction,
            coverage_share=coverage_share,
            record_target_tokens=record_target_tokens,
        )
        if fallback is not None and not callable(fallback):
            raise ValueError(f"fallback must be a CompactionStrategy (an async callable), got {fallback!r}")
        self._tokenizer = tokenizer
        self._estimator: MediaTokenEstimator = as_estimator(tokenizer)
        self._counter = self._estimator.parts
        self._records = RecordCache(self._counter, holds=core.HOLD_REASONS)
        self._grouping: Grouping | None = None
        self._decisions = RecordDecisions()
        self._recall: RecallPreview | None = None
        self._fallback: CompactionStrategy = fallback or AnchoredCompactionStrategy(
            max_input_tokens=max_input_tokens,
            tokenizer=tokenizer,
            keep_head_groups=keep_head_groups,
            keep_tail_groups=keep_tail_groups,
        )
        self._overflowing = False
        self.last_report: RecordReport | None = None
        self.passes = 0
        self.records_found = 0
        self.records_in_conversation = 0
        self._covered: set[int] = set()  # ordinals of covered groups, for the counter
        self.groups_covered = 0
        self.groups_kept_uncovered = 0
        self.groups_preserved_uncovered = 0
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
    def record_target_tokens(self) -> int | None:
        """The record size the recall tool asks for; larger groups may release table rows."""
        return self._config.record_target_tokens

    @property
    def fallback(self) -> CompactionStrategy:
        """The strategy that runs when no record can help."""
        return self._fallback

    # -- the recall middleware's seams -------------------------------------------------------

    def take_reforce(self) -> bool:
        """Take the outstanding ask for an uncovered batch: True once per ask.

        Wire it as the middleware's ``reforce``; the middleware then pins one request
        to the recall tool for the batch.
        """
        taken, self._decisions = core.take_reforce(self._decisions)
        if taken:
            logger.info("Asking again for a record of %d uncovered tool group(s)", len(self._ask_targets()))
        return taken

    def reforce_pending(self) -> bool:
        """An ask is outstanding and not yet taken (a preview: nothing is consumed)."""
        return core.reforce_due(self._decisions)

    def bind_recall(self, recall: RecallPreview) -> None:
        """Share the recall middleware's non-consuming ``record_due`` preview.

        The middleware calls this itself when its ``reforce`` is this strategy's bound
        :meth:`take_reforce`; call it explicitly if you wrap ``take_reforce``.
        """
        self._recall = recall

    def record_due(self) -> bool:
        """Is a record outstanding or about to be asked for? (Consumes nothing.)

        True while an ask is outstanding, or when the bound middleware would pin the
        next request. A composition waits on this before summarising user turns.
        """
        if self._decisions.ask is not None:
            return True
        return self._recall.record_due() if self._recall is not None else False

    # -- the pass ------------------------------------------------------------------------

    async def __call__(self, messages: list[Message]) -> bool:
        """Apply records to ``messages`` in place; True if anything changed."""
        if not messages:
            return False
        before = self._records.history(messages, note_kind=ANCHORED_NOTE_KIND)
        done = core.step(self._config, before, self._decisions, self._counter.measure, grouping=self._grouping)
        self._decisions = done.decisions
        self._grouping = done.grouping
        report = done.report
        changed = _differs(before, done.history)
        if changed:
            apply(messages, before, done.history, note_kind=ANCHORED_NOTE_KIND, exclude_reason=EXCLUDE_REASON)
        self._record(report)
        self._log(report, before)
        if report.fallback is Fallback.PLAIN:
            self.fallbacks_used += 1
            logger.info(
                "No record at %d of %d tokens: running the fallback %s",
                report.tokens_before,
                self._config.max_input_tokens,
                type(self._fallback).__name__,
            )
            changed = bool(await self._fallback(messages)) or changed
        elif report.fallback is Fallback.BEHIND_RECORD:
            if report.held_unrecorded:
                self.fallbacks_held_after_record += 1
            if await self._fallback(messages):
                self.fallbacks_after_record += 1
                changed = True
            self._check_budget(messages)
        else:
            self._overflowing = False
        return changed

    def decision_state(self) -> RecordDecisions:
        """The decisions history cannot show (an immutable value; see ``to_dict``)."""
        return self._decisions

    def restore_decisions(self, decisions: RecordDecisions | Mapping[str, Any]) -> None:
        """Continue from decisions (a value or its ``to_dict()``).

        Raises:
            SnapshotVersionError: They were written by a newer schema.
            SnapshotError: They are malformed or inconsistent.
        """
        # A value is read back through its dict, so it is checked exactly like a stored one.
        data = decisions.to_dict() if isinstance(decisions, RecordDecisions) else decisions
        self._decisions = RecordDecisions.from_dict(data)

    # -- bookkeeping -------------------------------------------------------------------------

    def _ask_targets(self) -> tuple[int, ...]:
        ask = self._decisions.ask
        return ask.targets if ask is not None else ()

    def _record(self, report: RecordReport) -> None:
        self.passes += 1
        self.last_report = report
        if report.records:
            self.records_found = 1
            self.records_in_conversation = max(self.records_in_conversation, report.records)
            self._covered.update(report.covered)
            self.groups_covered = len(self._covered)
            self.groups_kept_uncovered = len(report.uncovered)
            self.groups_preserved_uncovered = len(report.settled)
            self.groups_held_unreachable_coverage = report.unreachable
            self.rows_released += report.rows_released

    def _check_budget(self, messages: list[Message]) -> None:
        tokens = core.sent_tokens(self._records.history(messages, note_kind=ANCHORED_NOTE_KIND))
        if tokens <= self._config.max_input_tokens:
            self._overflowing = False
            return
        self.overflows += 1
        if not self._overflowing:
            logger.warning(
                "The prompt is %d tokens, over the %d-token budget, behind a record: the head, the records "
                "and the tool groups held because no record quotes them do not fit. Nothing recorded is lost; "
                "a larger budget or a fuller record is needed.",
                tokens,
                self._config.max_input_tokens,
            )
        self._overflowing = True

    def _log(self, report: RecordReport, before: History) -> None:
        if report.dropped:
            ids = [before[i].message_id or f"#{i}" for i in report.dropped]
            logger.info(
                "Records cover %d tool group(s); %d message(s) left the prompt (kept in stored history, excluded): %s",
                len(report.covered),
                len(ids),
                ", ".join(ids),
            )
        if report.joined:
            ids = [before[i].message_id or f"#{i}" for i in report.joined]
            logger.warning(
                "Excluded %d message(s) no record quotes, to keep a tool group whole (a result that arrived "
                "for a call a record already covered); they stay in stored history: %s",
                len(ids),
                ", ".join(ids),
            )
        if report.rows_released:
            logger.info("Released %d table row(s) that a record quotes verbatim", report.rows_released)
        if report.asked:
            logger.info("%d tool group(s) are not covered by a record; asking for one", len(report.asked))
        if report.unreachable:
            logger.warning(
                "%d held tool group(s) need more value text than the record target of %s tokens "
                "(estimate); they stay in the prompt",
                report.unreachable,
                self._config.record_target_tokens,
            )


def _differs(before: History, after: History) -> bool:
    return any(
        a is not b and (a.excluded != b.excluded or a.parts is not b.parts or a.held != b.held)
        for a, b in zip(before, after, strict=True)
    )


def record_text(message: Message, messages: Sequence[Message] | None = None) -> str:
    """The record text ``message`` carries, or "" when it carries none.

    A written record (compaction's own) is its whole text. Otherwise the message must be
    a tool message whose results start with the record prefix; pass the conversation as
    ``messages`` to also require that each result answers a
    ``recall_earlier_tool_results`` call in it (the strategy's own test). An excluded
    message carries no record.
    """
    props = message.additional_properties
    if props.get(EXCLUDED_KEY):
        return ""
    if props.get(WRITTEN_RECORD_KEY) is True:
        text = message.text
        has_call = any(c.type in TOOL_CALL_KINDS for c in message.contents)
        return text if text.startswith(core.RECORD_PREFIX) and not has_call else ""
    if message.role != "tool":
        return ""
    calls: set[str] | None = None
    if messages is not None:
        calls = {
            c.call_id
            for m in messages
            for c in m.contents
            if c.type == "function_call" and c.name == core.RECALL_TOOL_NAME and c.call_id
        }
    return "\n".join(
        c.result
        for c in message.contents
        if c.type == "function_result"
        and isinstance(c.result, str)
        and c.result.startswith(core.RECORD_PREFIX)
        and (calls is None or c.call_id in calls)
    )
