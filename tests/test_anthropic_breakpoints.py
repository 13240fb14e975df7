"""``cache_breakpoints``: our marks on the requests agent-framework-anthropic's client sends (issue 35, item 2).

The real ``AnthropicClient`` through real agents against the Anthropic loopback, which refuses what Anthropic would
(more than four marks, a mark on a thinking block) and prices each request from the marks it carries. The core
decides where (``tests/test_breakpoints.py``); these tests hold the shell to applying it: on the blocks of the
messages the pass named, within four, never on a request no pass preceded, and to what it buys on the bill.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agent_framework import Agent, Message

from maf_compaction import CompactionStack, cache_breakpoints
from maf_compaction.adapters import breakpoints
from maf_compaction.bench import runner
from maf_compaction.bench.anthropic_wire import AnthropicLoopback, agent_options, close_client, make_client
from maf_compaction.bench.client import scenario_tools
from maf_compaction.bench.model import ScriptedModel
from maf_compaction.bench.runner import Cell, Settings, run_cell
from maf_compaction.core import AnchoredConfig, history, message, text_part
from maf_compaction.core.breakpoints import MAX_BREAKPOINTS
from maf_compaction.testing import estimate_tokens
from offline_tokenizers import offline_tiktoken
from test_anthropic_loopback import new_provider, scenario


def marked(body: dict[str, Any]) -> list[int]:
    """Indices of the message blocks that carry a mark, counted over the request's blocks in order."""
    blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    return [n for n, block in enumerate(blocks) if "cache_control" in block]


def test_a_client_that_is_not_anthropics_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"agent-framework-anthropic client.*got object"):
        cache_breakpoints(object())


async def test_wrapping_twice_wraps_once() -> None:
    client = make_client("http://127.0.0.1:9")
    try:
        create = cache_breakpoints(client).anthropic_client.beta.messages.create
        assert cache_breakpoints(client).anthropic_client.beta.messages.create is create
    finally:
        await close_client(client)


def _published(n: int) -> breakpoints._Published:  # pyright: ignore[reportPrivateUsage]
    """A pass's outcome of ``n`` user/assistant turns under the anchored strategy's default head (three groups)."""
    records, messages = [], []
    for k in range(n):
        role = "user" if k % 2 == 0 else "assistant"
        words = f"turn {k} " * 40
        records.append(message(role, [text_part(words, estimate_tokens)]))
        messages.append(Message(role, [words]))
    return breakpoints._Published(tuple(messages), history(records), AnchoredConfig(max_input_tokens=10_000))  # pyright: ignore[reportPrivateUsage]


def _body(published: breakpoints._Published, **fields: Any) -> dict[str, Any]:  # pyright: ignore[reportPrivateUsage]
    wire = [{"role": m.role, "content": [{"type": "text", "text": m.text}]} for m in published.messages]
    return {"messages": wire, **fields}


def test_marks_the_request_already_carries_count_first_and_the_lowest_priority_goes() -> None:
    published = _published(6)
    # No mark of the user's: the last message, then the head's end (the anchored band starts right after it).
    assert marked({"messages": breakpoints.mark(_body(published), published)}) == [2, 5]
    # The automatic mark covers the last message; with a marked system block and a marked tool, one slot is left.
    system = [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}]
    tools = [{"name": "t", "cache_control": {"type": "ephemeral"}}]
    crowded = _body(published, cache_control={"type": "ephemeral"}, system=system, tools=tools)
    assert marked({"messages": breakpoints.mark(crowded, published)}) == [2]
    full = _body(published, cache_control={"type": "ephemeral"}, system=system * 2, tools=tools)
    assert marked({"messages": breakpoints.mark(full, published)}) == []
    # The request's own dicts are left as they were: the marked messages are new.
    body = _body(published)
    breakpoints.mark(body, published)
    assert marked(body) == []


def test_a_mark_whose_message_is_not_in_the_request_is_skipped() -> None:
    published = _published(6)
    body = _body(published)
    del body["messages"][2]  # the head's last message is not sent (a host dropped it)
    assert marked({"messages": breakpoints.mark(body, published)}) == [4]


async def _conversation(*, wrapped: bool, budget: int) -> AnthropicLoopback:
    played = scenario()
    async with AnthropicLoopback(ScriptedModel(played), new_provider(), id_seed=7, min_tokens=256) as server:
        client = make_client(server.base_url())
        if wrapped:
            cache_breakpoints(client)
        tokenizer = offline_tiktoken()
        stack = CompactionStack.build(max_input_tokens=budget, tokenizer=tokenizer, client=client)
        agent = Agent(
            client=client,
            instructions=played.system,
            tools=[*scenario_tools(played), stack.tool],
            middleware=[stack.recall],
            compaction_strategy=stack.strategy,
            default_options={**agent_options(cache="auto"), "max_tokens": 2_048},  # type: ignore[arg-type]
        )
        session = agent.create_session()
        try:
            for turn in played.turns:
                await agent.run(turn.user, session=session)
        finally:
            await close_client(client)
    return server


async def test_the_stacks_requests_carry_the_cores_marks_and_stay_valid() -> None:
    server = await _conversation(wrapped=True, budget=6_000)
    assert server.rejected == []
    counts = [len(marked(body)) for body in server.requests]
    assert all(n + 1 <= MAX_BREAKPOINTS for n in counts)
    # The agent's requests carry the automatic mark, and ours add the head's end and the settled run's end; the
    # summarizer's (the stack's client, without the agent's options) follow no pass of theirs and carry none.
    agents = [body for body in server.requests if "tools" in body]
    summarizer = [body for body in server.requests if "tools" not in body]
    assert all(body.get("cache_control") == {"type": "ephemeral"} for body in agents)
    assert max(len(marked(body)) for body in agents) == 2
    assert summarizer
    assert all(marked(body) == [] for body in summarizer)
    # After a break that keeps the prefix up to a mark, the request reads that prefix: some break reads.
    broke = [o for o, layout in zip(server.outcomes, server.layouts, strict=True) if layout.breakpoints]
    assert any(o.result.cached_tokens > 0 for o in broke)


async def test_the_same_conversation_without_the_marks_reads_less() -> None:
    ours, automatic = await asyncio.gather(
        _conversation(wrapped=True, budget=6_000), _conversation(wrapped=False, budget=6_000)
    )
    assert ours.rejected == automatic.rejected == []
    assert all(len(marked(body)) == 0 for body in automatic.requests)
    read = [sum(o.result.cached_tokens for o in server.outcomes) for server in (ours, automatic)]
    written = [sum(o.result.written_tokens for o in server.outcomes) for server in (ours, automatic)]
    assert read[0] > read[1]
    assert written[0] < written[1]


async def test_a_request_no_pass_preceded_goes_out_as_the_client_built_it() -> None:
    played = scenario()
    async with AnthropicLoopback(ScriptedModel(played), new_provider(), id_seed=7) as server:
        client = cache_breakpoints(make_client(server.base_url()))
        agent = Agent(client=client, instructions=played.system, tools=scenario_tools(played))
        try:
            await agent.run(played.turns[0].user)
        finally:
            await close_client(client)
    assert server.requests
    assert all(marked(body) == [] for body in server.requests)


@pytest.mark.parametrize("thinking", [False, True], ids=["no-thinking", "thinking"])
async def test_the_composition_costs_less_with_the_marks_and_every_request_is_valid(
    monkeypatch: pytest.MonkeyPatch, thinking: bool
) -> None:
    """The bench's composition row at three times the window: the marks re-read what each break keeps."""
    monkeypatch.setattr(runner, "_tokenizer", offline_tiktoken)
    settings = Settings(client="anthropic", cache="anthropic", profile="anthropic-5m", thinking=thinking)
    cell = Cell("tool_and_user_summary_anchored", 3.0, 1)
    ours = await run_cell(cell, Settings(**{**_fields(settings), "anthropic_cache": "ours"}))
    automatic = await run_cell(cell, settings)
    assert ours.rejected == automatic.rejected == 0
    assert ours.facts_kept == automatic.facts_kept == ours.facts_total
    assert ours.cost < automatic.cost
    assert ours.cached_tokens > automatic.cached_tokens


def _fields(settings: Settings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in Settings.__dataclass_fields__}


def test_our_marks_take_the_automatic_marks_ttl_so_a_longer_one_never_follows_a_shorter_one() -> None:
    """Anthropic refuses a 1-hour mark after a 5-minute one: with a 1-hour automatic mark, ours are 1-hour too."""
    published = _published(6)
    hour = {"type": "ephemeral", "ttl": "1h"}
    marked_messages = breakpoints.mark(_body(published, cache_control=hour), published)
    controls = [b["cache_control"] for m in marked_messages for b in m["content"] if "cache_control" in b]
    assert controls == [hour]
