"""The rows of the benchmark: which strategy each one runs, wired as a user would wire it.

A row is a factory: given a :class:`RowContext` it returns a :class:`RowSetup` (or a
``CompactionStrategy`` for both phases); ``--strategy NAME=module:factory`` adds one
(``docs/bench.md``, "Rows").
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from agent_framework import (
    CompactionStrategy,
    ContextWindowCompactionStrategy,
    SlidingWindowStrategy,
    SummarizationStrategy,
    TokenBudgetComposedStrategy,
    ToolResultCompactionStrategy,
    TruncationStrategy,
)

from ..adapters.anchored import AnchoredCompactionStrategy, MinimumGainAnchoredCompactionStrategy
from ..adapters.recall import RecallGate, ToolResultRecallMiddleware, make_recall_tool
from ..adapters.records import ToolResultAnchoredSummarizationCompactionStrategy
from ..adapters.tiktoken import TiktokenTokenizer
from ..adapters.user_summaries import UserTurnAnchoredSummarizationCompactionStrategy


@dataclass(frozen=True, slots=True)
class RowContext:
    """What a row factory may use.

    Attributes:
        budget: The input budget: ``window - output_tokens``.
        window: The context window.
        output_tokens: The output reservation (the harness's ``max_output_tokens``).
        tokenizer: The tokenizer strategies count with (o200k_base).
        summarizer: A chat client for summarizer calls; its calls are billed and counted
            as the row's summarizer calls.
    """

    budget: int
    window: int
    output_tokens: int
    tokenizer: TiktokenTokenizer
    summarizer: Any


@dataclass(slots=True)
class RowSetup:
    """A row's parts.

    Attributes:
        before: The per-model-call strategy (``before_compaction_strategy``), or ``None``.
        after: The after-run strategy (``after_compaction_strategy``), or ``None``.
        middleware: Agent or chat middleware the strategy needs.
        tools: Extra tools the strategy gives the model.
        disable_compaction: Turn the harness's compaction off (the control).
        counters: Reads the strategy's own counters after the run (records, forced
            calls...); they go to the row's figures as they are.
    """

    before: CompactionStrategy | None = None
    after: CompactionStrategy | None = None
    middleware: list[Any] = field(default_factory=list[Any])
    tools: list[Any] = field(default_factory=list[Any])
    disable_compaction: bool = False
    counters: Callable[[], Mapping[str, float]] | None = None


RowFactory = Callable[[RowContext], "RowSetup | CompactionStrategy"]


def _both(strategy: CompactionStrategy) -> RowSetup:
    return RowSetup(before=strategy, after=strategy)


def _none(context: RowContext) -> RowSetup:
    return RowSetup(disable_compaction=True)


def _context_window(context: RowContext) -> RowSetup:
    # Exactly what create_harness_agent builds when given the window and the output size.
    return _both(
        ContextWindowCompactionStrategy(
            max_context_window_tokens=context.window,
            max_output_tokens=context.output_tokens,
            tokenizer=context.tokenizer,
        )
    )


def _truncation(context: RowContext) -> RowSetup:
    return _both(
        TruncationStrategy(
            max_n=int(context.budget * 0.8), compact_to=int(context.budget * 0.5), tokenizer=context.tokenizer
        )
    )


def _sliding_window(context: RowContext) -> RowSetup:
    return _both(SlidingWindowStrategy(keep_last_groups=6))


def _tool_result(context: RowContext) -> RowSetup:
    return _both(ToolResultCompactionStrategy(keep_last_tool_call_groups=1))


def _summarization(context: RowContext) -> RowSetup:
    return _both(
        SummarizationStrategy(
            client=context.summarizer, max_summary_input_tokens=context.budget, tokenizer=context.tokenizer
        )
    )


def _token_budget(context: RowContext) -> RowSetup:
    return _both(
        TokenBudgetComposedStrategy(
            token_budget=context.budget,
            tokenizer=context.tokenizer,
            strategies=[ToolResultCompactionStrategy(keep_last_tool_call_groups=4)],
        )
    )


def _anchored(context: RowContext) -> RowSetup:
    return _both(AnchoredCompactionStrategy(max_input_tokens=context.budget, tokenizer=context.tokenizer))


def _anchored_min_gain(context: RowContext) -> RowSetup:
    return _both(MinimumGainAnchoredCompactionStrategy(max_input_tokens=context.budget, tokenizer=context.tokenizer))


def record_row(context: RowContext, *, min_groups_before_repeat: int = 2, **strategy_options: Any) -> RowSetup:
    """The record strategy wired as the README wires it: strategy, gate, recall tool, middleware.

    ``min_groups_before_repeat`` is 2 rather than the README's 4 because the generated
    lookups are each about a sixth of the budget: four of them do not fit between the
    trigger and the budget. ``strategy_options`` go to the strategy (for example
    ``coverage_share=1.0``), so a variant is one ``--strategy NAME=module:factory`` away.
    """
    strategy = ToolResultAnchoredSummarizationCompactionStrategy(
        max_input_tokens=context.budget, tokenizer=context.tokenizer, **strategy_options
    )
    gate = RecallGate()
    recall = ToolResultRecallMiddleware(
        max_input_tokens=context.budget,
        tokenizer=context.tokenizer,
        arm=gate.arm,
        disarm=gate.disarm,
        trigger_fraction=strategy.trigger_fraction,
        record_max_tokens=4_000,
        min_groups_before_repeat=min_groups_before_repeat,
        reforce=strategy.take_reforce,
    )

    def counters() -> dict[str, float]:
        return {
            "records": strategy.records_in_conversation,
            "groups_covered": strategy.groups_covered,
            "groups_held": strategy.groups_kept_uncovered,
            "groups_settled": strategy.groups_preserved_uncovered,
            "rows_released": strategy.rows_released,
            "fallbacks": strategy.fallbacks_used,
            "fallbacks_after_record": strategy.fallbacks_after_record,
            "overflows": strategy.overflows,
            "forced_calls": recall.forced_calls,
            "reforced_calls": recall.reforced_calls,
            "ignored_forced_calls": recall.ignored_forced_calls,
            "failed_forced_calls": recall.failed_forced_calls,
            "records_truncated": recall.records_truncated,
            "pin_disabled": int(recall.pin_disabled),
        }

    return RowSetup(
        before=strategy,
        after=strategy,
        middleware=[recall],
        tools=[make_recall_tool(gate, target_tokens=2_000)],
        counters=counters,
    )


def _tool_summary_anchored(context: RowContext) -> RowSetup:
    return record_row(context)


def user_summary_row(context: RowContext, **strategy_options: Any) -> RowSetup:
    """The user-turn strategy with the row's summarizer client; ``strategy_options`` go to it."""
    strategy = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=context.budget, tokenizer=context.tokenizer, client=context.summarizer, **strategy_options
    )

    def counters() -> dict[str, float]:
        return {
            "summaries": strategy.user_compactions,
            "folds": strategy.user_folds,
            "replayed": strategy.user_summaries_replayed,
            "standing": strategy.user_summaries_in_conversation,
            "failures": strategy.user_summary_failures,
            "declined": strategy.user_passes_declined,
            "summarizer_calls": strategy.summarizer_calls,
        }

    return RowSetup(before=strategy, after=strategy, counters=counters)


def _user_summary_anchored(context: RowContext) -> RowSetup:
    return user_summary_row(context)


def _user_summary_anchored_boundary(context: RowContext) -> RowSetup:
    return user_summary_row(context, summary_mode="boundary")


def _user_summary_anchored_fold(context: RowContext) -> RowSetup:
    return user_summary_row(context, summary_mode="fold")


#: Built-in rows, in table order; what each one runs is in :data:`ROW_DESCRIPTIONS`.
ROWS: Final[Mapping[str, RowFactory]] = {
    "none": _none,
    "context_window": _context_window,
    "truncation": _truncation,
    "sliding_window": _sliding_window,
    "tool_result": _tool_result,
    "summarization": _summarization,
    "token_budget": _token_budget,
    "anchored": _anchored,
    "anchored_min_gain": _anchored_min_gain,
    "tool_summary_anchored": _tool_summary_anchored,
    "user_summary_anchored": _user_summary_anchored,
    "user_summary_anchored_boundary": _user_summary_anchored_boundary,
    "user_summary_anchored_fold": _user_summary_anchored_fold,
}

ROW_DESCRIPTIONS: Final[Mapping[str, str]] = {
    "none": "no compaction (the control)",
    "context_window": "ContextWindowCompactionStrategy(window, output): the harness default",
    "truncation": "TruncationStrategy(max_n=0.8 budget, compact_to=0.5 budget)",
    "sliding_window": "SlidingWindowStrategy(keep_last_groups=6)",
    "tool_result": "ToolResultCompactionStrategy(keep_last_tool_call_groups=1)",
    "summarization": "SummarizationStrategy(client, max_summary_input_tokens=budget): framework defaults otherwise",
    "token_budget": "TokenBudgetComposedStrategy(budget, [ToolResultCompactionStrategy(keep 4)]) + its fallbacks",
    "anchored": "AnchoredCompactionStrategy(budget): defaults",
    "anchored_min_gain": "MinimumGainAnchoredCompactionStrategy(budget): defaults",
    "tool_summary_anchored": "ToolResultAnchoredSummarizationCompactionStrategy(budget) + RecallGate, "
    "make_recall_tool, ToolResultRecallMiddleware(min_groups_before_repeat=2): the README's wiring",
    "user_summary_anchored": "UserTurnAnchoredSummarizationCompactionStrategy(budget, summarizer): recompact mode",
    "user_summary_anchored_boundary": "UserTurnAnchoredSummarizationCompactionStrategy(..., summary_mode='boundary')",
    "user_summary_anchored_fold": "UserTurnAnchoredSummarizationCompactionStrategy(..., summary_mode='fold')",
}


def parse_strategy_option(text: str) -> tuple[str, str]:
    """``NAME=module:factory`` -> ``(NAME, "module:factory")``, with a clear error."""
    name, sep, target = text.partition("=")
    module, colon, attribute = target.partition(":")
    if not sep or not colon or not name.strip() or not module or not attribute:
        raise ValueError(f"--strategy expects NAME=module:factory, got {text!r}")
    return name.strip(), target


def parse_strategy_options(texts: Sequence[str]) -> dict[str, str]:
    """Every ``--strategy NAME=module:factory``, by name; a built-in row's name or a repeated name is refused."""
    extra: dict[str, str] = {}
    for text in texts:
        name, target = parse_strategy_option(text)
        if name in ROWS:
            raise ValueError(
                f"--strategy {text}: {name!r} is a built-in row; give your row another name (it would replace it)"
            )
        if name in extra:
            raise ValueError(f"--strategy {text}: the row {name!r} is already given as {extra[name]!r}")
        extra[name] = target
    return extra


def load_factory(target: str) -> RowFactory:
    """Import ``module:factory`` (a callable taking a :class:`RowContext`).

    The current directory is searched as ``python -m`` would search it: the
    ``maf-compaction`` console script does not put it on ``sys.path`` itself, and a
    row module next to the user's workload is the common case.
    """
    module_name, _, attribute = target.partition(":")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"--strategy: cannot import module {module_name!r}: {error}") from None
    except Exception as error:  # the module itself fails on import
        raise ValueError(
            f"--strategy: importing module {module_name!r} failed: {type(error).__name__}: {error}"
        ) from None
    factory: object = module
    for part in attribute.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise ValueError(f"--strategy: {module_name!r} has no attribute {attribute!r}")
    if not callable(factory):
        raise ValueError(f"--strategy: {target!r} is not callable")
    return factory  # pyright: ignore[reportReturnType]


def resolve_rows(names: Sequence[str], extra: Mapping[str, str]) -> dict[str, RowFactory]:
    """The factories of ``names`` (built-in or from ``extra``), in order, with clear errors."""
    rows: dict[str, RowFactory] = {}
    for name in names:
        if name in extra:
            rows[name] = load_factory(extra[name])
        elif name in ROWS:
            rows[name] = ROWS[name]
        else:
            known = ", ".join([*ROWS, *extra])
            raise ValueError(f"--rows: unknown row {name!r}; known rows: {known}")
    return rows


class RowFactoryError(RuntimeError):
    """A row's factory raised, or returned something that is not a strategy; the message names the row."""


def setup_of(factory: RowFactory, context: RowContext, *, row: str = "?") -> RowSetup:
    """Call a row factory and normalize its answer to a :class:`RowSetup`.

    Raises:
        RowFactoryError: The factory raised or returned neither a ``CompactionStrategy``
            nor a :class:`RowSetup`; the one-line message names ``row``.
    """
    try:
        made = factory(context)
    except Exception as error:
        raise RowFactoryError(f"row {row!r}: its factory raised {type(error).__name__}: {error}") from None
    if isinstance(made, RowSetup):
        return made
    if callable(made):
        return _both(made)
    raise RowFactoryError(
        f"row {row!r}: a row factory must return a CompactionStrategy or a RowSetup, got {type(made).__name__}"
    )
