"""The in-process chat client: the scripted model behind the simulated provider.

:class:`SimulatedChatClient` composes the framework's own client layers over ``BaseChatClient``,
so an ``Agent`` drives it as it drives a real provider; :func:`scenario_tools` gives the
scenario's tools as ``FunctionTool``s returning the scripted results.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import Any

from agent_framework import (
    BaseChatClient,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    FunctionTool,
    Message,
    ResponseStream,
    UsageDetails,
)
from agent_framework._middleware import ChatMiddlewareLayer
from agent_framework._tools import FunctionInvocationLayer
from agent_framework.observability import ChatTelemetryLayer

from .model import ScriptedModel
from .provider import CallKind, SimulatedProvider
from .rendering import RenderedRequest, render_content
from .scenario import Media, Scenario, ToolCall


class SimulatedChatClient(FunctionInvocationLayer, ChatMiddlewareLayer, ChatTelemetryLayer, BaseChatClient):
    """A chat client whose provider is simulated and whose model is scripted.

    Args:
        model: Answers each request from what it is sent.
        provider: Counts, caches and bills each request.
        kind: ``"model"`` for the agent's client, ``"summarizer"`` for a client a
            strategy uses to summarize (its calls are counted apart).
        **kwargs: Passed to the framework's client layers.
    """

    OTEL_PROVIDER_NAME = "simulated"

    def __init__(self, *, model: ScriptedModel, provider: SimulatedProvider, kind: CallKind = "model", **kwargs: Any):
        super().__init__(**kwargs)
        self.model = model
        self.provider = provider
        self.kind: CallKind = kind
        self.prompts: list[RenderedRequest] = []

    def _inner_get_response(
        self,
        *,
        messages: Sequence[Message],
        stream: bool,
        options: Mapping[str, Any],
        **kwargs: Any,
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        if not stream:
            return self._respond(messages, options)
        return self._build_response_stream(response_updates(self._respond(messages, options)))

    async def _respond(self, messages: Sequence[Message], options: Mapping[str, Any]) -> ChatResponse:
        validated = await self._validate_options(options)
        answer = self.model.reply(
            messages,
            tool_choice=validated.get("tool_choice"),
            max_tokens=validated.get("max_tokens"),
            summarizer=self.kind == "summarizer",
        )
        request = RenderedRequest.of(messages, validated)
        output = "\n".join(render_content(c) for c in answer.message.contents)
        record = self.provider.call(
            request,
            output=output,
            kind=self.kind,
            label=answer.label,
            instruction=answer.instruction,
            reasoning_tokens=answer.reasoning_tokens,
        )
        usage = UsageDetails(
            input_token_count=record.input_tokens,
            output_token_count=record.output_tokens,
            total_token_count=record.input_tokens + record.output_tokens,
            cache_read_input_token_count=record.cached_tokens,
            cache_creation_input_token_count=record.written_tokens,
            reasoning_output_token_count=record.reasoning_tokens,
        )
        number = len(self.provider.calls)
        return ChatResponse(
            messages=[answer.message], response_id=f"resp_{number}", model="scripted", usage_details=usage
        )


async def response_updates(pending: Awaitable[ChatResponse]) -> AsyncIterator[ChatResponseUpdate]:
    """A finished response as the updates a streaming provider would send (messages, then usage)."""
    response = await pending
    for message in response.messages:
        yield ChatResponseUpdate(role="assistant", contents=list(message.contents), response_id=response.response_id)
    if response.usage_details is not None:
        yield ChatResponseUpdate(contents=[Content.from_usage(response.usage_details)])


def _media_content(media: Media) -> Content:
    if media.uri is not None:
        return Content.from_uri(media.uri, media_type=media.media_type)
    return Content.from_uri(f"data:{media.media_type};base64,{media.data}", media_type=media.media_type)


def media_contents(media: Sequence[Media]) -> list[Content]:
    """Framework contents for scenario media parts."""
    return [_media_content(m) for m in media]


def scenario_tools(scenario: Scenario) -> list[FunctionTool]:
    """One ``FunctionTool`` per scenario tool, returning the scripted result of each call.

    A call is matched by its name and arguments; when the script calls a tool twice with
    the same arguments, the results are returned in script order (then the last again).
    """
    scripted: dict[tuple[str, str], deque[ToolCall]] = defaultdict(deque)
    for turn in scenario.turns:
        for call in turn.calls:
            scripted[(call.name, _key(call.arguments))].append(call)
    tools: list[FunctionTool] = []
    for spec in scenario.tools:

        def run(*, _name: str = spec.name, **arguments: Any) -> str | list[Content]:
            queue = scripted.get((_name, _key(arguments)))
            if not queue:
                return f"No records for {_name} with {json.dumps(arguments, sort_keys=True)}."
            call = queue.popleft() if len(queue) > 1 else queue[0]
            if not call.media:
                return call.result
            return [Content.from_text(call.result), *media_contents(call.media)]

        tools.append(
            FunctionTool(
                name=spec.name,
                description=spec.description,
                func=run,
                input_model=dict(spec.parameters),
                approval_mode="never_require",
            )
        )
    return tools


def _key(arguments: Mapping[str, Any]) -> str:
    return json.dumps(dict(arguments), sort_keys=True, default=str)
