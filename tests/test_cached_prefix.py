"""Records over the cached prefix, proven with the framework's own parts.

A record due on a request is asked for, with ``ToolResultRecallMiddleware(...,
record_request="cached_prefix")`` (and once pins are disabled), by the compaction pass: it
sends what the conversation's last request sent, no more (the prompt as it stands, which is
that request byte for byte and then what arrived since, cut between groups to the last
request's size and to the budget with the instruction: what arrived since is left for the
conversation's next request; the previous request's options) plus one user message holding
``RECORD_INSTRUCTION``, through the agent's chat client at its provider layer. The answer,
when it quotes a value of the results shown, becomes a written record placed right before
the conversation's newest group as it was when asked (its user message, or its newest tool
call and results: a request never ends with the record). Two answers in a row that ignore
the instruction, or two failed requests, end the route (records are pinned again).

Tests marked ``xfail(strict=True)`` are findings: their reasons say what was sent and what
was expected.

The agent is ``create_harness_agent`` (its todo, mode, file-memory and web-search providers
off unless a test turns todo and mode on) over a chat client that composes the framework's
own layers (function invocation, chat middleware, telemetry over ``BaseChatClient``) with a
scripted provider call; the strategy runs in both compaction phases and the README's recall
wiring (gate, recall tool, middleware with ``reforce=strategy.take_reforce``) is installed.
Each request is recorded as ``_inner_get_response`` receives it. The wire tests run the real
``agent-framework-openai`` clients against the bench's loopback server.

Every turn of the scripted conversation is one user question, one ``lookup`` call and a short
answer; a lookup result is twenty lines, four of which carry distinctive values (a code per
line), the rest filler the safety net can drop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import tempfile
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

import pytest
from agent_framework import (
    Agent,
    AgentSession,
    BaseChatClient,
    CharacterEstimatorTokenizer,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    FunctionTool,
    Message,
    ResponseStream,
    create_harness_agent,
    tool,
)
from agent_framework._compaction import EXCLUDE_REASON_KEY
from agent_framework._middleware import ChatMiddlewareLayer
from agent_framework._tools import FunctionInvocationLayer
from agent_framework.observability import ChatTelemetryLayer
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace as evolve

from maf_compaction import (
    CompactionStack,
    MediaTokenEstimator,
    RecallGate,
    SessionCompactionProvider,
    SessionCompactionRegistry,
    SessionToolResultRecallMiddleware,
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
    ToolResultRecallMiddleware,
    UserTurnAnchoredSummarizationCompactionStrategy,
    make_recall_tool,
    make_session_recall_tool,
    original_results,
)
from maf_compaction.adapters.convert import EXCLUDED_KEY, NOTE_KEY, WRITTEN_RECORD_KEY, is_summary
from maf_compaction.bench.loopback import ClientKind, LoopbackProvider, agent_options, close_client, make_client
from maf_compaction.bench.model import Reply, ScriptedModel, pinned_function
from maf_compaction.bench.provider import TASK, SimulatedProvider
from maf_compaction.bench.rendering import tool_spec
from maf_compaction.bench.scenario import GeneratorOptions, generate
from maf_compaction.bench.sessions import make_builder
from maf_compaction.bench.simulator import get_profile
from maf_compaction.core import records as record_rules
from maf_compaction.core.effects import Request, Route
from maf_compaction.core.envelope import VERSION
from maf_compaction.core.model import History, MessageRecord, Part, flagged, history
from maf_compaction.core.recall import (
    FAILURE_LIMIT,
    REST_CALLS,
    Pin,
    PinRule,
    RecallState,
    no_route,
    pin_due,
    pins_given_up,
)
from maf_compaction.core.records import (
    EXCLUDE_REASON,
    RECALL_TOOL_NAME,
    RECORD_INSTRUCTION,
    RECORD_MARKER,
    RECORD_PREFIX,
    ask_aligned,
    kept_record,
    place_written,
    recall_status,
)
from maf_compaction.core.state import Answer, RecordRoute, RequestKind, State, record_message_id
from maf_compaction.core.values import distinctive_values
from maf_compaction.errors import SnapshotError, SnapshotVersionError
from offline_tokenizers import offline_tiktoken

TOKENIZER: Final = CharacterEstimatorTokenizer()
#: The strategies' counting of a message (they wrap ``TOKENIZER`` in it); a request's size sums its messages.
ESTIMATOR: Final = MediaTokenEstimator(TOKENIZER)
#: The tokens of the instruction a request over the cached prefix ends with (one user message).
INSTRUCTION_TOKENS: Final = ESTIMATOR.count_message_tokens(Message("user", [Content.from_text(RECORD_INSTRUCTION)]))
PIN: Final = {"mode": "required", "required_function_name": RECALL_TOOL_NAME}
#: The input budget (CharacterEstimatorTokenizer: four characters a token). A lookup result is about
#: 280 tokens: the first record is due in the fourth turn, the next ones four groups later.
BUDGET: Final = 2_000
TURNS: Final = 10
FILLER: Final = "the service answered within its window and nothing else of note happened"
SMALL_TALK: Final = "Happy to keep going: what would you like to look at next?"
Kind = Literal["records", "composition"]
KINDS: Final[tuple[Kind, ...]] = ("records", "composition")
#: How the scripted model answers a request that ends with the record instruction.
RecordAnswer = Literal["text", "recall", "small_talk", "tool", "empty", "raise", "cancel", "hang"]


class ScriptError(RuntimeError):
    """The scripted provider failed."""


# --- the scripted provider ------------------------------------------------------------------------


def lookup_result(n: int) -> str:
    """The ``lookup`` result of turn ``n``: twenty lines, four with a code."""
    lines = [f"# lookup of item {n}"]
    lines += [f"code_{i}=XR-{n:02d}{i:02d}" if i % 5 == 0 else FILLER for i in range(20)]
    return "\n".join(lines)


def quote(messages: Sequence[Message]) -> str:
    """A faithful record of ``messages``: every distinctive value of every lookup result, in order."""
    values = [
        value
        for m in messages
        for c in m.contents
        if c.type == "function_result" and "# lookup of item" in str(c.result)
        for value in distinctive_values(str(c.result))
    ]
    return "lookup values: " + " ".join(dict.fromkeys(values))


def render(message: Message, *, ids: bool = True) -> str:
    """One message as a provider client reads it: role, author and every content, canonical JSON.

    ``ids=False`` leaves out the framework's random content ids (two runs of one conversation differ in them).
    """
    contents = [{k: v for k, v in c.to_dict().items() if ids or k != "id"} for c in message.contents]
    return json.dumps({"role": message.role, "author": message.author_name, "contents": contents}, sort_keys=True)


#: The one option a request over the cached prefix sets itself: its output cap (``core.max_answer_tokens``), which
#: no provider keys its prompt cache by.
OUTPUT_CAP: Final = "max_tokens"


def head_of(options: Mapping[str, Any]) -> dict[str, Any]:
    """A request's options as the provider's cache sees them: the output cap aside."""
    return {k: v for k, v in options.items() if k != OUTPUT_CAP}


def check_capped(ask: Mapping[str, Any], caller: Mapping[str, Any]) -> None:
    """A request over the cached prefix carries the caller's head, and an output cap never above the caller's own."""
    assert head_of(ask) == head_of(caller), "the request over the cached prefix changed the head"
    cap = ask.get(OUTPUT_CAP)
    assert isinstance(cap, int), "a request over the cached prefix carries no output cap"
    assert cap >= 1
    own = caller.get(OUTPUT_CAP)
    assert own is None or cap <= own, f"the cap {cap} is above the caller's own {own}"


def render_options(options: Mapping[str, Any]) -> str:
    """A request's options as canonical JSON, each tool as the declaration the model reads, the output cap aside."""
    data = {k: v for k, v in head_of(options).items() if k != "tools"}
    data["tools"] = [tool_spec(t) for t in options.get("tools") or ()]
    return json.dumps(data, sort_keys=True, default=str)


@dataclass(frozen=True)
class Sent:
    """One request as the provider layer received it (messages rendered on arrival).

    Attributes:
        number: 1-based, in arrival order.
        messages: The messages, rendered with :func:`render` when they arrived.
        canonical: The request as another run of the conversation must send it: its messages without
            content ids, then its options (:func:`render_options`).
        ids: Their message ids.
        texts: Their texts.
        call_ids: Call ids of every call and result in the request.
        options: A copy of the request's options.
        stream: It was a streaming call.
        tokens: Each message's tokens as the strategies count them (:data:`ESTIMATOR`).
    """

    number: int
    messages: tuple[str, ...]
    canonical: tuple[str, ...]
    ids: tuple[str | None, ...]
    texts: tuple[str, ...]
    call_ids: frozenset[str]
    options: Mapping[str, Any]
    stream: bool
    tokens: tuple[int, ...]

    @property
    def size(self) -> int:
        """The tokens the request's messages send (the strategies' counting; the head aside)."""
        return sum(self.tokens)

    @property
    def asks_record(self) -> bool:
        """The request ends with the record instruction (a record asked over the cached prefix)."""
        return bool(self.texts) and self.texts[-1].startswith(RECORD_INSTRUCTION)

    @property
    def pinned(self) -> bool:
        """The request's ``tool_choice`` names the recall tool."""
        choice = self.options.get("tool_choice")
        return choice == PIN or (isinstance(choice, Mapping) and RECALL_TOOL_NAME in json.dumps(choice, default=str))

    @property
    def text(self) -> str:
        return "\n".join(self.texts)


@dataclass(frozen=True)
class Script:
    """How the scripted model answers.

    A request ending with a user question gets a ``lookup`` call; a request after a tool
    result gets a short answer (a long one in ``chatty_turns``); a pinned request gets a
    recall call quoting every value (or, with ``obey_pins=False``, text); a request ending
    with the record instruction is answered as ``record_answer`` says.
    """

    record_answer: RecordAnswer = "text"
    obey_pins: bool = True
    chatty_turns: frozenset[int] = frozenset()
    #: Turns whose record requests fail at the provider whatever ``record_answer`` says (a brief outage).
    failing_turns: frozenset[int] = frozenset()

    def answer(self, messages: Sequence[Message], *, pinned: bool) -> list[Content]:
        """The model's answer to a request of ``messages`` (raises for ``"raise"`` and ``"cancel"``)."""
        turn = _turn(messages)
        if messages and messages[-1].role == "user" and (messages[-1].text or "").startswith(RECORD_INSTRUCTION):
            return self._record(turn, messages)
        if pinned:
            if self.obey_pins:
                return [_recall_call(turn, messages)]
            return [Content.from_text("I would rather continue with the task.")]
        if messages[-1].role == "user":
            return [Content.from_function_call(f"call_{turn}", "lookup", arguments={"n": turn})]
        answer = f"done with item {turn}"
        if turn in self.chatty_turns:
            answer += ". " + " ".join(f"Observation {i}: {FILLER}." for i in range(12))
        return [Content.from_text(answer)]

    def _record(self, turn: int, messages: Sequence[Message]) -> list[Content]:
        mode = self.record_answer
        if mode == "raise" or turn in self.failing_turns:
            raise ScriptError("the record request failed at the provider")
        if mode == "cancel":
            raise asyncio.CancelledError("the record request was cancelled")
        if mode == "recall":
            return [_recall_call(turn, messages)]
        if mode == "small_talk":
            return [Content.from_text(SMALL_TALK)]
        if mode == "empty":
            return [Content.from_text("")]
        if mode == "tool":
            return [Content.from_function_call(f"stray_{turn}", "lookup", arguments={"n": turn + 50})]
        return [Content.from_text(quote(messages))]


def _recall_call(turn: int, messages: Sequence[Message]) -> Content:
    return Content.from_function_call(f"rec_{turn}", RECALL_TOOL_NAME, arguments={"values": quote(messages)})


class Provider(FunctionInvocationLayer, ChatMiddlewareLayer, ChatTelemetryLayer, BaseChatClient):
    """The framework's client layers over the scripted model; each request is kept as it arrived."""

    OTEL_PROVIDER_NAME = "scripted"

    def __init__(self, script: Script | None = None) -> None:
        super().__init__()
        self.script = script or Script()
        self.requests: list[Sent] = []
        #: Each request's answer as the shell reads a record from it: a recall call's values, else the text.
        self.answers: list[str] = []

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        sent = Sent(
            number=len(self.requests) + 1,
            messages=tuple(render(m) for m in messages),
            canonical=(*(render(m, ids=False) for m in messages), render_options(options)),
            ids=tuple(m.message_id for m in messages),
            texts=tuple(m.text or "" for m in messages),
            call_ids=frozenset(c.call_id for m in messages for c in m.contents if c.call_id),
            options=dict(options),
            stream=stream,
            tokens=tuple(ESTIMATOR.count_message_tokens(m) for m in messages),
        )
        self.requests.append(sent)
        self.answers.append("")
        contents = self.script.answer(messages, pinned=sent.pinned)
        values = [c.arguments for c in contents if c.type == "function_call" and c.name == RECALL_TOOL_NAME]
        text = "".join(c.text or "" for c in contents if c.type == "text")
        self.answers[-1] = str(values[0]["values"]) if values and isinstance(values[0], Mapping) else text
        response = ChatResponse(messages=[Message("assistant", contents)], response_id=f"r{sent.number}")
        if not stream:
            hangs = sent.asks_record and self.script.record_answer == "hang"

            async def whole() -> ChatResponse:
                await asyncio.sleep(3_600 if hangs else 0)  # a provider that never answers a record request
                return response

            return whole()
        return ResponseStream(_updates(response), finalizer=ChatResponse.from_updates)


async def _updates(response: ChatResponse) -> Any:
    for message in response.messages:
        await asyncio.sleep(0)
        yield ChatResponseUpdate(role="assistant", contents=list(message.contents), response_id=response.response_id)


_QUESTION: Final = re.compile(r"^question (\d+):")


def _turn(messages: Sequence[Message]) -> int:
    """The number of the user question the request answers (its last question)."""
    for message in reversed(messages):
        found = _QUESTION.match(message.text or "") if message.role == "user" else None
        if found:
            return int(found.group(1))
    return -1


def question(n: int) -> str:
    return f"question {n}: what does the lookup of item {n} say about the rollout? " + "Context. " * 10


def faithful_summary(transcript: str, shown: str) -> str:
    """A summary the coverage rule keeps: the codes ``shown`` carries, or, when it carries none, the opening words of
    the transcript (something of what the turns say)."""
    values = distinctive_values(shown)
    if values:
        return "Summary: " + " ".join(values)
    return "Summary: " + " ".join(transcript.split()[:8])


class Summarizer(BaseChatClient):
    """The user half's summarizer: the transcript's codes (or its opening words), counted."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse]:
        self.calls += 1
        text = faithful_summary(messages[-1].text or "", " ".join(m.text or "" for m in messages))

        async def answer() -> ChatResponse:
            return ChatResponse(messages=[Message("assistant", [Content.from_text(text)])])

        return answer()


# --- wiring ---------------------------------------------------------------------------------------------


def build_stack(
    kind: Kind, record_request: Literal["pinned", "cached_prefix"], *, fallback_fraction: float = 0.9
) -> CompactionStack:
    """The README's stack: the record strategy (alone, or in the composition), its gate and recall middleware."""
    return make_builder(
        kind,
        BUDGET,
        TOKENIZER,
        Summarizer(),
        record_request=record_request,
        keep_head_groups=1,
        keep_tail_groups=1,
        fallback_fraction=fallback_fraction,
    )()


def make_lookup(invoked: list[int]) -> FunctionTool:
    """The scenario's tool; ``invoked`` lists every item it was run for."""

    @tool(approval_mode="never_require")
    def lookup(n: int) -> str:
        """Look up an item's rollout codes."""
        invoked.append(n)
        return lookup_result(n)

    return lookup


HARNESS_OFF: Final[Mapping[str, Any]] = {"disable_todo": True, "disable_mode": True}


@dataclass
class Conversation:
    """One conversation: the provider, the stack, the agent and its session."""

    client: Provider
    stack: CompactionStack
    agent: Any
    session: AgentSession
    invoked: list[int] = field(default_factory=list[int])
    replies: list[str] = field(default_factory=list[str])
    #: Options every run passes (``None``: the agent's own).
    options: Mapping[str, Any] | None = None
    #: After each turn: the requests sent so far, and stored history's included messages (rendered) with their ids.
    turn_ends: list[tuple[int, list[str], list[str | None]]] = field(
        default_factory=list[tuple[int, list[str], list[str | None]]]
    )

    @property
    def sent(self) -> list[Sent]:
        return self.client.requests

    @property
    def records(self) -> ToolResultAnchoredSummarizationCompactionStrategy:
        return self.stack.tool_results

    async def turn(self, n: int, *, stream: bool = False) -> None:
        options = {} if self.options is None else {"options": dict(self.options)}
        if stream:
            run = self.agent.run(question(n), session=self.session, stream=True, **options)
            async for _ in run:
                pass
            response = await run.get_final_response()
        else:
            response = await self.agent.run(question(n), session=self.session, **options)
        self.replies.append(response.text)
        included = [m for m in self.stored() if not excluded(m)]
        self.turn_ends.append((len(self.sent), [render(m) for m in included], [m.message_id for m in included]))

    async def play(self, turns: range, *, stream: bool = False) -> Conversation:
        for n in turns:
            await self.turn(n, stream=stream)
        return self

    def stored(self) -> list[Message]:
        return list(self.session.state["in_memory"]["messages"])


def agent_for(
    client: Provider,
    stack: CompactionStack,
    invoked: list[int],
    harness: Mapping[str, Any],
    *,
    recall_tool: bool = True,
) -> Any:
    return create_harness_agent(
        client,
        agent_instructions="Answer from the lookups.",
        tools=[make_lookup(invoked), *([make_recall_tool(stack.gate)] if recall_tool else [])],
        middleware=[stack.recall],
        before_compaction_strategy=stack.strategy,
        after_compaction_strategy=stack.strategy,
        tokenizer=TOKENIZER,
        disable_web_search=True,
        disable_file_memory=True,
        **harness,
    )


def conversation(
    kind: Kind = "records",
    *,
    record_request: Literal["pinned", "cached_prefix"] = "cached_prefix",
    client: Provider | None = None,
    harness: Mapping[str, Any] = HARNESS_OFF,
    fallback_fraction: float = 0.9,
) -> Conversation:
    client = client or Provider()
    stack = build_stack(kind, record_request, fallback_fraction=fallback_fraction)
    invoked: list[int] = []
    agent = agent_for(client, stack, invoked, harness)
    return Conversation(client, stack, agent, agent.create_session(), invoked)


def restored(old: Conversation, kind: Kind) -> Conversation:
    """A fresh replica of ``old``: new provider, stack and agent; the session and stack state through JSON."""
    client = Provider(old.client.script)
    data = json.loads(json.dumps(old.stack.to_dict()))
    session = AgentSession.from_dict(json.loads(json.dumps(old.session.to_dict())))
    stack = build_stack(kind, "cached_prefix").from_dict(data)
    invoked: list[int] = []
    agent = agent_for(client, stack, invoked, HARNESS_OFF)
    return Conversation(client, stack, agent, session, invoked)


def asked(sent: Sequence[Sent]) -> list[int]:
    """0-based indices of the requests that asked for a record over the cached prefix."""
    return [i for i, s in enumerate(sent) if s.asks_record]


def written_records(stored: Sequence[Message]) -> list[tuple[int, Message]]:
    """(index, message) of every written record in ``stored``."""
    return [(i, m) for i, m in enumerate(stored) if m.additional_properties.get(WRITTEN_RECORD_KEY) is True]


def excluded(message: Message) -> bool:
    return bool(message.additional_properties.get(EXCLUDED_KEY))


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings_seen() -> Iterator[list[str]]:
    handler = Capture()
    logger = logging.getLogger("maf_compaction")
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


_PLAYED: dict[tuple[object, ...], Conversation] = {}


async def played(kind: Kind, *, stream: bool = False, harness: bool = False) -> Conversation:
    """The reference conversation (every answer faithful), played once per test session."""
    key = (kind, stream, harness)
    if key not in _PLAYED:
        with tempfile.TemporaryDirectory(prefix="maf-cached-prefix-") as directory, contextlib.chdir(directory):
            switches: Mapping[str, Any] = {} if harness else HARNESS_OFF
            _PLAYED[key] = await conversation(kind, harness=switches).play(range(TURNS), stream=stream)
    return _PLAYED[key]


def content_of(rendered: str) -> list[dict[str, Any]]:
    """The contents of a rendered message."""
    return json.loads(rendered)["contents"]


def role_of(rendered: str) -> str:
    return json.loads(rendered)["role"]


def result_ids(rendered: Sequence[str]) -> list[str]:
    """Call ids of the tool results in rendered messages, in order."""
    return [c["call_id"] for m in rendered for c in content_of(m) if c["type"] == "function_result"]


def prompt_of(sent: Sent) -> str:
    """Everything a request shows the model (results included), for value lookups."""
    return "\n".join(sent.messages)


# --- 1. no pin, and the record request is the conversation's request plus one instruction ------------------

#: (kind, streaming, the harness's todo and mode providers on)
CELLS: Final[list[tuple[Kind, bool, bool]]] = [
    ("records", False, False),
    ("records", True, False),
    ("composition", False, False),
    ("composition", True, False),
    ("records", False, True),
]


def _cell_id(kind: Kind, stream: bool, harness: bool) -> str:
    return f"{kind}-{'stream' if stream else 'blocking'}{'-todo-mode' if harness else ''}"


# PORT-QUESTION: fails for the "records" kind (the composition's runs pass). A record due on a run's follow-up
# request (turn 8's, request 20) is asked over the list the framework's function loop hands that pass, which is the
# run's own list without the exclusions the run's first pass made (record 2's groups, call_4 to call_6, are not
# excluded there): src/core/records.step asks over ``history`` as handed in (``ask_over``), no longer over the prompt
# as it stands (the old ``_standing`` pass replayed the decisions that stand). So request 20 is no prefix of request
# 19 (a cache miss), shows call_4 again (already covered by record 2) and never shows lookup 7, which then stays
# uncovered to the end (before: request 20 was request 19 whole and covered lookup 7). ``records.step``'s own comment
# says the history handed in is "the last request and what came since"; on a follow-up request it is not: src, not
# this test, seems wrong.
@pytest.mark.parametrize(("kind", "stream", "harness"), CELLS, ids=[_cell_id(*c) for c in CELLS])
async def test_no_request_is_pinned_and_each_record_request_is_the_last_request_plus_the_instruction(
    kind: Kind, stream: bool, harness: bool
) -> None:
    """At ``_inner_get_response``: the longest prefix, cut between groups, of the prompt as it stands (the previous
    request's messages, then what arrived since, exactly as stored) whose messages send no more than the previous
    request's did and fit the budget with the instruction (the strategy's tokenizer counting), then one
    instruction; the previous request's options unchanged. So the previous request's messages (a provider's context
    aside) or, when they do not fit the budget with the instruction, a prefix of them; never what arrived since.

    The framework names the agent on a reply it stores after a run (``author_name``), which the conversation's own
    next request shows too: authors are compared against stored history, not against the previous request. A
    record asked on a run's follow-up request shows the run's call and result as that request carries them (not
    yet named: the run is not stored yet).
    """
    run = await played(kind, stream=stream, harness=harness)
    assert len(asked(run.sent)) >= 2, f"expected two records asked over the cached prefix, got {asked(run.sent)}"
    check_record_requests(run)
    assert len(run.invoked) == len(set(run.invoked)), "a tool ran for a record request"
    assert set(run.invoked) <= set(range(TURNS)), "a tool ran that the conversation did not call"


@pytest.mark.parametrize("kind", KINDS)
async def test_the_conversations_requests_still_end_with_what_the_conversation_ends_with(kind: Kind) -> None:
    """A record stands right before the conversation's newest group, never at its end: each turn's two requests
    end with the turn's question, then with its lookup's result; a written record is always followed by a
    message of the conversation itself (the question, or the call of the group that was newest when it was
    asked); and every question gets its lookup."""
    run = await played(kind)
    own = [s for s in run.sent if not s.asks_record]
    endings = [(_turn_of(s), role_of(s.messages[-1]), _ending(s.messages[-1])) for s in own]
    expected = [e for n in range(TURNS) for e in ((n, "user", question(n)), (n, "tool", f"call_{n}"))]
    assert endings == expected, "a request of the conversation does not end with what the conversation ends with"
    for s in own:
        for k, text in enumerate(s.texts):
            if not text.startswith(RECORD_MARKER):
                continue
            assert k + 1 < len(s.messages), f"request {s.number} ends with a written record"
            following = s.messages[k + 1]
            assert not s.texts[k + 1].startswith(RECORD_MARKER), f"request {s.number}: two records in a row"
            assert role_of(following) == "user" or [c for c in content_of(following) if c["type"] == "function_call"], (
                f"request {s.number}: the record is not followed by the conversation's question or call"
            )
    assert asked(run.sent), "no record was asked"
    assert run.invoked == list(range(TURNS)), "a question went without its lookup"


def _ending(rendered: str) -> str:
    """A user message's text, or the call id of a tool message's one result."""
    contents = content_of(rendered)
    if role_of(rendered) == "user":
        return "".join(c["text"] for c in contents if c["type"] == "text")
    (result,) = [c["call_id"] for c in contents if c["type"] == "function_result"]
    return result


async def test_a_record_due_with_the_fallback_is_asked_over_the_request_as_it_stands() -> None:
    """The fallback is due (over ``fallback_fraction``) on the request a record rides on: the record is asked over
    the prompt as it stands, before the pass decides anything new, cut to what the last request sent (the fallback's
    share of the budget bounds nothing once a request was seen): request 8 whole, without turn 3's answer and
    question 4, which arrived since. The record covers the four lookups whole and stands before question 4."""
    run = await conversation(fallback_fraction=0.75).play(range(6))
    check_record_requests(run)
    sent, stored = run.sent, run.stored()
    assert asked(sent) == [8], f"one record covers the lookups; asked at {asked(sent)}"
    ask, last = sent[8], sent[7]
    assert list(map(_anonymous, ask.messages[:-1])) == list(map(_anonymous, last.messages))
    assert ask.size - INSTRUCTION_TOKENS == last.size == prefix_limit(run, last)
    assert ask.size > int(BUDGET * 0.75), "the request over the cached prefix kept to the fallback's share"
    assert ask.call_ids == {f"call_{n}" for n in range(4)}
    ((index, _),) = written_records(stored)
    assert stored[index - 1].text == "done with item 3"
    assert stored[index + 1].text == question(4)
    assert run.records.groups_covered == 4


def check_record_requests(run: Conversation) -> None:
    """See the test above: no pin, and each record request repeats the conversation's last request (or the longest
    prefix of it, cut between groups, that fits :func:`prefix_limit`)."""
    sent = run.sent
    assert not [s.number for s in sent if s.pinned], "a request was pinned to the recall tool"
    assert all(s.options.get("tool_choice") in (None, "auto") for s in sent)
    assert run.stack.recall.forced_calls == 0
    asks = asked(sent)
    stored_messages = run.stored()
    stored = [render(m) for m in stored_messages]
    known = {_anonymous(m) for m in stored}
    ours = {render(m) for m in stored_messages if _ours(m)}  # records, summaries and notes compaction wrote
    for i in asks:
        ask, previous, carrier = sent[i], sent[i - 1], sent[i + 1]
        assert not previous.asks_record
        assert not carrier.asks_record
        sizes = _sizes(stored_messages, previous, ask, carrier)
        # Context the agent's providers add to a call (the harness's todo list joins a run's first call) is
        # never stored: the record request carries the context of the call it rides on.
        context, own = _split(ask.messages[:-1], known)
        assert context == _split(carrier.messages, known)[0]
        before = _split(previous.messages, known)[1]
        # Each message as stored, except what arrived within the run the record request rides on (the function
        # loop's call and result after the run's question, when the record is asked on the run's follow-up
        # request): the framework names the agent on those only when it stores the run, so they stand as the
        # request the pass ran in carries them, byte for byte, and differ from stored history by the author.
        carrier_run = carrier.messages[max(k for k, m in enumerate(carrier.messages) if _is_question(m)) + 1 :]
        unstored = [m for m in own if m not in stored]
        assert all(m in carrier_run for m in unstored), "a message of the record request is not as stored"
        for m in unstored:
            assert json.loads(m)["author"] is None
            assert role_of(m) in ("assistant", "tool")
        # The prompt as it stands: the previous request's messages, then what arrived since (exactly as stored;
        # what compaction wrote later aside), up to the conversation's end when the pass ran.
        standing = _standing(before, _split(carrier.messages, known)[1], stored, ours, own)
        # The record request is the longest prefix of that prompt, ending between two groups, whose messages fit
        # the limit: the group the cut leaves out would pass it. What arrived since the previous request is never
        # sent (the previous request's size is the limit); the previous request's messages are, whole, when they fit
        # the budget with the instruction (and no context of the call the record rides on adds to them).
        assert list(map(_anonymous, own)) == list(map(_anonymous, standing[: len(own)])), (
            f"request {ask.number} is not a prefix of request {previous.number} and what arrived since"
        )
        assert ask.tokens[-1] == INSTRUCTION_TOKENS
        limit, sends = prefix_limit(run, previous), ask.size - INSTRUCTION_TOKENS
        assert sends <= limit, f"request {ask.number} sends {sends} tokens besides the instruction, over {limit}"
        assert len(own) <= len(before) < len(standing), f"request {ask.number} sends what arrived since"
        assert role_of(standing[len(own)]) != "tool", "the cut separates a call from its result"
        assert not [c for c in content_of(own[-1]) if c["type"] == "function_call"]
        left_out = sum(sizes[_anonymous(m)] for m in _group_at(standing, len(own)))
        assert sends + left_out > limit, (
            f"request {ask.number} ({sends} tokens) leaves out a group of {left_out} that fits {limit}"
        )
        if not context and previous.size <= run.records.max_input_tokens - INSTRUCTION_TOKENS:
            assert len(own) == len(before), f"request {ask.number} is not request {previous.number} whole"
        # And exactly one instruction, a plain user message at the end.
        assert role_of(ask.messages[-1]) == "user"
        assert content_of(ask.messages[-1]) == [
            {"type": "text", "text": RECORD_INSTRUCTION, "additional_properties": {}}
        ]
        assert sum(t == RECORD_INSTRUCTION for t in ask.texts) == 1
        # The head: the previous request's options, unchanged (instructions, tools, tool_choice, the rest),
        # which are also the options of the request the pass ran in.
        check_capped(ask.options, previous.options)
        assert render_options(ask.options) == render_options(carrier.options)
        assert ask.options.get("instructions"), "the instructions did not reach the record request"
        assert {tool_spec(t)["name"] for t in ask.options["tools"]} >= {"lookup", RECALL_TOOL_NAME}
        assert ask.stream is False, "a record request is sent whole"


def prefix_limit(run: Conversation, last: Sent) -> int:
    """The most the messages of a request over the cached prefix may send after ``last``, the conversation's last
    request (by the strategy's tokenizer, the instruction aside): what ``last`` sent, and never past the budget with
    the instruction."""
    return min(run.records.max_input_tokens - INSTRUCTION_TOKENS, last.size)


def _sizes(stored: Sequence[Message], *requests: Sent) -> dict[str, int]:
    """Tokens of every message of ``stored`` and ``requests``, by its rendering without author (the same message
    counts the same wherever it stands; an author is no prompt text the strategies count)."""
    sizes: dict[str, int] = {}
    measured = [(render(m), ESTIMATOR.count_message_tokens(m)) for m in stored]
    for rendered, tokens in [*measured, *((m, t) for r in requests for m, t in zip(r.messages, r.tokens, strict=True))]:
        assert sizes.setdefault(_anonymous(rendered), tokens) == tokens, f"one message counts two sizes: {rendered}"
    return sizes


def _group_at(prompt: Sequence[str], k: int) -> list[str]:
    """The group starting at ``prompt[k]``: a tool call and the results after it, or one message."""
    end = k + 1
    if any(c["type"] == "function_call" for c in content_of(prompt[k])):
        while end < len(prompt) and role_of(prompt[end]) == "tool":
            end += 1
    return list(prompt[k:end])


def _standing(before: list[str], carrier: list[str], stored: list[str], ours: set[str], own: list[str]) -> list[str]:
    """``before`` and the stored messages after its last one, up to the last one ``carrier`` holds."""
    history = [m for m in stored if m not in ours or m in own]
    anonymous = [_anonymous(m) for m in history]
    start = anonymous.index(_anonymous(before[-1]))
    last = next(m for m in reversed(carrier) if m not in ours)
    end = anonymous.index(_anonymous(last))
    return [*before, *history[start + 1 : end + 1]]


def _is_question(rendered: str) -> bool:
    """A user's question of the scripted conversation."""
    return role_of(rendered) == "user" and any(
        c["type"] == "text" and _QUESTION.match(c["text"]) for c in content_of(rendered)
    )


def _ours(message: Message) -> bool:
    props = message.additional_properties
    return WRITTEN_RECORD_KEY in props or NOTE_KEY in props or is_summary(message)


def _split(messages: Sequence[str], known: set[str]) -> tuple[list[str], list[str]]:
    """(context a provider added for the call, the conversation's messages)."""
    context = [m for m in messages if _anonymous(m) not in known]
    return context, [m for m in messages if _anonymous(m) in known]


def _anonymous(rendered: str) -> str:
    return json.dumps({**json.loads(rendered), "author": None}, sort_keys=True)


class Watching(Provider):
    """The scripted provider, which also keeps the recall state each record request was asked with."""

    def __init__(self, script: Script | None = None) -> None:
        super().__init__(script)
        #: The stack whose record strategy asks (set once the conversation is built).
        self.stack: CompactionStack | None = None
        #: By the 0-based index of a request that asks for a record: the recall state when it arrived.
        self.recall_at: dict[int, RecallState] = {}

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        if self.stack is not None and messages and (messages[-1].text or "").startswith(RECORD_INSTRUCTION):
            self.recall_at[len(self.requests)] = self.stack.tool_results.conversation.value.recall
        return super()._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)


# PORT-QUESTION: fails for the "records" kind (the composition's runs pass). A record due on a run's follow-up
# request (turn 8's, request 20) is asked over the list the framework's function loop hands that pass, which is the
# run's own list without the exclusions the run's first pass made (record 2's groups, call_4 to call_6, are not
# excluded there): src/core/records.step asks over ``history`` as handed in (``ask_over``), no longer over the prompt
# as it stands (the old ``_standing`` pass replayed the decisions that stand). So request 20 is no prefix of request
# 19 (a cache miss), shows call_4 again (already covered by record 2) and never shows lookup 7, which then stays
# uncovered to the end (before: request 20 was request 19 whole and covered lookup 7). ``records.step``'s own comment
# says the history handed in is "the last request and what came since"; on a follow-up request it is not: src, not
# this test, seems wrong.
@pytest.mark.parametrize("kind", KINDS)
async def test_a_request_over_the_cached_prefix_sends_at_most_what_the_last_request_sent(kind: Kind) -> None:
    """The rule itself. The messages of a request over the cached prefix send at most
    ``RecordConfig.prefix_tokens(recall_state, instruction)`` tokens (the strategy's tokenizer): what the
    conversation's last request sent (the recall middleware's last ``HistorySeen``), never past the budget with the
    instruction; before any request was seen, the fallback's share of the budget less the instruction. So with room
    the record request is the last request whole, not what arrived since; when the last request does not fit the
    budget with the instruction (the records run's request 17), it is the longest prefix of it, cut between groups,
    that does. The fallback's share bounds nothing once a request was seen: with ``fallback_fraction=0.7`` the
    conversation sends exactly what it sends with ``0.9``."""
    client = Watching()
    run = conversation(kind, client=client, fallback_fraction=0.7)
    client.stack = run.stack
    await run.play(range(TURNS))
    check_record_requests(run)
    sent, room = run.sent, BUDGET - INSTRUCTION_TOKENS
    assert [s.canonical for s in sent] == [s.canonical for s in (await played(kind)).sent]
    asks = asked(sent)
    assert asks == ([8, 17, 19] if kind == "records" else [8, 17]), f"records asked at {asks}"
    config = run.records.config
    assert config.prefix_tokens(RecallState(), INSTRUCTION_TOKENS) == int(BUDGET * 0.7) - INSTRUCTION_TOKENS
    for i in asks:
        ask, last = sent[i], sent[i - 1]
        recall = client.recall_at[i]
        assert recall.seen is not None
        assert recall.seen.included_tokens == last.size, "the recall state did not see the last request's size"
        limit = config.prefix_tokens(recall, INSTRUCTION_TOKENS)
        assert limit == prefix_limit(run, last) == min(room, last.size)
        sends, own = ask.size - INSTRUCTION_TOKENS, ask.messages[:-1]
        assert sends <= last.size, f"request {ask.number} sends {sends} tokens, request {last.number} {last.size}"
        assert ask.size <= BUDGET
        assert list(map(_anonymous, own)) == list(map(_anonymous, last.messages[: len(own)])), (
            f"request {ask.number} is no prefix of request {last.number}"
        )
        check_capped(ask.options, last.options)
        if last.size <= room:  # with room: the last request whole, and nothing that arrived since
            assert len(own) == len(last.messages)
            assert sends == last.size
            assert not (sent[i + 1].call_ids - last.call_ids) & ask.call_ids
            continue
        # Past the room: the longest prefix of the last request, cut between groups, that fits it.
        assert len(own) < len(last.messages)
        assert role_of(last.messages[len(own)]) != "tool", "the cut separates a call from its result"
        assert not [c for c in content_of(own[-1]) if c["type"] == "function_call"], "the cut follows a call"
        left_out = len(_group_at(last.messages, len(own)))
        assert sends + sum(last.tokens[len(own) : len(own) + left_out]) > room, "a shorter cut than needed"
    pressed = [i for i in asks if sent[i - 1].size > room]
    assert pressed == ([17] if kind == "records" else [])
    if kind == "records":  # request 18 leaves out lookup 7, the last group of request 17
        assert sent[17].messages[:-1] == sent[16].messages[:-2]
        assert "call_7" in sent[16].call_ids - sent[17].call_ids


async def test_the_first_record_request_is_what_a_conversation_that_keeps_no_record_sends_next() -> None:
    """Until the first record, a conversation whose model ignores the instruction is the same conversation:
    its next request is the record request without the instruction, then what arrived since the request before
    it (turn 3's answer and question 4), which the record request does not send (content ids aside: another run)."""
    faithful = await played("records")
    ignoring = await conversation(client=Provider(Script(record_answer="small_talk"))).play(range(6))
    first = asked(faithful.sent)[0]
    assert asked(ignoring.sent)[0] == first
    assert [s.canonical for s in ignoring.sent[: first + 1]] == [s.canonical for s in faithful.sent[: first + 1]]
    ask, following = faithful.sent[first], ignoring.sent[first + 1]
    cut = len(ask.canonical) - 2  # the record request's messages, its instruction and head aside
    assert following.canonical[:cut] == ask.canonical[:cut]
    assert following.canonical[-1] == ask.canonical[-1]
    arrived = following.canonical[cut:-1]
    assert [c["text"] for m in arrived for c in content_of(m)] == ["done with item 3", question(4)]


def _turn_of(sent: Sent) -> int:
    return max(int(m.group(1)) for t in sent.texts if (m := _QUESTION.match(t)))


# --- 1, on the wire: the real OpenAI clients against the loopback server ------------------------------------

WIRE_MODES: Final[list[tuple[ClientKind, bool]]] = [
    ("openai-responses", False),
    ("openai-responses", True),
    ("openai-chat", False),
    ("openai-chat", True),
]
WIRE_IDS: Final = ["responses", "responses-stream", "chat", "chat-stream"]
#: Body fields that only steer transport: a record request is sent whole whatever the conversation streams.
STREAMING_FIELDS: Final = ("stream", "stream_options")
#: Where each OpenAI wire puts the output cap a request over the cached prefix sets (no cache key of the provider).
WIRE_CAPS: Final = ("max_output_tokens", "max_completion_tokens", "max_tokens")


class WireModel(ScriptedModel):
    """The loopback server's model: :class:`Script` over the messages the server parsed from the wire."""

    def __init__(self, script: Script) -> None:
        super().__init__(generate(GeneratorOptions(context_window=8_192, fill=1.0, tool_turns=1)))
        self.script = script

    def reply(
        self,
        messages: Sequence[Message],
        *,
        tool_choice: object = None,
        max_tokens: int | None = None,
        summarizer: bool = False,
    ) -> Reply:
        del max_tokens, summarizer
        conversation = [m for m in messages if m.role != "system"]
        pinned = pinned_function(tool_choice) == RECALL_TOOL_NAME
        asked = bool(conversation) and (conversation[-1].text or "").startswith(RECORD_INSTRUCTION)
        message = Message("assistant", self.script.answer(conversation, pinned=pinned))
        return Reply(message, "record" if asked or pinned else TASK, instruction=asked)


@pytest.mark.parametrize(("kind", "stream"), WIRE_MODES, ids=WIRE_IDS)
async def test_on_the_wire_the_record_request_repeats_the_last_body_and_appends_one_instruction(
    kind: ClientKind, stream: bool
) -> None:
    """The JSON bodies the real client sent: the record request's input (Responses) or messages (Chat
    Completions) are the previous body's, item for item (or a prefix of them cut between groups, when they do not
    fit the budget with the instruction; never what arrived since), then one user item with the instruction;
    every other field is the previous body's (``stream`` aside).

    Two fields the framework itself changes between a run's requests and the next run's (it re-ids a stored
    function call item, and names the agent on a stored reply) are compared apart: a Responses item's ``id``
    (an API reference, not prompt text) and a Chat message's ``name``. The conversation's own next request
    carries the same changes.
    """
    provider = SimulatedProvider(encoder=offline_tiktoken(), window=8_192, profile=get_profile("default"))
    stack = build_stack("records", "cached_prefix")
    invoked: list[int] = []
    async with LoopbackProvider(WireModel(Script()), provider, id_seed=0) as server:
        client = make_client(kind, server.base_url("model"))
        try:
            agent = Agent(
                client,
                instructions="Answer from the lookups.",
                tools=[make_lookup(invoked), make_recall_tool(stack.gate)],
                middleware=[stack.recall],
                compaction_strategy=stack.strategy,
                default_options=agent_options(kind),  # pyright: ignore[reportArgumentType]
            )
            session = agent.create_session()
            for n in range(TURNS):
                if stream:
                    await agent.run(question(n), session=session, stream=True).get_final_response()
                else:
                    await agent.run(question(n), session=session)
        finally:
            await close_client(client)
        bodies = list(server.requests)
    key = "input" if kind == "openai-responses" else "messages"
    asks = [i for i, body in enumerate(bodies) if _wire_text(body[key][-1]) == RECORD_INSTRUCTION]
    assert len(asks) >= 2, f"expected two records asked over the cached prefix, got asks at {asks}"
    assert stack.recall.forced_calls == 0
    for body in bodies:
        assert body.get("tool_choice") in (None, "auto"), f"a request was pinned: {body.get('tool_choice')!r}"
    for i in asks:
        ask, previous = bodies[i], bodies[i - 1]
        items, before = ask[key], previous[key]
        own = items[:-1]
        assert len(own) <= len(before), f"request {i + 1} sends more than request {i}"
        assert _stable(own) == _stable(before[: len(own)]), f"request {i + 1} is no prefix of request {i}"
        if len(own) < len(before):  # cut between groups to fit the budget with the instruction
            assert not _wire_result(before[len(own)]), "the cut separates a call from its result"
            assert not _wire_call(own[-1]), "the cut separates a call from its result"
            assert own[-1].get("type") != "reasoning", "the cut separates reasoning from what it reasoned"
        assert all(_wire_text(item) != RECORD_INSTRUCTION for item in items[:-1])
        last = items[-1]
        assert last.get("role") == "user"
        assert _wire_text(last) == RECORD_INSTRUCTION
        head = {k: v for k, v in ask.items() if k not in (key, *STREAMING_FIELDS, *WIRE_CAPS)}
        assert head == {k: v for k, v in previous.items() if k not in (key, *STREAMING_FIELDS, *WIRE_CAPS)}
        assert [k for k in WIRE_CAPS if k in ask], "the record request carries no output cap"
        assert head.get("instructions" if kind == "openai-responses" else "model")
        assert not ask.get("stream")
        assert bool(previous.get("stream")) is stream
    whole = [i for i in asks if len(bodies[i][key]) == len(bodies[i - 1][key]) + 1]
    assert whole, "no record request repeats the previous body whole"
    # The answer became a record: the next body carries it, and no longer the results it covers.
    after = bodies[asks[0] + 1][key]
    assert any(RECORD_MARKER in _wire_text(item) for item in after)
    assert len(invoked) == len(set(invoked)), "a tool ran for a record request"


#: Fields the framework changes on stored messages between runs (see the test above).
VOLATILE_FIELDS: Final = ("id", "name")


def _stable(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Wire items without :data:`VOLATILE_FIELDS` (a function call's ``name`` is inside its ``function``)."""
    return [
        {
            k: v
            for k, v in item.items()
            if k not in VOLATILE_FIELDS or (item.get("type") == "function_call" and k == "name")
        }
        for item in items
    ]


def _wire_result(item: Mapping[str, Any]) -> bool:
    """A tool result: a Responses ``function_call_output`` item or a Chat ``tool`` message."""
    return item.get("type") == "function_call_output" or item.get("role") == "tool"


def _wire_call(item: Mapping[str, Any]) -> bool:
    """A tool call: a Responses ``function_call`` item or a Chat message with ``tool_calls``."""
    return item.get("type") == "function_call" or bool(item.get("tool_calls"))


def _wire_text(item: Mapping[str, Any]) -> str:
    """The text of a wire input item or message (its text parts joined)."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [part.get("text") for part in content if isinstance(part, Mapping)]  # pyright: ignore[reportUnknownVariableType, reportUnknownMemberType]
        return "".join(p for p in parts if isinstance(p, str))
    return ""


# --- 2. the answer enters history as a written record; covered groups leave; sessions restore ------------------


# PORT-QUESTION: fails for the "records" kind (the composition's runs pass). A record due on a run's follow-up
# request (turn 8's, request 20) is asked over the list the framework's function loop hands that pass, which is the
# run's own list without the exclusions the run's first pass made (record 2's groups, call_4 to call_6, are not
# excluded there): src/core/records.step asks over ``history`` as handed in (``ask_over``), no longer over the prompt
# as it stands (the old ``_standing`` pass replayed the decisions that stand). So request 20 is no prefix of request
# 19 (a cache miss), shows call_4 again (already covered by record 2) and never shows lookup 7, which then stays
# uncovered to the end (before: request 20 was request 19 whole and covered lookup 7). ``records.step``'s own comment
# says the history handed in is "the last request and what came since"; on a follow-up request it is not: src, not
# this test, seems wrong.
@pytest.mark.parametrize("kind", KINDS)
async def test_the_answer_enters_history_as_a_written_record_right_before_the_conversations_newest_group(
    kind: Kind,
) -> None:
    """The record stands right before the newest group the conversation had when it was asked (its question, or
    its newest lookup call and result; so the prompt before it is the request the provider cached, and the request
    still ends with what the conversation ends with), in stored history and in the request of the same pass."""
    run = await played(kind)
    stored = run.stored()
    asks = asked(run.sent)
    records = written_records(stored)
    assert len(records) == len(asks), f"{len(asks)} record request(s), {len(records)} written record(s)"
    assert run.records.records_in_conversation == len(asks)
    for (index, message), i in zip(records, asks, strict=True):
        answer = run.client.answers[i]
        assert answer.startswith("lookup values: ")
        assert message.role == "assistant"
        assert message.text == f"{RECORD_PREFIX}\n{answer}"
        assert message.text.startswith(RECORD_MARKER)
        assert (message.message_id or "").startswith("compaction_record_")
        assert not excluded(message), "a written record is held in the prompt"
        # Where it stands: before the conversation's newest group when the pass ran (the last group of the
        # request the pass ran in: its question, or its lookup call and result), in both lists.
        carrier = run.sent[i + 1]
        rendered = render(message)
        assert rendered in carrier.messages, f"request {carrier.number} lacks the record it asked for"
        at = carrier.messages.index(rendered)
        newest = carrier.messages[at + 1 :]
        assert [role_of(m) for m in newest] in (["user"], ["assistant", "tool"]), (
            f"request {carrier.number}: the record does not stand right before the newest group"
        )
        before = next(m for m in reversed(stored[:index]) if not _ours(m))
        assert _anonymous(render(before)) == _anonymous(carrier.messages[at - 1])
        # What follows it in stored history is that group (a summary the user half wrote later aside).
        after = [m for m in stored[index + 1 :] if not _ours(m)][: len(newest)]
        assert list(map(_anonymous, map(render, after))) == list(map(_anonymous, newest))
        # The answer is in history only as the record.
        assert [m for m in stored if answer in (m.text or "")] == [message]
    # The request itself never is: no instruction, no reply to it (small talk, a call), only what compaction wrote.
    assert not [m for m in stored if RECORD_INSTRUCTION in (m.text or "")]
    assert not [m for m in stored if m.role == "user" and not _ours(m) and not _QUESTION.match(m.text or "")]
    assert run.replies == [f"done with item {n}" for n in range(TURNS)]


# PORT-QUESTION: fails for the "records" kind (the composition's runs pass). A record due on a run's follow-up
# request (turn 8's, request 20) is asked over the list the framework's function loop hands that pass, which is the
# run's own list without the exclusions the run's first pass made (record 2's groups, call_4 to call_6, are not
# excluded there): src/core/records.step asks over ``history`` as handed in (``ask_over``), no longer over the prompt
# as it stands (the old ``_standing`` pass replayed the decisions that stand). So request 20 is no prefix of request
# 19 (a cache miss), shows call_4 again (already covered by record 2) and never shows lookup 7, which then stays
# uncovered to the end (before: request 20 was request 19 whole and covered lookup 7). ``records.step``'s own comment
# says the history handed in is "the last request and what came since"; on a follow-up request it is not: src, not
# this test, seems wrong.
@pytest.mark.parametrize("kind", KINDS)
async def test_covered_groups_leave_the_prompt_on_the_recording_pass_and_stay_out(kind: Kind) -> None:
    """The groups a record was shown leave the prompt on the pass that asked, for good. The record stands right
    before the conversation's newest group, which arrived since the last request and so was never shown (a record
    request sends what the last request sent, no more): a lookup there stays in the prompt until a later record
    covers it. When the last request does not fit the budget with the instruction, the record request is cut
    before its last groups: the groups it was not shown stand before the record and stay in the prompt, whole,
    until the next record request shows them."""
    run = await played(kind)
    sent, stored = run.sent, run.stored()
    asks = asked(sent)
    covered_before: set[str] = set()
    newest_kept: set[str] = set()
    unshown_kept: set[str] = set()
    for n, i in enumerate(asks):
        shown = set(result_ids(sent[i].messages))
        record = f"{RECORD_PREFIX}\n{run.client.answers[i]}"
        carrier = sent[i + 1]
        assert record in carrier.texts, f"request {carrier.number} lacks the record"
        after_record = carrier.messages[carrier.texts.index(record) + 1 :]
        # After the record: only the conversation's newest group (the question, or the lookup call and result),
        # which the record request did not show.
        assert [role_of(m) for m in after_record] in (["user"], ["assistant", "tool"])
        newest = set(result_ids(after_record))
        assert not newest & shown, f"record request {sent[i].number} showed the newest group {newest}"
        unshown = set(result_ids(carrier.messages[: carrier.texts.index(record)])) - shown
        covered = shown - covered_before
        assert covered, f"record request {sent[i].number} showed no new result"
        # The pass that asked applies the record to the request it runs in, and every later request keeps it so.
        for later in sent[i + 1 :]:
            assert not covered & later.call_ids, f"request {later.number} still carries {covered & later.call_ids}"
            assert record in later.texts, f"request {later.number} lacks the record"
        # The newest group, and the groups the record was not shown, stay, whole, until the next record request
        # (which is shown them).
        until = asks[n + 1] if n + 1 < len(asks) else len(sent)
        for later in sent[i + 1 : until + 1]:
            kept = newest | unshown
            assert kept <= later.call_ids, f"request {later.number} lost {kept - later.call_ids}"
        if unshown:
            assert until < len(sent), f"no record request after request {carrier.number} shows {unshown}"
            assert unshown <= set(result_ids(sent[until].messages))
        newest_kept |= newest
        unshown_kept |= unshown
        covered_before |= covered
    # Records: the second record is asked on turn 8's first request over request 17 cut before lookup 7's group
    # (request 17 sent more than the budget leaves beside the instruction): it stands before question 8, after
    # lookup 7. The last record is asked on turn 8's follow-up request over request 19 whole: it covers lookup 7 and
    # stands before lookup 8's group, which stays (no later record). Composition: the user half's summaries keep the
    # last request smaller; the second record is asked over request 17 whole, covers lookups 4 to 7 and stands
    # before question 8; there is no third.
    if kind == "records":
        assert [sent[i].number for i in asks] == [9, 18, 20]
        assert sent[16].size > BUDGET - INSTRUCTION_TOKENS
        assert (unshown_kept, newest_kept) == ({"call_7"}, {"call_8"})
    else:
        assert [sent[i].number for i in asks] == [9, 18]
        assert (unshown_kept, newest_kept) == (set(), set())
    assert not newest_kept & covered_before
    assert unshown_kept <= covered_before, "a group a record was not shown stayed uncovered"
    lookups = {f"call_{n}" for n in range(TURNS)}
    assert covered_before, "no group was covered"
    assert covered_before < lookups, "the newest lookups stay until a record covers them"
    assert run.records.groups_covered >= len(covered_before)
    for message in stored:  # covered groups stay stored, excluded, their results intact
        ids = {c.call_id for c in message.contents if c.call_id}
        if ids & covered_before:
            assert excluded(message)
            assert message.additional_properties.get(EXCLUDE_REASON_KEY) == EXCLUDE_REASON
            for c in message.contents:
                if c.type == "function_result":
                    assert c.result == lookup_result(int(str(c.call_id).removeprefix("call_")))
        elif ids & lookups:
            assert not excluded(message), f"{ids} is excluded though no record covers it"


@pytest.mark.parametrize("kind", KINDS)
async def test_stored_history_and_the_in_call_copies_agree(kind: Kind) -> None:
    """After each turn, the included stored messages are the turn's last request (less a provider's context)
    and its answer: the same records, the same exclusions, the same contents and ids."""
    run = await played(kind)
    records = 0
    for turn, (count, included, ids) in enumerate(run.turn_ends):
        last = run.sent[count - 1]
        assert not last.asks_record
        assert list(map(_anonymous, last.messages)) == list(map(_anonymous, included[:-1])), (
            f"after turn {turn}, request {last.number} and stored history differ"
        )
        assert list(last.ids) == ids[:-1], "message ids differ between the request and stored history"
        assert role_of(included[-1]) == "assistant"
        assert content_of(included[-1]) == [{"type": "text", "text": run.replies[turn], "additional_properties": {}}]
        records = max(records, sum(1 for i in ids if (i or "").startswith("compaction_record_")))
    assert records >= 2, "the turns did not end with the written records in both"


def boundaries(reference: Conversation, *, due: bool) -> list[int]:
    """Turn boundaries whose next request asks for a record (``due``), or does not, in ``reference``."""
    asks = set(asked(reference.sent))
    return [b for b in range(1, TURNS) if (reference.turn_ends[b - 1][0] in asks) is due]


async def _restore_at(kind: Kind, boundary: int, reference: Conversation) -> tuple[Conversation, Conversation]:
    first = await conversation(kind).play(range(boundary))
    assert [s.canonical for s in first.sent] == [s.canonical for s in reference.sent[: len(first.sent)]]
    return first, await restored(first, kind).play(range(boundary, TURNS))


@pytest.mark.parametrize("kind", KINDS)
async def test_a_restored_session_continues_with_identical_requests_and_asks_nothing_twice(kind: Kind) -> None:
    """At every turn boundary where no record is due on the next request, the session (``AgentSession.to_dict``)
    and the stack (``CompactionStack.to_dict``) go through JSON to a fresh replica: its requests are the
    uninterrupted conversation's, byte for byte (content ids aside), and no record is asked again."""
    reference = await played(kind)
    restore_at = boundaries(reference, due=False)
    assert len(restore_at) >= 5
    for boundary in restore_at:
        first, second = await _restore_at(kind, boundary, reference)
        rest = reference.sent[len(first.sent) :]
        pairs = enumerate(zip(second.sent, rest, strict=False))
        differs = next((k for k, (a, b) in pairs if a.canonical != b.canonical), None)
        assert differs is None, (
            f"restored after turn {boundary}: request {len(first.sent) + (differs or 0) + 1} differs"
        )
        assert len(second.sent) == len(rest)
        assert asked(first.sent) + [len(first.sent) + i for i in asked(second.sent)] == asked(reference.sent)
        written = record_rules.written(second.records.conversation.value)
        assert len(written) == len(asked(reference.sent))
        assert len({w.identity for w in written}) == len(written), "a record was asked (and written) twice"
        assert _stored_form(second) == _stored_form(reference)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_record_due_on_the_first_request_after_a_restore_is_asked_on_it(kind: Kind) -> None:
    """A restored stack has seen no request sent: the record due on its first request is asked with the head of
    the caller's request (taken on the way in), so the requests are the uninterrupted conversation's."""
    reference = await played(kind)
    due = boundaries(reference, due=True)
    assert due, "the conversation has a record due on a turn's first request"
    for boundary in due:
        first, second = await _restore_at(kind, boundary, reference)
        assert second.sent[0].asks_record, f"restored after turn {boundary}: the due record was not asked"
        assert [s.canonical for s in second.sent] == [s.canonical for s in reference.sent[len(first.sent) :]]


@pytest.mark.parametrize(
    "cached",
    [8, 0],
    ids=["stack-cached", "stack-restored-every-phase"],
)
async def test_a_session_served_through_the_registry_asks_like_the_private_stack(cached: int) -> None:
    """The README's shared-agent wiring (session provider at position 1, session middleware with
    ``compact_before=True``, session recall tool) sends what the private stack sends, records included."""
    reference = await played("records")
    client = Provider()
    registry = SessionCompactionRegistry(lambda: build_stack("records", "cached_prefix"), max_cached_sessions=cached)
    compaction = SessionCompactionProvider(registry, tokenizer=TOKENIZER, before=False)
    invoked: list[int] = []
    agent = create_harness_agent(
        client,
        agent_instructions="Answer from the lookups.",
        tools=[make_lookup(invoked), make_session_recall_tool(registry)],
        middleware=[SessionToolResultRecallMiddleware(registry, compact_before=True)],
        disable_compaction=True,
        context_providers=[compaction],
        tokenizer=TOKENIZER,
        disable_web_search=True,
        disable_file_memory=True,
        **HARNESS_OFF,
    )
    agent.context_providers.remove(compaction)
    agent.context_providers.insert(1, compaction)
    session = agent.create_session()
    for n in range(TURNS):
        await agent.run(question(n), session=session)
    assert asked(client.requests) == asked(reference.sent)
    assert [s.canonical for s in client.requests] == [s.canonical for s in reference.sent]
    with registry.phase(session) as stack:
        assert len(record_rules.written(stack.tool_results.conversation.value)) == len(asked(reference.sent))


# --- 3. a failing record request ------------------------------------------------------------------------------


def _stored_form(run: Conversation) -> list[tuple[str, bool]]:
    return [(render(m, ids=False), excluded(m)) for m in run.stored()]


def _results_intact(run: Conversation) -> None:
    for message in run.stored():
        for c in message.contents:
            if c.type == "function_result" and str(c.call_id).startswith("call_"):
                original = original_results(message).get(str(c.call_id), c.result)
                assert original == lookup_result(int(str(c.call_id).removeprefix("call_")))


@pytest.mark.parametrize("kind", KINDS)
async def test_a_failing_record_request_records_nothing_warns_and_the_turn_completes(
    kind: Kind, warnings_seen: list[str]
) -> None:
    """The provider raises on every record request: each is a WARNING naming the strategy and the error, nothing
    is recorded over the cached prefix, every turn completes, and no result is lost. A failure is no verdict on the
    model: the route is never given up for it, only set to rest after FAILURE_LIMIT failures in a row (a WARNING
    says so, and again when it is tried after the rest; each further failure doubles the rest), while the safety
    net keeps each uncovered result's value lines; a host that asks over the cached prefix never pins."""
    failing = await conversation(kind, client=Provider(Script(record_answer="raise"))).play(range(TURNS))
    sent, stored = failing.sent, failing.stored()
    asks = asked(sent)
    assert len(asks) >= FAILURE_LIMIT, f"record requests at {asks}"
    strategy = failing.stack.strategy
    assert strategy.failed_prefix_requests == strategy.prefix_requests == len(asks)
    named = [
        w
        for w in warnings_seen
        if w.startswith(type(strategy).__name__)
        and "asked for a record over the cached prefix and the request failed" in w
        and "(ScriptError: the record request failed at the provider)" in w
    ]
    assert len(named) == len(asks), f"{len(asks)} failed request(s), {len(named)} warning(s)"
    rests = [w for w in warnings_seen if "requests over the cached prefix failed in a row: that route rests" in w]
    assert [int(w.split("for the next ")[1].split()[0]) for w in rests] == [
        REST_CALLS << n for n in range(len(asks) - FAILURE_LIMIT + 1)
    ]
    state = failing.records.conversation.value
    assert state.recall.route is not RecordRoute.NONE  # never given up for failures
    assert (state.recall.failed_requests, state.recall.ignored_instructions) == (len(asks), 0)
    assert record_rules.written(state) == ()
    assert not written_records(stored)
    assert not [s for s in sent if s.pinned]
    assert failing.stack.recall.forced_calls == 0
    assert failing.replies == [f"done with item {n}" for n in range(TURNS)]
    assert failing.invoked == list(range(TURNS))
    # Nothing of the failed requests enters history, and history holds every result whole.
    assert not [m for m in stored if RECORD_INSTRUCTION in (m.text or "")]
    assert len([m for m in stored if not _ours(m)]) == 4 * TURNS  # the composition's user summaries aside
    _results_intact(failing)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_brief_outage_of_record_requests_leaves_the_route_on_and_records_come_back(
    kind: Kind, warnings_seen: list[str]
) -> None:
    """The finding: two failed turns (a 503 on turns 3-4, healthy after) switched records off for the rest of the
    session, in its saved state too. Now the route rests a few calls and records are written again after it."""
    turns = range(2 * TURNS)
    run = await conversation(kind, client=Provider(Script(failing_turns=frozenset({3, 4})))).play(turns)
    healthy = await conversation(kind, client=Provider(Script())).play(turns)
    strategy = run.stack.strategy
    assert 0 < strategy.failed_prefix_requests < strategy.prefix_requests
    state = run.records.conversation.value
    assert state.recall.route is healthy.records.conversation.value.recall.route is not RecordRoute.NONE
    assert (state.recall.failed_requests, state.recall.resting) == (0, 0)  # the answer after the outage reset them
    assert written_records(run.stored()), "no record after the outage"
    assert type(state).from_dict(state.to_dict()).recall == state.recall  # what a session saves
    assert run.replies == healthy.replies
    _results_intact(run)
    told = [w for w in warnings_seen if "over the cached prefix failed in a row" in w or "tried again" in w]
    assert len(told) == 2, "the rest and the return are said"


async def test_a_record_request_that_hangs_times_out_on_its_own_and_counts_as_failed(
    warnings_seen: list[str],
) -> None:
    """The finding: the library set no time limit on a compaction request. Past ``request_timeout_s`` the request
    counts as failed (a WARNING names the limit), the turn completes, and the failures back off as any do."""
    run = conversation(client=Provider(Script(record_answer="hang")))
    run.stack.strategy.request_timeout_s = 0.05
    await run.play(range(2 * TURNS))
    strategy = run.stack.strategy
    asks = asked(run.sent)
    assert strategy.timed_out_requests == strategy.failed_prefix_requests == len(asks) >= FAILURE_LIMIT
    assert run.records.conversation.value.recall.failed_requests == len(asks)  # each counted once
    assert run.replies == [f"done with item {n}" for n in range(2 * TURNS)]
    timed_out = [w for w in warnings_seen if "took longer than request_timeout_s=0.05 s and counts as failed" in w]
    assert len(timed_out) == len(asks)
    assert any("failed in a row: that route rests" in w for w in warnings_seen)
    _results_intact(run)


async def test_a_host_that_cuts_each_turn_while_a_record_request_hangs_sees_it_counted_and_backed_off() -> None:
    """The finding: a record request that hung while the host cut each turn with ``asyncio.timeout`` was sent again
    on every turn and never counted. The cut counts as a failure (its cancellation still propagates), so after
    FAILURE_LIMIT cut turns the route rests and the next turns run without it."""
    run = conversation(client=Provider(Script(record_answer="hang")))
    cut = 0
    for n in range(2 * TURNS):
        try:
            async with asyncio.timeout(0.5):
                await run.turn(n)
        except TimeoutError:
            cut += 1
    state = run.records.conversation.value.recall
    asks = asked(run.sent)
    assert cut == len(asks) == state.failed_requests, (cut, asks)
    assert FAILURE_LIMIT <= cut <= FAILURE_LIMIT + 1  # of 20 turns: the rest (8 calls, then 16) spares the others
    assert run.records.failed_prefix_requests == 0  # the provider never answered: no failure of its own
    assert len(run.replies) == 2 * TURNS - cut  # every turn not cut completed


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), 86_401])
def test_request_timeout_s_must_be_a_positive_number_of_seconds_up_to_a_day(value: float) -> None:
    strategy = conversation().stack.strategy
    with pytest.raises(ValueError, match=r"^request_timeout_s must be "):
        strategy.request_timeout_s = value
    assert strategy.request_timeout_s == 120.0


async def test_a_pinning_middleware_without_the_recall_tool_refuses_to_pin_naming_the_missing_tool() -> None:
    """The finding: a pinned middleware whose recall tool was never registered forced requests to call an
    undeclared tool (46 calls instead of 28 here; a real provider rejects such a tool_choice). Now the request that
    would be pinned is refused before it is sent, with an error naming the tool and the two fixes."""
    client = Provider()
    stack = build_stack("records", "pinned")
    invoked: list[int] = []
    agent = agent_for(client, stack, invoked, HARNESS_OFF, recall_tool=False)
    run = Conversation(client, stack, agent, agent.create_session(), invoked)
    with pytest.raises(RuntimeError, match=r"declares no tool of that name.*add the recall tool") as refused:
        await run.play(range(TURNS))
    assert RECALL_TOOL_NAME in str(refused.value)
    assert not [s for s in client.requests if s.pinned]  # nothing forced was sent
    assert stack.recall.forced_calls == 0
    assert stack.recall.conversation.value.recall.next_pin is not None  # the pin stands until the wiring is fixed


def _direct_agent(client: Provider, strategy: Any, middleware: list[Any], gate: RecallGate | None = None) -> Any:
    """The README's direct wiring (no stack): a plain harness agent with the strategy and ``middleware``."""
    return create_harness_agent(
        client,
        agent_instructions="Answer from the lookups.",
        tools=[make_lookup([]), make_recall_tool(gate or RecallGate())],
        middleware=middleware,
        before_compaction_strategy=strategy,
        after_compaction_strategy=strategy,
        tokenizer=TOKENIZER,
        disable_web_search=True,
        disable_file_memory=True,
        **HARNESS_OFF,
    )


def _records(**options: Any) -> ToolResultAnchoredSummarizationCompactionStrategy:
    return ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=BUDGET, tokenizer=TOKENIZER, **options)


def _composition(summary_request: Literal["summarizer", "cached_prefix"]) -> Any:
    users = UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=BUDGET,
        tokenizer=TOKENIZER,
        client=Summarizer(),
        summary_mode="boundary",
        remembered_requests=2,
    )
    return ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
        tokenizer=TOKENIZER, tool_results=_records(), user_turns=users, summary_request=summary_request
    )


@pytest.mark.parametrize("kind", ["records", "composition", "composition over the cached prefix"])
async def test_a_record_strategy_without_its_recall_middleware_refuses_its_first_pass_naming_the_fix(kind: str) -> None:
    """The findings: a record strategy (or a composition, also with summary_request="cached_prefix") wired with no
    recall middleware ran on without a word, never asking for a record (its tool results only trimmed) and, over
    the cached prefix, never seeing a request to repeat. Now its first pass raises, naming the middleware and the
    one-call wiring, before anything is sent."""
    strategy = {
        "records": _records,
        "composition": lambda: _composition("summarizer"),
        "composition over the cached prefix": lambda: _composition("cached_prefix"),
    }[kind]()
    client = Provider()
    agent = _direct_agent(client, strategy, [])
    with pytest.raises(RuntimeError, match=r"has no recall middleware.*ToolResultRecallMiddleware.*CompactionStack"):
        await agent.run(question(0), session=agent.create_session())
    assert client.requests == [], "a request was sent before the wiring was refused"


@pytest.mark.parametrize("installed", [False, True], ids=["middleware-left-out", "readme-wiring"])
async def test_a_stack_whose_middleware_is_left_out_of_the_agent_is_named_once(
    installed: bool, warnings_seen: list[str]
) -> None:
    """A stack's parts share one conversation when it is built, so a strategy whose stack's middleware was never
    put in the agent's middleware cannot tell at its first pass (the harness compacts before any model request).
    By its second pass the middleware has seen a model request if it is installed: if not, one WARNING names it,
    and the wiring the README shows never gets it."""
    client = Provider()
    stack = build_stack("composition", "cached_prefix")
    agent = _direct_agent(client, stack.strategy, [stack.recall] if installed else [], stack.gate)
    session = agent.create_session()
    for n in range(TURNS):
        await agent.run(question(n), session=session)
    named = [w for w in warnings_seen if "has seen no model request" in w]
    assert len(named) == (0 if installed else 1), named
    if not installed:
        assert "stack.recall" in named[0]
        assert "ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy" in named[0]


async def test_a_middleware_that_wraps_take_reforce_shares_only_through_bind_recall_which_checks_its_trigger() -> None:
    """A middleware whose reforce wraps take_reforce shares nothing by itself: the strategy's first pass refuses,
    naming bind_recall; bind_recall refuses a middleware whose trigger differs from the strategy's, naming it."""
    records = _records(trigger_fraction=0.6)
    gate = RecallGate()
    options: dict[str, Any] = {"max_input_tokens": BUDGET, "tokenizer": TOKENIZER, "arm": gate.arm}
    differs = ToolResultRecallMiddleware(**options, trigger_fraction=0.8, reforce=lambda: records.take_reforce())  # noqa: PLW0108 (a wrapper)
    with pytest.raises(RuntimeError, match=r"bind_recall"):
        await _direct_agent(Provider(), records, [differs], gate).run(question(0), session=AgentSession())
    with pytest.raises(ValueError, match=r"trigger_fraction must be the trigger_fraction of the record strategy"):
        records.bind_recall(differs)
    agrees = ToolResultRecallMiddleware(**options, trigger_fraction=0.6, reforce=lambda: records.take_reforce())  # noqa: PLW0108 (a wrapper)
    records.bind_recall(agrees)
    client = Provider()
    agent = _direct_agent(client, records, [agrees], gate)
    session = agent.create_session()
    for n in range(TURNS):
        await agent.run(question(n), session=session)
    assert agrees.forced_calls > 0
    assert records.records_found > 0, "the bound middleware never got a record asked for"


def _pinned_questions(sent: Sequence[Sent]) -> set[int]:
    """Turns whose first request (the one ending with the user's question) was pinned to the recall tool."""
    return {_turn_of(s) for s in sent if s.pinned and _is_question(s.messages[-1])}


async def test_a_cancelled_record_request_propagates_and_the_conversation_goes_on() -> None:
    run = conversation(client=Provider(Script(record_answer="cancel")))
    with pytest.raises(asyncio.CancelledError):
        await run.play(range(TURNS))
    assert run.sent[-1].asks_record, "the cancellation came from the record request"
    cancelled_turn = len(run.replies)
    assert run.replies == [f"done with item {n}" for n in range(cancelled_turn)]
    assert run.records.prefix_requests == 1
    assert run.records.failed_prefix_requests == 0, "a cancellation is no failure of the provider"
    assert not written_records(run.stored())
    assert record_rules.written(run.records.conversation.value) == ()
    assert not [m for m in run.stored() if RECORD_INSTRUCTION in (m.text or "")]
    assert len(run.stored()) == 4 * cancelled_turn, "the cancelled turn left part of itself in history"
    # The same turn again, with a model that answers: the record is asked and written.
    run.client.script = Script()
    await run.play(range(cancelled_turn, cancelled_turn + 2))
    assert run.replies[cancelled_turn:] == [f"done with item {n}" for n in range(cancelled_turn, cancelled_turn + 2)]
    assert len(written_records(run.stored())) == 1
    _results_intact(run)


# --- 4. an answer that ignores the instruction ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["small_talk", "tool"])
async def test_answers_that_ignore_the_instruction_record_nothing_and_two_leave_the_safety_net(
    mode: RecordAnswer, warnings_seen: list[str]
) -> None:
    """Small talk, or a call of the scenario's tool: no record, the call never runs, nothing of either enters
    history, the run goes on; after two such answers in a row the route is off, and a host that asks over the
    cached prefix never pins: no route is left, and the safety net keeps every value in the prompt."""
    run = await conversation(client=Provider(Script(record_answer=mode))).play(range(TURNS))
    sent, stored = run.sent, run.stored()
    asks = asked(sent)
    assert len(asks) == 2, f"record requests at {asks}: two ignored in a row end the route"
    state = run.records.conversation.value
    assert no_route(state.recall)
    assert pins_given_up(state.recall), "a host that asks over the cached prefix has no pin to fall back to"
    assert record_rules.written(state) == ()
    assert not written_records(stored)
    assert run.replies == [f"done with item {n}" for n in range(TURNS)]
    assert len(run.invoked) == len(set(run.invoked))
    assert set(run.invoked) <= set(range(TURNS)), "the tool the answer called was run"
    stored_text = "\n".join(render(m) for m in stored)
    for left_out in (SMALL_TALK, "stray_", "[a call of", RECORD_INSTRUCTION):
        assert left_out not in stored_text
    assert not [w for w in warnings_seen if "got no text" in w], "an answer was taken for no answer"
    assert run.records.failed_prefix_requests == 0
    assert not [s for s in sent if s.pinned], "a request was pinned"
    assert run.stack.recall.forced_calls == 0
    last = prompt_of(sent[-1])
    missing = [v for n in run.invoked for v in distinctive_values(lookup_result(n)) if v not in last]
    assert not missing, f"the last request lacks {missing}"
    assert "[compacted:" in last, "the safety net cut nothing: the test proves nothing"
    _results_intact(run)


async def test_when_no_record_is_kept_the_safety_net_keeps_every_value_in_the_prompt() -> None:
    """The model ignores both routes (the instruction and the pin): only the safety net is left. A group no record
    covers is never shortened by position: the safety net cuts it to its value lines, so every value of every
    lookup made stays in each turn's last request."""
    script = Script(record_answer="small_talk", obey_pins=False)
    run = await conversation(client=Provider(script)).play(range(TURNS))
    assert not written_records(run.stored())
    # A host that asks over the cached prefix never pins: every turn makes its lookup.
    assert not _pinned_questions(run.sent)
    assert run.invoked == list(range(TURNS))
    for count, _, _ in run.turn_ends:
        last = run.sent[count - 1]
        made = [n for n in run.invoked if n <= _turn_of(last)]
        missing = [v for n in made for v in distinctive_values(lookup_result(n)) if v not in prompt_of(last)]
        assert not missing, f"request {last.number} lacks {missing}"
        # Each result is whole, or the safety net's cut: its first line and its value lines, verbatim and in order.
        for rendered in last.messages:
            for c in content_of(rendered):
                if c["type"] != "function_result" or not str(c["call_id"]).startswith("call_"):
                    continue
                whole = lookup_result(int(str(c["call_id"]).removeprefix("call_")))
                lines = whole.splitlines()
                kept = [lines[0], *(line for line in lines[1:] if line != FILLER)]
                assert c["result"] in (whole, _CUT_MARKER.format(len(lines) - len(kept), len(kept)) + "\n".join(kept))
    assert "[compacted:" in prompt_of(run.sent[-1]), "the safety net cut nothing: the test proves nothing"


#: The marker line the safety net puts before a result it cut to its value lines.
_CUT_MARKER: Final = (
    "[compacted: {} line(s) of this result without distinctive values were left out; the {} below are kept "
    "verbatim and in order]\n"
)


# --- 5. after two ignored pins ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_after_two_ignored_pins_the_next_record_is_asked_over_the_cached_prefix(kind: Kind) -> None:
    run = await conversation(kind, record_request="pinned", client=Provider(Script(obey_pins=False))).play(range(TURNS))
    recall, sent = run.stack.recall, run.sent
    pinned = [i for i, s in enumerate(sent) if s.pinned]
    assert len(pinned) == 2, f"pinned requests at {pinned}"
    assert recall.pin_disabled
    assert (recall.forced_calls, recall.ignored_forced_calls) == (2, 2)
    asks = asked(sent)
    assert asks, "no record was asked over the cached prefix once pins were disabled"
    assert min(asks) > pinned[1], "a record was asked over the cached prefix while pins were on"
    records = written_records(run.stored())
    assert len(records) == len(asks) >= 1
    for i in asks:
        head = max(j for j in range(i) if not sent[j].pinned and not sent[j].asks_record)
        check_capped(sent[i].options, sent[head].options)
        assert not sent[i].pinned
        assert render_options(sent[i].options) == render_options(sent[i + 1].options)
    assert run.records.groups_covered > 0


#: Anthropic's extended thinking, as a caller turns it on in the options.
THINKING: Final[Mapping[str, Any]] = {"thinking": {"type": "enabled", "budget_tokens": 2_048}}


@pytest.mark.parametrize("kind", KINDS)
async def test_with_extended_thinking_no_request_is_forced_and_each_record_is_asked_over_the_cached_prefix(
    kind: Kind,
) -> None:
    """Anthropic rejects a tool_choice naming a tool while extended thinking is on, so a pinning host whose requests
    turn thinking on must never pin one: each record due is asked over the cached prefix instead, and pinning is not
    given up (no request was refused; a request without thinking is pinned again)."""
    run = conversation(kind, record_request="pinned")
    run.options = THINKING
    await run.play(range(TURNS))
    sent, recall = run.sent, run.stack.recall
    assert not [s.number for s in sent if s.pinned], "a request with extended thinking was forced to call a tool"
    assert recall.forced_calls == 0
    asks = asked(sent)
    assert asks, "no record was asked over the cached prefix"
    assert len(written_records(run.stored())) == len(asks)
    assert run.records.groups_covered > 0
    assert recall.conversation.value.recall.route is RecordRoute.PINNED, "pinning was given up"
    assert all(s.options.get("thinking") == THINKING["thinking"] for s in sent)

    # The same conversation without thinking pins as before: the route stood.
    plain = await conversation(kind, record_request="pinned").play(range(TURNS))
    assert [s for s in plain.sent if s.pinned]


def test_a_request_that_cannot_be_forced_asks_its_due_record_over_the_cached_prefix() -> None:
    """The pure protocol: on a pinning host, a pin decided for a request that cannot be forced (extended thinking)
    becomes an ask over the cached prefix on that request; the route stays pinned, so the next forcible request is
    pinned; while that route rests after failures, the pin is dropped instead (never forced)."""
    from maf_compaction.core.recall import HistorySeen, PinRule, RecallStatus, RequestStarting, Unpinned, advance

    rule = PinRule(trigger_tokens=1_000)
    big = HistorySeen(RecallStatus(included_tokens=5_000, records=0, pending_groups=3))
    ready, _ = advance(rule, RecallState(), big)
    assert ready.next_pin == "size"
    forced, action = advance(rule, ready, RequestStarting())
    assert isinstance(action, Pin)
    asked_state, action = advance(rule, ready, RequestStarting(forcible=False))
    assert action == Unpinned()
    assert (asked_state.asking, asked_state.next_pin, asked_state.in_flight) == ("size", None, False)
    assert asked_state.route is RecordRoute.PINNED
    resting, action = advance(rule, evolve(ready, resting=3), RequestStarting(forcible=False))
    assert action == Unpinned()
    assert (resting.asking, resting.next_pin) == (None, None)
    assert forced.route is RecordRoute.PINNED


@pytest.mark.parametrize(
    ("aligned", "route"),
    [(True, RecordRoute.CACHED_PREFIX), (False, RecordRoute.PINS_IGNORED)],
    ids=["host-asks-over-the-prefix", "host-pins"],
)
def test_once_the_prefix_route_is_off_no_route_is_left(aligned: bool, route: RecordRoute) -> None:
    """The pure protocol. Records are asked over the cached prefix by a host that asks that way, or by a host that
    pins once its pins were given up. Two ignored instructions there disable the cached prefix, and with it the last
    route, at once: a history that would call for a record pins nothing, asks nothing over the cached prefix, and no
    record is due or expected (the safety net takes over). On the route the host had, the same history asks for
    one."""
    from maf_compaction.core.recall import (
        HistorySeen,
        PinRule,
        RecallStatus,
        RequestStarting,
        Unpinned,
        advance,
        judged_instruction,
        record_due,
    )
    from maf_compaction.core.records import record_expected

    rule = PinRule(trigger_tokens=1_000, aligned=aligned)
    big = HistorySeen(RecallStatus(included_tokens=5_000, records=0, pending_groups=3))
    on_route = RecallState(route=route)
    # The contrast: on the route the host had, the same history asks for a record over the cached prefix.
    ready, _ = advance(rule, on_route, big)
    assert ready.next_pin == "size"
    asking, action = advance(rule, ready, RequestStarting())
    assert (asking.asking, asking.route, action) == ("size", route, Unpinned())

    state = judged_instruction(judged_instruction(on_route, followed=False), followed=False)
    assert no_route(state)
    assert pins_given_up(state)
    state, _ = advance(rule, state, big)
    assert state.route is RecordRoute.NONE, "a given-up route came back"
    assert state.next_pin == "size"
    state, action = advance(rule, state, RequestStarting())
    assert state.next_pin is None
    assert state.asking is None, "asked over the cached prefix after that route was disabled"
    assert action == Unpinned()
    assert not isinstance(action, Pin)
    assert not state.in_flight
    assert pins_given_up(state)
    assert no_route(state)
    assert not record_due(rule, state, reforce_pending=True)
    assert not record_expected(State(recall=state))


@pytest.mark.parametrize("aligned", [True, False], ids=["cached-prefix-host", "pinning-host"])
def test_the_protocol_says_how_the_host_asks_for_records(aligned: bool) -> None:
    """Each event of the middleware writes its ``record_request`` into the state (the route ``CACHED_PREFIX`` or
    ``PINNED``), which the composition reads to leave room for a record's instruction; the next record goes over the
    cached prefix for a host that asks that way, or once pins are given up, and never once that route is given up
    too (a given-up route stays given up whatever the host)."""
    from maf_compaction.core.recall import HistorySeen, PinRule, RecallStatus, RequestStarting, advance
    from maf_compaction.core.recall import records_over_prefix as over

    rule = PinRule(trigger_tokens=1_000, aligned=aligned)
    status = RecallStatus(included_tokens=100, records=0, pending_groups=0)
    other = RecallState(route=RecordRoute.PINNED if aligned else RecordRoute.CACHED_PREFIX)
    seen, _ = advance(rule, other, HistorySeen(status))
    started, _ = advance(rule, other, RequestStarting())
    host = RecordRoute.CACHED_PREFIX if aligned else RecordRoute.PINNED
    assert seen.route is started.route is host
    assert over(seen) == aligned
    assert over(evolve(seen, route=RecordRoute.PINS_IGNORED))
    assert not over(evolve(seen, route=RecordRoute.NONE))
    for given_up in (RecordRoute.PINS_IGNORED, RecordRoute.NONE):
        again, _ = advance(rule, RecallState(route=given_up), HistorySeen(status))
        assert again.route is given_up


def test_how_the_host_asks_is_stored_with_the_state_and_another_version_is_refused() -> None:
    """The record route is stored in the conversation's state, by value; a state without it is refused, naming the
    field; a state of another version (there are no upgraders: the old version 3 of the recall state, without the
    route, is no longer read) is refused with ``SnapshotVersionError``."""
    state = State(recall=RecallState(asking="size", ignored_instructions=1, route=RecordRoute.CACHED_PREFIX))
    data = json.loads(json.dumps(state.to_dict()))
    assert (data["kind"], data["version"], data["recall"]["route"]) == ("state", VERSION, "cached_prefix")
    assert State.from_dict(data) == state
    without = {**data, "recall": {k: v for k, v in data["recall"].items() if k != "route"}}
    with pytest.raises(SnapshotError, match=r"recall\.route"):
        State.from_dict(without)
    with pytest.raises(SnapshotVersionError):
        State.from_dict({**without, "version": 3})


async def test_a_recall_call_in_the_answer_is_recorded_and_never_run() -> None:
    """A model may answer the instruction with one recall call: its ``values`` are the record; the call is not
    run (no function loop sees the answer) and enters history only as the written record."""
    run = await conversation(client=Provider(Script(record_answer="recall"))).play(range(TURNS))
    faithful = await played("records")
    asks = asked(run.sent)
    assert asks == asked(faithful.sent)
    records = written_records(run.stored())
    assert [m.text for _, m in records] == [m.text for _, m in written_records(faithful.stored())]
    assert [m.text for _, m in records] == [f"{RECORD_PREFIX}\n{run.client.answers[i]}" for i in asks]
    assert not [m for m in run.stored() for c in m.contents if (c.call_id or "").startswith("rec_")]
    assert not run.stack.gate.armed
    assert [s.canonical for s in run.sent] == [s.canonical for s in faithful.sent]


# --- 6. the core: placing written records, the ask's identity, the stored state ---------------------------------


def _measure(text: str) -> int:
    return max(1, len(text) // 4)


def _text_record(role: str, text: str, message_id: str, *, injected: bool = False) -> MessageRecord:
    return MessageRecord(
        role, (Part("text", text, _measure(text)),), 4 + _measure(text), message_id=message_id, injected=injected
    )


def _group(n: int, *, parallel: bool = False, thinking: bool = False) -> list[MessageRecord]:
    """A lookup group: the call (two calls in parallel when ``parallel``; opening with the model's reasoning when
    ``thinking``, as a Claude turn with extended thinking does) and one tool message with the results."""
    ids = [f"c{n}", f"c{n}b"] if parallel else [f"c{n}"]
    reasoning = (Part("text_reasoning", f"I should look up item {n}.", 8),) if thinking else ()
    calls = reasoning + tuple(Part("function_call", f'lookup {{"n":{n}}}', 4, call_id=i, name="lookup") for i in ids)
    results = tuple(Part("function_result", lookup_result(n), 80, call_id=i) for i in ids)
    return [
        MessageRecord("assistant", calls, 4 + 4 * len(ids), message_id=f"a{n}"),
        MessageRecord("tool", results, 4 + 80 * len(ids), message_id=f"t{n}"),
    ]


@st.composite
def conversations(draw: st.DrawFn) -> tuple[History, list[str]]:
    """A history of lookup turns (some with parallel calls, some with injected context) and its result ids."""
    records: list[MessageRecord] = []
    ids: list[str] = []
    for n in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            records.append(_text_record("user", f"todo list before {n}", f"ctx{n}", injected=True))
        records.append(_text_record("user", f"question {n}", f"u{n}"))
        parallel = draw(st.booleans())
        records += _group(n, parallel=parallel)
        ids += [f"c{n}", f"c{n}b"] if parallel else [f"c{n}"]
        records.append(_text_record("assistant", f"done {n}", f"d{n}"))
    return history(records), ids


def _originals(records: Sequence[MessageRecord]) -> int:
    """Messages of the conversation itself: not a provider's context, not what compaction wrote."""
    return sum(1 for r in records if not (r.injected or r.note or r.written_record or r.summary))


@st.composite
def placements(draw: st.DrawFn) -> tuple[History, tuple[Answer, ...]]:
    """A history and records written over it, each at a place within it or one past its end."""
    view, _ = draw(conversations())
    places = draw(st.lists(st.integers(1, _originals(view) + 1), max_size=4))
    written = tuple(
        Answer(
            identity=f"identity{k}",
            kind=RequestKind.RECORD,
            text=f"lookup values: XR-{k:04d}",
            message_id=record_message_id(f"identity{k}"),
            after=after,
        )
        for k, after in enumerate(places)
    )
    return view, written


@given(placements())
def test_place_written_places_each_record_after_its_conversation_prefix_and_is_idempotent(
    case: tuple[History, tuple[Answer, ...]],
) -> None:
    """Each record stands right after the first ``after`` messages of the conversation (a provider's context
    aside), records of one place in the order written; a place the history does not reach places nothing; and
    placing again (the shell applied the pass to the list) changes nothing."""
    view, written = case
    placed = place_written(view, written, _measure)
    assert place_written(placed, written, _measure) == placed, "placing again changed the history"
    assert [r for r in placed if not r.written_record] == list(view), "placing changed the conversation"
    expected: list[tuple[str, str | None]] = []
    count = 0
    for message in view:
        expected.append((message.role, message.message_id))
        if not message.injected:
            count += 1
            expected += [("assistant", w.message_id) for w in written if w.after == count]
    assert [(r.role, r.message_id) for r in placed] == expected
    by_id = {w.message_id: w for w in written}
    for position, r in enumerate(placed):
        if not r.written_record:
            continue
        record = by_id[str(r.message_id)]
        assert r.parts[0].text == f"{RECORD_PREFIX}\n{record.text}"
        assert r.parts[0].text.startswith(RECORD_MARKER)
        assert r.held
        assert not r.excluded
        assert _originals(placed[:position]) == record.after
    beyond = {w.message_id for w in written if (w.after or 0) > _originals(view)}
    assert not beyond & {r.message_id for r in placed}, "a record was placed beyond the history"


def _asking() -> State:
    return State(recall=RecallState(asking="size"))


#: How a drawn conversation ends when the record is asked: with the turn's answer (as drawn), a new question, a
#: new question and its lookup (a run's follow-up request), or that lookup made while thinking.
Ending = Literal["answer", "question", "call", "thinking call"]
ENDINGS: Final[tuple[Ending, ...]] = ("answer", "question", "call", "thinking call")


def _ended(view: History, ending: Ending) -> History:
    """``view`` ending as ``ending`` says."""
    extra: list[MessageRecord] = [] if ending == "answer" else [_text_record("user", "question 50", "u50")]
    if ending in ("call", "thinking call"):
        extra += _group(50, thinking=ending == "thinking call")
    return history([*view, *extra])


@given(conversations(), st.lists(st.integers(0, 30), max_size=4), st.sampled_from(ENDINGS))
def test_the_asks_identity_and_place_are_the_same_on_a_copy_with_injected_context(
    case: tuple[History, list[str]], positions: list[int], ending: Ending
) -> None:
    """The in-call copy carries a provider's context the stored history lacks: the ask is the same ask on
    both lists (its identity, record id and place), and once answered it is not asked again on either. Its place
    is right before the conversation's newest group: the question, the lookup call and its results, or the
    answer (each message but a call and its results is a group of its own). A lookup made while thinking keeps its
    reasoning first in its turn (a provider joins adjacent assistant messages; Anthropic rejects a final turn with
    thinking on that opens with anything else): the record stands before the question instead."""
    view = _ended(case[0], ending)
    plain = history(r for r in view if not r.injected)
    copy = list(view)
    for k, position in enumerate(positions):  # another list: context at other places
        copy.insert(min(position, len(copy)), _text_record("user", f"memory {k}", f"mem{k}", injected=True))
    other_list = history(copy)
    one, other = ask_aligned(plain, _asking(), plain), ask_aligned(other_list, _asking(), other_list)
    assert isinstance(one, Request)
    assert isinstance(other, Request)
    assert (one.kind, one.route) == (other.kind, other.route) == (RequestKind.RECORD, Route.CACHED_PREFIX)
    assert (one.identity, one.message_id, one.after) == (other.identity, other.message_id, other.after)
    assert one.instruction == RECORD_INSTRUCTION
    newest = len(plain) - {"call": 2, "thinking call": 3}.get(ending, 1)  # where the record stands
    assert one.after == _originals(plain[:newest])
    done = State(
        recall=RecallState(asking="size"),
        answers=(
            Answer(
                identity=one.identity,
                kind=RequestKind.RECORD,
                text="lookup values: XR-0000",
                message_id=one.message_id,
                after=one.after,
            ),
        ),
    )
    assert ask_aligned(plain, done, plain) is None
    assert ask_aligned(other_list, done, other_list) is None
    assert ask_aligned(plain, State(), plain) is None, "asked with no record due"


@pytest.mark.parametrize(("quoted", "counted"), [(50, False), (0, True)])
def test_a_group_the_newest_record_was_shown_makes_no_record_due_by_its_size_alone(quoted: int, counted: bool) -> None:
    """With thinking on, a record asked during a turn stands before the turn's question, so the lookup it was shown
    (and quotes) stays after it. That group is still new tool material (``pending_groups``), but its tokens do not
    count toward ``repeat_tokens``: otherwise every later call of the turn would ask for a record of it again. A
    group the record does not quote counts."""
    text = f"{RECORD_PREFIX}\nlookup values: XR-{quoted:02d}00 XR-{quoted:02d}05"
    record = MessageRecord(
        "assistant", (Part("text", text, _measure(text)),), 4 + _measure(text), message_id="r0", written_record=True
    )
    turn = [_text_record("user", "question 0", "u0"), *_group(0), _text_record("assistant", "done 0", "d0")]
    view = history([*turn, record, _text_record("user", "question 50", "u50"), *_group(50, thinking=True)])
    status, _ = recall_status(view)
    assert (status.records, status.pending_groups) == (1, 1)
    assert status.pending_tokens == (sum(r.tokens for r in _group(50, thinking=True)) if counted else 0)
    assert pin_due(PinRule(trigger_tokens=10**6, min_groups_before_repeat=2, repeat_tokens=50), status) is counted


def test_no_record_is_asked_over_results_that_carry_no_value() -> None:
    """A record due over results without a distinctive value (prose, a document read) is not asked: no answer could
    quote a value of them, so none could be kept, and the answer would count toward giving the record route up.
    With one value among the results shown, it is asked."""
    prose = "The deployment notes say the rollout went well and nothing needs doing. " * 20

    def turn(n: int, text: str) -> list[MessageRecord]:
        call = Part("function_call", f'read {{"n":{n}}}', 4, call_id=f"p{n}", name="read")
        return [
            _text_record("user", f"question {n}", f"u{n}"),
            MessageRecord("assistant", (call,), 8, message_id=f"a{n}"),
            MessageRecord(
                "tool", (Part("function_result", text, _measure(text), call_id=f"p{n}"),), 300, message_id=f"t{n}"
            ),
            _text_record("assistant", f"done {n}", f"d{n}"),
        ]

    without = history([*turn(0, prose), *turn(1, prose), _text_record("user", "question 2", "u2")])
    assert ask_aligned(without, _asking(), without) is None
    assert (
        kept_record(Request("k", RequestKind.RECORD, Route.CACHED_PREFIX, view=without), "lookup values: XR-0000")
        is None
    )
    with_one = history(
        [*turn(0, prose), *turn(1, prose + " Ticket TK-0042 stays open."), _text_record("user", "q", "u2")]
    )
    asked = ask_aligned(with_one, _asking(), with_one)
    assert isinstance(asked, Request)
    assert kept_record(asked, "read: TK-0042") is not None


@given(conversations())
def test_the_asks_identity_changes_with_the_results_shown(case: tuple[History, list[str]]) -> None:
    view, _ = case
    base = ask_aligned(view, _asking(), view)
    assert base is not None
    more = history([*view, *_group(99), _text_record("assistant", "done 99", "d99")])
    grown = ask_aligned(more, _asking(), more)
    assert grown is not None
    assert grown.identity != base.identity
    assert grown.after == base.after + 3
    tool_at = max(k for k, r in enumerate(view) if r.role == "tool")
    hidden = view.set(tool_at, flagged(view[tool_at], excluded=True))
    shrunk = ask_aligned(hidden, _asking(), hidden)
    assert shrunk is None or shrunk.identity != base.identity
    # The text of a result is not part of the identity: the same results shown are the same ask (told otherwise,
    # with a value still: over results without one no record is asked at all).
    retold = view.set(
        tool_at, replace(view[tool_at], parts=tuple(replace(p, text="x: XR-9999") for p in view[tool_at].parts))
    )
    again = ask_aligned(retold, _asking(), retold)
    assert again is not None
    assert again.identity == base.identity


def test_a_state_with_written_records_round_trips_through_the_envelope() -> None:
    state = State(
        recall=RecallState(asking="reforce", ignored_streak=1, ignored_instructions=1),
        answers=(
            Answer(
                identity="a" * 64,
                kind=RequestKind.RECORD,
                text="lookup values: XR-0000 XR-0005",
                message_id="compaction_record_" + "a" * 16,
                after=15,
            ),
            Answer(
                identity="b" * 64,
                kind=RequestKind.RECORD,
                text="lookup values: XR-0400",
                message_id="compaction_record_" + "b" * 16,
                after=31,
            ),
        ),
    )
    data = json.loads(json.dumps(state.to_dict()))
    assert (data["kind"], data["version"]) == ("state", VERSION)
    assert data["answers"][1] == {
        "identity": "b" * 64,
        "kind": "record",
        "text": "lookup values: XR-0400",
        "message_id": "compaction_record_" + "b" * 16,
        "sources": None,
        "turns": None,
        "after": 31,
    }
    assert State.from_dict(data) == state
    assert record_rules.written(State.from_dict(data)) == state.answers
    without = {k: v for k, v in data.items() if k != "answers"}
    with pytest.raises(SnapshotError, match="answers"):
        State.from_dict(without)


def test_a_record_state_of_an_earlier_release_is_refused() -> None:
    """The record state an earlier release stored (``record_state``, version 1, before records were written over
    the cached prefix: as the frozen ``records_stack`` fixture held it) is not read as a conversation's state: the
    one upgrade adds a field version 5 added, it does not turn another kind into a state. Relabelled as a state, the
    answers it lacks are refused by name."""
    old = {
        "kind": "record_state",
        "version": 1,
        "fallback": {"kind": "anchored", "version": 1, "tools_shed": 3, "texts_shed": 3, "keep_head_groups": 3},
        "recall": {"next_pin": "size", "pin_disabled": False, "in_flight": False, "awaiting_record": False},
        "records": {"kind": "records", "version": 1, "settled": [], "ask": None},
    }
    with pytest.raises(SnapshotError, match="record_state"):
        State.from_dict(old)
    with pytest.raises(SnapshotError, match="answers"):
        State.from_dict({**old, "kind": "state"})
