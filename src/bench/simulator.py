"""A simulated provider prompt cache and its billing, on token sequences (no agent_framework here).

The rules and their sources (``reference/caching-and-peers.md`` section 3, the providers'
own pages) and what is deliberately not simulated: ``docs/bench.md``, "The simulated provider".
"""

from __future__ import annotations

import bisect
import hashlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

OPENAI_MIN_CACHED_TOKENS = 1024
"""OpenAI caches nothing below 1,024 tokens (reference §3: "≥ 1,024 tokens")."""

OPENAI_HIT_INCREMENT = 128
"""OpenAI reports hits in 128-token increments (reference §3: "hits in 128-token increments")."""

ANTHROPIC_MIN_CACHEABLE_TOKENS = 1024
"""Anthropic's smallest minimum cacheable length (reference §3: 1,024 for Sonnet 4.5/4/3.7 and
Opus 4.1/4; 2,048 and 4,096 for other models, so it is a parameter of :class:`AnthropicCache`)."""

ANTHROPIC_MAX_BREAKPOINTS = 4
"""Anthropic accepts at most 4 ``cache_control`` breakpoints per request (reference §3: "≤ 4")."""

_MAX_TOKEN_ID = 2**64 - 1
_DIGEST_SIZE = 16


@dataclass(frozen=True, slots=True)
class CacheResult:
    """How one request's prompt tokens split between cache reads, cache writes and plain input.

    ``input_tokens`` is the whole prompt (as the providers' usage reports it, cached tokens
    included); ``cached_tokens`` of it were read from the cache and ``written_tokens`` were
    written to it (billed at the write price where the profile has one). The rest,
    :attr:`uncached_tokens`, is plain input. Where a cache entry's time to live ran out,
    :meth:`without_expiry` says what the request would have cost had it not.
    """

    cached_tokens: int
    input_tokens: int
    written_tokens: int = 0
    timeless_cached: int | None = None
    timeless_written: int | None = None

    def __post_init__(self) -> None:
        if self.input_tokens < 0:
            raise ValueError(f"input_tokens must be >= 0, got {self.input_tokens}")
        if not 0 <= self.cached_tokens <= self.input_tokens:
            raise ValueError(
                f"cached_tokens must be in [0, input_tokens={self.input_tokens}], got {self.cached_tokens}"
            )
        free = self.input_tokens - self.cached_tokens
        if not 0 <= self.written_tokens <= free:
            raise ValueError(
                f"written_tokens must be in [0, input_tokens - cached_tokens = {free}], got {self.written_tokens}"
            )

    def without_expiry(self) -> CacheResult:
        """The same request had no cache entry expired: what it would have read and written.

        ``timeless_cached`` and ``timeless_written`` hold those figures when an entry's
        time to live ran out before this request (``None``: nothing it could read had expired).
        """
        if self.timeless_cached is None:
            return self
        return CacheResult(self.timeless_cached, self.input_tokens, self.timeless_written or 0)

    @property
    def uncached_tokens(self) -> int:
        """Prompt tokens neither read from nor written to the cache, billed at the input price."""
        return self.input_tokens - self.cached_tokens - self.written_tokens

    @property
    def hit_ratio(self) -> float:
        """Share of the prompt served from the cache (0.0 for an empty prompt)."""
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0


def _validate_tokens(tokens: Sequence[int]) -> bytes:
    """Pack token ids as unsigned 64-bit integers, refusing anything that is not one."""
    try:
        return array("Q", tokens).tobytes()
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"tokens must be integers in [0, {_MAX_TOKEN_ID}]: {exc}") from exc


Salt = tuple[int, bytes]
"""A layer key mixed into the prefix identity at a token offset, adding no tokens: ``(offset, key)``.

A prefix ending at or before ``offset`` is not affected by the key; every longer prefix is. This is
how a request field that is not prompt text (``tool_choice``, a thinking setting, an opaque reasoning
payload) still decides which cached prefixes a request can read (``docs/bench.md``, "One cache model").
"""

_SALT_TAG = b"\xfe\xff salt \xff\xfe"


class _PrefixHasher:
    """Digests of the prefixes of one token sequence (and its salts), computed incrementally.

    Prefixes are compared by a 128-bit BLAKE2b digest of their packed token ids rather than
    token by token, so a lookup costs one pass over the request whatever the number of
    stored requests; at 128 bits an accidental collision is not a practical concern, and
    unlike Python's ``hash`` the digest is the same in every process (determinism). A salt
    at offset ``k`` is mixed in after the first ``k`` tokens, so it is part of every digest
    at an offset greater than ``k``.
    """

    __slots__ = ("_data", "_hash", "_next", "_pos", "_salts")

    def __init__(self, data: bytes, salts: Sequence[Salt] = ()) -> None:
        self._data = data
        self._hash = hashlib.blake2b(digest_size=_DIGEST_SIZE)
        self._pos = 0
        self._salts = sorted(((offset * 8, key) for offset, key in salts), key=lambda salt: salt[0])
        self._next = 0

    def _advance(self, end: int) -> None:
        self._hash.update(self._data[self._pos : end])
        self._pos = end

    def digest_at(self, offset: int) -> bytes:
        """Digest of ``tokens[:offset]`` and the salts before it; offsets must be asked in non-decreasing order."""
        end = offset * 8
        if end < self._pos:
            raise ValueError(f"offset must not decrease, got {offset} after {self._pos // 8}")
        while self._next < len(self._salts) and self._salts[self._next][0] < end:
            at, key = self._salts[self._next]
            self._advance(at)
            self._hash.update(_SALT_TAG + len(key).to_bytes(8, "little") + key)
            self._next += 1
        self._advance(end)
        return self._hash.copy().digest() + offset.to_bytes(8, "little")


def _check_salts(salts: Sequence[Salt], n: int) -> None:
    for offset, key in salts:
        if not isinstance(offset, int) or not 0 <= offset <= n or not isinstance(key, bytes):
            raise ValueError(f"salts must be (offset in [0, len(tokens)={n}], bytes) pairs, got {(offset, key)!r}")


def _check_ttl(ttl: float | None) -> None:
    if ttl is not None and not ttl > 0:
        raise ValueError(f"ttl must be None or a number of seconds > 0, got {ttl!r}")


def _expiry(hit: int, written: int, timeless_hit: int, timeless_written: int, n: int) -> CacheResult:
    """A cache outcome, with what an unexpired cache would have given when that differs."""
    if timeless_hit == hit:
        return CacheResult(cached_tokens=hit, input_tokens=n, written_tokens=written)
    return CacheResult(hit, n, written, timeless_cached=timeless_hit, timeless_written=timeless_written)


class OpenAICache:
    """OpenAI's automatic prompt cache for one simulated conversation.

    ``cached_tokens`` is the longest common prefix with any earlier request, rounded down to a
    multiple of ``increment`` (128), and 0 below ``min_tokens`` (1,024); every request is then
    stored. Each stored request keeps the digests of its prefixes ending on a 128-token
    boundary, so a lookup is one pass over the request whatever the number of requests. With
    ``count_writes=True`` the tail beyond the hit of a request of at least ``min_tokens`` tokens
    is reported as written (for profiles with a write price such as ``gpt-6-luna``).

    With a ``ttl`` (seconds), a stored prefix is read only if it was last used at most ``ttl``
    seconds before ``now``; every request refreshes each of its prefixes (OpenAI keeps a
    prefix "5 to 10 minutes of inactivity", so a read keeps it alive). Without one, nothing
    expires.
    """

    def __init__(
        self,
        *,
        min_tokens: int = OPENAI_MIN_CACHED_TOKENS,
        increment: int = OPENAI_HIT_INCREMENT,
        count_writes: bool = False,
        ttl: float | None = None,
    ) -> None:
        if increment < 1:
            raise ValueError(f"increment must be >= 1, got {increment}")
        if min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {min_tokens}")
        _check_ttl(ttl)
        self.min_tokens = min_tokens
        self.increment = increment
        self.count_writes = count_writes
        self.ttl = ttl
        self._used: dict[bytes, float] = {}

    def _fresh(self, digest: bytes, now: float) -> bool:
        used = self._used.get(digest)
        return used is not None and (self.ttl is None or now - used <= self.ttl)

    def lookup_and_store(self, tokens: Sequence[int], salts: Sequence[Salt] = (), *, now: float = 0.0) -> CacheResult:
        """Return the cache outcome of ``tokens`` (and its ``salts``) at time ``now``, then store it."""
        n = len(tokens)
        _check_salts(salts, n)
        hasher = _PrefixHasher(_validate_tokens(tokens), salts)
        hit = timeless = 0
        fresh = stored = True
        digests: list[bytes] = []
        for boundary in range(self.increment, n + 1, self.increment):
            digest = hasher.digest_at(boundary)
            digests.append(digest)
            stored = stored and digest in self._used
            fresh = fresh and stored and self._fresh(digest, now)
            timeless = boundary if stored else timeless
            hit = boundary if fresh else hit
        for digest in digests:
            self._used[digest] = now
        hit = hit if hit >= self.min_tokens else 0
        timeless = timeless if timeless >= self.min_tokens else 0

        def written(read: int) -> int:
            return n - read if self.count_writes and n >= self.min_tokens else 0

        return _expiry(hit, written(hit), timeless, written(timeless), n)


class AnthropicCache:
    """Anthropic's explicit (``cache_control``) prompt cache for one simulated conversation.

    A request comes as its token ids plus ``breakpoints``, the strictly increasing offsets where
    its marked blocks end (at most ``max_breakpoints``, 4; more raise ``ValueError``, as the API
    refuses them). No breakpoint, no caching. Each breakpoint ``b >= min_tokens`` writes
    ``tokens[:b]``; the written tokens billed are those from the hit to the newest breakpoint.
    The hit is the longest prefix an earlier request wrote that ends at or before this request's
    newest breakpoint; with ``lookback=True`` (default) that earlier breakpoint need not be
    marked again (Anthropic's ~20-block lookback, whose bound is not enforced), with
    ``lookback=False`` only this request's own breakpoints can hit.

    With a ``ttl`` (seconds: 300 for the default 5-minute cache, 3,600 for the 1-hour one), a
    written prefix is read only within ``ttl`` seconds of its last write or read; a read
    refreshes it, as Anthropic documents ("refreshed for no additional cost each time the
    cached content is used").
    """

    def __init__(
        self,
        *,
        min_tokens: int = ANTHROPIC_MIN_CACHEABLE_TOKENS,
        max_breakpoints: int = ANTHROPIC_MAX_BREAKPOINTS,
        lookback: bool = True,
        ttl: float | None = None,
    ) -> None:
        if min_tokens < 1:
            raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
        if max_breakpoints < 1:
            raise ValueError(f"max_breakpoints must be >= 1, got {max_breakpoints}")
        _check_ttl(ttl)
        self.min_tokens = min_tokens
        self.max_breakpoints = max_breakpoints
        self.lookback = lookback
        self.ttl = ttl
        self._written: dict[bytes, float] = {}  # digest -> last written or read
        self._written_offsets: list[int] = []  # sorted, distinct

    def _check_breakpoints(self, breakpoints: Sequence[int], n: int) -> list[int]:
        points = list(breakpoints)
        if len(points) > self.max_breakpoints:
            raise ValueError(f"breakpoints: at most {self.max_breakpoints} allowed, got {len(points)}")
        previous = 0
        for point in points:
            if not isinstance(point, int) or not previous < point <= n:
                raise ValueError(
                    f"breakpoints must be strictly increasing token offsets in [1, len(tokens)={n}], got {points}"
                )
            previous = point
        return points

    def lookup_and_store(
        self, tokens: Sequence[int], breakpoints: Sequence[int], salts: Sequence[Salt] = (), *, now: float = 0.0
    ) -> CacheResult:
        """Return the cache outcome of ``tokens`` marked at ``breakpoints`` (with ``salts``) at time ``now``,
        then store its writes."""
        data = _validate_tokens(tokens)
        n = len(tokens)
        points = self._check_breakpoints(breakpoints, n)
        _check_salts(salts, n)
        if not points:
            return CacheResult(cached_tokens=0, input_tokens=n)
        newest = points[-1]
        if self.lookback:
            limit = bisect.bisect_right(self._written_offsets, newest)
            candidates = sorted(set(self._written_offsets[:limit]) | set(points))
        else:
            candidates = points
        hasher = _PrefixHasher(data, salts)
        hit = timeless = 0
        digests: dict[int, bytes] = {}
        for offset in candidates:
            digest = hasher.digest_at(offset)
            digests[offset] = digest
            used = self._written.get(digest)
            if offset >= self.min_tokens and used is not None:
                timeless = offset
                if self.ttl is None or now - used <= self.ttl:
                    hit = offset
        if hit:
            self._written[digests[hit]] = now  # a read refreshes the entry
        for point in points:
            if point >= self.min_tokens:
                self._written[digests[point]] = now
                index = bisect.bisect_left(self._written_offsets, point)
                if index == len(self._written_offsets) or self._written_offsets[index] != point:
                    self._written_offsets.insert(index, point)

        def written(read: int) -> int:
            return newest - read if newest >= self.min_tokens else 0

        return _expiry(hit, written(hit), timeless, written(timeless), n)


ANTHROPIC_LOOKBACK_BLOCKS = 20
"""From each breakpoint Anthropic looks for an earlier cache entry at most 20 block boundaries back (the
breakpoint's own included); an entry further back is not found, so the request writes its prefix again."""

ANTHROPIC_WRITE_5M = 1.25
"""A token written to Anthropic's 5-minute cache costs 1.25x the input price (reference §3)."""

ANTHROPIC_WRITE_1H = 2.0
"""A token written to Anthropic's 1-hour cache costs 2x the input price (reference §3)."""

ANTHROPIC_TTLS: Mapping[str, float] = MappingProxyType({"5m": 300.0, "1h": 3_600.0})
"""The ``ttl`` values a ``cache_control`` mark may carry, in seconds (``5m`` when it names none)."""


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """One ``cache_control`` mark of a request: where its block ends and how long its entry lives.

    Attributes:
        end: Token offset where the marked block ends (the cached prefix is ``tokens[:end]``).
        block: Index of the marked block among the request's blocks (tools, system, message blocks).
        ttl: The entry's time to live in seconds (300 or 3,600: :data:`ANTHROPIC_TTLS`).
    """

    end: int
    block: int
    ttl: float = ANTHROPIC_TTLS["5m"]


@dataclass(frozen=True, slots=True)
class BreakpointResult:
    """A request's cache outcome under :class:`BreakpointCache`.

    Attributes:
        result: Read, written and plain input tokens (``written_tokens`` at both TTLs together).
        written_long: Of the written tokens, those written to the 1-hour cache (the rest: 5 minutes).
        timeless_written_long: The same had no entry expired (see :meth:`CacheResult.without_expiry`).
    """

    result: CacheResult
    written_long: int = 0
    timeless_written_long: int = 0


class BreakpointCache:
    """Anthropic's prompt cache for one conversation, driven by the breakpoints each request marks itself.

    Unlike :class:`AnthropicCache` (the simulated ``--cache anthropic`` rule, whose breakpoints the
    provider places), nothing here is invented: a request comes as its token ids, the token offsets
    where each of its blocks ends (``boundaries``: tools, system blocks, message content blocks, in
    that order) and the :class:`Breakpoint` s its ``cache_control`` marks put on some of them
    (the request-level automatic mark included). No mark, no caching.

    - **Writes**: each breakpoint whose prefix is at least ``min_tokens`` long stores that prefix
      with its TTL; the tokens written are those from the hit to the newest such breakpoint, each
      segment at the TTL of the breakpoint that ends it. Below ``min_tokens`` a mark caches nothing.
    - **Reads**: from each breakpoint the cache looks back over at most ``lookback_blocks`` block
      boundaries (the breakpoint's own first) for a stored prefix; the longest one found, and
      fresh, is the hit. A prefix stored further back is not found, so an edit more than
      ``lookback_blocks`` blocks before the newest mark writes everything again unless an
      earlier mark sits closer to it.
    - **Expiry**: an entry is read only within its TTL of its last write or read; a read refreshes it.
    """

    def __init__(
        self,
        *,
        min_tokens: int = ANTHROPIC_MIN_CACHEABLE_TOKENS,
        lookback_blocks: int = ANTHROPIC_LOOKBACK_BLOCKS,
        max_breakpoints: int = ANTHROPIC_MAX_BREAKPOINTS,
    ) -> None:
        if min_tokens < 1:
            raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
        if lookback_blocks < 1:
            raise ValueError(f"lookback_blocks must be >= 1, got {lookback_blocks}")
        if max_breakpoints < 1:
            raise ValueError(f"max_breakpoints must be >= 1, got {max_breakpoints}")
        self.min_tokens = min_tokens
        self.lookback_blocks = lookback_blocks
        self.max_breakpoints = max_breakpoints
        self._entries: dict[bytes, tuple[float, float]] = {}  # digest -> (last written or read, ttl)

    def _check(self, boundaries: Sequence[int], breakpoints: Sequence[Breakpoint], n: int) -> None:
        previous = 0
        for end in boundaries:
            if not isinstance(end, int) or not previous <= end <= n:
                raise ValueError(f"boundaries must be non-decreasing token offsets in [0, {n}], got {list(boundaries)}")
            previous = end
        if len(breakpoints) > self.max_breakpoints:
            raise ValueError(f"breakpoints: at most {self.max_breakpoints} allowed, got {len(breakpoints)}")
        for point in breakpoints:
            if not 0 <= point.block < len(boundaries) or boundaries[point.block] != point.end:
                raise ValueError(f"breakpoint {point} does not end one of the request's blocks")
            _check_ttl(point.ttl)

    def lookup_and_store(
        self,
        tokens: Sequence[int],
        boundaries: Sequence[int],
        breakpoints: Sequence[Breakpoint],
        salts: Sequence[Salt] = (),
        *,
        now: float = 0.0,
    ) -> BreakpointResult:
        """The cache outcome of ``tokens`` marked at ``breakpoints`` at time ``now``; then store its writes."""
        data = _validate_tokens(tokens)
        n = len(tokens)
        self._check(boundaries, breakpoints, n)
        _check_salts(salts, n)
        points = sorted(breakpoints, key=lambda point: point.end)
        if not points:
            return BreakpointResult(CacheResult(cached_tokens=0, input_tokens=n))
        candidates = {
            boundaries[block]
            for point in points
            for block in range(max(0, point.block - self.lookback_blocks + 1), point.block + 1)
        }
        hasher = _PrefixHasher(data, salts)
        digests = {offset: hasher.digest_at(offset) for offset in sorted(candidates | {p.end for p in points})}
        hit = timeless = 0
        for offset in sorted(candidates):
            entry = self._entries.get(digests[offset])
            if offset < self.min_tokens or entry is None:
                continue
            timeless = offset
            if now - entry[0] <= entry[1]:
                hit = offset
        if hit:
            self._entries[digests[hit]] = (now, self._entries[digests[hit]][1])  # a read refreshes the entry
        kept = [point for point in points if point.end >= self.min_tokens]
        for point in kept:
            known = self._entries.get(digests[point.end])
            self._entries[digests[point.end]] = (now, max(point.ttl, known[1] if known else 0.0))

        def written(read: int) -> tuple[int, int]:
            total = long = 0
            start = read
            for point in kept:
                if point.end > start:
                    total += point.end - start
                    long += point.end - start if point.ttl > ANTHROPIC_TTLS["5m"] else 0
                    start = point.end
            return total, long

        (write, long), (timeless_write, timeless_long) = written(hit), written(timeless)
        return BreakpointResult(_expiry(hit, write, timeless, timeless_write, n), long, timeless_long)


@dataclass(frozen=True, slots=True)
class PriceProfile:
    """Prices in dollars per million tokens.

    ``cache_write`` is the price of a token written to the cache; ``None`` means the provider
    bills no write premium, so written tokens (if a cache reports any) cost plain ``input``.
    """

    name: str
    input: float
    cached_input: float
    output: float
    cache_write: float | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must be a non-empty string")
        for field in ("input", "cached_input", "output"):
            value = getattr(self, field)
            if not value >= 0:
                raise ValueError(f"{field} must be a price >= 0 per million tokens, got {value}")
        if self.cache_write is not None and not self.cache_write >= 0:
            raise ValueError(f"cache_write must be None or a price >= 0 per million tokens, got {self.cache_write}")


PROFILES: Mapping[str, PriceProfile] = MappingProxyType(
    {
        # EVALUATION.md "Simulated provider": p=1.00, c=0.10, o=4.00 per million, ratio-only.
        "default": PriceProfile("default", input=1.00, cached_input=0.10, output=4.00),
        # reference §5.3, runs 63/64: "gpt-6-luna $0.10 / $0.01 / $0.50 with $0.125 cache writes".
        "gpt-6-luna": PriceProfile("gpt-6-luna", input=0.10, cached_input=0.01, output=0.50, cache_write=0.125),
        # reference §5.3, runs 63/64: "gpt-5.6-luna $0.20 / $0.02 cached / $1.20 out".
        "gpt-5.6-luna": PriceProfile("gpt-5.6-luna", input=0.20, cached_input=0.02, output=1.20),
        # reference §3, Anthropic: reads 0.1x, writes 1.25x (5 min TTL) on the default's ratios.
        "anthropic-5m": PriceProfile("anthropic-5m", input=1.00, cached_input=0.10, output=4.00, cache_write=1.25),
        # reference §3, Anthropic: writes 2x for the 1-hour TTL.
        "anthropic-1h": PriceProfile("anthropic-1h", input=1.00, cached_input=0.10, output=4.00, cache_write=2.00),
    }
)
"""Named price profiles; only figures the reference states (ratio-only where no dollars are given)."""


def get_profile(name: str) -> PriceProfile:
    """Return the named profile, or raise ``ValueError`` listing the known names."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"profile must be one of {sorted(PROFILES)}, got {name!r}") from None


def bill(profile: PriceProfile, result: CacheResult, output_tokens: int) -> float:
    """Dollars for one call: uncached x input + cached x cached_input + written x write + output x output.

    All prices are per million tokens (EVALUATION.md "Billing per call"). Written tokens are
    billed at ``profile.cache_write`` or, for a profile without one, at ``profile.input``.
    """
    if output_tokens < 0:
        raise ValueError(f"output_tokens must be >= 0, got {output_tokens}")
    write_price = profile.input if profile.cache_write is None else profile.cache_write
    total = (
        result.uncached_tokens * profile.input
        + result.cached_tokens * profile.cached_input
        + result.written_tokens * write_price
        + output_tokens * profile.output
    )
    return total / 1_000_000


def bill_breakpoints(
    profile: PriceProfile, outcome: BreakpointResult, output_tokens: int, *, timeless: bool = False
) -> float:
    """Dollars for one call priced by Anthropic's rules: reads at ``cached_input``, writes at 1.25x ``input`` (5
    minutes) or 2x (1 hour), the rest at ``input``, output at ``output`` (per million tokens).

    ``timeless``: what the call would have cost had no cache entry expired.
    """
    if output_tokens < 0:
        raise ValueError(f"output_tokens must be >= 0, got {output_tokens}")
    result = outcome.result.without_expiry() if timeless else outcome.result
    long = (
        outcome.timeless_written_long
        if timeless and outcome.result.timeless_cached is not None
        else outcome.written_long
    )
    short = result.written_tokens - long
    total = (
        result.uncached_tokens * profile.input
        + result.cached_tokens * profile.cached_input
        + short * profile.input * ANTHROPIC_WRITE_5M
        + long * profile.input * ANTHROPIC_WRITE_1H
        + output_tokens * profile.output
    )
    return total / 1_000_000
