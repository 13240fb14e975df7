"""core/host.py: a custom host's messages count as the adapters count framework messages; bad input is refused."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from agent_framework import CharacterEstimatorTokenizer, Content, Message

from maf_compaction import core
from maf_compaction.adapters.convert import to_history
from maf_compaction.adapters.counting import as_estimator

COUNTER = as_estimator(CharacterEstimatorTokenizer()).parts
MEASURE = COUNTER.measure
OPAQUE = json.dumps(
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}], "encrypted_content": "x" * 900}
)


def adapter_record(role: str, contents: list[Content]) -> core.MessageRecord:
    (record,) = to_history([Message(role, contents)], COUNTER, note_kind="anchored")
    return record


@pytest.mark.parametrize(
    ("role", "contents", "parts"),
    [
        (
            "user",
            [Content.from_text("Look up TL-3FA9C2 please")],
            [core.text_part("Look up TL-3FA9C2 please", MEASURE)],
        ),
        (
            "assistant",
            [Content.from_function_call(call_id="c1", name="lookup", arguments={"service": "billing", "limit": 3})],
            [core.call_part("c1", "lookup", {"service": "billing", "limit": 3}, MEASURE)],
        ),
        (
            "assistant",
            [Content.from_function_call(call_id="c1", name="lookup", arguments='{"service": "billing"}')],
            [core.call_part("c1", "lookup", '{"service": "billing"}', MEASURE)],
        ),
        (
            "tool",
            [Content.from_function_result(call_id="c1", result="code=TL-3FA9C2\n| a | b |")],
            [core.result_part("c1", "code=TL-3FA9C2\n| a | b |", MEASURE)],
        ),
        (
            "tool",
            [Content.from_function_result(call_id="c1", result={"code": "TL-3FA9C2"})],
            [core.result_part("c1", {"code": "TL-3FA9C2"}, MEASURE)],
        ),
        (
            "assistant",
            [
                Content.from_text_reasoning(id="rs_1", text="thinking", protected_data=OPAQUE),
                Content.from_text("Done."),
            ],
            [core.reasoning_part("thinking", MEASURE, opaque=OPAQUE), core.text_part("Done.", MEASURE)],
        ),
    ],
)
def test_a_hosts_message_counts_as_the_adapters_count_the_framework_message(
    role: str, contents: list[Content], parts: list[core.Part]
) -> None:
    ours = core.message(role, parts, origin=0)

    assert ours == adapter_record(role, contents)
    assert ours.tokens == adapter_record(role, contents).tokens


def test_an_opaque_payload_never_counts() -> None:
    assert core.reasoning_part("", MEASURE, opaque="A" * 4_000).tokens == 0


def test_a_media_part_counts_at_the_hosts_estimate() -> None:
    part = core.media_part("uri:image/png:https://example.com/a.png", 1_024)

    assert (part.tokens, part.media_tokens, part.text) == (1_024, 1_024, "")


@pytest.mark.parametrize(
    ("build", "error", "words"),
    [
        (lambda: core.message("robot", []), ValueError, "role must be one of"),
        (lambda: core.message("user", cast("Any", ["text"])), TypeError, "parts[0] must be a Part"),
        (lambda: core.message("user", [], origin=-1), ValueError, "origin"),
        (lambda: core.text_part(cast("Any", 3), MEASURE), TypeError, "text must be a string"),
        (lambda: core.text_part("x", lambda _: -1), TypeError, "measure must return an integer"),
        (lambda: core.media_part("ref", 10, kind="text"), ValueError, "kind must be one of"),
        (lambda: core.media_part("ref", -1), ValueError, "tokens"),
        (lambda: core.result_part("c1", "x", MEASURE, media_tokens=-2), ValueError, "media_tokens"),
    ],
)
def test_invalid_input_is_refused_naming_the_argument(build: object, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]")):
        build()  # type: ignore[operator]


def test_prompt_and_unchanged_say_what_to_send() -> None:
    given = core.history(
        [
            core.message("user", [core.text_part("hello", MEASURE)], origin=0),
            core.message("tool", [core.result_part("c1", "long result " * 20, MEASURE)], origin=1),
        ]
    )
    excluded = core.MessageRecord("user", given[0].parts, given[0].tokens, origin=0, excluded=True)
    cut = core.message("tool", [core.result_part("c1", "long result", MEASURE)], origin=1)
    note = core.message("assistant", [core.text_part("[compacted]", MEASURE)])

    assert core.prompt([excluded, cut, note]) == (cut, note)
    assert [core.unchanged(record, given) for record in (given[0], cut, note)] == [True, False, False]


def test_a_stored_state_reads_back_strictly() -> None:
    config = core.CompositionConfig(
        records=core.RecordConfig(max_input_tokens=1_000, fallback=core.AnchoredConfig(max_input_tokens=1_000)),
        users=core.UserSummaryConfig(max_input_tokens=1_000),
    )
    stored = json.loads(json.dumps(core.State().to_dict()))

    assert core.read_state(config, stored) == core.State()
    with pytest.raises(core.SnapshotVersionError):
        core.read_state(config, {**stored, "version": 99})
    with pytest.raises(core.SnapshotError):
        core.read_state(config, {**stored, "answers": "none"})
    assert core.read_snapshot(config.records.fallback, core.AnchoredSnapshot().to_dict()) == core.AnchoredSnapshot()


def test_a_rule_with_a_payoff_share_takes_the_hosts_measure() -> None:
    """``record_rule`` carries the config's payoff share; ``request_sent`` then needs the host's measure to judge
    which tool groups a record would pay for, and says so rather than count every group."""
    config = core.RecordConfig(max_input_tokens=1_000, payoff_share=0.2)
    rule = core.record_rule(config)
    assert rule.payoff_share == 0.2
    assert core.record_rule(core.RecordConfig(max_input_tokens=1_000)).payoff_share is None
    history = to_history(
        [Message("user", ["Task."])], as_estimator(CharacterEstimatorTokenizer()).parts, note_kind="anchored"
    )
    with pytest.raises(TypeError, match="measure"):
        core.request_sent(rule, core.State(), history)
    state = core.request_sent(rule, core.State(), history, CharacterEstimatorTokenizer().count_tokens)
    assert state.recall.seen is not None
    assert state.recall.next_pin is None  # no tool group: no record is due
