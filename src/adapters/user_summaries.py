"""``UserTurnAnchoredSummarizationCompactionStrategy``: earlier user turns become a summary.

A thin adapter over :mod:`maf_compaction.core.user_summaries` on the generic shell loop
(:mod:`.loop`). The core answers with effect requests (a summary, a media description);
this adapter performs them (the summarizer client, the host's ``describe_media`` hook)
and the loop absorbs each answer and steps again until the core is done. Because
answers are kept by request identity, the stored-history pass, a restored session or
another replica replays a summary instead of asking for it again.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar

from agent_framework import Content, Message

from ..core import user_summaries as core
from ..core.answers import max_answer_tokens
from ..core.checks import require_async_callable
from ..core.effects import Request
from ..core.effects import trimmed as remembered
from ..core.state import RequestKind, State
from ..core.user_summaries import Outcome, SummaryMode, UserReport, UserSummaryConfig
from . import telemetry
from .aligned import cut_at_cap
from .counting import Tokenizer
from .loop import CompactionAdapter

logger = logging.getLogger("maf_compaction")

#: Why a summarised user turn is excluded.
EXCLUDE_REASON = core.EXCLUDE_REASON
#: Why a folded summary is excluded.
FOLD_EXCLUDE_REASON = core.FOLD_EXCLUDE_REASON

#: Why a summary was not kept (telemetry): it was not smaller than what it would replace.
REFUSED_NOT_SMALLER = "not_smaller"
REFUSED_INCOMPLETE = "incomplete"

DescribeMediaHook = Callable[[Content, Message], Awaitable[str | None]]


class UserTurnAnchoredSummarizationCompactionStrategy(CompactionAdapter[UserSummaryConfig, State, UserReport]):
    """Replace earlier user turns with a summary that keeps every requirement and correction.

    Past ``trigger_fraction`` of the budget, the user turns between the first
    ``keep_head_user_turns`` and the last ``keep_tail_user_turns`` (the band) are sent to
    ``client`` with a prompt that asks for every requirement, constraint, correction and
    exact value, and replaced by one user message that starts with
    ``[earlier turns in this conversation, compacted]``. Assistant and tool messages stay
    where they are. The band must be worth a call (``min_band_share`` of the prompt),
    each request fits ``max_summary_input_tokens``, and a summary is accepted only if it
    is smaller than what it replaces; a failure or a refusal changes nothing and is
    counted.

    Modes: ``"recompact"`` re-summarises the standing summary with the new turns (one
    summary stands; the front of the prompt changes each time); ``"boundary"`` leaves
    standing summaries alone and summarises only the turns after the newest one (the
    prefix before it stays cached); ``"fold"`` is boundary plus folding standing
    summaries into one when the saving pays for the break.

    User turns with media stay verbatim unless ``describe_media`` is given: an async
    ``describe_media(content, message) -> str | None`` that receives copies of the media
    part and the whole turn and returns a description (``None`` for an unsupported
    part). Descriptions replace the media in the transcript, marked as inferred; a
    failed, empty or oversized one keeps the turn. Descriptions and summary answers live
    in the state (:meth:`decision_state`), keyed by what determines them.

    Args:
        max_input_tokens: The input budget.
        tokenizer: Any ``count_tokens(text) -> int`` tokenizer.
        client: The summarizer: any framework chat client (``get_response``).
        keep_head_user_turns: User turns at the start never summarised.
        keep_tail_user_turns: User turns at the end never summarised.
        trigger_fraction: The strategy acts above this share of the budget, in (0, 1].
        min_band_share: The band must be at least this share of the prompt, in [0, 1).
        summary_mode: ``"recompact"``, ``"boundary"`` or ``"fold"``.
        prompt: The summarizer's instructions (a default is provided).
        fold_prompt: The instructions for folding summaries.
        remembered_requests: Summary answers kept in the state (at least 1; 2 when a
            composition runs this strategy in the boundary or fold mode).
        max_summary_input_tokens: Bound on every summarizer request, instructions and
            numbered transcript together; half the budget by default (at least 1).
        describe_media: The host's media description hook (see above).

    Attributes:
        client: The summarizer client.
        last_report: What the last pass did, or ``None``.
        passes: Passes run, over both lists.
        user_compactions: Summaries accepted from a fresh answer.
        user_folds: Folds accepted from a fresh answer.
        user_summaries_replayed: Summaries or folds applied from a remembered answer.
        user_summary_failures: Fresh answers that failed or were refused.
        user_summaries_refused: Of those, the ones refused for not being smaller.
        user_summaries_incomplete: Of those, the ones refused because the answer, and one more request naming
            what it left out, missed a value, a requirement, constraint or correction line, or everything of
            what it would replace (the summary coverage rule, :mod:`maf_compaction.core.summary_check`).
        user_summaries_reasked: Answers that left something out, asked once more naming it.
        user_summaries_repaired: Summaries kept with what the answer left out copied after it from the turns.
        user_messages_replaced: Messages the last applied summary replaced.
        user_summaries_in_conversation: Summaries standing after the last pass.
        user_summary_tokens: Their tokens.
        user_passes_below_trigger: Passes at or below the trigger.
        user_passes_declined: Passes whose band was not worth a call.
        user_passes_nothing_fits: Passes where no item fitted ``max_summary_input_tokens``.
        summarizer_calls: Requests sent to the summarizer.
        media_descriptions: Calls of ``describe_media``.
        media_description_failures: Of those, the ones that raised or returned nothing.
    """

    def __init__(
        self,
        *,
        max_input_tokens: int,
        tokenizer: Tokenizer,
        client: Any,
        keep_head_user_turns: int = core.DEFAULT_KEEP_HEAD_USER_TURNS,
        keep_tail_user_turns: int = core.DEFAULT_KEEP_TAIL_USER_TURNS,
        trigger_fraction: float = core.DEFAULT_TRIGGER_FRACTION,
        min_band_share: float = core.DEFAULT_MIN_BAND_SHARE,
        summary_mode: SummaryMode = core.DEFAULT_SUMMARY_MODE,
        prompt: str | None = None,
        fold_prompt: str | None = None,
        remembered_requests: int = core.DEFAULT_REMEMBERED_REQUESTS,
        max_summary_input_tokens: int | None = None,
        describe_media: DescribeMediaHook | None = None,
    ) -> None:
        if client is None or not callable(getattr(client, "get_response", None)):
            raise ValueError(f"client must be a chat client with get_response(), got {client!r}")
        if describe_media is not None:
            require_async_callable("describe_media", describe_media, kind="an async callable or None")
        config = UserSummaryConfig(
            max_input_tokens=max_input_tokens,
            keep_head_user_turns=keep_head_user_turns,
            keep_tail_user_turns=keep_tail_user_turns,
            trigger_fraction=trigger_fraction,
            min_band_share=min_band_share,
            summary_mode=summary_mode,
            prompt=core.DEFAULT_PROMPT if prompt is None else prompt,
            fold_prompt=core.DEFAULT_FOLD_PROMPT if fold_prompt is None else fold_prompt,
            remembered_requests=remembered_requests,
            max_summary_input_tokens=max_summary_input_tokens,
            describe_media=describe_media is not None,
        )
        self._setup(config, tokenizer, State())
        self.client = client
        self._describe = describe_media
        self.last_report: UserReport | None = None
        self.passes = 0
        self.user_compactions = 0
        self.user_folds = 0
        self.user_summaries_replayed = 0
        self.user_summary_failures = 0
        self.user_summaries_refused = 0
        self.user_summaries_incomplete = 0
        self.user_summaries_reasked = 0
        self.user_summaries_repaired = 0
        self.user_messages_replaced = 0
        self.user_summaries_in_conversation = 0
        self.user_summary_tokens = 0
        self.user_passes_below_trigger = 0
        self.user_passes_declined = 0
        self.user_passes_nothing_fits = 0
        self.summarizer_calls = 0
        self.media_descriptions = 0
        self.media_description_failures = 0

    @property
    def trigger_fraction(self) -> float:
        """The strategy acts above this share of the budget."""
        return self._config.trigger_fraction

    @property
    def summary_mode(self) -> SummaryMode:
        """``"recompact"``, ``"boundary"`` or ``"fold"``."""
        return self._config.summary_mode

    core: ClassVar[object] = core
    state_type = State
    linked_reasons: ClassVar[frozenset[str]] = frozenset({core.EXCLUDE_REASON, core.FOLD_EXCLUDE_REASON})

    # -- effects ---------------------------------------------------------------------------

    async def _perform(self, request: Request, messages: Sequence[Message]) -> str | None:
        if request.kind is RequestKind.MEDIA:
            return await self._describe_media(request, messages)
        if request.kind is not RequestKind.RECORD:
            return await self._summarize(request)
        return await super()._perform(request, messages)

    async def _summarize(self, request: Request) -> str | None:
        self.summarizer_calls += 1
        cap = max_answer_tokens(request, self._counter.measure)
        telemetry.note_cap(cap)
        try:
            response = await self.client.get_response(
                [Message("system", [request.prompt]), Message("user", [request.transcript])],
                stream=False,
                options={"max_tokens": cap},
            )
        except Exception as error:  # the summarizer is outside our control; cancellation propagates
            telemetry.note_failure(error)
            logger.warning(
                "The summarizer failed (%s: %s); %s stay as they are", type(error).__name__, error, _what_stays(request)
            )
            return None
        telemetry.note_response(response)
        if cut_at_cap(
            response, "The summarizer", f"a {request.kind.value}", cap, f"{_what_stays(request)} stay as they are"
        ):
            self._count_cut()
            return None
        text = getattr(response, "text", None)
        if not isinstance(text, str) or not text.strip():
            logger.warning("The summarizer returned no text; %s stay as they are", _what_stays(request))
            return None
        return text

    async def _describe_media(self, request: Request, messages: Sequence[Message]) -> str | None:
        hook = self._describe
        if hook is None or not 0 <= request.origin < len(messages):
            return None
        message = messages[request.origin]
        self.media_descriptions += 1
        try:
            text = await hook(copy.deepcopy(message.contents[request.part]), copy.deepcopy(message))
        except Exception as error:  # the host's hook; cancellation propagates
            telemetry.note_failure(error)
            self.media_description_failures += 1
            logger.warning(
                "describe_media failed for message %s (%s: %s); the turn stays verbatim",
                message.message_id,
                type(error).__name__,
                error,
            )
            return None
        if not isinstance(text, str) or not text.strip():
            self.media_description_failures += 1
            return None
        return text

    # -- state -----------------------------------------------------------------------------

    def _read(self, data: Mapping[str, object]) -> State:
        # No configuration is checked: an answer is found only by its request's identity, a digest of everything
        # that determines it; ``remembered_requests`` of its summary answers are kept, the newest.
        return remembered(State.from_dict(data), self._config.remembered_requests)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _refusals(self, report: UserReport) -> Mapping[str, str]:
        if report.outcome is Outcome.REFUSED and report.request is not None:
            return {report.request: REFUSED_NOT_SMALLER}
        if report.outcome is Outcome.INCOMPLETE and report.request is not None:
            return {report.request: REFUSED_INCOMPLETE}
        return {}

    def _observe(self, report: UserReport, asked: set[str]) -> None:
        fresh = report.request in asked  # answered in this pass, not replayed from the state
        self.user_summaries_reasked += fresh and report.reasked
        nothing_fitted = self.last_report is not None and self.last_report.outcome is Outcome.NOTHING_FITS
        self.passes += 1
        self.last_report = report
        self.user_summaries_in_conversation = report.standing
        self.user_summary_tokens = report.summary_tokens
        outcome = report.outcome
        self.user_passes_below_trigger += outcome is Outcome.BELOW_TRIGGER
        self.user_passes_declined += outcome is Outcome.DECLINED
        if outcome is Outcome.NOTHING_FITS:
            self.user_passes_nothing_fits += 1
            if not nothing_fitted:  # once per episode, not on every pass
                logger.warning(
                    "Nothing to summarise fits max_summary_input_tokens=%d with the instructions (the oldest user "
                    "turn or summary alone, or for a fold two summaries, is larger); nothing was sent. Raise "
                    "max_summary_input_tokens to let it progress.",
                    self._config.summary_input_limit,
                )
        elif outcome in core.APPLIED:
            self.user_messages_replaced = len(report.replaced)
            if not fresh:
                self.user_summaries_replayed += 1
                return
            self.user_folds += outcome is Outcome.FOLDED
            self.user_compactions += outcome is Outcome.SUMMARIZED
            if report.missing is not None:
                self.user_summaries_repaired += 1
                _warn_left_out(report, "they follow it, copied verbatim from the turns it replaces")
            logger.info(
                "%s %d message(s) into %s (%d -> %d tokens)",
                "Folded" if outcome is Outcome.FOLDED else "Summarised",
                len(report.replaced),
                report.summary_id,
                report.tokens_before,
                report.tokens_after,
            )
            if report.tokens_after > self._config.max_input_tokens:
                logger.warning(
                    "After summary %s the prompt is still %d tokens, over the %d-token budget: the protected "
                    "and anchored turns, assistant and tool messages stay. Pair this strategy with a record "
                    "strategy or a fallback to make more room.",
                    report.summary_id,
                    report.tokens_after,
                    self._config.max_input_tokens,
                )
        elif fresh:  # only an answered request's outcome names it: failed or refused
            self.user_summary_failures += 1
            if outcome is Outcome.REFUSED:
                self.user_summaries_refused += 1
                logger.warning(
                    "Refused summary %s: it was not smaller than the %d tokens it would replace",
                    report.summary_id,
                    report.band_tokens,
                )
            elif outcome is Outcome.INCOMPLETE:
                self.user_summaries_incomplete += 1
                _warn_left_out(
                    report,
                    f"refused: the {len(report.kept)} message(s) it would replace stay verbatim: "
                    + ", ".join(report.kept),
                )


def _warn_left_out(report: UserReport, outcome: str) -> None:
    """One WARNING for a summary whose answers left something out (:mod:`maf_compaction.core.summary_check`)."""
    missing = report.missing.described() if report.missing is not None else "something"
    logger.warning(
        "Summary %s left out %s, and so did one more request naming them; %s", report.summary_id, missing, outcome
    )


def _what_stays(request: Request) -> str:
    """What a failed request leaves as it is: the records a composition's merge or rewrite would replace, or turns."""
    if request.kind is RequestKind.EMERGENCY_FOLD:
        return "the user summaries"
    return "the records" if request.kind in (RequestKind.MERGE, RequestKind.REWRITE) else "user turns"
