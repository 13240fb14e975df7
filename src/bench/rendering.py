"""What a provider receives: each request rendered canonically, entry by entry.

Instructions, tool declarations, then one entry per message (role and the model-facing
fields of its contents; ids and ``additional_properties`` never reach a provider). A request
that does not start with every entry of the previous one breaks the cached prefix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_framework import Content, FunctionTool, Message

from ..core.model import MEDIA_KINDS


def render_content(content: Content) -> str:
    """The model-facing fields of one content part, as one canonical string."""
    kind = content.type
    if kind in ("text", "text_reasoning"):
        return content.text or ""
    if kind == "function_call":
        return f"call {content.call_id} {content.name}({_json(content.arguments)})"
    if kind == "function_result":
        # ``exception`` stays on the host: clients send only the result.
        result = content.result if isinstance(content.result, str) else _json(content.result)
        return f"result {content.call_id}: {result}"
    if kind in MEDIA_KINDS:
        return f"[{kind} {content.media_type or ''} {content.uri or content.file_id or ''}]"
    payload = content.to_dict(exclude_none=True)
    for key in ("raw_representation", "additional_properties"):
        payload.pop(key, None)
    return _json(payload)


def render_message(message: Message) -> str:
    """One message as the provider sees it: role, then each content part on its own line."""
    return "\n".join([f"<|{message.role}|>", *(render_content(c) for c in message.contents)])


def render_instructions(options: Mapping[str, Any]) -> str | None:
    """The request's instructions as a leading system entry, or ``None`` without any."""
    instructions = options.get("instructions")
    return f"<|system|>\n{instructions}" if instructions else None


def render_tools(options: Mapping[str, Any]) -> str | None:
    """The request's tool declarations (JSON schema specs) as one entry, or ``None`` without tools."""
    tools: Sequence[object] = options.get("tools") or ()
    if not tools:
        return None
    specs = [t.to_json_schema_spec() if isinstance(t, FunctionTool) else t for t in tools]
    return f"<|tools|>\n{_json(specs)}"


def _json(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True, slots=True)
class RenderedRequest:
    """A request, canonically rendered.

    Attributes:
        instructions: The instructions entry, or ``None``.
        tools: The tool declarations entry, or ``None``.
        messages: One entry per request message, in order.
    """

    instructions: str | None
    tools: str | None
    messages: tuple[str, ...]

    @classmethod
    def of(cls, messages: Sequence[Message], options: Mapping[str, Any]) -> RenderedRequest:
        """Render ``messages`` and ``options`` as the provider receives them."""
        return cls(
            instructions=render_instructions(options),
            tools=render_tools(options),
            messages=tuple(render_message(m) for m in messages),
        )

    @property
    def preamble(self) -> tuple[str, ...]:
        """The entries before the messages: instructions and tool declarations, when present."""
        return tuple(entry for entry in (self.instructions, self.tools) if entry is not None)

    @property
    def entries(self) -> tuple[str, ...]:
        """The whole prompt: the preamble, then the messages."""
        return (*self.preamble, *self.messages)


def common_prefix(previous: Sequence[str], current: Sequence[str]) -> int:
    """Number of leading entries ``current`` shares with ``previous``."""
    shared = 0
    for before, now in zip(previous, current, strict=False):
        if before != now:
            break
        shared += 1
    return shared
