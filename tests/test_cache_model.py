"""One cache model: the in-process simulator and the loopback server price a request the same way.

Each rule is pinned on hand-made requests (what a head field, a tool, an image or an opaque
payload does to the cached prefix), then one workload runs through the bench's composition row
in process and through both real clients over the loopback; every request of each run is
priced again under every rule, and the runs must agree call by call within the bound each test
states (``docs/bench.md``, "One cache model", explains it).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import replace

import pytest

from maf_compaction.bench import runner
from maf_compaction.bench.provider import CACHE_KINDS, CACHE_RULES, CacheKind, CallRecord, SimulatedProvider
from maf_compaction.bench.rendering import RenderedRequest, canonical_head, opaque
from maf_compaction.bench.runner import Cell, ClientMode, Settings, play_cell
from maf_compaction.bench.simulator import get_profile
from maf_compaction.core.effects import COMPACTION_REQUEST
from offline_tokenizers import offline_tiktoken

TOKENIZER = offline_tiktoken()
FORCED = '{"mode":"required","required_function_name":"recall_earlier_tool_results"}'
SYSTEM = "<|system|>\n" + "Follow the rules of the deployment desk. " * 200
TOOLS = '<|tools|>\n[{"name":"lookup","parameters":{"type":"object"}}]'


def provider(cache: CacheKind) -> SimulatedProvider:
    return SimulatedProvider(encoder=TOKENIZER, window=200_000, profile=get_profile("default"), cache=cache)


def request(
    *messages: str, head: tuple[tuple[str, str], ...] = (), tools: str = TOOLS, media: int = 0
) -> RenderedRequest:
    return RenderedRequest(instructions=SYSTEM, tools=tools, messages=messages, head=head, media=media)


HISTORY = ("<|user|>\n" + "lookup the records of svc-1 please " * 80, "<|assistant|>\nDone.")


def preamble_tokens(cache: CacheKind) -> int:
    return provider(cache).layout(request()).preamble_end


# -- the rules, one request change at a time --------------------------------------------


@pytest.mark.parametrize("cache", CACHE_KINDS)
def test_a_new_message_reads_the_whole_previous_request(cache: CacheKind) -> None:
    p = provider(cache)
    first = p.call(request(*HISTORY), output="")
    second = p.call(request(*HISTORY, "<|user|>\nnext"), output="")
    assert not second.broke
    if cache == "anthropic":
        assert second.cached_tokens == first.input_tokens
    else:
        assert first.input_tokens - 128 < second.cached_tokens <= first.input_tokens


def test_openai_a_tool_choice_change_misses_the_whole_prompt() -> None:
    p = provider("openai")
    p.call(request(*HISTORY), output="")
    forced = p.call(request(*HISTORY, "<|user|>\nnext", head=(("tool_choice", FORCED),)), output="")
    assert forced.cached_tokens == 0
    assert forced.broke
    back = p.call(request(*HISTORY, "<|user|>\nnext", "<|assistant|>\nok"), output="")
    assert back.cached_tokens > 0  # the unpinned prefix was cached by the first request
    assert back.broke


def test_openai_free_tool_choice_prices_a_pin_as_an_extension() -> None:
    p = provider("openai-free-tool-choice")
    first = p.call(request(*HISTORY), output="")
    forced = p.call(request(*HISTORY, "<|user|>\nnext", head=(("tool_choice", FORCED),)), output="")
    assert forced.cached_tokens > first.input_tokens - 128
    assert not forced.broke
    # Every other model-facing head field still keys the prefix.
    other = p.call(request(*HISTORY, head=(("parallel_tool_calls", "false"),)), output="")
    assert other.cached_tokens == 0


def test_anthropic_a_tool_choice_change_invalidates_the_messages_only() -> None:
    p = provider("anthropic")
    p.call(request(*HISTORY), output="")
    forced = p.call(request(*HISTORY, "<|user|>\nnext", head=(("tool_choice", FORCED),)), output="")
    assert forced.cached_tokens == preamble_tokens("anthropic")
    assert forced.broke
    thinking = p.call(request(*HISTORY, head=(("reasoning", '{"effort":"high"}'),)), output="")
    assert thinking.cached_tokens == preamble_tokens("anthropic")


def test_anthropic_images_added_anywhere_invalidate_the_messages() -> None:
    p = provider("anthropic")
    p.call(request(*HISTORY, media=1), output="")
    more = p.call(request(*HISTORY, "<|user|>\n[data image/png x]", media=2), output="")
    assert more.cached_tokens == preamble_tokens("anthropic")


def test_anthropic_a_system_setting_invalidates_system_and_messages() -> None:
    p = provider("anthropic")
    p.call(request(*HISTORY), output="")
    toggled = p.call(request(*HISTORY, head=(("web_search_options", "{}"),)), output="")
    assert toggled.cached_tokens == 0  # no breakpoint marks the tools alone


@pytest.mark.parametrize("cache", CACHE_KINDS)
def test_a_tool_definition_change_invalidates_everything(cache: CacheKind) -> None:
    p = provider(cache)
    p.call(request(*HISTORY), output="")
    changed = p.call(request(*HISTORY, tools=TOOLS.replace("lookup", "search")), output="")
    assert changed.cached_tokens == 0
    assert changed.broke


@pytest.mark.parametrize("cache", CACHE_KINDS)
def test_an_opaque_payload_counts_zero_tokens_but_keys_the_prefix(cache: CacheKind) -> None:
    p = provider(cache)
    plain = p.layout(request(*HISTORY))
    with_state = p.layout(request(HISTORY[0], opaque("state-1"), HISTORY[1]))
    assert with_state.tokens == plain.tokens
    p.call(request(HISTORY[0], opaque("state-1"), HISTORY[1]), output="")
    other = p.call(request(HISTORY[0], opaque("state-2"), HISTORY[1], "<|user|>\nnext"), output="")
    assert other.broke
    assert other.cached_tokens < p.count(HISTORY[0]) + preamble_tokens(cache)


def test_every_rule_is_described_for_the_reports() -> None:
    assert set(CACHE_RULES) == set(CACHE_KINDS)


# -- one workload, in process and over the wire ----------------------------------------

SETTINGS = Settings(context_window=8_192, max_output_tokens=1_024, tool_turns=3, markers_per_tool=3)
#: The composition in both request shapes: over the cached prefix (the README's wiring) and pinned with a summarizer.
ROWS = ("tool_and_user_summary_anchored", "tool_and_user_summary_anchored_pinned")
_RUNS: dict[tuple[str, ClientMode], list[tuple[str, RenderedRequest]]] = {}


def played(client: ClientMode, row: str = ROWS[0]) -> list[tuple[str, RenderedRequest]]:
    """Every request of a composition row's run through ``client``: (kind, canonical request)."""
    if (row, client) not in _RUNS:
        settings = replace(SETTINGS, client=client)
        _, used = asyncio.run(play_cell(Cell(row, 1.5, 1), settings, keep_requests=True))
        _RUNS[row, client] = [(call.kind, sent) for call, sent in zip(used.calls, used.requests, strict=True)]
    return _RUNS[row, client]


def asks_over_the_prefix(sent: RenderedRequest) -> bool:
    """The request ends with our instruction: a record or a summary asked over the cached prefix."""
    return bool(sent.messages) and sent.messages[-1].startswith(f"<|user|>\n{COMPACTION_REQUEST}")


def priced(run: Sequence[tuple[str, RenderedRequest]], cache: CacheKind) -> list[CallRecord]:
    fresh = provider(cache)
    return [
        fresh.call(
            sent,
            output="",
            kind="model" if kind == "model" else "summarizer",
            instruction=asks_over_the_prefix(sent),
        )
        for kind, sent in run
    ]


@pytest.fixture(autouse=True)
def _offline_bench_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_tokenizer", lambda: TOKENIZER)


def tools_delta(local: RenderedRequest, wire: RenderedRequest) -> int:
    counter = provider("openai")
    return counter.count(wire.tools or "") - counter.count(local.tools or "")


OPAQUE_ENTRY = re.compile("^\x00opaque:[0-9a-f]+\x00$")


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("cache", CACHE_KINDS)
def test_responses_wire_agrees_with_in_process_call_by_call(cache: CacheKind, row: str) -> None:
    """Bound: the Responses client adds ``"additionalProperties": false`` to each tool's parameters
    and replays each answer's opaque reasoning item (identity, zero tokens). Its tool entry is the
    only text that differs, so with the wire's tool entry in the in-process request every call
    costs the same input, cached and written tokens and breaks alike; the raw input differs by
    exactly the tool entry's extra tokens."""
    local, wire = played("inprocess", row), played("openai-responses", row)
    assert [kind for kind, _ in wire] == [kind for kind, _ in local]
    if row.endswith("_pinned"):
        assert any(dict(sent.head).get("tool_choice") == FORCED for _, sent in local)  # pinned records were asked
        assert any(kind == "summarizer" for kind, _ in local)
    else:  # records and summaries asked over the cached prefix, none pinned, no summarizer call
        assert any(asks_over_the_prefix(sent) for _, sent in local)
        assert not any(dict(sent.head).get("tool_choice") == FORCED for _, sent in local)
        assert all(kind == "model" for kind, _ in local)
    for (_, here), (_, there) in zip(local, wire, strict=True):
        assert (here.instructions, here.head, here.media) == (there.instructions, there.head, there.media)
        assert tuple(m for m in there.messages if not OPAQUE_ENTRY.match(m)) == here.messages
    aligned = [(kind, replace(here, tools=there.tools)) for (kind, here), (_, there) in zip(local, wire, strict=True)]
    raw = priced(local, cache)
    for (_, here), (_, there), a, b, c in zip(
        local, wire, priced(aligned, cache), priced(wire, cache), raw, strict=True
    ):
        assert (b.input_tokens, b.cached_tokens, b.written_tokens, b.broke) == (
            a.input_tokens,
            a.cached_tokens,
            a.written_tokens,
            a.broke,
        )
        assert b.input_tokens - c.input_tokens == tools_delta(here, there)
        assert (tools_delta(here, there) > 0) is (here.tools is not None)  # the summarizer sends no tools


NAMED = re.compile(r"^<\|(\w+) name=[^|]*\|>")


def without_names(sent: RenderedRequest) -> RenderedRequest:
    return replace(sent, messages=tuple(NAMED.sub(r"<|\1|>", m) for m in sent.messages))


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("cache", CACHE_KINDS)
def test_chat_wire_agrees_with_in_process_call_by_call(cache: CacheKind, row: str) -> None:
    """Bound: the Chat Completions client adds a participant ``name`` to assistant messages it
    replays from history (not within the tool loop); a name is model-facing on that API, so the
    raw wire differs by exactly the names' tokens, and with the names left out it agrees exactly."""
    local, wire = played("inprocess", row), played("openai-chat", row)
    assert [kind for kind, _ in wire] == [kind for kind, _ in local]
    plain = [(kind, without_names(sent)) for kind, sent in wire]
    for a, b in zip(priced(local, cache), priced(plain, cache), strict=True):
        assert (b.input_tokens, b.cached_tokens, b.broke) == (a.input_tokens, a.cached_tokens, a.broke)
    counter = provider("openai")
    raw = priced(wire, cache)
    for (_, sent), a, b in zip(wire, priced(plain, cache), raw, strict=True):
        names = sum(counter.count(m) - counter.count(NAMED.sub(r"<|\1|>", m)) for m in sent.messages)
        assert b.input_tokens - a.input_tokens == names
    assert sum(b.broke for b in raw) > sum(a.broke for a in priced(local, cache))  # the finding: names break


@pytest.mark.parametrize("mode", ["auto", "required", "none"])
def test_a_framework_tool_mode_is_the_wire_s_plain_mode(mode: str) -> None:
    """In process the framework hands ``{"mode": m}`` (``validate_tool_mode``); a client sends ``m``: one head."""
    assert canonical_head({"tool_choice": {"mode": mode}}) == canonical_head({"tool_choice": mode})
    assert canonical_head({"tool_choice": {"mode": "auto"}}) == ()  # the APIs' default: not part of the head
