"""Every Python block in the README runs, in order, as a user would paste them.

The one change: the provider client is swapped for the offline scripted client, and the
tokenizer loads its vocabulary from the offline copy (no network here).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from maf_compaction.bench.scripted import ScriptedChatClient
from offline_tokenizers import vocabulary_gz

README = Path(__file__).resolve().parents[1] / "README.md"
PROVIDER_CLIENT = 'client = OpenAIChatClient(model_id="gpt-6-luna")'


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_the_readme_has_python_blocks_and_a_provider_client_to_swap() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 4
    assert sum(PROVIDER_CLIENT in block for block in blocks) == 1


async def test_every_readme_block_runs_and_the_agent_compacts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # the harness's file memory writes under the working directory
    monkeypatch.setenv("MAF_COMPACTION_TIKTOKEN_FILE", str(vocabulary_gz("o200k_base")))
    namespace: dict[str, Any] = {"__name__": "readme", "ScriptedChatClient": ScriptedChatClient}
    for block in python_blocks():
        code = block.replace(PROVIDER_CLIENT, 'client = ScriptedChatClient(tool_name="lookup_deployment")')
        exec(compile(code, str(README), "exec"), namespace)

    agent, strategy = namespace["agent"], namespace["strategy"]
    assert isinstance(namespace["client"], ScriptedChatClient)
    session = agent.create_session()
    for turn in range(3):
        response = await agent.run(f"Look up the deployment log of svc-{turn} and tell me code_1", session=session)
        assert "TL-3FA9C2" in response.text
    assert strategy.passes > 0
    assert strategy.last_report is not None
    assert strategy.last_report.tokens_after > 0
    assert namespace["tokenizer"].count_message_tokens is not None  # the media block replaced it last
