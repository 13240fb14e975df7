"""``AnchoredCompactionStrategy`` and ``MinimumGainAnchoredCompactionStrategy``.

Thin adapters over :mod:`maf_compaction.core.anchored` on the generic shell loop
(:mod:`.loop`): the strategy supplies its configuration, its counters and its log lines.
The conversation's decisions live on the instance (direct wiring: one conversation per
instance), so the in-call copies and the stored history get exactly the same sheds.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import replace
from typing import Any, ClassVar

from agent_framework import Message

from ..core import anchored as core
from ..core.anchored import AnchoredConfig, Report
from ..core.checks import AtLeastOne, require
from ..core.state import AnchoredSnapshot
from .counting import Tokenizer
from .loop import CompactionAdapter

logger = logging.getLogger("maf_compaction")


class AnchoredCompactionStrategy(CompactionAdapter[AnchoredConfig, AnchoredSnapshot, Report]):
    """Keep a fixed head and tail verbatim; shorten the band between by position only.

    Tool results in the band keep a share of the budget that depends only on their
    position (``band_share * max_input_tokens / (position + 1)``, at least 150 tokens),
    so each is shortened once, to the same bytes on every later pass. Whole groups are
    shed, oldest first, only when the prompt is over the budget, down to a low-water
    mark so one prefix break buys room for several turns; each shed group leaves a note
    the model can see and is named in a WARNING. User and system turns, injected
    context and preserved messages are never changed. If the anchors alone exceed the
    budget, the pass ends over it and logs a WARNING (honest overflow).

    Implements the framework's ``CompactionStrategy``; pass the same instance as both
    ``before_compaction_strategy`` and ``after_compaction_strategy`` of
    ``create_harness_agent`` so the call copies and the stored history agree.

    Args:
        max_input_tokens: The input budget: context window minus output reservation.
        tokenizer: Any ``count_tokens(text) -> int`` tokenizer; wrap it in a
            :class:`MediaTokenEstimator` to set media estimates.
        keep_head_groups: Groups at the start that are never touched (task, requirements).
        keep_tail_groups: Groups at the end that are never touched (the working set).
        keep_tokens: A fixed allowance per band result instead of the harmonic rule.
        band_share: Share of the budget the oldest band result keeps, in (0, 1].
        collapse_assistant_text: Also shed band assistant replies when shedding tool
            groups alone does not reach the low-water mark.
        low_water_fraction: A shed goes down to this share of the ceiling, in (0, 1].

    Attributes:
        last_report: What the last pass did (tokens before and after, shed message
            origins, results shortened, overflow), or ``None`` before the first pass.
        passes: Passes run, over both lists.
        shed_events: Passes that shed something new.
        overflows: Passes that ended over their ceiling (honest overflow).
        declined_collapses: Passes whose collapse the minimum-gain floor declined.

    ``compact_to`` is synchronous: the anchored strategy performs no effects.
    """

    core: ClassVar[object] = core
    state_type = AnchoredSnapshot

    def __init__(
        self,
        *,
        max_input_tokens: int,
        tokenizer: Tokenizer,
        keep_head_groups: int = core.DEFAULT_KEEP_HEAD_GROUPS,
        keep_tail_groups: int = core.DEFAULT_KEEP_TAIL_GROUPS,
        keep_tokens: int | None = None,
        band_share: float = core.DEFAULT_BAND_SHARE,
        collapse_assistant_text: bool = True,
        low_water_fraction: float = core.DEFAULT_LOW_WATER_FRACTION,
    ) -> None:
        config = AnchoredConfig(
            max_input_tokens=max_input_tokens,
            keep_head_groups=keep_head_groups,
            keep_tail_groups=keep_tail_groups,
            keep_tokens=keep_tokens,
            band_share=band_share,
            collapse_assistant_text=collapse_assistant_text,
            low_water_fraction=low_water_fraction,
        )
        self._setup(config, tokenizer, AnchoredSnapshot())
        self.passes = 0
        self.shed_events = 0
        self.overflows = 0
        self.declined_collapses = 0
        self.last_report: Report | None = None

    async def __call__(self, messages: list[Message]) -> bool:
        """Compact ``messages`` in place to ``max_input_tokens``; True if anything changed.

        False does not mean the prompt fits: see :attr:`last_report`.
        """
        return self.compact_to(messages, ceiling=self._config.max_input_tokens)

    def compact_to(self, messages: list[Message], *, ceiling: int) -> bool:
        """Compact in place, shedding (only) down toward ``ceiling`` instead of the budget.

        This is the seam a composition uses to compact below the budget. Shortening
        never reads the ceiling.
        """
        require("ceiling", ceiling, AtLeastOne)
        return self._run_sync(messages, ceiling=ceiling)

    def _observe(self, report: Report, asked: set[str]) -> None:
        del asked
        overflowing = self.last_report is not None and self.last_report.overflow
        self.passes += 1
        self.last_report = report
        self.shed_events += bool(report.shed)
        self.overflows += report.overflow
        self.declined_collapses += report.declined
        log_anchored(report, overflowing=overflowing)


def log_anchored(report: Report, *, overflowing: bool) -> None:
    """The anchored pass's own log lines (the loop names every excluded message)."""
    if report.misplaced:
        logger.warning(
            "%d shed note(s) no longer sit at the group they replaced: the list lost messages. "
            "Keep excluded messages in loaded history (InMemoryHistoryProvider(skip_excluded=False), "
            "the default); until then this strategy only shortens.",
            report.misplaced,
        )
    if report.overflow and not overflowing:
        logger.warning(
            "The prompt is %d tokens, over the %d-token ceiling: the anchored head, tail and "
            "protected turns alone exceed it. Nothing more can be removed by position.",
            report.tokens_after,
            report.ceiling,
        )
    logger.debug(
        "anchored pass: %d -> %d tokens (ceiling %d), %d result(s) shortened, changed=%s",
        report.tokens_before,
        report.tokens_after,
        report.ceiling,
        report.shortened,
        report.changed,
    )


class MinimumGainAnchoredCompactionStrategy(AnchoredCompactionStrategy):
    """The anchored strategy with a break-even floor on each collapse.

    A collapse re-bills every token behind its first edit at the uncached price, so it
    pays only when ``R > B(p - c) / (p + T c)``: R removed, B behind the edit, T turns
    left, p and c the uncached and cached prices. At a 10x discount and about 20 turns
    that is 29% of B, the default. While the prompt fits, a collapse that would remove
    less is declined (counted in :attr:`declined_collapses`); once accepted it is never
    taken back. Over the ceiling the floor is skipped.

    It takes the anchored strategy's parameters; only ``min_gain_fraction``'s default
    differs.

    Args:
        min_gain_fraction: The floor, in [0, 1); 0 makes it the anchored strategy.
        **kwargs: As for :class:`AnchoredCompactionStrategy`.
    """

    def __init__(self, *, min_gain_fraction: float = core.DEFAULT_MIN_GAIN_FRACTION, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._config = replace(self._config, min_gain_fraction=min_gain_fraction)

    @property
    def min_gain_fraction(self) -> float:
        """The break-even floor."""
        return self._config.min_gain_fraction


def _with_min_gain(signature: inspect.Signature) -> inspect.Signature:
    """The anchored signature plus ``min_gain_fraction``, for ``help()`` and IDEs (derived, not copied)."""
    extra = inspect.Parameter(
        "min_gain_fraction", inspect.Parameter.KEYWORD_ONLY, default=core.DEFAULT_MIN_GAIN_FRACTION, annotation=float
    )
    return signature.replace(parameters=[*signature.parameters.values(), extra])


MinimumGainAnchoredCompactionStrategy.__init__.__signature__ = _with_min_gain(  # type: ignore[attr-defined]
    inspect.signature(AnchoredCompactionStrategy.__init__)
)
