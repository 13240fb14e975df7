"""What a provider receives: each request as one canonical value, whichever way it was sent.

A request is its *head* (the model-facing top-level fields: ``tool_choice``, ``parallel_tool_calls``,
reasoning settings...), its tool declarations, its system text (the instructions) and one entry per
message (role and the model-facing fields of its contents; ids and ``additional_properties`` never
reach a provider). The in-process client builds it from the framework's messages and options
(:meth:`RenderedRequest.of`); the loopback server builds the same value from the wire JSON
(``loopback.render_wire_request``), so both are priced by one rule (``docs/bench.md``, "One cache
model").

An opaque provider payload (encrypted reasoning) is model-facing state but not prompt text: it
renders as a marker that the simulated provider counts as zero tokens and mixes into the prefix
identity, so a changed payload still breaks the prefix.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agent_framework import Content, FunctionTool, Message

from ..core.model import MEDIA_KINDS

#: Where an opaque payload sits in an entry: ``\x00opaque:<hex>\x00`` (no text can contain NUL).
OPAQUE_MARKER: Final = re.compile("\x00opaque:([0-9a-f]+)\x00")

#: Head fields whose change invalidates Anthropic's message blocks only (its cache table: ``tool_choice``,
#: thinking parameters; ``parallel_tool_calls`` is part of Anthropic's ``tool_choice``). Every other
#: head field is a system-level setting (it invalidates the system layer and the messages).
MESSAGE_LAYER_FIELDS: Final = frozenset({"tool_choice", "parallel_tool_calls", "reasoning", "thinking"})

#: A head field's value that is the APIs' default, so sending it or not is the same request.
_HEAD_DEFAULTS: Final[Mapping[str, object]] = {
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "text": {"format": {"type": "text"}},
}

#: Framework chat options that reach the model, and their wire names.
_MODEL_FACING_OPTIONS: Final[Mapping[str, str]] = {
    "tool_choice": "tool_choice",
    "allow_multiple_tool_calls": "parallel_tool_calls",
    "response_format": "response_format",
    "reasoning": "reasoning",
    "thinking": "thinking",
}


def opaque(*payload: str) -> str:
    """The marker of an opaque payload: identity without tokens (see the module docstring)."""
    digest = hashlib.sha256("\x1f".join(payload).encode()).hexdigest()[:32]
    return f"\x00opaque:{digest}\x00"


def _arguments(arguments: object) -> str:
    """A call's arguments as canonical JSON (a JSON string is parsed first, so spacing never matters)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return _json(arguments)


def render_content(content: Content) -> str:
    """The model-facing fields of one content part, as one canonical string."""
    kind = content.type
    if kind == "text":
        return content.text or ""
    if kind == "text_reasoning":
        if content.protected_data:  # encrypted reasoning: identity only; its summary is display text
            return opaque(content.protected_data, content.text or "")
        return content.text or ""
    if kind == "function_call":
        return f"call {content.call_id} {content.name}({_arguments(content.arguments)})"
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


def render_message(message: Message, *, name: str | None = None) -> str:
    """One message as the provider sees it: role (and a participant ``name``), then each part on its own line.

    A message of opaque reasoning alone renders as its markers only (no role line), so it adds
    identity but no tokens.
    """
    parts = [render_content(c) for c in message.contents]
    if parts and all(OPAQUE_MARKER.fullmatch(p) for p in parts):
        return "".join(parts)
    role = f"{message.role} name={name}" if name else str(message.role)
    return "\n".join([f"<|{role}|>", *parts])


def render_instructions(options: Mapping[str, Any]) -> str | None:
    """The request's instructions as the system entry, or ``None`` without any."""
    instructions = options.get("instructions")
    return system_entry(instructions) if isinstance(instructions, str) else None


def system_entry(text: str) -> str | None:
    """The system entry for instructions ``text`` (``None`` when empty)."""
    return f"<|system|>\n{text}" if text else None


def tool_spec(tool: object) -> dict[str, Any]:
    """A tool declaration in one form for every API: its name, description and parameters.

    Accepts a ``FunctionTool``, the Chat Completions form (``{"type": "function", "function":
    {...}}``) and the Responses form (``{"type": "function", "name": ...}``); fields that only
    steer validation (``strict``, ``type``) are not part of the declaration the model reads.
    """
    spec: Any = tool.to_json_schema_spec() if isinstance(tool, FunctionTool) else tool
    if isinstance(spec, Mapping) and isinstance(function := spec.get("function"), Mapping):  # pyright: ignore[reportUnknownMemberType]
        spec = function
    if not isinstance(spec, Mapping):
        return {"tool": _json(spec)}
    fields: Mapping[str, Any] = spec  # pyright: ignore[reportUnknownVariableType]
    return {key: value for key, value in fields.items() if key not in ("strict", "type")}


def render_tools(tools: Sequence[object] | None) -> str | None:
    """The request's tool declarations as one entry, or ``None`` without tools."""
    if not tools:
        return None
    return f"<|tools|>\n{_json([tool_spec(t) for t in tools])}"


def normalize_tool_choice(value: object) -> object:
    """Either API's ``tool_choice`` (or the framework's) in the framework form.

    ``{"type": "function", "name": n}`` (Responses) and ``{"type": "function", "function":
    {"name": n}}`` (Chat) become ``{"mode": "required", "required_function_name": n}``; an
    ``allowed_tools`` choice becomes ``{"mode": ..., "allowed_tools": [names]}``.
    """
    if not isinstance(value, Mapping):
        return value
    data: Mapping[str, Any] = value  # pyright: ignore[reportUnknownVariableType]

    def name_of(tool: object) -> object:
        found: Mapping[str, Any] = tool if isinstance(tool, Mapping) else {}  # pyright: ignore[reportUnknownVariableType]
        function = found.get("function")
        return found.get("name", function.get("name") if isinstance(function, Mapping) else None)  # pyright: ignore[reportUnknownMemberType]

    if data.get("type") == "function" and isinstance(name := name_of(data), str):
        return {"mode": "required", "required_function_name": name}
    if data.get("type") == "allowed_tools":
        inner = data.get("allowed_tools")
        allowed: Mapping[str, Any] = inner if isinstance(inner, Mapping) else data  # pyright: ignore[reportUnknownVariableType]
        tools = allowed.get("tools")
        names = [name_of(tool) for tool in (tools if isinstance(tools, list) else [])]  # pyright: ignore[reportUnknownVariableType]
        return {"mode": allowed.get("mode", "auto"), "allowed_tools": [n for n in names if isinstance(n, str)]}
    return dict(data)


def _plain_mode(choice: object) -> object:
    """A framework ``{"mode": m}`` with nothing else is the wire's plain ``m`` (``validate_tool_mode`` turns
    ``"auto"`` into ``{"mode": "auto"}`` in process; clients send ``"auto"``)."""
    if isinstance(choice, Mapping) and set(choice) == {"mode"}:  # pyright: ignore[reportUnknownArgumentType]
        mode: object = choice["mode"]  # pyright: ignore[reportUnknownVariableType]
        return mode
    return choice


def canonical_head(fields: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    """Model-facing head fields as sorted ``(name, canonical JSON)`` pairs, API defaults and nulls left out."""
    head: list[tuple[str, str]] = []
    for name, raw in fields.items():
        value = _plain_mode(normalize_tool_choice(raw)) if name == "tool_choice" else raw
        if value is None or _HEAD_DEFAULTS.get(name, object()) == value:
            continue
        head.append((name, _json(value)))
    return tuple(sorted(head))


def media_count(messages: Sequence[Message]) -> int:
    """Media parts anywhere in ``messages``, tool results included."""
    count = 0
    for message in messages:
        for content in message.contents:
            if content.type in MEDIA_KINDS:
                count += 1
            elif content.type == "function_result" and isinstance(content.result, list):
                items: list[Any] = content.result  # pyright: ignore[reportUnknownVariableType]
                count += sum(1 for item in items if isinstance(item, Content) and item.type in MEDIA_KINDS)
    return count


def _json(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True, slots=True)
class RenderedRequest:
    """A request, canonically rendered.

    Attributes:
        instructions: The system entry (the instructions), or ``None``.
        tools: The tool declarations entry, or ``None``.
        messages: One entry per request message, in order.
        head: The model-facing top-level fields, sorted ``(name, canonical JSON)`` pairs
            (API defaults left out, so ``tool_choice="auto"`` sent or not is one request).
        media: Media parts anywhere in the prompt (Anthropic invalidates its message cache
            when images are added or removed).
    """

    instructions: str | None
    tools: str | None
    messages: tuple[str, ...]
    head: tuple[tuple[str, str], ...] = ()
    media: int = 0

    @classmethod
    def of(cls, messages: Sequence[Message], options: Mapping[str, Any]) -> RenderedRequest:
        """Render ``messages`` and the framework chat ``options`` as the provider receives them."""
        fields = {wire: options[name] for name, wire in _MODEL_FACING_OPTIONS.items() if name in options}
        return cls(
            instructions=render_instructions(options),
            tools=render_tools(options.get("tools")),
            messages=tuple(render_message(m) for m in messages),
            head=canonical_head(fields),
            media=media_count(messages),
        )

    @property
    def preamble(self) -> tuple[str, ...]:
        """The entries before the messages, in the providers' cache order: tool declarations, then the system."""
        return tuple(entry for entry in (self.tools, self.instructions) if entry is not None)

    @property
    def entries(self) -> tuple[str, ...]:
        """The prompt text: the preamble, then the messages."""
        return (*self.preamble, *self.messages)

    def head_json(self, *, without: frozenset[str] = frozenset(), only: frozenset[str] | None = None) -> str:
        """The head fields as one canonical JSON object (``without`` some, or ``only`` some)."""
        return _json({k: v for k, v in self.head if k not in without and (only is None or k in only)})


def common_prefix(previous: Sequence[str], current: Sequence[str]) -> int:
    """Number of leading entries ``current`` shares with ``previous``."""
    shared = 0
    for before, now in zip(previous, current, strict=False):
        if before != now:
            break
        shared += 1
    return shared
