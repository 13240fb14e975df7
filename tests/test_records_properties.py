"""Property-based tests of the record strategy over generated tool-using histories.

Each history comes from ``histories.py`` (tool rounds with reasoning, parallel calls,
late results, media, tables and planted codes) with a record appended: a
``recall_earlier_tool_results`` call whose result quotes, for each earlier tool result,
all of its value lines and table rows, some of them, or nothing. Properties, one
sentence each:

- the same history and decisions give the same bytes;
- coverage is a function of the history and its records, whatever the decisions;
- a group is never dropped unless the records quote enough of its values (an oracle
  written here, independently of the core's tokenizer);
- a pass that ends over the budget says so (a WARNING and a counter), never silently;
- between record events an append-only extension keeps the earlier prompt as a prefix;
- the in-call copies (with injected context) and the stored history agree;
- a partial release keeps a result's set of values, so coverage reads the same;
- a group is judged once: a later record never changes the bytes of a group an earlier one judged;
- decisions survive a JSON round trip unchanged;
- the memo a pass hands the next (of this history or any other) never changes an answer;
- a payoff share changes only which uncovered groups are asked for, never what the prompt shows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import re
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from agent_framework import CharacterEstimatorTokenizer, Content, Message
from agent_framework._compaction import EXCLUDE_REASON_KEY
from hypothesis import given, note
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn

from histories import conversation_chunks, deep_copy_messages, describe, is_injected_todo, with_injected_context
from maf_compaction import (
    Ask,
    RecordDecisions,
    SnapshotError,
    State,
    ToolResultAnchoredSummarizationCompactionStrategy,
    record_text,
)
from maf_compaction.adapters.convert import to_history
from maf_compaction.adapters.counting import as_estimator
from maf_compaction.core.distill import is_remnant
from maf_compaction.core.grouping import group_records
from maf_compaction.core.records import RECALL_TOOL_NAME, RECORD_PREFIX, Fallback, RecordConfig, responses, rules
from maf_compaction.core.values import distinctive_values, words
from wiring import recalled

TOKENIZER = CharacterEstimatorTokenizer()
Strategy = ToolResultAnchoredSummarizationCompactionStrategy


# ----------------------------------------------------------------------------- generators


def _results(messages: Sequence[Message]) -> list[str]:
    return [
        c.result
        for m in messages
        for c in m.contents
        if c.type == "function_result" and isinstance(c.result, str) and c.result
    ]


@st.composite
def records_for(draw: DrawFn, messages: Sequence[Message], number: int = 1) -> list[Message]:
    """A recall call and its record, quoting all, some or none of each earlier result."""
    lines: list[str] = []
    for text in _results(messages):
        mode = draw(st.sampled_from(["all", "all", "some", "none"]))
        if mode == "none":
            continue
        rng = random.Random(draw(st.integers(0, 2**16)))
        for line in text.split("\n"):
            keep = bool(distinctive_values(line)) or line.startswith("|")
            if keep and (mode == "all" or rng.random() < 0.6):
                lines.append(line)
    body = "\n".join(lines) or "nothing to record"
    call_id = f"recall_prop_{number}"
    return [
        Message("assistant", [Content.from_function_call(call_id=call_id, name=RECALL_TOOL_NAME, arguments={})]),
        Message("tool", [Content.from_function_result(call_id=call_id, result=f"{RECORD_PREFIX}\n{body}")]),
    ]


@st.composite
def recorded(draw: DrawFn) -> tuple[list[Message], list[Message]]:
    """``(history ending in a record, an append-only extension without records)``."""
    chunks = draw(conversation_chunks(min_chunks=2, max_chunks=3, min_turns=3, max_turns=9))
    base = chunks[0]
    history = [*base, *draw(records_for(base))]
    extension = [m for chunk in chunks[1:] for m in chunk]
    return history, extension


decisions = st.builds(
    RecordDecisions,
    settled=st.lists(st.integers(0, 30), max_size=6, unique=True).map(lambda xs: tuple(sorted(xs))),
    ask=st.none()
    | st.builds(
        Ask,
        targets=st.lists(st.integers(0, 30), min_size=1, max_size=5, unique=True).map(lambda xs: tuple(sorted(xs))),
        records_at_ask=st.integers(0, 3),
        responses_at_ask=st.integers(0, 40),
        taken=st.booleans(),
    ),
).filter(lambda d: d.ask is None or not set(d.ask.targets) & set(d.settled))  # a settled group is never asked for


# ----------------------------------------------------------------------------- helpers


def _strategy(budget: int = 1_000_000, **kwargs: Any) -> Strategy:
    return recalled(Strategy(max_input_tokens=budget, tokenizer=TOKENIZER, record_target_tokens=150, **kwargs))


def _run(strategy: Strategy, messages: list[Message]) -> bool:
    return asyncio.run(strategy(messages))


def _shown(messages: Sequence[Message]) -> list[str]:
    """What the model is sent, message by message, as canonical JSON."""
    return [
        json.dumps(m.to_dict(exclude_none=True).get("contents"), sort_keys=True, default=str)
        for m in messages
        if not m.additional_properties.get("_excluded") and not is_injected_todo(m)
    ]


_SPLIT = re.compile(r"[\s,;|\"'`()\[\]{}<>]+")


def _oracle_values(text: str) -> set[str]:
    """Distinctive values, re-derived here from the README's wording."""
    found: set[str] = set()
    for raw in _SPLIT.split(text):
        word = raw.strip(string.punctuation)
        if "=" in word:
            word = word.split("=")[-1].strip(string.punctuation)
        if len(word) >= 4 and any(ch.isdigit() for ch in word):
            found.add(word)
    return found


def _record_words(messages: Sequence[Message]) -> set[str]:
    words: set[str] = set()
    for text in _results(messages):
        if text.startswith(RECORD_PREFIX):
            words |= {w.strip(string.punctuation).split("=")[-1].strip(string.punctuation) for w in _SPLIT.split(text)}
    return words


# ----------------------------------------------------------------------------- properties


@given(recorded(), st.sampled_from([1_000_000, 2_000, 600]))
def test_the_same_history_gives_the_same_bytes(case: tuple[list[Message], list[Message]], budget: int) -> None:
    history, _ = case
    first, second = deep_copy_messages(history), deep_copy_messages(history)
    _run(_strategy(budget), first)
    _run(_strategy(budget), second)
    assert _shown(first) == _shown(second)
    assert [m.additional_properties.get("_maf_compaction_hold") for m in first] == [
        m.additional_properties.get("_maf_compaction_hold") for m in second
    ]


@given(recorded(), decisions)
def test_coverage_is_a_function_of_history_and_records(
    case: tuple[list[Message], list[Message]], restored: RecordDecisions
) -> None:
    history, _ = case
    fresh, other = _strategy(), _strategy()
    other.restore_decisions(State(records=restored))
    first, second = deep_copy_messages(history), deep_copy_messages(history)
    _run(fresh, first)
    records = to_history(history, as_estimator(TOKENIZER).parts, note_kind="anchored")
    groups = sum(1 for g in group_records(records) if g.kind == "tool_call")
    named = [*restored.settled, *(restored.ask.targets if restored.ask is not None else ())]
    later = restored.ask is not None and restored.ask.responses_at_ask > responses(records)
    if later or any(ordinal >= groups for ordinal in named):  # decisions this conversation cannot have made
        with pytest.raises(SnapshotError):
            _run(other, second)
        return
    _run(other, second)
    assert fresh.last_report is not None
    assert other.last_report is not None
    assert fresh.last_report.covered == other.last_report.covered
    assert _shown(first) == _shown(second)


@given(recorded())
def test_a_group_is_dropped_only_when_the_records_quote_enough_of_it(case: tuple[list[Message], list[Message]]) -> None:
    history, _ = case
    messages = deep_copy_messages(history)
    _run(_strategy(), messages)
    quoted = _record_words(history)
    record = "\n".join(t for t in _results(history) if t.startswith(RECORD_PREFIX)).lower()
    groups = group_records(to_history(history, as_estimator(TOKENIZER).parts, note_kind="anchored"))
    for group in groups:
        if not all(
            messages[i].additional_properties.get(EXCLUDE_REASON_KEY) == "tool_summary_anchored" for i in group.members
        ):
            continue
        results = [c for i in group.members for c in history[i].contents if c.type == "function_result"]
        values = _oracle_values("\n".join(c.result or "" for c in results))
        note(f"group {group.members}: {sorted(values)}")
        if values:
            assert len(values & quoted) >= math.ceil(len(values) * 0.8 - 1e-9), describe(history)
        else:
            names = {c.name for i in group.members for c in history[i].contents if c.type == "function_call"}
            assert names
            assert all(str(name).lower() in record for name in names)


@given(recorded(), st.integers(300, 3_000))
def test_a_pass_over_the_budget_never_ends_silently(case: tuple[list[Message], list[Message]], budget: int) -> None:
    history, _ = case
    messages = deep_copy_messages(history)
    strategy = _strategy(budget)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("maf_compaction")
    logger.addHandler(handler)
    try:
        _run(strategy, messages)
    finally:
        logger.removeHandler(handler)
    report = strategy.last_report
    assert report is not None
    estimator = strategy._estimator  # pyright: ignore[reportPrivateUsage]
    size = sum(estimator.count_message_tokens(m) for m in messages if not m.additional_properties.get("_excluded"))
    if report.fallback is Fallback.BEHIND_RECORD and size > budget:
        assert strategy.overflows == 1
        assert any(r.levelno == logging.WARNING for r in records)


@given(recorded())
def test_between_record_events_the_prompt_only_grows(case: tuple[list[Message], list[Message]]) -> None:
    history, extension = case
    strategy = _strategy()
    stored = deep_copy_messages(history)
    _run(strategy, stored)
    before = _shown(stored)
    grown = [*stored, *deep_copy_messages(extension)]
    _run(strategy, grown)
    report = strategy.last_report
    assert report is not None
    assert report.fallback is Fallback.NONE
    if report.joined:
        return  # a late result for a covered call: reported, and the group goes whole
    assert _shown(grown)[: len(before)] == before


@given(recorded(), st.sampled_from([1_000_000, 2_000]))
def test_the_in_call_copies_and_the_stored_history_agree(
    case: tuple[list[Message], list[Message]], budget: int
) -> None:
    history, _ = case
    strategy = _strategy(budget)
    copies = with_injected_context(history)
    stored = deep_copy_messages(history)
    _run(strategy, copies)
    _run(strategy, stored)
    assert _shown(copies) == _shown(stored)


@given(recorded())
def test_a_rewritten_result_keeps_every_value_the_records_do_not_quote(
    case: tuple[list[Message], list[Message]],
) -> None:
    """A partial release names the rows it releases (the value set stays); a remnant drops only quoted values."""
    history, _ = case
    messages = deep_copy_messages(history)
    _run(_strategy(), messages)
    quoted = set(words("\n".join(record_text(m, messages) for m in history)))
    for original, compacted in zip(history, messages, strict=True):
        for before, after in zip(original.contents, compacted.contents, strict=True):
            if before.type == "function_result" and before.result != after.result:
                kept, had = set(distinctive_values(after.result or "")), set(distinctive_values(before.result or ""))
                if is_remnant(after.result or ""):
                    assert had - kept <= quoted
                    assert kept <= had
                else:
                    assert kept == had


@given(recorded(), st.data())
def test_a_later_record_never_changes_a_group_an_earlier_record_judged(
    case: tuple[list[Message], list[Message]], data: st.DataObject
) -> None:
    """A group is judged by the first record after it that quotes it: left, a remnant, or cut to its value lines.
    A second record, after more turns, quoting any share of every result, changes none of its bytes (the cached
    prefix up to it stays valid)."""
    history, extension = case
    strategy = _strategy()
    stored = deep_copy_messages(history)
    _run(strategy, stored)
    report = strategy.last_report
    assert report is not None
    before = [_shown([m]) for m in stored]
    later = data.draw(records_for([*history, *extension], number=2))
    grown = [*stored, *deep_copy_messages(extension), *later]
    _run(strategy, grown)
    counter = as_estimator(TOKENIZER).parts
    groups = [g for g in group_records(to_history(history, counter, note_kind="anchored")) if g.kind == "tool_call"]
    for ordinal in report.covered:
        for index in groups[ordinal].members:
            assert _shown([grown[index]]) == before[index], f"group {ordinal} changed: {describe(history)}"


@given(recorded(), recorded(), decisions, st.sampled_from([1_000_000, 2_000, 600]))
def test_a_memo_never_changes_the_answer(
    case: tuple[list[Message], list[Message]],
    other: tuple[list[Message], list[Message]],
    state: RecordDecisions,
    budget: int,
) -> None:
    counter = as_estimator(TOKENIZER).parts
    config = RecordConfig(max_input_tokens=budget, record_target_tokens=150)
    history = to_history(case[0], counter, note_kind="anchored")
    fresh = rules(config, history, state, counter.measure)
    for source in (case[0], other[0], [*other[0], *case[0]]):
        earlier = rules(config, to_history(source, counter, note_kind="anchored"), state, counter.measure)
        again = rules(config, history, state, counter.measure, memo=earlier.memo)
        assert (again.history, again.state, again.report) == (fresh.history, fresh.state, fresh.report)
    # The memo of this very history, handed back, gives the same answer too.
    repeat = rules(config, history, state, counter.measure, memo=fresh.memo)
    assert (repeat.history, repeat.state, repeat.report) == (fresh.history, fresh.state, fresh.report)


@given(recorded(), st.sampled_from([0.05, 0.2, 1.0]), st.sampled_from([1_000_000, 2_000]))
def test_a_payoff_share_changes_only_which_uncovered_groups_are_asked_for(
    case: tuple[list[Message], list[Message]], share: float, budget: int
) -> None:
    """The gate asks for fewer records, never drops more: the same groups are covered and uncovered, the
    prompt is the same, and every uncovered group is asked for or declined (held either way)."""
    history, _ = case
    gated, plain = deep_copy_messages(history), deep_copy_messages(history)
    with_share, without = _strategy(budget, record_payoff_share=share), _strategy(budget)
    _run(with_share, gated)
    _run(without, plain)
    assert _shown(gated) == _shown(plain)
    ours, theirs = with_share.last_report, without.last_report
    assert ours is not None
    assert theirs is not None
    assert (ours.covered, ours.uncovered, ours.thin) == (theirs.covered, theirs.uncovered, theirs.thin)
    assert set(ours.asked) <= set(theirs.asked)
    assert not set(ours.asked) & set(ours.declined)
    assert set(ours.declined) <= set(ours.uncovered)
    assert set(theirs.asked) - set(ours.asked) <= set(ours.declined)
    assert theirs.declined == ()


@given(decisions)
def test_decisions_survive_a_json_round_trip(value: RecordDecisions) -> None:
    assert RecordDecisions.from_dict(json.loads(json.dumps(value.to_dict()))) == value


def test_the_generator_makes_records_that_cover_and_records_that_do_not() -> None:
    """The properties above are not vacuous: over a fixed sample, both outcomes occur."""
    covered = thin = uncovered = released = 0

    @given(recorded())
    def sample(case: tuple[list[Message], list[Message]]) -> None:
        nonlocal covered, thin, uncovered, released
        strategy = _strategy()
        _run(strategy, deep_copy_messages(case[0]))
        report = strategy.last_report
        assert report is not None
        covered += len(report.covered) - len(report.thin)
        thin += len(report.thin)
        uncovered += len(report.uncovered)
        released += report.rows_released

    sample()
    assert covered > 0
    assert thin > 0
    assert uncovered > 0
    assert released > 0


@given(recorded(), st.sampled_from([1_000_000, 2_000, 600]))
def test_a_pass_over_a_passs_output_changes_nothing(case: tuple[list[Message], list[Message]], budget: int) -> None:
    """Compacting the record strategy's own output again leaves every stored byte as it was."""
    history, _ = case
    strategy = _strategy(budget)
    messages = deep_copy_messages(history)
    _run(strategy, messages)
    compacted = [m.to_dict() for m in messages]
    _run(strategy, messages)
    assert [m.to_dict() for m in messages] == compacted


def _fixture(name: str) -> tuple[list[Message], int]:
    stored = json.loads((Path(__file__).parent / "fixtures" / f"{name}.json").read_text())
    return [Message.from_dict(m) for m in stored["history"]], stored["budget"]


def test_name_coverage_reads_the_same_on_a_pass_over_a_passs_output() -> None:
    """Found by the long profile: a group without values (a call whose result has not arrived) was judged by
    name against the candidate groups calling its tool; once a pass excluded the other, covered one, the
    next pass counted one caller fewer and excluded it too. Groups already excluded count as judged."""
    history, budget = _fixture("name_coverage_after_a_pass")
    strategy = _strategy(budget)
    messages = deep_copy_messages(history)
    _run(strategy, messages)
    assert strategy.last_report is not None
    assert strategy.last_report.uncovered, "the group without values stays"
    compacted = [m.to_dict() for m in messages]
    _run(strategy, messages)
    assert [m.to_dict() for m in messages] == compacted


def test_the_fallbacks_sheds_on_the_copies_replay_on_the_stored_history() -> None:
    """Found by the long profile: the in-call copies' injected context put the pass over the budget, so the
    fallback behind the record shed a reply there; the stored history, within it, ran no fallback and kept
    the reply. The fallback's decisions replay on every pass while they stand, whatever the size."""
    history, budget = _fixture("fallback_sheds_on_the_copies")
    strategy = _strategy(budget)
    copies = with_injected_context(history)
    stored = deep_copy_messages(history)
    _run(strategy, copies)
    _run(strategy, stored)
    assert any(m.additional_properties.get(EXCLUDE_REASON_KEY) == "anchored_compaction" for m in stored)
    assert _shown(copies) == _shown(stored)
