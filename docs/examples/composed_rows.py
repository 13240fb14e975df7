"""Benchmark rows: the composition wired as the README wires it (records + user turns + the chain).

    maf-compaction bench --rows none,context_window,tool_summary_anchored,composed,composed_recompact \\
        --strategy composed=docs.examples.composed_rows:boundary \\
        --strategy composed_recompact=docs.examples.composed_rows:recompact

(run from the repository root, so ``docs.examples`` imports; or copy this file into your own package).
"""

from __future__ import annotations

from maf_compaction import (
    RecallGate,
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
    ToolResultRecallMiddleware,
    UserTurnAnchoredSummarizationCompactionStrategy,
    make_recall_tool,
)
from maf_compaction.bench.rows import RowContext, RowSetup


def composed_row(context: RowContext, *, summary_mode: str, overflow_policy: str = "shed") -> RowSetup:
    """The record half, the user half, the composition, the gate, the recall tool and its middleware."""
    records = ToolResultAnchoredSummarizationCompactionStrategy(
        max_input_tokens=context.budget, tokenizer=context.tokenizer
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
    )
    gate = RecallGate()
    recall = ToolResultRecallMiddleware(
        max_input_tokens=context.budget,
        tokenizer=context.tokenizer,
        arm=gate.arm,
        disarm=gate.disarm,
        trigger_fraction=records.trigger_fraction,
        record_max_tokens=4_000,
        min_groups_before_repeat=2,  # as the tool_summary_anchored row: lookups are a sixth of the budget
        reforce=records.take_reforce,
    )

    def counters() -> dict[str, float]:
        return {
            "records": records.records_in_conversation,
            "groups_covered": records.groups_covered,
            "summaries": users.user_compactions,
            "user_passes_waited": strategy.user_passes_waited,
            "shed_events": strategy.shed_events,
            "fallbacks_after_record": strategy.fallbacks_after_record,
            "budget_failures": strategy.budget_failures,
            "summarizer_calls": users.summarizer_calls,
        }

    return RowSetup(
        before=strategy,
        after=strategy,
        middleware=[recall],
        tools=[make_recall_tool(gate, target_tokens=2_000)],
        counters=counters,
    )


def boundary(context: RowContext) -> RowSetup:
    """The README's wiring: the user half in the boundary mode."""
    return composed_row(context, summary_mode="boundary")


def recompact(context: RowContext) -> RowSetup:
    """The user half in the recompacting mode."""
    return composed_row(context, summary_mode="recompact")
