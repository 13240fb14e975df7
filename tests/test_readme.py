"""Every Python block in the README runs, in order, as a user would paste them.

The one change: the provider client is swapped for the bench's offline client (the scripted
model behind the simulated provider, playing three lookups with the README's tool), and
the tokenizer loads its vocabulary from the offline copy (no network here).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from maf_compaction import (
    ToolResultAnchoredSummarizationCompactionStrategy,
    ToolResultRecallMiddleware,
    UserTurnAnchoredSummarizationCompactionStrategy,
)
from maf_compaction.bench.client import SimulatedChatClient
from maf_compaction.bench.model import ScriptedModel
from maf_compaction.bench.provider import SimulatedProvider
from maf_compaction.bench.scenario import Probe, Scenario, ToolCall, ToolSpec, Turn
from maf_compaction.bench.simulator import get_profile
from offline_tokenizers import offline_tiktoken, vocabulary_gz

README = Path(__file__).resolve().parents[1] / "README.md"
PROVIDER_CLIENT = 'client = OpenAIChatClient(model_id="gpt-6-luna")'
#: The README's tool returns this code for every service.
CODE = "TL-3FA9C2"
LOOKUPS = tuple(f"Look up the deployment log of svc-{n} and tell me code_1" for n in range(3))


def offline_client() -> SimulatedChatClient:
    """The scripted model behind the simulated provider: each lookup calls the README's tool, then quotes the code."""
    tool = "lookup_deployment"
    scenario = Scenario(
        "readme",
        "",
        (ToolSpec(tool, "The README's tool."),),
        tuple(
            Turn(text, calls=(ToolCall(tool, {"service": f"svc-{n}"}, ""),), probe=Probe(f"svc-{n}", (CODE,)))
            for n, text in enumerate(LOOKUPS)
        ),
    )
    provider = SimulatedProvider(encoder=offline_tiktoken(), window=128_000, profile=get_profile("default"))
    return SimulatedChatClient(model=ScriptedModel(scenario), provider=provider)


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_the_readme_has_python_blocks_and_a_provider_client_to_swap() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 4
    assert sum(PROVIDER_CLIENT in block for block in blocks) == 1


async def test_every_readme_block_runs_and_the_agent_compacts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # the harness's file memory writes under the working directory
    monkeypatch.setenv("MAF_COMPACTION_TIKTOKEN_FILE", str(vocabulary_gz("o200k_base")))
    namespace: dict[str, Any] = {"__name__": "readme", "offline_client": offline_client}
    for block in python_blocks():
        code = block.replace(PROVIDER_CLIENT, "client = offline_client()")
        exec(compile(code, str(README), "exec"), namespace)

    agent, strategy, client = namespace["agent"], namespace["strategy"], namespace["client"]
    assert isinstance(client, SimulatedChatClient)
    session = agent.create_session()
    for text in LOOKUPS:
        response = await agent.run(text, session=session)
        assert CODE in response.text
    assert len([c for c in client.provider.calls if c.kind == "model"]) == 2 * len(LOOKUPS)  # a call, then the answer
    # The record strategy's block came last among the agents: its wiring ran the lookups.
    assert isinstance(strategy, ToolResultAnchoredSummarizationCompactionStrategy)
    assert isinstance(namespace["recall"], ToolResultRecallMiddleware)
    assert namespace["recall_tool"].name == "recall_earlier_tool_results"
    assert namespace["recall"].forced_calls == 0  # three small lookups stay under the trigger
    users = namespace["users"]
    assert isinstance(users, UserTurnAnchoredSummarizationCompactionStrategy)
    assert users.client is client
    assert users.summary_mode == "boundary"
    assert users.config.summary_input_limit == namespace["BUDGET"] // 2
    assert strategy.passes > 0
    assert strategy.last_report is not None
    assert strategy.last_report.tokens_after > 0
    assert namespace["tokenizer"].count_message_tokens is not None  # the media block replaced it last
