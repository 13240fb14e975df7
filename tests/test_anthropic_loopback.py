"""Claude through its own client: agent-framework-anthropic's ``AnthropicClient`` against the Anthropic loopback.

Three parts. The real client through a real ``Agent``, JSON and streaming, with and without extended
thinking: the scripted model plays the same turns as in process, every request is valid, and usage
comes back as Anthropic reports it. Each validation rule: a request that breaks it gets Anthropic's
400 shape, and the nearest valid request passes. Pricing: the breakpoints the request marks itself
(explicit and automatic) decide what is read and written, with the 20-block lookback, the minimum
length, both TTLs and their write prices.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

import aiohttp
import pytest
from agent_framework import Agent, AgentResponse
from anthropic.types.beta import BetaMessage, BetaRawMessageStreamEvent
from pydantic import TypeAdapter

from maf_compaction.bench import runner
from maf_compaction.bench.anthropic_wire import (
    RULES,
    THINKING_TEXT,
    AnthropicLoopback,
    InvalidRequest,
    agent_options,
    close_client,
    make_client,
    min_cacheable_tokens,
    validate_request,
)
from maf_compaction.bench.client import SimulatedChatClient, scenario_tools
from maf_compaction.bench.model import ScriptedModel
from maf_compaction.bench.provider import SimulatedProvider
from maf_compaction.bench.runner import AnthropicCacheMode, Cell, Settings, run_cell
from maf_compaction.bench.scenario import GeneratorOptions, Scenario, generate
from maf_compaction.bench.simulator import (
    ANTHROPIC_WRITE_1H,
    ANTHROPIC_WRITE_5M,
    Breakpoint,
    BreakpointCache,
    get_profile,
)
from offline_tokenizers import offline_tiktoken

WINDOW = 8_192
MODEL = "claude-sonnet-4-6"
_EVENTS: TypeAdapter[BetaRawMessageStreamEvent] = TypeAdapter(BetaRawMessageStreamEvent)


def scenario() -> Scenario:
    """13 turns: requirements, three lookups among filler turns, a correction, four probes."""
    return generate(GeneratorOptions(context_window=WINDOW, fill=1.5, tool_turns=3, markers_per_tool=4))


def new_provider() -> SimulatedProvider:
    return SimulatedProvider(
        encoder=offline_tiktoken(), window=WINDOW, profile=get_profile("anthropic-5m"), cache="anthropic"
    )


# ---------------------------------------------------------------------------------------------------
# The real client through a real Agent
# ---------------------------------------------------------------------------------------------------


async def play(
    scenario: Scenario, *, stream: bool, thinking: bool, cache: AnthropicCacheMode = "auto"
) -> tuple[list[AgentResponse], AnthropicLoopback]:
    provider = new_provider()
    async with AnthropicLoopback(ScriptedModel(scenario), provider, id_seed=7) as server:
        client = make_client(server.base_url())
        options: Any = {**agent_options(cache=cache, thinking=thinking), "max_tokens": 2_048}
        agent = Agent(
            client=client, instructions=scenario.system, tools=scenario_tools(scenario), default_options=options
        )
        session = agent.create_session()
        responses: list[AgentResponse] = []
        try:
            for turn in scenario.turns:
                if stream:
                    updates = agent.run(turn.user, session=session, stream=True)
                    async for _ in updates:
                        pass
                    responses.append(await updates.get_final_response())
                else:
                    responses.append(await agent.run(turn.user, session=session))
        finally:
            await close_client(client)
    return responses, server


async def play_in_process(scenario: Scenario) -> list[AgentResponse]:
    provider = new_provider()
    client = SimulatedChatClient(model=ScriptedModel(scenario), provider=provider)
    agent = Agent(client=client, instructions=scenario.system, tools=scenario_tools(scenario))
    session = agent.create_session()
    return [await agent.run(turn.user, session=session) for turn in scenario.turns]


@pytest.mark.parametrize("thinking", [False, True], ids=["no-thinking", "thinking"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_the_real_client_plays_the_scenario_through_a_real_agent(stream: bool, thinking: bool) -> None:
    played = scenario()
    wire, server = await play(played, stream=stream, thinking=thinking)
    local = await play_in_process(played)
    assert [r.text for r in wire] == [r.text for r in local]
    assert server.rejected == []
    tool_uses = [b for body in server.requests for m in body["messages"] for b in _blocks(m) if b["type"] == "tool_use"]
    assert tool_uses  # the lookups went through the client's tool loop
    last = server.requests[-1]
    assert last["cache_control"] == {"type": "ephemeral"}
    if thinking:
        assert last["thinking"] == {"type": "enabled", "budget_tokens": 1_024}
        # every assistant turn the client replays starts with the thinking block it was given, signature intact
        replayed = [m for m in last["messages"] if m["role"] == "assistant"]
        assert replayed
        assert all(_blocks(m)[0]["type"] == "thinking" for m in replayed)
        assert all(_blocks(m)[0]["thinking"] == THINKING_TEXT for m in replayed)
        assert all(server.issued(_blocks(m)[0]["signature"], THINKING_TEXT) for m in replayed)
    else:
        assert "thinking" not in last


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_usage_reaches_the_agent_as_anthropic_reports_it(stream: bool) -> None:
    wire, server = await play(scenario(), stream=stream, thinking=False)
    calls = server.provider.calls
    outcomes = server.outcomes
    assert sum(o.result.cached_tokens for o in outcomes) > 0  # automatic caching reads the history
    total = [r.usage_details or {} for r in wire]
    per_turn_read = sum(t.get("cache_read_input_token_count") or 0 for t in total)
    per_turn_written = sum(t.get("cache_creation_input_token_count") or 0 for t in total)
    per_turn_input = sum(t.get("input_token_count") or 0 for t in total)
    assert per_turn_read == sum(o.result.cached_tokens for o in outcomes)
    assert per_turn_written == sum(o.result.written_tokens for o in outcomes)
    # input_tokens counts only what follows the last breakpoint: reads and writes are reported apart
    assert per_turn_input == sum(o.result.uncached_tokens for o in outcomes)
    assert per_turn_input + per_turn_read + per_turn_written == sum(c.input_tokens for c in calls)
    assert sum(t.get("output_token_count") or 0 for t in total) == sum(c.output_tokens for c in calls)


async def test_without_cache_control_nothing_is_read_or_written() -> None:
    """What the framework's client sends by default: no mark, so the whole history is billed on every call."""
    wire, server = await play(scenario(), stream=False, thinking=False, cache="none")
    assert all("cache_control" not in body for body in server.requests)
    assert all(o.result.cached_tokens == o.result.written_tokens == 0 for o in server.outcomes)
    assert all((r.usage_details or {}).get("cache_read_input_token_count") == 0 for r in wire)


# ---------------------------------------------------------------------------------------------------
# Validation: each rule, an invalid request and its nearest valid one
# ---------------------------------------------------------------------------------------------------


def base(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2_048, "messages": [{"role": "user", "content": "Hello."}], **fields}


def tool(name: str = "lookup", **extra: Any) -> dict[str, Any]:
    return {"name": name, "description": "Look a record up.", "input_schema": {"type": "object"}, **extra}


def use(call: str = "toolu_1", *, first: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    blocks = [*first, {"type": "tool_use", "id": call, "name": "lookup", "input": {"q": 1}}]
    return {"role": "assistant", "content": blocks}


def result(call: str = "toolu_1", *, after: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": "done"}, *after]}


def text(value: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": value, **extra}


EPHEMERAL = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
THINKING = {"type": "enabled", "budget_tokens": 1_024}
ASK = {"role": "user", "content": "Look it up."}

#: (rule, invalid body, the nearest valid body)
CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("request", base(messages=[]), base()),
    ("request", base(messages=[{"role": "system", "content": "x"}]), base()),
    ("request", base(messages=[{"role": "user", "content": ""}]), base()),
    ("request", base(max_tokens=0), base()),
    (
        "tool_pairing",
        base(tools=[tool()], messages=[ASK, use()]),
        base(tools=[tool()], messages=[ASK, use(), result()]),
    ),
    (
        "tool_pairing",
        base(tools=[tool()], messages=[ASK, use(), ASK, result()]),
        base(tools=[tool()], messages=[ASK, use(), result(), ASK]),  # consecutive user turns are one turn
    ),
    (
        "tool_pairing",
        base(tools=[tool()], messages=[ASK, use(), {"role": "user", "content": [text("x"), *result()["content"]]}]),
        base(tools=[tool()], messages=[ASK, use(), result(after=[text("x")])]),
    ),
    ("tool_pairing", base(tools=[tool()], messages=[ASK, {"role": "assistant", "content": "Ok."}, result()]), base()),
    (
        "tool_pairing",
        base(tools=[tool()], messages=[ASK, use(), result(), use(), result()]),
        base(tools=[tool()], messages=[ASK, use(), result(), use("toolu_2"), result("toolu_2")]),
    ),
    ("thinking_config", base(thinking={"type": "enabled", "budget_tokens": 512}), base(thinking=THINKING)),
    ("thinking_config", base(max_tokens=1_024, thinking=THINKING), base(max_tokens=1_025, thinking=THINKING)),
    (
        "thinking_tool_choice",
        base(tools=[tool()], thinking=THINKING, tool_choice={"type": "tool", "name": "lookup"}),
        base(tools=[tool()], tool_choice={"type": "tool", "name": "lookup"}),
    ),
    (
        "thinking_tool_choice",
        base(tools=[tool()], thinking=THINKING, tool_choice={"type": "any"}),
        base(tools=[tool()], thinking=THINKING, tool_choice={"type": "auto"}),
    ),
    (
        "thinking_order",
        base(tools=[tool()], thinking=THINKING, messages=[ASK, use(first=[text("A record.")]), result()]),
        base(tools=[tool()], messages=[ASK, use(first=[text("A record.")]), result()]),
    ),
    (
        "thinking_order",
        base(
            tools=[tool()],
            thinking=THINKING,
            messages=[ASK, {"role": "assistant", "content": [text("A record.")]}, use(), result()],
        ),
        base(tools=[tool()], thinking=THINKING, messages=[ASK, {"role": "assistant", "content": "A record."}, ASK]),
    ),
    (
        "thinking_signature",
        base(
            messages=[
                ASK,
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": "bad"}]},
                ASK,
            ]
        ),
        base(messages=[ASK, {"role": "assistant", "content": "Ok."}, ASK]),
    ),
    (
        "cache_control",
        base(system=[text("Be brief.", cache_control={"type": "ephemeral", "ttl": "2h"})]),
        base(system=[text("Be brief.", cache_control=HOUR)]),
    ),
    (
        "cache_control",
        base(system=[text("Be brief.", cache_control={"type": "persistent"})]),
        base(system=[text("Be brief.", cache_control=EPHEMERAL)]),
    ),
    (
        "cache_control",
        base(system=[text("", cache_control=EPHEMERAL), text("Be brief.")]),
        base(system=[text("Be brief.", cache_control=EPHEMERAL)]),
    ),
    (
        "breakpoints",
        base(system=[text(f"Part {i}.", cache_control=EPHEMERAL) for i in range(5)]),
        base(system=[text(f"Part {i}.", cache_control=EPHEMERAL) for i in range(4)]),
    ),
    (
        "breakpoints",
        base(system=[text(f"Part {i}.", cache_control=EPHEMERAL) for i in range(4)], cache_control=EPHEMERAL),
        base(system=[text(f"Part {i}.", cache_control=EPHEMERAL) for i in range(3)], cache_control=EPHEMERAL),
    ),
    (
        "ttl_order",
        base(system=[text("One.", cache_control=EPHEMERAL), text("Two.", cache_control=HOUR)]),
        base(system=[text("One.", cache_control=HOUR), text("Two.", cache_control=EPHEMERAL)]),
    ),
    ("ttl_order", base(system=[text("One.", cache_control=EPHEMERAL)], cache_control=HOUR), base(cache_control=HOUR)),
    (
        "tool_choice",
        base(tools=[tool()], tool_choice={"type": "tool", "name": "recall"}),
        base(tools=[tool(), tool("recall")], tool_choice={"type": "tool", "name": "recall"}),
    ),
]


def _blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


async def post(server: AnthropicLoopback, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server.base_url()}/v1/messages", json=body) as response,
    ):
        return response.status, await response.json()


@pytest.fixture
async def server() -> AsyncIterator[AnthropicLoopback]:
    async with AnthropicLoopback(ScriptedModel(scenario()), new_provider(), id_seed=3) as running:
        yield running


def test_every_rule_has_a_case() -> None:
    assert {rule for rule, _, _ in CASES} == set(RULES)


@pytest.mark.parametrize(("rule", "invalid", "valid"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
async def test_a_request_that_breaks_a_rule_gets_anthropics_400_and_its_valid_neighbour_passes(
    server: AnthropicLoopback, rule: str, invalid: dict[str, Any], valid: dict[str, Any]
) -> None:
    status, body = await post(server, invalid)
    assert status == 400
    assert set(body) == {"type", "error"}
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]
    assert [r.rule for r in server.rejected] == [rule]
    with pytest.raises(InvalidRequest) as raised:
        validate_request(invalid, server.issued)
    assert raised.value.rule == rule
    status, answer = await post(server, valid)
    assert status == 200, answer
    BetaMessage.model_validate(answer)
    assert len(server.rejected) == 1


async def test_thinking_blocks_pass_back_only_as_they_were_issued(server: AnthropicLoopback) -> None:
    first = base(tools=[tool()], thinking=THINKING, messages=[ASK])
    status, answer = await post(server, first)
    assert status == 200
    thinking = answer["content"][0]
    assert thinking["type"] == "thinking"
    assert thinking["thinking"] == THINKING_TEXT
    assert thinking["signature"]
    replay = [ASK, use(first=[thinking]), result()]
    assert (await post(server, {**first, "messages": replay}))[0] == 200
    changed = copy.deepcopy(replay)
    changed[1]["content"][0]["thinking"] = "Something else."
    assert (await post(server, {**first, "messages": changed}))[0] == 400
    unsigned = copy.deepcopy(replay)
    del unsigned[1]["content"][0]["signature"]
    assert (await post(server, {**first, "messages": unsigned}))[0] == 400
    assert [r.rule for r in server.rejected] == ["thinking_signature", "thinking_signature"]


async def test_the_sdk_raises_the_400_as_a_bad_request(server: AnthropicLoopback) -> None:
    from agent_framework.exceptions import ChatClientInvalidRequestException

    client = make_client(server.base_url())
    agent = Agent(
        client=client,
        tools=scenario_tools(scenario()),
        default_options=cast(Any, {"thinking": THINKING, "max_tokens": 2_048, "tool_choice": "required"}),
    )
    try:
        with pytest.raises(ChatClientInvalidRequestException, match="Thinking may not be enabled"):
            await agent.run("Look it up.")
    finally:
        await close_client(client)
    assert [r.rule for r in server.rejected] == ["thinking_tool_choice"]


# ---------------------------------------------------------------------------------------------------
# Pricing: the request's own breakpoints
# ---------------------------------------------------------------------------------------------------


def words(count: int, seed: int = 0) -> str:
    """About ``count`` tokens of distinct words."""
    return " ".join(f"w{seed}x{i}" for i in range(count // 3))


async def answer(server: AnthropicLoopback, body: Mapping[str, Any]) -> dict[str, Any]:
    status, data = await post(server, body)
    assert status == 200, data
    return data["usage"]


def conversation(turns: int, size: int = 800) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for number in range(turns):
        messages.append({"role": "user", "content": [text(words(size, number))]})
        messages.append({"role": "assistant", "content": [text(f"Reply {number}.")]})
    messages.append({"role": "user", "content": [text("Go on.")]})
    return messages


async def test_an_explicit_system_breakpoint_is_written_once_then_read(server: AnthropicLoopback) -> None:
    system = [text(words(3_000), cache_control=EPHEMERAL)]
    first = await answer(server, base(system=system))
    marked = server.layouts[0].breakpoints[0].end
    assert marked >= 1_024
    assert first["cache_creation_input_tokens"] == marked
    assert first["cache_read_input_tokens"] == 0
    assert first["cache_creation"] == {"ephemeral_5m_input_tokens": marked, "ephemeral_1h_input_tokens": 0}
    total = len(server.layouts[0].tokens)
    assert first["input_tokens"] == total - marked  # only what follows the last breakpoint
    second = await answer(server, base(system=system, messages=conversation(1)))
    assert second["cache_read_input_tokens"] == marked
    assert second["cache_creation_input_tokens"] == 0
    assert second["input_tokens"] == len(server.layouts[1].tokens) - marked


async def test_the_automatic_breakpoint_moves_to_the_last_block_and_reads_the_previous_request(
    server: AnthropicLoopback,
) -> None:
    messages = conversation(3)
    await answer(server, base(messages=messages, cache_control=EPHEMERAL))
    first_end = len(server.layouts[0].tokens)
    assert [p.end for p in server.layouts[0].breakpoints] == [first_end]
    longer = [*messages, {"role": "assistant", "content": "Ok."}, {"role": "user", "content": "More."}]
    usage = await answer(server, base(messages=longer, cache_control=EPHEMERAL))
    assert usage["cache_read_input_tokens"] == first_end
    assert usage["cache_creation_input_tokens"] == len(server.layouts[1].tokens) - first_end
    assert usage["input_tokens"] == 0


async def test_a_prefix_more_than_20_blocks_back_is_not_found_unless_a_mark_sits_near_it(
    server: AnthropicLoopback,
) -> None:
    messages = conversation(3)
    await answer(server, base(messages=messages, cache_control=EPHEMERAL))
    first_end = len(server.layouts[0].tokens)
    grown = [*messages]
    for number in range(11):  # 22 more blocks
        grown += [{"role": "assistant", "content": f"Step {number}."}, {"role": "user", "content": f"Next {number}."}]
    usage = await answer(server, base(messages=grown, cache_control=EPHEMERAL))
    assert usage["cache_read_input_tokens"] == 0  # the earlier entry is 22 blocks back: written again
    assert usage["cache_creation_input_tokens"] == len(server.layouts[1].tokens)
    marked = copy.deepcopy(grown)
    marked[len(messages) - 1]["content"][0]["cache_control"] = EPHEMERAL  # where the first request's entry ends
    usage = await answer(server, base(messages=marked, cache_control=EPHEMERAL))
    assert usage["cache_read_input_tokens"] == len(server.layouts[1].tokens)
    assert server.layouts[2].breakpoints[0].end == first_end


async def test_below_the_minimum_length_a_mark_caches_nothing() -> None:
    async with AnthropicLoopback(ScriptedModel(scenario()), new_provider(), id_seed=3) as running:
        short = base(system=[text(words(600), cache_control=EPHEMERAL)])
        for _ in range(2):
            usage = await answer(running, short)
            assert usage["cache_creation_input_tokens"] == usage["cache_read_input_tokens"] == 0
            assert usage["input_tokens"] == len(running.layouts[0].tokens)
    assert min_cacheable_tokens("claude-haiku-4-5") == 4_096
    assert min_cacheable_tokens("claude-sonnet-4-6") == 2_048
    assert min_cacheable_tokens("claude-opus-4-1") == 1_024
    async with AnthropicLoopback(ScriptedModel(scenario()), new_provider(), id_seed=3) as running:
        body = base(model="claude-haiku-4-5", system=[text(words(3_000), cache_control=EPHEMERAL)])
        assert running.layouts == []
        usage = await answer(running, body)
        assert 1_024 <= running.layouts[0].breakpoints[0].end < 4_096
        assert usage["cache_creation_input_tokens"] == 0  # a 4,096-token minimum on that model


async def test_a_5_minute_entry_expires_an_hour_entry_does_not(server: AnthropicLoopback) -> None:
    short = [text(words(3_000), cache_control=EPHEMERAL)]
    long = [text(words(3_000, seed=9), cache_control=HOUR)]
    await answer(server, base(system=short))
    await answer(server, base(system=long))
    server.provider.pause(301)
    assert (await answer(server, base(system=short)))["cache_read_input_tokens"] == 0
    usage = await answer(server, base(system=long))
    assert usage["cache_read_input_tokens"] == server.layouts[1].breakpoints[0].end
    server.provider.pause(3_601)
    assert (await answer(server, base(system=long)))["cache_read_input_tokens"] == 0


async def test_writes_cost_1_25x_for_5_minutes_2x_for_an_hour_and_reads_0_1x(server: AnthropicLoopback) -> None:
    profile = server.provider.profile
    bodies = [
        base(system=[text(words(3_000), cache_control=HOUR), text(words(3_000, seed=1), cache_control=EPHEMERAL)]),
        base(system=[text(words(3_000), cache_control=HOUR), text(words(3_000, seed=1), cache_control=EPHEMERAL)]),
    ]
    for body in bodies:
        usage = await answer(server, body)
        record = server.provider.calls[-1]
        creation = usage["cache_creation"]
        assert (
            creation["ephemeral_5m_input_tokens"] + creation["ephemeral_1h_input_tokens"]
            == (usage["cache_creation_input_tokens"])
        )
        expected = (
            usage["input_tokens"] * profile.input
            + usage["cache_read_input_tokens"] * profile.cached_input
            + creation["ephemeral_5m_input_tokens"] * profile.input * ANTHROPIC_WRITE_5M
            + creation["ephemeral_1h_input_tokens"] * profile.input * ANTHROPIC_WRITE_1H
            + usage["output_tokens"] * profile.output
        ) / 1_000_000
        assert record.cost == pytest.approx(expected)
    first, second = server.outcomes
    hour, five = (p.end for p in server.layouts[0].breakpoints)
    assert (first.written_long, first.result.written_tokens) == (hour, five)
    assert (second.result.cached_tokens, second.result.written_tokens) == (five, 0)
    assert profile.cached_input == pytest.approx(0.1 * profile.input)


async def test_a_tool_choice_or_thinking_change_misses_the_messages_but_reads_tools_and_system(
    server: AnthropicLoopback,
) -> None:
    system = [text(words(3_000), cache_control=EPHEMERAL)]
    tools = [tool(), tool("recall")]
    messages = conversation(2)
    await answer(server, base(tools=tools, system=system, messages=messages, cache_control=EPHEMERAL))
    pinned = base(
        tools=tools,
        system=system,
        messages=messages,
        cache_control=EPHEMERAL,
        tool_choice={"type": "tool", "name": "recall"},
    )
    usage = await answer(server, pinned)
    assert usage["cache_read_input_tokens"] == server.layouts[0].breakpoints[0].end  # tools and system only
    thinking = base(tools=tools, system=system, messages=messages, cache_control=EPHEMERAL, thinking=THINKING)
    usage = await answer(server, thinking)
    assert usage["cache_read_input_tokens"] == server.layouts[0].breakpoints[0].end


def test_the_breakpoint_cache_reads_the_longest_fresh_entry_within_the_lookback() -> None:
    tokens = list(range(3_000))
    boundaries = list(range(100, 3_001, 100))  # 30 blocks of 100 tokens
    cache = BreakpointCache(min_tokens=1_024)
    first = cache.lookup_and_store(tokens, boundaries, [Breakpoint(1_500, 14)])
    assert (first.result.cached_tokens, first.result.written_tokens) == (0, 1_500)
    near = cache.lookup_and_store(tokens, boundaries, [Breakpoint(3_000, 29)])  # 15 blocks on: found
    assert near.result.cached_tokens == 1_500
    assert near.result.written_tokens == 1_500
    far = BreakpointCache(min_tokens=1_024)
    far.lookup_and_store(tokens, boundaries, [Breakpoint(1_000 + 100, 10)])
    found = far.lookup_and_store(tokens, boundaries, [Breakpoint(3_000, 29)])  # 19 blocks on: found
    assert found.result.cached_tokens == 1_100
    farther = BreakpointCache(min_tokens=1_024)
    farther.lookup_and_store(tokens, boundaries, [Breakpoint(1_100, 10)])
    beyond = farther.lookup_and_store(tokens, boundaries + [3_000] * 2, [Breakpoint(3_000, 31)])  # 21 blocks on
    assert beyond.result.cached_tokens == 0
    with pytest.raises(ValueError, match="at most 4"):
        cache.lookup_and_store(tokens, boundaries, [Breakpoint(boundaries[i], i) for i in range(5)])


# ---------------------------------------------------------------------------------------------------
# The bench
# ---------------------------------------------------------------------------------------------------

SMALL = Settings(
    context_window=WINDOW,
    max_output_tokens=2_048,
    tool_turns=3,
    markers_per_tool=4,
    client="anthropic",
    cache="anthropic",
    profile="anthropic-5m",
)


@pytest.mark.parametrize("row", ["tool_summary_anchored_pinned", "tool_and_user_summary_anchored_pinned"])
async def test_with_thinking_every_request_of_a_pinning_row_is_valid(monkeypatch: pytest.MonkeyPatch, row: str) -> None:
    """Issue 35, item 3. With extended thinking on, Anthropic refuses a forced tool_choice and a final assistant turn
    that opens with anything but its thinking. Both happened here before: the pinned record was refused, then the
    record asked over the cached prefix stood as assistant text right before the current step's thinking and tool
    call, and the row stopped at turn 5. Now no request is pinned while thinking, the record keeps the model's
    reasoning first in its turn, and every request of the row is valid, with every fact kept."""
    monkeypatch.setattr(runner, "_tokenizer", offline_tiktoken)
    settings = Settings(**{**_fields(SMALL), "thinking": True})
    result = await run_cell(Cell(row, 1.5, 1), settings)
    assert (result.rejected, dict(result.rejections), result.error) == (0, {}, None)
    assert result.facts_kept == result.facts_total > 0


async def test_a_cell_counts_the_requests_the_loopback_refused_instead_of_crashing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thinking budget that is not below ``max_tokens`` is refused on every request: the cell counts the refusals
    by rule, with the message, and reports the row as stopped instead of crashing."""
    monkeypatch.setattr(runner, "_tokenizer", offline_tiktoken)
    settings = Settings(**{**_fields(SMALL), "thinking": True, "max_output_tokens": 1_024})
    result = await run_cell(Cell("none", 1.5, 1), settings)
    assert result.rejected >= 1
    assert sum(result.rejections.values()) == result.rejected
    assert set(result.rejections) == {"thinking_config"}
    assert "greater than `thinking.budget_tokens`" in result.rejection_messages["thinking_config"]
    assert result.error is not None
    assert "400" in result.error


async def test_a_cell_without_cache_control_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_tokenizer", offline_tiktoken)
    automatic = await run_cell(Cell("none", 1.5, 1), SMALL)
    bare = await run_cell(Cell("none", 1.5, 1), Settings(**{**_fields(SMALL), "anthropic_cache": "none"}))
    assert automatic.rejected == bare.rejected == 0
    assert automatic.cached_tokens > 0
    assert bare.cached_tokens == 0
    assert bare.cost > automatic.cost


def _fields(settings: Settings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in Settings.__dataclass_fields__}


def test_stream_events_follow_anthropics_sequence() -> None:
    from maf_compaction.bench.anthropic_wire import message_events

    message = BetaMessage.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [
                {"type": "thinking", "thinking": THINKING_TEXT, "signature": "c2ln"},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": 1}},
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {
                "input_tokens": 5,
                "cache_creation_input_tokens": 7,
                "cache_read_input_tokens": 11,
                "output_tokens": 40,
            },
        }
    )
    events = list(message_events(message))
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "message_start"
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    deltas = [data["delta"]["type"] for kind, data in events if kind == "content_block_delta"]
    assert deltas[0] == "thinking_delta"
    assert "signature_delta" in deltas
    assert deltas[-1] == "input_json_delta"
    start = events[0][1]["message"]
    assert start["content"] == []
    assert start["usage"]["cache_read_input_tokens"] == 11
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == "tool_use"
    assert final["usage"]["output_tokens"] == 40
    assert json.loads(
        "".join(
            d["delta"]["partial_json"]
            for k, d in events
            if k == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
        )
    ) == {"q": 1}
    for _, data in events:
        _EVENTS.validate_python(data)


def test_thinking_goes_with_the_anthropic_client(capsys: pytest.CaptureFixture[str]) -> None:
    from maf_compaction.bench import __main__ as bench_main

    assert bench_main.main(["bench", "--thinking", "--rows", "none"]) == 2
    assert "--thinking goes with --client anthropic" in capsys.readouterr().err


def test_the_command_line_reports_the_wire_rule_and_a_rejected_column(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from maf_compaction.bench import __main__ as bench_main

    monkeypatch.setattr(runner, "_tokenizer", offline_tiktoken)
    argv = ["bench", "--client", "anthropic", "--anthropic-cache", "none", "--thinking", "--rows", "none"]
    argv += ["--context-window", "8192", "--max-output-tokens", "2048", "--tool-turns", "3", "--markers-per-tool", "4"]
    argv += ["--fill", "0.9", "--seeds", "1", "--jobs", "1", "--quiet"]
    assert bench_main.main(argv) == 0
    out = capsys.readouterr().out
    assert "the Anthropic wire (anthropic client over the loopback, no cache_control, extended thinking on)" in out
    header = next(line for line in out.splitlines() if line.strip().startswith("row "))
    assert header.split()[-1] == "rejected"
