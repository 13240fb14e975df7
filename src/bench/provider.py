"""The simulated provider: renders each request, counts it (o200k_base), caches it, bills it.

A request over the window is a disqualification, counted while the call is still answered;
the rules: ``docs/bench.md``, "The simulated provider".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from .rendering import RenderedRequest, common_prefix
from .simulator import AnthropicCache, OpenAICache, PriceProfile, bill

CacheKind = Literal["openai", "anthropic"]
CallKind = Literal["model", "summarizer"]
CACHE_KINDS: tuple[CacheKind, ...] = ("openai", "anthropic")


class Encoder(Protocol):
    """Anything that turns text into token ids (``TiktokenTokenizer`` does)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        ...


@dataclass(frozen=True, slots=True)
class CallRecord:
    """What one call cost and what the cache made of it.

    Attributes:
        kind: ``"model"`` (the agent's own calls) or ``"summarizer"`` (a strategy's).
        turn: 1-based number of the user turn the call belongs to (0 when unknown).
        input_tokens: Tokens of the rendered request.
        cached_tokens: Of those, served from the cache.
        written_tokens: Tokens written to the cache at a premium (Anthropic).
        output_tokens: Tokens of the rendered reply.
        cost: Dollars, at the provider's price profile.
        over_window: The request exceeded the context window (a DQ).
        broke: The request is not a prefix extension of the previous request of its kind.
    """

    kind: CallKind
    turn: int
    input_tokens: int
    cached_tokens: int
    written_tokens: int
    output_tokens: int
    cost: float
    over_window: bool
    broke: bool


@dataclass(slots=True)
class SimulatedProvider:
    """One conversation's provider: a cache, a price profile and a window.

    Args:
        encoder: Tokenizes rendered entries (tiktoken ``o200k_base``).
        window: The context window in tokens.
        profile: The prices.
        cache: ``"openai"`` or ``"anthropic"``.
    """

    encoder: Encoder
    window: int
    profile: PriceProfile
    cache: CacheKind = "openai"
    calls: list[CallRecord] = field(default_factory=list[CallRecord])
    turn: int = 0
    _tokens: dict[str, tuple[int, ...]] = field(default_factory=dict[str, tuple[int, ...]])
    _openai: OpenAICache = field(default_factory=OpenAICache)
    _anthropic: AnthropicCache = field(default_factory=AnthropicCache)
    _previous: dict[CallKind, tuple[str, ...]] = field(default_factory=dict[CallKind, tuple[str, ...]])

    def __post_init__(self) -> None:
        if self.cache not in CACHE_KINDS:
            raise ValueError(f"cache must be one of {', '.join(CACHE_KINDS)}, got {self.cache!r}")
        if self.window < 1:
            raise ValueError(f"window must be a positive integer, got {self.window!r}")

    def tokens(self, entry: str) -> tuple[int, ...]:
        """Token ids of one rendered entry (memoized: entries repeat on every call)."""
        ids = self._tokens.get(entry)
        if ids is None:
            ids = self._tokens[entry] = tuple(self.encoder.encode(entry))
        return ids

    def count(self, text: str) -> int:
        """Tokens of ``text`` on the provider's own count."""
        return len(self.tokens(text))

    def call(self, request: RenderedRequest, *, output: str, kind: CallKind = "model") -> CallRecord:
        """Account one call: cache lookup, DQ check and bill."""
        sequence: list[int] = []
        boundaries: list[int] = []
        for entry in request.entries:
            sequence.extend(self.tokens(entry))
            boundaries.append(len(sequence))
        if self.cache == "openai":
            result = self._openai.lookup_and_store(sequence)
        else:
            result = self._anthropic.lookup_and_store(sequence, _breakpoints(boundaries, len(request.preamble)))
        output_tokens = self.count(output)
        previous, entries = self._previous.get(kind), request.entries
        broke = previous is not None and common_prefix(previous, entries) < len(previous)
        self._previous[kind] = entries
        record = CallRecord(
            kind=kind,
            turn=self.turn,
            input_tokens=result.input_tokens,
            cached_tokens=result.cached_tokens,
            written_tokens=result.written_tokens,
            output_tokens=output_tokens,
            cost=bill(self.profile, result, output_tokens),
            over_window=result.input_tokens > self.window,
            broke=broke,
        )
        self.calls.append(record)
        return record


def _breakpoints(boundaries: Sequence[int], preamble: int) -> list[int]:
    """Anthropic breakpoints: the end of the preamble and the end of the last message."""
    points: list[int] = []
    if preamble and boundaries[preamble - 1] > 0:
        points.append(boundaries[preamble - 1])
    if boundaries and boundaries[-1] > 0 and (not points or boundaries[-1] > points[-1]):
        points.append(boundaries[-1])
    return points
