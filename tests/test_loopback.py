"""Real client mode: ``agent-framework-openai``'s own clients against the loopback provider.

The end-to-end tests drive one generated, tool-heavy scenario (13 user turns, three with
a tool call, four closing probes) through ``agent_framework.Agent`` with the anchored
strategy, once in process (``SimulatedChatClient``) and once per wire mode (Responses and
Chat Completions, streaming and not) through the real client and HTTP on 127.0.0.1. The
scripted model must make the same calls and give the same answers either way, and the
cache hit share measured on the wire must agree with the in-process one.

Two shares are measured per wire run. ``issued`` is the raw wire rendering (only the ids
the server issued are canonicalized), ``drop`` also drops what the in-process rendering
never carries (input item ids, Chat participant names). The gap between them is a finding
about the real client's bytes, pinned down in ``test_raw_wire_bytes_*``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from agent_framework import Agent, AgentResponse, Message
from openai import AsyncOpenAI, InternalServerError
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from maf_compaction import AnchoredCompactionStrategy
from maf_compaction.bench.client import SimulatedChatClient, scenario_tools
from maf_compaction.bench.loopback import (
    REASONING_SUMMARY,
    ClientKind,
    IdPolicy,
    IssuedIds,
    LoopbackProvider,
    WireApi,
    agent_options,
    chat_chunks,
    make_client,
    parse_chat_request,
    parse_responses_request,
    render_wire_request,
    responses_events,
    sse_frame,
)
from maf_compaction.bench.model import ScriptedModel
from maf_compaction.bench.provider import CallRecord, SimulatedProvider
from maf_compaction.bench.rendering import OPAQUE_MARKER, RenderedRequest
from maf_compaction.bench.scenario import GeneratorOptions, Scenario, generate
from maf_compaction.bench.simulator import get_profile
from offline_tokenizers import offline_tiktoken

WINDOW = 8_192
BUDGET = 6_000
TOLERANCE = 0.02  # two percentage points
MODES: list[tuple[ClientKind, bool]] = [
    ("openai-responses", False),
    ("openai-responses", True),
    ("openai-chat", False),
    ("openai-chat", True),
]
MODE_IDS = ["responses", "responses-stream", "chat", "chat-stream"]


def scenario() -> Scenario:
    """13 turns: requirements, three lookups among filler turns, a correction, four probes."""
    return generate(GeneratorOptions(context_window=WINDOW, fill=1.5, tool_turns=3, markers_per_tool=4))


def new_provider() -> SimulatedProvider:
    return SimulatedProvider(encoder=offline_tiktoken(), window=WINDOW, profile=get_profile("default"))


def hit_share(calls: Sequence[CallRecord]) -> float:
    model = [c for c in calls if c.kind == "model"]
    return sum(c.cached_tokens for c in model) / sum(c.input_tokens for c in model)


def api_of(kind: ClientKind) -> WireApi:
    return "responses" if kind == "openai-responses" else "chat"


@dataclass(frozen=True)
class Run:
    """One pass of the scenario and what came out of it."""

    answers: list[str]
    tool_calls: list[tuple[str, str, str]]
    calls: list[CallRecord]
    requests: list[dict[str, Any]]
    ids: IssuedIds | None

    def share(self) -> float:
        return hit_share(self.calls)

    def issued(self) -> IssuedIds:
        """The ids the run's server issued (wire runs only)."""
        assert self.ids is not None
        return self.ids

    def share_as(self, api: WireApi, policy: IdPolicy) -> float:
        """The hit share of this run's wire requests, re-rendered with ``policy`` into a fresh provider."""
        provider = new_provider()
        for body in self.requests:
            provider.call(render_wire_request(api, body, policy), output="")
        return hit_share(provider.calls)


async def drive(agent: Agent[Any], provider: SimulatedProvider, script: Scenario, *, stream: bool) -> Run:
    session = agent.create_session()
    answers: list[str] = []
    tool_calls: list[tuple[str, str, str]] = []
    for number, turn in enumerate(script.turns, start=1):
        provider.turn = number
        response: AgentResponse[Any]
        if stream:
            response = await agent.run(turn.user, session=session, stream=True).get_final_response()
        else:
            response = await agent.run(turn.user, session=session)
        answers.append(response.text)
        for message in response.messages:
            for content in message.contents:
                if content.type == "function_call":
                    arguments = content.parse_arguments() or {}
                    tool_calls.append(
                        (content.call_id or "", content.name or "", json.dumps(arguments, sort_keys=True))
                    )
    return Run(answers, tool_calls, list(provider.calls), [], None)


def build_agent(client: Any, script: Scenario, options: Mapping[str, Any] | None = None) -> Agent[Any]:
    return Agent(
        client,
        instructions=script.system,
        tools=scenario_tools(script),
        compaction_strategy=AnchoredCompactionStrategy(max_input_tokens=BUDGET, tokenizer=offline_tiktoken()),
        default_options=dict(options or {}),
    )


_RUNS: dict[tuple[str, bool], Run] = {}


async def in_process(*, stream: bool) -> Run:
    key = ("in-process", stream)
    if key not in _RUNS:
        script = scenario()
        provider = new_provider()
        client = SimulatedChatClient(model=ScriptedModel(script), provider=provider)
        _RUNS[key] = await drive(build_agent(client, script), provider, script, stream=stream)
    return _RUNS[key]


async def over_the_wire(kind: ClientKind, *, stream: bool) -> Run:
    key = (kind, stream)
    if key not in _RUNS:
        script = scenario()
        provider = new_provider()
        async with LoopbackProvider(ScriptedModel(script), provider, id_seed=0) as server:
            client = make_client(kind, server.base_url("model"))
            run = await drive(build_agent(client, script, agent_options(kind)), provider, script, stream=stream)
            assert all(k == "model" for k in server.kinds)
            assert all(bool(body.get("stream")) is stream for body in server.requests)
            _RUNS[key] = Run(run.answers, run.tool_calls, run.calls, list(server.requests), server.ids)
    return _RUNS[key]


# ---------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------


def test_the_scenario_is_long_and_tool_heavy() -> None:
    script = scenario()
    assert len(script.turns) >= 10
    assert sum(1 for t in script.turns if t.calls) >= 3
    assert sum(1 for t in script.turns if t.probe) >= 2


@pytest.mark.parametrize(("kind", "stream"), MODES, ids=MODE_IDS)
async def test_wire_run_plays_the_same_script(kind: ClientKind, stream: bool) -> None:
    local = await in_process(stream=stream)
    wire = await over_the_wire(kind, stream=stream)
    assert wire.tool_calls == local.tool_calls
    assert [call_id for call_id, _, _ in wire.tool_calls] == ["call_3_0", "call_5_0", "call_8_0"]
    assert wire.answers == local.answers
    probes = [a for a in wire.answers if a.startswith("Values:")]
    assert len(probes) == 4
    assert len(wire.calls) == len(local.calls)


@pytest.mark.parametrize(("kind", "stream"), MODES, ids=MODE_IDS)
async def test_wire_hit_share_agrees_with_in_process(kind: ClientKind, stream: bool) -> None:
    local = await in_process(stream=stream)
    wire = await over_the_wire(kind, stream=stream)
    comparable = wire.share_as(api_of(kind), "drop")
    raw = wire.share()
    logging.getLogger("maf_compaction").info(
        "hit share %s stream=%s: in-process %.4f, wire drop %.4f, wire issued %.4f",
        kind,
        stream,
        local.share(),
        comparable,
        raw,
    )
    assert abs(comparable - local.share()) <= TOLERANCE, (local.share(), comparable, raw)
    # The live provider measured the raw wire ("issued"); re-rendering reproduces it exactly.
    assert wire.share_as(api_of(kind), "issued") == pytest.approx(raw)


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
async def test_encrypted_reasoning_goes_back_over_the_wire(stream: bool) -> None:
    wire = await over_the_wire("openai-responses", stream=stream)
    assert wire.requests[0]["store"] is False
    assert "reasoning.encrypted_content" in wire.requests[0]["include"]
    replayed = [[item for item in body["input"] if item.get("type") == "reasoning"] for body in wire.requests]
    assert [len(items) for items in replayed[:4]] == [0, 1, 2, 3]
    for items in replayed[1:]:
        assert items
        for item in items:
            assert isinstance(item["encrypted_content"], str)
            assert len(item["encrypted_content"]) > 400
            assert item["id"] in wire.issued()
            assert item["summary"] == []  # no summary was asked for, as the API answers then


async def test_raw_wire_bytes_responses_function_call_id_is_rebuilt_on_replay() -> None:
    """Finding: within the tool loop a call item carries the server's ``fc_`` id; replayed
    from history in the next run it carries ``fc_<call_id>``. Item ids are API references, not
    prompt text, so the canonical request (and its price) does not change there."""
    for stream in (False, True):
        wire = await over_the_wire("openai-responses", stream=stream)
        ids_sent: dict[str, list[str]] = {}
        for body in wire.requests:
            for item in body["input"]:
                if item.get("type") == "function_call":
                    ids_sent.setdefault(item["call_id"], []).append(item["id"])
        for call_id, sent in ids_sent.items():
            assert sent[0] in wire.issued(), sent
            assert set(sent[1:]) == {f"fc_{call_id}"}, sent
        assert wire.share() == wire.share_as("responses", "drop")


async def test_raw_wire_bytes_chat_assistant_name_appears_on_replay() -> None:
    """Finding: the assistant tool-call message has no ``name`` within the tool loop, and
    ``"name": "UnnamedAgent"`` once replayed from history: the raw wire cache breaks there."""
    for stream in (False, True):
        wire = await over_the_wire("openai-chat", stream=stream)
        names: dict[str, list[str | None]] = {}
        for body in wire.requests:
            for message in body["messages"]:
                for call in message.get("tool_calls") or ():
                    names.setdefault(call["id"], []).append(message.get("name"))
        for sent in names.values():
            assert sent[0] is None
            assert set(sent[1:]) == {"UnnamedAgent"}
        assert wire.share() < wire.share_as("chat", "drop")


# ---------------------------------------------------------------------------------------
# Parsing the wire
# ---------------------------------------------------------------------------------------

#: Shape of a request the Responses client sent with store=False (reference capture, §3.2).
RESPONSES_BODY: dict[str, Any] = {
    "model": "fake-model",
    "stream": False,
    "include": ["reasoning.encrypted_content"],
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_b57cf33b05fb", "summary": [], "encrypted_content": "ENC:aa7c"},
        {
            "call_id": "call_f5a142c5",
            "id": "fc_call_f5a142c5",
            "type": "function_call",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "status": "completed",
        },
        {"call_id": "call_f5a142c5", "type": "function_call_output", "output": "Sunny in Paris, 21C."},
        {
            "type": "reasoning",
            "id": "rs_794bbee66333",
            "summary": [{"type": "summary_text", "text": "Thinking."}],
            "encrypted_content": "ENC:8201",
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Tool said: sunny.", "annotations": []}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks. And say hi."}]},
    ],
    "instructions": "You are a terse test agent.",
    "store": False,
    "tool_choice": "auto",
    "max_output_tokens": 300,
    "tools": [
        {
            "name": "get_weather",
            "parameters": {"properties": {"city": {"type": "string"}}, "required": ["city"], "type": "object"},
            "strict": False,
            "type": "function",
            "description": "Return the weather for a city.",
        }
    ],
}

#: Shape of a request the Chat Completions client sent (reference capture, §3.2).
CHAT_BODY: dict[str, Any] = {
    "model": "fake-model",
    "stream": False,
    "messages": [
        {"role": "system", "content": "You are a terse test agent."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "name": "UnnamedAgent",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"P"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny."},
        {"role": "assistant", "content": [{"type": "text", "text": "Tool said: sunny."}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
    ],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "max_completion_tokens": 50,
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
}


def shape(messages: Sequence[Message]) -> list[tuple[str, list[str]]]:
    return [(m.role, [c.type for c in m.contents]) for m in messages]


def test_parse_responses_request() -> None:
    parsed = parse_responses_request(RESPONSES_BODY)
    assert shape(parsed.messages) == [
        ("system", ["text"]),
        ("user", ["text"]),
        ("assistant", ["text_reasoning"]),
        ("assistant", ["function_call"]),
        ("tool", ["function_result"]),
        ("assistant", ["text_reasoning"]),
        ("assistant", ["text"]),
        ("user", ["text"]),
    ]
    assert parsed.messages[0].text == "You are a terse test agent."
    call = parsed.messages[3].contents[0]
    assert (call.call_id, call.name, call.parse_arguments()) == ("call_f5a142c5", "get_weather", {"city": "Paris"})
    result = parsed.messages[4].contents[0]
    assert (result.call_id, result.result) == ("call_f5a142c5", "Sunny in Paris, 21C.")
    reasoning = parsed.messages[5].contents[0]
    assert (reasoning.text, reasoning.protected_data) == ("Thinking.", "ENC:8201")
    assert parsed.messages[-1].text == "Thanks. And say hi."
    assert (parsed.tool_choice, parsed.max_tokens, parsed.stream) == ("auto", 300, False)


def test_parse_chat_request() -> None:
    parsed = parse_chat_request(CHAT_BODY)
    assert shape(parsed.messages) == [
        ("system", ["text"]),
        ("user", ["text"]),
        ("assistant", ["function_call"]),
        ("tool", ["function_result"]),
        ("assistant", ["text"]),
        ("user", ["text"]),
    ]
    assert parsed.messages[2].contents[0].call_id == "call_1"
    assert parsed.messages[3].contents[0].result == "Sunny."
    assert parsed.messages[-1].text == "Thanks."
    assert parsed.tool_choice == {"mode": "required", "required_function_name": "get_weather"}
    assert parsed.max_tokens == 50


@pytest.mark.parametrize(
    ("api", "wire", "framework"),
    [
        ("responses", "auto", "auto"),
        ("responses", "none", "none"),
        ("responses", {"type": "function", "name": "f"}, {"mode": "required", "required_function_name": "f"}),
        (
            "responses",
            {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "f"}]},
            {"mode": "required", "allowed_tools": ["f"]},
        ),
        ("chat", "none", "none"),
        ("chat", {"type": "function", "function": {"name": "f"}}, {"mode": "required", "required_function_name": "f"}),
    ],
)
def test_tool_choice_maps_back_to_the_framework_form(api: WireApi, wire: object, framework: object) -> None:
    if api == "responses":
        parsed = parse_responses_request({"input": "hi", "tool_choice": wire})
    else:
        parsed = parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "tool_choice": wire})
    assert parsed.tool_choice == framework


def test_the_scripted_model_reads_a_wire_request_like_a_framework_one() -> None:
    script = scenario()
    turn = next(t for t in script.turns if t.calls)
    body = {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": turn.user}]}]}
    parsed = parse_responses_request(body)
    reply = ScriptedModel(script).respond(parsed.messages, tool_choice=parsed.tool_choice)
    assert [c.type for c in reply.contents] == ["function_call"]
    assert (reply.contents[0].call_id or "").endswith("_0")


# ---------------------------------------------------------------------------------------
# Rendering and id canonicalization
# ---------------------------------------------------------------------------------------


def responses_body_with(ids: IssuedIds, *, encrypted: str = "b64-state") -> dict[str, Any]:
    """A request replaying one answer of a server whose ids come from ``ids``."""
    return {
        "model": "m",
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "instructions": "Be brief.",
        "tool_choice": "auto",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
            {"type": "reasoning", "id": ids.new("rs"), "summary": [], "encrypted_content": encrypted},
            {"type": "function_call", "id": ids.new("fc"), "call_id": "call_1_0", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1_0", "output": "done"},
            {
                "type": "message",
                "id": ids.new("msg"),
                "role": "assistant",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            },
        ],
    }


def test_item_ids_never_render() -> None:
    """Server-issued and client-rebuilt item ids are references, not prompt text."""
    first, second = IssuedIds(seed=1), IssuedIds(seed=2)
    body_1, body_2 = responses_body_with(first), responses_body_with(second)
    assert body_1 != body_2
    assert render_wire_request("responses", body_1) == render_wire_request("responses", body_2)
    rebuilt = json.loads(json.dumps(body_1))
    rebuilt["input"][2]["id"] = "fc_call_1_0"  # what the client sends when it replays history
    assert render_wire_request("responses", rebuilt) == render_wire_request("responses", body_1)
    assert not any(
        issued in entry for entry in render_wire_request("responses", body_1).entries for issued in ("rs_", "fc_")
    )


def test_rendering_layout_and_transport_keys() -> None:
    rendered = render_wire_request("responses", RESPONSES_BODY)
    assert rendered.instructions == "<|system|>\nYou are a terse test agent."
    assert rendered.head == ()  # tool_choice "auto" is the default; the rest is transport
    assert rendered.tools is not None
    assert rendered.tools.startswith('<|tools|>\n[{"description":"Return the weather')
    assert '"strict"' not in rendered.tools
    assert rendered.messages[0] == "<|user|>\nWeather in Paris?"
    assert rendered.messages[2] == '<|assistant|>\ncall call_f5a142c5 get_weather({"city":"Paris"})'
    assert rendered.messages[3] == "<|tool|>\nresult call_f5a142c5: Sunny in Paris, 21C."
    assert rendered.messages[5] == "<|assistant|>\nTool said: sunny."
    chat = render_wire_request("chat", CHAT_BODY)
    assert chat.head == (("tool_choice", '{"mode":"required","required_function_name":"get_weather"}'),)
    assert chat.instructions == "<|system|>\nYou are a terse test agent."
    assert chat.messages[0] == "<|user|>\nWeather in Paris?"
    assert chat.messages[1] == '<|assistant name=UnnamedAgent|>\ncall call_1 get_weather({"city":"P"})'
    assert render_wire_request("chat", CHAT_BODY, policy="drop").messages[1].startswith("<|assistant|>\n")
    # The same conversation in process renders to the same entries (the chat name aside).
    local = RenderedRequest.of(
        parse_chat_request(CHAT_BODY).messages[1:], {"instructions": "You are a terse test agent."}
    )
    assert local.messages == render_wire_request("chat", CHAT_BODY, policy="drop").messages


def test_encrypted_content_is_opaque_identity_not_billed_text() -> None:
    small = render_wire_request("responses", responses_body_with(IssuedIds(), encrypted="A" * 40))
    large = render_wire_request("responses", responses_body_with(IssuedIds(), encrypted="B" * 4_000))
    assert "B" * 100 not in large.messages[1]
    assert OPAQUE_MARKER.fullmatch(large.messages[1])
    assert small.messages[1] != large.messages[1]  # different state, different identity
    provider = new_provider()
    assert provider.tokens(large.messages[1]) == provider.tokens(small.messages[1]) == ()
    # ... and the changed state still breaks the prefix behind it.
    provider.call(small, output="")
    assert provider.call(large, output="").broke


# ---------------------------------------------------------------------------------------
# Answers: bodies, SSE framing, usage
# ---------------------------------------------------------------------------------------


def test_sse_frame() -> None:
    assert sse_frame({"a": 1}, "response.created") == b'event: response.created\ndata: {"a":1}\n\n'
    assert sse_frame("[DONE]") == b"data: [DONE]\n\n"


async def test_responses_answers_parse_strictly_and_carry_usage() -> None:
    script = scenario()
    turn = next(t for t in script.turns if t.calls)
    body = {
        "model": "m",
        "store": False,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": turn.user}]}],
        "tools": [{"type": "function", "name": "lookup_records", "parameters": {"type": "object"}}],
        "tool_choice": "auto",
    }
    provider = new_provider()
    async with LoopbackProvider(ScriptedModel(script), provider, reasoning_summary=REASONING_SUMMARY) as server:
        sdk = AsyncOpenAI(api_key="sk-test", base_url=server.base_url(), max_retries=0, timeout=10)
        raw = await sdk.responses.with_raw_response.create(**body)
        response = Response.model_validate(json.loads(raw.http_response.text))
        async with await sdk.responses.create(**body, stream=True) as stream:
            events = [event async for event in stream]
        await sdk.close()
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    reasoning = response.output[0]
    assert reasoning.type == "reasoning"
    assert reasoning.encrypted_content
    assert response.usage is not None
    first = provider.calls[0]
    assert response.usage.input_tokens == first.input_tokens
    assert response.usage.input_tokens_details.cached_tokens == first.cached_tokens
    assert response.usage.output_tokens == first.output_tokens
    thinking = ScriptedModel(script).options.reasoning  # the model's own reasoning, then the summary it sends
    assert response.usage.output_tokens_details.reasoning_tokens == thinking + provider.count(REASONING_SUMMARY)
    assert provider.calls[1].input_tokens == first.input_tokens  # the streamed twin of the same request
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    assert "response.reasoning_summary_text.delta" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.usage is not None
    assert completed.response.usage.input_tokens == provider.calls[1].input_tokens


def test_responses_events_validate_against_the_sdk_types() -> None:
    ids = IssuedIds()
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    for output in (
        [{"type": "function_call", "id": ids.new("fc"), "call_id": "c", "name": "f", "arguments": '{"x": 1}'}],
        [
            {
                "type": "message",
                "id": ids.new("msg"),
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "x" * 100, "annotations": [], "logprobs": []}],
            }
        ],
    ):
        reasoning = {
            "type": "reasoning",
            "id": ids.new("rs"),
            "summary": [{"type": "summary_text", "text": "s"}],
            "encrypted_content": "e",
        }
        response = {
            "id": ids.new("resp"),
            "object": "response",
            "created_at": 1,
            "model": "m",
            "output": [reasoning, *output],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "status": "completed",
        }
        Response.model_validate(response)
        for _, payload in responses_events(response):
            adapter.validate_python(payload)


async def test_chat_answers_parse_strictly_and_carry_usage() -> None:
    script = scenario()
    turn = next(t for t in script.turns if t.calls)
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "system", "content": script.system}, {"role": "user", "content": turn.user}],
        "tools": [{"type": "function", "function": {"name": "lookup_records", "parameters": {"type": "object"}}}],
    }
    provider = new_provider()
    async with LoopbackProvider(ScriptedModel(script), provider) as server:
        sdk = AsyncOpenAI(api_key="sk-test", base_url=server.base_url(), max_retries=0, timeout=10)
        raw = await sdk.chat.completions.with_raw_response.create(**body)
        completion = ChatCompletion.model_validate(json.loads(raw.http_response.text))
        stream = await sdk.chat.completions.create(**body, stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        await sdk.close()
    message = completion.choices[0].message
    assert message.tool_calls
    assert message.tool_calls[0].id.startswith("call_")
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens == provider.calls[0].input_tokens
    assert completion.usage.prompt_tokens_details.cached_tokens == provider.calls[0].cached_tokens
    assert completion.usage.completion_tokens == provider.calls[0].output_tokens
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == provider.calls[1].input_tokens
    arguments = "".join(
        call.function.arguments or ""
        for chunk in chunks
        for choice in chunk.choices
        for call in choice.delta.tool_calls or ()
        if call.function is not None
    )
    assert json.loads(arguments) == {"lookup": 1}
    for chunk in chat_chunks(completion.model_dump(), include_usage=True):
        ChatCompletionChunk.model_validate(chunk)


async def test_summarizer_route_is_accounted_apart() -> None:
    script = scenario()
    provider = new_provider()
    async with LoopbackProvider(ScriptedModel(script), provider) as server:
        assert server.base_url("summarizer").endswith("/summarizer/v1")
        sdk = AsyncOpenAI(api_key="sk-test", base_url=server.base_url("summarizer"), max_retries=0, timeout=10)
        response = await sdk.responses.create(model="m", input=script.turns[0].user, instructions="Summarize.")
        await sdk.close()
    assert server.kinds == ["summarizer"]
    assert [c.kind for c in provider.calls] == ["summarizer"]
    assert [c.label for c in provider.calls] == ["summary"]
    assert response.output_text.startswith("Item 1 ")  # the plausible model's prose about the one item


async def test_a_bad_request_fails_fast_instead_of_hanging() -> None:
    async with LoopbackProvider(ScriptedModel(scenario()), new_provider()) as server:
        sdk = AsyncOpenAI(api_key="sk-test", base_url=server.base_url(), max_retries=0, timeout=5)
        with pytest.raises(InternalServerError):
            await sdk.post("/responses", cast_to=object, body=["not", "an", "object"])
        await sdk.close()


def test_base_url_needs_a_running_server() -> None:
    server = LoopbackProvider(ScriptedModel(scenario()), new_provider())
    with pytest.raises(RuntimeError, match="not running"):
        server.base_url()


def test_make_client_kinds() -> None:
    from agent_framework_openai import OpenAIChatClient, OpenAIChatCompletionClient

    assert isinstance(make_client("openai-responses", "http://127.0.0.1:9/v1"), OpenAIChatClient)
    assert isinstance(make_client("openai-chat", "http://127.0.0.1:9/v1"), OpenAIChatCompletionClient)
    assert agent_options("openai-responses") == {"store": False}
    assert agent_options("openai-chat") == {}
    bad: Any = "anthropic"
    with pytest.raises(ValueError, match="kind must be"):
        make_client(bad, "http://127.0.0.1:9/v1")
