"""Pin the simulated provider's prompt-cache rules and billing (reference/caching-and-peers.md §3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maf_compaction.bench.simulator import (
    PROFILES,
    AnthropicCache,
    CacheResult,
    OpenAICache,
    PriceProfile,
    bill,
    get_profile,
)


def seq(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def changed(tokens: list[int], k: int) -> list[int]:
    """``tokens`` with the token at position ``k`` replaced by one that appears nowhere else."""
    out = list(tokens)
    out[k] = 10**9
    return out


# --- OpenAI ---------------------------------------------------------------------------------


def test_openai_first_request_misses() -> None:
    assert OpenAICache().lookup_and_store(seq(5000)) == CacheResult(cached_tokens=0, input_tokens=5000)


def test_openai_nothing_cached_below_1024() -> None:
    cache = OpenAICache()
    cache.lookup_and_store(seq(1000))
    assert cache.lookup_and_store(seq(1000)).cached_tokens == 0
    cache.lookup_and_store(seq(1023))
    assert cache.lookup_and_store(seq(1023)).cached_tokens == 0


def test_openai_exactly_1024_is_cached() -> None:
    cache = OpenAICache()
    cache.lookup_and_store(seq(1024))
    assert cache.lookup_and_store(seq(1024)).cached_tokens == 1024


def test_openai_hits_in_128_steps() -> None:
    cache = OpenAICache()
    cache.lookup_and_store(seq(1500))
    result = cache.lookup_and_store(seq(1500))
    assert result == CacheResult(cached_tokens=1408, input_tokens=1500)
    assert result.uncached_tokens == 92


@pytest.mark.parametrize(("k", "hit"), [(2000, 1920), (1100, 1024), (1000, 0), (1024, 1024), (1023, 0), (0, 0)])
def test_openai_one_token_change_caps_hit_below_k(k: int, hit: int) -> None:
    cache = OpenAICache()
    base = seq(3000)
    cache.lookup_and_store(base)
    assert cache.lookup_and_store(changed(base, k)).cached_tokens == hit


def test_openai_prefix_extension_hits_whole_previous_request_floored() -> None:
    cache = OpenAICache()
    cache.lookup_and_store(seq(1300))
    assert cache.lookup_and_store(seq(2500)).cached_tokens == 1280
    # the 2,500-token request is now stored too
    assert cache.lookup_and_store(seq(4000)).cached_tokens == 2432


def test_openai_longest_match_among_earlier_requests_wins() -> None:
    cache = OpenAICache()
    base = seq(6000)
    cache.lookup_and_store(changed(base, 1500))
    cache.lookup_and_store(changed(base, 4100))
    cache.lookup_and_store(changed(base, 2600))
    assert cache.lookup_and_store(base).cached_tokens == 4096
    # an unrelated later request does not evict anything
    cache.lookup_and_store(seq(3000, start=50_000))
    assert cache.lookup_and_store(changed(base, 5999)).cached_tokens == 5888


def test_openai_count_writes_reports_uncached_tail() -> None:
    cache = OpenAICache(count_writes=True)
    assert cache.lookup_and_store(seq(500)).written_tokens == 0  # too short to be cached at all
    first = cache.lookup_and_store(seq(2000))
    assert (first.cached_tokens, first.written_tokens, first.uncached_tokens) == (0, 2000, 0)
    second = cache.lookup_and_store(seq(2100))
    assert (second.cached_tokens, second.written_tokens, second.uncached_tokens) == (1920, 180, 0)


def test_openai_empty_request() -> None:
    assert OpenAICache().lookup_and_store([]) == CacheResult(0, 0, 0)


def test_openai_invalid_parameters() -> None:
    with pytest.raises(ValueError, match="increment"):
        OpenAICache(increment=0)
    with pytest.raises(ValueError, match="min_tokens"):
        OpenAICache(min_tokens=-1)


@pytest.mark.parametrize("bad", [[-1], [2**64], [1.5]])
def test_invalid_tokens_refused(bad: list[int]) -> None:
    with pytest.raises(ValueError, match="tokens"):
        OpenAICache().lookup_and_store(bad)
    with pytest.raises(ValueError, match="tokens"):
        AnthropicCache().lookup_and_store(bad, [])


def brute_force_hit(history: list[list[int]], tokens: list[int]) -> int:
    best = 0
    for earlier in history:
        n = 0
        for a, b in zip(earlier, tokens, strict=False):
            if a != b:
                break
            n += 1
        best = max(best, n)
    best -= best % 128
    return best if best >= 1024 else 0


edit = st.tuples(
    st.sampled_from(["change", "extend", "truncate", "fresh"]),
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=1, max_value=900),
)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=3000), st.lists(st.tuples(st.integers(min_value=0), edit), max_size=8))
def test_openai_matches_brute_force(first_len: int, steps: list[tuple[int, tuple[str, int, int]]]) -> None:
    cache = OpenAICache()
    history: list[list[int]] = []
    requests = [seq(first_len)]
    for pick, (kind, where, amount) in steps:
        base = requests[pick % len(requests)]
        if kind == "change" and base:
            new = changed(base, where % len(base))
        elif kind == "extend":
            new = base + seq(amount, start=where)
        elif kind == "truncate":
            new = base[: where % (len(base) + 1)]
        else:
            new = seq(amount * 3, start=where)
        requests.append(new)
    for tokens in requests:
        hit = cache.lookup_and_store(tokens).cached_tokens
        assert hit <= len(tokens)
        assert hit % 128 == 0
        assert hit == 0 or hit >= 1024
        assert hit == brute_force_hit(history, tokens)
        history.append(tokens)


# --- Anthropic ------------------------------------------------------------------------------


def test_anthropic_no_breakpoint_no_hit_no_write() -> None:
    cache = AnthropicCache()
    cache.lookup_and_store(seq(3000), [])
    assert cache.lookup_and_store(seq(3000), []) == CacheResult(0, 3000, 0)
    # nothing was written by the unmarked requests either
    assert cache.lookup_and_store(seq(3000), [3000]) == CacheResult(0, 3000, 3000)


def test_anthropic_hit_at_newest_breakpoint_written_before() -> None:
    cache = AnthropicCache()
    assert cache.lookup_and_store(seq(3000), [1500, 2500]) == CacheResult(0, 3000, 2500)
    # same prefix, breakpoints at the same places: hit at 2,500, nothing new to write
    assert cache.lookup_and_store(seq(3000), [1500, 2500]) == CacheResult(2500, 3000, 0)
    # changed after 2,000: only the 1,500 prefix matches; writes up to the newest breakpoint
    assert cache.lookup_and_store(changed(seq(3000), 2000), [1500, 2500]) == CacheResult(1500, 3000, 1000)


def test_anthropic_hits_are_not_rounded() -> None:
    cache = AnthropicCache()
    cache.lookup_and_store(seq(1500), [1333])
    assert cache.lookup_and_store(seq(1500), [1333]).cached_tokens == 1333


def test_anthropic_lookback_finds_earlier_breakpoint() -> None:
    cache = AnthropicCache()
    cache.lookup_and_store(seq(2000), [2000])
    # the conversation grows; the single breakpoint moves to the new end
    assert cache.lookup_and_store(seq(3000), [3000]) == CacheResult(2000, 3000, 1000)
    assert cache.lookup_and_store(seq(4000), [4000]) == CacheResult(3000, 4000, 1000)
    # an earlier write past this request's newest breakpoint does not count
    assert cache.lookup_and_store(seq(4500), [2500]) == CacheResult(2000, 4500, 500)


def test_anthropic_without_lookback_only_own_breakpoints_hit() -> None:
    cache = AnthropicCache(lookback=False)
    cache.lookup_and_store(seq(2000), [2000])
    assert cache.lookup_and_store(seq(3000), [3000]) == CacheResult(0, 3000, 3000)
    assert cache.lookup_and_store(seq(3500), [2000, 3500]) == CacheResult(2000, 3500, 1500)


def test_anthropic_minimum_cacheable_length() -> None:
    cache = AnthropicCache()
    assert cache.lookup_and_store(seq(1500), [1000]) == CacheResult(0, 1500, 0)
    assert cache.lookup_and_store(seq(1500), [1000]) == CacheResult(0, 1500, 0)
    # 1,000 was never written, so a later request cannot read it
    assert cache.lookup_and_store(seq(1500), [1000, 1500]) == CacheResult(0, 1500, 1500)
    big = AnthropicCache(min_tokens=2048)
    big.lookup_and_store(seq(3000), [2000])
    assert big.lookup_and_store(seq(3000), [2000]) == CacheResult(0, 3000, 0)


def test_anthropic_more_than_four_breakpoints_refused() -> None:
    cache = AnthropicCache()
    cache.lookup_and_store(seq(5000), [1000, 2000, 3000, 4000])
    with pytest.raises(ValueError, match="breakpoints"):
        cache.lookup_and_store(seq(5000), [1000, 2000, 3000, 4000, 5000])


@pytest.mark.parametrize("points", [[0], [3001], [2000, 2000], [2000, 1500]])
def test_anthropic_bad_breakpoints_refused(points: list[int]) -> None:
    with pytest.raises(ValueError, match="breakpoints"):
        AnthropicCache().lookup_and_store(seq(3000), points)


def test_anthropic_invalid_parameters() -> None:
    with pytest.raises(ValueError, match="min_tokens"):
        AnthropicCache(min_tokens=0)
    with pytest.raises(ValueError, match="max_breakpoints"):
        AnthropicCache(max_breakpoints=0)


def test_anthropic_writes_billed_with_premium() -> None:
    cache = AnthropicCache()
    first = cache.lookup_and_store(seq(3000), [2000])
    second = cache.lookup_and_store(seq(4000), [3500])
    assert first == CacheResult(0, 3000, 2000)
    assert second == CacheResult(2000, 4000, 1500)
    # 5-minute TTL: 1,000 x 1.00 + 2,000 x 1.25 + 100 x 4.00 per million
    assert bill(PROFILES["anthropic-5m"], first, 100) == pytest.approx(3900 / 1e6, rel=1e-12)
    # 500 x 1.00 + 2,000 x 0.10 + 1,500 x 1.25 + 100 x 4.00
    assert bill(PROFILES["anthropic-5m"], second, 100) == pytest.approx(2975 / 1e6, rel=1e-12)
    # 1-hour TTL: writes at 2x
    assert bill(PROFILES["anthropic-1h"], second, 100) == pytest.approx(4100 / 1e6, rel=1e-12)


# --- prices ---------------------------------------------------------------------------------


def test_bill_default_profile_exact() -> None:
    result = CacheResult(cached_tokens=1408, input_tokens=1500)
    # 92 x 1.00 + 1,408 x 0.10 + 200 x 4.00 = 1,032.8 per million
    assert bill(get_profile("default"), result, 200) == pytest.approx(1032.8 / 1e6, rel=1e-12)


def test_bill_gpt6_luna_with_writes() -> None:
    result = CacheResult(cached_tokens=1000, input_tokens=5000, written_tokens=3000)
    # 1,000 x 0.10 + 1,000 x 0.01 + 3,000 x 0.125 + 1,000 x 0.50 = 985 per million
    assert bill(get_profile("gpt-6-luna"), result, 1000) == pytest.approx(985 / 1e6, rel=1e-12)


def test_bill_writes_without_write_price_cost_input() -> None:
    result = CacheResult(cached_tokens=0, input_tokens=1_000_000, written_tokens=400_000)
    assert bill(get_profile("gpt-5.6-luna"), result, 0) == pytest.approx(0.20, rel=1e-12)
    assert bill(get_profile("gpt-5.6-luna"), CacheResult(1_000_000, 1_000_000), 1_000_000) == pytest.approx(1.22)


def test_profiles_match_reference_figures() -> None:
    assert PROFILES["default"] == PriceProfile("default", 1.00, 0.10, 4.00)
    assert PROFILES["gpt-6-luna"] == PriceProfile("gpt-6-luna", 0.10, 0.01, 0.50, 0.125)
    assert PROFILES["gpt-5.6-luna"] == PriceProfile("gpt-5.6-luna", 0.20, 0.02, 1.20)
    assert PROFILES["anthropic-5m"].cache_write == 1.25 * PROFILES["anthropic-5m"].input
    assert PROFILES["anthropic-1h"].cache_write == 2 * PROFILES["anthropic-1h"].input
    for profile in PROFILES.values():
        assert profile.cached_input == pytest.approx(0.1 * profile.input)


def test_unknown_profile_refused() -> None:
    with pytest.raises(ValueError, match="profile must be one of"):
        get_profile("nope")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"input": -1.0}, "input"),
        ({"cached_input": -0.1}, "cached_input"),
        ({"output": float("nan")}, "output"),
        ({"cache_write": -2.0}, "cache_write"),
        ({"name": ""}, "name"),
    ],
)
def test_invalid_profile_refused(kwargs: dict[str, object], name: str) -> None:
    fields: dict[str, object] = {"name": "x", "input": 1.0, "cached_input": 0.1, "output": 4.0, **kwargs}
    with pytest.raises(ValueError, match=name):
        PriceProfile(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"cached_tokens": 11}, "cached_tokens"),
        ({"written_tokens": 8}, "written_tokens"),
        ({"input_tokens": -1, "cached_tokens": 0}, "input_tokens"),
    ],
)
def test_invalid_cache_result_refused(kwargs: dict[str, int], name: str) -> None:
    fields = {"cached_tokens": 3, "input_tokens": 10, "written_tokens": 0, **kwargs}
    with pytest.raises(ValueError, match=name):
        CacheResult(**fields)


def test_negative_output_tokens_refused() -> None:
    with pytest.raises(ValueError, match="output_tokens"):
        bill(PROFILES["default"], CacheResult(0, 10), -1)


def brute_force_anthropic(written: list[list[int]], tokens: list[int], points: list[int]) -> int:
    if not points:
        return 0
    return max((len(p) for p in written if len(p) <= points[-1] and tokens[: len(p)] == p), default=0)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0),
            edit,
            st.lists(st.integers(min_value=1, max_value=10**6), max_size=4, unique=True),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_anthropic_matches_brute_force(steps: list[tuple[int, tuple[str, int, int], list[int]]]) -> None:
    cache = AnthropicCache()
    written: list[list[int]] = []
    requests = [seq(2000)]
    for pick, (kind, where, amount), raw_points in steps:
        base = requests[pick % len(requests)]
        if kind == "change":
            tokens = changed(base, where % len(base))
        elif kind == "extend":
            tokens = base + seq(amount, start=where)
        elif kind == "truncate":
            tokens = base[: 1 + where % len(base)]
        else:
            tokens = seq(amount * 3, start=where)
        requests.append(tokens)
        points = sorted({1 + p % len(tokens) for p in raw_points})
        result = cache.lookup_and_store(tokens, points)
        expected = brute_force_anthropic(written, tokens, points)
        assert result.cached_tokens == expected
        newest = points[-1] if points else 0
        assert result.written_tokens == (newest - expected if newest >= 1024 else 0)
        written.extend(tokens[:p] for p in points if p >= 1024)


# -- salts: keys that are not tokens -------------------------------------------------------


def test_openai_a_salt_keys_every_prefix_after_its_offset_only() -> None:
    cache = OpenAICache()
    cache.lookup_and_store(seq(3000), [(1500, b"a")])
    assert cache.lookup_and_store(seq(3000), [(1500, b"a")]).cached_tokens == 2944
    # Another key at 1500: the prefixes up to 1500 still match, the longer ones do not.
    assert cache.lookup_and_store(seq(3000), [(1500, b"b")]).cached_tokens == 1408
    # A key at the start keys everything.
    assert cache.lookup_and_store(seq(3000), [(0, b"head")]).cached_tokens == 0


def test_anthropic_a_salt_at_a_breakpoint_leaves_that_breakpoint_readable() -> None:
    cache = AnthropicCache()
    cache.lookup_and_store(seq(3000), [1500, 3000], [(1500, b"messages:auto")])
    assert cache.lookup_and_store(seq(3000), [1500, 3000], [(1500, b"messages:forced")]) == CacheResult(
        1500, 3000, 1500
    )


@pytest.mark.parametrize("salts", [[(-1, b"x")], [(3001, b"x")], [(5, "text")]])
def test_invalid_salts_refused(salts: list[tuple[int, object]]) -> None:
    with pytest.raises(ValueError, match="salts must be"):
        OpenAICache().lookup_and_store(seq(3000), salts)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="salts must be"):
        AnthropicCache().lookup_and_store(seq(3000), [3000], salts)  # type: ignore[arg-type]
