"""Anthropic cache breakpoints where our decisions keep the bytes (:mod:`maf_compaction.core.breakpoints`).

agent-framework-anthropic's clients never mark a message cacheable, and drop any
``cache_control`` a content carries. :func:`cache_breakpoints` wraps the SDK call of one
client (``AnthropicClient`` and its Foundry, Bedrock and Vertex siblings alike, before
Bedrock signs the body) so every request it sends carries the marks the last compaction
pass chose, on the wire blocks of the messages the pass named.

The pass publishes what it produced (a value in a context variable: one task's request
never sees another's); the wrapper asks the core where to mark, finds those messages'
blocks in the request the client built (matched in order by tool call id or text), and
adds ``{"type": "ephemeral"}`` to them (with the request-level mark's TTL when the request
has one), within the four marks a request may carry (the user's own marks and the
request-level automatic one count first). A request no pass
ran before (a summarizer's, another agent's) goes out as the client built it.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

from agent_framework import Message

from ..core.breakpoints import MAX_BREAKPOINTS, StrategyConfig, strategy_marks
from ..core.model import History

logger = logging.getLogger("maf_compaction")

#: What a mark adds to a block.
EPHEMERAL: Final[Mapping[str, str]] = {"type": "ephemeral"}
#: Set on a wrapped ``create`` so wrapping twice is a no-op.
_WRAPPED: Final = "_maf_compaction_breakpoints"

_Key = tuple[str, str]
C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class _Published:
    """The last pass's outcome in this task: its history, the framework messages it applied to, its config."""

    messages: tuple[Message, ...]
    history: History
    config: StrategyConfig


_LAST_PASS: contextvars.ContextVar[_Published | None] = contextvars.ContextVar("maf_compaction_last_pass", default=None)


#: Whether any client was wrapped in this process: until one is, no pass copies its outcome (nothing would read it).
_wrapping = False


def publish(messages: Sequence[Message], history: History, config: StrategyConfig) -> None:
    """Record a pass's outcome (``messages`` as the pass left them, index for index with ``history``) for the
    requests this task sends next, once :func:`cache_breakpoints` wrapped a client."""
    if _wrapping:
        _LAST_PASS.set(_Published(tuple(messages), history, config))


def cache_breakpoints(client: C) -> C:
    """Mark the prompt cache of an agent-framework-anthropic ``client`` where our strategies keep the bytes.

    Wraps the client's SDK call (``client.anthropic_client.beta.messages.create``) once:
    every request that follows one of our compaction passes in the same task carries up to
    three ``cache_control`` marks: the end of the head, the end of the compacted run the
    next decisions build after, and the last message (left to the request-level
    ``cache_control`` when the options carry it). Marks the request already carries (your
    system blocks, tools, the automatic one) count first, so a request never exceeds
    Anthropic's four. Returns ``client``; wrapping it again changes nothing.

    Raises:
        TypeError: ``client`` is not an agent-framework-anthropic client (no ``anthropic_client``).
    """
    sdk = getattr(client, "anthropic_client", None)
    resource = getattr(getattr(sdk, "beta", None), "messages", None)
    create = getattr(resource, "create", None)
    if resource is None or create is None:
        raise TypeError(
            "cache_breakpoints expects an agent-framework-anthropic client (AnthropicClient, or its Foundry, "
            f"Bedrock or Vertex sibling) with an anthropic_client; got {type(client).__name__}"
        )
    if getattr(create, _WRAPPED, False):
        return client
    global _wrapping  # noqa: PLW0603 - one switch for the process: passes publish from now on
    _wrapping = True
    resource.create = _wrapped(create)
    return client


def _wrapped(create: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(create)
    async def marked(*args: Any, **kwargs: Any) -> Any:
        published = _LAST_PASS.get()
        if published is not None and isinstance(kwargs.get("messages"), list):
            kwargs["messages"] = mark(kwargs, published)
        return await create(*args, **kwargs)

    setattr(marked, _WRAPPED, True)
    return marked


def mark(body: Mapping[str, Any], published: _Published) -> list[Any]:
    """``body["messages"]`` with the marks ``published`` calls for added (new block dicts; the rest shared)."""
    messages = cast(list[Any], body["messages"])
    automatic = body.get("cache_control") is not None
    room = MAX_BREAKPOINTS - _marks_in(body)
    wanted = strategy_marks(published.config, published.history).ordered(last=not automatic)
    keys = [k for k in (_message_key(published.messages[i]) for i in sorted(wanted[: max(room, 0)])) if k]
    blocks = [(m, b) for m, message in enumerate(messages) for b in range(len(_blocks(message)))]
    found: list[tuple[int, int]] = []
    cursor = 0
    for key in keys:
        at = next(
            (k for k in range(cursor, len(blocks)) if _block_key(_blocks(messages[blocks[k][0]])[blocks[k][1]]) == key),
            None,
        )
        if at is None:
            logger.debug("maf_compaction: no block of this request matches a cache mark's message; mark skipped")
            continue
        found.append(blocks[at])
        cursor = at + 1
    if not found:
        return messages
    # Ours stand before the automatic mark: with its TTL, so a longer TTL never follows a shorter one.
    automatic_mark = body.get("cache_control")
    control = dict(automatic_mark) if isinstance(automatic_mark, Mapping) else dict(EPHEMERAL)
    marked = list(messages)
    for m, b in found:
        message = dict(marked[m])
        content = list(_blocks(message))
        content[b] = {**content[b], "cache_control": dict(control)}
        message["content"] = content
        marked[m] = message
    return marked


def _blocks(message: Any) -> list[Any]:
    content = message.get("content") if isinstance(message, Mapping) else None
    return cast(list[Any], content) if isinstance(content, list) else []


def _marks_in(body: Mapping[str, Any]) -> int:
    """The ``cache_control`` marks ``body`` carries already: the request-level one, tools, system and message blocks."""
    system = body.get("system")
    blocks = [
        *cast(list[Any], body.get("tools") or []),
        *(cast(list[Any], system) if isinstance(system, list) else []),
        *(block for message in cast(list[Any], body.get("messages") or []) for block in _blocks(message)),
    ]
    marked = sum(1 for block in blocks if isinstance(block, Mapping) and block.get("cache_control") is not None)
    return marked + (body.get("cache_control") is not None)


def _block_key(block: Any) -> _Key | None:
    """What names a wire block: its tool call id, or its text (thinking and media are never marked)."""
    if not isinstance(block, Mapping):
        return None
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        return ("text", text) if isinstance(text, str) and text else None
    if kind in ("tool_use", "mcp_tool_use"):
        return (kind, str(block.get("id")))
    if kind in ("tool_result", "mcp_tool_result"):
        return (kind, str(block.get("tool_use_id")))
    return None


#: The wire block type each content type becomes (agent-framework-anthropic's conversion).
_WIRE_TYPES: Final = {
    "function_call": "tool_use",
    "function_result": "tool_result",
    "mcp_server_tool_call": "mcp_tool_use",
    "mcp_server_tool_result": "mcp_tool_result",
}


def _message_key(message: Message) -> _Key | None:
    """The key of the last block ``message`` becomes that a mark may sit on (``None``: none may)."""
    for content in reversed(message.contents):
        if content.type == "text" and content.text:
            return ("text", content.text)
        wire = _WIRE_TYPES.get(content.type)
        if wire is not None and content.call_id:
            return (wire, content.call_id)
    return None
