"""Registries by configuration: a session entry carries the fingerprint of the stack that wrote it.

A registry serves every session whose fingerprint matches its own builder's, whichever
registry instance wrote it: a web app that builds its agent (and registry) per request, two
registries configured alike in one process (a blue/green reload), replicas. An entry
written under another configuration (budget, policy, mode, tail, tokenizer, a dropped
``describe_media``, a host fallback's parameters) is refused with an error naming the
parameters, and ``registry.migrate(session)`` carries it over on purpose.
"""

from __future__ import annotations

import copy
import gc
import json
from collections.abc import Callable
from typing import Any

import pytest
from agent_framework import AgentSession, CharacterEstimatorTokenizer, Content, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from maf_compaction import (
    AnchoredCompactionStrategy,
    CompactionStack,
    MediaTokenEstimator,
    RecallGate,
    SessionCompactionRegistry,
    SnapshotError,
    SnapshotVersionError,
    StackConfigurationError,
    StackKindError,
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy,
    ToolResultRecallMiddleware,
    UserTurnAnchoredSummarizationCompactionStrategy,
)
from maf_compaction.adapters.fingerprint import tokenizer_identity
from maf_compaction.core.envelope import READS
from offline_tokenizers import offline_tiktoken
from test_sessions import (
    COMPOSITION_BUDGET,
    KEY,
    TINY,
    TOKENIZER,
    Model,
    Summarizer,
    composition_stack,
    entry,
    question,
    records_stack,
    shared_agent,
    texts,
)

OTHER_TOKENIZER = MediaTokenEstimator(CharacterEstimatorTokenizer(), image_tokens=512)


async def describe(content: Content, message: Message) -> str:
    """A describe_media hook (never called here: the conversations have no media)."""
    return "an image"


#: The README composition's parameters; each test changes one.
BASE: dict[str, Any] = {
    "budget": COMPOSITION_BUDGET,
    "head": 3,
    "tail": 4,
    "policy": "shed",
    "mode": "boundary",
    "tokenizer": TOKENIZER,
    "describe_media": describe,
    "coverage": 0.8,
    "user_trigger": None,
    "pin_trigger": None,
    "fallback_tail": None,
}


def builder(summarizer: Any = None, **changes: Any) -> Callable[[], CompactionStack]:
    """A composition builder (or, with ``fallback_tail``, a record stack with a host fallback) from BASE."""
    p = {**BASE, **changes}
    client = summarizer if summarizer is not None else Summarizer()

    def build() -> CompactionStack:
        fallback = None
        if p["fallback_tail"] is not None:
            fallback = AnchoredCompactionStrategy(
                max_input_tokens=p["budget"], tokenizer=p["tokenizer"], keep_tail_groups=p["fallback_tail"]
            )
        records = ToolResultAnchoredSummarizationCompactionStrategy(
            max_input_tokens=p["budget"],
            tokenizer=p["tokenizer"],
            keep_head_groups=p["head"],
            keep_tail_groups=p["tail"],
            coverage_share=p["coverage"],
            fallback=fallback,
            # The middleware shares the record half's trigger (another one is refused at construction).
            **({} if p["pin_trigger"] is None else {"trigger_fraction": p["pin_trigger"]}),
        )
        strategy: Any = records
        if fallback is None:
            users = UserTurnAnchoredSummarizationCompactionStrategy(
                max_input_tokens=p["budget"],
                tokenizer=p["tokenizer"],
                client=client,
                summary_mode=p["mode"],
                remembered_requests=2,
                describe_media=p["describe_media"],
            )
            strategy = ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
                tokenizer=p["tokenizer"],
                tool_results=records,
                user_turns=users,
                overflow_policy=p["policy"],
                user_trigger_fraction=p["user_trigger"],
            )
        gate = RecallGate()
        recall = ToolResultRecallMiddleware(
            max_input_tokens=p["budget"],
            tokenizer=p["tokenizer"],
            arm=gate.arm,
            disarm=gate.disarm,
            trigger_fraction=records.trigger_fraction,
            reforce=records.take_reforce,
        )
        return CompactionStack(strategy, gate, recall)

    return build


def written_by(build: Callable[[], CompactionStack]) -> dict[str, Any]:
    """A session entry written by a registry over ``build`` (the gate armed: a decision to carry)."""
    session = AgentSession()
    with SessionCompactionRegistry(build).phase(session) as stack:
        stack.gate.arm()
    return entry(session)


# --- a registry per request, two registries on one session --------------------------------------------


def _kinds() -> list[tuple[str, Callable[[Summarizer], Callable[[], CompactionStack]]]]:
    return [
        ("records", lambda summarizer: records_stack),
        ("composition", lambda summarizer: lambda: composition_stack(summarizer, budget=LONG_BUDGET)),
    ]


TURNS = 12
#: A composition budget that lasts TURNS turns with records and summaries along the way.
LONG_BUDGET = 1_500


async def _one_registry(kind: int) -> tuple[list[str], int]:
    summarizer, client = Summarizer(), Model()
    agent = shared_agent(SessionCompactionRegistry(_kinds()[kind][1](summarizer)), client)
    session = agent.create_session()
    for number in range(TURNS):
        await agent.run(question(number), session=session)
    assert kind == 0 or summarizer.calls > 0, "the composition summarized nothing: nothing to carry"
    return texts(client.requests), summarizer.calls


@pytest.mark.parametrize("kind", [0, 1], ids=[name for name, _ in _kinds()])
@pytest.mark.parametrize("old", ["kept-alive", "dropped", "collected"])
async def test_a_registry_built_per_request_serves_the_session_like_one_registry(kind: int, old: str) -> None:
    """A web app that builds its agent and registry per request: every request of the session is served, with the
    requests and summarizer calls of one long-lived registry, whether old registries are alive, dropped or
    collected."""
    expected, expected_calls = await _one_registry(kind)
    summarizer, client = Summarizer(), Model()
    alive: list[Any] = []
    session = AgentSession()
    for number in range(TURNS):
        registry = SessionCompactionRegistry(_kinds()[kind][1](summarizer))
        agent = shared_agent(registry, client)
        await agent.run(question(number), session=session)
        if old == "kept-alive":
            alive.append((registry, agent))
        del registry, agent
        if old == "collected":
            gc.collect()
    assert texts(client.requests) == expected
    assert summarizer.calls == expected_calls


@pytest.mark.parametrize("kind", [0, 1], ids=[name for name, _ in _kinds()])
async def test_two_registries_configured_alike_alternate_on_one_session_through_json(kind: int) -> None:
    """Two live registries configured alike (an in-process replica, a blue/green reload) take turns on one
    session, moved through AgentSession.to_dict() JSON between turns: no error, the private requests."""
    expected, expected_calls = await _one_registry(kind)
    summarizer, client = Summarizer(), Model()
    agents = [shared_agent(SessionCompactionRegistry(_kinds()[kind][1](summarizer)), client) for _ in range(2)]
    session = agents[0].create_session()
    for number in range(TURNS):
        await agents[number % 2].run(question(number), session=session)
        session = AgentSession.from_dict(json.loads(json.dumps(session.to_dict())))
    assert texts(client.requests) == expected
    assert summarizer.calls == expected_calls


def test_a_stack_built_alike_in_any_registry_has_the_same_fingerprint() -> None:
    first, second = SessionCompactionRegistry(builder()), SessionCompactionRegistry(builder())
    assert first.configuration == second.configuration
    assert first.configuration.parameters["strategy.records.fallback.keep_tail_groups"] == 4
    assert first.configuration.parameters["strategy.users.describe_media"] is True
    assert str(first.configuration.parameters["tokenizer"]).endswith("CharacterEstimatorTokenizer")
    # A long prompt is a digest: named and compared, not copied into every session.
    assert str(first.configuration.parameters["strategy.users.prompt"]).startswith("sha256:")
    # What each pass reads from the host's last request (the answer's output cap) is no configuration.
    assert not [name for name in first.configuration.parameters if name.endswith("answer_tokens")]


# --- a different configuration is refused, naming the parameter ----------------------------------------

CHANGES: list[tuple[str, dict[str, Any], str]] = [
    ("budget", {"budget": COMPOSITION_BUDGET * 2}, "strategy.records.max_input_tokens"),
    ("policy", {"policy": "raise"}, "strategy.overflow_policy"),
    ("mode", {"mode": "fold"}, "strategy.users.summary_mode"),
    ("tail", {"tail": 6}, "strategy.records.keep_tail_groups"),
    ("head", {"head": 2}, "strategy.records.keep_head_groups"),
    ("coverage", {"coverage": 0.5}, "strategy.records.coverage_share"),
    ("user-trigger", {"user_trigger": 0.5}, "strategy.users.trigger_fraction"),
    ("pin-trigger", {"pin_trigger": 0.5}, "recall.trigger_fraction"),
    ("tokenizer", {"tokenizer": OTHER_TOKENIZER}, "tokenizer"),
    ("describe-media-dropped", {"describe_media": None}, "strategy.users.describe_media"),
]


@pytest.mark.parametrize(("case", "change", "named"), CHANGES, ids=[c[0] for c in CHANGES])
def test_an_entry_written_under_another_configuration_is_refused_naming_the_parameter(
    case: str, change: dict[str, Any], named: str
) -> None:
    stored = written_by(builder())
    registry = SessionCompactionRegistry(builder(**change))
    session = AgentSession()
    session.state[KEY] = copy.deepcopy(stored)
    with pytest.raises(StackConfigurationError, match=rf"\b{named}\b") as raised, registry.phase(session):
        pass
    assert named in [name for name, _, _ in raised.value.differing]
    assert "registry.migrate(session)" in str(raised.value)
    assert isinstance(raised.value, SnapshotError)
    assert session.state[KEY] == stored, "a refused phase wrote"


def test_a_host_fallbacks_parameters_are_part_of_the_configuration() -> None:
    """A record half built with an explicit fallback strategy: that fallback's parameters are compared too."""
    stored = written_by(builder(fallback_tail=4))
    session = AgentSession()
    session.state[KEY] = copy.deepcopy(stored)
    registry = SessionCompactionRegistry(builder(fallback_tail=2))
    with (
        pytest.raises(StackConfigurationError, match=r"fallback\.keep_tail_groups is 4 .*, 2 "),
        registry.phase(session),
    ):
        pass
    with SessionCompactionRegistry(builder(fallback_tail=4)).phase(session) as stack:
        assert stack.gate.armed


def test_an_entry_whose_digest_does_not_match_its_parameters_is_refused() -> None:
    """The digest is compared first: an entry of another configuration carrying the builder's digest (edited, or
    written by a buggy writer) must not pass on it."""
    stored = written_by(builder(tail=2))
    own = written_by(builder())
    session = AgentSession()
    session.state[KEY] = copy.deepcopy(stored)
    session.state[KEY]["configuration"]["digest"] = own["configuration"]["digest"]
    with pytest.raises(SnapshotError, match="digest"), SessionCompactionRegistry(builder()).phase(session):
        pass


def test_a_kind_change_is_still_a_stack_kind_error() -> None:
    stored = written_by(records_stack)
    session = AgentSession()
    session.state[KEY] = stored
    with pytest.raises(StackKindError), SessionCompactionRegistry(builder()).phase(session):
        pass


def test_migrate_carries_the_decisions_over_to_the_new_configuration_on_purpose() -> None:
    stored = written_by(builder())
    session = AgentSession()
    session.state[KEY] = copy.deepcopy(stored)
    larger = SessionCompactionRegistry(builder(budget=COMPOSITION_BUDGET * 2))
    assert larger.migrate(session)
    assert session.state[KEY]["configuration"] == larger.configuration.to_dict()
    migrated = session.state[KEY]
    assert (migrated["strategy"], migrated["state"]) == (stored["strategy"], stored["state"]), (
        "the decisions changed in the migration"
    )
    with larger.phase(session) as stack:
        assert stack.gate.armed
    assert not larger.migrate(AgentSession()), "nothing to migrate"
    # The old configuration now refuses the migrated entry.
    with pytest.raises(StackConfigurationError), SessionCompactionRegistry(builder()).phase(session):
        pass


def test_a_builder_that_changes_its_configuration_between_stacks_is_refused() -> None:
    budgets = iter([TINY, TINY * 7])
    registry = SessionCompactionRegistry(lambda: records_stack(next(budgets)), max_cached_sessions=0)
    with registry.phase(AgentSession()):
        pass
    with (
        pytest.raises(ValueError, match=r"configured differently from its first one \(.*max_input_tokens"),
        registry.phase(AgentSession()),
    ):
        pass


# --- the property ------------------------------------------------------------------------------------------

SPACE: dict[str, list[Any]] = {
    "budget": [COMPOSITION_BUDGET, COMPOSITION_BUDGET + 1],
    "tail": [3, 4],
    "policy": ["shed", "raise"],
    "mode": ["boundary", "recompact"],
    "tokenizer": [TOKENIZER, OTHER_TOKENIZER],
}
configurations = st.fixed_dictionaries({name: st.sampled_from(values) for name, values in SPACE.items()})


@settings(max_examples=40, deadline=None)
@given(configurations, configurations)
def test_an_entry_is_served_exactly_when_the_configurations_match(
    writer: dict[str, Any], reader: dict[str, Any]
) -> None:
    """A registry continues an entry iff its builder's parameters equal the writer's; otherwise the error names
    exactly the parameters that differ."""
    stored = written_by(builder(**writer))
    registry = SessionCompactionRegistry(builder(**reader))
    session = AgentSession()
    session.state[KEY] = stored
    built = registry.configuration.parameters
    written = stored["configuration"]["parameters"]
    differing = sorted(
        name
        for name in set(built) | set(written)
        if (name in built) != (name in written) or built.get(name) != written.get(name)
    )
    if writer == reader:
        assert not differing
        with registry.phase(session) as stack:
            assert stack.gate.armed
        return
    assert differing, f"{writer} and {reader} differ but their fingerprints do not"
    with pytest.raises(StackConfigurationError) as raised, registry.phase(session):
        pass
    assert [name for name, _, _ in raised.value.differing] == differing


def _older_entries(stored: dict[str, Any]) -> list[dict[str, Any]]:
    """``stored`` in the shapes earlier builds wrote: version 1 of the old format named its registry instance,
    version 2 named its configuration; both nested the stack (``{"kind": "stack", "version": 2, ...}``), whose
    state lacked what version 5 added."""
    recall = {k: v for k, v in stored["state"]["recall"].items() if k != "ignored_summaries"}
    if recall["seen"] is not None:
        recall["seen"] = {k: v for k, v in recall["seen"].items() if k != "pending_tokens"}
    state = {**stored["state"], "recall": recall}
    stack = {"kind": "stack", "version": 2, "strategy": stored["strategy"], "state": state}
    return [
        {"kind": "session_compaction", "version": 1, "registry": "a-registry-id", "stack": stack},
        {"kind": "session_compaction", "version": 2, "configuration": stored["configuration"], "stack": stack},
    ]


def test_an_entry_that_names_its_registry_is_another_shape_refused_naming_the_field() -> None:
    """Version 1 of the old format named its registry instance and nested the stack: it carries this build's
    version number but not its shape, so it is refused as malformed (naming the missing configuration), whichever
    kind of stack reads it, by phase and by migrate alike, and the session is left as it was."""
    old = _older_entries(written_by(builder()))[0]
    for build in (builder(), records_stack):
        session = AgentSession()
        session.state[KEY] = copy.deepcopy(old)
        registry = SessionCompactionRegistry(build)
        with pytest.raises(SnapshotError, match="'configuration'") as raised, registry.phase(session):
            pass
        assert not isinstance(raised.value, SnapshotVersionError)
        assert session.state[KEY] == old, "a refused phase wrote"
        with pytest.raises(SnapshotError, match="'configuration'"):
            registry.migrate(session)
        assert session.state[KEY] == old, "a refused migration wrote"


def test_an_entry_that_nests_its_stack_is_refused_with_snapshot_version_error() -> None:
    """Version 2 of the old format nested the stack under its own header: the stored format started over at
    version 1 and nothing older is read, so it is refused with SnapshotVersionError, whichever kind of stack reads
    it, by phase and by migrate alike, and the session is left as it was."""
    old = _older_entries(written_by(builder()))[1]
    for build in (builder(), records_stack):
        session = AgentSession()
        session.state[KEY] = copy.deepcopy(old)
        registry = SessionCompactionRegistry(build)
        with (
            pytest.raises(SnapshotVersionError, match="'session_compaction' snapshot version 2 is not") as raised,
            registry.phase(session),
        ):
            pass
        assert (raised.value.version, raised.value.kind, raised.value.supported) == (2, "session_compaction", READS)
        assert "it reads versions 1 and 5" in str(raised.value)
        assert "delete the entry" in str(raised.value)
        assert session.state[KEY] == old, "a refused phase wrote"
        with pytest.raises(SnapshotVersionError):
            registry.migrate(session)
        assert session.state[KEY] == old, "a refused migration wrote"


class CountingTokenizer:
    """A host's tokenizer that counts its calls: state, not a setting."""

    def __init__(self) -> None:
        self.calls = 0

    def count_tokens(self, text: str) -> int:
        """A quarter of the characters."""
        self.calls += 1
        return max(1, len(text) // 4)


def test_a_tokenizer_is_known_by_its_class_and_declared_settings_not_its_counters() -> None:
    counting = CountingTokenizer()
    registry = SessionCompactionRegistry(builder(tokenizer=counting), max_cached_sessions=0)
    before = registry.configuration
    assert before.parameters["tokenizer"] == f"{__name__}.CountingTokenizer"
    counting.calls = 12_345
    session = AgentSession()
    with registry.phase(session):  # a new stack, built after the counter moved: the same configuration
        pass
    with registry.phase(session):
        pass
    assert session.state[KEY]["configuration"] == before.to_dict()
    tiktoken = offline_tiktoken()
    assert tokenizer_identity(tiktoken) == {
        "tokenizer": "maf_compaction.adapters.tiktoken.TiktokenTokenizer",
        "tokenizer.encoding": "o200k_base",
    }
    assert tokenizer_identity(OTHER_TOKENIZER)["tokenizer.image_tokens"] == 512
