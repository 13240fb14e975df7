"""Real client mode over its whole life: clean exits, and servers that can share a session (issue 18).

Findings pinned here:

- ``maf-compaction bench --client ...`` printed "Task exception was never retrieved ...
  RuntimeError: Event loop is closed" at exit once a worker ran two cells: the cells'
  ``AsyncOpenAI`` clients were left for the garbage collector, which closed them on an
  event loop already gone. The runner now closes them inside the cell.
- Two ``LoopbackProvider``s started independently issued the same item ids, so a session
  moved from one to the other failed in the real client ("Stateless replay cannot
  reconstruct reasoning item(s) ..."). A server without an explicit ``id_seed`` now draws
  one from the operating system's randomness.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from agent_framework import Agent, AgentSession
from agent_framework.exceptions import ChatClientInvalidRequestException

from maf_compaction.bench import loopback, runner
from maf_compaction.bench.client import scenario_tools
from maf_compaction.bench.loopback import LoopbackProvider, agent_options, close_client, make_client
from maf_compaction.bench.model import ScriptedModel
from maf_compaction.bench.provider import SimulatedProvider
from maf_compaction.bench.runner import Cell, Settings, run_cell
from maf_compaction.bench.scenario import GeneratorOptions, Scenario, generate
from maf_compaction.bench.simulator import get_profile
from offline_tokenizers import offline_tiktoken

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 8_192
SMALL = Settings(context_window=WINDOW, max_output_tokens=1_024, tool_turns=3, markers_per_tool=4)


def subprocess_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


# -- clean exits ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "stream"),
    [("openai-responses", False), ("openai-chat", False), ("openai-responses", True), ("openai-chat", True)],
    ids=["responses", "chat", "responses-stream", "chat-stream"],
)
def test_the_client_mode_prints_nothing_on_stderr(kind: str, stream: bool, tmp_path: Path) -> None:
    """The issue's command, with both cells in one worker (``--jobs 1``: where the tracebacks came from)."""
    argv = [sys.executable, "-m", "maf_compaction.bench", "--client", kind, "--rows", "none,anchored"]
    argv += ["--fill", "0.9", "--seeds", "1", "--jobs", "1", *(["--stream"] if stream else [])]
    env = subprocess_env()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "2 cells in" in done.stdout


@pytest.mark.parametrize("kind", ["openai-responses", "openai-chat"])
async def test_a_cell_closes_its_openai_clients(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        made.append(make_client(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(loopback, "make_client", recording)
    monkeypatch.setattr(runner, "_tokenizer", offline_tiktoken)
    result = await run_cell(Cell("none", 0.9, 1), Settings(**{**_fields(SMALL), "client": kind}))
    assert result.error is None, result.error
    assert len(made) == 2  # the agent's client and the summarizer's
    assert all(client.client.is_closed() for client in made)


def _fields(settings: Settings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in Settings.__dataclass_fields__}


# -- independently started servers -------------------------------------------------------------------


def scenario() -> Scenario:
    """13 turns with lookups at turns 3, 5 and 8 (each answered with a reasoning item and a call)."""
    return generate(GeneratorOptions(context_window=WINDOW, fill=1.5, tool_turns=3, markers_per_tool=4))


def new_provider() -> SimulatedProvider:
    return SimulatedProvider(encoder=offline_tiktoken(), window=WINDOW, profile=get_profile("default"))


async def move_session(seeds: tuple[int | None, int | None], *, move_after: int = 4) -> list[str]:
    """Turns 1..move_after on one server, the rest on another; the session crosses as ``to_dict`` JSON.

    Each server has its own scripted model and provider (as a replica in its own process
    would), and each agent the real Responses client with ``store=False``.
    """
    script = scenario()
    answers: list[str] = []
    state: dict[str, Any] | None = None
    halves = [script.turns[:move_after], script.turns[move_after:]]
    for seed, turns in zip(seeds, halves, strict=True):
        async with LoopbackProvider(ScriptedModel(script), new_provider(), id_seed=seed) as server:
            client = make_client("openai-responses", server.base_url("model"))
            try:
                agent = Agent(
                    client,
                    instructions=script.system,
                    tools=scenario_tools(script),
                    default_options=cast("Any", agent_options("openai-responses")),
                )
                session = agent.create_session() if state is None else AgentSession.from_dict(state)
                for turn in turns:
                    answers.append((await agent.run(turn.user, session=session)).text)
                state = json.loads(json.dumps(session.to_dict()))
            finally:
                await close_client(client)
    return answers


async def test_a_session_moves_between_independently_started_servers() -> None:
    one_server = await move_session((7, 7), move_after=len(scenario().turns))
    moved = await move_session((None, None))
    assert moved == one_server
    assert sum(1 for answer in moved if answer.startswith("Values:")) == 4


async def test_two_servers_with_one_explicit_seed_collide_as_the_issue_found() -> None:
    """Why the default is drawn: the same seed issues the same ids, and the client refuses the mixed history."""
    with pytest.raises(ChatClientInvalidRequestException, match="Stateless replay cannot reconstruct reasoning"):
        await move_session((0, 0))


def test_an_explicit_seed_repeats_its_ids_and_a_drawn_one_does_not() -> None:
    script = scenario()

    def first_ids(seed: int | None) -> tuple[int, list[str]]:
        server = LoopbackProvider(ScriptedModel(script), new_provider(), id_seed=seed)
        return server.ids.seed, [server.ids.new(prefix) for prefix in ("resp", "rs", "fc", "msg", "chatcmpl")]

    assert first_ids(3) == first_ids(3)
    drawn = [first_ids(None) for _ in range(3)]
    assert len({seed for seed, _ in drawn}) == 3
    assert len({id_ for _, ids in drawn for id_ in ids}) == 15
    assert runner.LOOPBACK_ID_SEED == 0  # the bench's cells pass their own explicit seed


_FIRST_IDS = """
from maf_compaction.bench.loopback import LoopbackProvider
from maf_compaction.bench.model import ScriptedModel
from maf_compaction.bench.provider import SimulatedProvider
from maf_compaction.bench.scenario import Scenario
from maf_compaction.bench.simulator import get_profile


class Bytes:
    def encode(self, text):
        return list(text.encode())


provider = SimulatedProvider(encoder=Bytes(), window=8_192, profile=get_profile("default"))
server = LoopbackProvider(ScriptedModel(Scenario("ids", "", (), ())), provider)
print(" ".join(server.ids.new(prefix) for prefix in ("resp", "rs", "fc")))
"""


def test_servers_started_in_two_processes_issue_different_ids(tmp_path: Path) -> None:
    """One server per process, as replicas would be started: their first ids differ."""
    firsts = [
        subprocess.run(
            [sys.executable, "-W", "ignore", "-c", _FIRST_IDS],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=subprocess_env(),
            timeout=120,
            check=True,
        ).stdout.split()
        for _ in range(2)
    ]
    assert [len(ids) for ids in firsts] == [3, 3]
    assert not set(firsts[0]) & set(firsts[1])
