"""Workload files and session exports load into the scenario they describe, or fail clearly."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agent_framework import (
    Agent,
    AgentSession,
    CharacterEstimatorTokenizer,
    CompactionProvider,
    Content,
    FileSessionStore,
    InMemoryHistoryProvider,
    Message,
)
from agent_framework._compaction import ToolResultCompactionStrategy
from hypothesis import given
from hypothesis import strategies as st

from maf_compaction.adapters.anchored import AnchoredCompactionStrategy
from maf_compaction.adapters.convert import NOTE_KEY
from maf_compaction.bench.client import SimulatedChatClient, scenario_tools
from maf_compaction.bench.model import ScriptedModel
from maf_compaction.bench.provider import SimulatedProvider
from maf_compaction.bench.scenario import (
    LOOKUP_TOOL,
    RECALL_TOOL,
    Fact,
    GeneratorOptions,
    Media,
    Probe,
    Scenario,
    ToolCall,
    ToolSpec,
    Turn,
    generate,
)
from maf_compaction.bench.simulator import get_profile
from maf_compaction.bench.workload_file import (
    SUPPORTED_VERSION,
    WorkloadError,
    load_facts,
    load_session,
    load_workload,
)
from offline_tokenizers import offline_tiktoken

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(40))).decode()

JsonDict = dict[str, Any]


def example() -> JsonDict:
    """A workload using every field of the format."""
    return {
        "version": 1,
        "name": "my-run",
        "system": "You are an operations assistant.",
        "tools": [
            {
                "name": "lookup",
                "description": "Fetch the records of a lookup.",
                "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            },
            {"name": "screenshot"},
        ],
        "facts": [
            {"label": "code_1", "value": "TL-3FA9C2", "scope": "lookup 1"},
            {"label": "R1", "value": "RQ-0A1B2C", "scope": "requirements"},
        ],
        "turns": [
            {
                "user": "Requirement R1 (RQ-0A1B2C): go region by region. Here is the map.",
                "media": [
                    {"media_type": "image/png", "uri": "https://example.com/map.png"},
                    {"media_type": "image/png", "data": PNG},
                ],
                "reply": "Noted.",
            },
            {
                "user": "Run lookup 1.",
                "calls": [
                    {
                        "name": "lookup",
                        "arguments": {"n": 1, "deep": {"a": [1, None, True]}},
                        "result": "code_1=TL-3FA9C2",
                    },
                    {
                        "name": "screenshot",
                        "result": "A screenshot of the dashboard.",
                        "media": [{"media_type": "image/png", "data": PNG}],
                    },
                ],
                "reply": "Lookup 1 is loaded.",
            },
            {"user": "Quote code_1.", "probe": {"scope": "lookup 1", "expected": ["TL-3FA9C2"]}},
            {
                "user": "Quote R1 after checking.",
                "calls": [{"name": "screenshot", "result": ""}],
                "probe": {
                    "scope": "requirements",
                    "expected": ["RQ-0A1B2C"],
                },
            },
        ],
    }


def write(tmp_path: Path, data: object, name: str = "workload.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def fails(path: Path, loader: Callable[[Path], object] = load_workload) -> WorkloadError:
    with pytest.raises(WorkloadError) as info:
        loader(path)
    assert str(info.value).startswith(f"{path}: "), str(info.value)
    return info.value


# --- the workload format -------------------------------------------------------------------


def test_full_example_round_trips(tmp_path: Path) -> None:
    scenario = load_workload(write(tmp_path, example()))
    png = Media("image/png", data=PNG)
    assert scenario == Scenario(
        name="my-run",
        system="You are an operations assistant.",
        tools=(
            ToolSpec(
                "lookup",
                "Fetch the records of a lookup.",
                {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            ),
            ToolSpec("screenshot", ""),
        ),
        turns=(
            Turn(
                user="Requirement R1 (RQ-0A1B2C): go region by region. Here is the map.",
                media=(Media("image/png", uri="https://example.com/map.png"), png),
                reply="Noted.",
            ),
            Turn(
                user="Run lookup 1.",
                calls=(
                    ToolCall("lookup", {"n": 1, "deep": {"a": [1, None, True]}}, "code_1=TL-3FA9C2"),
                    ToolCall("screenshot", {}, "A screenshot of the dashboard.", (png,)),
                ),
                reply="Lookup 1 is loaded.",
            ),
            Turn(user="Quote code_1.", probe=Probe("lookup 1", ("TL-3FA9C2",))),
            Turn(
                user="Quote R1 after checking.",
                calls=(ToolCall("screenshot", {}, ""),),
                probe=Probe("requirements", ("RQ-0A1B2C",)),
            ),
        ),
        facts=(Fact("code_1", "TL-3FA9C2", "lookup 1"), Fact("R1", "RQ-0A1B2C", "requirements")),
        meta={"source": "workload", "file": str(tmp_path / "workload.json"), "version": 1},
    )
    assert scenario.turn_for("Quote code_1.") is scenario.turns[2]
    assert type(scenario.turns[1].calls[0].arguments) is dict  # plain JSON, not the parser's own objects


def test_the_documented_example_loads(tmp_path: Path) -> None:
    page = (Path(__file__).parent.parent / "docs" / "workload-format.md").read_text(encoding="utf-8")
    block = page.split("```json\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.json"
    path.write_text(block, encoding="utf-8")
    scenario = load_workload(path)
    assert [t.name for t in scenario.tools] == ["lookup", "screenshot"]
    assert len(scenario.turns) == 3
    assert scenario.turns[2].probe == Probe("all", ("RQ-4F1A9C", "TL-3FA9C2"))
    assert scenario.turns[1].calls[1].media[0].media_type == "image/png"


def test_minimal_file_takes_the_defaults(tmp_path: Path) -> None:
    scenario = load_workload(write(tmp_path, {"version": 1, "turns": [{"user": "hi"}]}, "tiny.json"))
    assert (scenario.name, scenario.system, scenario.tools, scenario.facts) == ("tiny", "", (), ())
    assert scenario.turns == (Turn(user="hi"),)


def test_facts_come_from_the_probes_when_absent(tmp_path: Path) -> None:
    data = example()
    del data["facts"]
    data["turns"].append({"user": "Again.", "probe": {"scope": "again", "expected": ["TL-3FA9C2", "XX-000000"]}})
    scenario = load_workload(write(tmp_path, data))
    assert scenario.facts == (
        Fact("TL-3FA9C2", "TL-3FA9C2", "lookup 1"),
        Fact("RQ-0A1B2C", "RQ-0A1B2C", "requirements"),
        Fact("XX-000000", "XX-000000", "again"),
    )


def test_an_empty_facts_list_means_no_facts(tmp_path: Path) -> None:
    data = example()
    data["facts"] = []
    assert load_workload(write(tmp_path, data)).facts == ()


def test_the_message_reads_file_path_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = example()
    data["turns"][3]["calls"][0]["result"] = 12
    write(tmp_path, data)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(WorkloadError) as info:
        load_workload("workload.json")
    assert str(info.value) == "workload.json: turns[3].calls[0].result: expected a string, got 12"
    assert (info.value.file, info.value.where) == ("workload.json", "turns[3].calls[0].result")
    assert isinstance(info.value, ValueError)


def _set(path: tuple[str | int, ...], value: object) -> Callable[[JsonDict], None]:
    def edit(data: JsonDict) -> None:
        target: Any = data
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return edit


def _drop(path: tuple[str | int, ...]) -> Callable[[JsonDict], None]:
    def edit(data: JsonDict) -> None:
        target: Any = data
        for step in path[:-1]:
            target = target[step]
        del target[path[-1]]

    return edit


# (edit, where, words the problem must contain)
INVALID: dict[str, tuple[Callable[[JsonDict], None], str, tuple[str, ...]]] = {
    "unknown top-level key": (_set(("tols",), []), "tols", ("unknown top-level key", 'did you mean "tools"')),
    "unknown turn key": (_set(("turns", 1, "rpely"), "x"), "turns[1].rpely", ("unknown key", 'did you mean "reply"')),
    "unknown call key": (_set(("turns", 1, "calls", 0, "args"), {}), "turns[1].calls[0].args", ("arguments",)),
    "unknown probe key": (_set(("turns", 2, "probe", "expect"), []), "turns[2].probe.expect", ("expected",)),
    "unknown media key": (_set(("turns", 0, "media", 0, "url"), "x"), "turns[0].media[0].url", ('"uri"',)),
    "unknown tool key": (_set(("tools", 0, "params"), {}), "tools[0].params", ("parameters",)),
    "unknown fact key": (_set(("facts", 0, "note"), ""), "facts[0].note", ("unknown key",)),
    "missing version": (_drop(("version",)), "version", ("required field is missing", "version 1")),
    "missing turns": (_drop(("turns",)), "turns", ("required field is missing",)),
    "missing user": (_drop(("turns", 2, "user")), "turns[2].user", ("required field is missing",)),
    "missing result": (_drop(("turns", 1, "calls", 1, "result")), "turns[1].calls[1].result", ("missing",)),
    "missing tool name": (_drop(("tools", 1, "name")), "tools[1].name", ("missing",)),
    "missing fact scope": (_drop(("facts", 1, "scope")), "facts[1].scope", ("missing",)),
    "missing probe scope": (_drop(("turns", 2, "probe", "scope")), "turns[2].probe.scope", ("missing",)),
    "missing media type": (_drop(("turns", 0, "media", 1, "media_type")), "turns[0].media[1].media_type", ("missing",)),
    "version newer": (_set(("version",), 2), "version", ("newer", f"reads version {SUPPORTED_VERSION}")),
    "version older": (_set(("version",), 0), "version", ("0 is not a version", "reads version 1")),
    "version a string": (_set(("version",), "1"), "version", ('expected an integer, got "1"',)),
    "version a bool": (_set(("version",), True), "version", ("expected an integer, got true",)),
    "turns not a list": (_set(("turns",), {"user": "x"}), "turns", ("expected a list",)),
    "no turns": (_set(("turns",), []), "turns", ("at least one turn",)),
    "turn not an object": (_set(("turns", 1), "hello"), "turns[1]", ('expected an object, got "hello"',)),
    "user not a string": (_set(("turns", 0, "user"), ["a"]), "turns[0].user", ('expected a string, got ["a"]',)),
    "empty user": (_set(("turns", 1, "user"), "  "), "turns[1].user", ("must not be empty",)),
    "duplicate user": (_set(("turns", 3, "user"), "Run lookup 1."), "turns[3].user", ("repeats", "turns[1].user")),
    "reply not a string": (_set(("turns", 0, "reply"), None), "turns[0].reply", ("expected a string, got null",)),
    "undeclared tool": (
        _set(("turns", 1, "calls", 0, "name"), "lookpu"),
        "turns[1].calls[0].name",
        ('"lookpu" is not a declared tool', "lookup, screenshot"),
    ),
    "arguments not an object": (
        _set(("turns", 1, "calls", 0, "arguments"), [1]),
        "turns[1].calls[0].arguments",
        ("expected an object",),
    ),
    "calls not a list": (_set(("turns", 1, "calls"), {}), "turns[1].calls", ("expected a list",)),
    "probe without values": (_set(("turns", 2, "probe", "expected"), []), "turns[2].probe.expected", ("at least one",)),
    "probe value empty": (_set(("turns", 2, "probe", "expected"), [""]), "turns[2].probe.expected[0]", ("empty",)),
    "probe value twice": (
        _set(("turns", 2, "probe", "expected"), ["A", "A"]),
        "turns[2].probe.expected[1]",
        ("twice",),
    ),
    "probe not an object": (_set(("turns", 2, "probe"), None), "turns[2].probe", ("expected an object",)),
    "reply on a probe turn": (_set(("turns", 2, "reply"), "Sure."), "turns[2].reply", ("probe turn",)),
    "duplicate tool": (_set(("tools", 1, "name"), "lookup"), "tools[1].name", ("repeats tools[0].name",)),
    "reserved tool": (_set(("tools", 1, "name"), RECALL_TOOL), "tools[1].name", ("reserved",)),
    "parameters not an object": (_set(("tools", 0, "parameters"), "x"), "tools[0].parameters", ("expected an object",)),
    "parameters of another type": (
        _set(("tools", 0, "parameters", "type"), "array"),
        "tools[0].parameters.type",
        ('"object"',),
    ),
    "duplicate fact label": (_set(("facts", 1, "label"), "code_1"), "facts[1].label", ("repeats facts[0].label",)),
    "empty fact value": (_set(("facts", 0, "value"), ""), "facts[0].value", ("empty",)),
    "name empty": (_set(("name",), ""), "name", ("empty",)),
    "system not a string": (_set(("system",), 3), "system", ("expected a string, got 3",)),
    "media both": (_set(("turns", 0, "media", 0, "data"), PNG), "turns[0].media[0]", ("exactly one", "not both")),
    "media neither": (_drop(("turns", 0, "media", 0, "uri")), "turns[0].media[0]", ("exactly one",)),
    "media bad base64": (
        _set(("turns", 1, "calls", 1, "media", 0, "data"), "abc!"),
        "turns[1].calls[1].media[0].data",
        ("not valid base64",),
    ),
    "media bad padding": (_set(("turns", 0, "media", 1, "data"), "abcde"), "turns[0].media[1].data", ("base64",)),
    "media type not a MIME type": (
        _set(("turns", 0, "media", 0, "media_type"), "png"),
        "turns[0].media[0].media_type",
        ("MIME type",),
    ),
    "media uri empty": (_set(("turns", 0, "media", 0, "uri"), ""), "turns[0].media[0].uri", ("empty",)),
    "media uri null": (_set(("turns", 0, "media", 0, "uri"), None), "turns[0].media[0].uri", ("got null",)),
    "name null": (_set(("name",), None), "name", ("expected a string, got null",)),
    "facts null": (_set(("facts",), None), "facts", ("expected a list, got null",)),
    "blank probe value": (
        _set(("turns", 2, "probe", "expected"), ["A", " \t"]),
        "turns[2].probe.expected[1]",
        ("empty",),
    ),
    "arguments null": (_set(("turns", 1, "calls", 0, "arguments"), None), "turns[1].calls[0].arguments", ("got null",)),
}


@pytest.mark.parametrize("case", list(INVALID), ids=list(INVALID))
def test_invalid_workload_names_file_turn_and_field(tmp_path: Path, case: str) -> None:
    edit, where, words = INVALID[case]
    data = example()
    edit(data)
    error = fails(write(tmp_path, data))
    assert error.where == where
    assert str(error).startswith(f"{tmp_path / 'workload.json'}: {where}: ")
    for word in words:
        assert word in error.problem, error.problem


def test_a_key_given_twice_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "workload.json"
    path.write_text('{"version": 1, "turns": [{"user": "a", "reply": "x", "reply": "y"}]}', encoding="utf-8")
    assert fails(path).where == "turns[0].reply"
    path.write_text(
        '{"version": 1, "tools": [{"name": "t"}], "turns": [{"user": "a", "calls": '
        '[{"name": "t", "result": "", "arguments": {"k": {"x": 1, "x": 2}}}]}]}',
        encoding="utf-8",
    )
    assert fails(path).where == "turns[0].calls[0].arguments.k.x"


def test_odd_keys_are_quoted_in_the_path(tmp_path: Path) -> None:
    error = fails(write(tmp_path, {"version": 1, "turns": [{"user": "a", "my key": 1}]}))
    assert error.where == 'turns[0]["my key"]'


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b'{"version": 1,\n "turns": [}', ("invalid JSON at line 2, column 12",)),
        (b"", ("invalid JSON at line 1, column 1",)),
        (b'{"version": 1, "turns": [{"user": "a", "reply": NaN}]}', ("NaN is not a JSON value",)),
        (b"\xff\xfe{}", ("not UTF-8",)),
        (b"[1, 2]", ("expected an object, got [1, 2]",)),
        (b'{"type": "session", "session_id": "s", "state": {}}', ("AgentSession export", "--session")),
    ],
    ids=["syntax", "empty", "nan", "not-utf8", "not-an-object", "a-session-export"],
)
def test_unreadable_content_is_an_error(tmp_path: Path, content: bytes, words: tuple[str, ...]) -> None:
    path = tmp_path / "workload.json"
    path.write_bytes(content)
    error = fails(path)
    for word in words:
        assert word in error.problem, error.problem


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    assert "cannot read the file" in fails(tmp_path / "absent.json").problem
    assert "cannot read the file" in fails(tmp_path).problem  # a directory


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "workload.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"version": 1, "turns": [{"user": "a"}]}).encode())
    assert load_workload(path).turns == (Turn(user="a"),)


def test_base64_may_be_wrapped_and_is_stored_without_line_breaks(tmp_path: Path) -> None:
    wrapped = "\n".join(PNG[i : i + 16] for i in range(0, len(PNG), 16))
    data = {"version": 1, "turns": [{"user": "a", "media": [{"media_type": "image/png", "data": wrapped}]}]}
    assert load_workload(write(tmp_path, data)).turns[0].media == (Media("image/png", data=PNG),)


@pytest.mark.parametrize("media_type", ["application/vnd.ms-excel", "image/svg+xml", "text/plain; charset=utf-8"])
def test_media_types_with_vendor_suffixes_and_parameters_pass(tmp_path: Path, media_type: str) -> None:
    data = {"version": 1, "turns": [{"user": "a", "media": [{"media_type": media_type, "uri": "file:///tmp/x"}]}]}
    assert load_workload(write(tmp_path, data)).turns[0].media[0].media_type == media_type


def test_facts_file(tmp_path: Path) -> None:
    path = write(tmp_path, [{"label": "a", "value": "TL-000001", "scope": "s"}], "facts.json")
    assert load_facts(path) == (Fact("a", "TL-000001", "s"),)
    error = fails(write(tmp_path, [{"label": "a", "value": 1, "scope": "s"}], "facts.json"), load_facts)
    assert error.where == "[0].value"
    assert "expected a list" in fails(write(tmp_path, {"facts": []}, "facts.json"), load_facts).problem


# --- property: any valid workload loads and every field round-trips ------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=12)
_word = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12).filter(lambda s: s.strip() != "")
_json_leaf = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | _text
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
_media = st.builds(
    lambda mt, uri, raw, by_uri: (
        {"media_type": mt, "uri": uri} if by_uri else {"media_type": mt, "data": base64.b64encode(raw).decode()}
    ),
    st.sampled_from(["image/png", "image/jpeg", "application/pdf", "audio/wav"]),
    st.from_regex(r"https://example\.com/[a-z0-9]{1,8}", fullmatch=True),
    st.binary(min_size=1, max_size=16),
    st.booleans(),
)


@st.composite
def workloads(draw: st.DrawFn) -> JsonDict:
    tool_names = draw(st.lists(_word.filter(lambda s: s != RECALL_TOOL), max_size=3, unique=True))
    tools: list[JsonDict] = []
    for name in tool_names:
        tool: JsonDict = {"name": name}
        if draw(st.booleans()):
            tool["description"] = draw(_text)
        if draw(st.booleans()):
            tool["parameters"] = {"type": "object", "properties": draw(st.dictionaries(_text, _json, max_size=2))}
        tools.append(tool)
    users = draw(st.lists(_word, min_size=1, max_size=5, unique=True))
    turns: list[JsonDict] = []
    for user in users:
        turn: JsonDict = {"user": user}
        if draw(st.booleans()):
            turn["media"] = draw(st.lists(_media, max_size=2))
        if tool_names and draw(st.booleans()):
            turn["calls"] = [
                {
                    "name": draw(st.sampled_from(tool_names)),
                    "arguments": draw(st.dictionaries(_text, _json, max_size=3)),
                    "result": draw(_text),
                    "media": draw(st.lists(_media, max_size=1)),
                }
                for _ in range(draw(st.integers(1, 2)))
            ]
        if draw(st.booleans()):
            turn["probe"] = {
                "scope": draw(_word),
                "expected": draw(st.lists(_word, min_size=1, max_size=3, unique=True)),
            }
        elif draw(st.booleans()):
            turn["reply"] = draw(_text)
        turns.append(turn)
    data: JsonDict = {"version": 1, "tools": tools, "turns": turns}
    if draw(st.booleans()):
        data["system"] = draw(_text)
    if draw(st.booleans()):
        data["name"] = draw(_word)
    if draw(st.booleans()):
        labels = draw(st.lists(_word, max_size=3, unique=True))
        data["facts"] = [{"label": label, "value": draw(_word), "scope": draw(_text)} for label in labels]
    return data


def _media_of(spec: JsonDict) -> Media:
    return Media(spec["media_type"], uri=spec.get("uri"), data=spec.get("data"))


@given(workloads())
def test_any_valid_workload_round_trips(tmp_path_factory: pytest.TempPathFactory, data: JsonDict) -> None:
    path = write(tmp_path_factory.getbasetemp(), data, "property.json")
    scenario = load_workload(path)
    assert scenario.name == data.get("name", "property")
    assert scenario.system == data.get("system", "")
    assert [(t.name, t.description, dict(t.parameters)) for t in scenario.tools] == [
        (t["name"], t.get("description", ""), t.get("parameters", ToolSpec("x", "").parameters)) for t in data["tools"]
    ]
    assert len(scenario.turns) == len(data["turns"])
    for turn, spec in zip(scenario.turns, data["turns"], strict=True):
        assert turn.user == spec["user"]
        assert turn.reply == spec.get("reply", "")
        assert turn.media == tuple(map(_media_of, spec.get("media", [])))
        probe = spec.get("probe")
        assert turn.probe == (Probe(probe["scope"], tuple(probe["expected"])) if probe else None)
        assert [(c.name, c.arguments, c.result, c.media) for c in turn.calls] == [
            (c["name"], c["arguments"], c["result"], tuple(map(_media_of, c["media"]))) for c in spec.get("calls", [])
        ]
    if "facts" in data:
        assert scenario.facts == tuple(Fact(f["label"], f["value"], f["scope"]) for f in data["facts"])
    else:
        values = [v for t in data["turns"] if "probe" in t for v in t["probe"]["expected"]]
        assert [f.value for f in scenario.facts] == list(dict.fromkeys(values))


# --- session exports -----------------------------------------------------------------------

ACK = "Understood."
#: Three lookup results of the generated workload, about 1,600 tokens each, 8 planted codes each.
GENERATED = generate(GeneratorOptions(context_window=8_192, fill=1.0, tool_turns=3, seed=5))
LOOKUPS = (("billing-api", 3), ("search", 2), ("ledger", 1))


def _lookup_turn(lookup: int, service: str, code: int) -> Turn:
    """Lookup ``lookup`` of the generated workload, asked about as ``service``; the reply quotes one code."""
    (call,) = next(t.calls for t in GENERATED.turns if t.calls and t.calls[0].arguments == {"lookup": lookup})
    fact = next(f for f in GENERATED.facts if f.label == f"code_{lookup}_{code}")
    return Turn(
        f"Look up the deployment log of {service} and tell me {fact.label}",
        calls=(ToolCall(LOOKUP_TOOL, {"service": service}, call.result),),
        reply=f"{service}: {fact.label} is {fact.value}.",
    )


#: What the recorded session plays: a greeting, three lookups, the greeting again, thanks.
RECORDED = Scenario(
    "recorded",
    "Answer from the lookups.",
    (ToolSpec(LOOKUP_TOOL, "Fetch the records of a service."),),
    (
        Turn("Hello there", reply=ACK),
        *(_lookup_turn(n, service, code) for n, (service, code) in enumerate(LOOKUPS, start=1)),
        Turn("Thanks", reply=ACK),
    ),
)
USER_TEXTS = (*(t.user for t in RECORDED.turns[:4]), "Hello there", "Thanks")


async def _run_session(after: Any = None) -> JsonDict:
    """A real session: the scripted model behind the framework's Agent, history in memory."""
    history = InMemoryHistoryProvider()
    providers: list[Any] = [history]
    if after is not None:
        providers.append(CompactionProvider(after_strategy=after, history_source_id=history.source_id))
    provider = SimulatedProvider(encoder=offline_tiktoken(), window=128_000, profile=get_profile("default"))
    agent = Agent(
        client=SimulatedChatClient(model=ScriptedModel(RECORDED), provider=provider),
        instructions=RECORDED.system,
        tools=scenario_tools(RECORDED),
        context_providers=providers,
    )
    session = agent.create_session()
    for text in USER_TEXTS:
        await agent.run(text, session=session)
    return json.loads(json.dumps(session.to_dict()))


@pytest.fixture(scope="module")
def exports() -> dict[str, JsonDict]:
    """The same conversation stored plainly, and after the framework's and our compaction."""
    with_logs = logging.getLogger("maf_compaction")
    level = with_logs.level
    with_logs.setLevel(logging.ERROR)  # the anchored strategy reports what it sheds
    try:
        return {
            "plain": asyncio.run(_run_session()),
            "tool_result": asyncio.run(_run_session(ToolResultCompactionStrategy(keep_last_tool_call_groups=1))),
            "anchored": asyncio.run(
                _run_session(AnchoredCompactionStrategy(max_input_tokens=1500, tokenizer=CharacterEstimatorTokenizer()))
            ),
        }
    finally:
        with_logs.setLevel(level)


def _stored(export: JsonDict) -> list[JsonDict]:
    return export["state"]["in_memory"]["messages"]


def test_session_replay_reproduces_turns_calls_results_and_replies(
    tmp_path: Path, exports: dict[str, JsonDict]
) -> None:
    scenario = load_session(write(tmp_path, exports["plain"], "session.json"))
    assert scenario.name == "session"
    assert scenario.tools == (ToolSpec(LOOKUP_TOOL, f"A tool the recorded session called ({LOOKUP_TOOL})."),)
    assert [t.user for t in scenario.turns] == [*USER_TEXTS[:4], "Hello there (turn 5)", "Thanks"]
    assert [scenario.turns[i].reply for i in (0, 4, 5)] == [ACK, ACK, ACK]
    for turn, recorded in zip(scenario.turns[1:4], RECORDED.turns[1:4], strict=True):
        assert turn.calls == recorded.calls  # each call with the exact result the tool returned
        assert turn.reply == recorded.reply
    assert all(t.calls == () and t.media == () and t.probe is None for t in (scenario.turns[0], *scenario.turns[4:]))
    assert scenario.meta["renamed_turns"] == 1
    assert scenario.meta["session_id"] == exports["plain"]["session_id"]
    assert scenario.meta["facts_source"] == "found"
    # every planted code of the three lookups, each scoped to the turn that showed it
    assert len(scenario.facts) == 3 * 8
    assert {f.scope for f in scenario.facts} == {"turn 2", "turn 3", "turn 4"}
    assert all(f.value in RECORDED.turns[int(f.scope[-1]) - 1].calls[0].result for f in scenario.facts)


@pytest.mark.parametrize("kind", ["tool_result", "anchored"])
def test_compacted_session_replays_the_original_conversation(
    tmp_path: Path, exports: dict[str, JsonDict], kind: str
) -> None:
    stored = _stored(exports[kind])
    excluded = [m for m in stored if m["additional_properties"].get("_excluded")]
    assert excluded, "the compaction excluded nothing; the test would prove nothing"
    plain = load_session(write(tmp_path, exports["plain"], "plain.json"))
    compacted = load_session(write(tmp_path, exports[kind], f"{kind}.json"))
    assert compacted.turns == plain.turns
    assert (compacted.tools, compacted.facts, compacted.system) == (plain.tools, plain.facts, plain.system)
    assert compacted.meta["excluded_replayed"] == len(excluded)
    if kind == "tool_result":
        assert compacted.meta["skipped_summaries"] == sum(
            m["message_id"].startswith("tool_summary_") for m in stored if m.get("message_id")
        )
        assert compacted.meta["skipped_summaries"] > 0
    else:
        notes = [m for m in stored if m["additional_properties"].get(NOTE_KEY)]
        assert notes
        assert compacted.meta["skipped_notes"] == len(notes)
        assert compacted.meta["restored_results"] > 0  # results the strategy shortened in place come back whole


def _session_with(messages: list[Message], *, source_id: str = "in_memory") -> JsonDict:
    """A session whose history provider stored ``messages`` (the framework's own save path)."""
    session = AgentSession(session_id="built")
    provider = InMemoryHistoryProvider(source_id)
    asyncio.run(provider.save_messages(session.session_id, messages, state=session.state.setdefault(source_id, {})))
    return json.loads(json.dumps(session.to_dict()))


def _call(call_id: str, name: str, arguments: str | dict[str, Any]) -> Content:
    return Content.from_function_call(call_id=call_id, name=name, arguments=arguments)


def test_session_media_calls_and_skipped_messages(tmp_path: Path) -> None:
    image = b"\x89PNG\r\n\x1a\n0123"
    messages = [
        Message("assistant", ["Welcome!"]),  # before the first user message
        Message("system", ["Stored instructions."]),
        Message(
            "user",
            [
                "Look at these",
                Content.from_data(image, "image/png"),
                Content.from_uri("https://example.com/a.jpg", media_type="image/jpeg"),
                Content.from_uri("data:text/plain,hi%20there"),
            ],
        ),
        Message("assistant", ["Let me check.", _call("c1", "shot", '{"page": 2}'), _call("c2", "scan", {"x": 1})]),
        Message(
            "tool",
            [
                Content.from_function_result("c2", result="scanned"),
                Content.from_function_result(
                    "c1", result=[Content.from_text("page 2"), Content.from_data(image, "image/png")]
                ),
            ],
        ),
        Message("assistant", [_call("r1", RECALL_TOOL, {"values": "x"})]),
        Message("tool", [Content.from_function_result("r1", result="recorded")]),
        Message("assistant", ["[compacted]"], additional_properties={NOTE_KEY: "anchored"}),
        Message("assistant", ["Summary of it all"], message_id="summary_9"),
        Message("tool", [Content.from_function_result("nobody", result="orphan")]),
        Message("assistant", ["Both pages look fine."]),
        Message("user", [Content.from_data(image, "image/png")]),  # media only: gets a placeholder text
        Message("assistant", [_call("c3", "scan", {})]),  # never answered
    ]
    scenario = load_session(write(tmp_path, _session_with(messages), "built.json"))
    png = Media("image/png", data=base64.b64encode(image).decode())
    assert scenario.system == "Stored instructions."
    assert scenario.tools == (
        ToolSpec("shot", "A tool the recorded session called (shot)."),
        ToolSpec("scan", "A tool the recorded session called (scan)."),
    )
    assert scenario.turns == (
        Turn(
            user="Look at these",
            media=(
                png,
                Media("image/jpeg", uri="https://example.com/a.jpg"),
                Media("text/plain", data=base64.b64encode(b"hi there").decode()),
            ),
            calls=(ToolCall("shot", {"page": 2}, "page 2", (png,)), ToolCall("scan", {"x": 1}, "scanned")),
            reply="Both pages look fine.",
        ),
        Turn(user="(turn 2)", media=(png,), calls=(ToolCall("scan", {}, ""),)),
    )
    meta = scenario.meta
    assert (meta["skipped_before_first_user"], meta["skipped_notes"], meta["skipped_summaries"]) == (1, 1, 1)
    assert (meta["skipped_recall_calls"], meta["orphan_results"], meta["unanswered_calls"]) == (1, 1, 1)
    assert (meta["renamed_turns"], meta["messages"]) == (1, 13)
    assert scenario.facts == ()


def test_session_facts_file_replaces_found_values(tmp_path: Path, exports: dict[str, JsonDict]) -> None:
    facts = write(tmp_path, [{"label": "c3", "value": "TL-A374AA", "scope": "billing"}], "facts.json")
    scenario = load_session(write(tmp_path, exports["plain"], "session.json"), facts)
    assert scenario.facts == (Fact("c3", "TL-A374AA", "billing"),)
    assert scenario.meta["facts_source"] == "file"
    bad = write(tmp_path, [{"label": "c3"}], "bad-facts.json")
    with pytest.raises(WorkloadError, match=r"bad-facts\.json: \[0\]\.value: required field is missing"):
        load_session(tmp_path / "session.json", bad)


@pytest.mark.filterwarnings("ignore::agent_framework._feature_stage.ExperimentalWarning")
def test_a_file_session_store_snapshot_loads(tmp_path: Path, exports: dict[str, JsonDict]) -> None:
    session = AgentSession.from_dict(exports["plain"])
    asyncio.run(FileSessionStore(tmp_path / "store").set("stored", session))
    (snapshot,) = (tmp_path / "store").iterdir()
    assert json.loads(snapshot.read_text())["version"] == "1.0"
    assert load_session(snapshot).turns == load_session(write(tmp_path, exports["plain"], "s.json")).turns


def test_session_history_is_chosen_by_source_id(tmp_path: Path) -> None:
    data = _session_with([Message("user", ["a"])], source_id="one")
    data["state"]["two"] = _session_with([Message("user", ["b"])], source_id="two")["state"]["two"]
    path = write(tmp_path, data, "two.json")
    assert "several histories" in fails(path, load_session).problem
    assert load_session(path, source_id="two").turns == (Turn(user="b"),)
    error = fails(path, lambda p: load_session(p, source_id="three"))
    assert (error.where, "histories found: one, two" in error.problem) == ("state.three", True)


@pytest.mark.parametrize(
    ("data", "where", "words"),
    [
        ([1], "", ("not an AgentSession export",)),
        ({"type": "thread", "session_id": "s", "state": {}}, "", ("not an AgentSession export",)),
        ({"type": "session", "state": {}}, "", ("not an AgentSession export",)),
        ({"type": "session", "session_id": "s", "state": []}, "state", ("expected an object",)),
        ({"version": 1, "turns": [{"user": "a"}]}, "", ("workload file", "--workload")),
        ({"type": "session", "session_id": "s", "state": {}, "version": "2.0"}, "version", ('"2.0"', '"1.0"')),
        ({"type": "session", "session_id": "s", "state": {}}, "state", ("no stored messages found",)),
        (
            {"type": "session", "session_id": "s", "state": {"in_memory": {"messages": []}}},
            "state.in_memory.messages",
            ("no messages found",),
        ),
        (
            {"type": "session", "session_id": "s", "state": {"in_memory": {"messages": [3]}}},
            "state.in_memory.messages[0]",
            ("expected a message",),
        ),
        (
            {
                "type": "session",
                "session_id": "s",
                "state": {
                    "in_memory": {
                        "messages": [
                            {"type": "message", "role": "assistant", "contents": [{"type": "text", "text": "hi"}]}
                        ]
                    }
                },
            },
            "state.in_memory.messages",
            ("no user message",),
        ),
        (
            {
                "type": "session",
                "session_id": "s",
                "state": {
                    "in_memory": {"messages": [{"type": "message", "role": "user", "contents": [{"text": "no type"}]}]}
                },
            },
            "",
            ("cannot restore",),
        ),
    ],
    ids=[
        "a-list",
        "another-type",
        "no-session-id",
        "state-not-object",
        "a-workload",
        "unknown-version",
        "no-history",
        "empty-history",
        "not-a-message",
        "no-user-message",
        "damaged-message",
    ],
)
def test_session_errors_name_the_file_and_the_problem(
    tmp_path: Path, data: object, where: str, words: tuple[str, ...]
) -> None:
    error = fails(write(tmp_path, data, "export.json"), load_session)
    assert error.where == where
    for word in words:
        assert word in error.problem, error.problem


def test_session_loader_does_not_mutate_or_depend_on_key_order(tmp_path: Path, exports: dict[str, JsonDict]) -> None:
    data = copy.deepcopy(exports["plain"])
    reordered = {key: data[key] for key in reversed(list(data))}
    assert (
        load_session(write(tmp_path, reordered, "r.json")).turns == load_session(write(tmp_path, data, "d.json")).turns
    )
    assert data == exports["plain"]
