"""Measuring what a provider's prompt cache would see: prompt size, prefix reuse, breaks.

A request is rendered canonically: the instructions as a leading system entry, the tool
declarations as one entry, then one entry per message holding its role and the
model-facing fields of its contents (text, a call's name and arguments, a result's
text, a media reference). Message ids and ``additional_properties`` never reach a
provider, so they are not rendered. Prefix
reuse is the longest run of leading entries a request shares with the previous one,
in tokens; a request that does not extend the previous one is a *break* (a compaction
event, from the cache's point of view).

Tokens are counted with the tokenizer the caller passes (the demo and tests use
tiktoken's ``o200k_base``), independently of any strategy's counter. The budget check
is different on purpose: it uses the strategies' own basis
(:meth:`MediaTokenEstimator.count_message_tokens`), because that is what a strategy
promises to keep under its budget.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_framework import Content, FunctionTool, Message

from ..adapters.counting import MediaTokenEstimator, Tokenizer
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


class PromptMeter:
    """Counts tokens of rendered entries with one tokenizer, remembering each entry's count."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._counts: dict[str, int] = {}

    def tokens(self, entry: str) -> int:
        """Tokens of one rendered entry."""
        count = self._counts.get(entry)
        if count is None:
            count = self._counts[entry] = self._tokenizer.count_tokens(entry)
        return count

    def prompt_tokens(self, request: RenderedRequest) -> int:
        """Tokens of the whole rendered request."""
        return sum(self.tokens(entry) for entry in request.entries)


def common_prefix(previous: Sequence[str], current: Sequence[str]) -> int:
    """Number of leading entries ``current`` shares with ``previous``."""
    shared = 0
    for before, now in zip(previous, current, strict=False):
        if before != now:
            break
        shared += 1
    return shared


@dataclass(frozen=True, slots=True)
class CallMeasure:
    """One model call, measured against the call before it.

    Attributes:
        number: 1-based call number.
        prompt_tokens: Tokens of the rendered request.
        reused_tokens: Tokens of the prefix shared with the previous request.
        breaks: The request is not a prefix extension of the previous one.
        first_change: Index of the first request message that differs from the
            previous request (``None`` when it extends it; ``0`` when the instructions
            or tools changed, since everything after them is re-billed).
        basis_tokens: The request messages counted on the strategies' own basis.
    """

    number: int
    prompt_tokens: int
    reused_tokens: int
    breaks: bool
    first_change: int | None
    basis_tokens: int

    @property
    def reuse_share(self) -> float:
        """Share of this prompt identical to the previous request's prefix."""
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def measure_calls(
    requests: Sequence[tuple[Sequence[Message], Mapping[str, Any]]],
    meter: PromptMeter,
    basis: MediaTokenEstimator,
) -> list[CallMeasure]:
    """Measure each ``(messages, options)`` request against the one before it."""
    measures: list[CallMeasure] = []
    previous: RenderedRequest | None = None
    for number, (messages, options) in enumerate(requests, start=1):
        current = RenderedRequest.of(messages, options)
        measures.append(_measure(number, previous, current, meter, sum(map(basis.count_message_tokens, messages))))
        previous = current
    return measures


def _measure(
    number: int,
    previous: RenderedRequest | None,
    current: RenderedRequest,
    meter: PromptMeter,
    basis_tokens: int,
) -> CallMeasure:
    prompt = meter.prompt_tokens(current)
    if previous is None:
        return CallMeasure(number, prompt, 0, breaks=False, first_change=None, basis_tokens=basis_tokens)
    before, now = previous.entries, current.entries
    shared = common_prefix(before, now)
    reused = sum(meter.tokens(entry) for entry in now[:shared])
    breaks = shared < len(before)
    first_change: int | None = None
    if breaks:
        preamble_kept = previous.preamble == current.preamble
        first_change = common_prefix(previous.messages, current.messages) if preamble_kept else 0
    return CallMeasure(number, prompt, reused, breaks=breaks, first_change=first_change, basis_tokens=basis_tokens)


@dataclass(frozen=True, slots=True)
class RunSummary:
    """The figures of one run, for the summary table.

    Attributes:
        model_calls: Requests the provider received.
        prompt_tokens: Sum of prompt tokens over all requests.
        reused_tokens: Sum of reused prefix tokens over all requests.
        breaks: Requests that are not a prefix extension of the previous one.
        max_prompt: The largest prompt, in tokens.
        over_budget: Requests whose messages exceed the budget on the strategies' basis.
        median_kept_at_break: Median share of the prompt reused by the breaking requests
            (``None`` without breaks): how deep a typical break cuts.
    """

    model_calls: int
    prompt_tokens: int
    reused_tokens: int
    breaks: int
    max_prompt: int
    over_budget: int
    median_kept_at_break: float | None

    @property
    def reuse_share(self) -> float:
        """Prefix reuse overall: reused tokens over prompt tokens."""
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def billed_input(self, cached_price: float = 0.1) -> float:
        """Input tokens billed when a reused token costs ``cached_price`` of an uncached one."""
        return self.prompt_tokens - self.reused_tokens + cached_price * self.reused_tokens


def summarize(measures: Sequence[CallMeasure], budget: int) -> RunSummary:
    """Sum ``measures`` up; ``budget`` is the input budget on the strategies' basis."""
    kept = sorted(m.reuse_share for m in measures if m.breaks)
    return RunSummary(
        model_calls=len(measures),
        prompt_tokens=sum(m.prompt_tokens for m in measures),
        reused_tokens=sum(m.reused_tokens for m in measures),
        breaks=sum(m.breaks for m in measures),
        max_prompt=max((m.prompt_tokens for m in measures), default=0),
        over_budget=sum(m.basis_tokens > budget for m in measures),
        median_kept_at_break=kept[len(kept) // 2] if kept else None,
    )
