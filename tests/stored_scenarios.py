"""Conversations the stored-state fixtures were made from and are continued with (see fixtures/stored/)."""

from __future__ import annotations

import json
from typing import Any

from agent_framework import AgentSession, CharacterEstimatorTokenizer, Content, Message

from maf_compaction import (
    AnchoredCompactionStrategy,
    CompactionStack,
    SessionCompactionRegistry,
    UserTurnAnchoredSummarizationCompactionStrategy,
)
from maf_compaction.core.state import BOUNDED_KINDS, CHAIN_KINDS

TOKENIZER = CharacterEstimatorTokenizer()


def conversation(turns: int) -> list[Message]:
    """A deterministic tool-using conversation: each turn a question, a lookup call, its result and a reply."""
    messages = [Message("system", ["Be terse."], message_id="sys")]
    for n in range(turns):
        messages += [
            Message("user", [f"question {n}: " + "about the deployment " * 8], message_id=f"u{n}"),
            Message(
                "assistant",
                [Content.from_function_call(f"call{n}", "lookup", arguments={"q": f"item {n}"})],
                message_id=f"a{n}",
            ),
            Message(
                "tool",
                [Content.from_function_result(f"call{n}", result=f"item {n}: code=XR-{n} " + "pad " * 60)],
                message_id=f"t{n}",
            ),
            Message("assistant", [f"answer {n}: " + "the deployment is fine " * 4], message_id=f"r{n}"),
        ]
    return messages


def shown(messages: list[Message]) -> list[Any]:
    """Messages as comparable values: role, id and every content's dict (less the framework's random ids)."""
    return [
        [m.role, m.message_id, [{k: v for k, v in c.to_dict().items() if k != "id"} for c in m.contents]]
        for m in messages
    ]


def anchored_strategy() -> AnchoredCompactionStrategy:
    return AnchoredCompactionStrategy(
        max_input_tokens=1_200, tokenizer=TOKENIZER, keep_head_groups=2, keep_tail_groups=3
    )


def user_strategy(summarizer: Any) -> UserTurnAnchoredSummarizationCompactionStrategy:
    return UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=1_500, tokenizer=TOKENIZER, client=summarizer, summary_mode="boundary"
    )


async def anchored_continuation(stored: dict[str, Any]) -> dict[str, Any]:
    """Restore ``stored`` and compact the conversation grown by three turns: the messages and the decisions."""
    strategy = anchored_strategy()
    strategy.restore_decisions(stored)
    messages = conversation(15)
    await strategy(messages)
    return {"messages": shown(messages), "decisions": strategy.decision_state().to_dict()}


async def user_continuation(stored: dict[str, Any]) -> dict[str, Any]:
    """The same for the user-turn strategy, with the scripted summarizer (its calls counted)."""
    import test_sessions as ts

    summarizer = ts.Summarizer()
    strategy = user_strategy(summarizer)
    strategy.restore_decisions(stored)
    messages = conversation(15)
    await strategy(messages)
    return {"messages": shown(messages), "summarizer_calls": summarizer.calls}


def stack_continuation(kind: str, budget: int, stored: dict[str, Any]) -> dict[str, Any]:
    """A fresh stack restored from ``stored``: the gate's permission and the decisions seen through public values."""
    import test_sessions as ts

    stack: CompactionStack = (
        ts.records_stack(budget) if kind == "records" else ts.composition_stack(ts.Summarizer(), budget)
    )
    stack.from_dict(stored)
    state = stack.strategy.decision_state()
    found: dict[str, Any] = {"armed": stack.gate.armed, "records": state.records.to_dict()}
    if kind != "records":
        found["users"] = [[a.identity, a.text] for a in state.answers if a.kind in BOUNDED_KINDS]
        found["chain"] = [[a.identity, a.text] for a in state.answers if a.kind in CHAIN_KINDS]
        found["compactions"] = [state.compactions, state.folds]
    return found


def builder(kind: str, budget: int, summarizer: Any) -> Any:
    import test_sessions as ts

    if kind == "records":
        return lambda: ts.records_stack(budget)
    return lambda: ts.composition_stack(summarizer, budget)


async def continue_session(kind: str, budget: int, stored: dict[str, Any]) -> dict[str, Any]:
    """Two more turns on the restored session: the prompts the model received, and the summarizer's calls."""
    import test_sessions as ts

    summarizer = ts.Summarizer()
    build = builder(kind, budget, summarizer)
    model = ts.Model()
    agent = ts.shared_agent(SessionCompactionRegistry(build), model)
    session = AgentSession.from_dict(json.loads(json.dumps(stored)))
    full = await ts.converse_until_full(agent, session, 2)
    return {"requests": ts.texts(model.requests), "summarizer_calls": summarizer.calls, "full": full}
