"""The simulated provider: counts each canonical request (o200k_base), caches it by a rule, bills it.

A request over the window is a disqualification, counted while the call is still answered;
the rules: ``docs/bench.md``, "The simulated provider" and "One cache model".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

from .causes import Break, break_cause
from .rendering import MESSAGE_LAYER_FIELDS, OPAQUE_MARKER, RenderedRequest, common_prefix
from .simulator import AnthropicCache, BreakpointResult, OpenAICache, PriceProfile, Salt, bill, bill_breakpoints

CacheKind = Literal["openai", "openai-free-tool-choice", "anthropic"]
CallKind = Literal["model", "summarizer"]
CACHE_KINDS: tuple[CacheKind, ...] = ("openai", "openai-free-tool-choice", "anthropic")

CACHE_RULES: Final[Mapping[CacheKind, str]] = {
    "openai": "OpenAI: exact prefix of the whole request; a change of any model-facing head field "
    "(tool_choice included) misses the whole prompt",
    "openai-free-tool-choice": "OpenAI, tool_choice free: as openai, but tool_choice is not part of the "
    "cached prefix (the other side of an undocumented question)",
    "anthropic": "Anthropic: layered tools -> system -> messages, breakpoints at the end of the system and "
    "of the last message, writes at the write price; tool_choice, thinking and images invalidate the messages",
}
"""One line per cache rule, for every report (the rules: ``docs/bench.md``, "One cache model")."""


def default_profile(cache: CacheKind) -> str:
    """The price profile a rule runs with unless another is named: Anthropic's bills its cache writes."""
    return "anthropic-5m" if cache == "anthropic" else "default"


#: Seconds a cache entry lives unused: OpenAI keeps a prefix "5 to 10 minutes of inactivity" (the short end),
#: Anthropic 5 minutes by default; reads refresh both.
DEFAULT_TTL: Final = 300.0
#: Anthropic's extended cache lives an hour (written at 2x: the ``anthropic-1h`` price profile).
LONG_TTL: Final = 3_600.0


def default_ttl(profile: str) -> float:
    """How long a cache entry lives unused under a price profile (``anthropic-1h`` buys an hour)."""
    return LONG_TTL if profile == "anthropic-1h" else DEFAULT_TTL


#: Seconds a call takes before its first token, and output tokens per second after it: the provider's clock
#: moves by this much per call, so a long tool loop ages the cache as it would.
CALL_SECONDS: Final = 1.0
OUTPUT_TOKENS_PER_SECOND: Final = 60.0

#: The label of an agent's own call; any other label names a compaction request (``record``, ``summary``...).
TASK: Final = "task"


@dataclass(frozen=True, slots=True)
class Layout:
    """One request as a cache rule sees it.

    Attributes:
        tokens: The prompt's token ids, in the rule's order (tools, system, messages).
        salts: Keys mixed into the prefix identity at token offsets (head fields, opaque payloads).
        preamble_end: Tokens of the tools and system entries.
        identity: The request's entries with its keys in place, for telling breaks.
    """

    tokens: tuple[int, ...]
    salts: tuple[Salt, ...]
    preamble_end: int
    identity: tuple[str, ...]


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
        output_tokens: Tokens of the rendered reply, reasoning included (billed as output).
        cost: Dollars, at the provider's price profile.
        over_window: The request exceeded the context window (a DQ).
        broke: The request is not a prefix extension of the previous request of its kind.
        pinned: The request's ``tool_choice`` forces a function (a pinned record).
        cause: When the call broke, the first element that differs from the previous request
            (:func:`~.breaks.break_cause`); ``None`` otherwise.
        label: :data:`TASK` for the agent's own calls; for a compaction request, what the model
            took it for (``record``, ``summary``, ``record+summary``, ``merge``, ``rewrite``, ``fold``).
        reasoning_tokens: Of ``output_tokens``, the model's reasoning.
        instruction_tokens: Of ``input_tokens``, the compaction instruction: the message a request
            over the cached prefix ends with, or a summarizer request's system prompt.
        expiry_cost: Of ``cost``, what cache entries that expired since their last use added.
        at: The provider's clock when the call arrived, in seconds.
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
    pinned: bool = False
    cause: Break | None = None
    label: str = TASK
    reasoning_tokens: int = 0
    instruction_tokens: int = 0
    expiry_cost: float = 0.0
    at: float = 0.0

    @property
    def compaction(self) -> bool:
        """The call is a compaction request (a record, a summary...), not one of the agent's own."""
        return self.label != TASK


@dataclass(slots=True)
class SimulatedProvider:
    """One conversation's provider: a cache, a price profile and a window.

    Args:
        encoder: Tokenizes rendered entries (tiktoken ``o200k_base``).
        window: The context window in tokens.
        profile: The prices.
        cache: The cache rule (:data:`CACHE_RULES`).
        keep_requests: Keep every priced request in :attr:`requests` (to re-price a run under
            another rule, as the agreement tests do).
        ttl: Seconds a cache entry lives unused (:data:`DEFAULT_TTL`); ``None``: nothing expires.
        clock: The provider's time in seconds: :meth:`pause` moves it (a user's think time), and
            so does every call (:data:`CALL_SECONDS`, :data:`OUTPUT_TOKENS_PER_SECOND`).
    """

    encoder: Encoder
    window: int
    profile: PriceProfile
    cache: CacheKind = "openai"
    keep_requests: bool = False
    ttl: float | None = None
    clock: float = 0.0
    calls: list[CallRecord] = field(default_factory=list[CallRecord])
    requests: list[RenderedRequest] = field(default_factory=list[RenderedRequest])
    turn: int = 0
    _tokens: dict[str, tuple[tuple[int, ...], tuple[Salt, ...]]] = field(
        default_factory=dict[str, tuple[tuple[int, ...], tuple[Salt, ...]]]
    )
    _openai: OpenAICache = field(init=False)
    _anthropic: AnthropicCache = field(init=False)
    _previous: dict[CallKind, tuple[tuple[str, ...], RenderedRequest]] = field(
        default_factory=dict[CallKind, tuple[tuple[str, ...], RenderedRequest]]
    )

    def __post_init__(self) -> None:
        if self.cache not in CACHE_KINDS:
            raise ValueError(f"cache must be one of {', '.join(CACHE_KINDS)}, got {self.cache!r}")
        if self.window < 1:
            raise ValueError(f"window must be a positive integer, got {self.window!r}")
        self._openai = OpenAICache(ttl=self.ttl)
        self._anthropic = AnthropicCache(ttl=self.ttl)

    def pause(self, seconds: float) -> None:
        """Let ``seconds`` pass with no call (a user reading and typing): cache entries age."""
        if not seconds >= 0:
            raise ValueError(f"seconds must be >= 0, got {seconds!r}")
        self.clock += seconds

    def tokens(self, entry: str) -> tuple[int, ...]:
        """Token ids of one rendered entry (memoized: entries repeat on every call); opaque markers count zero."""
        return self._encoded(entry)[0]

    def _encoded(self, entry: str) -> tuple[tuple[int, ...], tuple[Salt, ...]]:
        found = self._tokens.get(entry)
        if found is None:
            ids: list[int] = []
            salts: list[Salt] = []
            start = 0
            for marker in OPAQUE_MARKER.finditer(entry):
                ids.extend(self.encoder.encode(entry[start : marker.start()]) if marker.start() > start else ())
                salts.append((len(ids), marker.group(1).encode()))
                start = marker.end()
            ids.extend(self.encoder.encode(entry[start:]) if start < len(entry) else ())
            found = self._tokens[entry] = (tuple(ids), tuple(salts))
        return found

    def encoded(self, entry: str) -> tuple[tuple[int, ...], tuple[Salt, ...]]:
        """Token ids of one rendered entry and the salts of its opaque markers (at offsets into those ids)."""
        return self._encoded(entry)

    def count(self, text: str) -> int:
        """Tokens of ``text`` on the provider's own count."""
        return len(self.tokens(text))

    def layout(self, request: RenderedRequest) -> Layout:
        """``request`` as this provider's cache rule sees it (``docs/bench.md``, "One cache model").

        Every rule reads the prompt in one order, tools, system, messages. ``openai`` keys the
        whole prefix by the head fields (a changed ``tool_choice`` misses everything);
        ``openai-free-tool-choice`` leaves ``tool_choice`` out of that key; ``anthropic`` keys each
        layer as its invalidation table says: the system-level fields between tools and system,
        the message-level ones (``tool_choice``, thinking) and the media count before the messages.
        """
        tokens: list[int] = []
        salts: list[Salt] = []
        identity: list[str] = []

        def key(layer: str, value: str) -> None:
            salts.append((len(tokens), f"{layer}:{value}".encode()))
            identity.append(f"\x00{layer} {value}")

        def entry(text: str) -> None:
            ids, inner = self._encoded(text)
            salts.extend((len(tokens) + offset, salt) for offset, salt in inner)
            tokens.extend(ids)
            identity.append(text)

        if self.cache == "anthropic":
            if request.tools is not None:
                entry(request.tools)
            key("system", request.head_json(without=MESSAGE_LAYER_FIELDS))
            if request.instructions is not None:
                entry(request.instructions)
            preamble_end = len(tokens)
            key("messages", f"{request.head_json(only=MESSAGE_LAYER_FIELDS)} media={request.media}")
        else:
            without = frozenset({"tool_choice"}) if self.cache == "openai-free-tool-choice" else frozenset[str]()
            key("head", request.head_json(without=without))
            for text in request.preamble:
                entry(text)
            preamble_end = len(tokens)
        for text in request.messages:
            entry(text)
        return Layout(tuple(tokens), tuple(salts), preamble_end, tuple(identity))

    def call(
        self,
        request: RenderedRequest,
        *,
        output: str,
        kind: CallKind = "model",
        label: str = TASK,
        instruction: bool = False,
        reasoning_tokens: int = 0,
        priced: BreakpointResult | None = None,
    ) -> CallRecord:
        """Account one call: cache lookup by the provider's rule, DQ check and bill.

        ``label`` says what the model took the request for (:data:`TASK`, or a compaction
        request's kind); ``instruction`` that it ends with a compaction instruction (a request
        over the cached prefix), which the next request never repeats, so breaks are judged
        against what came before it. ``reasoning_tokens`` are billed as output. ``priced``: the
        cache outcome a wire server computed from the breakpoints the request itself marks (the
        Anthropic loopback, ``docs/bench.md``); it replaces the rule's lookup and is billed by
        Anthropic's write prices (:func:`~.simulator.bill_breakpoints`).
        """
        if reasoning_tokens < 0:
            raise ValueError(f"reasoning_tokens must be >= 0, got {reasoning_tokens}")
        layout = self.layout(request)
        if priced is not None:
            result = priced.result
        elif self.cache == "anthropic":
            points = _breakpoints(layout.preamble_end, len(layout.tokens))
            result = self._anthropic.lookup_and_store(layout.tokens, points, layout.salts, now=self.clock)
        else:
            result = self._openai.lookup_and_store(layout.tokens, layout.salts, now=self.clock)
        output_tokens = self.count(output) + reasoning_tokens
        previous, entries = self._previous.get(kind), layout.identity
        broke = previous is not None and common_prefix(previous[0], entries) < len(previous[0])
        ignored = ("tool_choice",) if self.cache == "openai-free-tool-choice" else ()
        cause = break_cause(previous[1], request, ignore_head=ignored) if broke and previous is not None else None
        asked = instruction and bool(request.messages)
        self._previous[kind] = (entries[:-1] if asked else entries, request)
        if priced is not None:
            cost = bill_breakpoints(self.profile, priced, output_tokens)
            timeless = bill_breakpoints(self.profile, priced, output_tokens, timeless=True)
        else:
            cost = bill(self.profile, result, output_tokens)
            timeless = bill(self.profile, result.without_expiry(), output_tokens)
        record = CallRecord(
            kind=kind,
            turn=self.turn,
            input_tokens=result.input_tokens,
            cached_tokens=result.cached_tokens,
            written_tokens=result.written_tokens,
            output_tokens=output_tokens,
            cost=cost,
            over_window=result.input_tokens > self.window,
            broke=broke,
            pinned='"mode":"required"' in dict(request.head).get("tool_choice", ""),
            cause=cause,
            label=label,
            reasoning_tokens=reasoning_tokens,
            instruction_tokens=self._instruction_tokens(request, kind, label, asked),
            expiry_cost=cost - timeless,
            at=self.clock,
        )
        self.clock += CALL_SECONDS + output_tokens / OUTPUT_TOKENS_PER_SECOND
        self.calls.append(record)
        if self.keep_requests:
            self.requests.append(request)
        return record

    def _instruction_tokens(self, request: RenderedRequest, kind: CallKind, label: str, asked: bool) -> int:
        if asked:
            return self.count(request.messages[-1])
        if kind == "summarizer" and label != TASK:  # the summarizer's prompt: its system entries
            system = [e for e in (request.instructions, *request.messages) if e and e.startswith("<|system")]
            return sum(self.count(entry) for entry in system)
        return 0


def _breakpoints(preamble_end: int, end: int) -> list[int]:
    """Anthropic breakpoints: the end of the preamble (tools and system) and the end of the last message."""
    points = [preamble_end] if preamble_end > 0 else []
    if end > 0 and (not points or end > points[-1]):
        points.append(end)
    return points
