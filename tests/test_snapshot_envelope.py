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
from dataclasses import dataclass
from typing import Any, cast

import pytest
from agent_framework import CharacterEstimatorTokenizer
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from maf_compaction import (
    AnchoredCompactionStrategy,
    AnchoredSnapshot,
    Ask,
    RecordDecisions,
    SnapshotError,
    SnapshotVersionError,
    ToolResultAnchoredSummarizationCompactionStrategy,
    UserSummarySnapshot,
)
from maf_compaction.core.composition import (
    ChainDecisions,
    CompositionState,
)
from maf_compaction.core.effects import Answer
from maf_compaction.core.envelope import MAX_COUNT, Count, Schema, dump, load, opened
from snapshot_values import anchored_snapshots, chain_decisions, record_decisions, user_snapshots

Snapshot = AnchoredSnapshot | RecordDecisions | UserSummarySnapshot
Reader = Callable[[Mapping[str, object]], Snapshot]

READERS: dict[str, Reader] = {
    "anchored": AnchoredSnapshot.from_dict,
    "records": RecordDecisions.from_dict,
    "user_summaries": UserSummarySnapshot.from_dict,
}
any_snapshot: SearchStrategy[Snapshot] = anchored_snapshots() | record_decisions() | user_snapshots


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


def user(**fields: object) -> dict[str, object]:
    return {**UserSummarySnapshot().to_dict(), **fields}


def answer(**fields: object) -> dict[str, object]:
    return {
        "identity": "a" * 32,
        "text": "the user asked for X",
        "summary_id": None,
        "sources": 1,
        "turns": None,
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


@pytest.mark.parametrize("field", ["answers", "descriptions", "compactions", "folds"])
def test_every_user_summary_field_is_required(field: str) -> None:
    data = user()
    del data[field]
    with pytest.raises(SnapshotError, match=rf"snapshot field '{field}' is missing"):
        UserSummarySnapshot.from_dict(data)


@pytest.mark.parametrize("field", ["identity", "text", "summary_id", "sources", "turns"])
def test_every_answer_field_is_required(field: str) -> None:
    entry = answer()
    del entry[field]
    with pytest.raises(SnapshotError, match=rf"snapshot field 'answers\[0\]\.{field}' is missing"):
        UserSummarySnapshot.from_dict(user(answers=[entry]))


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
    with pytest.raises(SnapshotError, match=r"ask\.targets"):
        records_strategy.restore_decisions(RecordDecisions(settled=(2,), ask=Ask((2,), 1, 1)))


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
        (user(answers=[answer(), answer(text=None)]), r"'answers': duplicate identity 'a{32}'"),
        (
            user(descriptions=[answer(sources=None), answer(sources=None, text="other")]),
            r"'descriptions': duplicate identity",
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
        (user(answers=[answer(kind="summary")]), r"'answers\[0\]\.kind'"),
    ],
)
def test_unknown_fields_are_refused_naming_them(data: dict[str, object], message: str) -> None:
    with pytest.raises(SnapshotError, match=message):
        read(data)


@pytest.mark.parametrize("kind", list(READERS))
@pytest.mark.parametrize("version", ["newer", 99, 0, -1])
def test_an_unknown_version_is_refused_naming_it(kind: str, version: int | str) -> None:
    supported = (1, 2) if kind == "anchored" else (1,)
    version = supported[-1] + 1 if isinstance(version, str) else version
    data = {"kind": kind, "version": version}
    with pytest.raises(SnapshotVersionError, match=rf"version {version} is not supported.*reads versions 1") as raised:
        READERS[kind](data)
    assert (raised.value.version, raised.value.supported) == (version, supported)
    advice = "upgrade maf-compaction" if version > 1 else "no build of maf-compaction writes it"
    assert advice in str(raised.value)


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
    data = {**(anchored() if got == "anchored" else records() if got == "records" else user()), "kind": got}
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
        (user(answers=[answer(sources=0)]), r"'answers\[0\]\.sources': must be an integer in \[1, "),
        (user(answers=[answer(text="  ")]), r"'answers\[0\]\.text': must be a non-empty string"),
        (user(answers=[answer(identity="")]), r"'answers\[0\]\.identity'"),
        (user(answers=[3]), r"'answers\[0\]': must be an object"),
        (user(compactions=1.0), r"'compactions'"),
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
        (user(answers=[answer(turns=3)]), r"'answers\[0\]\.turns': an answer with text carries no turns"),
        (user(descriptions=[answer(summary_id="user_summary_1", sources=None)]), r"'descriptions\[0\]\.summary_id'"),
        (user(descriptions=[answer()]), r"'descriptions\[0\]\.sources'"),
        *(
            (user(answers=[answer(summary_id=bad)]), r"'answers\[0\]\.summary_id': must be 'user_summary_<n>' or")
            for bad in ("q3", "user_summary_", "user_summary_01", "user_summary_fold_x", "user_summary_1 ", "record_1")
        ),
    ],
)
def test_inconsistent_snapshots_are_refused(data: dict[str, object], message: str) -> None:
    with pytest.raises(SnapshotError, match=message):
        read(data)


def test_todays_dicts_are_byte_compatible() -> None:
    """The envelope keeps the layout, order and version every snapshot has (the anchored one gained
    ``distilled`` in version 2; version 1 is still read, tests/test_stored_fixtures.py)."""
    assert json.dumps(AnchoredSnapshot(tools_shed=3, spared_tools=(1,), keep_head_groups=3).to_dict()) == (
        '{"kind": "anchored", "version": 2, "tools_shed": 3, "texts_shed": 0, "shortened": 0, "spared_tools": [1], '
        '"spared_texts": [], "shed_sizes": [], "distilled": [], "keep_head_groups": 3}'
    )
    assert json.dumps(RecordDecisions((0,), Ask((2,), 1, 3, taken=True)).to_dict()) == (
        '{"kind": "records", "version": 1, "settled": [0], "ask": {"targets": [2], "records_at_ask": 1, '
        '"responses_at_ask": 3, "taken": true}}'
    )
    assert json.dumps(UserSummarySnapshot((Answer("i", None, "user_summary_0", 2, turns=4),), (), 1, 0).to_dict()) == (
        '{"kind": "user_summaries", "version": 1, "answers": [{"identity": "i", "text": null, "summary_id": '
        '"user_summary_0", "sources": 2, "turns": 4}], "descriptions": [], "compactions": 1, "folds": 0}'
    )


def test_an_older_layout_is_read_when_declared() -> None:
    """An envelope reads an older version's fields when a kind declares it (the hook new kinds migrate by)."""
    layouts = {1: ("streak",), 2: ("streak", "disabled")}
    old = opened("recall", layouts, {"kind": "recall", "version": 1, "streak": 2})
    assert old["streak"] == 2
    with pytest.raises(SnapshotError, match="'disabled' is missing"):
        opened("recall", layouts, {"kind": "recall", "version": 2, "streak": 2})
    with pytest.raises(SnapshotError, match="unknown snapshot field"):
        opened("recall", layouts, {"kind": "recall", "version": 1, "streak": 2, "disabled": True})
    with pytest.raises(SnapshotVersionError):
        opened("recall", layouts, {"kind": "recall", "version": 3, "streak": 2, "disabled": True})


@dataclass(frozen=True)
class _Streak:
    streak: Count = 0
    disabled: bool = False


def test_a_writer_writes_what_its_reader_reads_in_declared_order() -> None:
    """A schema's fields are declared once, on the value: writer and reader cannot drift apart."""
    Schema("streak", 1, _Streak)
    assert list(dump(_Streak(1))) == ["kind", "version", "streak", "disabled"]
    assert dump(_Streak(1)) == {"kind": "streak", "version": 1, "streak": 1, "disabled": False}
    assert load(_Streak, dump(_Streak(2, True))) == _Streak(2, True)
    with pytest.raises(SnapshotError, match="'disabled' is missing"):
        load(_Streak, {"kind": "streak", "version": 1, "streak": 1})


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


# ----------------------------------------------------------------------------- the composition's chain


@given(chain_decisions)
def test_the_chains_decisions_round_trip_through_the_envelope_and_json(chain: ChainDecisions) -> None:
    data = json.loads(json.dumps(dump(chain)))
    assert ChainDecisions.from_dict(data) == chain
    state = CompositionState(chain=chain)
    assert CompositionState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


def test_a_failed_replacement_is_dated_and_a_version_1_failure_still_stands_for_ever() -> None:
    failed = Answer("i" * 32, None, "record_replacement_0", 2, turns=5)
    data = dump(ChainDecisions(replacements=(("merge", failed),)))
    assert data["version"] == 3
    assert cast("list[dict[str, object]]", data["replacements"])[0]["turns"] == 5
    restored = ChainDecisions.from_dict(data).replacements[0][1]
    assert (restored.stands(5), restored.stands(6)) == (True, False), "a failure stands until the next user turn"
    # Version 1 had no date: its failures were never asked again, and read so they still are not.
    old = {
        **data,
        "version": 1,
        "replacements": [
            {k: v for k, v in entry.items() if k != "turns"}
            for entry in cast("list[dict[str, object]]", data["replacements"])
        ],
    }
    legacy = ChainDecisions.from_dict(old).replacements[0][1]
    assert (legacy.turns, legacy.stands(10**6)) == (None, True)
    with pytest.raises(SnapshotError, match=r"unknown snapshot field\(s\) 'replacements\[0\]\.turns'"):
        ChainDecisions.from_dict({**data, "version": 1})


def test_a_version_1_composition_state_reads_unless_a_kept_merge_makes_its_counts_ambiguous() -> None:
    kept = ("merge", Answer("i" * 32, "record\nTL-1", "record_replacement_0", 2))
    calm = CompositionState(chain=ChainDecisions(replacements=(kept,)))
    waiting = CompositionState(chain=ChainDecisions(replacements=(kept,), wait_since=3))
    unmerged = CompositionState(chain=ChainDecisions(wait_since=3))
    for state in (calm, unmerged):
        data = {**state.to_dict(), "version": 1}
        data.pop("written")  # version 3 added the records written over the cached prefix
        assert CompositionState.from_dict(json.loads(json.dumps(data))) == state, "the two layouts agree here"
    assert CompositionState.from_dict(waiting.to_dict()) == waiting
    older = {name: value for name, value in waiting.to_dict().items() if name != "written"}
    with pytest.raises(SnapshotError, match=r"snapshot field 'records': a version-1 snapshot with a kept record merge"):
        CompositionState.from_dict({**older, "version": 1})


def test_an_emergency_fold_reads_from_version_3_only_and_carries_a_fold_id() -> None:
    fold = ("fold", Answer("f" * 32, "folded TL-1", "user_summary_emergency_fold_0", 2))
    data = dump(ChainDecisions(replacements=(fold,)))
    assert data["version"] == 3
    assert ChainDecisions.from_dict(json.loads(json.dumps(data))).replacements == (fold,)
    with pytest.raises(
        SnapshotError, match=r"'replacements\[0\]\.kind': must be one of 'merge', 'rewrite', got 'fold'"
    ):
        ChainDecisions.from_dict({**data, "version": 2})
    entry = cast("list[dict[str, object]]", data["replacements"])[0]
    for bad, message in (
        ({"replacement_id": "record_replacement_0"}, r"must be user_summary_emergency_fold_<n>"),
        ({"sources": 1}, r"'replacements\[0\]\.sources': must be an integer"),
    ):
        with pytest.raises(SnapshotError, match=message):
            ChainDecisions.from_dict({**data, "replacements": [{**entry, **bad}]})


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"text": "merged", "turns": 3}, r"'replacements\[0\]\.turns': an answer with text carries no turns"),
        ({"text": None, "turns": -1}, r"'replacements\[0\]\.turns': must be an integer"),
        ({"text": None, "turns": True}, r"'replacements\[0\]\.turns': must be an integer"),
    ],
)
def test_an_inconsistent_replacement_is_refused_naming_the_field(entry: dict[str, object], message: str) -> None:
    data = dump(ChainDecisions(replacements=(("merge", Answer("i" * 32, None, "record_replacement_0", 2)),)))
    data["replacements"] = [{**cast("list[dict[str, object]]", data["replacements"])[0], **entry}]
    with pytest.raises(SnapshotError, match=message):
        ChainDecisions.from_dict(data)


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


def test_a_choice_field_names_the_values_it_allows() -> None:
    """A wrong choice says which values are allowed (msgspec's own text would not)."""
    from maf_compaction.core.recall import RecallState

    stored = dump(RecallState())
    with pytest.raises(SnapshotError, match=r"'next_pin': must be 'reforce', 'size' or null, got 'bogus'"):
        load(RecallState, {**stored, "next_pin": "bogus"})
    chain = dump(ChainDecisions(replacements=(("merge", Answer("i" * 32, "text", "record_replacement_0", 2)),)))
    entry = cast("list[dict[str, object]]", chain["replacements"])[0]
    entry["kind"] = "bogus"
    with pytest.raises(SnapshotError, match=r"'replacements\[0\]\.kind': must be 'fold', 'merge' or 'rewrite'"):
        ChainDecisions.from_dict(chain)
