"""An offline chat client with a deterministic scripted model, built from the framework's layers.

``ScriptedChatClient`` composes the same layers, in the same order, as the framework's
OpenAI client (function invocation, chat middleware, telemetry over ``BaseChatClient``);
only the provider call is simulated. It records every request exactly as a provider
would receive it (the projected messages after compaction, and the options) and answers
from what it can see:

- the last message is a user turn asking for a lookup: it calls the workload's tool;
- the last message is a tool result: it quotes the planted code the user asked for, if
  the result shows it;
- the last message asks to recall a requirement: it quotes the requirement's code if a
  message in its context still shows it;
- anything else: a short acknowledgement.

Usage is filled per call: input tokens of the canonical rendering, output tokens of the
reply, and as cached input the tokens of the prefix shared with the previous request
(a prompt cache that matches on whole messages).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_framework import (
    BaseChatClient,
    CharacterEstimatorTokenizer,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    Message,
    ResponseStream,
    UsageDetails,
)
from agent_framework._middleware import ChatMiddlewareLayer
from agent_framework._tools import FunctionInvocationLayer
from agent_framework.observability import ChatTelemetryLayer

from .client import response_updates
from .measure import PromptMeter, RenderedRequest, common_prefix
from .workload import LOOKUP_REQUEST, REQUIREMENT_REQUEST, TOOL_NAME

_GROUP_KEY = "_group"


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the provider received it.

    Attributes:
        messages: The messages sent (copies taken on arrival, so later compaction of
            stored history cannot change the record; contents are shared, never mutated).
        options: The validated chat options (``instructions``, ``tools``, ``max_tokens``...).
        stream: The call was a streaming call.
    """

    messages: tuple[Message, ...]
    options: Mapping[str, Any]
    stream: bool


class ScriptedChatClient(FunctionInvocationLayer, ChatMiddlewareLayer, ChatTelemetryLayer, BaseChatClient):
    """A chat client whose model is a deterministic script over the workload's conventions.

    Args:
        meter: Counts the usage figures; defaults to the framework's character estimator.
        tool_name: The lookup tool the model calls.
        **kwargs: Passed to the framework's client layers (middleware, ...).
    """

    OTEL_PROVIDER_NAME = "scripted"

    def __init__(self, *, meter: PromptMeter | None = None, tool_name: str = TOOL_NAME, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.requests: list[RecordedRequest] = []
        self._meter = meter or PromptMeter(CharacterEstimatorTokenizer())
        self._tool_name = tool_name
        self._previous: RenderedRequest | None = None

    def _inner_get_response(
        self,
        *,
        messages: Sequence[Message],
        stream: bool,
        options: Mapping[str, Any],
        **kwargs: Any,
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        if not stream:
            return self._respond(messages, options, stream=False)
        return self._build_response_stream(response_updates(self._respond(messages, options, stream=True)))

    async def _respond(self, messages: Sequence[Message], options: Mapping[str, Any], *, stream: bool) -> ChatResponse:
        validated = await self._validate_options(options)
        self.requests.append(RecordedRequest(tuple(map(_snapshot, messages)), validated, stream))
        reply = self._reply(messages)
        rendered = RenderedRequest.of(messages, validated)
        reused = 0
        if self._previous is not None:
            shared = common_prefix(self._previous.entries, rendered.entries)
            reused = sum(self._meter.tokens(entry) for entry in rendered.entries[:shared])
        self._previous = rendered
        prompt = self._meter.prompt_tokens(rendered)
        output = self._meter.tokens("\n".join(map(_plain, reply.contents)))
        usage = UsageDetails(
            input_token_count=prompt,
            output_token_count=output,
            total_token_count=prompt + output,
            cache_read_input_token_count=reused,
        )
        number = len(self.requests)
        return ChatResponse(messages=[reply], response_id=f"resp_{number}", model="scripted", usage_details=usage)

    def _reply(self, messages: Sequence[Message]) -> Message:
        """The scripted model: it sees only ``messages``."""
        last = messages[-1] if messages else None
        if last is None:
            return Message("assistant", ["How can I help?"])
        if last.role == "tool":
            return Message("assistant", [_quote_code(messages)])
        text = last.text if last.role == "user" else ""
        lookup = LOOKUP_REQUEST.search(text)
        if lookup is not None:
            call = Content.from_function_call(
                call_id=f"call_{len(self.requests):04d}",
                name=self._tool_name,
                arguments={"service": lookup["service"]},
            )
            return Message("assistant", [call])
        requirement = REQUIREMENT_REQUEST.search(text)
        if requirement is not None:
            return Message("assistant", [_quote_requirement(messages, requirement["label"])])
        return Message("assistant", ["Understood. I will keep these in mind."])


def _snapshot(message: Message) -> Message:
    """A copy of ``message`` that later in-place edits of the original cannot reach."""
    copied = copy.copy(message)
    copied.contents = list(message.contents)
    props = dict(message.additional_properties)
    group = props.get(_GROUP_KEY)
    if isinstance(group, dict):
        props[_GROUP_KEY] = dict(group)  # pyright: ignore[reportUnknownArgumentType]
    copied.additional_properties = props
    return copied


def _plain(content: Content) -> str:
    if content.type == "function_call":
        return f"{content.name} {content.arguments}"
    return content.text or ""


def _quote_code(messages: Sequence[Message]) -> str:
    """Answer the latest lookup from the latest tool result."""
    request = next((m for m in reversed(messages) if m.role == "user" and LOOKUP_REQUEST.search(m.text)), None)
    match = LOOKUP_REQUEST.search(request.text) if request is not None else None
    if match is None:
        return "The lookup returned; nothing was asked about it."
    service, code = match["service"], match["code"]
    results = [c for c in messages[-1].contents if c.type == "function_result"]
    text = "\n".join(str(c.result) for c in results)
    found = re.search(rf"^{code}=(TL-[0-9A-F]{{6}})$|^\| {code} \| (TL-[0-9A-F]{{6}}) \|", text, re.MULTILINE)
    if found is None:
        return f"{service}: the log does not show {code}."
    return f"{service}: {code} is {found[1] or found[2]}."


def _quote_requirement(messages: Sequence[Message], label: str) -> str:
    """Quote a requirement's code if any visible user message still states it."""
    pattern = re.compile(rf"^- {label} \((RQ-[0-9A-F]{{6}})\): (.*)$", re.MULTILINE)
    for message in messages:
        if message.role != "user":
            continue
        found = pattern.search(message.text)
        if found is not None:
            return f"{label} ({found[1]}): {found[2]}"
    return f"I can no longer see requirement {label} in this conversation."
