"""Examples of the pure anchored step: band by position, per-position allowance, sheds as watermarks.

Records are built directly; ``measure`` is the framework's four-characters-per-token estimate, so
every figure below can be worked out by hand.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from maf_compaction.core import anchored as core
from maf_compaction.core.anchored import (
    AnchoredConfig,
    AnchoredDone,
    AnchoredSnapshot,
    band_groups,
)
from maf_compaction.core.envelope import VERSION
from maf_compaction.core.errors import SnapshotError, SnapshotVersionError
from maf_compaction.core.model import History, MessageRecord, Part, history
from maf_compaction.core.shorten import is_shortened

# --- helpers ---------------------------------------------------------------------------------

OVERHEAD = 4  # per-message tokens, maf_compaction.core.counting.MESSAGE_OVERHEAD_TOKENS
NO_SHORTENING = 10**6  # a keep_tokens no test result reaches
TOOL_NOTE = "[compacted: an earlier tool call and its result (lookup)]"
REPLY_NOTE = "[compacted: an earlier assistant reply]"


def measure(text: str) -> int:
    return max(1, len(text) // 4)


def marker(removed: int) -> str:
    return f"\n[... removed by compaction: {removed:,} characters]\n"


def text_record(role: str, text: str, message_id: str, *, injected: bool = False) -> MessageRecord:
    return MessageRecord(
        role=role,
        parts=(Part(kind="text", text=text, tokens=measure(text)),),
        tokens=OVERHEAD + measure(text),
        message_id=message_id,
        injected=injected,
    )


def call_record(index: int, names: tuple[str, ...] = ("lookup",)) -> MessageRecord:
    """``a<index>``, one call per name; ``lookup {"q":0}`` is 3 tokens, the record 7."""
    texts = [f'{name} {{"q":{index}}}' for name in names]
    parts = tuple(
        Part(kind="function_call", text=text, tokens=measure(text), call_id=f"c{index}_{k}", name=name)
        for k, (name, text) in enumerate(zip(names, texts, strict=True))
    )
    return MessageRecord(
        role="assistant", parts=parts, tokens=OVERHEAD + sum(p.tokens for p in parts), message_id=f"a{index}"
    )


def result_record(
    index: int, text: str, *, call: int = 0, preserved: bool = False, media_tokens: int = 0
) -> MessageRecord:
    """The result of call ``call`` of ``call_record(index)``: ``t<index>``, or ``t<index>_<call>``."""
    part = Part(
        kind="function_result",
        text=text,
        tokens=measure(text) + media_tokens,
        media_tokens=media_tokens,
        call_id=f"c{index}_{call}",
    )
    return MessageRecord(
        role="tool",
        parts=(part,),
        tokens=OVERHEAD + part.tokens,
        message_id=f"t{index}" if call == 0 else f"t{index}_{call}",
        preserved=preserved,
    )


def tool_group(
    index: int, result: str, *, names: tuple[str, ...] = ("lookup",), preserved: bool = False
) -> list[MessageRecord]:
    return [call_record(index, names), result_record(index, result, preserved=preserved)]


def note_record(message_id: str, text: str = TOOL_NOTE) -> MessageRecord:
    record = text_record("assistant", text, message_id)
    return replace(record, note=True)


def build(records: list[MessageRecord]) -> History:
    """A history whose records carry their index as ``origin``, as the shell converts them."""
    return history(replace(record, origin=index) for index, record in enumerate(records))


def conversation(*results: str, final: str = "go") -> list[MessageRecord]:
    """System, task, one tool group per result, a final user turn: four + len(results) groups."""
    records = [text_record("system", "S", "sys"), text_record("user", "task", "task")]
    for index, result in enumerate(results):
        records += tool_group(index, result)
    return [*records, text_record("user", final, "final")]


def config(**overrides: Any) -> AnchoredConfig:
    """Head = system + task, tail = the final turn, a budget nothing here reaches."""
    settings: dict[str, Any] = {"max_input_tokens": 100_000, "keep_head_groups": 2, "keep_tail_groups": 1}
    settings.update(overrides)
    return AnchoredConfig(**settings)


def run(
    cfg: AnchoredConfig,
    records: list[MessageRecord] | History,
    snapshot: AnchoredSnapshot | None = None,
    *,
    ceiling: int | None = None,
) -> AnchoredDone:
    source = records if not isinstance(records, list) else build(records)
    return core.run(cfg, snapshot or AnchoredSnapshot(), source, measure, ceiling=ceiling)


def band_ids(cfg: AnchoredConfig, records: list[MessageRecord]) -> list[list[str | None]]:
    return [[records[i].message_id for i in group.members] for group in band_groups(cfg, records)]


def record(done: AnchoredDone, message_id: str) -> MessageRecord:
    return next(r for r in done.history if r.message_id == message_id)


def result_text(done: AnchoredDone, message_id: str) -> str:
    return record(done, message_id).parts[0].text


def excluded_ids(done: AnchoredDone) -> list[str | None]:
    return [r.message_id for r in done.history if r.excluded]


def notes(done: AnchoredDone) -> list[tuple[str | None, str]]:
    return [(r.message_id, r.parts[0].text) for r in done.history if r.note]


def included_tokens(records: History | list[MessageRecord]) -> int:
    return sum(r.tokens for r in records if not r.excluded)


def kept_tokens(shortened: str) -> int:
    """Tokens of the head and tail a shortened result keeps (the marker line excluded)."""
    head, _, tail = shortened.partition("\n[... removed by compaction: ")
    return measure(head) + measure(tail.split(" characters]\n", 1)[1])


# Six tool groups of 211 tokens (call 7 + result 204) between 10 head tokens and a 5-token tail: 1,281.
SIX_GROUPS = conversation(*(["x" * 800] * 6))
SHED_CONFIG = config(max_input_tokens=1_000, keep_tokens=NO_SHORTENING)  # low water 750
GROUP_TOKENS = 211
TOOL_NOTE_TOKENS = OVERHEAD + measure(TOOL_NOTE)


# --- the band: group positions only ----------------------------------------------------------------

TASK_R1_FINAL = [text_record("user", "task", "task"), *tool_group(1, "r1"), text_record("user", "go", "final")]


def test_band_is_the_groups_between_head_and_tail() -> None:
    records = conversation("r0", "r1")

    assert band_ids(config(), records) == [["a0", "t0"], ["a1", "t1"]]


def test_system_message_is_one_of_the_head_groups() -> None:
    records = [text_record("system", "S", "sys"), *tool_group(0, "r0"), *TASK_R1_FINAL]

    assert band_ids(config(keep_head_groups=1), records) == [["a0", "t0"], ["a1", "t1"]]


def test_head_groups_after_the_system_message_are_kept_out_of_the_band() -> None:
    records = [text_record("system", "S", "sys"), *tool_group(0, "r0"), *TASK_R1_FINAL]

    assert band_ids(config(keep_head_groups=2), records) == [["a1", "t1"]]


def test_band_lists_only_tool_and_reply_groups() -> None:
    records = [*conversation("r0")[:-1], text_record("assistant", "done", "r0"), *conversation()[1:]]

    assert band_ids(config(keep_head_groups=1), records) == [["a0", "t0"], ["r0"]]


def test_band_is_empty_when_the_tail_reaches_the_head() -> None:
    records = conversation("r0", "r1")  # five groups

    assert band_ids(config(keep_head_groups=2, keep_tail_groups=3), records) == []


def test_band_is_empty_when_head_and_tail_cover_every_group() -> None:
    records = conversation("r0", "r1")

    assert band_ids(config(keep_head_groups=3, keep_tail_groups=3), records) == []


def test_pass_over_an_empty_band_changes_nothing() -> None:
    records = conversation("x" * 40_000)
    done = run(config(keep_tokens=150, keep_tail_groups=2), records)

    assert (done.report.changed, list(done.history)) == (False, list(build(records)))


def test_keep_head_groups_zero_puts_the_first_group_in_the_band() -> None:
    records = [*tool_group(0, "r0"), *TASK_R1_FINAL]

    assert band_ids(config(keep_head_groups=0), records) == [["a0", "t0"], ["a1", "t1"]]


def test_note_records_do_not_count_as_groups() -> None:
    # Were the five notes of the first pass groups, the tail group (t6) would move into the band and
    # be cut to keep_tokens.
    records = [*SIX_GROUPS[:-1], *tool_group(6, "x" * 4_000)]
    cfg = config(max_input_tokens=2_000, keep_tokens=999)
    first = run(cfg, records)
    second = run(cfg, first.history, first.state)

    assert (len(notes(first)), second.report.changed, result_text(second, "t6")) == (5, False, "x" * 4_000)


def test_band_groups_index_the_history_it_was_given() -> None:
    # Regression: indices were once into the history with the notes filtered out.
    records = conversation("r0", "r1")
    with_notes = [*records[:2], note_record("anchored_tool_0"), *records[2:]]

    assert band_ids(config(), with_notes) == [["a0", "t0"], ["a1", "t1"]]


def test_injected_records_do_not_count_as_groups() -> None:
    records = conversation("r0", "r1")
    todo = text_record("user", "todo: 1. look up", "todo", injected=True)

    assert band_ids(config(), [todo, *records]) == band_ids(config(), records)


def test_injected_record_inside_the_band_belongs_to_no_group() -> None:
    records = conversation("r0", "r1")
    memory = text_record("assistant", "memory: the user prefers YAML", "memory", injected=True)

    assert band_ids(config(), [*records[:4], memory, *records[4:]]) == [["a0", "t0"], ["a1", "t1"]]


# --- the per-position keep rule --------------------------------------------------------------------


@pytest.mark.parametrize(("position", "allowance"), [(0, 29_488), (1, 14_744), (5, 4_914), (1_000, 150)])
def test_allowance_at_a_117952_token_budget(position: int, allowance: int) -> None:
    assert config(max_input_tokens=117_952).allowance(position) == allowance


@pytest.mark.parametrize(("position", "allowance"), [(194, 151), (195, 150), (196, 150)])
def test_allowance_never_drops_below_150(position: int, allowance: int) -> None:
    assert config(max_input_tokens=117_952).allowance(position) == allowance


@pytest.mark.parametrize("position", [0, 5, 1_000])
def test_keep_tokens_overrides_the_allowance_at_every_position(position: int) -> None:
    assert config(max_input_tokens=117_952, keep_tokens=300).allowance(position) == 300


def test_band_share_one_lets_the_oldest_position_keep_the_whole_budget() -> None:
    assert config(max_input_tokens=117_952, band_share=1).allowance(0) == 117_952


def test_band_result_over_its_allowance_is_cut_to_head_marker_tail() -> None:
    done = run(config(keep_tokens=150), conversation("x" * 4_000))

    assert result_text(done, "t0") == "x" * 300 + marker(3_400) + "x" * 300


def test_band_result_within_its_allowance_is_left_as_is() -> None:
    records = conversation("x" * 596)  # 149 tokens
    done = run(config(keep_tokens=150), records)

    assert record(done, "t0") == build(records)[3]


def test_shortened_record_is_recounted() -> None:
    done = run(config(keep_tokens=150), conversation("x" * 4_000))

    shortened = record(done, "t0")
    assert (shortened.parts[0].tokens, shortened.tokens) == (
        measure(shortened.parts[0].text),
        OVERHEAD + measure(shortened.parts[0].text),
    )


def test_each_band_position_keeps_its_own_allowance() -> None:
    cfg = config(max_input_tokens=2_400)  # allowances 600, 300, 200, 150
    done = run(cfg, conversation(*(["x" * 4_000] * 4)))

    assert [kept_tokens(result_text(done, f"t{p}")) for p in range(4)] == [600, 300, 200, 150]


def test_shortening_is_reported_per_result() -> None:
    done = run(config(keep_tokens=150), conversation("x" * 4_000, "x" * 400, "x" * 4_000))

    assert done.report.shortened == 2


def test_shortening_counts_each_result_of_a_parallel_call() -> None:
    records = conversation()
    results = [result_record(0, "x" * 4_000), result_record(0, "x" * 4_000, call=1)]
    done = run(config(keep_tokens=150), [*records[:2], call_record(0, ("lookup", "fetch")), *results, records[-1]])

    assert done.report.shortened == 2


def test_preserved_result_is_never_shortened() -> None:
    records = conversation("x" * 4_000)
    records[3] = replace(records[3], preserved=True)

    assert result_text(run(config(keep_tokens=150), records), "t0") == "x" * 4_000


def test_preserved_group_still_takes_its_band_position() -> None:
    records = conversation("x" * 4_000, "x" * 4_000)
    records[3] = replace(records[3], preserved=True)
    done = run(config(max_input_tokens=2_400), records)

    assert kept_tokens(result_text(done, "t1")) == 300  # position 1, not position 0's 600


def test_head_and_tail_results_are_never_shortened() -> None:
    head = [text_record("system", "S", "sys"), *tool_group(0, "x" * 4_000)]
    tail = tool_group(2, "x" * 4_000)
    done = run(config(keep_tokens=150), [*head, *tool_group(1, "x" * 4_000), *tail])

    assert (result_text(done, "t0"), result_text(done, "t2")) == ("x" * 4_000, "x" * 4_000)


def test_user_and_assistant_text_in_the_band_is_never_shortened() -> None:
    big_user = text_record("user", "u" * 4_000, "big_user")
    big_reply = text_record("assistant", "r" * 4_000, "big_reply")
    records = conversation("x" * 40)
    done = run(config(keep_tokens=150), [*records[:2], big_user, big_reply, *records[2:]])

    assert (record(done, "big_user"), record(done, "big_reply")) == (
        replace(big_user, origin=2),
        replace(big_reply, origin=3),
    )


def test_shortened_result_is_left_alone_by_the_next_pass() -> None:
    first = run(config(keep_tokens=150), conversation("x" * 4_000))
    second = run(config(keep_tokens=150), first.history, first.state)

    assert (second.report.changed, second.history) == (False, first.history)


def test_shortened_result_carries_the_marker_line() -> None:
    done = run(config(keep_tokens=150), conversation("x" * 4_000))

    assert is_shortened(result_text(done, "t0")) is True


# --- shedding ---------------------------------------------------------------------------------


def test_nothing_is_shed_at_the_ceiling() -> None:
    done = run(config(max_input_tokens=1_281, keep_tokens=NO_SHORTENING), SIX_GROUPS)

    assert (excluded_ids(done), done.report.changed) == ([], False)


def test_shed_takes_the_oldest_tool_groups() -> None:
    done = run(SHED_CONFIG, SIX_GROUPS)

    assert excluded_ids(done) == ["a0", "t0", "a1", "t1", "a2", "t2"]


def test_shed_goes_down_to_the_low_water_mark_and_stops() -> None:
    done = run(SHED_CONFIG, SIX_GROUPS)
    low_water = math.floor(1_000 * 0.75)

    assert (done.report.tokens_after, done.report.tokens_after + GROUP_TOKENS - TOOL_NOTE_TOKENS > low_water) == (
        1_281 - 3 * (GROUP_TOKENS - TOOL_NOTE_TOKENS),
        True,
    )


def test_low_water_fraction_sets_how_deep_a_shed_goes() -> None:
    done = run(config(max_input_tokens=1_000, keep_tokens=NO_SHORTENING, low_water_fraction=1), SIX_GROUPS)

    assert excluded_ids(done) == ["a0", "t0", "a1", "t1"]


def test_shed_reports_the_origins_it_excluded() -> None:
    done = run(SHED_CONFIG, SIX_GROUPS)

    assert done.report.shed == (2, 3, 4, 5, 6, 7)


def test_shed_moves_the_tool_watermark() -> None:
    done = run(SHED_CONFIG, SIX_GROUPS)

    assert done.state.tools_shed == 3


def test_each_shed_group_gets_a_note_at_its_start() -> None:
    done = run(SHED_CONFIG, SIX_GROUPS)

    assert [r.message_id for r in done.history][2:9] == [
        "anchored_tool_0",
        "a0",
        "t0",
        "anchored_tool_1",
        "a1",
        "t1",
        "anchored_tool_2",
    ]


def test_note_names_the_tool_and_is_a_counted_assistant_message() -> None:
    note = record(run(SHED_CONFIG, SIX_GROUPS), "anchored_tool_0")

    assert (note.role, note.parts[0].text, note.tokens, note.note, note.excluded, note.origin) == (
        "assistant",
        TOOL_NOTE,
        TOOL_NOTE_TOKENS,
        True,
        False,
        None,
    )


def test_note_lists_every_tool_name_once_sorted() -> None:
    records = conversation()
    group = [call_record(0, ("lookup", "fetch", "lookup")), result_record(0, "x" * 4_000)]
    done = run(config(max_input_tokens=500, keep_tokens=NO_SHORTENING), [*records[:2], *group, records[-1]])

    assert notes(done) == [("anchored_tool_0", "[compacted: an earlier tool call and its result (fetch, lookup)]")]


def test_note_for_a_tool_group_without_a_call_names_no_tool() -> None:
    records = conversation()
    orphan = result_record(0, "x" * 4_000)
    done = run(config(max_input_tokens=500, keep_tokens=NO_SHORTENING), [*records[:2], orphan, records[-1]])

    assert notes(done) == [("anchored_tool_0", "[compacted: an earlier tool call and its result]")]


def test_snapshot_watermark_replays_sheds_without_reporting_them() -> None:
    done = run(config(keep_tokens=NO_SHORTENING), SIX_GROUPS, AnchoredSnapshot(tools_shed=2))

    assert (excluded_ids(done), [n[0] for n in notes(done)], done.report.shed) == (
        ["a0", "t0", "a1", "t1"],
        ["anchored_tool_0", "anchored_tool_1"],
        (),
    )


def test_replies_are_shed_after_tool_groups_when_still_over() -> None:
    records = conversation("x" * 800)
    reply = text_record("assistant", "r" * 2_000, "r0")
    done = run(config(max_input_tokens=600, keep_tokens=NO_SHORTENING), [*records[:4], reply, *records[4:]])

    assert (excluded_ids(done), notes(done), done.state.texts_shed) == (
        ["a0", "t0", "r0"],
        [("anchored_tool_0", TOOL_NOTE), ("anchored_reply_0", REPLY_NOTE)],
        1,
    )


def test_replies_are_never_shed_without_collapse_assistant_text() -> None:
    records = conversation("x" * 800)
    reply = text_record("assistant", "r" * 2_000, "r0")
    cfg = config(max_input_tokens=600, keep_tokens=NO_SHORTENING, collapse_assistant_text=False)
    done = run(cfg, [*records[:4], reply, *records[4:]])

    assert (excluded_ids(done), done.state.texts_shed) == (["a0", "t0"], 0)


def test_user_turns_in_the_band_are_never_shed() -> None:
    records = conversation("x" * 800)
    big_user = text_record("user", "u" * 4_000, "big_user")
    done = run(config(max_input_tokens=600, keep_tokens=NO_SHORTENING), [*records[:2], big_user, *records[2:]])

    assert excluded_ids(done) == ["a0", "t0"]


def test_preserved_group_is_skipped_by_a_shed() -> None:
    records = list(SIX_GROUPS)
    records[3] = replace(records[3], preserved=True)
    done = run(SHED_CONFIG, records)

    assert (excluded_ids(done), [n[0] for n in notes(done)]) == (
        ["a1", "t1", "a2", "t2", "a3", "t3"],
        ["anchored_tool_1", "anchored_tool_2", "anchored_tool_3"],
    )


def test_skipped_preserved_position_is_remembered_as_spared() -> None:
    records = list(SIX_GROUPS)
    records[3] = replace(records[3], preserved=True)

    assert run(SHED_CONFIG, records).state == AnchoredSnapshot(
        tools_shed=4,
        shortened=6,
        spared_tools=(0,),
        shed_sizes=((1, 2), (2, 2), (3, 2)),
        keep_head_groups=SHED_CONFIG.keep_head_groups,
    )


def test_spared_group_is_never_shed_by_a_replay_once_its_mark_is_gone() -> None:
    snapshot = AnchoredSnapshot(tools_shed=4, shortened=6, spared_tools=(0,))
    done = run(config(keep_tokens=NO_SHORTENING), SIX_GROUPS, snapshot)

    assert (excluded_ids(done), done.report.shed) == (["a1", "t1", "a2", "t2", "a3", "t3"], ())


def test_group_already_excluded_by_another_component_frees_nothing_in_a_shed() -> None:
    records = list(SIX_GROUPS)
    records[2:4] = [replace(r, excluded=True) for r in records[2:4]]
    done = run(SHED_CONFIG, records)

    assert done.report.shed == (4, 5, 6, 7)


def test_group_already_excluded_by_another_component_gets_no_note() -> None:
    records = list(SIX_GROUPS)
    records[2:4] = [replace(r, excluded=True) for r in records[2:4]]
    done = run(SHED_CONFIG, records)

    assert [n[0] for n in notes(done)] == ["anchored_tool_1", "anchored_tool_2"]


def test_ceiling_argument_bounds_how_far_shedding_goes() -> None:
    done = run(config(keep_tokens=NO_SHORTENING), SIX_GROUPS, ceiling=1_000)

    assert (excluded_ids(done), done.report.ceiling) == (["a0", "t0", "a1", "t1", "a2", "t2"], 1_000)


def test_ceiling_argument_does_not_change_shortening() -> None:
    records = conversation("x" * 4_000)
    normal = run(config(keep_tokens=150), records)

    assert run(config(keep_tokens=150), records, ceiling=5_000).history == normal.history


def test_overflow_is_reported_when_the_anchors_exceed_the_ceiling() -> None:
    records = [text_record("system", "S" * 4_000, "sys"), *conversation("x" * 800)[1:]]
    done = run(config(max_input_tokens=1_000, keep_tokens=NO_SHORTENING), records)

    assert (done.report.overflow, excluded_ids(done), done.report.tokens_after > 1_000) == (True, ["a0", "t0"], True)


def test_no_overflow_when_the_shed_fits() -> None:
    assert run(SHED_CONFIG, SIX_GROUPS).report.overflow is False


def test_replayed_notes_count_toward_the_ceiling() -> None:
    # Regression: the shed once started from the records without the notes of earlier sheds.
    records = [text_record("system", "S" * 40, "sys")]
    for index in range(5):
        records += tool_group(index, "x" * 400)
    records.append(text_record("user", "go", "final"))
    cfg = config(max_input_tokens=260, keep_head_groups=1, keep_tokens=NO_SHORTENING)
    # 241 tokens without the three replayed notes, 295 with them; two band groups could still be shed.
    done = run(cfg, records, AnchoredSnapshot(tools_shed=3))

    assert done.report.tokens_after <= 260


# --- the minimum-gain floor --------------------------------------------------------------------


MIN_GAIN = config(keep_tokens=150, min_gain_fraction=0.5)


def floor_case(tail_tokens: int) -> list[MessageRecord]:
    """One 1,004-token band result (cut to 165, saving 839) and a final turn of ``tail_tokens``."""
    records = conversation("x" * 4_000)
    records[-1] = replace(records[-1], tokens=tail_tokens)
    return records


SAVED = 1_004 - (OVERHEAD + measure("x" * 300 + marker(3_400) + "x" * 300))


def test_floor_case_saves_839_tokens() -> None:
    done = run(config(keep_tokens=150), floor_case(5))

    assert (SAVED, done.report.tokens_before - done.report.tokens_after) == (839, 839)


@pytest.mark.parametrize("tail_tokens", [674, 675])
def test_min_gain_accepts_a_collapse_at_the_floor(tail_tokens: int) -> None:
    # behind = 1,004 (from the edited result, not its call) + tail; int(behind * 0.5) == 839 == saved.
    done = run(MIN_GAIN, floor_case(tail_tokens))

    assert (done.report.declined, done.report.shortened) == (False, 1)


def test_min_gain_declines_a_collapse_one_token_below_the_floor() -> None:
    done = run(MIN_GAIN, floor_case(676))  # int(1,680 * 0.5) = 840 > 839

    assert (done.report.declined, done.report.shortened, done.report.changed) == (True, 0, False)


def test_declined_collapse_commits_nothing() -> None:
    assert run(MIN_GAIN, floor_case(676)).state.shortened == 0


def test_accepted_collapse_commits_every_band_position() -> None:
    assert run(MIN_GAIN, conversation("x" * 4_000, "x" * 40, final="go")).state.shortened == 2


def test_min_gain_floor_is_skipped_over_the_ceiling() -> None:
    cfg = config(max_input_tokens=1_500, keep_tokens=150, min_gain_fraction=0.5)
    done = run(cfg, floor_case(676))  # 1,697 tokens > 1,500

    assert (done.report.declined, done.report.shortened) == (False, 1)


def test_zero_min_gain_never_declines() -> None:
    done = run(config(keep_tokens=150, min_gain_fraction=0), floor_case(50_000))

    assert (done.report.declined, done.report.shortened) == (False, 1)


def test_committed_position_stays_shortened_when_a_later_collapse_is_declined() -> None:
    records = conversation("x" * 4_000, "x" * 4_000)
    records[-1] = replace(records[-1], tokens=50_000)
    done = run(MIN_GAIN, records, AnchoredSnapshot(shortened=1))

    assert (done.report.declined, is_shortened(result_text(done, "t0")), result_text(done, "t1")) == (
        True,
        True,
        "x" * 4_000,
    )


def test_commitment_survives_a_pass_over_a_shorter_history() -> None:
    # Regression: the commitment was once clamped to the band of the list at hand and written back.
    cfg = config(keep_tokens=150, min_gain_fraction=0.29)
    longer = conversation(*(["x" * 4_000] * 3))
    first = run(cfg, longer)
    shorter = run(cfg, [*longer[:6], longer[-1]], first.state)  # two of the three band groups

    assert (first.state.shortened, shorter.state.shortened) == (3, 3)


# --- media ------------------------------------------------------------------------------------


def test_shortened_result_keeps_its_media_estimate() -> None:
    # Regression: the shortened part was once recounted as measure(text) alone.
    records = conversation()
    group = [call_record(0), result_record(0, "x" * 4_000, media_tokens=1_024)]
    done = run(config(keep_tokens=150), [*records[:2], *group, records[-1]])

    part = record(done, "t0").parts[0]
    assert part.tokens == measure(part.text) + 1_024


# --- the snapshot ----------------------------------------------------------------------------------


def test_snapshot_round_trips_through_its_dict() -> None:
    snapshot = AnchoredSnapshot(
        tools_shed=3,
        texts_shed=1,
        shortened=7,
        spared_tools=(0, 1),
        spared_texts=(0,),
        shed_sizes=((2, 2),),
        keep_head_groups=3,
    )

    assert AnchoredSnapshot.from_dict(snapshot.to_dict()) == snapshot


def test_snapshot_dict_names_its_kind_and_version() -> None:
    assert AnchoredSnapshot(tools_shed=3, spared_tools=(1,)).to_dict() == {
        "kind": "anchored",
        "version": VERSION,
        "tools_shed": 3,
        "texts_shed": 0,
        "shortened": 0,
        "spared_tools": [1],
        "spared_texts": [],
        "shed_sizes": [],
        "distilled": [],
        "keep_head_groups": None,
    }


def test_a_snapshot_of_an_earlier_build_is_refused_naming_its_version() -> None:
    """The stored format started over at 1: an earlier build's version 2 (or its version 1 without ``distilled``,
    which now reads as a value missing a field) is not guessed at."""
    data = {**AnchoredSnapshot(tools_shed=3, spared_tools=(1,), keep_head_groups=3).to_dict(), "version": 2}
    with pytest.raises(SnapshotVersionError, match="version 2 is not supported"):
        AnchoredSnapshot.from_dict(data)
    del data["distilled"]
    with pytest.raises(SnapshotError, match="'distilled' is missing"):
        AnchoredSnapshot.from_dict({**data, "version": 1})


def test_snapshot_dict_without_spared_positions_is_refused_naming_them() -> None:
    data = {"kind": "anchored", "version": 1, "tools_shed": 3, "texts_shed": 0, "shortened": 4}

    with pytest.raises(
        SnapshotError, match="'spared_tools', 'spared_texts', 'shed_sizes', 'distilled', 'keep_head_groups' are missing"
    ):
        AnchoredSnapshot.from_dict(data)


@pytest.mark.parametrize("value", ["0", [-1], [True], ["0"], None])
def test_snapshot_with_bad_spared_positions_is_refused(value: object) -> None:
    data = {**AnchoredSnapshot().to_dict(), "spared_tools": value}

    with pytest.raises(SnapshotError, match="spared_tools"):
        AnchoredSnapshot.from_dict(data)


def test_snapshot_of_a_newer_version_is_refused() -> None:
    with pytest.raises(SnapshotVersionError, match="99") as raised:
        AnchoredSnapshot.from_dict({"kind": "anchored", "version": 99, "tools_shed": 0})

    assert raised.value.version == 99


def test_snapshot_of_another_kind_is_refused() -> None:
    with pytest.raises(SnapshotError, match="'record'"):
        AnchoredSnapshot.from_dict({"kind": "record", "version": 1, "tools_shed": 0, "texts_shed": 0, "shortened": 0})


@pytest.mark.parametrize("value", [-1, "3", 1.5, None, True])
def test_snapshot_with_a_bad_watermark_is_refused(value: object) -> None:
    data = {**AnchoredSnapshot().to_dict(), "tools_shed": value}

    with pytest.raises(SnapshotError, match="tools_shed"):
        AnchoredSnapshot.from_dict(data)


def test_snapshot_with_a_boolean_version_is_refused() -> None:
    # Regression: True == 1, so `version not in (1,)` once let a boolean through.
    with pytest.raises(SnapshotVersionError):
        AnchoredSnapshot.from_dict(
            {"kind": "anchored", "version": True, "tools_shed": 0, "texts_shed": 0, "shortened": 0}
        )


@pytest.mark.parametrize("shed_sizes", [5, [[1]], [[1, -2]], [[True, 2]], [["a", 1]]])
def test_snapshot_with_malformed_shed_sizes_is_refused(shed_sizes: object) -> None:
    data = {**AnchoredSnapshot().to_dict(), "shed_sizes": shed_sizes}

    with pytest.raises(SnapshotError, match="shed_sizes"):
        AnchoredSnapshot.from_dict(data)
