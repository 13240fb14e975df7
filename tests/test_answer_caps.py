"""Every compaction request is sent with an output cap derived from what its answer must be smaller than.

An answer the rules could keep is smaller than what it replaces (a record than the tool results its request shows,
a summary, fold, merge or rewrite than the items its transcript numbers), so the cap refuses nothing keepable: it
is that bound and as much again for reasoning (at least :data:`ANSWER_HEADROOM_TOKENS`; plus an enabled thinking
budget), never above the cap the conversation's own request carries. An answer the provider cut at the cap
(``finish_reason="length"``) is named in a WARNING and never enters history (from the summarizer a failure, over the
cached prefix an answer that did not follow the instruction): a runaway answer costs at most the cap.

Proven on the pure rule, and through the framework's own parts: the composition wired as the README wires it
(``tests/test_summaries_over_prefix.py``'s conversation over ``create_harness_agent``), summaries sent to a
summarizer client and asked over the cached prefix.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, ClassVar

import pytest
from agent_framework import ChatResponse, Content, Message

from maf_compaction.adapters.aligned import SentHead, capped_options, head_answer_room
from maf_compaction.adapters.convert import is_summary
from maf_compaction.core import max_answer_tokens
from maf_compaction.core.answers import ANSWER_HEADROOM_TOKENS, answer_bound, answer_room, cut_answer
from maf_compaction.core.effects import Request, Route
from maf_compaction.core.host import call_part, message, result_part, text_part
from maf_compaction.core.model import history
from maf_compaction.core.recall import IGNORED_LIMIT, no_route
from maf_compaction.core.records import SUMMARY_SECTION
from maf_compaction.core.state import RequestKind
from maf_compaction.core.values import distinctive_values
from test_cached_prefix import HARNESS_OFF, Provider, asked, conversation, written_records
from test_cached_prefix import TURNS as CONVERSATION_TURNS
from test_summaries_over_prefix import (
    NOTES,
    TURNS,
    Summarizer,
    asks_summary,
    note,
    summary_asks,
    talk,
)


def measure(text: str) -> int:
    """One token per word: the rule is a function of the measure it is given."""
    return len(text.split())


RESULTS = ("code=TL-1 status=ok region=eu " * 20, "code=TL-2 owner=ops " * 30)


def record_request(*, also: Request | None = None) -> Request:
    view = history(
        [
            message("user", [text_part("look both up", measure)]),
            message(
                "assistant",
                [call_part("c1", "lookup", {"n": 1}, measure), call_part("c2", "lookup", {"n": 2}, measure)],
            ),
            message("tool", [result_part("c1", RESULTS[0], measure)]),
            message("tool", [result_part("c2", RESULTS[1], measure)]),
        ]
    )
    return Request("r", RequestKind.RECORD, Route.CACHED_PREFIX, instruction="record", view=view, also=also)


SUMMARY = Request("s", RequestKind.SUMMARY, transcript="1. keep R1 (RQ-1)\n2. the deadline is 2026-12-01")


def test_a_records_bound_is_the_tool_results_its_request_shows() -> None:
    assert answer_bound(record_request(), measure) == measure("\n".join(RESULTS))


@pytest.mark.parametrize("kind", [RequestKind.SUMMARY, RequestKind.FOLD, RequestKind.MERGE, RequestKind.REWRITE])
def test_a_replacements_bound_is_the_items_it_replaces(kind: RequestKind) -> None:
    request = Request("x", kind, transcript=SUMMARY.transcript)
    assert answer_bound(request, measure) == measure(SUMMARY.transcript)


def test_a_record_asked_with_a_summary_is_bounded_by_both_and_the_section_line() -> None:
    both = record_request(also=SUMMARY)
    expected = measure("\n".join(RESULTS)) + measure(f"\n{SUMMARY_SECTION}\n") + measure(SUMMARY.transcript)
    assert answer_bound(both, measure) == expected


def test_the_cap_is_the_bound_plus_headroom_and_thinking_never_above_the_requests_own() -> None:
    bound = measure(SUMMARY.transcript)
    assert max_answer_tokens(SUMMARY, measure) == bound + ANSWER_HEADROOM_TOKENS
    large = Request("l", RequestKind.SUMMARY, transcript="word " * (3 * ANSWER_HEADROOM_TOKENS))
    assert max_answer_tokens(large, measure) == 2 * 3 * ANSWER_HEADROOM_TOKENS, "room to reason grows with the answer"
    assert max_answer_tokens(SUMMARY, measure, thinking=2_000) == bound + ANSWER_HEADROOM_TOKENS + 2_000
    assert max_answer_tokens(SUMMARY, measure, limit=100) == 100
    assert max_answer_tokens(SUMMARY, measure, limit=10**6) == bound + ANSWER_HEADROOM_TOKENS


def test_a_host_hooks_request_has_no_cap() -> None:
    media = Request("m", RequestKind.MEDIA, Route.HOOK)
    assert answer_bound(media, measure) is None
    assert max_answer_tokens(media, measure) is None


@pytest.mark.parametrize(("limit", "thinking"), [(0, 0), (None, -1)])
def test_invalid_limits_are_refused_naming_them(limit: int | None, thinking: int) -> None:
    with pytest.raises(ValueError, match="thinking must be >= 0 and limit None or >= 1"):
        max_answer_tokens(SUMMARY, measure, limit=limit, thinking=thinking)


def test_over_the_prefix_the_cap_leaves_room_for_an_enabled_thinking_budget_within_the_requests_own() -> None:
    """Anthropic counts thinking toward ``max_tokens``, which must exceed the budget: the cap adds the budget, and
    the conversation's own cap (valid with that budget) is never exceeded."""
    bound = measure(SUMMARY.transcript)
    thinking = {"type": "enabled", "budget_tokens": 6_000}
    own_large = capped_options({"max_tokens": 64_000, "thinking": thinking, "temperature": 1}, SUMMARY, measure)
    assert own_large == {"max_tokens": bound + ANSWER_HEADROOM_TOKENS + 6_000, "thinking": thinking, "temperature": 1}
    own_small = capped_options({"max_tokens": 8_000, "thinking": thinking}, SUMMARY, measure)
    assert own_small["max_tokens"] == 8_000
    assert capped_options({}, SUMMARY, measure) == {"max_tokens": bound + ANSWER_HEADROOM_TOKENS}
    media = Request("m", RequestKind.MEDIA, Route.HOOK)
    assert capped_options({"max_tokens": 5}, media, measure) == {"max_tokens": 5}


def test_the_room_an_answer_has_is_the_requests_own_cap_less_its_thinking_budget() -> None:
    """What a composition's answer over the cached prefix may hold (it decides whether a record request carries a
    summary from it): none known without a request or a cap; the cap less an enabled thinking budget."""
    assert answer_room(None) is None
    assert answer_room(2_048) == 2_048
    assert answer_room(8_000, 6_000) == 2_000
    assert answer_room(1_024, 1_024) == 1
    assert head_answer_room(None) is None
    assert head_answer_room(SentHead.of(None, {})) is None
    assert head_answer_room(SentHead.of(None, {"max_tokens": True})) is None
    thinking = {"type": "enabled", "budget_tokens": 6_000}
    assert head_answer_room(SentHead.of(None, {"max_tokens": 8_000, "thinking": thinking})) == 2_000
    disabled = {"type": "disabled", "budget_tokens": 6_000}
    assert head_answer_room(SentHead.of(None, {"max_tokens": 8_000, "thinking": disabled})) == 8_000


def test_an_answer_cut_below_what_a_kept_one_may_hold_counts_by_its_complete_lines() -> None:
    """Cut at the conversation's own cap, below the answer's bound, an answer keeps its complete lines (the line the
    cut fell in may end in the start of a value); cut at the bound's cap, or with no line complete, it is a runaway."""
    bound = answer_bound(SUMMARY, measure)
    assert bound is not None
    assert bound > 2
    written = "- R1 (RQ-11AB22): keep totals in EUR.\n- R2 (RQ-33CD"
    assert cut_answer(SUMMARY, written, measure, limit=bound - 1) == "- R1 (RQ-11AB22): keep totals in EUR."
    assert cut_answer(SUMMARY, written, measure, limit=bound) == ""
    assert cut_answer(SUMMARY, written, measure, limit=None) == ""
    assert cut_answer(SUMMARY, "- R2 (RQ-33CD", measure, limit=1) == ""
    assert cut_answer(Request("m", RequestKind.MEDIA, Route.HOOK), written, measure, limit=1) == ""


# --- through the framework's parts ----------------------------------------------------------------------------


class CappingSummarizer(Summarizer):
    """A summarizer client that keeps each request's options and, with ``runaway``, writes until its cap cuts it."""

    def __init__(self, *, runaway: bool = False) -> None:
        super().__init__()
        self.runaway = runaway
        self.options: list[dict[str, Any]] = []
        self.transcripts: list[str] = []

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse]:
        self.options.append(dict(options))
        self.transcripts.append(messages[-1].text or "")
        if not self.runaway:
            return super()._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)
        self.calls += 1
        text = " ".join(["again"] * int(options["max_tokens"]))

        async def answer() -> ChatResponse:
            return ChatResponse(messages=[Message("assistant", [Content.from_text(text)])], finish_reason="length")

        return answer()


async def test_each_summarizer_request_carries_the_cap_of_the_turns_it_would_replace() -> None:
    summarizer = CappingSummarizer()
    run = await talk("summarizer", summarizer=summarizer, words=note).play(range(NOTES))
    assert summarizer.calls >= 1
    composition = run.strategy
    counted = composition.user_turns._counter.measure  # pyright: ignore[reportPrivateUsage]
    for options, transcript in zip(summarizer.options, summarizer.transcripts, strict=True):
        bound = counted(transcript)
        assert options["max_tokens"] == bound + max(bound, ANSWER_HEADROOM_TOKENS)
    assert [m for m in run.stored() if is_summary(m)], "a capped request still gets its summary"


async def test_an_answer_cut_at_its_cap_is_a_failure_named_in_a_warning_and_never_enters_history(
    caplog: pytest.LogCaptureFixture,
) -> None:
    summarizer = CappingSummarizer(runaway=True)
    with caplog.at_level(logging.WARNING, logger="maf_compaction"):
        run = await talk("summarizer", summarizer=summarizer, words=note).play(range(NOTES))
    assert summarizer.calls >= 1
    assert not [m for m in run.stored() if is_summary(m)]
    assert not [m for m in run.stored() if "again again" in (m.text or "")]
    cut = [r.getMessage() for r in caplog.records if "reached its output cap" in r.getMessage()]
    assert len(cut) == summarizer.calls
    assert all(f"max_tokens={o['max_tokens']}" in line for line, o in zip(cut, summarizer.options, strict=True))
    assert run.strategy.answers_cut == run.strategy.user_turns.answers_cut == summarizer.calls


async def test_a_summary_over_the_cached_prefix_carries_its_cap_and_task_requests_keep_their_own() -> None:
    run = await talk().play(range(TURNS))
    asks = summary_asks(run.sent)
    assert asks
    for i, sent in enumerate(run.sent):
        if i in asks:
            assert sent.options["max_tokens"] > ANSWER_HEADROOM_TOKENS
        elif not sent.asks_record and not asks_summary(sent):
            assert sent.options.get("max_tokens") == run.sent[0].options.get("max_tokens")


class CuttingProvider(Provider):
    """The framework's client layers over the scripted model, whose every record answer is cut at its cap (with
    ``truncate``, after two thirds of its text, one value to a line: the cut falls in the middle of a value)."""

    truncate: ClassVar[bool] = False

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Any:
        pending = super()._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)
        if not self.requests[-1].asks_record:
            return pending

        async def cut() -> ChatResponse:
            response = await pending  # type: ignore[misc]
            if self.truncate:
                text = "\n".join(" ".join(part.text or "" for m in response.messages for part in m.contents).split())
                response.messages = [Message("assistant", [Content.from_text(text[: 2 * len(text) // 3])])]
            response.finish_reason = "length"
            return response

        return cut()


async def test_a_record_cut_at_its_cap_is_an_answer_that_did_not_follow_the_instruction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Asked again, the same request would be cut again: two such answers turn the route off, as two answers that
    quote nothing do, and the safety net takes the record's place; nothing of them enters history."""
    with caplog.at_level(logging.WARNING, logger="maf_compaction"):
        run = await conversation(client=CuttingProvider()).play(range(CONVERSATION_TURNS))
    asks = asked(run.sent)
    assert len(asks) == IGNORED_LIMIT
    for i in asks:
        assert isinstance(run.sent[i].options.get("max_tokens"), int)
    cut = [r.getMessage() for r in caplog.records if "reached its output cap" in r.getMessage()]
    assert len(cut) == len(asks)
    assert all("did not follow the instruction" in line for line in cut)
    state = run.records.conversation.value.recall
    assert (state.ignored_instructions, state.failed_requests, no_route(state)) == (IGNORED_LIMIT, 0, True)
    assert not written_records(run.stored())
    assert run.records.answers_cut == len(asks)
    assert run.records.failed_prefix_requests == 0


def _text(message: Message) -> str:
    """Every text and tool result ``message`` carries."""
    return "\n".join(str(c.text or c.result or "") for c in message.contents)


class TruncatingProvider(CuttingProvider):
    """:class:`CuttingProvider`, cutting each record answer in the middle of a value."""

    truncate = True


async def test_a_record_cut_at_the_agents_own_cap_is_judged_by_its_complete_lines_and_the_route_stays(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The agent's own ``max_tokens`` is below what a record may hold: an answer cut there is no runaway. Its complete
    lines are judged as any record is (they quote results, so it is kept), the line the cut fell in never enters
    history (its last value is the start of another), nothing counts as ignored, and a WARNING says so."""
    own = 64  # below every record's bound here: no cut answer could be a runaway
    harness = {**HARNESS_OFF, "default_options": {"max_tokens": own}}
    with caplog.at_level(logging.WARNING, logger="maf_compaction"):
        run = await conversation(client=TruncatingProvider(), harness=harness).play(range(CONVERSATION_TURNS))
    asks = asked(run.sent)
    assert asks, "no record was asked for"
    assert all(run.sent[i].options.get("max_tokens") == own for i in asks)
    cut = [r.getMessage() for r in caplog.records if "reached the agent's own output cap" in r.getMessage()]
    assert len(cut) == len(asks)
    state = run.records.conversation.value.recall
    assert (state.ignored_instructions, no_route(state)) == (0, False)
    records = [m for _, m in written_records(run.stored())]
    assert records, "no cut record was kept"
    planted = {v for m in run.stored() if m.role == "tool" for v in distinctive_values(_text(m))}
    for record in records:
        assert set(distinctive_values(_text(record))) <= planted, "a value cut short entered a record"
    assert run.records.answers_cut == len(asks)
