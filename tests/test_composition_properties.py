"""Property-based tests of the composition over generated histories.

Each history comes from ``histories.py`` (user turns, some pasted or with media, tool
rounds with reasoning, parallel calls, late results, tables and planted codes), with a
record appended now and then (``records_for`` from the record properties: it quotes all,
some or none of each earlier result). The budget is drawn as a share of the history's
own size, so passes land below the trigger, between the trigger and the budget (with
room for another step like the largest, and without it), and far over it; the overflow
policy and whether the recall protocol has a pin pending (a record is due, so the user
half may wait) are drawn too. The summarizer is the extractive
``ScriptedSummarizer`` (a framework chat client whose model is a script).

Properties, one sentence each:

- nothing leaves the prompt unless a record covers it, a summary links to it, or a
  WARNING names it;
- the same state gives the same bytes on the in-call copies (with injected context), on
  the stored history and on a deep copy (the in-call copies may raise where the stored
  history fits: the injected context counts toward the budget);
- no summarizer request is sent twice for one state;
- a pass over a pass's output changes nothing, but for a summary of the user turns a
  bounded request left for later passes (the README's bounded passes);
- a pass meets the budget (by the package's one definition of the sent size, recomputed
  from the list) or raises ``CompactionBudgetExceeded`` and leaves the list untouched.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_framework import CharacterEstimatorTokenizer, Message
from agent_framework._compaction import EXCLUDE_REASON_KEY
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn
from msgspec.structs import replace

from histories import conversations, deep_copy_messages, describe, is_injected_todo, with_injected_context
from maf_compaction import (
    CompactionBudgetExceeded,
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
    UserTurnAnchoredSummarizationCompactionStrategy,
)
from maf_compaction.adapters.convert import EXCLUDED_KEY, HOLD_KEY, SUMMARIZED_BY_KEY, SUMMARY_KEY, to_history
from maf_compaction.adapters.counting import as_estimator
from maf_compaction.core.protocol import sent_tokens
from maf_compaction.core.records import HOLD_UNRECORDED
from maf_compaction.core.state import RecallState, RecordRoute
from maf_compaction.core.user_summaries import Outcome
from test_records_properties import records_for
from test_user_summaries import ScriptedSummarizer, extractive
from wiring import recalled

TOKENIZER = CharacterEstimatorTokenizer()
Composition = ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy
LINKED = frozenset({"user_turn_summarized", "user_summaries_folded"})
RECORDED = "tool_summary_anchored"
_PAD = "keep the export layout readable for the finance team"
_NAMES = re.compile(r"excluded: (.*)$")


@dataclass(frozen=True)
class Case:
    """A history and how the composition is configured for it."""

    history: list[Message]
    share: float
    policy: str
    route: str  # "open", "pinned" (a pin decided for the next request) or "none" (no route to a record left)
    mode: str
    payoff: float | None = None  # the record half's record_payoff_share

    def budget(self) -> int:
        return max(1, int(size(self.history) * self.share))


@st.composite
def cases(draw: DrawFn) -> Case:
    history = deep_copy_messages(draw(conversations(min_turns=3, max_turns=9)))
    if draw(st.booleans()):  # chatty users: long turns, so the user half has a band worth a summary
        for n, message in enumerate(history):
            if message.role == "user" and all(c.type == "text" for c in message.contents):
                message.contents[0].text = f"{message.text}\nRequirement RQ-{n:06X}: " + " ".join([_PAD] * 12)
    if draw(st.booleans()):
        history = [*history, *draw(records_for(history))]
        history.append(Message("user", ["Go on."], message_id="after_record"))
    return Case(
        history=history,
        share=draw(st.sampled_from([0.25, 0.5, 0.7, 0.9, 1.05, 1.15, 1.5])),
        policy=draw(st.sampled_from(["shed", "raise"])),
        route=draw(st.sampled_from(["open", "pinned", "none", "open"])),  # no route: a quarter of the cases
        mode=draw(st.sampled_from(["boundary", "recompact", "fold"])),
        payoff=draw(st.sampled_from([None, 0.2])),
    )


def made_dense(history: Sequence[Message]) -> None:
    """Every string tool result in ``history`` replaced, in place, by a value-dense log (a value on every line)."""
    for message in history:
        for content in message.contents:
            if content.type == "function_result" and isinstance(content.result, str):
                content.result = "\n".join(
                    f"{content.call_id}-{i:04d} node=nd{i % 7}x took={1000 + i}ms" for i in range(24)
                )


@st.composite
def room_cases(draw: DrawFn) -> Case:
    """Value-dense results no record would pay for, an open route, the shed policy, the README's boundary mode,
    and a prompt that fits its budget but not beside a step like its largest: where the shed makes room before the
    budget (about a third of the examples do)."""
    case = draw(cases())
    made_dense(case.history)
    share = draw(st.sampled_from([1.02, 1.05, 1.1]))
    return Case(case.history, share=share, policy="shed", route="open", mode="boundary", payoff=0.2)


# ----------------------------------------------------------------------------- helpers


def size(messages: Sequence[Message]) -> int:
    """The sent size of ``messages`` by the package's one definition, recomputed from the list."""
    return sent_tokens(to_history(messages, as_estimator(TOKENIZER).parts, note_kind="anchored"))


def build(case: Case, summarizer: ScriptedSummarizer) -> Composition:
    budget = case.budget()
    records = ToolResultAnchoredSummarizationCompactionStrategy(
        max_input_tokens=budget, tokenizer=TOKENIZER, record_target_tokens=150, record_payoff_share=case.payoff
    )
    users = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=budget,
        tokenizer=TOKENIZER,
        client=summarizer,
        summary_mode=case.mode,  # type: ignore[arg-type]
        remembered_requests=2,
    )
    strategy = Composition(
        tokenizer=TOKENIZER,
        tool_results=records,
        user_turns=users,
        overflow_policy=case.policy,  # type: ignore[arg-type]
    )
    recalled(strategy)
    routes = {"pinned": RecallState(next_pin="size"), "none": RecallState(route=RecordRoute.NONE)}
    if case.route in routes:
        shared = records.conversation
        shared.value = replace(shared.value, recall=routes[case.route])
    return strategy


def run(strategy: Composition, messages: list[Message]) -> CompactionBudgetExceeded | None:
    try:
        asyncio.run(strategy(messages))
    except CompactionBudgetExceeded as error:
        return error
    return None


def shown(messages: Sequence[Message]) -> list[str]:
    """What the model is sent, message by message, as canonical JSON (injected context aside)."""
    return [
        json.dumps([m.role, m.to_dict(exclude_none=True).get("contents")], sort_keys=True, default=str)
        for m in messages
        if not m.additional_properties.get(EXCLUDED_KEY) and not is_injected_todo(m)
    ]


def dump(messages: Sequence[Message]) -> list[dict[str, Any]]:
    return [m.to_dict() for m in messages]


@contextmanager
def captured() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("maf_compaction")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def named_in_warnings(records: Sequence[logging.LogRecord]) -> list[str]:
    names: list[str] = []
    for record in records:
        if record.levelno >= logging.WARNING and (found := _NAMES.search(record.getMessage())):
            names += [n.strip() for n in found.group(1).split(", ")]
    return names


def transcripts(summarizer: ScriptedSummarizer) -> list[str]:
    return ["\n".join(m.text for m in request) for request in summarizer.requests]


# ----------------------------------------------------------------------------- properties


@given(st.one_of(cases(), room_cases()))
def test_nothing_leaves_the_prompt_unless_recorded_summarized_or_named_in_a_warning(case: Case) -> None:
    messages = deep_copy_messages(case.history)
    strategy = build(case, ScriptedSummarizer(extractive))
    with captured() as logs:
        failure = run(strategy, messages)
    if failure is not None:
        return  # the list is untouched (see the budget property)
    names = named_in_warnings(logs)
    summaries = {
        m.message_id
        for m in messages
        if SUMMARY_KEY in m.additional_properties and not m.additional_properties.get(EXCLUDED_KEY)
    }
    before = {id(m) for m in case.history}
    assert not before & {id(m) for m in messages}
    for index, message in enumerate(messages):
        props = message.additional_properties
        if not props.get(EXCLUDED_KEY) or SUMMARY_KEY in props:
            continue
        reason = props.get(EXCLUDE_REASON_KEY)
        if reason in LINKED:
            assert props.get(SUMMARIZED_BY_KEY) in summaries, f"message {index} linked to no standing summary"
            continue
        label = message.message_id or f"<{message.role} message"
        assert reason == RECORDED or any(n == label or n.startswith(label) for n in names), (
            f"message {index} ({message.message_id}, reason {reason!r}) left without a WARNING naming it; "
            f"named: {names}\n{describe(case.history)}"
        )
        if reason == RECORDED:
            assert message.message_id is None or message.message_id in names


@given(st.one_of(cases(), room_cases()))
def test_the_same_state_gives_the_same_bytes_on_both_lists_and_a_deep_copy(case: Case) -> None:
    summarizer = ScriptedSummarizer(extractive)
    strategy = build(case, summarizer)
    copies = with_injected_context(case.history)
    stored = deep_copy_messages(case.history)
    first = run(strategy, copies)
    second = run(strategy, stored)
    if first is None:
        assert second is None, "the stored history carries less than the in-call copies"
    if second is not None:
        return
    if first is None:
        assert shown(copies) == shown(stored)
    again = deep_copy_messages(case.history)
    assert run(strategy, again) is None
    assert dump(again) == dump(stored)


@given(st.one_of(cases(), room_cases()))
def test_a_pass_over_a_passs_output_changes_nothing(case: Case) -> None:
    settles(case.history, build(case, ScriptedSummarizer(extractive)))


def settles(history: Sequence[Message], strategy: Composition) -> int:
    """Passes over a pass's output change nothing, but for the user half's bounded passes; how many changed.

    One summarizer request is bounded by ``max_summary_input_tokens`` and never spans a
    turn that stays verbatim, so a pass summarises the oldest whole turns that fit and newer
    ones stay for later passes (the README). Each later pass may summarise more of them
    (in fold mode, fold the summaries so made: one fold request per pass, as one summary),
    and nothing else: every message that is not a user turn is left as it was.
    """
    messages = deep_copy_messages(history)
    if run(strategy, messages) is not None:
        return 0  # the list is untouched (see the budget property)
    report = strategy.last_report
    assert report is not None
    if report.over_budget:
        return 0  # the user half made progress over the budget: the next pass continues from it
    for later in range(len(messages)):  # each later pass that changes anything summarises a user turn
        compacted = dump(messages)
        assert run(strategy, messages) is None
        if dump(messages) == compacted:
            return later
        report = strategy.last_report
        assert report is not None
        assert report.users is not None
        assert report.users.outcome in {Outcome.SUMMARIZED, Outcome.FOLDED}, "only the user half's later passes"
        assert [m for m in dump(messages) if m["role"] != "user"] == [m for m in compacted if m["role"] != "user"]
    pytest.fail("passes over the output never settled")


def test_a_bounded_request_leaves_newer_turns_for_the_next_pass() -> None:
    """Found by the long profile: the user band (seven long turns) is larger than one summarizer request may
    carry (``max_summary_input_tokens``, half the budget by default), so a pass summarises the three oldest and
    the next pass over its output the rest, as the README says ("newer material stays for later passes"); the
    pass after that changes nothing."""
    stored = json.loads((Path(__file__).parent / "fixtures" / "bounded_summary_requests.json").read_text())
    history = [Message.from_dict(m) for m in stored["history"]]
    case = Case(history, stored["share"], stored["policy"], stored["route"], stored["mode"])
    assert settles(case.history, build(case, ScriptedSummarizer(extractive))) == 1


@given(cases())
def test_no_summarizer_request_is_sent_twice_for_one_state(case: Case) -> None:
    summarizer = ScriptedSummarizer(extractive)
    strategy = build(case, summarizer)
    failed = [run(strategy, lst) for lst in (with_injected_context(case.history), deep_copy_messages(case.history))]
    if any(f is not None for f in failed):
        return  # a failed pass keeps no answer
    run(strategy, deep_copy_messages(case.history))
    sent = transcripts(summarizer)
    assert len(sent) == len(set(sent)), f"{len(sent)} requests, {len(set(sent))} distinct"


@given(cases())
def test_a_call_and_its_result_stay_or_leave_together(case: Case) -> None:
    messages = deep_copy_messages(case.history)
    if run(build(case, ScriptedSummarizer(extractive)), messages) is not None:
        return
    state: dict[str, set[bool]] = {}
    calls: dict[str, int] = {}
    for message in messages:
        for content in message.contents:
            if content.type in ("function_call", "function_result") and content.call_id:
                state.setdefault(content.call_id, set()).add(bool(message.additional_properties.get(EXCLUDED_KEY)))
                calls[content.call_id] = calls.get(content.call_id, 0) + (content.type == "function_call")
    # A call id the generator reuses for several calls names no single pair: only unique ids are judged.
    split = sorted(call_id for call_id, flags in state.items() if len(flags) > 1 and calls[call_id] == 1)
    assert not split, f"calls split from their results: {split}\n{describe(case.history)}"


@given(cases())
def test_a_pass_meets_the_budget_or_raises_and_leaves_the_list_untouched(case: Case) -> None:
    messages = deep_copy_messages(case.history)
    before = dump(messages)
    strategy = build(case, ScriptedSummarizer(extractive))
    failure = run(strategy, messages)
    budget = case.budget()
    if failure is None:
        report = strategy.last_report
        assert report is not None
        # Over the budget only when the user half made progress (the next pass continues from it).
        assert size(messages) <= budget or (report.over_budget and report.users is not None and report.users.replaced)
    else:
        assert dump(messages) == before
        assert failure.budget == budget
        assert failure.needed > budget


@given(cases())
def test_no_step_reports_making_the_prompt_larger_as_the_conversation_grows(case: Case) -> None:
    """The finding: a pass reported its shed step taking the prompt from 9,690 to 10,210 tokens. The step had
    counted its input without the notes of earlier sheds (the stored list keeps their exclusions, not their notes),
    then put them back. Each step's figures now start from the prompt as the earlier decisions leave it."""
    strategy = build(case, ScriptedSummarizer(extractive))
    grown: list[Message] = []
    for message in case.history:
        grown.append(message)
        if message.role != "user":
            continue
        run(strategy, grown)
        report = strategy.last_report
        for name, step in (("shed", report and report.shed), ("fallback", report and report.fallback)):
            if step:
                assert step.tokens_after <= step.tokens_before, f"the {name} step grew the prompt at {len(grown)}"


def test_the_generator_reaches_every_outcome() -> None:
    """The properties are not vacuous: over the sample, passes fit, shed, summarise, wait and raise."""
    seen: dict[str, int] = {
        "fit": 0,
        "raised": 0,
        "shed": 0,
        "summarized": 0,
        "waited": 0,
        "recorded": 0,
        "netted": 0,
    }

    # More than the default profile's examples: seven outcomes over four routes, two policies and seven shares.
    @settings(max_examples=max(120, settings().max_examples))
    @given(cases())
    def sample(case: Case) -> None:
        strategy = build(case, ScriptedSummarizer(extractive))
        messages = deep_copy_messages(case.history)
        if run(strategy, messages) is not None:
            seen["raised"] += 1
            return
        seen["fit"] += 1
        report = strategy.last_report
        assert report is not None
        seen["shed"] += bool(report.shed is not None and report.shed.shed)
        seen["summarized"] += report.users is not None and report.users.summary_id is not None
        seen["waited"] += report.waited
        seen["recorded"] += bool(report.records.covered)
        seen["netted"] += case.route == "none" and report.fallback is not None and bool(report.fallback.distilled)

    sample()
    assert all(seen.values()), seen


def test_room_cases_reach_a_shed_for_room() -> None:
    """The properties drawn over :func:`room_cases` are not vacuous: the shed makes room before the budget."""
    sheds = 0

    @settings(max_examples=max(40, settings().max_examples))
    @given(room_cases())
    def sample(case: Case) -> None:
        nonlocal sheds
        strategy = build(case, ScriptedSummarizer(extractive))
        if run(strategy, deep_copy_messages(case.history)) is not None:
            return
        report = strategy.last_report
        assert report is not None
        sheds += bool(report.shed is not None and report.shed.shed) and report.tokens_before <= case.budget()

    sample()
    assert sheds, "no example shed for room"


def test_a_hold_for_a_fallback_that_never_ran_is_released() -> None:
    """Found by the long profile (present before 2026-12-05): a record left the prompt over the budget, so the
    record rules held every unrecorded group for the fallback; the user half's summary then brought it under the
    budget and the fallback never ran, but the holds stayed on the output, and the next pass (under the budget
    from the start, where the rules hold nothing) released them: a pass over a pass's output changed it."""
    stored = json.loads((Path(__file__).parent / "fixtures" / "unrecorded_hold_under_the_budget.json").read_text())
    history = [Message.from_dict(m) for m in stored["history"]]
    case = Case(history, stored["share"], stored["policy"], stored["route"], stored["mode"])
    strategy = build(case, ScriptedSummarizer(extractive))
    messages = deep_copy_messages(case.history)
    assert run(strategy, messages) is None
    report = strategy.last_report
    assert report is not None
    assert report.records.held_unrecorded, "the record rules held groups for the fallback"
    assert report.users is not None
    assert report.users.summary_id is not None, "the summary fit the budget"
    assert report.fallback is None, "so the fallback never ran"
    assert not any(m.additional_properties.get(HOLD_KEY) == HOLD_UNRECORDED for m in messages)
    compacted = dump(messages)
    assert run(strategy, messages) is None
    assert dump(messages) == compacted


def test_a_summary_inserted_in_the_head_does_not_push_a_tool_group_out_of_it() -> None:
    """Found by the long profile: a user summary inserted among the record half's head groups moved a tool
    group out of the head, so the next pass over the same output judged it and excluded it. Our inserts are
    not head groups (the anchored rules count positions alike)."""
    stored = json.loads((Path(__file__).parent / "fixtures" / "summary_in_the_record_head.json").read_text())
    history = [Message.from_dict(m) for m in stored["history"]]
    case = Case(history, stored["share"], stored["policy"], "pinned" if stored["pinned"] else "open", stored["mode"])
    strategy = build(case, ScriptedSummarizer(extractive))
    messages = deep_copy_messages(case.history)
    assert run(strategy, messages) is None
    assert strategy.last_report is not None
    assert strategy.last_report.users is not None
    assert strategy.last_report.users.summary_id == "user_summary_0", "the summary lands in the head"
    compacted = dump(messages)
    assert run(strategy, messages) is None
    assert dump(messages) == compacted
