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
from ..adapters.composition import ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy
from ..adapters.recall import RecallGate, RecordRequest, ToolResultRecallMiddleware, make_recall_tool
from ..adapters.records import ToolResultAnchoredSummarizationCompactionStrategy
from ..adapters.tiktoken import TiktokenTokenizer
from ..adapters.user_summaries import UserTurnAnchoredSummarizationCompactionStrategy
from ..core.records import PAYOFF_SHARE


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


#: The README's wirings' ``repeat_fraction`` for records asked over the cached prefix: a later record is due at
#: once when the new tool groups send this share of the budget, however few they are (measured:
#: docs/records.md, "When a later record is due"). Pinned rows leave it off: where ``tool_choice`` keys the cache a
#: pinned record re-reads the whole prompt uncached, and more of them cost more than the re-reads they spare.
REPEAT_FRACTION: Final = 0.3


def _recall_wiring(
    context: RowContext,
    records: ToolResultAnchoredSummarizationCompactionStrategy,
    *,
    min_groups_before_repeat: int,
    record_request: RecordRequest = "pinned",
) -> tuple[ToolResultRecallMiddleware, Any]:
    """The README's recall wiring for a record half: a gate, its middleware and the recall tool."""
    gate = RecallGate()
    recall = ToolResultRecallMiddleware(
        max_input_tokens=context.budget,
        tokenizer=context.tokenizer,
        arm=gate.arm,
        disarm=gate.disarm,
        trigger_fraction=records.trigger_fraction,
        record_payoff_share=records.record_payoff_share,
        record_max_tokens=4_000,
        min_groups_before_repeat=min_groups_before_repeat,
        repeat_fraction=REPEAT_FRACTION if record_request == "cached_prefix" else None,
        reforce=records.take_reforce,
        record_request=record_request,
    )
    return recall, make_recall_tool(gate, target_tokens=2_000)


def record_row(
    context: RowContext,
    *,
    min_groups_before_repeat: int = 2,
    record_request: RecordRequest = "cached_prefix",
    **strategy_options: Any,
) -> RowSetup:
    """The record strategy wired as the README wires it: strategy, gate, recall tool, middleware.

    ``min_groups_before_repeat`` is 2 rather than the README's 4 because the generated
    lookups are each about a sixth of the budget: four of them do not fit between the
    trigger and the budget. ``strategy_options`` go to the strategy (for example
    ``coverage_share=1.0``), so a variant is one ``--strategy NAME=module:factory`` away.
    """
    strategy = ToolResultAnchoredSummarizationCompactionStrategy(
        max_input_tokens=context.budget, tokenizer=context.tokenizer, **strategy_options
    )
    recall, recall_tool = _recall_wiring(
        context, strategy, min_groups_before_repeat=min_groups_before_repeat, record_request=record_request
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
            "prefix_requests": strategy.prefix_requests,
            "failed_prefix_requests": strategy.failed_prefix_requests,
        }

    return RowSetup(before=strategy, after=strategy, middleware=[recall], tools=[recall_tool], counters=counters)


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


def composed_row(
    context: RowContext,
    *,
    summary_mode: str = "boundary",
    overflow_policy: str = "shed",
    record_request: RecordRequest = "cached_prefix",
    summary_request: str = "cached_prefix",
    record_payoff_share: float | None = PAYOFF_SHARE,
) -> RowSetup:
    """The composition wired as the README wires it: both halves, the gate, the recall tool and its middleware.

    ``min_groups_before_repeat`` is 2 for the reason :func:`record_row` gives.
    """
    records = ToolResultAnchoredSummarizationCompactionStrategy(
        max_input_tokens=context.budget, tokenizer=context.tokenizer, record_payoff_share=record_payoff_share
    )
    users = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=context.budget,
        tokenizer=context.tokenizer,
        client=context.summarizer,
        summary_mode=summary_mode,  # type: ignore[arg-type]
        remembered_requests=2,
    )
    strategy = ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
        tokenizer=context.tokenizer,
        tool_results=records,
        user_turns=users,
        overflow_policy=overflow_policy,  # type: ignore[arg-type]
        summary_request=summary_request,  # type: ignore[arg-type]
    )
    recall, recall_tool = _recall_wiring(context, records, min_groups_before_repeat=2, record_request=record_request)

    def counters() -> dict[str, float]:
        return {
            "records": records.records_in_conversation,
            "groups_covered": records.groups_covered,
            "summaries": users.user_compactions,
            "user_passes_waited": strategy.user_passes_waited,
            "records_replaced": strategy.records_replaced,
            "replacements_refused": strategy.replacements_refused,
            "refused_answer_tokens": strategy.refused_answer_tokens,
            "replacements_skipped": strategy.replacements_skipped,
            "replacements_failed": strategy.replacements_failed,
            "shed_events": strategy.shed_events,
            "budget_failures": strategy.budget_failures,
            "summarizer_calls": users.summarizer_calls,
            "forced_calls": recall.forced_calls,
            "prefix_requests": strategy.prefix_requests,
            "failed_prefix_requests": strategy.failed_prefix_requests,
        }

    return RowSetup(before=strategy, after=strategy, middleware=[recall], tools=[recall_tool], counters=counters)


#: Built-in rows, in table order: name -> (factory, what it runs). A factory that returns a
#: strategy runs it in both phases, as a ``--strategy`` row's does.
_BUILT_IN: Final[Mapping[str, tuple[RowFactory, str]]] = {
    "none": (lambda _: RowSetup(disable_compaction=True), "no compaction (the control)"),
    "context_window": (  # exactly what create_harness_agent builds when given the window and the output size
        lambda c: ContextWindowCompactionStrategy(
            max_context_window_tokens=c.window, max_output_tokens=c.output_tokens, tokenizer=c.tokenizer
        ),
        "ContextWindowCompactionStrategy(window, output): the harness default",
    ),
    "truncation": (
        lambda c: TruncationStrategy(max_n=int(c.budget * 0.8), compact_to=int(c.budget * 0.5), tokenizer=c.tokenizer),
        "TruncationStrategy(max_n=0.8 budget, compact_to=0.5 budget)",
    ),
    "sliding_window": (
        lambda _: SlidingWindowStrategy(keep_last_groups=6),
        "SlidingWindowStrategy(keep_last_groups=6)",
    ),
    "tool_result": (
        lambda _: ToolResultCompactionStrategy(keep_last_tool_call_groups=1),
        "ToolResultCompactionStrategy(keep_last_tool_call_groups=1)",
    ),
    "summarization": (
        lambda c: SummarizationStrategy(client=c.summarizer, max_summary_input_tokens=c.budget, tokenizer=c.tokenizer),
        "SummarizationStrategy(client, max_summary_input_tokens=budget): framework defaults otherwise",
    ),
    "token_budget": (
        lambda c: TokenBudgetComposedStrategy(
            token_budget=c.budget,
            tokenizer=c.tokenizer,
            strategies=[ToolResultCompactionStrategy(keep_last_tool_call_groups=4)],
        ),
        "TokenBudgetComposedStrategy(budget, [ToolResultCompactionStrategy(keep 4)]) + its fallbacks",
    ),
    "anchored": (
        lambda c: AnchoredCompactionStrategy(max_input_tokens=c.budget, tokenizer=c.tokenizer),
        "AnchoredCompactionStrategy(budget): defaults",
    ),
    "anchored_min_gain": (
        lambda c: MinimumGainAnchoredCompactionStrategy(max_input_tokens=c.budget, tokenizer=c.tokenizer),
        "MinimumGainAnchoredCompactionStrategy(budget): defaults",
    ),
    "tool_summary_anchored": (
        record_row,
        "ToolResultAnchoredSummarizationCompactionStrategy(budget) + RecallGate, make_recall_tool, "
        "ToolResultRecallMiddleware(min_groups_before_repeat=2, repeat_fraction=0.3, record_request='cached_prefix'): "
        "the README's wiring",
    ),
    "tool_summary_anchored_pinned": (
        lambda c: record_row(c, record_request="pinned"),
        "the same with record_request='pinned': each record asked by pinning tool_choice to the recall tool",
    ),
    "user_summary_anchored": (
        user_summary_row,
        "UserTurnAnchoredSummarizationCompactionStrategy(budget, summarizer): recompact mode",
    ),
    "user_summary_anchored_boundary": (
        lambda c: user_summary_row(c, summary_mode="boundary"),
        "UserTurnAnchoredSummarizationCompactionStrategy(..., summary_mode='boundary')",
    ),
    "user_summary_anchored_fold": (
        lambda c: user_summary_row(c, summary_mode="fold"),
        "UserTurnAnchoredSummarizationCompactionStrategy(..., summary_mode='fold')",
    ),
    "tool_and_user_summary_anchored": (
        composed_row,
        "ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(records, users in boundary mode, "
        "summary_request='cached_prefix') + the recall wiring with record_request='cached_prefix': the README's "
        "composition",
    ),
    "tool_and_user_summary_anchored_ungated": (
        lambda c: composed_row(c, record_payoff_share=None),
        "the same with record_payoff_share=None: a record is asked for every tool group, whatever it costs",
    ),
    "tool_and_user_summary_anchored_pinned": (
        lambda c: composed_row(c, record_request="pinned", summary_request="summarizer"),
        "the same with records pinned and summaries sent to the summarizer client (the earlier request shapes)",
    ),
    "tool_and_user_summary_anchored_recompact": (
        lambda c: composed_row(c, summary_mode="recompact"),
        "ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(..., users in recompact mode)",
    ),
    "tool_and_user_summary_anchored_raise": (
        lambda c: composed_row(c, overflow_policy="raise", record_payoff_share=None),
        "ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(..., overflow_policy='raise'): keeps "
        "uncovered results (and asks for every record: record_payoff_share=None); a run it cannot fit stops with "
        "CompactionBudgetExceeded",
    ),
}
#: Built-in rows, in table order.
ROWS: Final[Mapping[str, RowFactory]] = {name: factory for name, (factory, _) in _BUILT_IN.items()}
#: What each built-in row runs (the ``--help`` epilog).
ROW_DESCRIPTIONS: Final[Mapping[str, str]] = {name: text for name, (_, text) in _BUILT_IN.items()}


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
