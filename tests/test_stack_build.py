"""``CompactionStack.build``: one call makes a conversation's whole compaction, its parts views of one conversation.

The one-call wiring must be the README's parts wired by hand, request for request, through
real framework classes (the harness agent, its function loop, the scripted provider's
layers), and every part must read and write the one state value.
"""

from __future__ import annotations

from typing import Any

import pytest
from agent_framework import Agent, create_harness_agent

from maf_compaction import (
    CompactionStack,
    RecallGate,
    State,
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
    ToolResultRecallMiddleware,
    UserTurnAnchoredSummarizationCompactionStrategy,
    make_recall_tool,
)
from maf_compaction.core.records import RECALL_TOOL_NAME
from test_sessions import TOKENIZER, Model, Summarizer, converse, lookup, texts

BUDGET = 500


def by_hand(summarizer: Any) -> tuple[Any, Any, Any]:
    """The README's "Both halves" wiring, part by part: (strategy, recall tool, middleware)."""
    records = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=BUDGET, tokenizer=TOKENIZER)
    users = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=BUDGET, tokenizer=TOKENIZER, client=summarizer, summary_mode="boundary", remembered_requests=2
    )
    strategy = ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
        tokenizer=TOKENIZER, tool_results=records, user_turns=users, summary_request="cached_prefix"
    )
    gate = RecallGate()
    recall = ToolResultRecallMiddleware(
        max_input_tokens=BUDGET,
        tokenizer=TOKENIZER,
        arm=gate.arm,
        disarm=gate.disarm,
        trigger_fraction=records.trigger_fraction,
        reforce=records.take_reforce,
        record_request="cached_prefix",
    )
    return strategy, make_recall_tool(gate), recall


def agent(model: Model, strategy: Any, tool: Any, recall: Any) -> Agent:
    return create_harness_agent(
        model,
        tools=[lookup, tool],
        middleware=[recall],
        before_compaction_strategy=strategy,
        after_compaction_strategy=strategy,
        tokenizer=TOKENIZER,
        disable_todo=True,
        disable_mode=True,
        disable_web_search=True,
        disable_file_memory=True,
    )


async def test_one_call_builds_the_readme_wiring_request_for_request() -> None:
    runs: list[tuple[list[str], int, State]] = []
    for built in (True, False):
        model, summarizer = Model(), Summarizer()
        if built:
            stack = CompactionStack.build(max_input_tokens=BUDGET, tokenizer=TOKENIZER, client=summarizer)
            parts = (stack.strategy, stack.tool, stack.recall)
        else:
            parts = by_hand(summarizer)
        talking = agent(model, *parts)
        await converse(talking, talking.create_session(), 6)
        runs.append((texts(model.requests), summarizer.calls, parts[0].decision_state()))
    (built_requests, built_calls, built_state), (hand_requests, hand_calls, hand_state) = runs
    assert built_requests == hand_requests
    assert (built_calls, built_state) == (hand_calls, hand_state)
    assert built_state != State(), "the conversation made decisions: the comparison is not of two empty states"


@pytest.mark.parametrize("client", [None, "summarizer"])
def test_every_part_is_a_view_of_one_conversation(client: str | None) -> None:
    stack = CompactionStack.build(max_input_tokens=BUDGET, tokenizer=TOKENIZER, client=Summarizer() if client else None)
    kind, strategy_type = (
        ("composition", ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy)
        if client
        else ("records", ToolResultAnchoredSummarizationCompactionStrategy)
    )
    assert (stack.kind, type(stack.strategy)) == (kind, strategy_type)
    conversation = stack.tool_results.conversation
    assert stack.strategy.conversation is conversation
    assert stack.recall.conversation is conversation
    assert stack.gate.conversation is conversation
    assert stack.tool is stack.tool
    assert stack.tool.name == RECALL_TOOL_NAME
    stack.gate.arm()  # the gate's permission is a field of the one value, seen by every part
    assert stack.strategy.decision_state().recall.armed
    assert stack.state().armed
    again = CompactionStack.build(max_input_tokens=BUDGET, tokenizer=TOKENIZER, client=Summarizer() if client else None)
    assert again.from_dict(stack.to_dict()).state() == stack.state()


def test_the_recall_tool_spends_the_stacks_gate_once_per_arming() -> None:
    stack = CompactionStack.build(max_input_tokens=BUDGET, tokenizer=TOKENIZER)
    assert not stack.gate.armed
    stack.gate.arm()
    assert stack.gate.take()
    assert not stack.gate.take()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_input_tokens": 0}, "max_input_tokens"),
        ({"trigger_fraction": 1.5}, "trigger_fraction"),
        ({"record_request": "sometimes"}, "record_request"),
        ({"client": "summarizer", "remembered_requests": 1}, "remembered_requests"),
        ({"client": "summarizer", "summary_request": "never"}, "summary_request"),
    ],
)
def test_a_bad_parameter_is_named(options: dict[str, Any], named: str) -> None:
    given = {"max_input_tokens": BUDGET, "tokenizer": TOKENIZER, **options}
    if given.get("client") == "summarizer":
        given["client"] = Summarizer()
    with pytest.raises(ValueError, match=named):
        CompactionStack.build(**given)
