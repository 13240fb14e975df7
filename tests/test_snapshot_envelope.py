"""The one snapshot envelope: strict reading, config checks, lossless round trips.

Each finding of issue 10 (item 3) is reproduced first, then the properties: every valid
snapshot of every kind survives a JSON round trip unchanged, and every single-field
corruption of a valid dict is refused with a ``SnapshotError`` (never another exception,
never silently accepted).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import pytest
from agent_framework import CharacterEstimatorTokenizer
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy
from msgspec.structs import replace

from maf_compaction import (
    AnchoredCompactionStrategy,
    AnchoredSnapshot,
    Answer,
    Ask,
    ChainDecisions,
    RecordDecisions,
    SnapshotError,
    SnapshotVersionError,
    StackKindError,
    StackState,
    State,
    ToolResultAnchoredSummarizationCompactionStrategy,
)
from maf_compaction.core.envelope import MAX_COUNT, READS, VERSION
from maf_compaction.core.recall import IGNORED_LIMIT, RecallState, RecallStatus
from maf_compaction.core.state import RequestKind
from snapshot_values import anchored_snapshots, chain_decisions, record_decisions, states

Snapshot = AnchoredSnapshot | RecordDecisions | ChainDecisions | State
Reader = Callable[[Mapping[str, object]], Snapshot]

READERS: dict[str, Reader] = {
    "anchored": AnchoredSnapshot.from_dict,
    "records": RecordDecisions.from_dict,
    "chain": ChainDecisions.from_dict,
    "state": State.from_dict,
}
any_snapshot: SearchStrategy[Snapshot] = anchored_snapshots() | record_decisions() | chain_decisions | states()


def read(data: Mapping[str, Any]) -> Snapshot:
    """Read ``data`` with the reader of the kind it claims (the anchored one when it claims none)."""
    kind = data.get("kind") if isinstance(data, Mapping) else None
    return READERS.get(kind if isinstance(kind, str) else "anchored", AnchoredSnapshot.from_dict)(data)


def anchored(**fields: object) -> dict[str, object]:
    """A valid anchored dict (made under the default head) with ``fields`` replaced."""
    return {**AnchoredSnapshot(keep_head_groups=3).to_dict(), **fields}


def records(**fields: object) -> dict[str, object]:
    return {**RecordDecisions().to_dict(), **fields}


def ask(**fields: object) -> dict[str, object]:
    return {"targets": [1], "records_at_ask": 1, "responses_at_ask": 2, "taken": False, **fields}


def state(**fields: object) -> dict[str, object]:
    return {**State().to_dict(), **fields}


def answer(**fields: object) -> dict[str, object]:
    return {
        "identity": "a" * 32,
        "kind": "summary",
        "text": "the user asked for X",
        "message_id": "user_summary_0",
        "sources": 1,
        "turns": None,
        "after": None,
        **fields,
    }


# ----------------------------------------------------------------------------- the findings


def test_a_truncated_record_snapshot_is_refused_naming_the_missing_fields() -> None:
    # Regression: {"kind": "records", "version": 1} alone once read as empty decisions.
    with pytest.raises(SnapshotError, match=r"'settled', 'ask' are missing"):
        RecordDecisions.from_dict({"kind": "records", "version": 1})
    with pytest.raises(SnapshotError, match=r"snapshot field 'ask' is missing"):
        RecordDecisions.from_dict({"kind": "records", "version": 1, "settled": []})


@pytest.mark.parametrize("field", ["targets", "records_at_ask", "responses_at_ask", "taken"])
def test_a_truncated_ask_is_refused_naming_the_field_path(field: str) -> None:
    stored = ask()
    del stored[field]
    with pytest.raises(SnapshotError, match=rf"snapshot field 'ask\.{field}' is missing"):
        RecordDecisions.from_dict(records(ask=stored))


@pytest.mark.parametrize(
    "field", ["tools_shed", "texts_shed", "shortened", "spared_tools", "spared_texts", "shed_sizes", "keep_head_groups"]
)
def test_every_anchored_field_is_required(field: str) -> None:
    data = anchored(tools_shed=2)
    del data[field]
    with pytest.raises(SnapshotError, match=rf"snapshot field '{field}' is missing"):
        AnchoredSnapshot.from_dict(data)


@pytest.mark.parametrize("field", ["records", "fallback", "recall", "chain", "answers", "compactions", "folds"])
def test_every_state_field_is_required(field: str) -> None:
    data = state()
    del data[field]
    with pytest.raises(SnapshotError, match=rf"snapshot field '{field}' is missing"):
        State.from_dict(data)


def test_a_nested_field_is_required_and_named_by_its_path() -> None:
    data = state()
    del cast("dict[str, object]", data["recall"])["route"]
    with pytest.raises(SnapshotError, match=r"snapshot field 'recall\.route' is missing"):
        State.from_dict(data)
    data = state()
    del cast("dict[str, object]", cast("dict[str, object]", data["chain"])["shed"])["distilled"]
    with pytest.raises(SnapshotError, match=r"snapshot field 'chain\.shed\.distilled' is missing"):
        State.from_dict(data)


@pytest.mark.parametrize("field", ["identity", "kind", "text", "message_id", "sources", "turns", "after"])
def test_every_answer_field_is_required(field: str) -> None:
    entry = answer()
    del entry[field]
    with pytest.raises(SnapshotError, match=rf"snapshot field 'answers\[0\]\.{field}' is missing"):
        State.from_dict(state(answers=[entry]))


@pytest.mark.parametrize("count", [10**18, MAX_COUNT + 1, 2**63])
def test_an_absurd_count_is_refused(count: int) -> None:
    with pytest.raises(SnapshotError, match=r"snapshot field 'tools_shed': must be an integer in \[0, 2147483647\]"):
        AnchoredSnapshot.from_dict(anchored(tools_shed=count))
    with pytest.raises(SnapshotError, match=r"'ask\.records_at_ask'"):
        RecordDecisions.from_dict(records(ask=ask(records_at_ask=count)))
    with pytest.raises(SnapshotError, match=r"'spared_texts\[0\]'"):
        AnchoredSnapshot.from_dict(anchored(texts_shed=MAX_COUNT, spared_texts=[count]))


def test_the_largest_count_is_accepted() -> None:
    data = anchored(tools_shed=MAX_COUNT, spared_tools=[MAX_COUNT - 1])
    assert AnchoredSnapshot.from_dict(data).tools_shed == MAX_COUNT


def test_a_snapshot_without_its_head_is_refused() -> None:
    # Regression: dropping keep_head_groups once skipped the head check on restore.
    data = anchored(tools_shed=2)
    del data["keep_head_groups"]
    strategy = AnchoredCompactionStrategy(max_input_tokens=1_000, tokenizer=CharacterEstimatorTokenizer())
    with pytest.raises(SnapshotError, match="'keep_head_groups' is missing"):
        strategy.restore_decisions(data)
    assert strategy.decision_state() == AnchoredSnapshot()


@pytest.mark.parametrize("field", ["tools_shed", "texts_shed", "shortened"])
def test_decisions_under_a_null_head_are_refused(field: str) -> None:
    with pytest.raises(
        SnapshotError, match="snapshot field 'keep_head_groups': null, but the snapshot holds decisions"
    ):
        AnchoredSnapshot.from_dict(anchored(keep_head_groups=None, **{field: 1}))


def test_an_empty_snapshot_needs_no_head() -> None:
    assert AnchoredSnapshot.from_dict(AnchoredSnapshot().to_dict(), keep_head_groups=7) == AnchoredSnapshot()


def test_a_snapshot_made_under_another_head_is_refused_naming_both_values() -> None:
    data = anchored(tools_shed=2, keep_head_groups=5)
    with pytest.raises(SnapshotError, match=r"'keep_head_groups'.*keep_head_groups=5.*keep_head_groups=3"):
        AnchoredSnapshot.from_dict(data, keep_head_groups=3)
    assert AnchoredSnapshot.from_dict(data, keep_head_groups=5).keep_head_groups == 5
    assert AnchoredSnapshot.from_dict(data).keep_head_groups == 5  # no config given: not checked
    error = AnchoredSnapshot(tools_shed=2, keep_head_groups=5).config_error(keep_head_groups=3)
    assert isinstance(error, SnapshotError)
    assert AnchoredSnapshot(tools_shed=2, keep_head_groups=5).config_error(keep_head_groups=5) is None


def test_restoring_a_value_checks_it_like_a_dict() -> None:
    strategy = AnchoredCompactionStrategy(max_input_tokens=1_000, tokenizer=CharacterEstimatorTokenizer())
    with pytest.raises(SnapshotError, match="spared_tools"):
        strategy.restore_decisions(AnchoredSnapshot(tools_shed=1, spared_tools=(4,), keep_head_groups=3))
    with pytest.raises(SnapshotError, match="keep_head_groups"):
        strategy.restore_decisions(AnchoredSnapshot(tools_shed=1))
    records_strategy = ToolResultAnchoredSummarizationCompactionStrategy(
        max_input_tokens=1_000, tokenizer=CharacterEstimatorTokenizer()
    )
    decisions = RecordDecisions(settled=(2,), ask=Ask(targets=(2,), records_at_ask=1, responses_at_ask=1))
    with pytest.raises(SnapshotError, match=r"records\.ask\.targets"):
        records_strategy.restore_decisions(State(records=decisions))
    assert records_strategy.decision_state() == State()


def test_duplicate_shed_sizes_are_refused() -> None:
    # Regression: duplicate positions once merged silently (the last one won).
    data = anchored(tools_shed=4, shed_sizes=[[1, 2], [1, 3]])
    with pytest.raises(SnapshotError, match=r"snapshot field 'shed_sizes': duplicate position 1"):
        AnchoredSnapshot.from_dict(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (anchored(tools_shed=9, spared_tools=[3, 3]), r"'spared_tools': duplicate position 3"),
        (anchored(texts_shed=9, spared_texts=[0, 5, 0]), r"'spared_texts': duplicate position 0"),
        (records(settled=[4, 4]), r"'settled': duplicate position 4"),
        (records(ask=ask(targets=[3, 1, 3])), r"'ask\.targets': duplicate position 3"),
        (state(answers=[answer(), answer(text=None)]), r"'answers': duplicate identity 'a{32}'"),
        (
            state(
                answers=[answer(kind="media", message_id=None), answer(kind="fold", message_id="user_summary_fold_0")]
            ),
            r"'answers': duplicate identity",
        ),
    ],
)
def test_duplicates_are_refused_naming_field_and_value(data: dict[str, object], message: str) -> None:
    with pytest.raises(SnapshotError, match=message):
        read(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({**anchored(), "shed_count": 1}, r"unknown snapshot field\(s\) 'shed_count'"),
        ({**records(), "pinned": True, "asks": []}, r"'pinned', 'asks'"),
        (records(ask=ask(extra=1)), r"'ask\.extra'"),
        (state(answers=[answer(summary_id="user_summary_0")]), r"'answers\[0\]\.summary_id'"),
        (
            state(recall={**cast("dict[str, object]", state()["recall"]), "pin_disabled": True}),
            r"'recall\.pin_disabled'",
        ),
    ],
)
def test_unknown_fields_are_refused_naming_them(data: dict[str, object], message: str) -> None:
    with pytest.raises(SnapshotError, match=message):
        read(data)


@pytest.mark.parametrize("kind", list(READERS))
@pytest.mark.parametrize("version", [2, 3, 4, 6, 99, 0, -1])
def test_another_version_is_refused_naming_it(kind: str, version: int) -> None:
    """The stored format started over at 1: a pre-release build's entry (versions 2 to 4 of its kinds) and a
    newer release's are refused alike, naming the version and what to do."""
    data = {**read({"kind": kind, "version": VERSION, **_fields(kind)}).to_dict(), "version": version}
    with pytest.raises(
        SnapshotVersionError, match=rf"version {version} is not supported.*reads versions 1 and 5"
    ) as raised:
        READERS[kind](data)
    assert (raised.value.version, raised.value.supported, raised.value.kind) == (version, READS, kind)
    assert "upgrade to read it" in str(raised.value)
    assert "delete the entry" in str(raised.value)


def test_a_version_1_state_is_upgraded_as_it_is_read_and_written_back_at_today_s_version() -> None:
    """Version 5 added ``recall.ignored_summaries`` and ``recall.seen.pending_tokens``: a version-1 state (which lacks
    them) reads with what version 1 acted on (summaries it sent to the summarizer stayed there for good: the streak
    at IGNORED_LIMIT, else 0; no record was due by the new groups' size: 0 tokens) and every other decision as
    stored, and is written back at today's version; a version-5 state that lacks either is refused naming the field
    (only the older version is upgraded)."""
    seen = RecallStatus(included_tokens=900, records=1, pending_groups=2, pending_tokens=0)
    for to_summarizer, streak in ((True, IGNORED_LIMIT), (False, 0)):
        made = State(
            recall=RecallState(
                summaries_to_summarizer=to_summarizer, ignored_instructions=1, ignored_summaries=streak, seen=seen
            )
        ).to_dict()
        recall = {k: v for k, v in cast("dict[str, object]", made["recall"]).items() if k != "ignored_summaries"}
        recall["seen"] = {k: v for k, v in cast("dict[str, object]", recall["seen"]).items() if k != "pending_tokens"}
        older = {**made, "version": 1, "recall": recall}
        read_back = State.from_dict(older)
        assert (read_back.recall.summaries_to_summarizer, read_back.recall.ignored_summaries) == (to_summarizer, streak)
        assert read_back.recall.seen == seen
        assert read_back.to_dict() == {**made, "version": VERSION}
        with pytest.raises(SnapshotError, match=r"'recall\.ignored_summaries' is missing"):
            State.from_dict({**older, "version": VERSION})
        with pytest.raises(SnapshotError, match=r"'recall\.seen\.pending_tokens' is missing"):
            State.from_dict({**made, "recall": {**cast("dict[str, object]", made["recall"]), "seen": recall["seen"]}})


def test_a_version_1_value_that_holds_a_field_version_5_added_is_refused_naming_it() -> None:
    """Version 1 never wrote ``ignored_summaries``, ``seen.pending_tokens`` or the configuration parameter
    ``pin_rule.repeat_tokens``: a version-1 value that holds one was not written by version 1, and is refused
    instead of being read as whatever it says."""
    seen = RecallStatus(included_tokens=900, records=1, pending_groups=2, pending_tokens=5)
    made = State(recall=RecallState(seen=seen)).to_dict()
    with pytest.raises(SnapshotError, match="version 1 has no such field"):
        State.from_dict({**made, "version": 1})
    recall = {k: v for k, v in cast("dict[str, object]", made["recall"]).items() if k != "ignored_summaries"}
    with pytest.raises(SnapshotError, match="'pending_tokens': version 1 has no such field"):
        State.from_dict({**made, "version": 1, "recall": recall})


def _fields(kind: str) -> dict[str, object]:
    made = {"anchored": anchored(), "records": records(), "chain": ChainDecisions().to_dict(), "state": state()}[kind]
    return {k: v for k, v in made.items() if k not in ("kind", "version")}


@pytest.mark.parametrize("version", ["1", 1.0, True, None, [1]])
def test_a_version_that_is_not_an_integer_is_refused(version: object) -> None:
    with pytest.raises(SnapshotVersionError):
        RecordDecisions.from_dict({**records(), "version": version})


def test_a_missing_version_is_refused() -> None:
    data = records()
    del data["version"]
    with pytest.raises(SnapshotError, match="'version' is missing"):
        RecordDecisions.from_dict(data)


@pytest.mark.parametrize("expected", list(READERS))
@pytest.mark.parametrize("got", [*READERS, "summary"])
def test_a_snapshot_of_another_kind_is_refused_naming_both(expected: str, got: str) -> None:
    if expected == got:
        return
    data = {"kind": got, "version": 1, **_fields(got if got in READERS else "state")}
    with pytest.raises(SnapshotError, match=rf"expected an? '{expected}' snapshot, got kind '{got}'"):
        READERS[expected](data)


def test_a_snapshot_without_a_kind_is_refused() -> None:
    data = anchored()
    del data["kind"]
    with pytest.raises(SnapshotError, match="got no kind"):
        AnchoredSnapshot.from_dict(data)


@pytest.mark.parametrize("kind", list(READERS))
@pytest.mark.parametrize("data", [None, [], "anchored", 3, b"{}"])
def test_a_non_mapping_is_refused(kind: str, data: object) -> None:
    with pytest.raises(SnapshotError, match="must be a mapping"):
        READERS[kind](cast("Any", data))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (anchored(tools_shed=True), r"'tools_shed': must be an integer"),
        (anchored(tools_shed=-1), r"'tools_shed': must be an integer in \[0, "),
        (anchored(keep_head_groups=False), r"'keep_head_groups'"),
        (anchored(tools_shed=3, shed_sizes=[[1, True]]), r"'shed_sizes\[0\]\[1\]'"),
        (anchored(tools_shed=3, shed_sizes=[[1, 2, 3]]), r"'shed_sizes\[0\]': must be a \[position, count\] pair"),
        (records(ask=ask(taken=1)), r"'ask\.taken': must be true or false"),
        (records(ask=[1]), r"'ask': must be an object"),
        (state(answers=[answer(sources=0)]), r"'answers\[0\]\.sources': must be an integer in \[1, "),
        (state(answers=[answer(text="  ")]), r"'answers\[0\]\.text': must be a non-empty string"),
        (state(answers=[answer(identity="")]), r"'answers\[0\]\.identity'"),
        (state(answers=[3]), r"'answers\[0\]': must be an object"),
        (state(compactions=1.0), r"'compactions'"),
    ],
)
def test_wrong_types_and_ranges_are_refused_naming_the_path(data: dict[str, object], message: str) -> None:
    with pytest.raises(SnapshotError, match=message):
        read(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (anchored(tools_shed=3, spared_tools=[3]), r"'spared_tools': position 3 is not below tools_shed=3"),
        (anchored(texts_shed=0, spared_texts=[0]), r"'spared_texts': position 0 is not below texts_shed=0"),
        (anchored(tools_shed=2, shed_sizes=[[2, 1]]), r"'shed_sizes': position 2 is not below tools_shed=2"),
        (anchored(tools_shed=4, spared_tools=[1], shed_sizes=[[1, 2]]), r"'shed_sizes': position 1 is spared"),
        (records(settled=[2, 5], ask=ask(targets=[1, 5])), r"'ask\.targets': position 5 is also settled"),
        (records(ask=ask(targets=[])), r"'ask\.targets': must name at least one group"),
        (state(answers=[answer(turns=3)]), r"'answers\[0\]\.turns': an answer with text carries no turns"),
        (state(answers=[answer(kind="media")]), r"'answers\[0\]\.message_id': must be null for a media answer"),
        (state(answers=[answer(after=4)]), r"'answers\[0\]\.after': a summary answer has no place"),
        (
            state(answers=[answer(kind="record", message_id="compaction_record_" + "a" * 16)]),
            r"'answers\[0\]\.after': a record answer needs place",
        ),
        (
            # Another record's id (one of the allocated form): the record would be placed a second time.
            state(answers=[answer(kind="record", message_id="compaction_record_0123456789abcdef", after=3)]),
            r"'answers\[0\]\.message_id': must be 'compaction_record_aaaaaaaaaaaaaaaa' \(the id its request",
        ),
        (
            state(answers=[answer(kind="emergency_fold", message_id="user_summary_emergency_fold_0")]),
            r"'answers\[0\]\.sources': must be an integer in \[2, ",
        ),
        *(
            (state(answers=[answer(message_id=bad)]), r"'answers\[0\]\.message_id': must be an id of the form")
            for bad in ("q3", "user_summary_", "user_summary_01", "user_summary_fold_1", "user_summary_1 ", "record_1")
        ),
        (
            state(answers=[answer(kind="merge")]),
            r"'answers\[0\]\.message_id': must be an id of the form record_replacement_",
        ),
    ],
)
def test_inconsistent_snapshots_are_refused(data: dict[str, object], message: str) -> None:
    with pytest.raises(SnapshotError, match=message):
        read(data)


def test_the_stored_layout_is_the_declared_one() -> None:
    """One header at the top (kind, version 5), then the fields in their declared order; nested values carry none;
    enumerations are stored by value."""
    assert json.dumps(AnchoredSnapshot(tools_shed=3, spared_tools=(1,), keep_head_groups=3).to_dict()) == (
        '{"kind": "anchored", "version": 5, "tools_shed": 3, "texts_shed": 0, "shortened": 0, "spared_tools": [1], '
        '"spared_texts": [], "shed_sizes": [], "distilled": [], "keep_head_groups": 3}'
    )
    ask = Ask(targets=(2,), records_at_ask=1, responses_at_ask=3, taken=True)
    assert json.dumps(RecordDecisions(settled=(0,), ask=ask).to_dict()) == (
        '{"kind": "records", "version": 5, "settled": [0], "ask": {"targets": [2], "records_at_ask": 1, '
        '"responses_at_ask": 3, "taken": true}}'
    )
    failed = Answer(identity="i", kind=RequestKind.SUMMARY, message_id="user_summary_0", sources=2, turns=4)
    stored = State(answers=(failed,), compactions=1).to_dict()
    assert list(stored) == [
        "kind",
        "version",
        "records",
        "fallback",
        "recall",
        "chain",
        "answers",
        "compactions",
        "folds",
    ]
    assert stored["answers"] == [
        {
            "identity": "i",
            "kind": "summary",
            "text": None,
            "message_id": "user_summary_0",
            "sources": 2,
            "turns": 4,
            "after": None,
        }
    ]
    assert "kind" not in cast("dict[str, object]", stored["fallback"])
    assert cast("dict[str, object]", stored["recall"])["route"] == "pinned"
    stack = StackState(kind="records", state=State()).to_dict()
    assert list(stack) == ["kind", "version", "strategy", "state"]
    assert (stack["kind"], stack["version"], stack["strategy"]) == ("stack", VERSION, "records")


def test_a_stack_is_read_for_the_kind_the_builder_makes() -> None:
    data = StackState(kind="composition", state=State(folds=2)).to_dict()
    assert StackState.from_dict(data, kind="composition").state.folds == 2
    with pytest.raises(StackKindError, match="'composition' stack but the builder makes a 'records' stack"):
        StackState.from_dict(data, kind="records")
    with pytest.raises(
        SnapshotError, match=r"snapshot field 'strategy': must be 'composition' or 'records', got 'anchored'"
    ):
        StackState.from_dict({**data, "strategy": "anchored"}, kind="records")
    with pytest.raises(SnapshotError, match=r"snapshot field 'state\.folds'"):
        StackState.from_dict(
            {**data, "state": {**cast("dict[str, object]", data["state"]), "folds": -1}}, kind="composition"
        )


def test_a_long_bad_value_is_shown_cut_short() -> None:
    with pytest.raises(SnapshotError) as raised:
        AnchoredSnapshot.from_dict(anchored(tools_shed="x" * 10_000))
    assert len(str(raised.value)) < 200


# ----------------------------------------------------------------------------- properties


@given(any_snapshot)
def test_the_strict_round_trip_is_lossless(snapshot: Snapshot) -> None:
    """Every valid snapshot reads back from its JSON equal to itself, and writes the same dict again."""
    data = json.loads(json.dumps(snapshot.to_dict()))
    restored = read(data)
    assert restored == snapshot
    assert restored.to_dict() == data


@given(anchored_snapshots(), st.integers(0, 12))
def test_an_anchored_snapshot_restores_only_under_its_own_head(snapshot: AnchoredSnapshot, head: int) -> None:
    """A snapshot reads under the head it was made with (or any head when it names none), and no other."""
    data = snapshot.to_dict()
    if snapshot.keep_head_groups in (None, head):
        assert AnchoredSnapshot.from_dict(data, keep_head_groups=head) == snapshot
    else:
        with pytest.raises(SnapshotError, match=f"keep_head_groups={snapshot.keep_head_groups}.*={head}"):
            AnchoredSnapshot.from_dict(data, keep_head_groups=head)


Path = tuple[str | int, ...]


def _nodes(value: object, path: Path = ()) -> list[tuple[Path, object]]:
    """Every value in a JSON tree with its path (the root first)."""
    found: list[tuple[Path, object]] = [(path, value)]
    if isinstance(value, dict):
        for key, item in cast("dict[str, object]", value).items():
            found.extend(_nodes(item, (*path, key)))
    elif isinstance(value, list):
        for index, item in enumerate(cast("list[object]", value)):
            found.extend(_nodes(item, (*path, index)))
    return found


def _at(tree: object, path: Path) -> Any:
    node: Any = tree
    for step in path:
        node = node[step]
    return node


def _wrong_types(value: object) -> list[object]:
    """Values of another JSON type that no field holding ``value`` accepts.

    ``None`` is never offered for a non-null value: several fields are nullable. No
    field is a float, so a float is wrong everywhere.
    """
    if isinstance(value, bool):
        return [1, "true", 1.5]
    if isinstance(value, int):
        return [True, str(value), 1.5, [value]]
    if isinstance(value, str):
        return [5, 1.5, [value]]
    if isinstance(value, list):
        return [{}, "[]", 5, 1.5]
    if isinstance(value, dict):
        return [[], "{}", 5, 1.5]
    return [1.5, [1.5]]  # None


def corruptions(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every single-field corruption of a valid snapshot dict, each on a fresh copy, with how it was made.

    Delete any field; add an unknown field to any object; give any value a type no
    field holding it accepts; put any integer out of range; repeat any list element.
    """
    for path, value in _nodes(data):
        if path and isinstance(path[-1], str):
            yield _changed(data, f"delete {list(path)}", lambda tree, p=path: _delete(tree, p))
        if isinstance(value, dict):
            yield _changed(
                data, f"unknown field in {list(path)}", lambda tree, p=path: _set(tree, (*p, "unexpected"), 0)
            )
        if isinstance(value, list) and value:
            for index in range(len(cast("list[object]", value))):
                yield _changed(data, f"repeat {list(path)}[{index}]", lambda tree, p=path, i=index: _repeat(tree, p, i))
        if not path:
            continue
        for wrong in _wrong_types(value):
            yield _changed(data, f"{wrong!r} at {list(path)}", lambda tree, p=path, w=wrong: _set(tree, p, w))
        if isinstance(value, int) and not isinstance(value, bool):
            for wrong in (-1, MAX_COUNT + 1, 10**18):
                yield _changed(data, f"{wrong} at {list(path)}", lambda tree, p=path, w=wrong: _set(tree, p, w))


def _changed(data: dict[str, Any], how: str, change: Callable[[Any], None]) -> tuple[str, dict[str, Any]]:
    tree = copy.deepcopy(data)
    change(tree)
    return how, tree


def _delete(tree: Any, path: Path) -> None:
    del _at(tree, path[:-1])[path[-1]]


def _set(tree: Any, path: Path, value: object) -> None:
    _at(tree, path[:-1])[path[-1]] = value


def _repeat(tree: Any, path: Path, index: int) -> None:
    items = _at(tree, path)
    items.append(copy.deepcopy(items[index]))


@given(any_snapshot)
def test_any_single_field_corruption_is_refused(snapshot: Snapshot) -> None:
    """Deleting, retyping, overflowing or repeating any one field of a valid dict, or adding one, is refused."""
    data = json.loads(json.dumps(snapshot.to_dict()))
    tried = 0
    for how, corrupt in corruptions(data):
        tried += 1
        try:
            read(corrupt)
        except SnapshotError:
            continue
        raise AssertionError(f"accepted after {how}: {json.dumps(corrupt)}")
    assert tried >= len(data) * 2  # every top-level field was at least deleted and retyped


@given(any_snapshot, st.sampled_from(list(READERS)))
def test_every_reader_refuses_the_other_kinds(snapshot: Snapshot, kind: str) -> None:
    """A valid snapshot of one kind is never read as another kind."""
    data = snapshot.to_dict()
    if data["kind"] == kind:
        assert READERS[kind](data) == snapshot
    else:
        with pytest.raises(SnapshotError, match=f"expected an? '{kind}' snapshot, got kind '{data['kind']}'"):
            READERS[kind](data)


@given(anchored_snapshots().filter(lambda s: s.keep_head_groups is not None), st.data())
def test_a_position_at_or_past_its_watermark_is_refused(snapshot: AnchoredSnapshot, data: st.DataObject) -> None:
    """Moving one spared or sized position to its lane's watermark or beyond is refused, naming the field."""
    lanes = [
        ("spared_tools", snapshot.tools_shed),
        ("spared_texts", snapshot.texts_shed),
        ("shed_sizes", snapshot.tools_shed),
    ]
    field, watermark = data.draw(st.sampled_from([lane for lane in lanes if lane[1] < MAX_COUNT] or [lanes[0]]))
    if watermark >= MAX_COUNT:
        return
    position = data.draw(st.integers(watermark, MAX_COUNT))
    stored = snapshot.to_dict()
    entries = cast("list[Any]", stored[field])
    entries.append([position, 1] if field == "shed_sizes" else position)
    with pytest.raises(SnapshotError, match=rf"'{field}': position {position} is not below"):
        AnchoredSnapshot.from_dict(stored)


@given(record_decisions().filter(lambda d: d.ask is not None and bool(d.settled)), st.data())
def test_an_ask_for_a_settled_group_is_refused(decisions: RecordDecisions, data: st.DataObject) -> None:
    """Adding any settled group to the outstanding ask is refused, naming the group."""
    settled = data.draw(st.sampled_from(decisions.settled))
    stored = decisions.to_dict()
    ask_fields = cast("dict[str, Any]", stored["ask"])
    ask_fields["targets"] = [*ask_fields["targets"], settled]
    with pytest.raises(SnapshotError, match=rf"'ask\.targets': position {settled} is also settled"):
        RecordDecisions.from_dict(stored)


# ----------------------------------------------------------------------------- the one table of answers


def _head(value: State) -> int | None:
    """The head a drawn state's positions were drawn for (its fallback's, else its shed policy's)."""
    fallback = value.fallback.keep_head_groups
    return fallback if fallback is not None else value.chain.shed.keep_head_groups


@given(states())
def test_a_whole_state_round_trips_through_json(value: State) -> None:
    data = json.loads(json.dumps(value.to_dict()))
    head = _head(value)
    assert State.from_dict(data, keep_head_groups=head) == value
    assert (
        StackState.from_dict(StackState(kind="composition", state=value).to_dict(), kind="composition").state == value
    )


@given(states())
def test_any_state_stored_by_version_1_reads_as_version_1_decided(value: State) -> None:
    """Any state, stored as version 1 wrote it (without the fields version 5 added, inside a stack too), reads back
    as the same decisions with those fields at what version 1 acted on: the ignored-summary streak at IGNORED_LIMIT
    where summaries had gone to the summarizer (for good, then), else 0, and the last request's new tool tokens
    at 0."""
    recall_state = value.recall
    decided = replace(
        recall_state,
        ignored_summaries=IGNORED_LIMIT if recall_state.summaries_to_summarizer else 0,
        seen=None if recall_state.seen is None else replace(recall_state.seen, pending_tokens=0),
    )
    expected = replace(value, recall=decided)
    stored = json.loads(json.dumps(value.to_dict()))
    recall_fields = stored["recall"]
    del recall_fields["ignored_summaries"]
    if recall_fields["seen"] is not None:
        del recall_fields["seen"]["pending_tokens"]
    head = _head(value)
    assert State.from_dict({**stored, "version": 1}, keep_head_groups=head) == expected
    stack = {
        "kind": "stack",
        "version": 1,
        "strategy": "composition",
        "state": {k: v for k, v in stored.items() if k not in ("kind", "version")},
    }
    assert StackState.from_dict(stack, kind="composition").state == expected


def test_a_failure_is_dated_and_stands_until_the_next_user_turn() -> None:
    failed = Answer(identity="i" * 32, kind=RequestKind.MERGE, message_id="record_replacement_0", sources=2, turns=5)
    data = State(answers=(failed,)).to_dict()
    assert cast("list[dict[str, object]]", data["answers"])[0]["turns"] == 5
    restored = State.from_dict(json.loads(json.dumps(data))).answers[0]
    assert (restored.stands(5), restored.stands(6)) == (True, False), "a failure stands until the next user turn"
    kept = Answer(identity="k" * 32, kind=RequestKind.MERGE, text="TL-1", message_id="record_replacement_1", sources=2)
    assert kept.stands(10**6)


def test_a_choice_field_names_the_values_it_allows() -> None:
    """A wrong choice says which values are allowed (msgspec's own text would not)."""
    stored = state()
    recall = cast("dict[str, object]", stored["recall"])
    with pytest.raises(SnapshotError, match=r"'recall\.next_pin': must be 'reforce', 'size' or null, got 'bogus'"):
        State.from_dict({**stored, "recall": {**recall, "next_pin": "bogus"}})
    with pytest.raises(
        SnapshotError, match=r"'recall\.route': must be 'pinned', 'cached_prefix', 'pins_ignored' or 'none', got 'x'"
    ):
        State.from_dict({**stored, "recall": {**recall, "route": "x"}})
    with pytest.raises(SnapshotError, match=r"'answers\[0\]\.kind': must be 'record', 'summary', 'fold', 'media'"):
        State.from_dict(state(answers=[answer(kind="bogus")]))


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: {**RecordDecisions().to_dict(), "settled": (1, "x")}, "settled[1]"),
        (lambda: {**AnchoredSnapshot().to_dict(), "shed_sizes": [(1, True)]}, "shed_sizes[0][1]"),
    ],
)
def test_a_malformed_value_built_from_tuples_is_named_like_one_read_from_json(
    build: Callable[[], dict[str, object]], field: str
) -> None:
    """A host may hand a state built in Python (tuples, not lists): the error still names the field."""
    reader = RecordDecisions.from_dict if field.startswith("settled") else AnchoredSnapshot.from_dict
    with pytest.raises(SnapshotError, match=re.escape(f"snapshot field {field!r}")):
        reader(build())
