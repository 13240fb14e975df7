"""Failed requests over the cached prefix back off; they never give the route up (pure core, hypothesis).

The finding: two brief provider failures (a 503 on turns 3-4, healthy after) counted like two ignored instructions
and switched records off for the rest of the session, in its saved state too. A failure says nothing of the model:
:func:`recall.failed` counts it, and only ``FAILURE_LIMIT`` in a row set the route to rest for ``REST_CALLS`` model
calls (doubled on each further failure, at most ``MAX_REST_CALLS``); each model call the middleware sees counts the
rest down; any answer resets the count. Every change is worded for a WARNING by :func:`recall.route_news`.

While the route rests the safety net stands in for the record, over the band of a tail of one group
(:func:`records.fallback_for`); when the rest ends the fallback keeps the configured tail again. What the net
decided meanwhile is named by positions counted from the head, some of them in the configured tail: those decisions
stand after the rest, like any other (the last tests here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace as evolve

from maf_compaction import core
from maf_compaction.core import answers, recall, records
from maf_compaction.core.effects import Request, Route
from maf_compaction.core.recall import FAILURE_LIMIT, IGNORED_LIMIT, MAX_REST_CALLS, REST_CALLS, HistorySeen, PinRule
from maf_compaction.core.state import RecallState, RecallStatus, RecordRoute, RequestKind, State
from maf_compaction.testing import check_later_passes_keep_earlier_decisions, estimate_tokens

Event = Literal["fail", "answer", "ignored", "call"]
RULE = PinRule(trigger_tokens=6_000, aligned=True)  # a host that asks over the cached prefix
PINNING = PinRule(trigger_tokens=6_000)
STATUS = RecallStatus(included_tokens=9_000, records=0, pending_groups=5)


def step(state: RecallState, event: Event) -> RecallState:
    if event == "fail":
        return recall.failed(state)
    if event == "answer":
        return recall.judged_instruction(state, followed=True)
    if event == "ignored":
        return recall.judged_instruction(state, followed=False)
    return recall.advance(RULE, state, HistorySeen(STATUS))[0]


@given(
    st.sampled_from([RecordRoute.CACHED_PREFIX, RecordRoute.PINS_IGNORED]),
    st.lists(st.sampled_from(["fail", "answer", "call"]), max_size=60),
)
def test_failures_alone_never_give_the_route_up_and_a_rest_follows_only_a_run_of_them(
    route: RecordRoute, events: list[Event]
) -> None:
    state = RecallState(route=route)
    run = 0
    for event in events:
        before, state = state, step(state, event)
        assert state.route is route  # never NONE for failures
        run = run + 1 if event == "fail" else 0 if event == "answer" else run
        assert state.failed_requests == run
        if event == "fail":
            expected = 0 if run < FAILURE_LIMIT else min(REST_CALLS << (run - FAILURE_LIMIT), MAX_REST_CALLS)
            assert state.resting == (expected or before.resting)
        elif event == "call":
            assert state.resting == max(0, before.resting - 1)
        assert recall.records_over_prefix(state) == (state.resting == 0)
        assert recall.no_route(state) == (state.resting > 0)
        news = recall.route_news(before, state)
        if state.resting > before.resting:
            assert f"rests for the next {state.resting} model call(s)" in (news or "")
        elif before.resting and not state.resting:
            assert news == "requests over the cached prefix are tried again after their rest"
        else:
            assert news is None


def test_ignored_instructions_still_give_the_route_up_and_say_so() -> None:
    state = RecallState(route=RecordRoute.CACHED_PREFIX)
    once = step(state, "ignored")
    twice = step(once, "ignored")
    assert (once.route, twice.route) == (RecordRoute.CACHED_PREFIX, RecordRoute.NONE)
    assert "no record is asked for in this conversation" in (recall.route_news(once, twice) or "")
    assert recall.no_route(step(twice, "answer"))  # an answer after giving up does not bring it back


def test_a_pinning_host_is_never_set_to_rest_by_prefix_failures() -> None:
    """Only the cached-prefix route fails this way; a host that pins keeps pinning."""
    state = RecallState(route=RecordRoute.PINNED)
    for _ in range(FAILURE_LIMIT):
        state = recall.failed(state)
    assert state.resting == REST_CALLS
    assert not recall.no_route(state)
    assert recall.advance(PINNING, state, HistorySeen(STATUS))[0].next_pin == "size"


SummaryEvent = Literal["ignored", "followed", "aside"]


@given(st.lists(st.sampled_from(("ignored", "followed", "aside")), max_size=12))
def test_summaries_go_to_the_summarizer_for_good_only_after_a_run_of_ignored_answers(
    events: list[SummaryEvent],
) -> None:
    """An ignored summary over the cached prefix sends that summary to the summarizer (``summaries_to_summarizer``);
    the summarizer's answer sends the next one over the prefix again; only IGNORED_LIMIT ignored in a row (no
    followed answer between them) keep every later summary with the summarizer, which is said once. The record
    route's own verdict is never touched."""
    state, run, given_up = RecallState(route=RecordRoute.CACHED_PREFIX), 0, False
    for event in events:
        before = state
        if event == "aside":
            state = recall.summarized_aside(state)
        else:
            state = recall.judged_summary(state, followed=event == "followed")
            run = 0 if event == "followed" else run + 1
            given_up = given_up or run >= IGNORED_LIMIT
        news = recall.route_news(before, state)
        assert state.ignored_summaries == run
        assert (news is not None) == (run == IGNORED_LIMIT and before.ignored_summaries < IGNORED_LIMIT), news
        if event == "ignored":
            assert state.summaries_to_summarizer
        elif event == "aside":
            assert state.summaries_to_summarizer == (run >= IGNORED_LIMIT)
        assert (state.route, state.ignored_instructions) == (RecordRoute.CACHED_PREFIX, 0)


@given(
    st.builds(
        RecallStatus,
        included_tokens=st.integers(0, 20_000),
        records=st.integers(0, 3),
        pending_groups=st.integers(0, 5),
        pending_tokens=st.integers(0, 20_000),
    ),
    st.integers(1, 20_000),
    st.integers(1, 5),
    st.booleans(),
)
def test_repeat_tokens_add_a_later_record_exactly_when_new_groups_send_that_much(
    status: RecallStatus, repeat_tokens: int, min_groups: int, repeat_records: bool
) -> None:
    """``repeat_tokens`` makes a later record due where ``min_groups_before_repeat`` or the trigger alone would wait,
    exactly when new tool groups send that many tokens (below the trigger too); it never unmakes a record, and
    changes nothing before the first record or with repeats off."""
    base = PinRule(trigger_tokens=6_000, min_groups_before_repeat=min_groups, repeat_records=repeat_records)
    with_tokens = PinRule(
        trigger_tokens=6_000,
        min_groups_before_repeat=min_groups,
        repeat_records=repeat_records,
        repeat_tokens=repeat_tokens,
    )
    before, after = recall.pin_due(base, status), recall.pin_due(with_tokens, status)
    heavy = status.pending_groups > 0 and status.pending_tokens >= repeat_tokens
    added = status.records > 0 and repeat_records and heavy
    assert after == (before or added)
    if not status.records or not repeat_records:
        assert after == before


def test_only_a_summary_the_summarizer_answers_sends_the_next_one_over_the_cached_prefix_again() -> None:
    """After one ignored summary (the flag set, the streak at 1) a record merge the summarizer answers leaves the
    next summary with the summarizer; the summary it answers sends the next one over the cached prefix again; a
    failed summary request changes nothing."""
    aside = State(recall=RecallState(summaries_to_summarizer=True, ignored_summaries=1))
    merge = Request("m" * 32, RequestKind.MERGE, Route.SUMMARIZER, message_id="record_merge_0", sources=2)
    summary = Request("s" * 32, RequestKind.SUMMARY, Route.SUMMARIZER, message_id="user_summary_0", sources=2)
    assert answers.absorb(aside, [(merge, "merged: XR-1 XR-2")]).recall.summaries_to_summarizer
    assert answers.absorb(aside, [(summary, None)]).recall.summaries_to_summarizer
    after = answers.absorb(aside, [(summary, "the user asked for XR-1")]).recall
    assert (after.summaries_to_summarizer, after.ignored_summaries) == (False, 1)
    given_up = State(recall=RecallState(summaries_to_summarizer=True, ignored_summaries=IGNORED_LIMIT))
    assert answers.absorb(given_up, [(summary, "the user asked for XR-1")]).recall.summaries_to_summarizer


def test_a_summary_part_that_quotes_none_of_its_values_is_lacking_not_an_ignored_instruction() -> None:
    """A summary asked within a record's request shares the answer's room with the record: a part without any
    of its items' values is no answer (asked alone next, over the cached prefix), and says nothing of how the
    model follows a summary request of its own. Asked alone, the same answer is an ignored instruction."""
    transcript = "1. keep ticket XR-1 open\n2. ship ticket XR-2 by friday"
    summary = Request(
        "s" * 32, RequestKind.SUMMARY, Route.CACHED_PREFIX, transcript=transcript, message_id="user_summary_0"
    )
    record = Request("r" * 32, RequestKind.RECORD, Route.CACHED_PREFIX, message_id="compaction_record_0", also=summary)
    lacking = "Item 1 is about a ticket. Item 2 is about shipping."
    state = answers.absorb(State(), [(record, f"lookup 1: TL-1\n{records.SUMMARY_SECTION}\n{lacking}")])
    assert (state.recall.summaries_to_summarizer, state.recall.ignored_summaries) == (False, 0)
    assert all(a.identity != summary.identity for a in state.answers)
    alone = answers.absorb(State(), [(summary, lacking)]).recall
    assert (alone.summaries_to_summarizer, alone.ignored_summaries) == (True, 1)


# ----------------------------------------------------------------------------- after the rest

FILLER = "eu-west cache-miss status=ok took=12 ms shard=3 the request completed within its window"


def lookup_text(n: int, *, dense: bool) -> str:
    """A lookup's result: mostly filler with a value line in ten (``dense``: a value on every line)."""
    if dense:
        return "\n".join(f"code_{n}_{i}=TL-{n:02d}{i:04d} owner=ana{n}{i}" for i in range(40))
    lines = [f"[record {i}] code_{n}_{i}=TL-{n:02d}{i:04d}" if i % 10 == 5 else FILLER for i in range(40)]
    return "\n".join([f"# lookup {n}", *lines])


def lookups(count: int, *, dense: bool) -> list[core.MessageRecord]:
    """A task, then ``count`` lookups (a user turn, a call, its result, a reply): lookup 0 closes the head of three
    groups, and lookup ``n``'s tool group is at band position ``n - 1``."""
    measure = estimate_tokens
    records = [core.message("user", [core.text_part("Task: reconcile.", measure)], origin=0)]
    for n in range(count):
        parts = [
            ("user", core.text_part(f"Please run lookup {n}.", measure)),
            ("assistant", core.call_part(f"call_{n}", "lookup", {"n": n}, measure)),
            ("tool", core.result_part(f"call_{n}", lookup_text(n, dense=dense), measure)),
            ("assistant", core.text_part(f"Lookup {n} is done.", measure)),
        ]
        records += [core.message(role, [part], origin=len(records) + k) for k, (role, part) in enumerate(parts)]
    return records


def rest_then_growth(*, dense: bool) -> tuple[core.History, core.History]:
    """Eight lookups, then the same with the user's next turn: one group more, so the configured tail (four groups)
    still holds lookup 7's tool group (band position 6) while a tail of one does not."""
    first = lookups(8, dense=dense)
    later = [*first, core.message("user", [core.text_part("And now?", estimate_tokens)], origin=len(first))]
    return core.history(first), core.history(later)


def configured(kind: str, budget: int) -> tuple[Any, Callable[..., Any]]:
    records = core.RecordConfig(max_input_tokens=budget, fallback=core.AnchoredConfig(max_input_tokens=budget))
    if kind == "records":
        return records, core.records_step
    users = core.UserSummaryConfig(max_input_tokens=budget)
    return core.CompositionConfig(records=records, users=users), core.composition_step


#: Pinning was given up, and the cached-prefix route rests for one more model call: the first pass runs the net
#: (a tail of one group); the request it compacts counts the rest down, so the next pass keeps the configured tail.
RESTING = State(recall=RecallState(route=RecordRoute.PINS_IGNORED, resting=1))


@pytest.mark.parametrize("fill", [0.7, 3.0])
@pytest.mark.parametrize("kind", ["records", "composition"])
def test_what_the_net_cut_while_the_route_rested_stays_cut_after_the_rest(kind: str, fill: float) -> None:
    """Past the record trigger while the route rests, the net cuts every lookup after the head and before the newest
    group to its value lines, lookup 7 (band position 6) too. After the rest the band keeps four groups at the end
    again, and position 6 lies in that tail: its cut replays there, byte for byte (it was dropped, from the prompt
    and from the state: lookup 7's result came back whole, a second break)."""
    first, later = rest_then_growth(dense=False)
    config, step = configured(kind, int(core.sent_tokens(first) / fill))
    after = check_later_passes_keep_earlier_decisions(
        [first, later], step=step, config=config, state=RESTING, measure=estimate_tokens, rule=core.record_rule(config)
    )
    assert not recall.no_route(after.recall), "the second pass ran with the rest over"
    assert after.fallback.distilled == tuple(range(7))


def test_after_the_rest_the_composition_keeps_shedding_value_dense_results_under_the_budget() -> None:
    """Value-dense results (the net's value lines are the whole result) over three times the budget: while the route
    rests the shed policy sheds every lookup before the newest group, band position 6 too. After the rest it reads
    its band with the configured tail, where position 6 is not: the group came back and nothing was shed in its
    place, so the pass raised CompactionBudgetExceeded. It stays shed."""
    first, later = rest_then_growth(dense=True)
    config, step = configured("composition", int(core.sent_tokens(first) / 3))
    after = check_later_passes_keep_earlier_decisions(
        [first, later], step=step, config=config, state=RESTING, measure=estimate_tokens, rule=core.record_rule(config)
    )
    assert not recall.no_route(after.recall)
    assert after.chain.shed.tools_shed == 7


@pytest.mark.parametrize("kind", ["records", "composition"])
def test_a_state_after_the_rest_fits_its_conversation_on_restore(kind: str) -> None:
    """A host restoring the state saved after the rest checks it against the conversation. Its positions were decided
    over the net's band (a tail of one group), some past the configured band: the check judged them by the configured
    band and refused the state as another conversation's ("snapshot field 'shortened' is 7, but this conversation's
    band holds 6 such group(s)"). It judges them by the widest band the fallback runs with, and still refuses a
    position past that."""
    first, later = rest_then_growth(dense=False)
    config, step = configured(kind, int(core.sent_tokens(first) / 0.7))
    after = check_later_passes_keep_earlier_decisions(
        [first, later], step=step, config=config, state=RESTING, measure=estimate_tokens, rule=core.record_rule(config)
    )
    check = core.records_check if kind == "records" else core.composition_check
    assert not recall.no_route(after.recall)
    assert check(config, after, later) is None
    forged = evolve(after, fallback=evolve(after.fallback, distilled=(*after.fallback.distilled, 7)))
    assert "names band position 7" in (check(config, forged, later) or "")
