"""The safety net under the records: over the budget, a tool group no record covers is cut to the
lines that carry its distinctive values before any group is shed.

The pure rule is exercised here on the anchored engine (the record strategies' fallback runs it);
tests/test_records.py and tests/test_composition.py drive it through the strategies.
"""

from __future__ import annotations

from dataclasses import replace

from pyrsistent import pvector

from maf_compaction.core import anchored
from maf_compaction.core.anchored import AnchoredConfig, AnchoredSnapshot
from maf_compaction.core.distill import is_distilled
from maf_compaction.core.model import History, MessageRecord, Part
from maf_compaction.core.values import distinctive_values

FILLER = "the service answered within its window and nothing else of note happened here"


def measure(text: str) -> int:
    return max(1, len(text) // 4)


def lookup_text(n: int) -> str:
    lines = [f"# lookup {n}"]
    lines += [f"code_{n}_{i}=TL-{n:02d}{i:04d}" if i % 8 == 3 else FILLER for i in range(40)]
    return "\n".join(lines)


def text(role: str, body: str, message_id: str, origin: int) -> MessageRecord:
    return MessageRecord(
        role=role,
        parts=(Part(kind="text", text=body, tokens=measure(body)),),
        tokens=4 + measure(body),
        message_id=message_id,
        origin=origin,
    )


def group(n: int, origin: int, *, held: str | None) -> list[MessageRecord]:
    call_text = f'lookup {{"n":{n}}}'
    result = lookup_text(n)
    call = MessageRecord(
        role="assistant",
        parts=(Part(kind="function_call", text=call_text, tokens=measure(call_text), call_id=f"c{n}", name="lookup"),),
        tokens=4 + measure(call_text),
        message_id=f"a{n}",
        origin=origin,
        held=held,
    )
    reply = MessageRecord(
        role="tool",
        parts=(Part(kind="function_result", text=result, tokens=measure(result), call_id=f"c{n}"),),
        tokens=4 + measure(result),
        message_id=f"t{n}",
        origin=origin + 1,
        held=held,
    )
    return [call, reply]


def conversation(lookups: int, *, held: str | None = "uncovered") -> History:
    records = [text("user", "Audit the deployments.", "task", 0)]
    for n in range(lookups):
        records += [text("user", f"Run lookup {n}.", f"u{n}", len(records)), *group(n, len(records) + 1, held=held)]
    return pvector(records)


CONFIG = AnchoredConfig(max_input_tokens=2_000, keep_head_groups=1, keep_tail_groups=2, keep_tokens=10**6)
DISTILLABLE: frozenset[str | None] = frozenset({"uncovered"})


def run(
    history: History, state: AnchoredSnapshot | None = None, *, distillable: frozenset[str | None] = frozenset()
) -> anchored.AnchoredDone:
    snapshot = AnchoredSnapshot() if state is None else state
    return anchored.run(CONFIG, snapshot, history, measure, releasable=frozenset(), distillable=distillable)


def results(history: History) -> list[str]:
    return [p.text for r in history for p in r.parts if p.kind == "function_result" and not r.excluded]


def test_over_the_budget_uncovered_groups_are_distilled_oldest_first_and_nothing_is_shed() -> None:
    history = conversation(8)
    done = run(history, distillable=DISTILLABLE)

    texts = results(done.history)
    assert done.report.tokens_before > CONFIG.max_input_tokens >= done.report.tokens_after
    assert done.report.shed == ()
    assert [is_distilled(t) for t in texts] == [True] * len(done.state.distilled) + [False] * (
        len(texts) - len(done.state.distilled)
    )
    assert done.state.distilled == tuple(range(len(done.state.distilled)))
    # Every planted value is still in the prompt, verbatim.
    for n in range(8):
        for value in distinctive_values(lookup_text(n)):
            assert any(value in t for t in texts)
    assert done.report.distilled == tuple(
        r.origin for r in done.history if r.role == "tool" and is_distilled(r.parts[0].text)
    )


def test_without_the_net_the_same_pass_sheds_whole_groups() -> None:
    history = conversation(8, held=None)
    done = run(history)

    assert done.report.shed
    assert done.state.distilled == ()
    assert not any(is_distilled(t) for t in results(done.history))


def test_a_group_held_for_another_reason_is_not_distilled() -> None:
    done = run(conversation(8, held="record"), distillable=DISTILLABLE)

    assert done.state.distilled == ()
    assert done.report.overflow


def test_distillations_replay_on_the_other_list_and_a_pass_over_its_own_output_changes_nothing() -> None:
    history = conversation(8)
    first = run(history, distillable=DISTILLABLE)
    # The other list: the same conversation, undistilled, with the snapshot: the same bytes.
    other = run(history, first.state, distillable=DISTILLABLE)
    assert list(other.history) == list(first.history)
    assert other.report.distilled == ()  # a replay is not news: the first list's pass named them
    again = run(first.history, first.state, distillable=DISTILLABLE)
    assert list(again.history) == list(first.history)
    assert again.report.distilled == ()
    assert again.state == first.state


def test_a_replayed_distillation_holds_under_the_budget_too() -> None:
    """A decision replays whatever the size, so a later list that happens to fit gives the same bytes."""
    history = conversation(8)
    first = run(history, distillable=DISTILLABLE)
    roomy = replace(CONFIG, max_input_tokens=100_000)
    replayed = anchored.run(roomy, first.state, history, measure, releasable=frozenset(), distillable=DISTILLABLE)
    assert results(replayed.history) == results(first.history)


def test_the_snapshot_refuses_a_distilled_position_the_band_never_had() -> None:
    history = conversation(4)
    forged = AnchoredSnapshot(distilled=(7,), keep_head_groups=1)
    refused = anchored.check(CONFIG, forged, history)
    assert refused is not None
    assert refused.startswith("snapshot field 'distilled' names band position 7, but the band holds")
