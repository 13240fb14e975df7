"""Real client mode for Claude: agent-framework-anthropic's ``AnthropicClient`` against a loopback Messages API.

:class:`AnthropicLoopback` serves ``POST /v1/messages`` (JSON or server-sent events) on ``127.0.0.1``.
Every request is first checked as Anthropic documents it (:func:`validate_request`); an invalid one
is answered with Anthropic's 400 error shape and recorded in :attr:`AnthropicLoopback.rejected`. A
valid one is answered by the scripted model and priced from the breakpoints the request itself
marks (:func:`wire_layout`, :class:`~.simulator.BreakpointCache`): explicit ``cache_control`` marks on
tools, system blocks and message content blocks, and the request-level automatic one. Usage is
reported as Anthropic reports it. :func:`make_client` builds the real client, :func:`agent_options`
the options an ``Agent`` passes (automatic caching, extended thinking). The rules and their sources:
``docs/bench.md``, "The Anthropic loopback".
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from agent_framework import Content, Message
from aiohttp import web
from anthropic.types.beta import (
    BetaCacheCreation,
    BetaContentBlock,
    BetaMessage,
    BetaRawMessageStreamEvent,
    BetaTextBlock,
    BetaThinkingBlock,
    BetaToolUseBlock,
    BetaUsage,
)
from pydantic import TypeAdapter

from .loopback import IssuedIds, LoopbackServer, canonical_json, sse_frame
from .model import ScriptedModel
from .provider import CallKind, CallRecord, SimulatedProvider
from .rendering import (
    MESSAGE_LAYER_FIELDS,
    RenderedRequest,
    canonical_head,
    media_count,
    opaque,
    render_content,
    render_message,
    render_tools,
    system_entry,
    tool_spec,
)
from .runner import ANTHROPIC_CACHE_MODES, AnthropicCacheMode
from .simulator import (
    ANTHROPIC_LOOKBACK_BLOCKS,
    ANTHROPIC_MAX_BREAKPOINTS,
    ANTHROPIC_TTLS,
    Breakpoint,
    BreakpointCache,
    BreakpointResult,
    Salt,
)

if TYPE_CHECKING:
    from agent_framework_anthropic import AnthropicClient


logger = logging.getLogger("maf_compaction")


#: The model name the bench's client sends (its minimum cacheable length is 2,048 tokens, reference §3).
DEFAULT_MODEL: Final = "claude-sonnet-4-6"
#: The smallest ``budget_tokens`` Anthropic accepts for extended thinking, and what the bench asks for.
MIN_THINKING_BUDGET: Final = 1_024
#: The thinking text of every answer when extended thinking is on (no planted values, no summary keywords).
THINKING_TEXT: Final = "Choosing the next step from the conversation so far."
#: Minimum cacheable prompt length by model name prefix (reference §3); any other model: 1,024.
MIN_CACHEABLE_TOKENS: Final[Mapping[str, int]] = {
    "claude-opus-4-6": 4_096,
    "claude-opus-4-5": 4_096,
    "claude-haiku-4-5": 4_096,
    "claude-sonnet-4-6": 2_048,
    "claude-3-5-haiku": 2_048,
    "claude-3-haiku": 2_048,
}
#: Top-level request fields that are not model-facing head fields (transport, sampling, caching).
TRANSPORT_KEYS: Final = frozenset(
    {
        "model",
        "max_tokens",
        "stream",
        "metadata",
        "service_tier",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "cache_control",
        "container",
        "inference_geo",
    }
)
#: Content block types that may not carry ``cache_control`` and that the automatic mark skips.
_UNCACHEABLE: Final = frozenset({"thinking", "redacted_thinking"})
_THINKING: Final = frozenset({"thinking", "redacted_thinking"})
_SIGNATURE_BYTES: Final = 96
_DELTA_CHARS: Final = 48
_STREAM_EVENT: Final[TypeAdapter[BetaRawMessageStreamEvent]] = TypeAdapter(BetaRawMessageStreamEvent)

#: The validation rules, by the name reports count rejections under.
RULES: Final[Mapping[str, str]] = {
    "request": "the body's shape: model, max_tokens, messages, roles, non-empty content",
    "tool_pairing": "each tool_use answered by a tool_result in the next user turn, results first, no strays",
    "thinking_config": "thinking budget_tokens of at least 1,024 and below max_tokens",
    "thinking_tool_choice": "with thinking on, tool_choice may not force a tool (any / tool)",
    "thinking_order": "with thinking on, a final assistant turn with tool_use starts with a thinking block",
    "thinking_signature": "thinking blocks passed back unchanged, with the signature they were issued",
    "cache_control": "cache_control is {type: ephemeral, ttl: 5m|1h}, never on thinking or empty text blocks",
    "breakpoints": "at most 4 cache_control marks, the automatic one included",
    "ttl_order": "a 1h mark never after a 5m mark",
    "tool_choice": "a tool_choice of type tool names a declared tool",
}


class InvalidRequest(ValueError):
    """A request Anthropic would refuse with a 400 ``invalid_request_error``.

    Attributes:
        rule: The rule it breaks (a key of :data:`RULES`).
        message: What Anthropic's error message would say (in our words).
    """

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message


@dataclass(frozen=True, slots=True)
class Rejection:
    """One request the loopback answered with a 400.

    Attributes:
        kind: ``"model"`` or ``"summarizer"`` (the route).
        rule: The rule it broke (:data:`RULES`).
        message: The error message sent.
        number: 1-based number of the request among all the server received.
        body: The refused request body, as received.
    """

    kind: CallKind
    rule: str
    message: str
    number: int
    body: Mapping[str, Any] = field(default_factory=dict[str, Any], repr=False, compare=False)


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    """Anthropic's error shape: ``{"type": "error", "error": {"type": kind, "message": message}}``."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix ``model`` caches (reference §3): 1,024, 2,048 or 4,096 tokens."""
    return next((tokens for prefix, tokens in MIN_CACHEABLE_TOKENS.items() if model.startswith(prefix)), 1_024)


# ---------------------------------------------------------------------------------------
# Reading the wire
# ---------------------------------------------------------------------------------------


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}  # pyright: ignore[reportUnknownVariableType]


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []  # pyright: ignore[reportUnknownVariableType]


def _blocks(content: object) -> list[Mapping[str, Any]]:
    """A message's content as blocks (a string is one text block, which cannot carry a mark)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [_mapping(block) for block in _list(content)]


def thinking_on(body: Mapping[str, Any]) -> bool:
    """The request turns extended thinking on (``enabled``, or ``adaptive``)."""
    return _mapping(body.get("thinking")).get("type") in ("enabled", "adaptive")


@dataclass(frozen=True, slots=True)
class _Turn:
    """Consecutive wire messages of one role (the API combines them into one turn)."""

    role: str
    blocks: tuple[tuple[str, Mapping[str, Any]], ...]  # (where, block)


def _turns(messages: Sequence[Mapping[str, Any]]) -> list[_Turn]:
    turns: list[_Turn] = []
    for number, message in enumerate(messages):
        role = str(message.get("role"))
        blocks = tuple((f"messages.{number}.content.{i}", b) for i, b in enumerate(_blocks(message.get("content"))))
        if turns and turns[-1].role == role:
            turns[-1] = _Turn(role, turns[-1].blocks + blocks)
        else:
            turns.append(_Turn(role, blocks))
    return turns


def _check_shape(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    if not isinstance(body.get("model"), str) or not body.get("model"):
        raise InvalidRequest("request", "model: Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise InvalidRequest("request", "max_tokens: Input should be a valid integer greater than or equal to 1")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("request", "messages: at least one message is required")
    messages = [_mapping(m) for m in _list(raw)]
    for number, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise InvalidRequest("request", f'messages.{number}.role: Input should be "user" or "assistant"')
        content = message.get("content")
        if content is None or content in ("", []):
            raise InvalidRequest("request", f"messages.{number}: all messages must have non-empty content")
    # The first-party API takes a first message of either role (Bedrock refuses an assistant one: not simulated).
    return messages


def _check_tool_pairing(turns: Sequence[_Turn]) -> None:
    seen: set[str] = set()
    for index, turn in enumerate(turns):
        if turn.role == "assistant":
            uses = [(where, str(b.get("id"))) for where, b in turn.blocks if b.get("type") == "tool_use"]
            for where, use in uses:
                if use in seen:
                    raise InvalidRequest("tool_pairing", f"{where}: `tool_use` ids must be unique, {use} repeats")
                seen.add(use)
            if not uses:
                continue
            after = turns[index + 1] if index + 1 < len(turns) else None
            answered = (
                {str(b.get("tool_use_id")) for _, b in after.blocks if b.get("type") == "tool_result"}
                if after
                else set()
            )
            missing = [use for _, use in uses if use not in answered]
            if missing:
                raise InvalidRequest(
                    "tool_pairing",
                    f"{uses[0][0]}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block "
                    "in the next message.",
                )
            continue
        previous = turns[index - 1] if index > 0 else None
        asked = {str(b.get("id")) for _, b in previous.blocks if b.get("type") == "tool_use"} if previous else set()
        other = False
        for where, block in turn.blocks:
            if block.get("type") != "tool_result":
                other = True
                continue
            if other:
                raise InvalidRequest(
                    "tool_pairing",
                    f"{where}: `tool_result` blocks must come first in a user turn, before any other content",
                )
            if str(block.get("tool_use_id")) not in asked:
                raise InvalidRequest(
                    "tool_pairing",
                    f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: {block.get('tool_use_id')}. "
                    "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
                )


def _check_thinking(body: Mapping[str, Any], turns: Sequence[_Turn], issued: Callable[[str, str], bool]) -> None:
    for turn in turns:
        for where, block in turn.blocks:
            if block.get("type") == "thinking":
                signature, text = block.get("signature"), block.get("thinking")
                if not isinstance(signature, str) or not isinstance(text, str) or not issued(signature, text):
                    raise InvalidRequest("thinking_signature", f"{where}: Invalid `signature` in `thinking` block")
    if not thinking_on(body):
        return
    config = _mapping(body.get("thinking"))
    if config.get("type") == "enabled":
        budget = config.get("budget_tokens")
        if not isinstance(budget, int) or budget < 1_024:
            raise InvalidRequest("thinking_config", "thinking.enabled.budget_tokens: must be at least 1024")
        if budget >= int(body.get("max_tokens") or 0):
            raise InvalidRequest("thinking_config", "`max_tokens` must be greater than `thinking.budget_tokens`")
    if _mapping(body.get("tool_choice")).get("type") in ("any", "tool"):
        raise InvalidRequest("thinking_tool_choice", "Thinking may not be enabled when tool_choice forces tool use.")
    final = next((turn for turn in reversed(turns) if turn.role == "assistant"), None)
    if final is None or not any(b.get("type") == "tool_use" for _, b in final.blocks):
        return
    where, first = final.blocks[0]
    if first.get("type") not in _THINKING:
        raise InvalidRequest(
            "thinking_order",
            f"{where}.type: Expected `thinking` or `redacted_thinking`, but found `{first.get('type')}`. When "
            "`thinking` is enabled, a final `assistant` message must start with a thinking block (preceding the "
            "lastmost set of `tool_use` and `tool_result` blocks).",
        )


@dataclass(frozen=True, slots=True)
class _Mark:
    where: str
    ttl: str


def _mark_of(where: str, block: Mapping[str, Any]) -> _Mark | None:
    mark = block.get("cache_control")
    if mark is None:
        return None
    data = _mapping(mark)
    ttl = data.get("ttl", "5m")
    if data.get("type") != "ephemeral" or ttl not in ANTHROPIC_TTLS or set(data) - {"type", "ttl"}:
        raise InvalidRequest("cache_control", f"{where}.cache_control: expected {{type: ephemeral, ttl: 5m|1h}}")
    if block.get("type") in _UNCACHEABLE:
        raise InvalidRequest("cache_control", f"{where}: `{block.get('type')}` blocks cannot carry cache_control")
    if block.get("type") == "text" and not block.get("text"):
        raise InvalidRequest("cache_control", f"{where}: cache_control cannot be set for empty text blocks")
    return _Mark(where, str(ttl))


# ---------------------------------------------------------------------------------------
# Blocks: what the cache sees, in Anthropic's order (tools, system, messages)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WireBlock:
    """One block of a request as the cache sees it.

    Attributes:
        where: Its path in the body (``tools.0``, ``system.1``, ``messages.3.content.0``).
        kind: Its type (``tool``, ``text``, ``tool_use``, ``tool_result``, ``thinking``...).
        text: Its canonical rendering (opaque payloads as zero-token markers).
        mark: Its explicit ``cache_control`` mark, if any.
    """

    where: str
    kind: str
    text: str
    mark: _Mark | None

    @property
    def cacheable(self) -> bool:
        """A mark may sit here (the automatic one lands on the last such block)."""
        return self.kind not in _UNCACHEABLE and bool(self.text)


def _block_text(block: Mapping[str, Any]) -> str:
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text") or "")
    if kind == "tool_use":
        return f"call {block.get('id')} {block.get('name')}({canonical_json(block.get('input') or {})})"
    if kind == "tool_result":
        return f"result {block.get('tool_use_id')}: {_result_text(block.get('content'))}"
    if kind == "thinking":
        return opaque(str(block.get("signature") or ""), str(block.get("thinking") or ""))
    if kind == "redacted_thinking":
        return opaque(str(block.get("data") or ""))
    if kind in ("image", "document"):
        source = _mapping(block.get("source"))
        where = source.get("url") or hashlib.sha256(str(source.get("data") or "").encode()).hexdigest()[:16]
        return f"[{kind} {source.get('media_type') or ''} {where}]"
    return canonical_json({k: v for k, v in block.items() if k != "cache_control"})


def _result_text(content: object) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(_block_text(b) for b in _blocks(content))


def wire_blocks(body: Mapping[str, Any]) -> tuple[list[WireBlock], int, int]:
    """Every block of ``body`` in cache order, and the indices where the system and the messages begin.

    Tools and system blocks first (each its own block), then each message's content blocks; a
    message's first block carries its role line. A ``tool_result`` whose inner blocks carry a
    mark counts as marked at its own end. Raises :class:`InvalidRequest` for a malformed mark.
    """
    blocks: list[WireBlock] = []
    for number, tool in enumerate(_mapping(t) for t in _list(body.get("tools"))):
        where = f"tools.{number}"
        spec = tool_spec({k: v for k, v in tool.items() if k != "cache_control"})
        blocks.append(WireBlock(where, "tool", f"<|tool|>\n{canonical_json(spec)}", _mark_of(where, tool)))
    system_start = len(blocks)
    system = body.get("system")
    for number, block in enumerate(_blocks(system) if system else []):
        where = f"system.{number}"
        text = str(block.get("text") or "")
        blocks.append(
            WireBlock(where, "text", (system_entry(text) or "") if number == 0 else text, _mark_of(where, block))
        )
    messages_start = len(blocks)
    for number, message in enumerate(_mapping(m) for m in _list(body.get("messages"))):
        for index, block in enumerate(_blocks(message.get("content"))):
            where = f"messages.{number}.content.{index}"
            mark = _mark_of(where, block)
            for inner, part in enumerate(_blocks(block.get("content")) if block.get("type") == "tool_result" else []):
                mark = _mark_of(f"{where}.content.{inner}", part) or mark
            text = _block_text(block)
            head = f"<|{message.get('role')}|>\n" if index == 0 else "\n"
            blocks.append(WireBlock(where, str(block.get("type")), head + text, mark))
    return blocks, system_start, messages_start


def _marks(body: Mapping[str, Any], blocks: Sequence[WireBlock]) -> list[tuple[int, _Mark]]:
    """The request's breakpoints: each marked block, and the automatic mark on the last cacheable block."""
    marks = [(index, block.mark) for index, block in enumerate(blocks) if block.mark is not None]
    automatic = body.get("cache_control")
    if automatic is not None:
        mark = _mark_of("cache_control", {"type": "text", "text": "x", "cache_control": automatic})
        last = next((i for i in range(len(blocks) - 1, -1, -1) if blocks[i].cacheable), None)
        if mark is not None and last is not None and all(index != last for index, _ in marks):
            marks.append((last, mark))
    if len(marks) > ANTHROPIC_MAX_BREAKPOINTS:
        raise InvalidRequest(
            "breakpoints",
            f"A maximum of {ANTHROPIC_MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(marks)}.",
        )
    ordered = sorted(marks, key=lambda pair: pair[0])
    for (_, before), (_, after) in itertools.pairwise(ordered):
        if before.ttl == "5m" and after.ttl == "1h":
            raise InvalidRequest(
                "ttl_order", f"{after.where}: a ttl='1h' cache_control block may not come after a ttl='5m' one"
            )
    return ordered


def validate_request(body: Mapping[str, Any], issued: Callable[[str, str], bool] = lambda _s, _t: True) -> None:
    """Refuse ``body`` as Anthropic would (raises :class:`InvalidRequest` naming the rule, :data:`RULES`).

    ``issued(signature, thinking)`` says whether a thinking block's signature was issued for that
    text (so a changed or missing one is refused).
    """
    messages = _check_shape(body)
    turns = _turns(messages)
    _check_tool_pairing(turns)
    _check_thinking(body, turns, issued)
    choice = _mapping(body.get("tool_choice"))
    names = {_mapping(t).get("name") for t in _list(body.get("tools"))}
    if choice.get("type") == "tool" and choice.get("name") not in names:
        raise InvalidRequest("tool_choice", f"tool_choice.name: no tool named {choice.get('name')!r} in tools")
    blocks, _, _ = wire_blocks(body)
    _marks(body, blocks)


def framework_tool_choice(value: object) -> object:
    """Anthropic's ``tool_choice`` in the framework's form (what the scripted model reads)."""
    choice = _mapping(value)
    kind = choice.get("type")
    if kind == "tool":
        return {"mode": "required", "required_function_name": choice.get("name")}
    if kind == "any":
        return "required"
    if kind in ("auto", "none"):
        return kind
    return None


def wire_messages(body: Mapping[str, Any]) -> list[Message]:
    """The request as framework messages: the system text first, then each wire message (its tool results apart)."""
    messages: list[Message] = []
    system = body.get("system")
    text = system if isinstance(system, str) else "\n\n".join(str(b.get("text") or "") for b in _blocks(system))
    if text:
        messages.append(Message("system", [text]))
    for message in (_mapping(m) for m in _list(body.get("messages"))):
        role = str(message.get("role") or "user")
        group: list[Content] = []
        group_role = role
        for block in _blocks(message.get("content")):
            content, block_role = _content(block, role)
            if content is None:
                continue
            if group and block_role != group_role:
                messages.append(Message(group_role, group))
                group = []
            group_role = block_role
            group.append(content)
        if group:
            messages.append(Message(group_role, group))
    return messages


def _content(block: Mapping[str, Any], role: str) -> tuple[Content | None, str]:
    kind = block.get("type")
    if kind == "text":
        return Content.from_text(str(block.get("text") or "")), role
    if kind == "tool_use":
        call = Content.from_function_call(
            call_id=str(block.get("id") or ""),
            name=str(block.get("name") or ""),
            arguments=dict(_mapping(block.get("input"))),
        )
        return call, "assistant"
    if kind == "tool_result":
        result = Content.from_function_result(
            call_id=str(block.get("tool_use_id") or ""), result=_result_text(block.get("content"))
        )
        return result, "tool"
    if kind == "thinking":
        reasoning = Content.from_text_reasoning(
            text=str(block.get("thinking") or ""), protected_data=str(block.get("signature") or "") or None
        )
        return reasoning, role
    if kind == "image":
        source = _mapping(block.get("source"))
        uri = source.get("url") or f"data:{source.get('media_type')};base64,{source.get('data') or ''}"
        return Content.from_uri(str(uri), media_type=str(source.get("media_type") or "image/*")), role
    logger.debug("anthropic loopback: block of type %r not shown to the scripted model", kind)
    return None, role


def rendered_request(body: Mapping[str, Any], messages: Sequence[Message]) -> RenderedRequest:
    """The canonical request (``docs/bench.md``, "One cache model") of a Messages API body: its identity for breaks.

    Pricing does not use it (the breakpoints decide, :func:`wire_layout`); it tells whether a
    request extends the previous one, and what changed when it does not.
    """
    system = [m for m in messages if m.role == "system"]
    head = {k: v for k, v in body.items() if k not in TRANSPORT_KEYS and k not in ("messages", "tools", "system")}
    if "tool_choice" in head:
        choice = _mapping(head["tool_choice"])
        head["tool_choice"] = framework_tool_choice(choice)
        if "disable_parallel_tool_use" in choice:
            head["parallel_tool_calls"] = not choice["disable_parallel_tool_use"]
    tools = [{k: v for k, v in _mapping(t).items() if k != "cache_control"} for t in _list(body.get("tools"))]
    conversation = [m for m in messages if m.role != "system"]
    return RenderedRequest(
        instructions=system_entry(system[0].text) if system else None,
        tools=render_tools(tools),
        messages=tuple(render_message(m) for m in conversation),
        head=canonical_head(head),
        media=media_count(conversation),
    )


@dataclass(frozen=True, slots=True)
class WireLayout:
    """A request's tokens as Anthropic's cache reads them.

    Attributes:
        tokens: The prompt's token ids: tools, system, messages.
        boundaries: Token offset where each block ends.
        salts: Layer keys (system-level settings before the system; ``tool_choice``, thinking and
            the image count before the messages) and opaque payloads (thinking signatures).
        breakpoints: The marks the request carries, explicit and automatic.
        blocks: The blocks.
    """

    tokens: tuple[int, ...]
    boundaries: tuple[int, ...]
    salts: tuple[Salt, ...]
    breakpoints: tuple[Breakpoint, ...]
    blocks: tuple[WireBlock, ...]


def wire_layout(body: Mapping[str, Any], request: RenderedRequest, provider: SimulatedProvider) -> WireLayout:
    """``body`` as tokens, block boundaries, layer keys and the breakpoints it marks (validated bodies only)."""
    blocks, system_start, messages_start = wire_blocks(body)
    tokens: list[int] = []
    salts: list[Salt] = []
    boundaries: list[int] = []
    for index, block in enumerate(blocks):
        if index == system_start:
            salts.append((len(tokens), f"system:{request.head_json(without=MESSAGE_LAYER_FIELDS)}".encode()))
        if index == messages_start:
            keys = f"{request.head_json(only=MESSAGE_LAYER_FIELDS)} media={request.media}"
            salts.append((len(tokens), f"messages:{keys}".encode()))
        ids, inner = provider.encoded(block.text)
        salts.extend((len(tokens) + offset, salt) for offset, salt in inner)
        tokens.extend(ids)
        boundaries.append(len(tokens))
    if messages_start == len(blocks):
        salts.append((len(tokens), b"messages:"))
    points = tuple(
        Breakpoint(end=boundaries[index], block=index, ttl=ANTHROPIC_TTLS[mark.ttl])
        for index, mark in _marks(body, blocks)
    )
    return WireLayout(tuple(tokens), tuple(boundaries), tuple(salts), points, tuple(blocks))


# ---------------------------------------------------------------------------------------
# Answers
# ---------------------------------------------------------------------------------------


def _signature(seed: int, number: int, text: str) -> str:
    blob = b""
    block = 0
    while len(blob) < _SIGNATURE_BYTES:
        blob += hashlib.sha256(f"sig:{seed}:{number}:{block}:{text}".encode()).digest()
        block += 1
    return base64.b64encode(blob[:_SIGNATURE_BYTES]).decode("ascii")


def usage_of(record: CallRecord, outcome: BreakpointResult) -> BetaUsage:
    """Usage as Anthropic reports it: ``input_tokens`` after the last breakpoint only, writes and reads apart."""
    written = outcome.result.written_tokens
    return BetaUsage(
        input_tokens=outcome.result.uncached_tokens,
        cache_creation_input_tokens=written,
        cache_read_input_tokens=outcome.result.cached_tokens,
        cache_creation=BetaCacheCreation(
            ephemeral_5m_input_tokens=written - outcome.written_long, ephemeral_1h_input_tokens=outcome.written_long
        ),
        output_tokens=record.output_tokens,
    )


def _content_blocks(reply: Message, thinking: tuple[str, str] | None) -> list[BetaContentBlock]:
    blocks: list[BetaContentBlock] = []
    if thinking is not None:
        blocks.append(BetaThinkingBlock(type="thinking", thinking=thinking[0], signature=thinking[1]))
    text = "".join(c.text or "" for c in reply.contents if c.type == "text")
    if text:
        blocks.append(BetaTextBlock(type="text", text=text))
    for call in (c for c in reply.contents if c.type == "function_call"):
        arguments = call.arguments
        data = json.loads(arguments) if isinstance(arguments, str) else dict(arguments or {})
        blocks.append(BetaToolUseBlock(type="tool_use", id=call.call_id or "", name=call.name or "", input=data))
    if not blocks:
        blocks.append(BetaTextBlock(type="text", text="Done."))
    return blocks


def _wire(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_unset=True, by_alias=True)


def _chunks(text: str) -> list[str]:
    return [text[i : i + _DELTA_CHARS] for i in range(0, len(text), _DELTA_CHARS)] or [""]


def message_events(message: BetaMessage | Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The Messages API event stream of a finished ``message``: ``(event type, payload)`` pairs.

    ``message_start`` (no content; usage with the input figures), per content block
    ``content_block_start``, its deltas (``thinking_delta`` then ``signature_delta``,
    ``text_delta``, ``input_json_delta``) and ``content_block_stop``, then ``message_delta`` with the
    stop reason and the final (cumulative) usage, and ``message_stop``. Every event is validated
    as the SDK's ``BetaRawMessageStreamEvent``.
    """
    done = message if isinstance(message, BetaMessage) else BetaMessage.model_validate(message)
    usage = done.usage
    events: list[dict[str, Any]] = []
    started = usage.model_copy(update={"output_tokens": min(1, usage.output_tokens)})
    opening = done.model_copy(update={"content": [], "stop_reason": None, "stop_sequence": None, "usage": started})
    events.append({"type": "message_start", "message": _wire(opening)})
    for index, block in enumerate(done.content):
        if isinstance(block, BetaThinkingBlock):
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                }
            )
            for delta in _chunks(block.thinking):
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "thinking_delta", "thinking": delta},
                    }
                )
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": block.signature},
                }
            )
        elif isinstance(block, BetaTextBlock):
            events.append(
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
            )
            for delta in _chunks(block.text):
                events.append(
                    {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": delta}}
                )
        elif isinstance(block, BetaToolUseBlock):
            opened = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
            events.append({"type": "content_block_start", "index": index, "content_block": opened})
            for delta in _chunks(json.dumps(block.input, ensure_ascii=False)):
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": delta},
                    }
                )
        else:
            raise ValueError(f"no event stream for a content block of type {block.type!r}")
        events.append({"type": "content_block_stop", "index": index})
    final = {
        "output_tokens": usage.output_tokens,
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
    }
    events.append(
        {"type": "message_delta", "delta": {"stop_reason": done.stop_reason, "stop_sequence": None}, "usage": final}
    )
    events.append({"type": "message_stop"})
    for payload in events:
        validated = _STREAM_EVENT.validate_python(payload)
        yield validated.type, _wire(validated)


# ---------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------

_ROUTES: Final[tuple[tuple[str, CallKind], ...]] = (
    ("/v1/messages", "model"),
    ("/summarizer/v1/messages", "summarizer"),
)


class AnthropicLoopback(LoopbackServer):
    """A Messages API server on ``127.0.0.1`` that validates, prices and answers with the scripted model.

    Use it as an async context manager (``async with AnthropicLoopback(model, provider) as server``,
    then ``make_client(server.base_url("model"))``). One :class:`~.simulator.BreakpointCache` serves
    both routes (Anthropic's cache is keyed by the prefix, not by the client). ``min_tokens``
    overrides the model's minimum cacheable length (:func:`min_cacheable_tokens`); ``id_seed`` seeds
    the message ids and thinking signatures (as :class:`~.loopback.LoopbackProvider`'s). With
    thinking on, every answer starts with a thinking block (:data:`THINKING_TEXT`) whose signature
    the server remembers, so a block passed back changed or unsigned is refused.

    ``requests``, ``rendered``, ``kinds`` and ``layouts`` record each accepted request's body, its
    rendering for the cache, route and layout; ``rejected`` each refused one (:class:`Rejection`);
    ``outcomes`` each accepted request's cache outcome.
    """

    def __init__(
        self,
        model: ScriptedModel,
        provider: SimulatedProvider,
        *,
        id_seed: int | None = None,
        min_tokens: int | None = None,
        lookback_blocks: int = ANTHROPIC_LOOKBACK_BLOCKS,
    ) -> None:
        self.model = model
        self.provider = provider
        self.min_tokens = min_tokens
        self.lookback_blocks = lookback_blocks
        self.ids = IssuedIds(seed=secrets.randbits(64) if id_seed is None else id_seed)
        self.requests: list[dict[str, Any]] = []
        self.rendered: list[RenderedRequest] = []
        self.kinds: list[CallKind] = []
        self.layouts: list[WireLayout] = []
        self.outcomes: list[BreakpointResult] = []
        self.rejected: list[Rejection] = []
        self._signatures: dict[str, str] = {}
        self._cache: BreakpointCache | None = None
        self._received = 0

    async def __aenter__(self) -> AnthropicLoopback:
        """Start serving on an ephemeral port of ``127.0.0.1``."""
        await self._start((path, self._handler(kind)) for path, kind in _ROUTES)
        return self

    def base_url(self, kind: CallKind = "model") -> str:
        """The ``base_url`` an ``AsyncAnthropic`` client uses (it appends ``/v1/messages``)."""
        return self._url("/summarizer" if kind == "summarizer" else "")

    def issued(self, signature: str, thinking: str) -> bool:
        """``signature`` was issued by this server for the thinking text ``thinking``."""
        return self._signatures.get(signature) == thinking

    def cache(self, model: str) -> BreakpointCache:
        """The server's cache (made on the first request, with that request's model's minimum length)."""
        if self._cache is None:
            minimum = self.min_tokens if self.min_tokens is not None else min_cacheable_tokens(model)
            self._cache = BreakpointCache(min_tokens=minimum, lookback_blocks=self.lookback_blocks)
        return self._cache

    def _handler(self, kind: CallKind) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            self._received += 1
            try:
                body = await request.json()
            except ValueError:
                return web.json_response(error_body("The request body is not valid JSON."), status=400)
            if not isinstance(body, dict):
                return web.json_response(error_body("The request body must be a JSON object."), status=400)
            payload: dict[str, Any] = body  # pyright: ignore[reportUnknownVariableType]
            try:
                validate_request(payload, self.issued)
            except InvalidRequest as invalid:
                self.rejected.append(Rejection(kind, invalid.rule, invalid.message, self._received, payload))
                logger.debug("anthropic loopback: refused request %d (%s)", self._received, invalid.message)
                return web.json_response(
                    error_body(invalid.message), status=400, headers={"request-id": "req_loopback"}
                )
            try:
                return await self._reply(request, payload, kind)
            except Exception as error:
                logger.exception("anthropic loopback: %s %s failed", request.method, request.path)
                return web.json_response(error_body(f"loopback: {error}", "api_error"), status=500)

        return handle

    def answer(self, body: Mapping[str, Any], kind: CallKind) -> BetaMessage:
        """Answer one valid request: the model's reply, priced from the request's own breakpoints."""
        messages = wire_messages(body)
        reply = self.model.reply(
            messages,
            tool_choice=framework_tool_choice(body.get("tool_choice")),
            max_tokens=_int(body.get("max_tokens")),
            summarizer=kind == "summarizer",
        )
        request = rendered_request(body, messages)
        layout = wire_layout(body, request, self.provider)
        outcome = self.cache(str(body.get("model"))).lookup_and_store(
            layout.tokens, layout.boundaries, layout.breakpoints, layout.salts, now=self.provider.clock
        )
        thinking: tuple[str, str] | None = None
        reasoning = reply.reasoning_tokens
        if thinking_on(body):
            signature = _signature(self.ids.seed, len(self.requests) + 1, THINKING_TEXT)
            self._signatures[signature] = THINKING_TEXT
            thinking = (THINKING_TEXT, signature)
        output = "\n".join(render_content(c) for c in reply.message.contents)
        record = self.provider.call(
            request,
            output=output,
            kind=kind,
            label=reply.label,
            instruction=reply.instruction,
            reasoning_tokens=reasoning,
            priced=outcome,
        )
        self.requests.append(dict(body))
        self.rendered.append(request)
        self.kinds.append(kind)
        self.layouts.append(layout)
        self.outcomes.append(outcome)
        content = _content_blocks(reply.message, thinking)
        calls = any(isinstance(block, BetaToolUseBlock) for block in content)
        return BetaMessage(
            id=self.ids.new("msg"),
            type="message",
            role="assistant",
            model=str(body.get("model")),
            content=content,
            stop_reason="tool_use" if calls else "end_turn",
            stop_sequence=None,
            usage=usage_of(record, outcome),
        )

    async def _reply(self, request: web.Request, body: dict[str, Any], kind: CallKind) -> web.StreamResponse:
        message = self.answer(body, kind)
        if not body.get("stream"):
            return web.json_response(_wire(message))
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        frames: Iterable[bytes] = (sse_frame(data, event) for event, data in message_events(message))
        for frame in frames:
            await response.write(frame)
        await response.write_eof()
        return response


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ---------------------------------------------------------------------------------------
# The real client
# ---------------------------------------------------------------------------------------


def make_client(base_url: str, *, model: str = DEFAULT_MODEL, timeout: float = 30.0) -> AnthropicClient[Any]:
    """agent-framework-anthropic's real ``AnthropicClient``, pointed at ``base_url``.

    It gets a pre-built ``AsyncAnthropic`` with a dummy key, ``max_retries=0`` and a finite
    ``timeout`` (seconds), so a refused request fails its call at once and no ``ANTHROPIC_*``
    environment variable is read.
    """
    from agent_framework_anthropic import AnthropicClient  # noqa: PLC0415 (heavy, only needed here)
    from anthropic import AsyncAnthropic  # noqa: PLC0415

    sdk = AsyncAnthropic(api_key="sk-ant-loopback", base_url=base_url, max_retries=0, timeout=timeout)
    return AnthropicClient(model=model, anthropic_client=sdk)


async def close_client(client: AnthropicClient[Any]) -> None:
    """Close the ``AsyncAnthropic`` client behind a :func:`make_client` client (before the event loop ends)."""
    await client.anthropic_client.close()


def agent_options(
    *, cache: AnthropicCacheMode = "auto", thinking: bool = False, budget_tokens: int = MIN_THINKING_BUDGET
) -> dict[str, Any]:
    """The ``default_options`` of an ``Agent`` over :func:`make_client`.

    ``cache="auto"`` adds the request-level ``cache_control`` (automatic caching: one breakpoint on
    the last cacheable block), the one line a user adds, and so does ``"ours"`` (its client also
    carries :func:`maf_compaction.cache_breakpoints`); ``"none"`` sends none, as the framework
    does by default. ``thinking`` turns extended thinking on with ``budget_tokens``.
    """
    if cache not in ANTHROPIC_CACHE_MODES:
        raise ValueError(f"cache must be one of {', '.join(ANTHROPIC_CACHE_MODES)}, got {cache!r}")
    options: dict[str, Any] = {}
    if cache in ("auto", "ours"):
        options["cache_control"] = {"type": "ephemeral"}
    if thinking:
        options["thinking"] = {"type": "enabled", "budget_tokens": budget_tokens}
    return options
