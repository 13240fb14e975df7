"""Malformed input gets a typed error that names what is wrong, before anything is changed.

Issue 10, item 5. Everything here goes through the public API with real ``Message`` and
``Content`` objects, and every strategy is awaited as the framework awaits it:

- a malformed message list (``None`` or another object in it, ``contents`` or
  ``additional_properties`` that are not what the framework builds) raises ``TypeError``
  naming the index and the field, and leaves the list and every message as they were;
- a tokenizer whose ``count_tokens`` answers something other than an integer >= 0 raises
  ``TypeError`` (``ValueError`` for a negative count) naming the tokenizer and the answer;
- a parameter of the wrong kind (a string for a bool, a sync function where the strategy
  awaits, a gate that is not a ``RecallGate``, ``coverage_share=0``) is refused at
  construction with a ``ValueError`` naming the parameter;
- a non-string tool result that the anchored strategy shortens shows the model the
  shortened text, and ``original_results`` gives back the original value with its type.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from agent_framework import (
    CharacterEstimatorTokenizer,
    ChatContext,
    ChatResponse,
    Content,
    Message,
    SlidingWindowStrategy,
)
from agent_framework_openai import OpenAIChatClient, OpenAIChatCompletionClient

from maf_compaction import (
    AnchoredCompactionStrategy,
    MediaTokenEstimator,
    MinimumGainAnchoredCompactionStrategy,
    RecallGate,
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultRecallMiddleware,
    UserTurnAnchoredSummarizationCompactionStrategy,
    find_nested_strategy,
    make_recall_tool,
    original_results,
    record_text,
)
from maf_compaction.adapters.convert import HistoryCache
from maf_compaction.core.anchored import AnchoredConfig
from maf_compaction.core.records import RecordConfig
from maf_compaction.core.shorten import is_shortened
from maf_compaction.core.user_summaries import UserSummaryConfig
from wiring import recalled

TOKENIZER = CharacterEstimatorTokenizer()
BUDGET = 1_500  # the conversation below is several times this: every strategy acts on it
BAD_AT = 5  # the index the malformed cases put their defect at (inside the band)

# --- a conversation every strategy acts on ------------------------------------------------


def long_text(n: int) -> str:
    return "\n".join(f"row {k}: code_{n}_{k}=TL-{n:02d}{k:04d} status ok" for k in range(60))


def conversation() -> list[Message]:
    """System, task, eight question/lookup turns with long results, a final question."""
    messages = [Message("system", ["You help with deployments."], message_id="sys")]
    messages.append(Message("user", ["Check every region. " * 20], message_id="task"))
    for n in range(8):
        messages.append(Message("user", [f"Now region {n}, please. " * 20], message_id=f"u{n}"))
        messages.append(
            Message(
                "assistant",
                [Content.from_function_call(f"c{n}", "lookup", arguments={"region": n})],
                message_id=f"a{n}",
            )
        )
        messages.append(
            Message("tool", [Content.from_function_result(f"c{n}", result=long_text(n))], message_id=f"t{n}")
        )
    messages.append(Message("user", ["Summarise the findings."], message_id="final"))
    return messages


class Summarizer:
    """A chat client whose summaries are short: enough for the user-turn strategy to act."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_response(self, messages: Sequence[Message], **kwargs: Any) -> ChatResponse:
        self.calls += 1
        return ChatResponse(messages=[Message("assistant", ["The user asked about every region."])])


Factory = Callable[[Any], Callable[[list[Message]], Awaitable[bool]]]


def anchored(tokenizer: Any) -> AnchoredCompactionStrategy:
    return AnchoredCompactionStrategy(max_input_tokens=BUDGET, tokenizer=tokenizer)


def min_gain(tokenizer: Any) -> MinimumGainAnchoredCompactionStrategy:
    return MinimumGainAnchoredCompactionStrategy(max_input_tokens=BUDGET, tokenizer=tokenizer)


def records(tokenizer: Any) -> ToolResultAnchoredSummarizationCompactionStrategy:
    return recalled(ToolResultAnchoredSummarizationCompactionStrategy(max_input_tokens=BUDGET, tokenizer=tokenizer))


def user_turns(tokenizer: Any) -> UserTurnAnchoredSummarizationCompactionStrategy:
    return UserTurnAnchoredSummarizationCompactionStrategy(
        max_input_tokens=BUDGET, tokenizer=tokenizer, client=Summarizer(), min_band_share=0
    )


def recall_middleware(tokenizer: Any) -> Callable[[list[Message]], Awaitable[bool]]:
    """The recall middleware, driven as the framework drives it; it reads the loaded list on the way out."""
    middleware = ToolResultRecallMiddleware(max_input_tokens=BUDGET, tokenizer=tokenizer, arm=RecallGate().arm)

    async def call(messages: list[Message]) -> bool:
        async def call_next() -> None:
            return None

        context = ChatContext(client=Summarizer(), messages=messages, options={})  # type: ignore[arg-type]
        await middleware.process(context, call_next)
        return middleware.record_due()

    return call


STRATEGIES: list[Factory] = [anchored, min_gain, records, user_turns]
EVERY_READER: list[Factory] = [*STRATEGIES, recall_middleware]
READER_IDS = ["anchored", "min_gain", "records", "user_turns", "recall_middleware"]


def label(value: object) -> str:
    """A stable test id for a parameter value (no object addresses)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return repr(value)
    return getattr(value, "__name__", type(value).__name__)


def state(messages: Sequence[object]) -> list[tuple[int, object]]:
    """Every item's identity and a deep copy of everything it holds, malformed or not."""
    out: list[tuple[int, object]] = []
    for item in messages:
        if isinstance(item, Message):
            contents: object = item.contents
            copied = (
                [c.to_dict() if isinstance(c, Content) else copy.deepcopy(c) for c in contents]
                if isinstance(contents, list)
                else copy.deepcopy(contents)
            )
            ids = [id(c) for c in contents] if isinstance(contents, list) else None
            fields = (item.role, item.message_id, copied, ids, copy.deepcopy(item.additional_properties))
            out.append((id(item), fields))
        else:
            out.append((id(item), copy.deepcopy(item)))
    return out


@pytest.mark.parametrize("factory", STRATEGIES, ids=READER_IDS[:-1])
async def test_the_control_conversation_is_changed_by_every_strategy(factory: Factory) -> None:
    """Without a defect each strategy changes this list, so the tests below can tell a refusal."""
    messages = conversation()
    before = state(messages)
    assert await factory(TOKENIZER)(messages) is True
    assert state(messages) != before


# --- malformed messages ----------------------------------------------------------------------


def with_item(item: object) -> Callable[[list[Message]], None]:
    def damage(messages: list[Message]) -> None:
        messages.insert(BAD_AT, item)  # type: ignore[arg-type]

    return damage


def with_attribute(name: str, value: object) -> Callable[[list[Message]], None]:
    def damage(messages: list[Message]) -> None:
        setattr(messages[BAD_AT], name, value)

    return damage


def with_content(value: object) -> Callable[[list[Message]], None]:
    def damage(messages: list[Message]) -> None:
        messages[BAD_AT].contents = [*messages[BAD_AT].contents, value]  # type: ignore[list-item]

    return damage


MALFORMED: list[tuple[str, Callable[[list[Message]], None], str]] = [
    ("None in the list", with_item(None), rf"messages\[{BAD_AT}\] must be an agent_framework Message, got None"),
    ("a string in the list", with_item("hello"), rf"messages\[{BAD_AT}\] must be an agent_framework Message, got str"),
    (
        "a dict in the list",
        with_item({"role": "user", "contents": ["hi"]}),
        rf"messages\[{BAD_AT}\] must be an agent_framework Message, got dict",
    ),
    (
        "contents=None",
        with_attribute("contents", None),
        rf"messages\[{BAD_AT}\]\.contents must be a list of Content, got None",
    ),
    (
        "contents a string",
        with_attribute("contents", "text"),
        rf"messages\[{BAD_AT}\]\.contents must be a list of Content, got str",
    ),
    (
        "a None content",
        with_content(None),
        rf"messages\[{BAD_AT}\]\.contents\[1\] must be a Content, got None",
    ),
    (
        "a string content",
        with_content("raw"),
        rf"messages\[{BAD_AT}\]\.contents\[1\] must be a Content, got str",
    ),
    (
        "a None appended in place",
        lambda messages: messages[BAD_AT].contents.append(None),  # type: ignore[arg-type]
        rf"messages\[{BAD_AT}\]\.contents\[1\] must be a Content, got None",
    ),
    (
        "additional_properties=None",
        with_attribute("additional_properties", None),
        rf"messages\[{BAD_AT}\]\.additional_properties must be a dict, got None",
    ),
    (
        "additional_properties a list",
        with_attribute("additional_properties", ["_excluded"]),
        rf"messages\[{BAD_AT}\]\.additional_properties must be a dict, got list",
    ),
    ("role=None", with_attribute("role", None), rf"messages\[{BAD_AT}\]\.role must be a non-empty string, got None"),
    (
        "message_id an int",
        with_attribute("message_id", 7),
        rf"messages\[{BAD_AT}\]\.message_id must be a string or None, got int",
    ),
]


@pytest.mark.parametrize(("case", "damage", "message"), MALFORMED, ids=[case for case, _, _ in MALFORMED])
@pytest.mark.parametrize("factory", EVERY_READER, ids=READER_IDS)
async def test_a_malformed_message_is_named_and_nothing_changes(
    factory: Factory, case: str, damage: Callable[[list[Message]], None], message: str
) -> None:
    messages = conversation()
    damage(messages)
    before = state(messages)
    with pytest.raises(TypeError, match=message):
        await factory(TOKENIZER)(messages)
    assert state(messages) == before, case


@pytest.mark.parametrize(("case", "damage", "message"), MALFORMED, ids=[case for case, _, _ in MALFORMED])
async def test_a_defect_on_a_later_pass_is_found_too(
    case: str, damage: Callable[[list[Message]], None], message: str
) -> None:
    """The conversion cache does not hide a message that went bad after it was converted."""
    messages = conversation()
    strategy = anchored(TOKENIZER)
    await strategy(messages)
    messages = conversation()  # a fresh copy the cache has converted once...
    await strategy(messages)
    damage(messages)  # ...and then broken
    before = state(messages)
    with pytest.raises(TypeError, match=message):
        await strategy(messages)
    assert state(messages) == before, case


def test_count_message_tokens_names_a_malformed_message() -> None:
    estimator = MediaTokenEstimator(TOKENIZER)
    with pytest.raises(TypeError, match="message must be an agent_framework Message, got None"):
        estimator.count_message_tokens(None)  # type: ignore[arg-type]
    broken = Message("user", ["hi"])
    broken.contents = None  # type: ignore[assignment]
    with pytest.raises(TypeError, match=r"message\.contents must be a list of Content, got None"):
        estimator.count_message_tokens(broken)


def test_original_results_names_a_malformed_message() -> None:
    with pytest.raises(TypeError, match="message must be an agent_framework Message, got str"):
        original_results("not a message")  # type: ignore[arg-type]
    message = Message("tool", [Content.from_function_result("c", result="x")])
    message.additional_properties = None  # type: ignore[assignment]
    assert original_results(message) == {}


def test_record_text_names_a_malformed_message() -> None:
    with pytest.raises(TypeError, match="message must be an agent_framework Message, got None"):
        record_text(None)  # type: ignore[arg-type]
    assert record_text(Message("user", ["hi"])) == ""


def test_find_nested_strategy_requires_a_class() -> None:
    strategy = anchored(TOKENIZER)
    with pytest.raises(ValueError, match="kind must be a class, got 'AnchoredCompactionStrategy'"):
        find_nested_strategy(strategy, "AnchoredCompactionStrategy")  # type: ignore[arg-type]
    assert find_nested_strategy(strategy, AnchoredCompactionStrategy) is strategy


# --- tokenizer answers -----------------------------------------------------------------------


class Answering:
    """A tokenizer that answers ``value`` for every text."""

    def __init__(self, value: object) -> None:
        self.value = value

    def count_tokens(self, text: str) -> object:
        return self.value

    def __repr__(self) -> str:
        return f"Answering({self.value!r})"


class Index:
    """An integer-like count (as ``numpy.int64`` is): accepted as its int."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


BAD_ANSWERS: list[tuple[object, type[Exception]]] = [
    ("12", TypeError),
    (None, TypeError),
    (2.5, TypeError),
    (12.0, TypeError),
    (True, TypeError),
    ([3], TypeError),
    (-5, ValueError),
    (Index(-1), ValueError),
]


@pytest.mark.parametrize(("value", "error"), BAD_ANSWERS, ids=[label(v) for v, _ in BAD_ANSWERS])
@pytest.mark.parametrize("factory", EVERY_READER, ids=READER_IDS)
async def test_a_tokenizer_answer_that_is_not_a_count_is_named(
    factory: Factory, value: object, error: type[Exception]
) -> None:
    messages = conversation()
    before = state(messages)
    expected = f"tokenizer Answering({value!r}) returned {value!r} from count_tokens; it must return an integer >= 0"
    with pytest.raises(error, match=re.escape(expected)):
        await factory(Answering(value))(messages)
    assert state(messages) == before


@pytest.mark.parametrize(("value", "error"), BAD_ANSWERS, ids=[label(v) for v, _ in BAD_ANSWERS])
def test_the_estimator_checks_the_wrapped_tokenizer(value: object, error: type[Exception]) -> None:
    estimator = MediaTokenEstimator(Answering(value))  # type: ignore[arg-type]
    with pytest.raises(error, match=r"tokenizer Answering\(.*\) returned .* from count_tokens"):
        estimator.count_tokens("some text")
    with pytest.raises(error, match="from count_tokens; it must return an integer >= 0"):
        estimator.count_message_tokens(Message("user", ["some text"]))


async def test_integer_like_and_zero_counts_are_accepted() -> None:
    assert MediaTokenEstimator(Answering(Index(7))).count_tokens("x") == 7  # type: ignore[arg-type]
    assert MediaTokenEstimator(Answering(0)).count_tokens("x") == 0  # type: ignore[arg-type]
    messages = conversation()
    await anchored(Answering(Index(50)))(messages)  # 50 tokens a text: over the budget, it compacts


# --- parameters of the wrong kind ------------------------------------------------------------


async def sync_strategy(messages: list[Message]) -> bool:
    return False


def not_async(messages: list[Message]) -> bool:
    return False


class SyncStrategy:
    def __call__(self, messages: list[Message]) -> bool:
        return False


class AsyncStrategy:
    async def __call__(self, messages: list[Message]) -> bool:
        return False


async def describe(content: Content, message: Message) -> str | None:
    return "a chart"


def describe_sync(content: Content, message: Message) -> str | None:
    return "a chart"


class AsyncTokenizer:
    async def count_tokens(self, text: str) -> int:
        return len(text)


def noop() -> None:
    return None


async def async_noop() -> None:
    return None


async def async_reforce() -> bool:
    return False


def case_id(kind: str, overrides: dict[str, Any]) -> str:
    return f"{kind}-{', '.join(f'{k}={label(v)}' for k, v in overrides.items())}"


def strategy_arguments(kind: str) -> dict[str, Any]:
    base: dict[str, Any] = {"max_input_tokens": BUDGET, "tokenizer": TOKENIZER}
    if kind == "user_turns":
        base["client"] = Summarizer()
    if kind == "recall_middleware":
        base["arm"] = noop
    return base


CONSTRUCTORS: dict[str, Callable[..., object]] = {
    "anchored": AnchoredCompactionStrategy,
    "min_gain": MinimumGainAnchoredCompactionStrategy,
    "records": ToolResultAnchoredSummarizationCompactionStrategy,
    "user_turns": UserTurnAnchoredSummarizationCompactionStrategy,
    "recall_middleware": ToolResultRecallMiddleware,
}

WRONG_KIND: list[tuple[str, dict[str, Any], str]] = [
    ("anchored", {"collapse_assistant_text": "false"}, "collapse_assistant_text must be True or False, got 'false'"),
    ("anchored", {"collapse_assistant_text": 0}, "collapse_assistant_text must be True or False, got 0"),
    ("min_gain", {"collapse_assistant_text": "false"}, "collapse_assistant_text must be True or False, got 'false'"),
    ("min_gain", {"collapse_assistant_text": None}, "collapse_assistant_text must be True or False, got None"),
    ("records", {"fallback": not_async}, "fallback must be a CompactionStrategy or None .*, got <function not_async"),
    ("records", {"fallback": SyncStrategy()}, "fallback must be a CompactionStrategy or None .*, got <.*SyncStrategy"),
    ("records", {"fallback": "anchored"}, "fallback must be a CompactionStrategy or None"),
    ("records", {"coverage_share": 0}, r"coverage_share must be in \(0, 1\], got 0"),
    ("records", {"coverage_share": 0.0}, r"coverage_share must be in \(0, 1\], got 0\.0"),
    (
        "user_turns",
        {"describe_media": describe_sync},
        "describe_media must be an async callable or None .*describe_sync",
    ),
    ("user_turns", {"describe_media": "ocr"}, "describe_media must be an async callable or None"),
    ("recall_middleware", {"repeat_records": "no"}, "repeat_records must be True or False, got 'no'"),
    ("recall_middleware", {"arm": async_noop}, "arm must be a callable taking no arguments that is not async"),
    ("recall_middleware", {"disarm": async_noop}, "disarm must be a callable taking no arguments or None that is not"),
    ("recall_middleware", {"reforce": async_reforce}, "reforce must be a callable taking no arguments or None that is"),
    ("recall_middleware", {"reforce": True}, "reforce must be a callable taking no arguments or None"),
    *(
        (kind, {"tokenizer": AsyncTokenizer()}, "tokenizer must have a count_tokens.* that is not async")
        for kind in CONSTRUCTORS
    ),
    *((kind, {"tokenizer": "o200k_base"}, "tokenizer must have a count_tokens") for kind in CONSTRUCTORS),
]


@pytest.mark.parametrize(
    ("kind", "overrides", "message"),
    WRONG_KIND,
    ids=[case_id(kind, overrides) for kind, overrides, _ in WRONG_KIND],
)
def test_a_parameter_of_the_wrong_kind_is_refused_by_name(kind: str, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CONSTRUCTORS[kind](**{**strategy_arguments(kind), **overrides})


RIGHT_KIND: list[tuple[str, dict[str, Any]]] = [
    ("anchored", {"collapse_assistant_text": False}),
    ("min_gain", {"collapse_assistant_text": False}),
    ("records", {"fallback": sync_strategy}),  # an async def function
    ("records", {"fallback": AsyncStrategy()}),
    ("records", {"fallback": functools.partial(sync_strategy)}),
    ("records", {"fallback": anchored(TOKENIZER)}),
    ("records", {"fallback": SlidingWindowStrategy(keep_last_groups=4)}),  # the framework's own
    ("records", {"coverage_share": 1}),
    ("records", {"coverage_share": 0.01}),
    ("user_turns", {"describe_media": describe}),
    ("recall_middleware", {"repeat_records": False, "disarm": noop, "reforce": lambda: False}),
    ("recall_middleware", {"tokenizer": MediaTokenEstimator(TOKENIZER)}),
]


@pytest.mark.parametrize(
    ("kind", "overrides"),
    RIGHT_KIND,
    ids=[case_id(kind, overrides) for kind, overrides in RIGHT_KIND],
)
def test_a_parameter_of_the_right_kind_is_accepted(kind: str, overrides: dict[str, Any]) -> None:
    CONSTRUCTORS[kind](**{**strategy_arguments(kind), **overrides})


async def test_an_async_fallback_is_awaited() -> None:
    calls: list[int] = []

    class Counting:
        async def __call__(self, messages: list[Message]) -> bool:
            calls.append(len(messages))
            return False

    strategy = recalled(
        ToolResultAnchoredSummarizationCompactionStrategy(
            max_input_tokens=BUDGET, tokenizer=TOKENIZER, fallback=Counting()
        )
    )
    await strategy(conversation())  # no record and far over the fallback fraction
    assert calls == [len(conversation())]


def test_make_recall_tool_requires_a_recall_gate() -> None:
    with pytest.raises(ValueError, match="gate must be a RecallGate or None, got 'x'"):
        make_recall_tool(gate="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gate must be a RecallGate or None, got True"):
        make_recall_tool(True)  # type: ignore[arg-type]
    assert make_recall_tool(RecallGate()).name == make_recall_tool(None).name


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tokenizer": AsyncTokenizer()}, "tokenizer must have a count_tokens.* that is not async"),
        ({"tokenizer": None}, "tokenizer must have a count_tokens"),
        ({"estimate_media": describe}, "estimate_media must be a callable .* that is not async"),
        ({"estimate_media": 1_024}, "estimate_media must be a callable"),
        ({"image_tokens": True}, "image_tokens must be an integer >= 1, got True"),
    ],
    ids=["async tokenizer", "no tokenizer", "async estimate_media", "int estimate_media", "bool image_tokens"],
)
def test_the_estimator_refuses_parameters_of_the_wrong_kind(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MediaTokenEstimator(**{"tokenizer": TOKENIZER, **overrides})


def test_the_configs_check_their_bools_and_the_coverage_range() -> None:
    with pytest.raises(ValueError, match="collapse_assistant_text must be True or False, got 'false'"):
        AnchoredConfig(max_input_tokens=BUDGET, collapse_assistant_text="false")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="describe_media must be True or False, got 'yes'"):
        UserSummaryConfig(max_input_tokens=BUDGET, describe_media="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"coverage_share must be in \(0, 1\], got 0"):
        RecordConfig(max_input_tokens=BUDGET, coverage_share=0)
    assert RecordConfig(max_input_tokens=BUDGET, coverage_share=1).coverage_share == 1


# --- non-string results keep their value when shortened -------------------------------------


def structured_conversation(result: object) -> list[Message]:
    """Task, five lookups whose results are ``result`` (not a string), a final question."""
    messages = [Message("system", ["sys"], message_id="sys"), Message("user", ["task"], message_id="task")]
    for n in range(5):
        messages.append(
            Message(
                "assistant", [Content.from_function_call(f"c{n}", "lookup", arguments={"n": n})], message_id=f"a{n}"
            )
        )
        messages.append(
            Message(
                "tool",
                [Content("function_result", call_id=f"c{n}", result=copy.deepcopy(result))],
                message_id=f"t{n}",
            )
        )
    messages.append(Message("user", ["go"], message_id="final"))
    return messages


DICT_RESULT: dict[str, Any] = {
    "region": "eu-west",
    "count": 300,
    "healthy": True,
    "rows": [{"id": f"TL-{k:04d}", "state": "ok", "load": k / 10} for k in range(300)],
}
LIST_RESULT: list[Any] = [{"id": f"TB-{k:04d}", "tags": ["a", "b"], "owner": None} for k in range(300)]


def shortened(messages: Sequence[Message]) -> list[Message]:
    return [m for m in messages if m.role == "tool" and isinstance(m.contents[0].result, str)]


def wire_texts(message: Message) -> tuple[object, object]:
    """What the two OpenAI clients send for the message's result (Chat Completions, Responses)."""
    call = Message("assistant", [Content.from_function_call(message.contents[0].call_id or "", "lookup")])
    chat = OpenAIChatCompletionClient(model="gpt-4o", api_key="sk-offline")._prepare_messages_for_openai(
        [call, message]
    )
    responses = OpenAIChatClient(model="gpt-4o", api_key="sk-offline")._prepare_messages_for_openai([call, message])
    tool_message = next(m for m in chat if m.get("role") == "tool")
    output = next(item for item in responses if item.get("type") == "function_call_output")
    return tool_message["content"], output["output"]


@pytest.mark.parametrize("result", [DICT_RESULT, LIST_RESULT], ids=["dict", "list"])
async def test_a_shortened_structured_result_keeps_its_original_value(result: object) -> None:
    messages = structured_conversation(result)
    full_text = json.dumps(result)
    await AnchoredCompactionStrategy(max_input_tokens=100_000, tokenizer=TOKENIZER, keep_tokens=150)(messages)

    rewritten = shortened(messages)
    assert rewritten, "the band's results were shortened"
    for message in rewritten:
        content = message.contents[0]
        text = content.result
        assert isinstance(text, str)
        assert is_shortened(text)
        assert len(text) < len(full_text) / 4
        assert [item.text for item in content.items or ()] == [text]
        assert wire_texts(message) == (text, text), "the model sees the shortened text on both APIs"
        kept = original_results(message)
        assert kept == {content.call_id: result}
        assert type(kept[content.call_id or ""]) is type(result)
    untouched = [m for m in messages if m.role == "tool" and all(m is not r for r in rewritten)]
    assert untouched, "the head and tail results stay as they are"
    assert all(m.contents[0].result == result for m in untouched)


async def test_the_original_value_survives_a_session_round_trip_and_later_passes() -> None:
    messages = structured_conversation(DICT_RESULT)
    strategy = AnchoredCompactionStrategy(max_input_tokens=100_000, tokenizer=TOKENIZER, keep_tokens=150)
    await strategy(messages)
    target = shortened(messages)[0]
    call_id = target.contents[0].call_id or ""

    restored = Message.from_dict(json.loads(json.dumps(target.to_dict())))
    assert original_results(restored) == {call_id: DICT_RESULT}

    assert await strategy(messages) is False  # a second pass changes nothing, the original included
    assert original_results(target) == {call_id: DICT_RESULT}

    copied = original_results(target)
    copied[call_id]["rows"].clear()  # type: ignore[index, union-attr]
    assert original_results(target) == {call_id: DICT_RESULT}, "the caller gets a copy"


async def test_a_content_result_is_kept_as_its_dict() -> None:
    inner = Content.from_text("TL-0001 ok\n" * 600)
    messages = structured_conversation(inner)
    await AnchoredCompactionStrategy(max_input_tokens=100_000, tokenizer=TOKENIZER, keep_tokens=150)(messages)
    target = shortened(messages)[0]
    kept = original_results(target)[target.contents[0].call_id or ""]
    assert kept == inner.to_dict()
    assert Content.from_dict(kept) == inner  # type: ignore[arg-type]
    json.dumps(target.to_dict())  # JSON-safe


async def test_a_value_json_cannot_hold_is_kept_as_its_text() -> None:
    result = {("tuple", "key"): "x" * 8_000}  # JSON keys must be strings: sent as its str, as the clients do
    messages = structured_conversation(result)
    await AnchoredCompactionStrategy(max_input_tokens=100_000, tokenizer=TOKENIZER, keep_tokens=150)(messages)
    target = shortened(messages)[0]
    assert original_results(target) == {target.contents[0].call_id: str(result)}


async def test_string_results_are_kept_as_their_text_as_before() -> None:
    messages = structured_conversation("code=TL-3FA9C2\n" * 500)
    await AnchoredCompactionStrategy(max_input_tokens=100_000, tokenizer=TOKENIZER, keep_tokens=150)(messages)
    rewritten = [m for m in messages if m.role == "tool" and is_shortened(m.contents[0].result or "")]
    assert rewritten
    for message in rewritten:
        assert original_results(message) == {message.contents[0].call_id: "code=TL-3FA9C2\n" * 500}


async def test_a_shortened_structured_result_still_reads_as_structured() -> None:
    """Partial records never rewrite a structured result; shortening does not make it plain text.

    The shortened text is no longer JSON, so the part is structured because its kept
    original is a dict, and the original text the core reads is the JSON the model saw.
    """
    messages = structured_conversation(DICT_RESULT)
    await AnchoredCompactionStrategy(max_input_tokens=100_000, tokenizer=TOKENIZER, keep_tokens=150)(messages)
    target = shortened(messages)[0]
    (part,) = HistoryCache(MediaTokenEstimator(TOKENIZER).parts).history([target], note_kind="anchored")[0].parts
    assert is_shortened(part.text)
    assert part.structured
    assert part.original == json.dumps(DICT_RESULT)
