"""Where a prefix break comes from: ``bench.breaks`` on hand-made requests, and on the wire of both real clients."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from agent_framework import Content, Message

from maf_compaction.bench.breaks import (
    Break,
    RowCauses,
    break_cause,
    causes_table,
    named_loop_messages,
    regions,
    tally,
)
from maf_compaction.bench.rendering import RenderedRequest, opaque, render_message
from maf_compaction.bench.runner import Cell, Settings, play_cell

SYSTEM = "<|system|>\nBe brief."
USER = render_message(Message("user", ["look it up"]))
NEXT = render_message(Message("user", ["and now?"]))
CALL = render_message(Message("assistant", [Content.from_function_call(call_id="c1", name="lookup", arguments="{}")]))
NAMED_CALL = render_message(
    Message("assistant", [Content.from_function_call(call_id="c1", name="lookup", arguments="{}")]), name="Agent"
)
RESULT = render_message(Message("tool", [Content.from_function_result(call_id="c1", result="TL-1")]))
ANSWER = render_message(Message("assistant", ["TL-1"]))
PINNED = (("tool_choice", '{"mode":"required","required_function_name":"recall"}'),)


def request(*messages: str, head: tuple[tuple[str, str], ...] = (), tools: str | None = None) -> RenderedRequest:
    return RenderedRequest(instructions=SYSTEM, tools=tools, messages=messages, head=head)


def test_an_extension_or_the_same_request_is_no_break() -> None:
    before = request(USER, CALL, RESULT)
    assert break_cause(before, before) is None
    assert break_cause(before, request(USER, CALL, RESULT, ANSWER)) is None


def test_a_participant_name_the_loop_did_not_send_is_named() -> None:
    found = break_cause(request(USER, CALL, RESULT), request(USER, NAMED_CALL, RESULT, ANSWER, USER))
    assert found == Break("message", "assistant message: participant name added", 1)
    assert str(found) == "message 1: assistant message: participant name added"
    removed = break_cause(request(USER, NAMED_CALL), request(USER, CALL))
    assert removed is not None
    assert removed.cause == "assistant message: participant name removed"


def test_a_head_change_comes_first_and_names_the_message_break_it_hides() -> None:
    pinned = break_cause(request(USER, CALL, RESULT), request(USER, CALL, RESULT, head=PINNED))
    assert pinned == Break("head tool_choice", "auto -> pinned to recall")
    unpinned = break_cause(request(USER, CALL, RESULT, head=PINNED), request(USER, RESULT, ANSWER))
    assert unpinned == Break("head tool_choice", "pinned to recall -> auto", 1, "messages dropped")
    assert unpinned is not None
    assert unpinned.label == "head tool_choice: pinned to recall -> auto, and messages dropped"
    assert break_cause(request(USER), request(USER, head=PINNED), ignore_head=["tool_choice"]) is None


def test_tools_and_instructions_are_named() -> None:
    assert break_cause(request(USER), request(USER, tools="<|tools|>\n[]")) == Break(
        "tools", "tool declarations changed"
    )
    other = dataclasses.replace(request(USER), instructions="<|system|>\nBe thorough.")
    assert break_cause(request(USER), other) == Break("instructions", "instructions changed")


def test_compaction_edits_are_told_apart() -> None:
    before = request(USER, CALL, RESULT, ANSWER)
    dropped = break_cause(before, request(ANSWER, NEXT))
    assert dropped == Break("message", "messages dropped", 0)
    record = render_message(Message("assistant", ["record: TL-1"]))
    inserted = break_cause(before, request(USER, record, CALL, RESULT, ANSWER))
    assert inserted == Break("message", "assistant message inserted", 1)
    replaced = break_cause(before, request(USER, CALL, render_message(Message("tool", ["[removed]"])), ANSWER))
    assert replaced == Break("message", "tool message replaced", 2)
    assert break_cause(before, request(USER, CALL)) == Break("message", "trailing messages dropped", 2)


def test_changed_opaque_reasoning_is_named() -> None:
    before = request(USER, opaque("state-1"), ANSWER)
    found = break_cause(before, request(USER, opaque("state-2"), ANSWER))
    assert found == Break("message", "reasoning message: opaque reasoning state changed", 1)


def test_tally_and_table() -> None:
    causes = tally([None, Break("message", "b"), Break("message", "a"), Break("message", "b")])
    assert causes == {"b": 2, "a": 1}
    lines = causes_table([RowCauses("none", causes, 0.5, 0.25), RowCauses("other", {"a": 3}, 0.25, 0.5)])
    assert lines[0] == "| cause | none | other |"
    assert lines[2:] == [
        "| a | 1 | 3 |",
        "| b | 2 | 0 |",
        "| **breaks** | **3** | **3** |",
        "| cost $ | 0.5000 | 0.2500 |",
        "| of it: pinned calls $ | 0.0000 | 0.0000 |",
        "| hit% | 25.0 | 50.0 |",
    ]


async def test_the_streaming_path_sends_the_loops_messages_unnamed_on_every_request() -> None:
    """Streaming names copies of the answer at the run's end: the Chat control never breaks."""
    result, _ = await play_cell(Cell("none", 1.5, 1), Settings(client="openai-chat", stream=True))
    assert result.breaks == 0
    assert result.break_causes == {}


@pytest.mark.parametrize("kind", ["openai-chat", "openai-responses"])
async def test_the_controls_breaks_on_the_wire_are_the_loops_unnamed_messages(kind: str) -> None:
    """Chat replays a tool loop's assistant message with a name the loop did not send; the patch fixes it."""
    settings = Settings(client=kind)  # pyright: ignore[reportArgumentType]
    result, _ = await play_cell(Cell("none", 1.5, 1), settings)
    expected = {"assistant message: participant name added": 6} if kind == "openai-chat" else {}
    assert result.break_causes == expected
    assert result.breaks == sum(expected.values())
    with named_loop_messages():
        fixed, _ = await play_cell(Cell("none", 1.5, 1), settings)
    assert fixed.breaks == 0
    assert fixed.break_causes == {}
    assert fixed.cost <= result.cost


def test_the_committed_wire_cache_tables_are_current(tmp_path: Path) -> None:
    """docs/wire-cache.md's tables are what ``python -m maf_compaction.bench.breaks --write`` writes.

    The command runs in a fresh interpreter, as a user runs it. A cost once came out a ten-thousandth apart
    (0.1249 for 0.1248, the framework's row): the framework's random function-call identities, which its
    ``ContextWindowCompactionStrategy`` counts; each cell now draws them from its seed
    (``runner.seeded_framework_ids``).
    """
    page = Path(__file__).resolve().parents[1] / "docs" / "wire-cache.md"
    text = page.read_text(encoding="utf-8")
    assert [name for name, _, _ in regions(text)] == ["wire", "named"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "wire-cache.md").write_text(text, encoding="utf-8")
    command = [sys.executable, "-W", "ignore", "-m", "maf_compaction.bench.breaks", "--write"]
    subprocess.run(command, cwd=tmp_path, check=True, capture_output=True, timeout=600)
    assert (tmp_path / "docs" / "wire-cache.md").read_text(encoding="utf-8") == text
