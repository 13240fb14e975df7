"""Examples of the anchored strategies through their framework adapters.

Every conversation here is made of real ``Message``/``Content`` objects and counted with the
framework's ``CharacterEstimatorTokenizer`` (four characters per token), so every figure can be
worked out by hand: a tool call ``lookup {"q":N}`` is 7 tokens with the 4-token message overhead, a
result of ``4 * n`` characters is ``n + 4``.
"""

from __future__ import annotations

import copy
import logging
import math
import re
from collections.abc import Sequence
from typing import Any

import pytest
from agent_framework import CharacterEstimatorTokenizer, Content, Message

from maf_compaction import (
    AnchoredCompactionStrategy,
    AnchoredSnapshot,
    MediaTokenEstimator,
    MinimumGainAnchoredCompactionStrategy,
    SnapshotVersionError,
    original_results,
)
from maf_compaction.core.shorten import is_shortened

# --- helpers ---------------------------------------------------------------------------------

TOKENIZER = CharacterEstimatorTokenizer()
ESTIMATOR = MediaTokenEstimator(TOKENIZER)
MARKER_LINE = re.compile(r"\n\[\.\.\. removed by compaction: ([\d,]+) characters\]\n")
TOOL_NOTE = "[compacted: an earlier tool call and its result (lookup)]"
REPLY_NOTE = "[compacted: an earlier assistant reply]"
NO_SHORTENING = 10**6  # a keep_tokens no result here reaches
TODO_ATTRIBUTION = {"source_id": "todo", "source_type": "TodoProvider"}


def system(text: str = "sys") -> Message:
    return Message("system", [text], message_id="sys")


def user(text: str, message_id: str) -> Message:
    return Message("user", [text], message_id=message_id)


def reply(text: str, message_id: str) -> Message:
    return Message("assistant", [text], message_id=message_id)


def injected(role: str, text: str) -> Message:
    """Context the harness's todo provider adds for one call; not conversation history."""
    return Message(role, [text], message_id="todo", additional_properties={"_attribution": TODO_ATTRIBUTION})


def tool_turn(
    index: int, result: str | list[Content], *, names: Sequence[str] = ("lookup",), preserved: bool = False
) -> list[Message]:
    """An assistant call (``a<index>``) and its result message (``t<index>``)."""
    calls = [Content.from_function_call(f"c{index}_{k}", name, arguments={"q": index}) for k, name in enumerate(names)]
    results = [Content.from_function_result(f"c{index}_{k}", result=result) for k in range(len(names))]
    props: dict[str, Any] = {"_preserved": True} if preserved else {}
    return [
        Message("assistant", calls, message_id=f"a{index}"),
        Message("tool", results, message_id=f"t{index}", additional_properties=props),
    ]


def conversation(*results: str, final: str = "go") -> list[Message]:
    """System, task, one tool turn per result, a final user turn: four + len(results) groups."""
    messages = [system(), user("task", "task")]
    for index, result in enumerate(results):
        messages += tool_turn(index, result)
    return [*messages, user(final, "final")]


def six_groups() -> list[Message]:
    """1,281 tokens: ten head tokens, six 211-token tool turns, a 5-token final turn."""
    return conversation(*(["x" * 800] * 6))


def overflowing() -> list[Message]:
    """A 1,004-token system prompt and a 1,004-token user turn against a budget of 1,000."""
    messages = conversation("x" * 800)
    messages[0] = system("s" * 4_000)
    messages.insert(2, user("u" * 4_000, "big_user"))
    return messages


def with_image_result() -> list[Message]:
    """A band result of 1,000 text tokens plus an image (1,024 tokens at the default estimate)."""
    image = Content.from_uri("https://example.com/plot.png", media_type="image/png")
    return [system(), user("task", "task"), *tool_turn(0, [Content.from_text("x" * 4_000), image]), user("go", "final")]


def gain_case(final: str) -> list[Message]:
    """A 1,004-token band result (cut to 165 tokens: 839 saved) before a final turn of ``final``."""
    return conversation("x" * 4_000, final=final)


SMALL_FINAL = "go"  # behind = 1,004 + 5: floor int(1,009 * 0.29) = 292 < 839
LARGE_FINAL = "y" * 12_000  # behind = 1,004 + 3,004: floor int(4,008 * 0.29) = 1,162 > 839


def strategy(**overrides: Any) -> AnchoredCompactionStrategy:
    """Head = system + task, tail = the final turn, a budget nothing here reaches by default."""
    settings: dict[str, Any] = {
        "max_input_tokens": 100_000,
        "tokenizer": TOKENIZER,
        "keep_head_groups": 2,
        "keep_tail_groups": 1,
    }
    settings.update(overrides)
    return AnchoredCompactionStrategy(**settings)


def min_gain(**overrides: Any) -> MinimumGainAnchoredCompactionStrategy:
    settings: dict[str, Any] = {
        "max_input_tokens": 100_000,
        "tokenizer": TOKENIZER,
        "keep_head_groups": 2,
        "keep_tail_groups": 1,
        "keep_tokens": 150,
    }
    settings.update(overrides)
    return MinimumGainAnchoredCompactionStrategy(**settings)


def shedder(**overrides: Any) -> AnchoredCompactionStrategy:
    """Budget 1,000 (low water 750), shortening out of the way so only sheds move tokens."""
    return strategy(max_input_tokens=1_000, keep_tokens=NO_SHORTENING, **overrides)


def by_id(messages: Sequence[Message], message_id: str) -> Message:
    return next(m for m in messages if m.message_id == message_id)


def result_of(messages: Sequence[Message], message_id: str) -> str:
    content = by_id(messages, message_id).contents[0]
    assert content.type == "function_result"
    return str(content.result)


def is_excluded(message: Message) -> bool:
    return bool(message.additional_properties.get("_excluded", False))


def excluded_ids(messages: Sequence[Message]) -> list[str | None]:
    return [m.message_id for m in messages if is_excluded(m)]


def notes(messages: Sequence[Message]) -> list[tuple[str | None, str]]:
    return [(m.message_id, m.text) for m in messages if m.additional_properties.get("_maf_compaction_note")]


def included_tokens(messages: Sequence[Message]) -> int:
    return sum(ESTIMATOR.count_message_tokens(m) for m in messages if not is_excluded(m))


def render(message: Message) -> str:
    pieces: list[str] = []
    for content in message.contents:
        if content.type == "function_call":
            pieces.append(f"{content.name}({content.arguments})")
        elif content.type == "function_result":
            pieces.append(str(content.result))
        else:
            pieces.append(content.text or "")
    return "|".join(pieces)


def prompt(messages: Sequence[Message]) -> list[tuple[str | None, str, str]]:
    """What the model is sent: id, role and text of every included message."""
    return [(m.message_id, str(m.role), render(m)) for m in messages if not is_excluded(m)]


def dump(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The messages' bytes, deep-copied so later passes cannot change them."""
    return copy.deepcopy([m.to_dict() for m in messages])


def kept_tokens(shortened: str) -> int:
    """Tokens of the head and tail a shortened result keeps (the marker line excluded)."""
    found = MARKER_LINE.search(shortened)
    assert found is not None
    return TOKENIZER.count_tokens(shortened[: found.start()]) + TOKENIZER.count_tokens(shortened[found.end() :])


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "maf_compaction" and r.levelno == logging.WARNING]


# --- the band: group positions only ----------------------------------------------------------------


async def test_pass_with_an_empty_band_returns_false_and_changes_nothing() -> None:
    messages = conversation("x" * 40_000)  # four groups
    before = dump(messages)

    changed = await strategy(keep_tokens=150, keep_tail_groups=2)(messages)

    assert (changed, dump(messages)) == (False, before)


async def test_system_message_counts_as_a_head_group() -> None:
    messages = [system(), *tool_turn(0, "x" * 4_000), user("task", "task"), *tool_turn(1, "x" * 4_000)]
    messages.append(user("go", "final"))

    await strategy(keep_tokens=150, keep_head_groups=1)(messages)

    assert (is_shortened(result_of(messages, "t0")), is_shortened(result_of(messages, "t1"))) == (True, True)


async def test_groups_after_the_system_message_fill_the_rest_of_the_head() -> None:
    messages = [system(), *tool_turn(0, "x" * 4_000), user("task", "task"), *tool_turn(1, "x" * 4_000)]
    messages.append(user("go", "final"))

    await strategy(keep_tokens=150, keep_head_groups=2)(messages)

    assert (result_of(messages, "t0"), is_shortened(result_of(messages, "t1"))) == ("x" * 4_000, True)


async def test_keep_head_groups_zero_puts_the_first_group_in_the_band() -> None:
    messages = [*tool_turn(0, "x" * 4_000), user("go", "final")]

    await strategy(keep_tokens=150, keep_head_groups=0)(messages)

    assert is_shortened(result_of(messages, "t0")) is True


async def test_notes_do_not_move_the_tail_anchor() -> None:
    # Were the five notes of the first pass groups, the tail turn t6 would enter the band and be cut.
    messages = [*six_groups()[:-1], *tool_turn(6, "x" * 4_000)]
    compactor = strategy(max_input_tokens=2_000, keep_tokens=999)
    await compactor(messages)
    after_first = dump(messages)

    changed = await compactor(messages)

    assert (len(notes(messages)), changed, dump(messages), result_of(messages, "t6")) == (
        5,
        False,
        after_first,
        "x" * 4_000,
    )


async def test_injected_todo_does_not_count_as_a_head_group() -> None:
    # Were the todo a group, the two head groups would be the todo and the system message, and t0 would be cut.
    messages = [injected("user", "todo: 1. look up the deployment"), system(), *tool_turn(0, "x" * 4_000)]
    messages.append(user("go", "final"))

    await strategy(keep_tokens=150, keep_head_groups=2)(messages)

    assert result_of(messages, "t0") == "x" * 4_000


async def test_injected_message_is_never_shed_or_changed() -> None:
    messages = six_groups()
    todo = injected("assistant", "todo " * 400)
    messages.insert(4, todo)
    before = todo.to_dict()

    await shedder()(messages)

    assert (by_id(messages, "todo").to_dict(), "todo" in excluded_ids(messages)) == (before, False)


async def test_message_loaded_by_a_history_provider_still_counts_as_a_group() -> None:
    loaded = {"source_id": "memory", "source_type": "InMemoryHistoryProvider"}
    messages = [system(), Message("user", ["task"], message_id="task", additional_properties={"_attribution": loaded})]
    messages += [*tool_turn(0, "x" * 4_000), user("go", "final")]

    await strategy(keep_tokens=150, keep_head_groups=2)(messages)

    # Were the task not a group, the two head groups would be the system message and t0's turn.
    assert is_shortened(result_of(messages, "t0")) is True


# --- the per-position keep rule --------------------------------------------------------------------


async def test_results_keep_the_harmonic_allowance_of_their_position() -> None:
    # At 117,952 positions 0-5 keep 29,488, 14,744, 9,829, 7,372, 5,897 and 4,914 tokens.
    messages = conversation(*(["x" * 32_000] * 6))  # 8,000-token results

    await strategy(max_input_tokens=117_952)(messages)

    kept = [kept_tokens(r) if is_shortened(r) else None for r in (result_of(messages, f"t{p}") for p in range(6))]
    assert kept == [None, None, None, 7_372, 5_897, 4_914]


async def test_keep_tokens_overrides_the_position_rule() -> None:
    messages = conversation(*(["x" * 4_000] * 3))

    await strategy(keep_tokens=300)(messages)

    assert [kept_tokens(result_of(messages, f"t{p}")) for p in range(3)] == [300, 300, 300]


async def test_result_within_its_allowance_is_untouched() -> None:
    messages = conversation("x" * 596)  # 149 tokens

    changed = await strategy(keep_tokens=150)(messages)

    assert (changed, result_of(messages, "t0")) == (False, "x" * 596)


async def test_result_over_its_allowance_is_cut_to_head_marker_tail() -> None:
    messages = conversation("x" * 4_000)

    await strategy(keep_tokens=150)(messages)

    assert result_of(messages, "t0") == "x" * 300 + "\n[... removed by compaction: 3,400 characters]\n" + "x" * 300


async def test_marker_counts_removed_characters_with_thousands_commas() -> None:
    original = "".join(f"code_{i}=TL-{i:06X}\n" for i in range(2_000))
    messages = conversation(original)

    await strategy(keep_tokens=150)(messages)

    shortened = result_of(messages, "t0")
    found = MARKER_LINE.search(shortened)
    assert found is not None
    assert found.group(1) == f"{len(original) - len(shortened[: found.start()]) - len(shortened[found.end() :]):,}"


async def test_shortened_result_costs_about_its_allowance() -> None:
    messages = conversation("x" * 40_000)

    await strategy(keep_tokens=1_000)(messages)

    assert (
        ESTIMATOR.count_message_tokens(by_id(messages, "t0"))
        == 4 + 1_000 + len("\n[... removed by compaction: 36,000 characters]\n") // 4
    )


async def test_second_pass_leaves_the_bytes_identical() -> None:
    messages = conversation(*(["x" * 4_000] * 3))
    compactor = strategy(keep_tokens=150)
    await compactor(messages)
    after_first = dump(messages)

    changed = await compactor(messages)

    assert (changed, dump(messages)) == (False, after_first)


async def test_shortened_result_keeps_its_original_text() -> None:
    original = "code_7=TL-3FA9C2\n" * 500
    messages = conversation(original)

    await strategy(keep_tokens=150)(messages)

    assert original_results(by_id(messages, "t0")) == {"c0_0": original}


async def test_unshortened_message_has_no_original_results() -> None:
    messages = conversation("x" * 4_000)

    await strategy(keep_tokens=150)(messages)

    assert original_results(by_id(messages, "a0")) == {}


async def test_head_and_tail_results_are_never_shortened() -> None:
    messages = [system(), *tool_turn(0, "x" * 4_000), *tool_turn(1, "x" * 4_000), *tool_turn(2, "x" * 4_000)]

    await strategy(keep_tokens=150)(messages)

    assert (result_of(messages, "t0"), is_shortened(result_of(messages, "t1")), result_of(messages, "t2")) == (
        "x" * 4_000,
        True,
        "x" * 4_000,
    )


async def test_user_system_and_assistant_text_are_never_shortened() -> None:
    messages = conversation("x" * 40)
    messages[0] = system("s" * 8_000)
    messages[2:2] = [user("u" * 8_000, "big_user"), reply("r" * 8_000, "big_reply")]
    before = dump(messages)

    changed = await strategy(keep_tokens=150, keep_head_groups=1)(messages)

    assert (changed, dump(messages)) == (False, before)


async def test_preserved_result_is_never_shortened() -> None:
    messages = [system(), user("task", "task"), *tool_turn(0, "x" * 4_000, preserved=True), user("go", "final")]

    changed = await strategy(keep_tokens=150)(messages)

    assert (changed, result_of(messages, "t0")) == (False, "x" * 4_000)


async def test_pass_returns_true_when_it_changed_something() -> None:
    assert await strategy(keep_tokens=150)(conversation("x" * 4_000)) is True


# --- shedding ---------------------------------------------------------------------------------


async def test_nothing_is_shed_at_the_ceiling() -> None:
    messages = six_groups()

    changed = await strategy(max_input_tokens=1_281, keep_tokens=NO_SHORTENING)(messages)

    assert (changed, excluded_ids(messages)) == (False, [])


async def test_shed_excludes_the_oldest_tool_groups() -> None:
    messages = six_groups()

    await shedder()(messages)

    assert excluded_ids(messages) == ["a0", "t0", "a1", "t1", "a2", "t2"]


async def test_shed_goes_down_to_the_low_water_mark() -> None:
    messages = six_groups()

    await shedder()(messages)

    assert included_tokens(messages) <= math.floor(1_000 * 0.75)


async def test_shed_stops_at_the_first_group_that_reaches_the_low_water_mark() -> None:
    messages = six_groups()

    await shedder()(messages)

    # Keeping the last shed group (211 tokens instead of its 18-token note) would be over 750.
    assert (included_tokens(messages), included_tokens(messages) + 211 - 18 > 750) == (702, True)


async def test_pass_report_matches_what_the_model_is_sent() -> None:
    messages = six_groups()
    compactor = shedder()

    await compactor(messages)

    assert compactor.last_report is not None
    assert (compactor.last_report.tokens_before, compactor.last_report.tokens_after) == (
        1_281,
        included_tokens(messages),
    )


async def test_each_shed_group_gets_a_note_at_its_start() -> None:
    messages = six_groups()

    await shedder()(messages)

    assert [m.message_id for m in messages][2:10] == [
        "anchored_tool_0",
        "a0",
        "t0",
        "anchored_tool_1",
        "a1",
        "t1",
        "anchored_tool_2",
        "a2",
    ]


async def test_note_is_an_included_assistant_message_naming_the_tool() -> None:
    messages = six_groups()

    await shedder()(messages)

    note = by_id(messages, "anchored_tool_0")
    assert (note.role, note.text, note.additional_properties.get("_maf_compaction_note"), is_excluded(note)) == (
        "assistant",
        TOOL_NOTE,
        "anchored",
        False,
    )


async def test_note_lists_every_tool_name_sorted() -> None:
    messages = [system(), user("task", "task"), *tool_turn(0, "x" * 4_000, names=("lookup", "fetch"))]
    messages.append(user("go", "final"))

    await strategy(max_input_tokens=1_000, keep_tokens=NO_SHORTENING)(messages)

    assert notes(messages) == [("anchored_tool_0", "[compacted: an earlier tool call and its result (fetch, lookup)]")]


async def test_shed_messages_stay_in_the_list_excluded_with_a_reason() -> None:
    messages = six_groups()

    await shedder()(messages)

    shed = by_id(messages, "t0").additional_properties
    assert (len(messages), shed.get("_excluded"), shed.get("_exclude_reason")) == (15 + 3, True, "anchored_compaction")


async def test_shed_warning_names_the_shed_message_ids(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="maf_compaction")

    await shedder()(six_groups())

    assert len(warnings_of(caplog)) == 1
    assert warnings_of(caplog)[0].endswith(": a0, t0, a1, t1, a2, t2")


async def test_small_turns_after_a_shed_do_not_shed_again() -> None:
    messages = six_groups()
    compactor = shedder()
    await compactor(messages)

    unchanged_prefix: list[bool] = []
    for turn in range(6, 11):  # five turns of 26 tokens: 702 -> 832, still under 1,000
        before = dump(messages)
        messages += [*tool_turn(turn, "y" * 40), user(f"next {turn}", f"u{turn}")]
        await compactor(messages)
        unchanged_prefix.append(dump(messages[: len(before)]) == before)

    assert (compactor.shed_events, unchanged_prefix, included_tokens(messages)) == (1, [True] * 5, 832)


async def test_replies_are_shed_after_tool_groups_when_still_over() -> None:
    messages = conversation("x" * 800)
    messages.insert(4, reply("r" * 2_000, "r0"))

    await strategy(max_input_tokens=600, keep_tokens=NO_SHORTENING)(messages)

    assert (excluded_ids(messages), notes(messages)) == (
        ["a0", "t0", "r0"],
        [("anchored_tool_0", TOOL_NOTE), ("anchored_reply_0", REPLY_NOTE)],
    )


async def test_replies_are_never_shed_without_collapse_assistant_text() -> None:
    messages = conversation("x" * 800)
    messages.insert(4, reply("r" * 2_000, "r0"))

    await strategy(max_input_tokens=600, keep_tokens=NO_SHORTENING, collapse_assistant_text=False)(messages)

    assert excluded_ids(messages) == ["a0", "t0"]


async def test_user_turns_are_never_shed() -> None:
    messages = conversation("x" * 800)
    messages.insert(2, user("u" * 4_000, "big_user"))

    await strategy(max_input_tokens=600, keep_tokens=NO_SHORTENING)(messages)

    assert excluded_ids(messages) == ["a0", "t0"]


async def test_preserved_group_is_skipped_but_keeps_its_position() -> None:
    messages = six_groups()
    messages[3].additional_properties["_preserved"] = True

    await shedder()(messages)

    assert (excluded_ids(messages), [n[0] for n in notes(messages)]) == (
        ["a1", "t1", "a2", "t2", "a3", "t3"],
        ["anchored_tool_1", "anchored_tool_2", "anchored_tool_3"],
    )


async def test_overflow_is_reported_when_anchors_and_user_turns_exceed_the_budget() -> None:
    messages = overflowing()
    compactor = shedder()

    await compactor(messages)

    assert compactor.last_report is not None
    assert (compactor.last_report.overflow, compactor.overflows, included_tokens(messages) > 1_000) == (True, 1, True)


async def test_each_shed_message_is_named_once_though_every_call_sheds_it_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each message is named once per reason in a conversation: a later WARNING names only what is newly shed, on
    copies rebuilt from stored history on every call as on the stored list itself."""
    caplog.set_level(logging.WARNING, logger="maf_compaction")
    worker = shedder()
    stored = conversation(*(["x" * 800] * 6))
    await worker([copy.deepcopy(m) for m in stored])  # the first call's copy
    for index in range(6, 9):  # three more tool turns, each call on a fresh copy of the unchanged stored history
        stored[-1:-1] = tool_turn(index, "x" * 800)
        await worker([copy.deepcopy(m) for m in stored])
    shed = [w for w in warnings_of(caplog) if "shed to fit the budget" in w]
    names = [name for w in shed for name in w.rsplit(": ", 1)[1].split(", ")]
    assert len(shed) > 1
    assert len(names) == len(set(names)), names  # never named twice
    assert names[:6] == ["a0", "t0", "a1", "t1", "a2", "t2"]


async def test_overflow_is_logged_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="maf_compaction")

    await shedder()(overflowing())

    assert any("over the 1000-token ceiling" in message for message in warnings_of(caplog))


async def test_overflow_leaves_the_anchors_unchanged() -> None:
    messages = overflowing()
    anchors = dump([messages[0], messages[1], messages[-1]])

    await shedder()(messages)

    assert (dump([by_id(messages, i) for i in ("sys", "task", "final")]), excluded_ids(messages)) == (
        anchors,
        ["a0", "t0"],
    )


async def test_result_with_an_image_is_still_counted_after_shortening() -> None:
    # Regression: a shortened result once lost its 1,024-token media estimate from the count.
    messages = with_image_result()
    compactor = strategy(max_input_tokens=1_000, keep_tokens=150)

    await compactor(messages)

    assert compactor.last_report is not None
    assert compactor.last_report.tokens_after == included_tokens(messages)


async def test_pass_over_an_image_result_sheds_to_fit() -> None:
    messages = with_image_result()
    compactor = strategy(max_input_tokens=1_000, keep_tokens=150)

    await compactor(messages)

    assert compactor.last_report is not None
    assert (included_tokens(messages) <= 1_000, compactor.last_report.overflow) == (True, False)


async def test_no_message_is_excluded_without_a_warning_naming_it(caplog: pytest.LogCaptureFixture) -> None:
    # Regression: a group skipped while preserved was once shed silently on a list without the mark.
    caplog.set_level(logging.WARNING, logger="maf_compaction")
    compactor = shedder()
    in_call = six_groups()
    in_call[3].additional_properties["_preserved"] = True
    await compactor(in_call)
    stored = six_groups()  # the same conversation without the mark
    await compactor(stored)

    named = " ".join(warnings_of(caplog))
    assert [i for i in excluded_ids(stored) if not re.search(rf"\b{i}\b", named)] == []


async def test_group_spared_while_preserved_stays_on_a_list_without_the_mark() -> None:
    compactor = shedder()
    in_call = six_groups()
    in_call[3].additional_properties["_preserved"] = True
    await compactor(in_call)
    stored = six_groups()

    await compactor(stored)

    assert (excluded_ids(stored), compactor.shed_events) == (["a1", "t1", "a2", "t2", "a3", "t3"], 1)


# --- compact_to --------------------------------------------------------------------------------


async def test_compact_to_shortens_exactly_like_a_normal_pass() -> None:
    normal, lowered = conversation(*(["x" * 4_000] * 3)), conversation(*(["x" * 4_000] * 3))
    await strategy(keep_tokens=150)(normal)

    strategy(keep_tokens=150).compact_to(lowered, ceiling=50_000)

    assert dump(lowered) == dump(normal)


async def test_compact_to_sheds_toward_its_own_ceiling() -> None:
    normal, lowered = six_groups(), six_groups()
    await strategy(keep_tokens=NO_SHORTENING)(normal)

    strategy(keep_tokens=NO_SHORTENING).compact_to(lowered, ceiling=1_000)

    assert (excluded_ids(normal), excluded_ids(lowered)) == ([], ["a0", "t0", "a1", "t1", "a2", "t2"])


@pytest.mark.parametrize("ceiling", [0, -1, 1.5, True])
def test_compact_to_refuses_an_invalid_ceiling(ceiling: Any) -> None:
    with pytest.raises(ValueError, match="ceiling"):
        strategy().compact_to(six_groups(), ceiling=ceiling)


def test_compact_to_an_empty_list_returns_false() -> None:
    assert strategy().compact_to([], ceiling=1_000) is False


async def test_pass_over_an_empty_list_returns_false() -> None:
    assert await strategy()([]) is False


# --- sheds replay on the other list and across instances ----------------------------------------


async def test_other_list_gets_the_same_sheds_without_a_new_shed_event() -> None:
    in_call, stored = six_groups(), six_groups()
    compactor = shedder()
    await compactor(in_call)

    await compactor(stored)

    assert (prompt(stored), excluded_ids(stored), notes(stored), compactor.shed_events) == (
        prompt(in_call),
        excluded_ids(in_call),
        notes(in_call),
        1,
    )


async def test_replay_on_the_other_list_logs_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="maf_compaction")
    compactor = shedder()
    await compactor(six_groups())
    caplog.clear()

    await compactor(six_groups())

    assert warnings_of(caplog) == []


async def test_decision_state_holds_the_shed_watermark() -> None:
    compactor = shedder()

    await compactor(six_groups())

    assert compactor.decision_state() == AnchoredSnapshot(
        tools_shed=3,
        texts_shed=0,
        shortened=6,
        shed_sizes=((0, 2), (1, 2), (2, 2)),
        keep_head_groups=compactor.config.keep_head_groups,
    )


@pytest.mark.parametrize("as_dict", [False, True], ids=["snapshot", "dict"])
async def test_restored_instance_replays_the_sheds(as_dict: bool) -> None:
    first, replayed = six_groups(), six_groups()
    original = shedder()
    await original(first)
    restored = shedder()
    state = original.decision_state()

    restored.restore_decisions(state.to_dict() if as_dict else state)
    await restored(replayed)

    assert (prompt(replayed), excluded_ids(replayed), restored.shed_events) == (prompt(first), excluded_ids(first), 0)


def test_restore_refuses_a_newer_snapshot_version() -> None:
    data = {**AnchoredSnapshot().to_dict(), "version": 99}

    with pytest.raises(SnapshotVersionError, match="99"):
        strategy().restore_decisions(data)


# --- the minimum-gain floor --------------------------------------------------------------------


def test_min_gain_fraction_defaults_to_029() -> None:
    assert min_gain().min_gain_fraction == 0.29


async def test_min_gain_accepts_a_collapse_above_the_floor() -> None:
    messages = gain_case(SMALL_FINAL)
    compactor = min_gain()

    changed = await compactor(messages)

    assert (changed, is_shortened(result_of(messages, "t0")), compactor.declined_collapses) == (True, True, 0)


async def test_min_gain_declines_a_collapse_below_the_floor_under_the_ceiling() -> None:
    messages = gain_case(LARGE_FINAL)
    before = dump(messages)
    compactor = min_gain()

    changed = await compactor(messages)

    assert (changed, dump(messages), compactor.declined_collapses) == (False, before, 1)


async def test_min_gain_accepts_the_same_collapse_over_the_ceiling() -> None:
    messages = gain_case(LARGE_FINAL)  # 4,025 tokens
    compactor = min_gain(max_input_tokens=4_000)

    await compactor(messages)

    assert (is_shortened(result_of(messages, "t0")), compactor.declined_collapses, excluded_ids(messages)) == (
        True,
        0,
        [],
    )


async def test_zero_min_gain_behaves_exactly_like_the_anchored_strategy() -> None:
    anchored, zero = gain_case(LARGE_FINAL), gain_case(LARGE_FINAL)

    results = (
        await strategy(keep_tokens=150)(anchored),
        await min_gain(min_gain_fraction=0)(zero),
    )

    assert (results, dump(zero)) == ((True, True), dump(anchored))


async def test_accepted_collapse_is_kept_when_the_ratio_would_now_decline() -> None:
    compactor = min_gain()
    await compactor(gain_case(SMALL_FINAL))
    longer, fresh = ([*gain_case(SMALL_FINAL), user(LARGE_FINAL, "later")] for _ in range(2))

    await compactor(longer)
    await min_gain()(fresh)

    assert (is_shortened(result_of(longer, "t0")), result_of(fresh, "t0")) == (True, "x" * 4_000)


# --- validation --------------------------------------------------------------------------------


INVALID_PARAMETERS: list[tuple[dict[str, Any], str]] = [
    ({"max_input_tokens": 0}, r"max_input_tokens must be an integer >= 1"),
    ({"max_input_tokens": -5}, r"max_input_tokens must be an integer >= 1"),
    ({"max_input_tokens": 1.5}, r"max_input_tokens must be an integer >= 1"),
    ({"max_input_tokens": True}, r"max_input_tokens must be an integer >= 1"),
    ({"keep_head_groups": -1}, r"keep_head_groups must be an integer >= 0"),
    ({"keep_tail_groups": -1}, r"keep_tail_groups must be an integer >= 0"),
    ({"keep_tokens": -1}, r"keep_tokens must be an integer >= 0"),
    ({"band_share": 0}, r"band_share must be in \(0, 1\]"),
    ({"band_share": 1.5}, r"band_share must be in \(0, 1\]"),
    ({"band_share": float("nan")}, r"band_share must be in \(0, 1\]"),
    ({"low_water_fraction": 0}, r"low_water_fraction must be in \(0, 1\]"),
    ({"low_water_fraction": 1.2}, r"low_water_fraction must be in \(0, 1\]"),
    ({"tokenizer": object()}, r"tokenizer must have a count_tokens"),
]


@pytest.mark.parametrize(
    ("overrides", "message"),
    INVALID_PARAMETERS,
    ids=[
        ", ".join(f"{k}={re.sub(r' at 0x[0-9a-f]+', '', repr(v))}" for k, v in overrides.items())
        for overrides, _ in INVALID_PARAMETERS
    ],
)
@pytest.mark.parametrize("factory", [strategy, min_gain], ids=["anchored", "min_gain"])
def test_invalid_parameter_is_refused_by_name_and_range(factory: Any, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        factory(**overrides)


@pytest.mark.parametrize("fraction", [-0.1, 1.0])
def test_invalid_min_gain_fraction_is_refused_by_name_and_range(fraction: float) -> None:
    with pytest.raises(ValueError, match=r"min_gain_fraction must be in \[0, 1\)"):
        min_gain(min_gain_fraction=fraction)


@pytest.mark.parametrize(
    "overrides",
    [
        {"band_share": 1},
        {"keep_head_groups": 0},
        {"keep_tail_groups": 0},
        {"keep_tokens": 0},
        {"low_water_fraction": 1},
    ],
    ids=repr,
)
def test_edge_values_are_accepted(overrides: dict[str, Any]) -> None:
    config = strategy(**overrides).config

    assert {name: getattr(config, name) for name in overrides} == overrides


def test_zero_min_gain_fraction_is_accepted() -> None:
    assert min_gain(min_gain_fraction=0).min_gain_fraction == 0


def test_a_snapshot_made_under_another_head_is_refused() -> None:
    from maf_compaction import AnchoredSnapshot, SnapshotError

    strategy = AnchoredCompactionStrategy(max_input_tokens=1_000, tokenizer=CharacterEstimatorTokenizer())
    with pytest.raises(SnapshotError, match="keep_head_groups=5"):
        strategy.restore_decisions(AnchoredSnapshot(tools_shed=2, keep_head_groups=5))
    strategy.restore_decisions(AnchoredSnapshot(tools_shed=2, keep_head_groups=3))
    assert strategy.decision_state().tools_shed == 2
