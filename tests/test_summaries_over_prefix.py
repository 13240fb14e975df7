"""The composition's user-turn summaries asked over the cached prefix, proven with the framework's own parts.

With ``ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(..., summary_request="cached_prefix")`` and
the recall middleware installed (``record_request="cached_prefix"``), a summary of earlier user turns is not sent
to the summarizer client: the pass sends the conversation's own request as the provider cached it (a prefix of
the last request, cut between groups, at most its size) plus one user message, ``[compaction request] Do not
continue the task. <prompt>`` followed by :data:`PREFIX_ITEMS_HEADING` and the turns named by their opening words,
through the agent's chat client at its provider layer. The answer is judged like a summarizer answer (the same
request identity, smaller than the turns it replaces) and must quote a value of the turns when they carry any (an
answer that called a tool is never a summary). Summaries have their own verdict: one ignored answer or failure is
not kept (not even as a failure) and sets ``RecallState.summaries_to_summarizer``: the same summary goes to the
summarizer client on the same pass, the next one over the cached prefix again, and once two in a row were ignored
every later one follows them to the summarizer, while records keep going over the cached prefix (their own streak,
``ignored_instructions`` and the record route, is not touched). A pass that runs before
any request went through the recall middleware (a ``CompactionProvider`` compacting a loaded session before the
run), or without the middleware, has no head to repeat: the summarizer client answers. Inside a request the
middleware already holds the caller's head, so even the first request's summary goes over the prompt as it stands
(cut to the fallback's share of the budget).

The parts are the ones ``tests/test_cached_prefix.py`` uses (imported from it): ``create_harness_agent`` (todo,
mode, file memory and web search off) over the framework's client layers (function invocation, chat middleware,
telemetry over ``BaseChatClient``) with a scripted provider call that records every request as it arrives, the
README's recall wiring, sessions, and snapshots through JSON. The scripted model here (:class:`Model`) also answers
summary instructions: faithfully (the values of the turns the instruction names, found by their opening words:
exactly what the summarizer client answers for the same turns), or in one of the ways a model ignores it.

Two conversations are played. In the first, every turn is a question that carries a ticket and a date (distinctive
values), a ``lookup`` call and a short answer: records and summaries are both asked over the cached prefix. In the
second, every turn is a note with a ticket and a date and the model only acknowledges it: no tool runs, so the
user half's summaries are the only requests over the cached prefix (the first note is long: the head anchor, never
summarised, and the conversation's largest step, so the user half asks for room several turns before the prompt
reaches the budget).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import pytest
from agent_framework import (
    Agent,
    AgentSession,
    ChatResponse,
    CompactionProvider,
    Content,
    InMemoryHistoryProvider,
    Message,
    create_harness_agent,
)
from agent_framework._compaction import EXCLUDE_REASON_KEY, EXCLUDED_KEY

from maf_compaction import (
    CompactionStack,
    RecallGate,
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
    ToolResultRecallMiddleware,
    UserTurnAnchoredSummarizationCompactionStrategy,
    make_recall_tool,
)
from maf_compaction.adapters.convert import SUMMARIZED_BY_KEY, SUMMARY_KEY, SUMMARY_OF_KEY, is_summary
from maf_compaction.bench.sessions import make_builder
from maf_compaction.core import records as record_rules
from maf_compaction.core.composition import SummaryRequest
from maf_compaction.core.counting import MESSAGE_OVERHEAD_TOKENS
from maf_compaction.core.effects import COMPACTION_REQUEST
from maf_compaction.core.recall import FAILURE_LIMIT, IGNORED_LIMIT, RecallState, no_route
from maf_compaction.core.records import RECORD_INSTRUCTION, RECORD_MARKER, SUMMARY_SECTION
from maf_compaction.core.state import BOUNDED_KINDS, Answer
from maf_compaction.core.user_summaries import (
    DEFAULT_PROMPT,
    EXCLUDE_REASON,
    OPENING_CHARACTERS,
    PREFIX_ITEMS_HEADING,
    USER_SUMMARY_MARKER,
)
from maf_compaction.core.values import distinctive_values
from test_cached_prefix import (
    BUDGET,
    ESTIMATOR,
    HARNESS_OFF,
    OUTPUT_CAP,
    SMALL_TALK,
    TOKENIZER,
    Capture,
    Conversation,
    Provider,
    RecordAnswer,
    Script,
    ScriptError,
    Sent,
    Summarizer,
    agent_for,
    check_capped,
    content_of,
    excluded,
    faithful_summary,
    make_lookup,
    question,
    render,
    role_of,
)

#: Turns of the lookup conversation: two summaries are asked in it, each riding on a record's break.
TURNS: Final = 10
#: Turns of the note conversation: the user half asks for room from turn 11 on.
NOTES: Final = 16
#: How the shell words an answer that called a tool instead of answering (``adapters.aligned.answer_text``).
CALL_MARK: Final = "[a call of"

#: How the scripted model answers a summary instruction (see :class:`Model`).
SummaryAnswer = Literal["faithful", "small_talk", "continue", "tool", "empty", "raise", "verbose"]
IGNORING: Final[tuple[SummaryAnswer, ...]] = ("small_talk", "continue", "tool", "empty")

_NAMED: Final = re.compile(r"^\d+\. \u00ab(.*)\u00bb$", re.MULTILINE)
_NOTE: Final = re.compile(r"^note (\d+):")


def fact_question(n: int) -> str:
    """The lookup conversation's turn ``n``: the scripted question (``question n: ...``), with a ticket and a date."""
    return f"{question(n)}Requirement: ticket TK-{n:02d}A{n:02d} must ship by 2025-04-{n + 10:02d}."


def note(n: int) -> str:
    """The note conversation's turn ``n``: a ticket and a date, then background (the first note is long)."""
    return f"note {n}: keep ticket NT-{n:02d}C{n:02d} open until 2025-06-{n + 1:02d}; " + "background detail. " * (
        120 if n == 0 else 12
    )


def values_of(texts: Sequence[str]) -> str:
    """What a faithful summary of ``texts`` says: their distinctive values, in order, or the opening words of their
    numbered transcript when they carry none (as :class:`Summarizer`)."""
    transcript = "\n".join(f"{number}. {text}" for number, text in enumerate(texts, start=1))
    return faithful_summary(transcript, transcript)


def named(instruction: str) -> list[str]:
    """The opening words a summary instruction names its turns by, in order."""
    return _NAMED.findall(instruction)


def opening(text: str) -> str:
    """How a turn is named: its first line, at most :data:`OPENING_CHARACTERS` characters."""
    line = text.strip().splitlines()[0].strip()
    return line[:OPENING_CHARACTERS].rstrip()


def instruction_for(openings: Sequence[str]) -> str:
    """The summary instruction that names ``openings`` (the user half's default prompt)."""
    items = "\n".join(f"{k}. \u00ab{o}\u00bb" for k, o in enumerate(openings, start=1))
    return f"{COMPACTION_REQUEST} Do not continue the task. {DEFAULT_PROMPT}\n\n{PREFIX_ITEMS_HEADING}\n{items}"


@dataclass(frozen=True)
class Model(Script):
    """:class:`Script`, which also answers a summary instruction and acknowledges notes.

    ``summary_answer``: ``"faithful"`` finds the user messages the instruction names (by their opening words) and
    answers their values, as :class:`Summarizer` does for the same turns; ``"small_talk"`` answers without them;
    ``"continue"`` answers as if the instruction were not there (the bench's ``ignore_instruction``); ``"tool"``
    calls ``lookup``; ``"empty"`` answers nothing; ``"raise"`` fails; ``"verbose"`` quotes the values and pads them
    past the size of the turns. A note is acknowledged (``noted <n>``), pinned or not.
    """

    summary_answer: SummaryAnswer = "faithful"

    def answer(self, messages: Sequence[Message], *, pinned: bool) -> list[Content]:
        last = messages[-1]
        if last.role == "user" and asks_summary_text(last.text or ""):
            if not (last.text or "").startswith(RECORD_INSTRUCTION):
                return self._summary(messages)
            # A record and a summary asked in one request: the record, the section line, the summary (a part
            # that is no text, a call or a failure, is what the model answers instead of both).
            record, summary = super().answer(messages, pinned=pinned), self._summary(messages)
            if [c.type for c in record] == ["text"] and [c.type for c in summary] == ["text"]:
                return [Content.from_text(f"{record[0].text}\n{SUMMARY_SECTION}\n{summary[0].text}")]
            return record if [c.type for c in record] != ["text"] else summary
        found = _NOTE.match(last.text or "") if last.role == "user" else None
        if found:
            return [Content.from_text(f"noted {found.group(1)}")]
        return super().answer(messages, pinned=pinned)

    def _summary(self, messages: Sequence[Message]) -> list[Content]:
        mode = self.summary_answer
        if mode == "raise":
            raise ScriptError("the summary request failed at the provider")
        if mode == "small_talk":
            return [Content.from_text(SMALL_TALK)]
        if mode == "continue":
            return self.answer(messages[:-1], pinned=False)
        if mode == "tool":
            return [Content.from_function_call("stray_summary", "lookup", arguments={"n": 77})]
        if mode == "empty":
            return [Content.from_text("")]
        openings = named(messages[-1].text or "")
        items = [m.text or "" for m in messages[:-1] if m.role == "user" and any(o in (m.text or "") for o in openings)]
        text = values_of(items)
        if mode == "verbose":
            text += " " + " ".join(f"(restated: {item})" for item in items)
        return [Content.from_text(text)]


def asks_summary_text(text: str) -> bool:
    """``text`` is a summary instruction sent over the cached prefix."""
    return text.startswith(COMPACTION_REQUEST) and PREFIX_ITEMS_HEADING in text


def asks_summary(sent: Sent) -> bool:
    """The request ends with a summary instruction."""
    return bool(sent.texts) and asks_summary_text(sent.texts[-1])


def over_prefix(sent: Sent) -> bool:
    """The request was sent over the cached prefix (a record or a summary instruction at its end)."""
    return sent.asks_record or asks_summary(sent)


def summary_asks(sent: Sequence[Sent]) -> list[int]:
    """0-based indices of the requests that asked for a summary over the cached prefix."""
    return [i for i, s in enumerate(sent) if asks_summary(s)]


def canonical(sent: Sequence[Sent]) -> list[tuple[str, ...]]:
    return [s.canonical for s in sent]


def user_answers(run: Talk) -> tuple[Answer, ...]:
    """The user half's remembered answers (its summaries and folds, kept or refused), oldest first."""
    return tuple(a for a in run.strategy.decision_state().answers if a.kind in BOUNDED_KINDS)


# --- wiring ---------------------------------------------------------------------------------------------------


def build(summary_request: SummaryRequest, summarizer: Summarizer, budget: int = BUDGET) -> CompactionStack:
    """The README's "Both halves" wiring on the test budget: both halves, the gate, the recall middleware."""
    return make_builder(
        "composition",
        budget,
        TOKENIZER,
        summarizer,
        record_request="cached_prefix",
        summary_request=summary_request,
        keep_head_groups=1,
        keep_tail_groups=1,
    )()


def composition(stack: CompactionStack) -> ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy:
    strategy = stack.strategy
    assert isinstance(strategy, ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy)
    return strategy


@dataclass
class Talk(Conversation):
    """A conversation of :func:`fact_question` (or :func:`note`) turns, with the user half's summarizer client."""

    summarizer: Summarizer = field(default_factory=Summarizer)
    words: Callable[[int], str] = fact_question
    summary_request: SummaryRequest = "cached_prefix"

    async def turn(self, n: int, *, stream: bool = False) -> None:
        if stream:
            run = self.agent.run(self.words(n), session=self.session, stream=True)
            async for _ in run:
                pass
            response = await run.get_final_response()
        else:
            response = await self.agent.run(self.words(n), session=self.session)
        self.replies.append(response.text)
        included = [m for m in self.stored() if not excluded(m)]
        self.turn_ends.append((len(self.sent), [render(m) for m in included], [m.message_id for m in included]))

    async def play(self, turns: range, *, stream: bool = False) -> Talk:
        await super().play(turns, stream=stream)
        return self

    @property
    def strategy(self) -> ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy:
        return composition(self.stack)


def talk(
    summary_request: SummaryRequest = "cached_prefix",
    *,
    model: Model | None = None,
    words: Callable[[int], str] = fact_question,
    middleware: bool = True,
    summarizer: Summarizer | None = None,
    budget: int = BUDGET,
    max_tokens: int | None = None,
) -> Talk:
    """A conversation through ``create_harness_agent``; without ``middleware`` neither the recall middleware nor the
    recall tool is installed; ``max_tokens``: the agent's own output cap."""
    client = Provider(model or Model())
    summarizer = summarizer if summarizer is not None else Summarizer()
    stack = build(summary_request, summarizer, budget)
    invoked: list[int] = []
    if middleware:
        capped = {} if max_tokens is None else {"default_options": {"max_tokens": max_tokens}}
        agent = agent_for(client, stack, invoked, {**HARNESS_OFF, **capped})
    else:
        agent = create_harness_agent(
            client,
            agent_instructions="Answer from the lookups.",
            tools=[make_lookup(invoked)],
            before_compaction_strategy=stack.strategy,
            after_compaction_strategy=stack.strategy,
            tokenizer=TOKENIZER,
            disable_web_search=True,
            disable_file_memory=True,
            **HARNESS_OFF,
        )
    session = agent.create_session()
    return Talk(
        client, stack, agent, session, invoked, summarizer=summarizer, words=words, summary_request=summary_request
    )


def restored(old: Talk) -> Talk:
    """A fresh replica of ``old``: new provider, summarizer, stack and agent; session and stack state through JSON."""
    client = Provider(old.client.script)
    summarizer = Summarizer()
    data = json.loads(json.dumps(old.stack.to_dict()))
    session = AgentSession.from_dict(json.loads(json.dumps(old.session.to_dict())))
    stack = build(old.summary_request, summarizer).from_dict(data)
    invoked: list[int] = []
    agent = agent_for(client, stack, invoked, HARNESS_OFF)
    return Talk(
        client,
        stack,
        agent,
        session,
        invoked,
        summarizer=summarizer,
        words=old.words,
        summary_request=old.summary_request,
    )


_PLAYED: dict[tuple[object, ...], Talk] = {}


async def played(
    summary_request: SummaryRequest = "cached_prefix",
    *,
    stream: bool = False,
    answer: SummaryAnswer = "faithful",
    words: Callable[[int], str] = fact_question,
    turns: int = TURNS,
) -> Talk:
    """A conversation played once per test session (runs are deterministic)."""
    key = (summary_request, stream, answer, words, turns)
    if key not in _PLAYED:
        run = talk(summary_request, model=Model(summary_answer=answer), words=words)
        _PLAYED[key] = await run.play(range(turns), stream=stream)
    return _PLAYED[key]


def stored_form(run: Conversation) -> list[tuple[object, ...]]:
    """Stored history as compaction left it: every message (content ids aside), its id, exclusion and links."""
    keys = (EXCLUDED_KEY, EXCLUDE_REASON_KEY, SUMMARIZED_BY_KEY, SUMMARY_KEY, SUMMARY_OF_KEY)
    return [
        (render(m, ids=False), m.message_id, *(json.dumps(m.additional_properties.get(k)) for k in keys))
        for m in run.stored()
    ]


def facts_kept(run: Talk, turns: range) -> list[str]:
    """Values of the turns played that no included stored message carries (a turn or a summary)."""
    included = "\n".join(m.text or "" for m in run.stored() if not excluded(m))
    return [v for n in turns for v in distinctive_values(run.words(n)) if v not in included]


def without_instructions(sent: Sequence[Sent]) -> list[tuple[str, ...]]:
    """The conversation's requests and its record requests without their instruction (a summary may ride in one),
    summary-only requests aside."""
    return [
        (*s.canonical[:-2], s.canonical[-1]) if s.asks_record else s.canonical
        for s in sent
        if s.asks_record or not asks_summary(s)
    ]


def unnamed(rendered: str) -> str:
    """A rendered message without its author."""
    message = json.loads(rendered)
    message.pop("author", None)
    return json.dumps(message, sort_keys=True)


def summary_answer(sent: Sent, answer: str) -> str:
    """The summary part of ``answer`` to ``sent`` (a record asked with the summary answers both, split by a line)."""
    if not sent.asks_record:
        return answer
    lines = answer.split("\n")
    return "\n".join(lines[lines.index(SUMMARY_SECTION) + 1 :])


def last_request_before(sent: Sequence[Sent], i: int) -> Sent:
    """The conversation's last request before request ``i`` (requests over the cached prefix aside)."""
    return sent[max(j for j in range(i) if not over_prefix(sent[j]))]


def _group_at(prompt: Sequence[str], k: int) -> list[str]:
    """The group starting at ``prompt[k]``: a tool call and the results after it, or one message."""
    end = k + 1
    if any(c["type"] == "function_call" for c in content_of(prompt[k])):
        while end < len(prompt) and role_of(prompt[end]) == "tool":
            end += 1
    return list(prompt[k:end])


@pytest.fixture
def warnings_seen() -> Iterator[list[str]]:
    handler = Capture()
    logger = logging.getLogger("maf_compaction")
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


# --- 1. summaries over the cached prefix: the request, the answer, history ----------------------------------------


def check_summary_requests(run: Talk) -> list[int]:
    """Each summary request is a prefix of the conversation's last request (cut between groups, at most its size,
    within the budget) plus exactly one instruction naming the summarised turns; the last request's head; sent whole.
    Returns the summary requests' indices."""
    sent = run.sent
    asks = summary_asks(sent)
    measure = ESTIMATOR.parts.measure
    for i in asks:
        ask = sent[i]
        last = last_request_before(sent, i)
        own = ask.messages[:-1]
        # The conversation's request as the provider cached it: a prefix of the last request, cut between groups.
        assert own, f"request {ask.number} sends nothing before the instruction"
        assert len(own) <= len(last.messages)
        # The framework names the agent on the replies it stores after a run: a request asked on the next run's
        # first pass shows them named, the run's own requests did not (see test_cached_prefix): authors aside.
        assert list(map(unnamed, own)) == list(map(unnamed, last.messages[: len(own)])), (
            f"request {ask.number} is no prefix of request {last.number}"
        )
        assert not [c for c in content_of(own[-1]) if c["type"] == "function_call"], "the cut follows a call"
        sends = ask.size - ask.tokens[-1]
        assert sends <= last.size, f"request {ask.number} sends {sends} tokens, request {last.number} {last.size}"
        assert ask.size <= BUDGET, f"request {ask.number} is {ask.size} tokens, over the {BUDGET}-token budget"
        if len(own) < len(last.messages):
            assert role_of(last.messages[len(own)]) != "tool", "the cut separates a call from its result"
            # The longest such prefix: the group the cut leaves out would pass what the request may send.
            # What the pass lets it send (``RecordConfig.prefix_tokens``): the last request's size, and the budget
            # less the instruction as the pass estimates it before writing it (the prompt, the openings, a margin).
            # A summary asked with a record rides on the record's view, cut for the record's instruction.
            estimate = measure(DEFAULT_PROMPT) + sum(measure(o) for o in named(ask.texts[-1])) + 64
            if ask.asks_record:
                estimate = measure(RECORD_INSTRUCTION) + MESSAGE_OVERHEAD_TOKENS
            limit = min(BUDGET - estimate, last.size)
            left_out = _group_at(last.messages, len(own))
            assert sends + sum(last.tokens[len(own) : len(own) + len(left_out)]) > limit, (
                f"request {ask.number} leaves out a group that fits"
            )
        # Exactly one instruction, a plain user message at the end, naming each turn by its opening words.
        assert sum(t.startswith(COMPACTION_REQUEST) for t in ask.texts) == 1
        assert role_of(ask.messages[-1]) == "user"
        openings = named(ask.texts[-1])
        assert openings, f"request {ask.number} names no turn"
        expected = instruction_for(openings)
        if ask.asks_record:  # asked with a record: the record's instruction, then the summary's after a section line
            body = expected.removeprefix(f"{COMPACTION_REQUEST} Do not continue the task. ")
            expected = (
                f"{RECORD_INSTRUCTION}\n\nThen, after the record, write one line {SUMMARY_SECTION} and below it a "
                f"summary, as follows. {body}"
            )
        assert content_of(ask.messages[-1]) == [{"type": "text", "text": expected, "additional_properties": {}}]
        users = [t for t, m in zip(ask.texts[:-1], own, strict=True) if role_of(m) == "user"]
        for o in openings:
            assert [t for t in users if opening(t) == o] == [t for t in users if o in t], f"«{o}» is ambiguous"
            assert [t for t in users if opening(t) == o], f"request {ask.number} names «{o}», which it does not send"
        # The head of the conversation's last (unpinned) request, unchanged; sent whole.
        assert not last.pinned
        check_capped(ask.options, last.options)
        assert ask.options.get("instructions"), "the instructions did not reach the summary request"
        assert ask.stream is False
    return asks


CELLS: Final = [False, True]


@pytest.mark.parametrize("stream", CELLS, ids=["blocking", "stream"])
async def test_summaries_are_asked_over_the_cached_prefix_and_the_summarizer_is_never_called(stream: bool) -> None:
    run = await played(stream=stream)
    asks = check_summary_requests(run)
    assert len(asks) == 2, f"summary requests over the cached prefix at {asks}"
    whole = [len(run.sent[i].messages) - 1 == len(last_request_before(run.sent, i).messages) for i in asks]
    assert whole == [True, False], "expected the last request whole, then a cut of it (the rule's two cases)"
    assert run.summarizer.calls == 0
    assert run.strategy.user_turns.summarizer_calls == 0
    assert run.strategy.user_turns.user_compactions == len(asks)
    assert run.strategy.prefix_requests == sum(1 for s in run.sent if over_prefix(s))
    assert run.strategy.failed_prefix_requests == 0
    assert not [s.number for s in run.sent if s.pinned], "a request was pinned"
    # Each rides on a record asked on the same pass, and that record (in the conversation's next request, not yet in
    # the cached one) is not in the summary's view.
    for i in asks:
        assert run.sent[i - 1].asks_record, f"request {i + 1} does not follow a record request"
        last, following = last_request_before(run.sent, i), run.sent[i + 1]
        new = {r for r in following.ids if (r or "").startswith("compaction_record_")} - set(last.ids)
        assert new, f"request {following.number} carries no new record"
        assert not new & set(run.sent[i].ids), "the summary's view holds the record asked on its pass"
        assert not [t for t in run.sent[i].texts if t.startswith(RECORD_MARKER) and t not in last.texts]
    # No tool runs for a request over the cached prefix, and every question got its lookup.
    assert run.invoked == list(range(TURNS))
    assert run.replies == [f"done with item {n}" for n in range(TURNS)]
    state = run.stack.tool_results.conversation.value.recall
    assert (state.ignored_instructions, no_route(state)) == (0, False)
    if stream:  # the same conversation as the blocking run (the framework renders a streamed call's arguments apart)
        blocking = await played()
        assert asks == summary_asks(blocking.sent)
        assert [s.texts for s in run.sent] == [s.texts for s in blocking.sent]
        assert run.client.answers == blocking.client.answers


async def test_each_answer_enters_history_as_a_user_summary_linked_to_the_turns_it_replaces() -> None:
    run = await played()
    sent, stored = run.sent, run.stored()
    asks = summary_asks(sent)
    by_id = {m.message_id: m for m in stored}
    summaries = [m for m in stored if is_summary(m)]
    assert [m.text for m in summaries] == [
        f"{USER_SUMMARY_MARKER}\n{summary_answer(sent[i], run.client.answers[i])}" for i in asks
    ]
    for summary, i in zip(summaries, asks, strict=True):
        assert summary.role == "user"
        replaced = summary.additional_properties[SUMMARY_OF_KEY]
        turns = [by_id[r] for r in replaced]
        assert [opening(t.text or "") for t in turns] == named(sent[i].texts[-1]), (
            f"request {sent[i].number} does not name the turns its summary replaces"
        )
        assert summary_answer(sent[i], run.client.answers[i]) == values_of([t.text or "" for t in turns])
        for t in turns:
            assert t.role == "user"
            assert excluded(t)
            assert t.additional_properties.get(EXCLUDE_REASON_KEY) == EXCLUDE_REASON
            assert t.additional_properties.get(SUMMARIZED_BY_KEY) == summary.message_id
        assert stored.index(summary) + 1 == stored.index(turns[0]), "the summary does not stand where its turns began"
    # The instruction and anything of its request never enter history; every fact of every turn stays.
    for m in stored:
        assert COMPACTION_REQUEST not in (m.text or "")
        assert PREFIX_ITEMS_HEADING not in (m.text or "")
    assert not facts_kept(run, range(TURNS))
    # Each request of the conversation after a summary carries it, and none of the turns it replaced.
    for summary, i in zip(summaries, asks, strict=True):
        following = [s for s in sent[i + 1 :] if not over_prefix(s)]
        gone = set(summary.additional_properties[SUMMARY_OF_KEY])
        for later in following:
            assert summary.text in later.texts
            assert not gone & set(later.ids)


async def test_the_summaries_and_the_conversation_are_those_of_the_summarizer_route() -> None:
    """The same run with ``summary_request="summarizer"``: the same requests of the conversation, the same answers
    under the same request identities, the same history, byte for byte (content ids aside); only who was asked
    differs."""
    prefix, summarizer = await played(), await played("summarizer")
    assert summarizer.summarizer.calls == len(summary_asks(prefix.sent)) == 2
    assert not summary_asks(summarizer.sent)
    assert canonical([s for s in prefix.sent if not asks_summary(s)]) == canonical(summarizer.sent)
    assert stored_form(prefix) == stored_form(summarizer)

    def answers(run: Talk) -> list[tuple[object, ...]]:
        return [(a.identity, a.text, a.message_id, a.sources, a.turns) for a in user_answers(run)]

    assert answers(prefix) == answers(summarizer)
    assert [a[1] for a in answers(prefix)] == [
        summary_answer(prefix.sent[i], prefix.client.answers[i]) for i in summary_asks(prefix.sent)
    ]
    assert prefix.strategy.user_turns.user_compactions == summarizer.strategy.user_turns.user_compactions


class VerboseSummarizer(Summarizer):
    """A summarizer client that answers as :class:`Model` does with ``summary_answer="verbose"``."""

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse]:
        self.calls += 1
        lines = (messages[-1].text or "").splitlines()
        items = [line.split(". ", 1)[1] for line in lines if re.match(r"^\d+\. ", line)]
        text = values_of(items) + " " + " ".join(f"(restated: {item})" for item in items)

        async def answer() -> ChatResponse:
            return ChatResponse(messages=[Message("assistant", [Content.from_text(text)])])

        return answer()


async def test_an_answer_larger_than_its_turns_is_refused_as_a_summarizer_answer_would_be() -> None:
    """The answer quotes the values (it followed the instruction) but is not smaller than the turns: refused and
    remembered (never asked for again), the route stays on; the summarizer route with a summarizer that answers
    alike sends the same conversation and keeps the same history."""
    run = await talk(model=Model(summary_answer="verbose")).play(range(TURNS))
    other = await talk("summarizer", summarizer=VerboseSummarizer()).play(range(TURNS))
    asks = summary_asks(run.sent)
    assert len(asks) == other.summarizer.calls >= 2
    assert not [m for m in run.stored() if is_summary(m)]
    assert run.strategy.user_turns.user_compactions == 0
    answers = user_answers(run)
    remembered = run.strategy.user_turns.config.remembered_requests
    assert len(answers) == min(len(asks), remembered)
    # The newest refusals, as many as the strategy remembers.
    given = [summary_answer(run.sent[i], run.client.answers[i]) for i in asks]
    assert [a.text for a in answers] == given[-remembered:], "a refusal was not remembered"
    instructions = [run.sent[i].texts[-1] for i in asks]
    assert len(set(instructions)) == len(instructions), "a refused summary was asked for again"
    bands = [named(text) for text in instructions]
    assert all(set(a) < set(b) for a, b in itertools.pairwise(bands)), f"each ask must cover a larger band: {bands}"
    state = run.stack.tool_results.conversation.value.recall
    assert (state.ignored_instructions, no_route(state)) == (0, False)
    assert run.summarizer.calls == 0
    assert not facts_kept(run, range(TURNS))
    assert without_instructions(run.sent) == without_instructions(other.sent)
    assert stored_form(run) == stored_form(other)
    assert answers == user_answers(other)


# --- 2. no request seen: the summarizer client ------------------------------------------------------------------


async def test_without_the_recall_middleware_summaries_go_to_the_summarizer() -> None:
    """No middleware saw a request, so there is no head to repeat: every summary goes to the summarizer client, and
    the conversation is the one the cached-prefix route sends."""
    run = await talk(words=note, middleware=False).play(range(NOTES))
    reference = await played(words=note, turns=NOTES)
    assert not [s for s in run.sent if over_prefix(s)]
    assert run.strategy.prefix_requests == 0
    assert run.summarizer.calls == run.strategy.user_turns.user_compactions >= 1
    # The same messages in every request (the head differs only by the recall tool, not installed here).
    others = [s for s in reference.sent if not asks_summary(s)]
    assert [s.canonical[:-1] for s in run.sent] == [s.canonical[:-1] for s in others]
    assert [m.text for m in run.stored() if is_summary(m)] == [m.text for m in reference.stored() if is_summary(m)]
    assert not facts_kept(run, range(NOTES))


def long_note(n: int) -> str:
    """A note of a conversation a host loads into a new session (twelve of them pass the budget)."""
    return note(n) + "more background. " * 18


def loaded_notes() -> list[Message]:
    """Twelve long notes and their acknowledgements, as a host loads them into a session before its first run."""
    return [m for n in range(12) for m in (Message("user", [long_note(n)]), Message("assistant", [f"noted {n}"]))]


class RecordingSummarizer(Summarizer):
    """:class:`Summarizer`, which also keeps the transcript of every request."""

    def __init__(self) -> None:
        super().__init__()
        self.transcripts: list[str] = []

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse]:
        self.transcripts.append(messages[-1].text or "")
        return super()._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)


def transcript_openings(transcript: str) -> list[str]:
    """The turns a summarizer transcript numbers, by their opening words."""
    return [opening(line.split(". ", 1)[1]) for line in transcript.splitlines() if re.match(r"^\d+\. ", line)]


async def test_a_pass_before_any_request_asks_the_summarizer_then_summaries_go_over_the_prefix() -> None:
    """An ``Agent`` whose ``CompactionProvider`` compacts the loaded history before the run, so before any request
    went out through the recall middleware, over a session that already holds twelve long notes: there is no head to
    repeat, and that summary goes to the summarizer client (the same summary the harness asks over the prompt inside
    the first request: see the next test). Once requests were seen, the next summary goes over the cached prefix."""
    client = Provider(Model())
    summarizer = RecordingSummarizer()
    stack = build("cached_prefix", summarizer)
    history = InMemoryHistoryProvider()
    compaction = CompactionProvider(
        before_strategy=stack.strategy,
        after_strategy=stack.strategy,
        tokenizer=TOKENIZER,
        history_source_id=history.source_id,
    )
    invoked: list[int] = []
    agent = Agent(
        client,
        instructions="Answer from the lookups.",
        tools=[make_lookup(invoked), make_recall_tool(stack.gate)],
        middleware=[stack.recall],
        context_providers=[history, compaction],
    )
    session = agent.create_session()
    session.state[history.source_id] = {"messages": loaded_notes()}
    run = Talk(client, stack, agent, session, invoked, summarizer=summarizer, words=long_note)
    assert stack.tool_results.conversation.value.recall.seen is None
    await run.turn(12)
    assert summarizer.calls == 1, "the summary of the loaded turns did not go to the summarizer"
    assert not [s for s in run.sent if over_prefix(s)]
    assert run.strategy.prefix_requests == 0
    (summary,) = [m for m in run.stored() if is_summary(m)]
    assert summary.text == f"{USER_SUMMARY_MARKER}\n{values_of([long_note(n) for n in range(1, 6)])}"
    assert summary.text in run.sent[0].texts, "the first request lacks the summary"
    inside = await asked_inside_the_first_request()
    assert transcript_openings(summarizer.transcripts[0]) == named(inside.sent[0].texts[-1]), (
        "the pass before the run and the pass inside the first request ask different summaries"
    )
    await run.play(range(13, 18))
    asks = summary_asks(run.sent)
    assert asks, "no summary went over the cached prefix once requests were seen"
    assert summarizer.calls == 1
    check_summary_requests(run)
    assert invoked == []
    assert not facts_kept(run, range(18))


async def asked_inside_the_first_request() -> Talk:
    """The loaded notes in ``create_harness_agent``'s session, and the first turn after them."""
    run = talk(words=long_note)
    run.session.state["in_memory"] = {"messages": loaded_notes()}
    return await run.play(range(12, 13))


async def test_inside_the_first_request_the_summary_goes_over_the_prompt_with_the_callers_head() -> None:
    """The harness compacts inside the request, after the recall middleware took the caller's head on the way in:
    before any request was seen sent, the summary is asked over the prompt as it stands with that head, cut between
    groups to the fallback's share of the budget (``RecordConfig.prefix_tokens`` without a request seen), and the
    summarizer client is not called."""
    run = await asked_inside_the_first_request()
    sent = run.sent
    assert summary_asks(sent) == [0]
    ask, first = sent[0], sent[1]
    assert run.summarizer.calls == 0
    own = ask.texts[:-1]
    loaded = [m.text for m in loaded_notes()]
    assert list(own) == loaded[: len(own)], "the summary request is no prefix of the loaded conversation"
    assert len(own) < len(loaded)
    measure = ESTIMATOR.parts.measure
    estimate = measure(DEFAULT_PROMPT) + sum(measure(o) for o in named(ask.texts[-1])) + 64
    limit = run.stack.tool_results.config.prefix_tokens(RecallState(), estimate)
    assert limit == int(BUDGET * 0.9) - estimate
    sends = ask.size - ask.tokens[-1]
    assert sends <= limit < sends + ESTIMATOR.count_message_tokens(loaded_notes()[len(own)])
    check_capped(ask.options, first.options)
    assert ask.texts[-1] == instruction_for([opening(long_note(n)) for n in range(1, 6)])
    (summary,) = [m for m in run.stored() if is_summary(m)]
    assert summary.text == f"{USER_SUMMARY_MARKER}\n{run.client.answers[0]}"
    assert summary.text in first.texts


# --- 3. a model that ignores the instruction ---------------------------------------------------------------------


# --- 3. a model that ignores the instruction ---------------------------------------------------------------------


def summarizer_summaries(run: Talk) -> list[Message]:
    """The stored summaries, each checked to be what the summarizer client answers for the turns it replaces."""
    by_id = {m.message_id: m for m in run.stored()}
    summaries = [m for m in run.stored() if is_summary(m)]
    for summary in summaries:
        turns = [by_id[r].text or "" for r in summary.additional_properties[SUMMARY_OF_KEY]]
        assert summary.text == f"{USER_SUMMARY_MARKER}\n{values_of(turns)}".rstrip(), (
            f"{summary.message_id} is not the summarizer's answer for its turns: {summary.text!r}"
        )
    return summaries


def check_given_to_the_summarizer(run: Talk, ask: int) -> None:
    """The summary asked over the cached prefix at request index ``ask`` was not kept: the same summary (the same
    turns) went to the summarizer client on the same pass (its first call), and the conversation's request that
    follows, in the same turn, carries the summarizer's answer."""
    summarizer = run.summarizer
    assert isinstance(summarizer, RecordingSummarizer)
    openings = named(run.sent[ask].texts[-1])
    assert summarizer.transcripts, "the summarizer client was not asked"
    assert transcript_openings(summarizer.transcripts[0]) == openings, "the summarizer was asked another summary"
    following = run.sent[ask + 1]
    assert not over_prefix(following)
    turn = next(k for k, (end, _, _) in enumerate(run.turn_ends) if ask < end)
    assert ask + 1 < run.turn_ends[turn][0], "the summarizer's summary did not reach the same turn's next request"
    by_id = {m.message_id: m for m in run.stored()}
    (summary,) = [
        m
        for m in summarizer_summaries(run)
        if [opening(by_id[r].text or "") for r in m.additional_properties[SUMMARY_OF_KEY]] == openings
    ]
    assert summary.text in following.texts, f"request {following.number} lacks the summarizer's summary"
    assert not set(summary.additional_properties[SUMMARY_OF_KEY]) & set(following.ids)


def check_ignored_answer_left_out(run: Talk) -> None:
    """Nothing of an ignored answer or of its request entered history."""
    text = "\n".join(render(m) for m in run.stored())
    for left_out in (SMALL_TALK, CALL_MARK, "stray_summary", COMPACTION_REQUEST, PREFIX_ITEMS_HEADING):
        assert left_out not in text, f"{left_out!r} entered history"


@pytest.mark.parametrize("answer", IGNORING)
async def test_an_ignored_summary_goes_to_the_summarizer_on_the_same_pass_and_two_in_a_row_send_all_later_ones(
    answer: SummaryAnswer, warnings_seen: list[str]
) -> None:
    """Small talk, the task continued, a tool call or nothing, for every summary asked over the cached prefix: no
    summary is kept of an ignored answer (not even a failure), and the same summary goes to the summarizer client at
    once, whose answer enters history. The next summary is asked over the cached prefix again (one ignored answer is
    no verdict on the model); once IGNORED_LIMIT in a row were ignored, ``summaries_to_summarizer`` stays set, every
    later summary goes to the summarizer, and a WARNING says so. The record route's own streak is untouched, no tool
    runs, and the conversation and its history are those of the run whose model follows the instruction (whose
    answer is the summarizer's, byte for byte)."""
    turns = 3 * NOTES  # long enough for more summaries than IGNORED_LIMIT
    run = await talk(model=Model(summary_answer=answer), words=note, summarizer=RecordingSummarizer()).play(
        range(turns)
    )
    faithful = await played(words=note, turns=turns)
    sent = run.sent
    asks = summary_asks(sent)
    assert len(summary_asks(faithful.sent)) > IGNORED_LIMIT
    assert asks == summary_asks(faithful.sent)[:IGNORED_LIMIT], f"summary requests over the cached prefix at {asks}"
    check_summary_requests(run)
    check_given_to_the_summarizer(run, asks[0])
    state = run.stack.tool_results.conversation.value.recall
    assert (state.summaries_to_summarizer, state.ignored_summaries) == (True, IGNORED_LIMIT)
    assert (no_route(state), state.ignored_instructions) == (False, 0)
    assert run.strategy.prefix_requests == IGNORED_LIMIT
    assert len([w for w in warnings_seen if "ignored the summary instruction" in w]) == 1
    assert run.strategy.failed_prefix_requests == 0  # an answer, whatever it says, is no failure
    summaries = summarizer_summaries(run)
    assert run.summarizer.calls == run.strategy.user_turns.user_compactions == len(summaries) >= 1
    assert user_answers(run) == user_answers(faithful)
    assert canonical([s for s in sent if not asks_summary(s)]) == canonical(
        [s for s in faithful.sent if not asks_summary(s)]
    )
    assert stored_form(run) == stored_form(faithful)
    check_ignored_answer_left_out(run)
    assert run.invoked == []
    assert run.replies == [f"noted {n}" for n in range(turns)]
    assert not facts_kept(run, range(turns))
    assert not [w for w in warnings_seen if "asked for a summary over the cached prefix and the request failed" in w]


@dataclass(frozen=True)
class FlakyModel(Model):
    """:class:`Model` whose first ``failures`` summary requests fail at the provider (a brief outage)."""

    failures: int = 2
    asked: list[int] = field(default_factory=list[int])

    def _summary(self, messages: Sequence[Message]) -> list[Content]:
        self.asked.append(len(messages))
        if len(self.asked) <= self.failures:
            raise ScriptError("the summary request failed at the provider")
        return super()._summary(messages)


@dataclass(frozen=True)
class OnceIgnoringModel(Model):
    """:class:`Model` that answers the first summary instruction with small talk, every later one faithfully."""

    asked: list[int] = field(default_factory=list[int])

    def _summary(self, messages: Sequence[Message]) -> list[Content]:
        self.asked.append(len(messages))
        if len(self.asked) == 1:
            return [Content.from_text(SMALL_TALK)]
        return super()._summary(messages)


async def test_one_ignored_summary_is_no_verdict_the_next_goes_over_the_cached_prefix_and_is_kept(
    warnings_seen: list[str],
) -> None:
    """The finding: one summary answer that quoted none of its turns' values (a model's slip on one summary) sent every
    later summary to the summarizer for good, each a request that re-reads its transcript uncached. Now the ignored
    summary goes to the summarizer on the same pass, the next one is asked over the cached prefix again and kept, the
    streak is reset, and no WARNING says the route was given up."""
    turns = 3 * NOTES
    model = OnceIgnoringModel()
    run = await talk(model=model, words=note, summarizer=RecordingSummarizer()).play(range(turns))
    asks = summary_asks(run.sent)
    assert len(asks) > IGNORED_LIMIT, f"summary requests over the cached prefix at {asks}"
    check_given_to_the_summarizer(run, asks[0])
    assert run.summarizer.calls == 1
    state = run.stack.tool_results.conversation.value.recall
    assert (state.summaries_to_summarizer, state.ignored_summaries) == (False, 0)
    assert run.strategy.user_turns.user_compactions == len(asks)  # one by the summarizer, the rest over the prefix
    assert not [w for w in warnings_seen if "ignored the summary instruction" in w]
    check_ignored_answer_left_out(run)
    assert run.replies == [f"noted {n}" for n in range(turns)]


async def test_a_failed_summary_request_is_asked_again_over_the_cached_prefix_once_the_conversation_grows(
    warnings_seen: list[str],
) -> None:
    """The finding: one failed summary request sent every later summary to the summarizer for good. A failure is
    no verdict on the model: the failed request stands until the conversation grows, then is asked again over the
    cached prefix; below FAILURE_LIMIT failures in a row the summarizer is never asked, and the route's state is
    reset by the first answer."""
    model = FlakyModel(failures=FAILURE_LIMIT - 1)
    run = await talk(model=model, words=note, summarizer=RecordingSummarizer()).play(range(NOTES))
    state = run.stack.tool_results.conversation.value.recall
    assert (state.summaries_to_summarizer, state.failed_requests, state.resting) == (False, 0, 0)
    assert run.strategy.failed_prefix_requests == FAILURE_LIMIT - 1
    assert len(model.asked) > FAILURE_LIMIT - 1, "asked again after the failures"
    assert run.summarizer.calls == 0
    assert run.strategy.user_turns.user_compactions >= 1  # a summary over the cached prefix was kept after them
    failed = [w for w in warnings_seen if "asked for a summary over the cached prefix and the request failed" in w]
    assert len(failed) == FAILURE_LIMIT - 1
    assert run.replies == [f"noted {n}" for n in range(NOTES)]


@pytest.mark.parametrize(
    ("record_answer", "summary_answer"), [("text", "small_talk"), ("small_talk", "faithful")], ids=["summary", "record"]
)
async def test_summaries_and_records_each_have_their_own_verdict(
    record_answer: RecordAnswer, summary_answer: SummaryAnswer
) -> None:
    """Lookup conversation, 16 turns. A model that ignores summary instructions and follows record instructions
    gives up only the summaries' route (one strike): every record, before and after, is still asked over the cached
    prefix and followed, and the record route stays on. A model that ignores record instructions and follows
    summary instructions gives up the records' route after two in a row (``RecordRoute.NONE``, which sends summaries
    to the summarizer as well), and ``summaries_to_summarizer`` stays off: no summary answer was judged ignored."""
    run = await talk(model=Model(summary_answer=summary_answer, record_answer=record_answer)).play(range(16))
    sent = run.sent
    state = run.stack.tool_results.conversation.value.recall
    asks = summary_asks(sent)
    records = [i for i, s in enumerate(sent) if s.asks_record]
    summaries = summarizer_summaries(run)
    # With the records' route given up, the safety net cuts the lookups to their value lines past the record
    # trigger, so fewer summaries are needed.
    least = 2 if summary_answer == "small_talk" else 1
    assert run.summarizer.calls == run.strategy.user_turns.user_compactions == len(summaries) >= least
    check_ignored_answer_left_out(run)
    assert not facts_kept(run, range(16))
    if summary_answer == "small_talk":
        assert (state.summaries_to_summarizer, no_route(state), state.ignored_instructions) == (True, False, 0)
        assert len(asks) == IGNORED_LIMIT, f"summaries asked over the cached prefix after two were ignored: {asks}"
        later = [i for i in records if i > asks[0]]
        assert len(later) >= 2, "no record went over the cached prefix after the summaries' route was given up"
        assert all(run.client.answers[i].startswith("lookup values: XR-") for i in records)
        assert not [s.number for s in sent if s.pinned], "a record was pinned"
        assert run.invoked == list(range(16))
    else:
        assert (state.summaries_to_summarizer, no_route(state), state.ignored_instructions) == (False, True, 2)
        assert asks == []
        assert len(records) == 2
        assert [run.client.answers[i] for i in records] == [SMALL_TALK, SMALL_TALK]
        assert not [s for s in sent[records[-1] + 1 :] if over_prefix(s)]


async def test_an_ignored_summary_over_a_prompt_past_the_budget_is_answered_by_the_summarizer_on_the_same_pass() -> (
    None
):
    """Notes of equal size, every summary instruction answered with small talk: each summary over the cached
    prefix is ignored, and the summarizer client answers it in the same pass, so no later turn passes the budget and
    no ``CompactionBudgetExceeded`` is raised (before the fix the ignored summary stood as a failure until the next
    turn, whose prompt of 2,129 tokens was asked over the prefix again, ignored, and raised)."""

    def even(n: int) -> str:
        return f"note {n}: keep ticket NT-{n:02d}C{n:02d} open until 2025-06-{n + 1:02d}; " + "background detail. " * 30

    run = talk(model=Model(summary_answer="small_talk"), words=even, summarizer=RecordingSummarizer())
    await run.play(range(NOTES))
    asks = summary_asks(run.sent)
    assert len(asks) == IGNORED_LIMIT, f"summary requests over the cached prefix at {asks}"
    check_summary_requests(run)
    check_given_to_the_summarizer(run, asks[0])
    assert run.summarizer.calls == run.strategy.user_turns.user_compactions == len(summarizer_summaries(run)) >= 2
    assert all(s.size <= BUDGET for s in run.sent), [s.number for s in run.sent if s.size > BUDGET]
    state = run.stack.tool_results.conversation.value.recall
    assert (state.summaries_to_summarizer, no_route(state)) == (True, False)
    check_ignored_answer_left_out(run)
    assert run.replies == [f"noted {n}" for n in range(NOTES)]
    assert not facts_kept(run, range(NOTES))


async def test_a_tool_call_is_never_taken_for_a_summary() -> None:
    """The scripted questions carry no value, so any text would do for a summary of them; the model answers the
    instruction with a ``lookup`` call, which the shell words ``[a call of lookup]``: that is no summary, the same
    summary goes to the summarizer client on the same pass (after two such answers, every later one), no tool runs
    for it, and no stored message says it."""
    run = await talk(model=Model(summary_answer="tool"), words=question, summarizer=RecordingSummarizer()).play(
        range(TURNS)
    )
    asks = summary_asks(run.sent)
    assert len(asks) == IGNORED_LIMIT, f"summary requests over the cached prefix at {asks}"
    assert all(run.client.answers[i] == "" for i in asks), "the model answered the instruction with text, not a call"
    check_given_to_the_summarizer(run, asks[0])
    state = run.stack.tool_results.conversation.value.recall
    assert (state.summaries_to_summarizer, no_route(state)) == (True, False)
    assert run.summarizer.calls == run.strategy.user_turns.user_compactions == len(summarizer_summaries(run)) >= 1
    check_ignored_answer_left_out(run)
    assert run.invoked == list(range(TURNS)), "a tool ran for the summary request"


@pytest.mark.parametrize(
    ("summary_answer", "chatty"), [("faithful", frozenset({3, 9})), ("small_talk", frozenset({12}))]
)
async def test_every_request_over_the_cached_prefix_repeats_at_most_the_last_request_and_fits_the_budget(
    summary_answer: SummaryAnswer, chatty: frozenset[int]
) -> None:
    """Lookup conversation, 16 turns, with long answers at the ``chatty`` turns: a record still due at a pass's end
    whose only unrecorded result the cut to the last request's size leaves out is not asked over the whole output
    (``records.ask_over_output``). Every request over the cached prefix, record or summary, sends at most what the
    conversation's last request sent and fits the budget with its instruction. (Before the fix these runs sent record
    requests of 2,096 to 2,204 tokens, over the 2,000-token budget.)"""
    run = await talk(model=Model(summary_answer=summary_answer, chatty_turns=chatty)).play(range(16))
    over = [i for i, s in enumerate(run.sent) if over_prefix(s)]
    assert [i for i in over if run.sent[i].asks_record], "no record was asked over the cached prefix"
    assert summary_asks(run.sent), "no summary was asked over the cached prefix"
    for i in over:
        ask = run.sent[i]
        last = last_request_before(run.sent, i)
        sends = ask.size - ask.tokens[-1]
        assert sends <= last.size, f"request {ask.number} sends {sends} tokens, request {last.number} {last.size}"
        assert ask.size <= BUDGET, f"request {ask.number} is {ask.size} tokens"
    check_summary_requests(run)
    assert not facts_kept(run, range(16))


# --- 4. parameters ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["bogus", "", "Cached_Prefix", "pinned", None, 1])
def test_summary_request_is_validated(value: Any) -> None:
    records = ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=BUDGET, tokenizer=TOKENIZER)
    users = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=BUDGET,
        tokenizer=TOKENIZER,
        client=Summarizer(),
        summary_mode="boundary",
        remembered_requests=2,
    )
    with pytest.raises(ValueError, match="summary_request") as raised:
        ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
            tokenizer=TOKENIZER, tool_results=records, user_turns=users, summary_request=value
        )
    message = str(raised.value)
    assert "summarizer" in message
    assert "cached_prefix" in message
    assert repr(value) in message
    for allowed in ("summarizer", "cached_prefix"):
        made = ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
            tokenizer=TOKENIZER, tool_results=records, user_turns=users, summary_request=allowed
        )
        assert made.summary_request == made.config.summary_request == allowed


@pytest.mark.parametrize("value", ["bogus", "", "summarizer", None])
def test_record_request_is_validated(value: Any) -> None:
    gate = RecallGate()
    with pytest.raises(ValueError, match="record_request") as raised:
        ToolResultRecallMiddleware(
            max_input_tokens=BUDGET, tokenizer=TOKENIZER, arm=gate.arm, disarm=gate.disarm, record_request=value
        )
    message = str(raised.value)
    assert "pinned" in message
    assert "cached_prefix" in message
    assert repr(value) in message


# --- 5. restores ---------------------------------------------------------------------------------------------------


async def test_a_restored_session_continues_with_identical_requests_and_asks_no_summary_twice() -> None:
    """At every turn boundary the session (``AgentSession.to_dict``) and the stack (``CompactionStack.to_dict``) go
    through JSON to a fresh replica: its requests are the uninterrupted conversation's, byte for byte (content ids
    aside), summaries over the cached prefix included, and no summary is asked again (of the model or the
    summarizer client)."""
    reference = await played()
    for boundary in range(1, TURNS):
        first = await talk().play(range(boundary))
        assert canonical(first.sent) == canonical(reference.sent[: len(first.sent)])
        second = await restored(first).play(range(boundary, TURNS))
        rest = reference.sent[len(first.sent) :]
        pairs = enumerate(zip(canonical(second.sent), canonical(rest), strict=False))
        differs = next((k for k, (a, b) in pairs if a != b), None)
        assert canonical(second.sent) == canonical(rest), (
            f"restored after turn {boundary}: request {len(first.sent) + (differs or 0) + 1} differs"
        )
        asks = summary_asks(first.sent) + [len(first.sent) + i for i in summary_asks(second.sent)]
        assert asks == summary_asks(reference.sent), f"restored after turn {boundary}: summaries asked at {asks}"
        assert first.summarizer.calls == second.summarizer.calls == 0
        assert stored_form(second) == stored_form(reference)
        answers = user_answers(second)
        assert len({a.identity for a in answers}) == len(answers)


# --- a record and a summary in one request -----------------------------------------------------------------------


#: A budget with room for a record's request to carry a summary's instruction too (on the test budget the
#: conversation's last request leaves too little: the two are then asked one after the other).
ROOMY: Final = 2_600


@dataclass(frozen=True)
class RecordOnly(Model):
    """:class:`Model`, which answers a request that asks for a record and a summary with the record alone."""

    def answer(self, messages: Sequence[Message], *, pinned: bool) -> list[Content]:
        last = messages[-1]
        if last.role == "user" and (last.text or "").startswith(RECORD_INSTRUCTION):
            return Script.answer(self, messages, pinned=pinned)
        return super().answer(messages, pinned=pinned)


@pytest.mark.parametrize("max_tokens", [None, 4_096])
async def test_a_record_request_carries_the_summary_the_pass_will_want_and_its_answer_is_used_without_a_request(
    max_tokens: int | None,
) -> None:
    """A record due on a pass asks, in the same request, for the summary the user half asks for once the record is
    in: the answer's part after the section line is that summary (stored as the summarizer's would be), and no
    request over the cached prefix asks for the same turns again. So it does under the agent's own output cap when
    both are expected to fit it."""
    run = await talk(budget=ROOMY, max_tokens=max_tokens).play(range(TURNS))
    sent = run.sent
    both = [i for i in summary_asks(sent) if sent[i].asks_record]
    assert both, "no record request carried a summary"
    for i in both:
        later = [j for j in summary_asks(sent) if j > i and named(sent[j].texts[-1]) == named(sent[i].texts[-1])]
        assert not later, f"the turns of request {sent[i].number}'s summary were asked for again at {later}"
    summaries = {m.text for m in run.stored() if is_summary(m)}
    for i in both:
        assert f"{USER_SUMMARY_MARKER}\n{summary_answer(sent[i], run.client.answers[i])}" in summaries
    assert run.strategy.user_turns.user_compactions == len(summary_asks(sent))
    assert run.summarizer.calls == 0


async def test_a_record_request_asks_for_no_summary_when_both_would_not_fit_the_agents_output_cap() -> None:
    """One cap bounds the whole answer over the cached prefix (the agent's own ``max_tokens``): when the record and
    the summary together are expected to exceed it, the record is asked for alone and the summary goes over the
    cached prefix in a request of its own on the same pass; nothing counts as ignored and every fact stays."""
    small = 96
    run = await talk(budget=ROOMY, max_tokens=small).play(range(TURNS))
    sent = run.sent
    records = [i for i, s in enumerate(sent) if s.asks_record]
    assert records, "no record was asked for"
    assert summary_asks(sent), "no summary was asked for"
    assert not [i for i in summary_asks(sent) if sent[i].asks_record], "a record request carried a summary"
    assert all(sent[i].options.get(OUTPUT_CAP) == small for i in records), "a record went out under another cap"
    state = run.stack.tool_results.conversation.value.recall
    assert (state.ignored_instructions, no_route(state), state.summaries_to_summarizer) == (0, False, False)
    assert run.summarizer.calls == 0
    assert not facts_kept(run, range(TURNS))


async def test_an_answer_without_the_summary_part_keeps_the_record_and_the_summary_is_asked_on_its_own() -> None:
    """The model answers a record-and-summary request with the record alone: the record is kept, nothing counts as
    an ignored instruction, and the summary goes over the cached prefix by itself on the same pass."""
    run = await talk(model=RecordOnly(), budget=ROOMY).play(range(TURNS))
    sent = run.sent
    both = [i for i in summary_asks(sent) if sent[i].asks_record]
    assert both, "no record request carried a summary"
    for i in both:
        assert sent[i + 1].texts[-1].startswith(COMPACTION_REQUEST)
        assert not sent[i + 1].asks_record
        assert named(sent[i + 1].texts[-1]) == named(sent[i].texts[-1]), "the summary asked alone is another one"
    state = run.stack.tool_results.conversation.value.recall
    assert (state.ignored_instructions, no_route(state), state.summaries_to_summarizer) == (0, False, False)
    written = record_rules.written(run.stack.tool_results.conversation.value)
    assert len(written) >= len(both), "a record answered without its summary part was not kept"
    assert run.summarizer.calls == 0
    assert not facts_kept(run, range(TURNS))
