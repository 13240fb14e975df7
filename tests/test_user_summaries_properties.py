"""Property-based tests of the user-turn strategy over generated histories.

Each history comes from ``histories.py`` (tool rounds, reasoning, parallel calls, late
results, media) and grows append-only, chunk by chunk, the way stored history grows.
Its user turns are rewritten to carry requirement codes (``RQ-00002A``), one per line,
with padding lines around them; some turns carry an image or a document. The
summarizer is a real framework chat client whose model is extractive: it keeps every
line with a code, so a dropped requirement shows. After every chunk the strategy runs
on the in-call copies (a todo list injected, history attributed) and then on the stored
history, as the harness does. Properties, one sentence each:

- no user requirement is silently dropped: every user turn is included, or excluded
  and linked (through any chain of replaced summaries) to an included summary that
  carries each of its codes;
- the same conversation state never triggers a second summarizer call, nor a second
  ``describe_media`` call for the same media, on either list, on a repeat or on a
  restored replica;
- both lists, and a fresh instance restored from the snapshot's JSON, show the same
  bytes;
- every request the summarizer receives fits ``max_summary_input_tokens``;
- the core is pure: ``step`` and ``absorb`` never change their inputs and give the same
  answer twice.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_framework import Content, Message
from agent_framework._compaction import EXCLUDED_KEY
from hypothesis import event, given, note
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn

from histories import Chunks, conversation_chunks, deep_copy_messages, describe, is_injected_todo, with_injected_context
from maf_compaction import State, UserTurnAnchoredSummarizationCompactionStrategy
from maf_compaction.adapters.convert import SUMMARIZED_BY_KEY, SUMMARY_OF_KEY, is_summary, to_history
from maf_compaction.core.answers import absorb
from maf_compaction.core.effects import Request, Route
from maf_compaction.core.protocol import Done, Needs
from maf_compaction.core.state import RequestKind
from maf_compaction.core.user_summaries import (
    DEFAULT_PROMPT,
    SUMMARY_MODES,
    UserSummaryConfig,
    step,
)
from test_user_summaries import CODE, ESTIMATOR, SHORT_PROMPT, TOKENIZER, ScriptedSummarizer, extractive, shown

Strategy = UserTurnAnchoredSummarizationCompactionStrategy
Hook = Callable[[Content, Message], Awaitable[str | None]]

_PADDING = (
    "keep the weekly report in the same format as before and send it to the usual list",
    "the numbers for the northern region are still preliminary so mark them as such",
    "no need to recheck the invoices that were already reconciled last month",
    "use the shared drive folder for every export and keep the file names stable",
)


# ----------------------------------------------------------------------------- generators


@st.composite
def requirement_chunks(draw: DrawFn) -> Chunks:
    """Append-only chunks of a tool-using history whose user turns state requirement codes."""
    chunks: Chunks = draw(conversation_chunks(min_chunks=3, max_chunks=6, min_turns=3, max_turns=10))
    number = 0
    for message in (m for chunk in chunks for m in chunk):
        if message.role != "user":
            continue
        lines = [message.text] if message.text else []
        for _ in range(draw(st.integers(0, 3))):
            number += 1
            lines.append(f"Requirement RQ-{number:06X}: {random.Random(number).choice(_PADDING)[:40]}.")
        lines += [_PADDING[i % len(_PADDING)] for i in range(draw(st.integers(0, 4)))]
        media = [c for c in message.contents if c.type != "text"]
        if not media and draw(st.integers(0, 7)) == 0:
            media = [Content.from_data(b"\x89PNG\r\n\x1a\n" + number.to_bytes(4, "big") * 8, "image/png")]
        random.Random(number).shuffle(lines)
        message.contents = [Content.from_text("\n".join(lines) or "Go on."), *media]
    return chunks


@dataclass
class Params:
    """One drawn configuration: strategy parameters and the media hook's behaviour."""

    load: float
    kwargs: dict[str, Any]
    hook: str  # "none", "describe" or "fail"
    hook_keys: list[str] = field(default_factory=list[str])

    def budget(self, chunks: Chunks) -> int:
        return max(1, int(_tokens([m for chunk in chunks for m in chunk]) * self.load))

    def make(self, client: ScriptedSummarizer, budget: int) -> Strategy:
        hook = None if self.hook == "none" else self._hook
        return Strategy(max_input_tokens=budget, tokenizer=TOKENIZER, client=client, describe_media=hook, **self.kwargs)

    async def _hook(self, content: Content, message: Message) -> str | None:
        key = json.dumps([message.message_id, message.to_dict().get("contents"), content.to_dict()], default=str)
        self.hook_keys.append(key)
        if self.hook == "fail":
            return None
        return f"a {content.media_type or 'file'} the user attached ({len(self.hook_keys)})"


@st.composite
def params(draw: DrawFn, *, small_bound: bool = False) -> Params:
    mode = draw(st.sampled_from(SUMMARY_MODES))
    kwargs: dict[str, Any] = {
        "summary_mode": mode,
        "keep_head_user_turns": draw(st.integers(0, 2)),
        "keep_tail_user_turns": draw(st.integers(0, 2)),
        "trigger_fraction": draw(st.sampled_from([0.5, 0.8, 1.0])),
        "min_band_share": draw(st.sampled_from([0.0, 0.0, 0.05, 0.1, 0.3])),
        "remembered_requests": draw(st.integers(1, 3)),
        "prompt": draw(st.sampled_from([DEFAULT_PROMPT, SHORT_PROMPT, SHORT_PROMPT])),
    }
    if small_bound:
        kwargs["max_summary_input_tokens"] = draw(st.integers(1, 400))
    else:
        kwargs["max_summary_input_tokens"] = draw(st.none() | st.integers(50, 4_000))
    return Params(
        load=draw(st.sampled_from([0.15, 0.3, 0.5, 0.8, 1.2])),
        kwargs=kwargs,
        hook=draw(st.sampled_from(["none", "describe", "describe", "fail"])),
    )


# ----------------------------------------------------------------------------- helpers


def _tokens(messages: Sequence[Message]) -> int:
    return sum(
        ESTIMATOR.count_message_tokens(m)
        for m in messages
        if not m.additional_properties.get(EXCLUDED_KEY) and not is_injected_todo(m)
    )


def _run(strategy: Strategy, messages: list[Message]) -> bool:
    return asyncio.run(strategy(messages))


def _excluded(message: Message) -> bool:
    return bool(message.additional_properties.get(EXCLUDED_KEY))


def _history(messages: Sequence[Message]) -> list[Message]:
    return [m for m in messages if not is_injected_todo(m)]


@dataclass
class Pass:
    """One chunk's worth of passes: the state before, both lists after, and what was asked."""

    before: list[Message]
    in_call: list[Message]
    stored: list[Message]
    calls: int
    new_requests: list[list[Message]]


def _play(chunks: Chunks, client: ScriptedSummarizer, strategy: Strategy) -> Iterator[Pass]:
    """Grow the history chunk by chunk; after each, compact the in-call copies, then stored history."""
    stored: list[Message] = []
    for chunk in chunks:
        stored += deep_copy_messages(chunk)
        before = deep_copy_messages(stored)
        calls = client.calls
        in_call = with_injected_context(stored)
        _run(strategy, in_call)
        _run(strategy, stored)
        report = strategy.last_report
        event(f"{strategy.summary_mode}: {report.outcome.value if report else 'no pass'}")
        if strategy.media_descriptions:
            event("media described")
        yield Pass(before, in_call, deep_copy_messages(stored), client.calls - calls, client.requests[calls:])


def _summary_chain(messages: Sequence[Message], message: Message) -> Message | None:
    """The included summary that stands for an excluded ``message``, following replaced summaries."""
    summaries = {m.message_id: m for m in messages if is_summary(m)}
    seen: set[str] = set()
    current = message
    while _excluded(current):
        summary_id = current.additional_properties.get(SUMMARIZED_BY_KEY)
        if not isinstance(summary_id, str) or summary_id in seen or summary_id not in summaries:
            return None
        seen.add(summary_id)
        current = summaries[summary_id]
    return current if current is not message else None


# ----------------------------------------------------------------------------- properties


@given(requirement_chunks(), params())
def test_no_user_requirement_is_silently_dropped(chunks: Chunks, p: Params) -> None:
    client = ScriptedSummarizer()
    strategy = p.make(client, p.budget(chunks))
    for done in _play(chunks, client, strategy):
        note(describe(done.stored))
        for messages in (done.in_call, done.stored):
            history = _history(messages)
            ids = [m.message_id for m in history if is_summary(m)]
            assert len(ids) == len(set(ids))
            for message in history:
                if message.role != "user" or not _excluded(message):
                    continue
                summary = _summary_chain(history, message)
                assert summary is not None, f"{message.message_id} excluded with no summary standing for it"
                assert not _excluded(summary)
                missing = set(CODE.findall(message.text)) - set(CODE.findall(summary.text))
                assert not missing, f"{summary.message_id} lost {sorted(missing)} of {message.message_id}"
                if message.message_id and not is_summary(message):
                    direct = message.additional_properties[SUMMARIZED_BY_KEY]
                    linked = next(m for m in history if m.message_id == direct)
                    assert message.message_id in linked.additional_properties[SUMMARY_OF_KEY]


@given(requirement_chunks(), params())
def test_the_same_state_never_triggers_a_second_call(chunks: Chunks, p: Params) -> None:
    client = ScriptedSummarizer()
    budget = p.budget(chunks)
    strategy = p.make(client, budget)
    sent: list[str] = []
    for done in _play(chunks, client, strategy):
        assert done.calls <= 1
        # Again, on fresh copies of the same state: both lists, then a restored replica.
        calls, hooks = client.calls, len(p.hook_keys)
        _run(strategy, with_injected_context(done.before))
        _run(strategy, deep_copy_messages(done.before))
        replica = p.make(client, budget)
        replica.restore_decisions(json.loads(json.dumps(strategy.decision_state().to_dict())))
        _run(replica, deep_copy_messages(done.before))
        assert (client.calls, len(p.hook_keys)) == (calls, hooks)
        sent += [json.dumps([m.text for m in request]) for request in done.new_requests]
    assert len(sent) == len(set(sent)), "a request was sent twice"
    if p.hook == "describe":  # a description that came back is never asked for again (a failure may be, later)
        assert len(p.hook_keys) == len(set(p.hook_keys)), "the same media was described twice"


@given(requirement_chunks(), params())
def test_both_lists_and_a_restored_instance_show_the_same_bytes(chunks: Chunks, p: Params) -> None:
    client = ScriptedSummarizer()
    budget = p.budget(chunks)
    strategy = p.make(client, budget)
    for done in _play(chunks, client, strategy):
        note(describe(done.stored))
        assert shown(done.in_call) == shown(done.stored)
        assert is_injected_todo(done.in_call[0])
        assert not _excluded(done.in_call[0])
        restored_client = ScriptedSummarizer()
        restored = p.make(restored_client, budget)
        restored.restore_decisions(json.loads(json.dumps(strategy.decision_state().to_dict())))
        copies = deep_copy_messages(done.before)
        _run(restored, copies)
        assert restored_client.calls == 0
        assert shown(copies) == shown(done.stored)


def test_injected_context_does_not_tip_the_band_share() -> None:
    """Found by the long profile: the in-call copies (injected context counted) found the band under
    ``min_band_share`` of the prompt, the stored history over it, so only one list was summarised. The
    share is of the conversation's own tokens, so both lists decide alike."""
    stored = json.loads((Path(__file__).parent / "fixtures" / "band_share_injected_context.json").read_text())
    history = [Message.from_dict(m) for m in stored.pop("history")]
    strategy = Strategy(tokenizer=TOKENIZER, client=ScriptedSummarizer(), prompt=DEFAULT_PROMPT, **stored)
    in_call, copies = with_injected_context(history), deep_copy_messages(history)
    _run(strategy, in_call)
    assert strategy.last_report is not None
    assert strategy.last_report.outcome.value == "summarized"
    _run(strategy, copies)
    assert shown(in_call) == shown(copies)


def test_a_summary_made_over_the_trigger_replays_on_the_list_below_it() -> None:
    """Injected context put only the in-call copies over the trigger: the stored history, below it, still
    applies the summary they made, so both lists show the same bytes."""
    stored = json.loads((Path(__file__).parent / "fixtures" / "band_share_injected_context.json").read_text())
    history = [Message.from_dict(m) for m in stored.pop("history")]
    stored |= {"max_input_tokens": 2_330, "min_band_share": 0.0}  # trigger 1,165: stored 1,154, in-call 1,182
    strategy = Strategy(tokenizer=TOKENIZER, client=ScriptedSummarizer(), prompt=DEFAULT_PROMPT, **stored)
    in_call, copies = with_injected_context(history), deep_copy_messages(history)
    _run(strategy, in_call)
    assert strategy.last_report is not None
    assert strategy.last_report.outcome.value == "summarized"
    _run(strategy, copies)
    assert shown(in_call) == shown(copies)


@given(requirement_chunks(), params(), st.booleans())
def test_same_state_any_copy_same_bytes(chunks: Chunks, p: Params, restored: bool) -> None:
    """The same state on any copy of the same conversation gives the same bytes (excluded messages too,
    not only what the model is shown) with no second summarizer or describe_media call."""
    client = ScriptedSummarizer()
    budget = p.budget(chunks)
    strategy = p.make(client, budget)
    for done in _play(chunks, client, strategy):
        note(describe(done.stored))
        calls, hooks = client.calls, len(p.hook_keys)
        replica = strategy
        if restored:
            replica = p.make(client, budget)
            replica.restore_decisions(json.loads(json.dumps(strategy.decision_state().to_dict())))
        copies = deep_copy_messages(done.before)
        _run(replica, copies)
        assert (client.calls, len(p.hook_keys)) == (calls, hooks)
        assert [m.to_dict() for m in copies] == [m.to_dict() for m in done.stored]


@given(requirement_chunks(), params(small_bound=True))
def test_every_request_fits_max_summary_input_tokens(chunks: Chunks, p: Params) -> None:
    client = ScriptedSummarizer()
    strategy = p.make(client, p.budget(chunks))
    limit = p.kwargs["max_summary_input_tokens"]
    for done in _play(chunks, client, strategy):
        for request in done.new_requests:
            assert [m.role for m in request] == ["system", "user"]
            assert sum(TOKENIZER.count_tokens(m.text) for m in request) <= limit
    assert all(sum(TOKENIZER.count_tokens(m.text) for m in request) <= limit for request in client.requests)


@given(requirement_chunks(), params(), st.data())
def test_the_core_is_pure(chunks: Chunks, p: Params, data: st.DataObject) -> None:
    messages = [m for chunk in chunks for m in chunk]
    config = UserSummaryConfig(max_input_tokens=p.budget(chunks), describe_media=p.hook != "none", **p.kwargs)
    history = to_history(messages, ESTIMATOR.parts, note_kind="anchored")
    snapshot = State()
    measure = ESTIMATOR.parts.measure
    asked: set[str] = set()
    for _ in range(64):  # each round must ask something new: media reachable in turn, then one summary
        kept_history, kept_snapshot = copy.deepcopy(history), copy.deepcopy(snapshot)
        first = step(config, snapshot, history, measure)
        second = step(config, snapshot, history, measure)
        assert first == second
        assert (history, snapshot) == (kept_history, kept_snapshot)
        if isinstance(first, Done):
            return
        assert isinstance(first, Needs)
        assert first.requests
        identities = {r.identity for r in first.requests}
        assert not identities <= asked, "the core asked again for an answer it was given"
        asked |= identities
        answers: list[tuple[Request, str | None]] = []
        for request in first.requests:
            fails = data.draw(st.integers(0, 4)) == 0
            if request.kind in (RequestKind.SUMMARY, RequestKind.FOLD):
                assert request.route is Route.SUMMARIZER, "the user strategy asks for nothing over the cached prefix"
                text = extractive([Message("user", [request.transcript])])
            else:
                assert (request.kind, request.route) == (RequestKind.MEDIA, Route.HOOK), (
                    "the user strategy asks for nothing over the cached prefix"
                )
                text = f"an attachment ({request.part})"
            answers.append((request, None if fails else text))
        absorbed = absorb(snapshot, answers)
        assert absorbed == absorb(snapshot, answers)
        assert snapshot == kept_snapshot
        snapshot = absorbed
    raise AssertionError("the core kept asking after its answers were recorded")


@given(requirement_chunks(), params())
def test_a_pass_over_a_passs_output_changes_nothing(chunks: Chunks, p: Params) -> None:
    """In every summary mode, compacting a pass's own output again leaves every stored byte as it was
    (unless that pass ended above the trigger: the next pass continues from it)."""
    client = ScriptedSummarizer()
    budget = p.budget(chunks)
    strategy = p.make(client, budget)
    for done in _play(chunks, client, strategy):
        report = strategy.last_report
        if report is None or report.tokens_after > budget * p.kwargs["trigger_fraction"]:
            continue
        stored = deep_copy_messages(done.stored)
        _run(strategy, stored)
        assert [m.to_dict() for m in stored] == [m.to_dict() for m in done.stored]
