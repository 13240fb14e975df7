"""Where the core marks a request for Anthropic's prompt cache (:mod:`maf_compaction.core.breakpoints`).

Examples of each strategy's marks, then properties over drawn histories as they grow, one sentence each:

- every mark names a message the request carries as a turn of the conversation, head before frontier before last;
- the prompt up to the head mark reads the same on every later pass, and so does the prompt up to the frontier
  mark, unless a later pass rewrote what compaction wrote before it (a fold or merge) or shed under the budget.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from maf_compaction import core
from maf_compaction.core.breakpoints import CacheMarks, cache_marks, strategy_marks
from maf_compaction.core.model import MessageRecord, flagged
from maf_compaction.core.records import Fallback
from maf_compaction.core.user_summaries import Outcome
from maf_compaction.testing import estimate_tokens, history_chunks, run_pass, shown
from test_core_replay_properties import KINDS, SHARES, budget_of, setup


def text(role: str, words: str, **flags: Any) -> MessageRecord:
    record = core.message(role, [core.text_part(words, estimate_tokens)])
    return flagged(record, **flags) if flags else record


def call(call_id: str) -> MessageRecord:
    return core.message("assistant", [core.call_part(call_id, "lookup", {"q": call_id}, estimate_tokens)])


def result(call_id: str) -> MessageRecord:
    return core.message("tool", [core.result_part(call_id, f"rows for {call_id}", estimate_tokens)])


def composed() -> core.History:
    """A composition's output: the head turn, a summary of turns 2-3 (their replies stay), a record of a lookup,
    then the user's next turn and a lookup still in the prompt."""
    return core.history(
        [
            text("user", "Build the export; keep the totals in EUR."),  # 0 head
            text("assistant", "Starting."),  # 1 head
            text("user", "[earlier turns, compacted] ...", summary=True),  # 2
            text("user", "Add a CSV header.", excluded=True),  # 3 summarized
            text("assistant", "Added."),  # 4
            flagged(call("c1"), excluded=True),  # 5 recorded
            flagged(result("c1"), excluded=True),  # 6
            text("assistant", "[recorded by compaction] c1: rows", written_record=True),  # 7
            text("user", "Now sort by date.", excluded=True),  # 8 summarized
            text("assistant", "Sorted."),  # 9
            text("user", "Check the March rows."),  # 10: the next summary starts here
            call("c2"),  # 11
            result("c2"),  # 12
            text("assistant", "March is fine."),  # 13
        ]
    )


def test_the_composition_marks_its_head_the_end_of_what_it_settled_and_the_last_message() -> None:
    anchored = core.AnchoredConfig(max_input_tokens=10_000)
    records = core.RecordConfig(max_input_tokens=10_000, fallback=anchored)
    users = core.UserSummaryConfig(max_input_tokens=10_000, summary_mode="boundary")
    config = core.CompositionConfig(records=records, users=users)
    marks = strategy_marks(config, composed())
    # The head is one user turn (the shorter of the halves' heads); the next summary replaces turn 10 and
    # the next record a group after it, so everything before 10 stays: assistant replies among summaries too.
    assert marks == CacheMarks(last=13, frontier=9, head=1)
    assert marks.ordered() == (13, 9, 1)
    assert marks.ordered(last=False) == (9, 1)
    # In recompact mode the next summary replaces the standing one too: nothing past the head is settled.
    recompact = core.CompositionConfig(records=records, users=replace(users, summary_mode="recompact"))
    assert strategy_marks(recompact, composed()) == CacheMarks(last=13, frontier=None, head=1)


def test_a_short_turn_left_before_a_summary_never_pulls_the_frontier_back() -> None:
    """A composition leaves a turn shorter than its summary verbatim at the band's edge, before the summary that
    follows it; past the head a summary is asked only for turns after the last one standing, so that turn never
    changes and the frontier stays after the summary (in recompact mode a summary re-summarises the band from its
    first turn, the short one too when nothing longer follows it: the frontier stays before it)."""
    history = core.history(
        [
            text("user", "Build the export; keep the totals in EUR."),  # 0 head
            text("assistant", "Starting."),  # 1 head
            text("user", "Ok."),  # 2: short, left verbatim
            text("assistant", "Sure."),  # 3
            text("user", "[earlier turns, compacted] ...", summary=True),  # 4
            text("user", "Add a CSV header with every column the finance team asked for.", excluded=True),  # 5
            text("assistant", "Added."),  # 6
            text("user", "Now sort by date."),  # 7: the next summary starts here
            text("assistant", "Sorted."),  # 8
        ]
    )
    assert cache_marks(history, keep_head_user_turns=1) == CacheMarks(last=8, frontier=6, head=1)
    assert cache_marks(history, keep_head_user_turns=1, summaries_move=True) == CacheMarks(
        last=8, frontier=None, head=1
    )


def test_the_record_half_alone_builds_after_assistant_replies_it_never_changes() -> None:
    history = composed()
    records = cache_marks(history, keep_head_groups=1, group_kinds=frozenset({"tool_call"}))
    anchored = cache_marks(history, keep_head_groups=1)
    # Records change tool groups: the first still in the prompt is c2's (11). The anchored rules change any
    # band group: the first after the head is the assistant's reply at 1.
    assert (records.head, records.frontier) == (0, 10)
    assert (anchored.head, anchored.frontier) == (0, None)


def test_injected_excluded_and_instructions_are_never_marked() -> None:
    history = core.history(
        [
            text("system", "You are terse."),
            text("user", "Start."),
            text("assistant", "Started."),
            text("user", "Continue."),
            text("assistant", "Done.", excluded=True),
            text("user", "todo: 1. check", injected=True),
        ]
    )
    marks = cache_marks(history, keep_head_user_turns=1)
    assert marks == CacheMarks(last=3, frontier=None, head=2)
    assert cache_marks(core.history([text("system", "x"), text("user", "y", injected=True)])) == CacheMarks(
        None, None, None
    )


def test_a_conversation_inside_its_head_marks_only_its_last_message() -> None:
    history = core.history([text("user", "Start."), text("assistant", "Started.")])
    assert cache_marks(history, keep_head_groups=3).ordered() == (1,)
    assert cache_marks(history, keep_head_user_turns=1).ordered() == (1,)


# ----------------------------------------------------------------------------------------- properties


def rewrote(report: object) -> bool:
    """The pass rewrote what compaction wrote before (a fold, a merge of records or summaries) or ran the anchored
    rules under the budget (the fallback, a shed): the frontier is a forecast of the next decisions, not of these."""
    if isinstance(report, core.CompositionReport):
        return bool(report.fallback or report.shed or report.folded or report.replaced or rewrote(report.records))
    if isinstance(report, core.RecordReport):
        return report.fallback is not Fallback.NONE or report.fallback_report is not None
    return getattr(report, "outcome", None) is Outcome.FOLDED


def _prompt_to(history: core.History, index: int) -> list[Any]:
    return shown(r for r in history[: index + 1] if not r.excluded)


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_every_mark_names_a_turn_the_request_carries_in_order(kind: str, data: st.DataObject) -> None:
    growth = data.draw(history_chunks(min_chunks=1, max_chunks=2, min_turns=3, max_turns=9))
    chosen = setup(kind, budget_of(growth[-1], data.draw(st.sampled_from(SHARES))))
    with contextlib.suppress(core.CompactionBudgetExceeded):
        state = chosen.state
        for given_ in growth:
            passed = run_pass(chosen.step, chosen.config, state, given_, estimate_tokens, rule=chosen.rule)
            state = passed.state
            out = passed.done.history
            marks = strategy_marks(chosen.config, out)
            for index in marks.ordered():
                record = out[index]
                assert not record.excluded
                assert record.role != "system"
                assert record.in_conversation
            present = [m for m in (marks.head, marks.frontier, marks.last) if m is not None]
            assert present == sorted(set(present))
            assert marks == strategy_marks(chosen.config, core.history(out))  # a value of the history alone


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_the_prompt_before_a_mark_reads_the_same_on_the_next_pass(kind: str, data: st.DataObject) -> None:
    growth = data.draw(history_chunks(min_chunks=2, max_chunks=4, min_turns=3, max_turns=9))
    chosen = setup(kind, budget_of(growth[-1], data.draw(st.sampled_from(SHARES))))
    note(f"budget {chosen.config.max_input_tokens}")
    with contextlib.suppress(core.CompactionBudgetExceeded):
        state = chosen.state
        earlier: tuple[core.History, CacheMarks] | None = None
        for given_ in growth:
            passed = run_pass(chosen.step, chosen.config, state, given_, estimate_tokens, rule=chosen.rule)
            state = passed.state
            out = passed.done.history
            if earlier is not None:
                before, marks = earlier
                now = shown(r for r in out if not r.excluded)
                for mark in (marks.head, None if rewrote(passed.done.report) else marks.frontier):
                    if mark is not None:
                        kept = _prompt_to(before, mark)
                        assert now[: len(kept)] == kept, mark
            earlier = (out, strategy_marks(chosen.config, out))
