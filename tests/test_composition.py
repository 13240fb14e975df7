"""The composition, rule by rule: parameters, the record half, the user half and its wait, the chain.

Conversations are framework ``Message`` lists as an agent stores them: a system message,
the task, then rounds of a user requirement, a lookup (call and result with planted codes)
and the assistant's narration; a record is a ``recall_earlier_tool_results`` call and its
result carrying the record prefix, quoting the values of the lookups it covers. The
summarizer is ``ScriptedSummarizer`` (a framework chat client built from the framework's
layers whose model is a script, see ``test_user_summaries``). Tokens are counted with the
framework's ``CharacterEstimatorTokenizer``.

The recall protocol's decision to pin the next request lives in the state the record half
shares with the recall middleware (its ``Conversation``); tests that need a record *due*
without a model call write that decision into the conversation's value, as the middleware does.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from typing import Any

import pytest
from agent_framework import CharacterEstimatorTokenizer, Content, Message
from msgspec.structs import replace

from histories import TODO_ATTRIBUTION, deep_copy_messages, with_injected_context
from maf_compaction import (
    AnchoredCompactionStrategy,
    CompactionBudgetExceeded,
    TiktokenTokenizer,
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
    UserTurnAnchoredSummarizationCompactionStrategy,
    find_nested_strategy,
    record_text,
)
from maf_compaction.adapters.convert import EXCLUDED_KEY, NOTE_KEY, PRESERVED_KEY, SUMMARY_KEY, SUMMARY_OF_KEY
from maf_compaction.core.anchored import TOOL_NOTE_PREFIX
from maf_compaction.core.composition import ROOM_LOW_WATER_FRACTION, CompositionReport, shed_rules
from maf_compaction.core.counting import MESSAGE_OVERHEAD_TOKENS
from maf_compaction.core.distill import is_distilled, is_remnant
from maf_compaction.core.errors import SnapshotError
from maf_compaction.core.records import RECALL_TOOL_NAME, RECORD_INSTRUCTION, RECORD_PREFIX
from maf_compaction.core.state import Answer, RecallState, RecordRoute, RequestKind, State
from maf_compaction.core.user_summaries import Outcome
from maf_compaction.core.values import distinctive_values
from test_composition_properties import shown
from test_user_summaries import ScriptedSummarizer, extractive
from wiring import recalled

TOKENIZER = CharacterEstimatorTokenizer()
Composition = ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy
FILLER = "eu-west cache-miss status=ok took=12 ms shard=3 the request completed within its window"
PAD = "please keep the layout we agreed on and make sure the export stays readable for the finance team"


# ----------------------------------------------------------------------------- conversations


def lookup_text(n: int, lines: int = 20, *, dense: bool = False) -> str:
    """A lookup result: filler and two planted codes (``dense``: a code on every line, so the safety net
    cannot make it smaller and only a shed can)."""
    body = [f"# lookup {n} of run RUN-{n:04d}"] if dense else [f"# lookup {n}"]
    body += [f"code_{n}_{i}=TL-{n:02d}{i:04d}" if dense or i % 10 == 5 else FILLER for i in range(lines)]
    return "\n".join(body)


def quote(n: int, *, dense: bool = False) -> str:
    """What a faithful record quotes of lookup ``n``."""
    return "\n".join(line for line in lookup_text(n, dense=dense).split("\n") if distinctive_values(line))


def lookup_round(n: int, *, pad: int = 2, narration: int = 0, dense: bool = False) -> list[Message]:
    """Requirement ``n`` (a user turn), lookup ``n`` (call and result), the assistant's narration."""
    call_id = f"call_{n}"
    return [
        Message("user", [f"Requirement RQ-{n:06d}: keep step {n}.\n" + "\n".join([PAD] * pad)], message_id=f"q{n}"),
        Message(
            "assistant",
            [Content.from_function_call(call_id=call_id, name="lookup", arguments={"n": n})],
            message_id=f"c{n}",
        ),
        Message(
            "tool",
            [Content.from_function_result(call_id=call_id, result=lookup_text(n, dense=dense))],
            message_id=f"r{n}",
        ),
        Message("assistant", [f"Lookup {n} is done. " + " ".join([FILLER] * narration)], message_id=f"n{n}"),
    ]


def record(covers: Sequence[int], *, number: int = 1, dense: bool = False) -> list[Message]:
    """A record the model wrote through the recall tool, quoting the lookups ``covers``."""
    body = "\n".join(quote(n, dense=dense) for n in covers)
    call_id = f"recall_{number}"
    return [
        Message(
            "assistant",
            [Content.from_function_call(call_id=call_id, name=RECALL_TOOL_NAME, arguments={"values": body})],
            message_id=f"rc{number}",
        ),
        Message(
            "tool",
            [Content.from_function_result(call_id=call_id, result=f"{RECORD_PREFIX}\n{body}")],
            message_id=f"rr{number}",
        ),
    ]


def conversation(
    lookups: int = 6, *, covers: Sequence[int] = (), pad: int = 2, narration: int = 0, dense: bool = False
) -> list[Message]:
    messages = [
        Message("system", ["You audit deployments."], message_id="sys"),
        Message("user", ["Task: reconcile the deployments."], message_id="task"),
    ]
    for n in range(lookups):
        messages += lookup_round(n, pad=pad, narration=narration, dense=dense)
    if covers:
        messages += record(covers, dense=dense)
    messages.append(Message("user", ["Now report what you found."], message_id="last"))
    return messages


def user_rounds(turns: int, *, start: int = 0, pad: int = 6) -> list[Message]:
    """User turns and short replies, no tools."""
    messages: list[Message] = []
    for n in range(start, start + turns):
        text = f"Requirement RQ-{n:06d}: keep step {n}.\n" + "\n".join([PAD] * pad)
        messages += [
            Message("user", [text], message_id=f"q{n}"),
            Message("assistant", [f"Noted {n}."], message_id=f"a{n}"),
        ]
    return messages


def chat(turns: int = 12, *, pad: int = 6) -> list[Message]:
    """A conversation of user turns, no tools."""
    return [
        Message("system", ["You keep requirements."], message_id="sys"),
        Message("user", ["Task: collect the requirements."], message_id="task"),
        *user_rounds(turns, pad=pad),
    ]


# ----------------------------------------------------------------------------- helpers


def build(
    budget: int,
    *,
    summarizer: ScriptedSummarizer | None = None,
    summary_mode: str = "boundary",
    remembered_requests: int = 2,
    records: dict[str, Any] | None = None,
    users: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Composition:
    record_half = ToolResultAnchoredSummarizationCompactionStrategy(
        max_input_tokens=budget, tokenizer=TOKENIZER, **(records or {})
    )
    user_half = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=budget,
        tokenizer=TOKENIZER,
        client=summarizer or ScriptedSummarizer(extractive),
        summary_mode=summary_mode,  # type: ignore[arg-type]
        remembered_requests=remembered_requests,
        max_summary_input_tokens=10_000,
        **(users or {}),
    )
    return recalled(Composition(tokenizer=TOKENIZER, tool_results=record_half, user_turns=user_half, **kwargs))


def run(strategy: Composition, messages: list[Message]) -> bool:
    return asyncio.run(strategy(messages))


def excluded(message: Message) -> bool:
    return bool(message.additional_properties.get(EXCLUDED_KEY))


def excluded_ids(messages: Sequence[Message]) -> list[str]:
    return [m.message_id or "?" for m in messages if excluded(m)]


def by_id(messages: Sequence[Message], message_id: str) -> Message:
    return next(m for m in messages if m.message_id == message_id)


def notes(messages: Sequence[Message]) -> list[Message]:
    return [m for m in messages if NOTE_KEY in m.additional_properties and not excluded(m)]


def size(messages: Sequence[Message]) -> int:
    """Included text tokens (a lower bound of what the strategy counts)."""
    return sum(TOKENIZER.count_tokens(m.text) for m in messages if not excluded(m))


def measured(messages: Sequence[Message]) -> tuple[int, int]:
    """(prompt tokens, after the record half) as the composition counts them, on a copy."""
    probe = build(10**9)
    copied = [Message.from_dict(m.to_dict()) for m in messages]
    run(probe, copied)
    report = probe.last_report
    assert report is not None
    return report.tokens_before, report.records.tokens_after


def needs_room(messages: Sequence[Message]) -> int:
    """A budget the prompt fits, but not beside another turn like its largest (95%: a turn is about 8%).

    While the next such step would still fit, the composition's user half does not ask
    for a summary of its own (a break whose saving later calls repay slowly).
    """
    return int(measured(messages)[0] / 0.95)


def dump(messages: Sequence[Message]) -> list[dict[str, Any]]:
    return [m.to_dict() for m in messages]


def pin_next_request(strategy: Composition) -> None:
    """Write the recall protocol's decision to pin the next request into the shared state (as the middleware does)."""
    shared = strategy.tool_results.conversation
    shared.value = replace(shared.value, recall=RecallState(next_pin="size"))


def respond(messages: list[Message], n: int) -> None:
    """One more model response and user turn (the conversation's clock moves on by one)."""
    messages += [
        Message("assistant", [f"Working on it ({n})."], message_id=f"w{n}"),
        Message("user", [f"Continue {n}."], message_id=f"k{n}"),
    ]


# ----------------------------------------------------------------------------- parameters


def _half_kwargs(**overrides: Any) -> dict[str, Any]:
    records = overrides.pop("records", {})
    users = overrides.pop("users", {})
    return {"records": records, "users": users, **overrides}


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"overflow_policy": "drop"}, "overflow_policy"),
        ({"overflow_policy": None}, "overflow_policy"),
        ({"harder_attempts": -1}, "harder_attempts"),
        ({"harder_attempts": 1.5}, "harder_attempts"),
        ({"harder_attempts": True}, "harder_attempts"),
        ({"chain_gain_fraction": 1.0}, "chain_gain_fraction"),
        ({"chain_gain_fraction": -0.01}, "chain_gain_fraction"),
        ({"chain_gain_fraction": float("nan")}, "chain_gain_fraction"),
        ({"chain_gain_fraction": "0.2"}, "chain_gain_fraction"),
        ({"remembered_requests": 1}, "remembered_requests"),
        ({"summary_mode": "fold", "remembered_requests": 1}, "remembered_requests"),
        ({"merge_prompt": ""}, "merge_prompt"),
        ({"merge_prompt": 3}, "merge_prompt"),
    ],
)
def test_an_invalid_parameter_raises_naming_it(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        build(1_000, **kwargs)


@pytest.mark.parametrize("value", [0, 1.5, -0.1, float("nan"), float("inf"), "0.5", True])
def test_an_invalid_user_trigger_fraction_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ValueError, match=r"^user_trigger_fraction must be (a number )?in \(0, 1\], got "):
        build(1_000, user_trigger_fraction=value)


@pytest.mark.parametrize("half", ["tool_results", "user_turns"])
def test_a_tokenizer_other_than_the_halves_is_refused_naming_it(half: str) -> None:
    other = CharacterEstimatorTokenizer()
    record_half = ToolResultAnchoredSummarizationCompactionStrategy(
        max_input_tokens=1_000, tokenizer=other if half == "tool_results" else TOKENIZER
    )
    user_half = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=1_000,
        tokenizer=other if half == "user_turns" else TOKENIZER,
        client=ScriptedSummarizer(),
        remembered_requests=2,
    )
    with pytest.raises(ValueError, match=rf"^tokenizer must be the same tokenizer as {half}'s"):
        Composition(tokenizer=TOKENIZER, tool_results=record_half, user_turns=user_half)
    # The same tokenizer everywhere is accepted (the README's wiring).
    assert build(1_000).tokenizer is TOKENIZER


def test_user_trigger_fraction_sets_the_user_halfs_trigger() -> None:
    assert build(1_000).config.users.trigger_fraction == build(1_000).tool_results.trigger_fraction
    assert build(1_000, user_trigger_fraction=0.75).config.users.trigger_fraction == 0.75


def test_the_two_halves_must_share_one_budget() -> None:
    record_half = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=1_000, tokenizer=TOKENIZER)
    user_half = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=900, tokenizer=TOKENIZER, client=ScriptedSummarizer(), remembered_requests=2
    )
    with pytest.raises(ValueError, match="max_input_tokens"):
        Composition(tokenizer=TOKENIZER, tool_results=record_half, user_turns=user_half)


def test_the_boundaries_of_each_range_are_accepted() -> None:
    assert build(1_000, harder_attempts=0, chain_gain_fraction=0.0).harder_attempts == 0
    assert build(1_000, chain_gain_fraction=0.999).chain_gain_fraction == pytest.approx(0.999)
    assert build(1_000, overflow_policy="raise").overflow_policy == "raise"
    assert build(1_000, summary_mode="recompact", remembered_requests=1).user_turns.config.remembered_requests == 1
    defaults = build(1_000)
    assert (defaults.overflow_policy, defaults.harder_attempts, defaults.chain_gain_fraction) == ("shed", 2, 0.29)


def test_halves_of_the_wrong_type_are_refused_naming_the_parameter() -> None:
    record_half = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=1_000, tokenizer=TOKENIZER)
    user_half = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=1_000, tokenizer=TOKENIZER, client=ScriptedSummarizer(), remembered_requests=2
    )
    anchored = AnchoredCompactionStrategy(max_input_tokens=1_000, tokenizer=TOKENIZER)
    with pytest.raises(ValueError, match="tool_results"):
        Composition(tokenizer=TOKENIZER, tool_results=anchored, user_turns=user_half)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="user_turns"):
        Composition(tokenizer=TOKENIZER, tool_results=record_half, user_turns=anchored)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tool_results"):
        Composition(tokenizer=TOKENIZER, tool_results=user_half, user_turns=record_half)  # type: ignore[arg-type]


class _HostFallback:
    """A host's own fallback: any async callable over the list."""

    async def __call__(self, messages: list[Message]) -> bool:
        del messages
        return False


def test_a_record_half_with_a_fallback_of_another_kind_is_refused_saying_what_is_supported() -> None:
    with pytest.raises(
        ValueError, match=r"^tool_results' fallback must be its default or an AnchoredCompactionStrategy"
    ):
        build(1_000, records={"fallback": _HostFallback()})


def test_the_readme_record_half_with_an_explicit_anchored_fallback_composes() -> None:
    """The README's record block (``fallback=AnchoredCompactionStrategy(max_input_tokens=BUDGET, ...)``) composes."""
    fallback = AnchoredCompactionStrategy(max_input_tokens=1_000, tokenizer=TOKENIZER)
    strategy = build(1_000, records={"fallback": fallback})
    assert strategy.config.records.fallback == fallback.config
    assert shed_rules(strategy.config, State()).keep_tail_groups == fallback.config.keep_tail_groups
    # With no route to a record the shed policy reads the fallback's band: its tail keeps one group.
    no_route = State(recall=RecallState(route=RecordRoute.NONE))
    assert shed_rules(strategy.config, no_route).keep_tail_groups == 1


@pytest.mark.parametrize(
    ("fallback", "message"),
    [
        ({"max_input_tokens": 900}, r"^tool_results' fallback must have the record half's max_input_tokens \(1000\)"),
        ({"keep_head_groups": 2}, r"^tool_results' fallback must have the record half's keep_head_groups \(3\)"),
        (
            {"tokenizer": CharacterEstimatorTokenizer()},
            r"^tokenizer must be the same tokenizer as tool_results' fallback",
        ),
    ],
)
def test_an_anchored_fallback_of_another_budget_head_or_tokenizer_is_refused(
    fallback: dict[str, Any], message: str
) -> None:
    kwargs: dict[str, Any] = {"max_input_tokens": 1_000, "tokenizer": TOKENIZER, **fallback}
    with pytest.raises(ValueError, match=message):
        build(1_000, records={"fallback": AnchoredCompactionStrategy(**kwargs)})


def test_find_nested_strategy_finds_the_record_half_and_the_estimate_delegates() -> None:
    strategy = build(100_000)
    assert find_nested_strategy(strategy, ToolResultAnchoredSummarizationCompactionStrategy) is strategy.tool_results
    assert find_nested_strategy(strategy, UserTurnAnchoredSummarizationCompactionStrategy) is strategy.user_turns
    assert find_nested_strategy(strategy, AnchoredCompactionStrategy) is None
    # A held group whose values alone exceed the record target: the half's estimate, read through the composition.
    strategy = build(100_000, records={"record_target_tokens": 1})
    messages = conversation(6, covers=(0,))
    run(strategy, messages)
    assert strategy.tool_results.groups_held_unreachable_coverage > 0
    assert strategy.groups_held_unreachable_coverage == strategy.tool_results.groups_held_unreachable_coverage


def test_record_text_reads_the_record_the_model_wrote() -> None:
    messages = conversation(3, covers=(0, 1))
    written = by_id(messages, "rr1")
    text = record_text(written, messages)
    assert quote(0) in text
    assert quote(1) in text
    assert record_text(by_id(messages, "r0"), messages) == ""


def test_the_record_halfs_take_reforce_shares_the_compositions_one_state_value() -> None:
    strategy = build(100_000)
    messages = conversation(6, covers=(0, 1, 2))
    run(strategy, messages)
    ask = strategy.decision_state().records.ask
    assert ask is not None
    assert ask.targets == (3, 4, 5)
    assert not ask.taken
    assert strategy.tool_results.decision_state().records.ask == ask
    take = strategy.tool_results.take_reforce
    assert take() is True
    assert take() is False, "one ask pins one request"
    taken = strategy.decision_state().records.ask
    assert taken is not None
    assert taken.taken, "the composition sees what the middleware took"
    run(strategy, messages)
    again = strategy.decision_state().records.ask
    assert again is not None
    assert again.taken, "a pass keeps the taken ask"


# ----------------------------------------------------------------------------- the record half


def test_the_record_half_covers_the_groups_a_record_quotes_and_leaves_user_turns() -> None:
    strategy = build(100_000)
    messages = conversation(6, covers=(0, 1, 2))
    assert run(strategy, messages)
    # 0..2 leave; 3..5 are not quoted and stay.
    assert excluded_ids(messages) == ["c0", "r0", "c1", "r1", "c2", "r2"]
    assert not any(excluded(m) for m in messages if m.role == "user")
    report = strategy.last_report
    assert report is not None
    assert report.fallback is None
    assert report.shed is None
    assert strategy.tool_results.groups_covered == 3


@pytest.mark.parametrize(("policy", "leaves"), [("shed", True), ("raise", False)])
def test_under_raise_a_group_leaves_only_when_every_value_is_quoted(policy: str, leaves: bool) -> None:
    messages = conversation(3)
    wide = lookup_text(0, lines=50)  # five planted codes
    by_id(messages, "r0").contents[0] = Content.from_function_result(call_id="call_0", result=wide)
    quoted = [line for line in wide.split("\n") if distinctive_values(line)]
    assert len(quoted) == 5
    body = "\n".join([*quoted[:4], quote(1), quote(2)])  # four of lookup 0's five codes: 80%
    messages[-1:-1] = [
        Message(
            "assistant",
            [Content.from_function_call(call_id="recall_1", name=RECALL_TOOL_NAME, arguments={"values": body})],
            message_id="rc1",
        ),
        Message(
            "tool",
            [Content.from_function_result(call_id="recall_1", result=f"{RECORD_PREFIX}\n{body}")],
            message_id="rr1",
        ),
    ]
    run(build(100_000, overflow_policy=policy), messages)
    assert {"c1", "r1", "c2", "r2"} <= set(excluded_ids(messages)), "fully quoted groups leave under both"
    assert "r0" not in excluded_ids(messages)
    # Under "shed" the group is covered at 80%: only its remnant stays, the code the record does not quote.
    left = str(by_id(messages, "r0").contents[0].result)
    assert is_remnant(left) is leaves
    assert quoted[4] in left


# ----------------------------------------------------------------------------- the user half


def test_the_user_half_summarises_user_turns_and_leaves_tool_groups() -> None:
    summarizer = ScriptedSummarizer(extractive)
    # Every lookup before the record is covered; the two after it are not candidates yet (no ask, no wait).
    messages = conversation(4, covers=(0, 1, 2, 3), pad=30)
    messages[-1:-1] = [*lookup_round(4, pad=30), *lookup_round(5, pad=30)]
    _, after_records = measured(messages)
    strategy = build(int(after_records / 0.8), summarizer=summarizer)
    run(strategy, messages)
    assert summarizer.calls == 1
    summaries = [m for m in messages if SUMMARY_KEY in m.additional_properties]
    assert len(summaries) == 1
    assert any(excluded(m) for m in messages if m.role == "user")
    assert not any(excluded(m) for m in messages if m.message_id in {"c4", "r4", "c5", "r5"})
    assert not any(excluded(m) for m in messages if m.role == "assistant" and m.message_id and m.message_id[0] == "n")
    report = strategy.last_report
    assert report is not None
    assert report.users is not None
    assert not report.waited


def test_alone_the_user_half_asks_only_when_the_next_step_would_not_fit() -> None:
    messages = chat(12)
    roomy = ScriptedSummarizer(extractive)
    strategy = build(int(measured(messages)[0] / 0.8), summarizer=roomy)
    run(strategy, [Message.from_dict(m.to_dict()) for m in messages])
    assert roomy.calls == 0, "20% of the budget is free and a turn is about 8%: no break for a summary yet"
    assert strategy.last_report is not None
    assert strategy.last_report.users is not None
    assert strategy.last_report.users.outcome is Outcome.DECLINED
    tight = ScriptedSummarizer(extractive)
    strategy = build(needs_room(messages), summarizer=tight)
    run(strategy, messages)
    assert tight.calls == 1, "5% free: the next turn like the largest would not fit"
    assert any(SUMMARY_KEY in m.additional_properties for m in messages)


def short_rounds(names: Sequence[str]) -> list[Message]:
    """Short user turns (an acknowledgement, a go-ahead), each shorter than a summary of it would be."""
    messages: list[Message] = []
    for name in names:
        messages += [Message("user", [f"Ok, go on ({name})."], message_id=name), Message("assistant", ["Sure."])]
    return messages


def summarised(messages: Sequence[Message]) -> list[str]:
    """What the summaries standing in ``messages`` replaced, in order."""
    return [
        str(m)
        for s in messages
        if SUMMARY_KEY in s.additional_properties and not excluded(s)
        for m in s.additional_properties[SUMMARY_OF_KEY]
    ]


def edged() -> list[Message]:
    """Short turns right after the head, then long ones with short ones among and after them, then the tail."""
    return [
        Message("system", ["You keep requirements."], message_id="sys"),
        Message("user", ["Task: collect the requirements."], message_id="task"),
        *short_rounds(["s0", "s1"]),
        *user_rounds(3),
        *short_rounds(["s2"]),
        *user_rounds(3, start=3),
        *short_rounds(["s3", "s4"]),
        *user_rounds(1, start=6),  # the tail, never summarised
    ]


@pytest.mark.parametrize("mode", ["boundary", "recompact"])
def test_short_turns_that_open_the_band_stay_verbatim_before_the_first_summary(mode: str) -> None:
    """A turn shorter than its summary would be (what it owes the check and a sentence or two of prose) costs
    output to summarise and saves nothing: the short turns right after the head stay verbatim, and the first
    summary stands after them, so the model reads every turn in the order it was said. Every other short turn goes
    with its neighbours; the user-turn strategy on its own summarises them all."""
    messages = edged()
    summarizer = ScriptedSummarizer(extractive)
    strategy = build(needs_room(messages), summarizer=summarizer, summary_mode=mode)
    run(strategy, messages)
    assert summarizer.calls == 1
    assert summarised(messages) == ["q0", "q1", "q2", "s2", "q3", "q4", "q5", "s3", "s4"]
    summary = next(m.message_id for m in messages if SUMMARY_KEY in m.additional_properties)
    assert [m.message_id for m in messages if m.role == "user" and not excluded(m)] == [
        "task",
        "s0",
        "s1",
        summary,
        "q6",
    ]
    alone = edged()
    user_half = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=needs_room(alone),
        tokenizer=TOKENIZER,
        client=ScriptedSummarizer(extractive),
        summary_mode=mode,  # type: ignore[arg-type]
    )
    asyncio.run(user_half(alone))
    assert summarised(alone)[:2] == ["s0", "s1"]


@pytest.mark.parametrize("mode", ["boundary", "recompact"])
def test_short_turns_after_a_summary_go_into_the_next_one(mode: str) -> None:
    """Once a summary stands, no short turn stays behind: the next summary takes the ones that open its band, so
    what stays verbatim never grows past the run before the first summary, and no short turn ever stands between
    two summaries."""
    messages = edged()
    strategy = build(needs_room(messages), summarizer=ScriptedSummarizer(extractive), summary_mode=mode)
    run(strategy, messages)
    first = len(summarised(messages))
    messages += [*short_rounds(["s5", "s6"]), *user_rounds(12, start=7)]
    run(strategy, messages)
    assert len(summarised(messages)) > first, "the grown conversation needed room again"
    standing = [m for m in messages if SUMMARY_KEY in m.additional_properties and not excluded(m)]
    assert len(standing) == (2 if mode == "boundary" else 1)
    assert {"q6", "s5", "s6"} <= set(summarised(messages))
    users = [m for m in messages if m.role == "user" and not excluded(m)]
    assert [m.message_id for m in users[:3]] == ["task", "s0", "s1"]
    assert all(SUMMARY_KEY in m.additional_properties for m in users[3:-1])


def test_a_band_of_short_turns_only_is_summarised_whole() -> None:
    """With no turn worth a summary of its own, the short ones together are what can make room."""
    messages = [
        Message("system", ["You keep requirements."], message_id="sys"),
        Message("user", ["Task: collect the requirements."], message_id="task"),
        *short_rounds([f"s{n}" for n in range(40)]),
    ]
    summarizer = ScriptedSummarizer(extractive)
    strategy = build(int(measured(messages)[0] * 0.95), summarizer=summarizer)  # over the budget: room is due
    run(strategy, messages)
    assert summarizer.calls == 1
    assert summarised(messages) == [f"s{n}" for n in range(39)]


def asks_at(budget: int, messages: Sequence[Message], recall: RecallState) -> bool:
    """Does one pass at ``budget``, from ``recall``, ask for a record of the pending groups?"""
    strategy = build(budget)
    shared = strategy.tool_results.conversation
    shared.value = replace(shared.value, recall=recall)
    run(strategy, [Message.from_dict(m.to_dict()) for m in messages])
    return strategy.decision_state().records.ask is not None


def threshold(messages: Sequence[Message], recall: RecallState) -> int:
    """The smallest budget at which the pass finds room for another step like the largest (and so asks nothing)."""
    low, high = measured(messages)[0], 2 * measured(messages)[0]
    assert asks_at(low, messages, recall)
    assert not asks_at(high, messages, recall)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if asks_at(middle, messages, recall) else (low, middle)
    return high


def test_a_tool_step_leaves_room_for_the_instruction_of_a_record_over_the_cached_prefix() -> None:
    """Found in per-call traces (Anthropic cache rules, fill 3.0): a prompt that fitted beside its largest lookup
    but not with a record's instruction too got the lookup first; the record over the cached prefix could then
    cover only what stood before it, and a second record (a second break) followed. While that route is open, the
    room a tool step needs includes the instruction, so the ask comes one request earlier; a conversation whose
    route is disabled, or whose records are pinned (a pin sends no instruction), keeps the plain rule."""
    messages = conversation(6)
    aligned = threshold(messages, RecallState(route=RecordRoute.CACHED_PREFIX))
    pinned = threshold(messages, RecallState())
    instruction = TOKENIZER.count_tokens(RECORD_INSTRUCTION) + MESSAGE_OVERHEAD_TOKENS
    assert aligned - pinned == instruction
    pins_ignored = RecallState(route=RecordRoute.PINS_IGNORED)
    assert threshold(messages, pins_ignored) == aligned, "pins disabled: records go over the prefix"
    assert threshold(messages, RecallState(route=RecordRoute.NONE)) == pinned


def test_a_summary_rides_on_a_records_break_below_the_user_trigger() -> None:
    def rounds(covers: Sequence[int]) -> list[Message]:
        messages = conversation(4, covers=covers, pad=30)
        messages[-1:-1] = [*lookup_round(4, pad=30), *lookup_round(5, pad=30)]
        return messages

    messages = rounds((0, 1, 2, 3))
    budget = int(measured(messages)[0] / 0.3)  # the prompt is 30% of the budget: below every trigger
    summarizer = ScriptedSummarizer(extractive)
    strategy = build(budget, summarizer=summarizer)
    run(strategy, messages)
    assert summarizer.calls == 1, "the record breaks the prefix after the head: the summary costs no break of its own"
    assert any(SUMMARY_KEY in m.additional_properties for m in messages)
    assert {"c0", "r0"} <= set(excluded_ids(messages))
    # Without a record there is no break to ride on, and nothing else asks at 30% of the budget.
    alone = ScriptedSummarizer(extractive)
    unrecorded = rounds(())
    run(build(budget, summarizer=alone), unrecorded)
    assert alone.calls == 0
    assert not any(excluded(m) for m in unrecorded)


# ----------------------------------------------------------------------------- the wait


def test_the_user_half_waits_for_a_due_record_at_most_two_responses() -> None:
    summarizer = ScriptedSummarizer(extractive)
    messages = chat(12)
    strategy = build(needs_room(messages), summarizer=summarizer)
    pin_next_request(strategy)
    assert strategy.tool_results.record_expected()
    waited: list[bool] = []
    for n in range(3):
        if n:
            respond(messages, n)
        run(strategy, messages)
        assert strategy.last_report is not None
        waited.append(strategy.last_report.waited)
    assert waited == [True, True, False]
    assert strategy.user_passes_waited == 2
    assert summarizer.calls == 1, "the user half runs once the wait is over"


def test_a_summary_made_on_one_list_replays_on_the_other_while_that_one_waits() -> None:
    """The in-call copies carry injected context and are over the budget (no wait); the stored history fits (a wait)."""
    base = chat(14)
    budget = measured(base)[0]  # the stored history fits exactly; the copies are over by the todo list
    assert measured(with_injected_context(base))[0] > budget
    summarizer = ScriptedSummarizer(extractive)
    strategy = build(budget, summarizer=summarizer)
    pin_next_request(strategy)
    copies, stored = with_injected_context(base), deep_copy_messages(base)
    run(strategy, copies)
    assert strategy.last_report is not None
    assert not strategy.last_report.waited
    run(strategy, stored)
    assert strategy.last_report is not None
    assert strategy.last_report.waited, "the stored history fits, so its pass waits for the due record"
    assert shown(copies) == shown(stored), "the wait holds back new requests, not the summary the copies made"
    assert summarizer.calls == 1
    respond(stored, 1)
    run(strategy, with_injected_context(stored))  # the next call's copies, loaded from the stored history
    assert summarizer.calls == 1, "no second request for turns already summarised"


def test_no_new_wait_starts_behind_the_same_record_but_one_does_behind_a_new_record() -> None:
    summarizer = ScriptedSummarizer(extractive)
    messages = conversation(4, covers=(0, 1, 2, 3))
    messages += user_rounds(10, start=10)
    strategy = build(int(measured(messages)[1] / 0.8), summarizer=summarizer)
    pin_next_request(strategy)
    for n in range(3):
        respond(messages, n)
        run(strategy, messages)
    assert strategy.last_report is not None
    assert not strategy.last_report.waited
    for n in range(3, 6):
        respond(messages, n)
        run(strategy, messages)
        assert strategy.last_report is not None
        assert not strategy.last_report.waited, f"waited again at {n}"
    messages += record((0,), number=2)
    respond(messages, 6)
    run(strategy, messages)
    assert strategy.last_report is not None
    assert strategy.last_report.waited, "a new record is a new wait"


def test_a_chain_that_goes_on_after_a_partial_record_waits_two_responses_from_its_new_ask() -> None:
    """A record covers part of an ask's batch and the chain asks again for the rest: the user half waits for that
    record two responses from the new ask (so its summary rides on that record's break), not from the first."""
    from maf_compaction.core.composition import _wait  # pyright: ignore[reportPrivateUsage]
    from maf_compaction.core.state import ChainDecisions

    started = ChainDecisions(wait_since=24)
    assert _wait(started, 26, expected=True, count=3) == (replace(started, wait_since=None, declined_behind=3), False)
    assert _wait(started, 26, expected=True, count=3, asked_at=26) == (started, True)
    assert _wait(started, 27, expected=True, count=3, asked_at=26) == (started, True)
    declined = _wait(started, 28, expected=True, count=3, asked_at=26)
    assert declined == (replace(started, wait_since=None, declined_behind=3), False)
    # An ask from the future of this clock (a restored, older history) does not extend the wait.
    assert _wait(started, 26, expected=True, count=3, asked_at=30)[1] is False


def test_a_wait_is_dropped_when_the_clock_goes_back_after_a_restore() -> None:
    long = chat(12)
    for n in range(6):
        respond(long, n)
    strategy = build(int(measured(long)[0] / 0.8))
    pin_next_request(strategy)
    run(strategy, long)
    saved = strategy.decision_state()
    assert saved.chain.wait_since is not None
    # The same conversation restored at an earlier point: its clock is six responses behind the wait.
    summarizer = ScriptedSummarizer(extractive)
    short = chat(12)
    restored = build(needs_room(short), summarizer=summarizer)
    restored.restore_state(saved)
    waited: list[bool] = []
    for n in range(3):
        if n:
            respond(short, n)
        run(restored, short)
        assert restored.last_report is not None
        waited.append(restored.last_report.waited)
    assert waited == [True, True, False], "a stale wait must not hold the user half past two responses"
    assert summarizer.calls == 1


# ----------------------------------------------------------------------------- the fallback with holds


def test_the_fallback_with_holds_distills_held_results_before_it_sheds_narration() -> None:
    """Over the budget, the held band results are cut to their value lines first (the safety net); when that
    is not enough, narration goes, and never a held group."""
    messages = conversation(8, covers=(0, 1, 2), narration=12)
    _, after_records = measured(messages)
    strategy = build(after_records - 200, overflow_policy="raise")
    run(strategy, messages)
    assert [m.message_id for m in messages if excluded(m)] == ["c0", "r0", "c1", "r1", "c2", "r2"]
    distilled = [m.message_id for m in messages if is_distilled(str(m.contents[0].result or ""))]
    assert distilled == ["r3", "r4", "r5", "r6"]  # the band's held results; r7 is in the tail
    for n in range(3, 8):
        kept = str(by_id(messages, f"r{n}").contents[0].result)
        assert all(v in kept for v in distinctive_values(lookup_text(n)))


@pytest.mark.parametrize("routes_left", [True, False], ids=["a-route-left", "no-route-left"])
def test_with_no_route_to_a_record_the_safety_net_cuts_every_band_group_past_the_trigger_at_once(
    routes_left: bool,
) -> None:
    """Under the budget but past the record trigger, no record yet. While a record can still be asked for, the
    results wait for it, whole. Once neither route is left (pins and the cached prefix disabled), the safety net
    takes the record's place: in one pass every result after the head and before the conversation's newest group is
    cut to its value lines (one break: what one record would have covered), the user half's summary rides on that
    break as on a record's (the summarizer client, the cached prefix being disabled too), and every value stays."""
    messages = conversation(8)
    size, _ = measured(messages)
    summarizer = ScriptedSummarizer(extractive)
    strategy = build(int(size / 0.7), summarizer=summarizer)  # the trigger is 0.6 of it
    if not routes_left:
        shared = strategy.tool_results.conversation
        shared.value = replace(shared.value, recall=RecallState(route=RecordRoute.NONE))
    run(strategy, messages)
    distilled = [m.message_id for m in messages if is_distilled(str(m.contents[0].result or ""))]
    if routes_left:
        assert distilled == []
        return
    assert distilled == [f"r{n}" for n in range(8)]  # the newest group is the user's last message
    assert summarizer.calls == 1
    (summary,) = [m for m in messages if SUMMARY_KEY in m.additional_properties]
    assert set(excluded_ids(messages)) == set(summary.additional_properties[SUMMARY_OF_KEY])
    assert all(i.startswith("q") for i in excluded_ids(messages)), "only user turns leave, for the summary"
    for n in range(8):
        kept = str(by_id(messages, f"r{n}").contents[0].result)
        assert all(v in kept for v in distinctive_values(lookup_text(n)))
    # The next pass replays the same bytes, and so does a fresh stack restored from the state (the snapshot's
    # positions past the configured tail are this state's own).
    before = [m.to_dict() for m in messages]
    run(strategy, messages)
    assert [m.to_dict() for m in messages] == before
    restored = build(int(size / 0.7), summarizer=ScriptedSummarizer(extractive))
    restored.restore_decisions(strategy.decision_state().to_dict())
    loaded = [Message.from_dict(m) for m in before]
    run(restored, loaded)
    assert [m.to_dict() for m in loaded] == before


def without_a_route(messages: Sequence[Message]) -> tuple[Composition, int]:
    """A composition whose record trigger (0.6 of the budget) ``messages`` pass, with no route to a record left."""
    budget = int(measured(messages)[0] / 0.7)
    strategy = build(budget, summarizer=ScriptedSummarizer(extractive))
    shared = strategy.tool_results.conversation
    shared.value = replace(shared.value, recall=RecallState(route=RecordRoute.NONE))
    return strategy, budget


def test_a_summary_riding_on_the_safety_nets_break_does_not_call_the_break_off() -> None:
    """Long user turns, no route left: past the trigger the net will cut the lookups, and the user half's summary
    rides on that break. The summary alone brings the prompt under the trigger, yet the net cuts on the same pass:
    the break it was judged on stands (otherwise the summary breaks now and the net a second time on a later pass)."""
    messages = conversation(8, pad=40)
    strategy, budget = without_a_route(messages)
    run(strategy, messages)
    summaries = [m for m in messages if SUMMARY_KEY in m.additional_properties]
    assert summaries, "the summary rode on the net's break"
    whole = [Message.from_dict(m.to_dict()) for m in messages if not excluded(m)]
    for message in whole:
        if message.role == "tool":
            message.contents[0].result = lookup_text(int(str(message.message_id)[1:]))
    assert measured(whole)[0] < 0.6 * budget, "with the summary and every lookup whole, the prompt is under the trigger"
    distilled = [m.message_id for m in messages if is_distilled(str(m.contents[0].result or ""))]
    assert distilled == [f"r{n}" for n in range(8)]


def test_the_nets_kept_pace_cuts_ask_for_no_summary_far_under_the_trigger() -> None:
    """Review finding: after the net's first cut every later lookup is cut as it stops being the newest, and each
    such cut asked the user half for a summary of the newest turns, however small the prompt. A kept-pace cut is
    ridden only once a step like the largest would take the prompt past the record trigger."""
    messages = conversation(8, pad=40)
    strategy, budget = without_a_route(messages)
    summarizer = strategy.user_turns.client
    assert isinstance(summarizer, ScriptedSummarizer)
    run(strategy, messages)
    assert summarizer.calls == 1, "the first cut carries the summary"
    for n in range(8, 14):
        messages[-1:-1] = lookup_round(n)  # a new lookup round, then the user's last message again
        run(strategy, messages)
        assert 2 * measured(messages)[0] < 0.6 * budget, "far under the trigger, even with a second prompt's worth"
    assert all(is_distilled(str(by_id(messages, f"r{n}").contents[0].result or "")) for n in range(8, 14))
    assert summarizer.calls == 1, "a kept-pace cut far under the trigger asked for a summary"


def test_once_the_safety_net_has_cut_it_keeps_pace_below_the_trigger() -> None:
    """With no route left and the net fired once, the conversation is known to run long: each later lookup is cut
    as soon as it stops being the newest group, while the prompt is still under the record trigger (the break then
    re-reads one turn, not every turn that piles up behind the lookup until the trigger is passed again)."""
    messages = conversation(8)
    strategy, budget = without_a_route(messages)
    run(strategy, messages)
    assert strategy.decision_state().fallback.distilled
    messages[-1:-1] = lookup_round(8)  # a new lookup, then the user's last message again
    assert measured(messages)[0] < 0.6 * budget, "the prompt is under the trigger"
    run(strategy, messages)
    assert is_distilled(str(by_id(messages, "r8").contents[0].result or ""))
    assert all(v in str(by_id(messages, "r8").contents[0].result) for v in distinctive_values(lookup_text(8)))
    # A conversation with a route left keeps it whole: the record it waits for covers it.
    fresh = conversation(9)
    waiting = build(budget, summarizer=ScriptedSummarizer(extractive))
    run(waiting, fresh)
    assert not is_distilled(str(by_id(fresh, "r8").contents[0].result or ""))


@pytest.mark.parametrize("policy", ["shed", "raise"])
def test_a_thinly_quoted_lookup_is_cut_to_its_value_lines_except_under_raise(policy: str) -> None:
    """A record quotes lookup 0 whole and one of lookup 1's values. Under "shed" lookup 1 is cut on that pass to
    its value lines (every value kept); under "raise", which cuts nothing it need not, it stays whole, is held and
    asked for once more."""
    messages = conversation(4)
    one = distinctive_values(lookup_text(1))[0]
    body = f"{quote(0)}\nlookup 1 gave {one}"
    messages[-1:-1] = [
        Message(
            "assistant",
            [Content.from_function_call(call_id="recall_1", name=RECALL_TOOL_NAME, arguments={"values": body})],
        ),
        Message("tool", [Content.from_function_result(call_id="recall_1", result=f"{RECORD_PREFIX}\n{body}")]),
    ]
    strategy = build(10**6, overflow_policy=policy)
    run(strategy, messages)
    text = str(by_id(messages, "r1").contents[0].result)
    report = strategy.last_report
    assert report is not None
    assert all(v in text for v in distinctive_values(lookup_text(1)))
    if policy == "shed":
        assert is_distilled(text)
        assert report.records.thin == (1,)
    else:
        assert text == lookup_text(1)
        assert report.records.thin == ()
        assert 1 in report.records.uncovered
        assert 1 in report.records.asked


def test_the_fallback_with_holds_sheds_only_narration() -> None:
    messages = conversation(8, covers=(0, 1, 2), narration=12)
    _, after_records = measured(messages)
    strategy = build(after_records - 1_600, overflow_policy="raise")
    run(strategy, messages)
    report = strategy.last_report
    assert report is not None
    assert report.fallback is not None
    assert report.fallback.changed
    assert report.shed is None
    lost = [m for m in messages if excluded(m) and m.message_id not in {"c0", "r0", "c1", "r1", "c2", "r2"}]
    assert lost, "the fallback shed nothing"
    assert all(m.role == "assistant" and not any(c.type == "function_call" for c in m.contents) for m in lost), [
        m.message_id for m in lost
    ]
    for n in range(3, 8):
        assert not excluded(by_id(messages, f"r{n}"))
        assert not excluded(by_id(messages, f"c{n}"))


def test_an_explicit_fallback_without_narration_shedding_makes_the_fallback_step_shed_none() -> None:
    """The fallback's own parameters run in the fallback step: ``collapse_assistant_text=False`` sheds no narration."""
    messages = conversation(8, covers=(0, 1, 2), narration=12, dense=True)
    _, after_records = measured(messages)
    fallback = AnchoredCompactionStrategy(
        max_input_tokens=after_records - 600, tokenizer=TOKENIZER, collapse_assistant_text=False
    )
    strategy = build(after_records - 600, overflow_policy="shed", records={"fallback": fallback})
    copy = deep_copy_messages(messages)
    run(strategy, copy)
    report = strategy.last_report
    assert report is not None
    assert report.fallback is not None
    assert report.fallback.shed == (), "the fallback shed narration although its parameters forbid it"
    narration = [m.message_id for m in copy if excluded(m) and (m.message_id or "").startswith("n")]
    assert narration == []
    # The default fallback sheds narration on the same conversation (the parameter made the difference).
    default = build(after_records - 600, overflow_policy="shed")
    run(default, messages)
    assert default.last_report is not None
    assert default.last_report.fallback is not None
    assert default.last_report.fallback.shed


def test_an_explicit_fallbacks_tail_is_the_shed_steps_tail() -> None:
    """The shed step keeps the fallback's ``keep_tail_groups``: a tail over every unrecorded lookup sheds none."""
    budget, messages = _over_by_groups(1)

    def composed(tail: int) -> Composition:
        fallback = AnchoredCompactionStrategy(max_input_tokens=budget, tokenizer=TOKENIZER, keep_tail_groups=tail)
        return build(budget, records={"fallback": fallback}, users={"keep_tail_user_turns": 1_000})

    short = deep_copy_messages(messages)
    run(composed(4), short)
    assert [i for i in excluded_ids(short) if i not in {"c0", "r0", "c1", "r1", "c2", "r2"}][:2] == ["c3", "r3"]
    # Groups from the end: last, n5, r5, q5, n4, r4, q4, n3, r3, q3: a tail of 10 holds every unrecorded lookup.
    with pytest.raises(CompactionBudgetExceeded):
        run(composed(10), deep_copy_messages(messages))


# ----------------------------------------------------------------------------- the overflow policy


def _over_by_groups(groups: int) -> tuple[int, list[Message]]:
    """A budget that the record half and the fallback leave ``groups`` uncovered lookups over.

    Every result line carries a code, so the safety net cannot make a result smaller: only
    the overflow policy can make room (tests/test_safety_net.py covers the net).
    """
    messages = conversation(6, covers=(0, 1, 2), dense=True)
    _, after_records = measured(messages)
    uncovered = TOKENIZER.count_tokens(lookup_text(3, dense=True))
    return after_records - uncovered * groups + uncovered // 2, messages


def build_without_user_band(budget: int, **kwargs: Any) -> Composition:
    """Every user turn in the user half's tail: only the record half and the chain can make room.

    Over the budget the user half runs even while a record is due, so without this it
    would summarise the requirements and the overflow policy would not be reached.
    """
    return build(budget, users={"keep_tail_user_turns": 1_000}, **kwargs)


def test_shed_removes_whole_unrecorded_groups_oldest_first_named_in_a_warning_with_a_note(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget, messages = _over_by_groups(1)
    strategy = build_without_user_band(budget)
    with caplog.at_level(logging.WARNING, logger="maf_compaction"):
        run(strategy, messages)
    shed = [i for i in excluded_ids(messages) if i not in {"c0", "r0", "c1", "r1", "c2", "r2"}]
    assert shed[:2] == ["c3", "r3"], f"the oldest unrecorded group goes first, shed {shed}"
    assert not excluded(by_id(messages, "c5"))
    assert not excluded(by_id(messages, "r5"))
    assert strategy.shed_events == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for message_id in shed:
        assert any(message_id in w and "shed" in w for w in warnings), f"{message_id} shed without a WARNING naming it"
    tool_notes = [m for m in notes(messages) if m.text.startswith(TOOL_NOTE_PREFIX)]
    assert tool_notes, "no removal note the model sees"
    assert messages.index(tool_notes[0]) < messages.index(by_id(messages, "q4"))
    assert size(messages) <= budget


def test_shed_never_removes_a_record_or_a_user_turn() -> None:
    budget, messages = _over_by_groups(2)
    strategy = build_without_user_band(budget)
    run(strategy, messages)
    report = strategy.last_report
    assert report is not None
    assert report.shed is not None
    assert report.shed.shed
    assert not excluded(by_id(messages, "rc1"))
    assert not excluded(by_id(messages, "rr1"))
    assert not [m.message_id for m in messages if m.role == "user" and excluded(m)]


def test_a_shed_replays_on_the_other_list_and_after_a_restore() -> None:
    budget, messages = _over_by_groups(1)
    strategy = build_without_user_band(budget)
    run(strategy, messages)
    other = conversation(6, covers=(0, 1, 2), dense=True)
    run(strategy, other)
    assert dump(other) == dump(messages)
    restored = build_without_user_band(budget)
    restored.restore_state(strategy.decision_state())
    third = conversation(6, covers=(0, 1, 2), dense=True)
    run(restored, third)
    assert dump(third) == dump(messages)


def _no_record_pays(budget: int, **kwargs: Any) -> Composition:
    """A composition whose record half asks only for records that pay (none does on value-dense lookups)."""
    return build(budget, records={"record_payoff_share": 0.2}, **kwargs)


def test_room_no_record_will_make_is_shed_before_the_budget_with_the_summary_on_the_same_break(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A step like the largest no longer fits and no record would pay: the shed the next lookup would force a pass
    later is made now, judged on the prompt before the summary, which rides on it (one break, not two)."""
    messages = conversation(6, dense=True, pad=6)
    budget = needs_room(messages)
    before = measured(messages)[0]
    strategy = _no_record_pays(budget)
    with caplog.at_level(logging.WARNING, logger="maf_compaction"):
        run(strategy, messages)
    report = strategy.last_report
    assert report is not None
    assert report.tokens_before <= budget, "the prompt fits: an over-budget shed would prove nothing"
    assert strategy.tool_results.decision_state().records.ask is None, "no record was asked for the room"
    assert report.users is not None
    assert report.users.outcome is Outcome.SUMMARIZED, "the summary rides on the shed's break"
    assert strategy.shed_events == 1
    shed = [i for i in excluded_ids(messages) if not i.startswith("q")]
    assert shed[:2] == ["c0", "r0"], f"oldest first, shed {shed}"
    assert not excluded(by_id(messages, "c5"))
    assert not excluded(by_id(messages, "r5")), "the newest lookup stays: the conversation works with it"
    # Judged before the summary: the shed frees what takes the prompt to the room low water, and the summary more.
    low = int(budget * ROOM_LOW_WATER_FRACTION)
    freed_by_shed = sum(TOKENIZER.count_tokens(lookup_text(int(i[1:]), dense=True)) for i in shed if i[0] == "r")
    assert freed_by_shed >= before - low
    assert report.tokens_after < low
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert all(any(i in w for w in warnings) for i in shed), "a shed message no WARNING names"
    # The other list and a restored copy replay it.
    other = conversation(6, dense=True, pad=6)
    run(strategy, other)
    assert dump(other) == dump(messages)
    restored = _no_record_pays(budget)
    restored.restore_state(strategy.decision_state())
    third = conversation(6, dense=True, pad=6)
    run(restored, third)
    assert dump(third) == dump(messages)


def test_room_is_not_shed_before_the_budget_under_raise_or_from_the_newest_lookup() -> None:
    messages = conversation(6, dense=True, pad=6)
    strategy = _no_record_pays(needs_room(messages), overflow_policy="raise")
    run(strategy, messages)
    assert [i for i in excluded_ids(messages) if not i.startswith("q")] == []
    # The only unrecorded lookup in the band is the conversation's newest: the shed waits for the budget.
    messages = conversation(1, dense=True, pad=6)[:-1] + user_rounds(8, start=1) + [Message("user", ["Report."])]
    strategy = _no_record_pays(needs_room(messages))
    run(strategy, messages)
    assert strategy.shed_events == 0
    assert not excluded(by_id(messages, "c0"))
    assert not excluded(by_id(messages, "r0"))


def test_a_summary_alone_waits_for_the_shed_the_next_step_makes() -> None:
    """Only the newest lookup could make the room a step like it needs: the user half's summary does not break the
    prefix alone for that room now (a summary, then the shed the next step forces: two breaks for one step); on
    the pass the next lookup arrives, which breaks the prefix for that room anyway, it is asked."""
    opening = conversation(1, dense=True, pad=6)[:-1] + user_rounds(8, start=1)
    messages = [*opening, Message("user", ["Report."], message_id="last")]
    budget = needs_room(messages)
    strategy = _no_record_pays(budget)
    assert not run(strategy, messages)
    report = strategy.last_report
    assert report is not None
    assert report.users is not None
    assert report.users.outcome is not Outcome.SUMMARIZED, "a summary alone for room the shed makes next step"
    assert strategy.user_turns.summarizer_calls == 0
    assert strategy.shed_events == 0
    # The next lookup arrives (lookup 0 is no longer the newest): the pass makes the room, the summary on its break.
    later = [*opening, *lookup_round(9, pad=6, dense=True), Message("user", ["Report."], message_id="last")]
    run(strategy, later)
    assert _summarized_over(strategy, budget).tokens_after <= budget
    assert strategy.user_turns.summarizer_calls == 1
    assert not excluded(by_id(later, "r9"))


def test_a_pass_that_began_over_the_budget_makes_room_for_the_next_step_on_its_own_break() -> None:
    """Over the budget, a record is asked for (it comes with the next request, on a break of its own) and the summary
    brings the prompt under the budget, but not beside a step like the largest: the room that step needs is shed on
    this pass's break (groups no record would pay for, oldest first), not left to the next pass, which would break
    the prefix again for it (an emergency fold or a shed besides the record's break). The other list replays it."""

    def lookups() -> list[Message]:
        return [*conversation(6, dense=True, pad=2)[:-1], *lookup_round(6, pad=2), Message("user", ["Now report."])]

    messages = lookups()
    budget = int(measured(messages)[0] * 0.96)
    strategy = _no_record_pays(budget)
    run(strategy, messages)
    report = _summarized_over(strategy, budget)
    ask = strategy.tool_results.decision_state().records.ask
    assert ask is not None, "no record is asked for: the case the room was left to it"
    assert ask.targets == (6,)
    assert strategy.shed_events == 1
    assert report.tokens_after <= int(budget * ROOM_LOW_WATER_FRACTION)
    assert not excluded(by_id(messages, "r6")), "the lookup a record is asked for stays"
    shed = [i for i in excluded_ids(messages) if i.startswith("r")]
    assert shed == [f"r{n}" for n in range(len(shed))], f"oldest first, shed {shed}"
    other = lookups()
    run(strategy, other)
    assert dump(other) == dump(messages)


def _summarized_over(strategy: Composition, budget: int) -> CompositionReport:
    """The last pass's report, asserting that it began over ``budget`` and the user half summarised on it."""
    report = strategy.last_report
    assert report is not None
    assert report.tokens_before > budget
    assert report.users is not None
    assert report.users.outcome is Outcome.SUMMARIZED
    return report


def test_a_summary_waits_only_while_the_prompt_fits_with_its_injected_context() -> None:
    """Found by review: the wait is judged on the conversation's own tokens, but the in-call copies carry the
    harness's todo list too; where that alone puts them over the budget, the user half asks as it would alone (it
    once declined, and the over-budget shed took the newest lookup, or the pass raised)."""
    base = [*conversation(1, dense=True, pad=6)[:-1], *user_rounds(8, start=1), Message("user", ["Report."])]
    own, sent = measured(base)[0], measured(with_injected_context(base))[0]
    budget = own + (sent - own) // 2
    strategy = _no_record_pays(budget)
    copies = with_injected_context(base)
    run(strategy, copies)
    _summarized_over(strategy, budget)
    assert not excluded(by_id(copies, "r0")), "the newest lookup shed in the summary's place"
    # Under the low water, with a long user brief as the largest step and a long todo list injected: no raise.
    lookup = conversation(1, dense=True, pad=0)[3:5]
    brief = [Message("user", ["Long brief:\n" + "\n".join([PAD] * 80)]), Message("assistant", ["Noted."])]
    chat_base = [*chat(3), *brief, *user_rounds(1, start=3), *lookup, *user_rounds(6, start=4)]
    todo = Message(
        "user",
        ["## Todo list\n" + "\n".join(f"- [ ] item {i}: {PAD}" for i in range(100))],
        additional_properties={"_attribution": dict(TODO_ATTRIBUTION)},
    )
    strategy = _no_record_pays(5500)
    messages = [todo, *deep_copy_messages([*chat_base, Message("user", ["Report."])])]
    run(strategy, messages)
    report = strategy.last_report
    assert report is not None
    assert report.tokens_after <= 5500


def test_room_is_judged_alike_on_the_in_call_copies_and_the_stored_history() -> None:
    """Context injected into the in-call copies (the harness's todo list) must not tip the decision: both lists
    shed the same groups, whichever runs first, at budgets around the one where the copies alone pass it."""
    base = conversation(6, dense=True, pad=6)
    for budget in range(measured(base)[0] - 40, needs_room(base) + 41, 8):
        for copies_first in (True, False):
            strategy = _no_record_pays(budget)
            copies = with_injected_context(base)
            stored = deep_copy_messages(base)
            for messages in (copies, stored) if copies_first else (stored, copies):
                run(strategy, messages)
            sent = [m for m in shown(copies) if "Todo list" not in m]
            assert sent == shown(stored), f"budget {budget}, copies first: {copies_first}"


def test_room_spares_the_newest_lookup_not_a_record_call_after_it() -> None:
    """The newest tool group the conversation works with is its newest lookup, even when a record the model wrote
    through the recall tool came after it."""
    messages = conversation(6, covers=(0,), dense=True, pad=6)[:-1] + user_rounds(3, start=6)
    strategy = _no_record_pays(needs_room(messages))
    run(strategy, messages)
    assert not excluded(by_id(messages, "c5"))
    assert not excluded(by_id(messages, "r5"))


def test_room_is_left_to_the_safety_net_when_no_route_to_a_record_is_left() -> None:
    """With no route left, the net cuts the groups in the record's place and keeps pace: no shed before the
    budget (it once shed every cut lookup, the newest too, by the room judged before the net's cut)."""
    messages = conversation(8, pad=2)
    strategy = _no_record_pays(needs_room(messages))
    shared = strategy.tool_results.conversation
    shared.value = replace(shared.value, recall=RecallState(route=RecordRoute.NONE))
    run(strategy, messages)
    assert strategy.shed_events == 0
    assert not excluded(by_id(messages, "r7"))


def test_raise_keeps_uncovered_results_and_leaves_the_list_untouched() -> None:
    budget, messages = _over_by_groups(1)
    strategy = build_without_user_band(budget, overflow_policy="raise")
    before = dump(messages)
    with pytest.raises(CompactionBudgetExceeded) as raised:
        run(strategy, messages)
    assert dump(messages) == before
    assert raised.value.budget == budget
    assert raised.value.needed > budget
    assert strategy.budget_failures == 1


@pytest.mark.parametrize("policy", ["shed", "raise"])
def test_both_policies_raise_when_protected_messages_alone_cannot_fit(policy: str) -> None:
    messages = conversation(6, covers=(0, 1, 2))
    for message in messages[:6]:
        message.additional_properties[PRESERVED_KEY] = True
    protected = size(messages[:6])
    strategy = build(protected - 10, overflow_policy=policy)
    before = dump(messages)
    with pytest.raises(CompactionBudgetExceeded) as raised:
        run(strategy, messages)
    assert dump(messages) == before
    assert raised.value.needed > raised.value.budget == protected - 10


@pytest.mark.parametrize("policy", ["shed", "raise"])
def test_both_policies_raise_when_the_records_alone_cannot_fit(policy: str) -> None:
    messages = conversation(6, covers=(0, 1, 2, 3, 4, 5))
    recorded = TOKENIZER.count_tokens("\n".join(quote(n) for n in range(6)))
    strategy = build(recorded // 2, overflow_policy=policy)
    with pytest.raises(CompactionBudgetExceeded):
        run(strategy, messages)
    assert not any(excluded(m) for m in messages)


# ----------------------------------------------------------------------------- defects found


def test_a_due_record_never_makes_a_pass_fail_that_the_user_half_fits() -> None:
    """Waiting is only for passes that fit: over the budget the user half runs though a record is due."""
    messages = chat(12)
    budget = measured(messages)[0] // 2
    free = build(budget)
    run(free, [Message.from_dict(m.to_dict()) for m in messages])
    assert free.last_report is not None
    assert free.last_report.tokens_after <= budget, "without a pending pin the user half fits the budget"
    strategy = build(budget)
    pin_next_request(strategy)
    assert strategy.tool_results.record_expected()
    run(strategy, messages)  # raised CompactionBudgetExceeded while the wait gated the user half
    report = strategy.last_report
    assert report is not None
    assert not report.waited
    assert report.users is not None
    assert report.users.replaced
    assert report.tokens_after <= budget
    assert report.shed is None or not report.shed.shed, "the wait made the pass shed instead"


def _restored_with_summary_id(summary_id: str) -> dict[str, Any]:
    """A composition state whose user half remembers one accepted summary under ``summary_id``."""
    answer = Answer(
        identity="a" * 32,
        kind=RequestKind.SUMMARY,
        text="The user asked for RQ-000001.",
        message_id=summary_id,
        sources=2,
    )
    return State(answers=(answer,), compactions=1).to_dict()


@pytest.mark.parametrize("bad", ["q3", "user_summary_", "user_summary_07", "record_replacement_0", "user_summary_1x"])
def test_a_restored_malformed_summary_id_is_refused_naming_the_field(bad: str) -> None:
    form = "'answers[0].message_id': must be an id of the form user_summary_(0|[1-9][0-9]*) for a summary answer"
    with pytest.raises(SnapshotError, match=re.escape(form)):
        build(1_000).restore_decisions(_restored_with_summary_id(bad))


def test_a_restored_summary_id_of_another_message_in_history_is_refused_naming_the_field() -> None:
    messages = chat(4)
    messages[3].message_id = "user_summary_0"  # a host message that happens to carry the id
    strategy = build(100_000)
    strategy.restore_decisions(_restored_with_summary_id("user_summary_0"))
    before = dump(messages)
    with pytest.raises(SnapshotError, match=r"'answers\[0\]\.message_id' is 'user_summary_0', the id of"):
        run(strategy, messages)
    assert dump(messages) == before
    # The same state over a history without that id is this conversation's; so is the user half's own.
    fine = build(100_000)
    fine.restore_decisions(_restored_with_summary_id("user_summary_0"))
    run(fine, chat(4))
    alone = build(100_000).user_turns
    alone.restore_decisions(_restored_with_summary_id("user_summary_0"))
    with pytest.raises(SnapshotError, match=r"'answers\[0\]\.message_id' is 'user_summary_0'"):
        asyncio.run(alone(messages))


def test_a_pass_that_raises_never_repeats_its_summarizer_request() -> None:
    summarizer = ScriptedSummarizer(extractive)
    messages = chat(12)
    messages[-1].contents[0].text = "Noted, and here is a long protected reply. " * 60
    messages[-1].additional_properties[PRESERVED_KEY] = True
    budget = measured(messages)[0] // 3
    strategy = build(budget, summarizer=summarizer, overflow_policy="raise")
    raised = 0
    for _ in range(6):  # a pass that summarised ends over the budget (the next continues); then it raises
        try:
            run(strategy, messages)
        except CompactionBudgetExceeded:
            raised += 1
    assert raised >= 1
    assert summarizer.calls >= 1
    transcripts = [summarizer.transcript(i) for i in range(summarizer.calls)]
    assert len(set(transcripts)) == len(transcripts), f"{summarizer.calls} calls for {len(set(transcripts))} request(s)"


@pytest.mark.parametrize(
    ("recall_state", "waits"),
    [
        (RecallState(route=RecordRoute.PINS_IGNORED), True),  # the record comes over the cached prefix instead
        (RecallState(route=RecordRoute.NONE), False),  # no route is left: nothing to wait for
    ],
    ids=["pins-disabled", "both-routes-disabled"],
)
def test_the_user_half_waits_only_while_a_record_can_still_come(recall_state: RecallState, waits: bool) -> None:
    summarizer = ScriptedSummarizer(extractive)
    messages = conversation(6, covers=(0, 1, 2))
    messages += user_rounds(10, start=10, pad=8)
    strategy = build(int(measured(messages)[1] / 0.8), summarizer=summarizer)
    shared = strategy.tool_results.conversation
    shared.value = replace(shared.value, recall=recall_state)
    run(strategy, messages)
    assert strategy.last_report is not None
    assert strategy.last_report.records.asked == (3, 4, 5), "the record half asks for the uncovered lookups"
    assert strategy.last_report.waited is waits
    assert summarizer.calls == (0 if waits else 1)


def test_two_tiktoken_tokenizers_of_one_encoding_are_the_same_tokenizer() -> None:
    """The finding: two equal ``TiktokenTokenizer()`` instances were refused as "not the same tokenizer", with two
    identical reprs. They count alike (every vocabulary source is checked against the official file); another
    encoding is still refused."""
    first, second = TiktokenTokenizer(), TiktokenTokenizer()
    assert first == second
    assert hash(first) == hash(second)
    record_half = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=1_000, tokenizer=first)
    user_half = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=1_000, tokenizer=second, client=ScriptedSummarizer(), remembered_requests=2
    )
    composed = Composition(tokenizer=TiktokenTokenizer(), tool_results=record_half, user_turns=user_half)
    assert composed.tokenizer == first
    other = TiktokenTokenizer("cl100k_base")
    assert other != first
    with pytest.raises(ValueError, match=r"^tokenizer must be the same tokenizer as tool_results'"):
        Composition(tokenizer=other, tool_results=record_half, user_turns=user_half)
