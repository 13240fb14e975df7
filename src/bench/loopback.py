"""Real client mode: the framework's OpenAI clients against a loopback server hosting the simulator.

:class:`LoopbackProvider` serves the Responses and Chat Completions APIs (JSON or SSE) on
``127.0.0.1``; :func:`make_client` builds the real client and :func:`agent_options` the options
an ``Agent`` needs. How requests are parsed, rendered for the cache and answered:
``docs/bench.md``, "The loopback server".
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

from agent_framework import Content, Message
from aiohttp import web
from openai import BaseModel
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta, ChoiceDeltaToolCall, ChoiceDeltaToolCallFunction
from openai.types.chat.chat_completion_message_function_tool_call import ChatCompletionMessageFunctionToolCall, Function
from openai.types.completion_usage import CompletionTokensDetails, CompletionUsage, PromptTokensDetails
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseStreamEvent,
    ResponseUsage,
)
from openai.types.responses.response_reasoning_item import Summary
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from pydantic import TypeAdapter

from .model import ScriptedModel
from .provider import CallKind, CallRecord, SimulatedProvider
from .rendering import (
    RenderedRequest,
    canonical_head,
    media_count,
    normalize_tool_choice,
    render_content,
    render_message,
    render_tools,
    system_entry,
)

if TYPE_CHECKING:
    from agent_framework_openai import OpenAIChatClient, OpenAIChatCompletionClient


logger = logging.getLogger("maf_compaction")

#: Which real client: ``OpenAIChatClient`` (Responses API) or ``OpenAIChatCompletionClient``.
ClientKind: TypeAlias = Literal["openai-responses", "openai-chat"]
#: Which wire API a request used.
WireApi: TypeAlias = Literal["responses", "chat"]
#: What the wire request renders besides the canonical request: ``"issued"``, everything model-facing as sent
#: (a Chat participant ``name`` included); ``"drop"`` leaves names out (the view an in-process run has). Item ids
#: never render: they are API references, not prompt text.
IdPolicy: TypeAlias = Literal["issued", "drop"]

#: Top-level request fields that steer transport, storage or sampling, not the prompt.
TRANSPORT_KEYS: Final = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "store",
        "include",
        "max_output_tokens",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_logprobs",
        "logprobs",
        "n",
        "seed",
        "stop",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "user",
        "metadata",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "background",
        "truncation",
    }
)
#: Bits of the seed a :class:`LoopbackProvider` draws when none is given (collisions between servers: ~2**-32).
ID_SEED_BITS: Final = 64
#: Bytes of opaque state behind each reasoning item's ``encrypted_content``.
ENCRYPTED_BYTES: Final = 384
#: A visible reasoning summary for servers asked to send one (no planted values, no summary keywords).
REASONING_SUMMARY: Final = "Choosing the next step from the conversation so far."
#: ``created_at`` of the first answer; later answers count up from it (deterministic).
_EPOCH: Final = 1_767_225_600
_DELTA_CHARS: Final = 48
_ISSUED_PREFIXES: Final = ("resp", "rs", "fc", "msg", "chatcmpl")
#: Validates (and builds) the SDK's stream event of a payload, by its ``type``.
_STREAM_EVENT: Final[TypeAdapter[ResponseStreamEvent]] = TypeAdapter(ResponseStreamEvent)
_FinishReason: TypeAlias = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


# ---------------------------------------------------------------------------------------
# Canonical JSON, ids and opaque state
# ---------------------------------------------------------------------------------------


def canonical_json(value: object) -> str:
    """``value`` as canonical JSON: sorted keys, compact separators, UTF-8 text kept as is."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(slots=True)
class IssuedIds:
    """The ids one server handed out.

    Ids look like ``<prefix>_<24 hex>`` (``chatcmpl-<hex>`` for chat completions), derived
    from ``seed`` and a counter, so one seed always issues the same ids and two seeds
    issue different ones. They are API references: no rendering for the cache uses them.

    Args:
        seed: Seeds the ids.
    """

    seed: int = 0
    _count: int = field(default=0, init=False)
    _issued: set[str] = field(default_factory=set[str], init=False)

    def new(self, prefix: str) -> str:
        """Issue a fresh id with ``prefix`` (one of ``resp``, ``rs``, ``fc``, ``msg``, ``chatcmpl``)."""
        if prefix not in _ISSUED_PREFIXES:
            raise ValueError(f"prefix must be one of {', '.join(_ISSUED_PREFIXES)}, got {prefix!r}")
        self._count += 1
        digest = hashlib.sha256(f"{self.seed}:{self._count}".encode()).hexdigest()[:24]
        issued = f"chatcmpl-{digest}" if prefix == "chatcmpl" else f"{prefix}_{digest}"
        self._issued.add(issued)
        return issued

    def __contains__(self, value: object) -> bool:
        return value in self._issued


def _encrypted_content(seed: int, number: int, summary: str) -> str:
    """Deterministic opaque bytes standing in for a provider's encrypted reasoning state."""
    blob = b""
    block = 0
    while len(blob) < ENCRYPTED_BYTES:
        blob += hashlib.sha256(f"{seed}:{number}:{block}:{summary}".encode()).digest()
        block += 1
    return base64.b64encode(blob[:ENCRYPTED_BYTES]).decode("ascii")


# ---------------------------------------------------------------------------------------
# Parsing: wire JSON -> framework messages
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What the scripted model reads from one wire request.

    Attributes:
        messages: The request as framework messages (instructions first, as a system message).
        tool_choice: The framework form: ``"auto"``, ``"none"``, ``"required"``,
            ``{"mode": "required", "required_function_name": name}`` when one function is
            forced, ``{"mode": ..., "allowed_tools": [...]}`` for an allow-list, or ``None``.
        max_tokens: ``max_output_tokens`` (Responses) or ``max_completion_tokens`` / ``max_tokens`` (Chat).
        stream: The client asked for server-sent events.
    """

    messages: list[Message]
    tool_choice: object
    max_tokens: int | None
    stream: bool

    @classmethod
    def of(cls, body: Mapping[str, Any], messages: list[Message], *max_keys: str) -> ParsedRequest:
        """``messages`` with the body's ``tool_choice``, ``stream`` and first integer of ``max_keys``."""
        limits = [_int_or_none(body.get(key)) for key in max_keys]
        max_tokens = next((limit for limit in limits if limit is not None), None)
        return cls(messages, normalize_tool_choice(body.get("tool_choice")), max_tokens, bool(body.get("stream")))


def _as_mapping(value: object) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value  # pyright: ignore[reportUnknownVariableType]
    return {}


def _as_list(value: object) -> list[Any]:
    if isinstance(value, list):
        return value  # pyright: ignore[reportUnknownVariableType]
    return []


def _media_type_of(uri: str, default: str) -> str:
    if uri.startswith("data:") and ";" in uri:
        return uri[5 : uri.index(";")]
    return default


def _part_content(part: object) -> Content | None:
    """One content part (either API's shape) as framework content; ``None`` for parts the model ignores."""
    if isinstance(part, str):
        return Content.from_text(part)
    data = _as_mapping(part)
    kind = data.get("type")
    if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
        return Content.from_text(str(data.get("text") or ""))
    if kind == "refusal":
        return Content.from_text(str(data.get("refusal") or ""))
    if kind == "input_image":
        url = data.get("image_url")
        if isinstance(url, str):
            return Content.from_uri(url, media_type=_media_type_of(url, "image/*"))
    if kind == "image_url":
        url = _as_mapping(data.get("image_url")).get("url")
        if isinstance(url, str):
            return Content.from_uri(url, media_type=_media_type_of(url, "image/*"))
    if kind == "input_file":
        url = data.get("file_url") or data.get("file_data")
        if isinstance(url, str):
            return Content.from_uri(url, media_type=_media_type_of(url, "application/octet-stream"))
    logger.debug("loopback: content part of type %r not shown to the scripted model", kind)
    return None


def _parts(value: object) -> list[Content]:
    if value is None:
        return []
    if isinstance(value, str):
        return [Content.from_text(value)]
    return [c for c in map(_part_content, _as_list(value)) if c is not None]


def _text_of(value: object) -> str:
    """The text of a tool output / tool message content (a string or a list of parts)."""
    if isinstance(value, str):
        return value
    return "\n".join(c.text or "" for c in _parts(value) if c.type == "text")


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _responses_item_message(item: Mapping[str, Any]) -> Message | None:
    kind = item.get("type", "message")
    if kind == "message":
        return Message(str(item.get("role") or "user"), _parts(item.get("content")))
    if kind == "function_call":
        return Message(
            "assistant",
            [
                Content.from_function_call(
                    call_id=str(item.get("call_id") or ""),
                    name=str(item.get("name") or ""),
                    arguments=str(item.get("arguments") or ""),
                )
            ],
        )
    if kind == "function_call_output":
        return Message(
            "tool",
            [Content.from_function_result(call_id=str(item.get("call_id") or ""), result=_text_of(item.get("output")))],
        )
    if kind == "reasoning":
        summary = "\n".join(str(_as_mapping(s).get("text") or "") for s in _as_list(item.get("summary")))
        encrypted = item.get("encrypted_content")
        return Message(
            "assistant",
            [
                Content.from_text_reasoning(
                    id=item.get("id") if isinstance(item.get("id"), str) else None,
                    text=summary,
                    protected_data=encrypted if isinstance(encrypted, str) else None,
                )
            ],
        )
    logger.debug("loopback: input item of type %r not shown to the scripted model", kind)
    return None


def parse_responses_request(body: Mapping[str, Any]) -> ParsedRequest:
    """A Responses API request body as the scripted model reads it.

    ``instructions`` becomes a leading system message; each input item becomes one message:
    ``message`` (any role) with its text parts, ``function_call`` (an assistant call),
    ``function_call_output`` (a tool result), ``reasoning`` (assistant reasoning with the
    summary as text and ``encrypted_content`` as protected data).
    """
    messages: list[Message] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append(Message("system", [instructions]))
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        messages.append(Message("user", [raw_input]))
    else:
        for item in map(_as_mapping, _as_list(raw_input)):
            message = _responses_item_message(item)
            if message is not None:
                messages.append(message)
    return ParsedRequest.of(body, messages, "max_output_tokens")


def _chat_message(data: Mapping[str, Any]) -> Message:
    role = str(data.get("role") or "user")
    if role == "developer":
        role = "system"
    if role == "tool":
        result = _text_of(data.get("content"))
        return Message(
            "tool", [Content.from_function_result(call_id=str(data.get("tool_call_id") or ""), result=result)]
        )
    contents = _parts(data.get("content"))
    for call in map(_as_mapping, _as_list(data.get("tool_calls"))):
        function = _as_mapping(call.get("function"))
        contents.append(
            Content.from_function_call(
                call_id=str(call.get("id") or ""),
                name=str(function.get("name") or ""),
                arguments=str(function.get("arguments") or ""),
            )
        )
    return Message(role, contents)


def parse_chat_request(body: Mapping[str, Any]) -> ParsedRequest:
    """A Chat Completions request body as the scripted model reads it (one message per wire message)."""
    messages = [_chat_message(m) for m in map(_as_mapping, _as_list(body.get("messages")))]
    return ParsedRequest.of(body, messages, "max_completion_tokens", "max_tokens")


# ---------------------------------------------------------------------------------------
# Rendering: wire JSON -> what the simulated cache sees
# ---------------------------------------------------------------------------------------


def render_wire_request(api: WireApi, body: Mapping[str, Any], policy: IdPolicy = "issued") -> RenderedRequest:
    """A request body of either API as the one canonical request (``docs/bench.md``, "One cache model").

    The body is read as the scripted model reads it (framework messages) and rendered by the
    same rules as an in-process request, so one conversation is priced the same either way:
    ``instructions`` (Responses) or the leading system message (Chat) is the system entry; item
    ids are API references, not prompt text, and never render; the model-facing top-level
    fields (``tool_choice``...) form the head; an item of a type the parser does not know
    renders as its canonical JSON. What the wire carries and an in-process request cannot is
    kept: a Chat participant ``name`` (model-facing on that API) renders with its message,
    unless ``policy`` is ``"drop"``.
    """
    key = "input" if api == "responses" else "messages"
    raw = body.get(key)
    items: list[Any] = [{"role": "user", "content": raw}] if isinstance(raw, str) else _as_list(raw)
    instructions = body.get("instructions") if api == "responses" else None
    messages: list[Message] = []
    entries: list[str] = []
    for number, item in enumerate(map(_as_mapping, items)):
        if api == "chat" and number == 0 and item.get("role") in ("system", "developer"):
            instructions = _text_of(item.get("content"))
            continue
        message = _chat_message(item) if api == "chat" else _responses_item_message(item)
        if message is None:
            entries.append(canonical_json({k: v for k, v in item.items() if k != "id"}))
            continue
        name = item.get("name") if api == "chat" and policy == "issued" else None
        messages.append(message)
        entries.append(render_message(message, name=name if isinstance(name, str) else None))
    head = {k: v for k, v in body.items() if k not in TRANSPORT_KEYS and k not in (key, "tools", "instructions")}
    tools = body.get("tools")
    return RenderedRequest(
        instructions=system_entry(instructions) if isinstance(instructions, str) else None,
        tools=render_tools(_as_list(tools)),
        messages=tuple(entries),
        head=canonical_head(head),
        media=media_count(messages),
    )


# ---------------------------------------------------------------------------------------
# Answers: JSON bodies and SSE frames
# ---------------------------------------------------------------------------------------


def sse_frame(data: Mapping[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event: an optional ``event:`` line, one ``data:`` line, a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def _chunks(text: str) -> list[str]:
    return [text[i : i + _DELTA_CHARS] for i in range(0, len(text), _DELTA_CHARS)] or [""]


def _arguments_json(content: Content) -> str:
    arguments = content.arguments
    if isinstance(arguments, str):
        return arguments
    return json.dumps(dict(arguments or {}), ensure_ascii=False)


def _wire(model: BaseModel) -> dict[str, Any]:
    """An SDK object as the JSON the server sends: the fields it was given, nulls included."""
    return model.model_dump(mode="json", exclude_unset=True, by_alias=True)


@dataclass(frozen=True, slots=True)
class _Answer:
    """One answered call: the reply, its accounting, and the ids it was given."""

    reply: Message
    record: CallRecord
    reasoning_tokens: int
    number: int
    summary: str


def _responses_output(answer: _Answer, ids: IssuedIds) -> list[ResponseOutputItem]:
    output: list[ResponseOutputItem] = [
        ResponseReasoningItem(
            type="reasoning",
            id=ids.new("rs"),
            summary=[Summary(type="summary_text", text=answer.summary)] if answer.summary else [],
            encrypted_content=_encrypted_content(ids.seed, answer.number, answer.summary),
        )
    ]
    for call in (c for c in answer.reply.contents if c.type == "function_call"):
        arguments = _arguments_json(call)
        output.append(
            ResponseFunctionToolCall(
                type="function_call",
                id=ids.new("fc"),
                call_id=call.call_id or "",
                name=call.name or "",
                arguments=arguments,
                status="completed",
            )
        )
    texts = [c.text or "" for c in answer.reply.contents if c.type == "text"]
    if texts or len(output) == 1:
        text = ResponseOutputText(type="output_text", text="".join(texts), annotations=[], logprobs=[])
        output.append(
            ResponseOutputMessage(
                type="message", id=ids.new("msg"), role="assistant", status="completed", content=[text]
            )
        )
    return output


def _response(body: Mapping[str, Any], answer: _Answer, ids: IssuedIds) -> Response:
    record = answer.record
    usage = ResponseUsage(
        input_tokens=record.input_tokens,
        input_tokens_details=InputTokensDetails(
            cached_tokens=record.cached_tokens, cache_write_tokens=record.written_tokens
        ),
        output_tokens=record.output_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=answer.reasoning_tokens),
        total_tokens=record.input_tokens + record.output_tokens,
    )
    return Response.model_validate(
        {
            "id": ids.new("resp"),
            "object": "response",
            "created_at": _EPOCH + answer.number,
            "status": "completed",
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": body.get("model") or "scripted",
            "output": _responses_output(answer, ids),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": body.get("store", True),
            "temperature": body.get("temperature"),
            "text": {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools", []),
            "top_p": body.get("top_p"),
            "truncation": "disabled",
            "usage": usage,
            "metadata": {},
        }
    )


def responses_events(response: Response | Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The Responses API event stream for a finished ``response``: ``(event type, payload)`` pairs.

    ``response.created``, ``response.in_progress``, then per output item ``output_item.added``,
    its deltas (reasoning summary text, function call arguments, output text) and
    ``output_item.done``, then ``response.completed`` with the usage. Every event is
    validated as the SDK's ``ResponseStreamEvent``.
    """
    done = response if isinstance(response, Response) else Response.model_validate(response)
    events: list[dict[str, Any]] = []

    def event(kind: str, **payload: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **payload})

    pending = done.model_copy(update={"status": "in_progress", "output": [], "usage": None})
    event("response.created", response=pending)
    event("response.in_progress", response=pending)
    for index, item in enumerate(done.output):
        at = {"item_id": item.id, "output_index": index}
        if isinstance(item, ResponseReasoningItem):
            event("response.output_item.added", output_index=index, item=item.model_copy(update={"summary": []}))
            for number, part in enumerate(item.summary):
                where = {**at, "summary_index": number}
                event("response.reasoning_summary_part.added", **where, part={"type": "summary_text", "text": ""})
                for delta in _chunks(part.text):
                    event("response.reasoning_summary_text.delta", **where, delta=delta)
                event("response.reasoning_summary_text.done", **where, text=part.text)
                event("response.reasoning_summary_part.done", **where, part={"type": "summary_text", "text": part.text})
        elif isinstance(item, ResponseFunctionToolCall):
            opened = item.model_copy(update={"arguments": "", "status": "in_progress"})
            event("response.output_item.added", output_index=index, item=opened)
            for delta in _chunks(item.arguments):
                event("response.function_call_arguments.delta", **at, delta=delta)
            event("response.function_call_arguments.done", **at, name=item.name, arguments=item.arguments)
        elif isinstance(item, ResponseOutputMessage):
            opened = item.model_copy(update={"status": "in_progress", "content": []})
            event("response.output_item.added", output_index=index, item=opened)
            for number, part in enumerate(item.content):
                text = part.text if isinstance(part, ResponseOutputText) else part.refusal
                where = {**at, "content_index": number}
                empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                event("response.content_part.added", **where, part=empty)
                for delta in _chunks(text):
                    event("response.output_text.delta", **where, delta=delta, logprobs=[])
                event("response.output_text.done", **where, text=text, logprobs=[])
                event("response.content_part.done", **where, part=part)
        else:
            raise ValueError(f"no event stream for an output item of type {item.type!r}")
        event("response.output_item.done", output_index=index, item=item)
    event("response.completed", response=done)
    for payload in events:
        validated = _STREAM_EVENT.validate_python(payload)
        yield validated.type, _wire(validated)


def _completion(body: Mapping[str, Any], answer: _Answer, ids: IssuedIds) -> ChatCompletion:
    calls = [c for c in answer.reply.contents if c.type == "function_call"]
    text = "".join(c.text or "" for c in answer.reply.contents if c.type == "text")
    message = ChatCompletionMessage(role="assistant", content=text if text or not calls else None, refusal=None)
    if calls:
        message.tool_calls = [
            ChatCompletionMessageFunctionToolCall(
                id=c.call_id or "", type="function", function=Function(name=c.name or "", arguments=_arguments_json(c))
            )
            for c in calls
        ]
    record = answer.record
    usage = CompletionUsage(
        prompt_tokens=record.input_tokens,
        prompt_tokens_details=PromptTokensDetails(
            cached_tokens=record.cached_tokens, cache_write_tokens=record.written_tokens, audio_tokens=0
        ),
        completion_tokens=record.output_tokens,
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=answer.reasoning_tokens, audio_tokens=0),
        total_tokens=record.input_tokens + record.output_tokens,
    )
    finish_reason: Literal["tool_calls", "stop"] = "tool_calls" if calls else "stop"
    return ChatCompletion(
        id=ids.new("chatcmpl"),
        object="chat.completion",
        created=_EPOCH + answer.number,
        model=body.get("model") or "scripted",
        system_fingerprint="fp_loopback",
        choices=[Choice(index=0, message=message, finish_reason=finish_reason, logprobs=None)],
        usage=usage,
    )


def chat_chunks(completion: ChatCompletion | Mapping[str, Any], *, include_usage: bool) -> Iterator[dict[str, Any]]:
    """The Chat Completions chunk stream for a finished ``completion`` (``[DONE]`` is not included).

    A role chunk, content deltas or tool-call deltas (id and name first, then the
    arguments), a chunk with the ``finish_reason``, and with ``include_usage`` a last chunk
    with empty ``choices`` and the usage. Every chunk is an SDK ``ChatCompletionChunk``.
    """
    done = completion if isinstance(completion, ChatCompletion) else ChatCompletion.model_validate(completion)
    base = {"id": done.id, "created": done.created, "model": done.model, "system_fingerprint": done.system_fingerprint}
    choice = done.choices[0]

    def chunk(delta: ChoiceDelta, finish_reason: _FinishReason | None = None) -> dict[str, Any]:
        picked = ChunkChoice(index=0, delta=delta, finish_reason=finish_reason, logprobs=None)
        return _wire(ChatCompletionChunk(**base, object="chat.completion.chunk", choices=[picked]))

    yield chunk(ChoiceDelta(role="assistant", content="", refusal=None))
    for delta in _chunks(choice.message.content) if choice.message.content else ():
        yield chunk(ChoiceDelta(content=delta))
    for index, call in enumerate(c for c in choice.message.tool_calls or () if c.type == "function"):
        opening = ChoiceDeltaToolCallFunction(name=call.function.name, arguments="")
        yield chunk(
            ChoiceDelta(tool_calls=[ChoiceDeltaToolCall(index=index, id=call.id, type="function", function=opening)])
        )
        for delta in _chunks(call.function.arguments):
            argument = ChoiceDeltaToolCallFunction(arguments=delta)
            yield chunk(ChoiceDelta(tool_calls=[ChoiceDeltaToolCall(index=index, function=argument)]))
    yield chunk(ChoiceDelta(), choice.finish_reason)
    if include_usage:
        yield _wire(ChatCompletionChunk(**base, object="chat.completion.chunk", choices=[], usage=done.usage))


# ---------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------

_ROUTES: Final[tuple[tuple[str, CallKind, WireApi], ...]] = (
    ("/v1/responses", "model", "responses"),
    ("/v1/chat/completions", "model", "chat"),
    ("/summarizer/v1/responses", "summarizer", "responses"),
    ("/summarizer/v1/chat/completions", "summarizer", "chat"),
)


#: A loopback route's handler.
Handler: TypeAlias = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve(handlers: Iterable[tuple[str, Handler]]) -> tuple[web.AppRunner, int]:
    """Serve ``handlers`` (each a POST path and its handler) on an ephemeral port of ``127.0.0.1``: the runner
    (``cleanup()`` stops serving) and the port."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    for path, handler in handlers:
        app.router.add_post(path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    await web.SockSite(runner, sock).start()
    return runner, port


class LoopbackServer:
    """What both loopback servers share: serving on an ephemeral port of ``127.0.0.1`` (:func:`serve`), stopping
    (``async with`` ends it), and their URLs while they run."""

    _runner: web.AppRunner | None = None
    _port: int | None = None

    async def _start(self, handlers: Iterable[tuple[str, Handler]]) -> None:
        self._runner, self._port = await serve(handlers)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
        self._runner = None
        self._port = None

    def _url(self, path: str) -> str:
        """``http://127.0.0.1:<port><path>``; refused while the server is not running."""
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not running; use it as an async context manager")
        return f"http://127.0.0.1:{self._port}{path}"


class LoopbackProvider(LoopbackServer):
    """An OpenAI-compatible HTTP server on ``127.0.0.1`` answering with the scripted model.

    Use it as an async context manager (``async with LoopbackProvider(model, provider) as server``,
    then ``make_client(kind, server.base_url("model"))``). Every request is priced as the one
    canonical request (:func:`render_wire_request`); ``id_policy="drop"`` also leaves out Chat
    participant names. ``id_seed`` seeds the ids it issues and its reasoning items'
    ``encrypted_content``. Without one, a seed is drawn from the operating system's randomness
    (:func:`secrets.randbits`), so servers started independently (one per process, as replicas
    would be) never issue the same id, and a session can move between them: the OpenAI client
    refuses to replay a history in which one reasoning id appears in two answers. Give an
    explicit seed where the ids must repeat from run to run (the bench passes one, so its figures
    are reproducible); two servers that share a session need different seeds. Each Responses
    answer carries a reasoning item with opaque ``encrypted_content`` and, as the API does when no
    summary is asked for, no summary; a ``reasoning_summary`` text is sent (and billed as
    reasoning output) instead.
    ``requests``, ``apis``, ``kinds`` and ``rendered`` record, per request, the raw JSON body,
    its API, ``"model"`` or ``"summarizer"``, and what the provider was given; ``ids`` the ids
    issued.
    """

    def __init__(
        self,
        model: ScriptedModel,
        provider: SimulatedProvider,
        *,
        id_policy: IdPolicy = "issued",
        id_seed: int | None = None,
        reasoning_summary: str = "",
    ) -> None:
        self.model = model
        self.provider = provider
        self.id_policy: IdPolicy = id_policy
        self.reasoning_summary = reasoning_summary
        self.ids = IssuedIds(seed=secrets.randbits(ID_SEED_BITS) if id_seed is None else id_seed)
        self.requests: list[dict[str, Any]] = []
        self.apis: list[WireApi] = []
        self.kinds: list[CallKind] = []
        self.rendered: list[RenderedRequest] = []

    # -- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> LoopbackProvider:
        """Start serving on an ephemeral port of ``127.0.0.1``."""
        await self._start((path, self._handler(kind, api)) for path, kind, api in _ROUTES)
        logger.debug("loopback: serving on 127.0.0.1:%d", self._port)
        return self

    def base_url(self, kind: CallKind = "model") -> str:
        """The ``base_url`` an OpenAI client uses for the agent's calls or a summarizer's."""
        return self._url("/summarizer/v1" if kind == "summarizer" else "/v1")

    # -- requests -------------------------------------------------------------------

    def _handler(self, kind: CallKind, api: WireApi) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                body = await request.json()
                if not isinstance(body, dict):
                    raise ValueError("the request body is not a JSON object")
                payload: dict[str, Any] = body  # pyright: ignore[reportUnknownVariableType]
                return await self._reply(request, payload, kind, api)
            except Exception as error:
                logger.exception("loopback: %s %s failed", request.method, request.path)
                return web.json_response(
                    {"error": {"message": f"loopback: {error}", "type": "server_error", "param": None, "code": None}},
                    status=500,
                )

        return handle

    def _answer(self, body: dict[str, Any], kind: CallKind, api: WireApi, parsed: ParsedRequest) -> _Answer:
        self.requests.append(body)
        self.apis.append(api)
        self.kinds.append(kind)
        answer = self.model.reply(
            parsed.messages,
            tool_choice=parsed.tool_choice,
            max_tokens=parsed.max_tokens,
            summarizer=kind == "summarizer",
        )
        rendered = render_wire_request(api, body, self.id_policy)
        self.rendered.append(rendered)
        output = "\n".join(render_content(c) for c in answer.message.contents)
        reasoning_tokens = answer.reasoning_tokens
        if api == "responses" and self.reasoning_summary:
            reasoning_tokens += self.provider.count(self.reasoning_summary)
        record = self.provider.call(
            rendered,
            output=output,
            kind=kind,
            label=answer.label,
            instruction=answer.instruction,
            reasoning_tokens=reasoning_tokens,
        )
        return _Answer(answer.message, record, reasoning_tokens, len(self.requests), self.reasoning_summary)

    async def _reply(
        self, request: web.Request, body: dict[str, Any], kind: CallKind, api: WireApi
    ) -> web.StreamResponse:
        parsed = (parse_responses_request if api == "responses" else parse_chat_request)(body)
        answer = self._answer(body, kind, api, parsed)
        done = _response(body, answer, self.ids) if api == "responses" else _completion(body, answer, self.ids)
        if not parsed.stream:
            return web.json_response(_wire(done))
        if isinstance(done, Response):
            return await self._stream(request, (sse_frame(data, event) for event, data in responses_events(done)))
        include_usage = bool(_as_mapping(body.get("stream_options")).get("include_usage"))
        frames = [sse_frame(c) for c in chat_chunks(done, include_usage=include_usage)]
        return await self._stream(request, [*frames, sse_frame("[DONE]")])

    @staticmethod
    async def _stream(request: web.Request, frames: Iterable[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for frame in frames:
            await response.write(frame)
        await response.write_eof()
        return response


# ---------------------------------------------------------------------------------------
# The real clients
# ---------------------------------------------------------------------------------------


def make_client(
    kind: ClientKind,
    base_url: str,
    *,
    model: str = "scripted-model",
    timeout: float = 30.0,
) -> OpenAIChatClient[Any] | OpenAIChatCompletionClient[Any]:
    """The framework's real OpenAI client for ``kind``, pointed at ``base_url``.

    ``"openai-responses"`` builds ``agent_framework_openai.OpenAIChatClient`` (Responses API),
    ``"openai-chat"`` builds ``OpenAIChatCompletionClient``. Both get a pre-built
    ``AsyncOpenAI`` with a dummy key, ``max_retries=0`` and a finite ``timeout`` (seconds), so a
    failing server fails the call instead of hanging it, and no ``OPENAI_*`` environment
    variable is read. The Responses client stores server-side by default: give the agent
    :func:`agent_options` (``store=False``) so history is kept and replayed client-side.
    """
    from agent_framework_openai import OpenAIChatClient, OpenAIChatCompletionClient  # noqa: PLC0415 (heavy, only needed here)
    from openai import AsyncOpenAI  # noqa: PLC0415

    openai_client = AsyncOpenAI(api_key="sk-loopback", base_url=base_url, max_retries=0, timeout=timeout)
    if kind == "openai-responses":
        return OpenAIChatClient(model=model, async_client=openai_client)
    if kind == "openai-chat":
        return OpenAIChatCompletionClient(model=model, async_client=openai_client)
    raise ValueError(f"kind must be 'openai-responses' or 'openai-chat', got {kind!r}")


async def close_client(client: OpenAIChatClient[Any] | OpenAIChatCompletionClient[Any]) -> None:
    """Close the ``AsyncOpenAI`` client (and its HTTP connections) behind a :func:`make_client` client.

    Call it before the event loop ends: an open client is closed by the garbage collector,
    which schedules the close on a loop that may be gone ("Event loop is closed" on stderr).
    """
    await client.client.close()


def agent_options(kind: ClientKind) -> dict[str, Any]:
    """The ``default_options`` an ``Agent`` over :func:`make_client` needs: ``store=False`` for the Responses API."""
    return {"store": False} if kind == "openai-responses" else {}
