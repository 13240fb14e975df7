"""``measure_agent_overhead``: what a configured agent sends beside the messages, checked on the wire.

Each test builds a real ``create_harness_agent`` agent around a client that records the
request of its first model call (the messages and options after every provider ran),
measures the agent, and compares the measurement with that request, counted the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from agent_framework import (
    Agent,
    BaseChatClient,
    ChatResponse,
    FunctionTool,
    Message,
    create_harness_agent,
    tool,
)
from agent_framework._middleware import ChatMiddlewareLayer
from agent_framework._tools import FunctionInvocationLayer

from maf_compaction import AgentOverhead, AnchoredCompactionStrategy, MediaTokenEstimator, measure_agent_overhead
from offline_tokenizers import offline_tiktoken


class RecordingClient(FunctionInvocationLayer, ChatMiddlewareLayer, BaseChatClient):
    """Answers "ok" and keeps every request's messages and options."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[list[Message], dict[str, Any]]] = []

    def _inner_get_response(self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **_: Any):
        async def respond() -> ChatResponse:
            self.requests.append((list(messages), dict(await self._validate_options(options))))
            return ChatResponse(messages=[Message("assistant", ["ok"])], response_id="r1")

        return respond()


@tool(approval_mode="never_require")
def lookup_deployment(service: str) -> str:
    """Look up the current deployment record of a service."""
    return f"service={service}"


def spec_tokens(tool_: object) -> int:
    spec = tool_.to_json_schema_spec() if isinstance(tool_, FunctionTool) else tool_
    return offline_tiktoken().count_tokens(json.dumps(spec, ensure_ascii=False, sort_keys=True, separators=(",", ":")))


async def first_request(agent: Agent, client: RecordingClient) -> tuple[list[Message], dict[str, Any]]:
    await agent.run("hello", session=agent.create_session())
    return client.requests[0]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the harness's file memory writes under the working directory


HARNESS_VARIANTS = {
    "harness-defaults": {},
    "no-todo-no-mode": {"disable_todo": True, "disable_mode": True},
    "quiet": {"disable_todo": True, "disable_mode": True, "disable_file_memory": True, "disable_web_search": True},
}


@pytest.mark.parametrize("variant", HARNESS_VARIANTS)
async def test_measures_what_the_first_model_call_carries(variant: str) -> None:
    tokenizer = offline_tiktoken()
    client = RecordingClient()
    agent = create_harness_agent(
        client,
        name="assistant",
        agent_instructions="Answer from the lookups you make. Quote values exactly.",
        tools=[lookup_deployment],
        max_context_window_tokens=32_000,
        max_output_tokens=2_000,
        tokenizer=tokenizer,
        **HARNESS_VARIANTS[variant],
    )
    overhead = measure_agent_overhead(agent, tokenizer)
    messages, options = await first_request(agent, client)

    assert overhead.instructions == options["instructions"]
    assert overhead.instructions_tokens == tokenizer.count_tokens(options["instructions"])
    sent_tools = options.get("tools") or []
    assert overhead.tools_tokens == sum(spec_tokens(t) for t in sent_tools)
    assert list(overhead.tools) == [getattr(t, "name", None) or t.get("type") for t in sent_tools]
    injected = [m for m in messages if m.additional_properties.get("_attribution", {}).get("source_id") != "in_memory"]
    injected = [m for m in injected if m.text != "hello"]
    assert overhead.context_tokens == sum(MediaTokenEstimator(tokenizer).count_message_tokens(m) for m in injected)
    assert overhead.total == overhead.instructions_tokens + overhead.tools_tokens + overhead.context_tokens
    if variant == "harness-defaults":
        assert "todos_add" in overhead.tools
        assert "file_memory_write" in overhead.tools
        assert overhead.context_tokens > 0  # the todo list message at the head of the first call
        assert overhead.total > 2_000  # the harness's defaults are most of it
    if variant == "quiet":
        assert list(overhead.tools) == ["lookup_deployment"]
        assert overhead.context_tokens == 0


async def test_measuring_neither_runs_compaction_nor_touches_the_agents_sessions() -> None:
    tokenizer = offline_tiktoken()
    strategy = AnchoredCompactionStrategy(max_input_tokens=20_000, tokenizer=tokenizer)
    client = RecordingClient()
    agent = create_harness_agent(
        client,
        tools=[lookup_deployment],
        before_compaction_strategy=strategy,
        after_compaction_strategy=strategy,
        tokenizer=tokenizer,
    )
    providers = list(agent.context_providers)
    measure_agent_overhead(agent, tokenizer)
    assert strategy.passes == 0
    assert client.requests == []
    assert agent.context_providers == providers
    await first_request(agent, client)  # the strategy is still free to bind to the real conversation
    assert strategy.passes > 0


def test_measuring_the_harness_writes_nothing_in_the_working_directory(tmp_path: Path) -> None:
    """The harness's file memory would create ``./agent-file-memory/<session>``: measuring leaves the folder empty."""
    tokenizer = offline_tiktoken()
    agent = create_harness_agent(RecordingClient(), tools=[lookup_deployment], tokenizer=tokenizer)
    overhead = measure_agent_overhead(agent, tokenizer)
    assert "file_memory_write" in overhead.tools  # the file memory was measured
    assert list(tmp_path.iterdir()) == []


async def test_works_inside_a_running_event_loop() -> None:
    """Called from async code (a notebook, a server), it still answers."""
    agent = create_harness_agent(RecordingClient(), tools=[lookup_deployment], disable_file_memory=True)
    overhead = measure_agent_overhead(agent, offline_tiktoken())
    assert overhead.tools_tokens > 0


def test_a_plain_agent_counts_its_instructions_and_tools() -> None:
    tokenizer = offline_tiktoken()
    agent = Agent(RecordingClient(), "You are terse.", tools=[lookup_deployment])
    overhead = measure_agent_overhead(agent, tokenizer)
    assert overhead.instructions_tokens == tokenizer.count_tokens("You are terse.")
    assert overhead.tools == {"lookup_deployment": spec_tokens(lookup_deployment)}
    assert overhead.context_tokens == 0


def test_budget_subtracts_the_overhead_and_refuses_nothing_left() -> None:
    overhead = AgentOverhead(instructions_tokens=1_000, tools_tokens=2_000, context_tokens=50)
    assert overhead.total == 3_050
    assert overhead.budget(32_000, 2_000, margin=500) == 32_000 - 2_000 - 3_050 - 500
    with pytest.raises(ValueError, match="no room for the conversation"):
        overhead.budget(5_000, 2_000)
    assert str(overhead).startswith("3,050 tokens beside the messages")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ((32_000, 2_000, -1), r"^margin must be an integer >= 0, got -1$"),
        ((32_000, -5, 0), r"^max_output_tokens must be an integer >= 0, got -5$"),
        ((0, 2_000, 0), r"^context_window must be an integer >= 1, got 0$"),
        ((32_000.5, 2_000, 0), r"^context_window must be an integer >= 1, got 32000.5$"),
    ],
)
def test_budget_refuses_a_negative_margin_and_other_impossible_sizes(
    arguments: tuple[float, int, int], message: str
) -> None:
    """The finding: ``margin=-1`` gave a budget larger than the window allows, without a word."""
    overhead = AgentOverhead(instructions_tokens=1_000, tools_tokens=2_000, context_tokens=50)
    window, output, margin = arguments
    with pytest.raises(ValueError, match=message):
        overhead.budget(window, output, margin=margin)  # type: ignore[arg-type]
