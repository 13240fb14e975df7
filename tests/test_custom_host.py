"""docs/examples/custom_host.py: a host without Agent Framework compacts an OpenAI-format list with the core.

Run as a user runs it (a separate interpreter), with a check that no agent_framework module was ever imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "custom_host.py"
RUN = (
    "import json, runpy, sys\n"
    "namespace = runpy.run_path(sys.argv[1], run_name='__main__')\n"
    "print('FRAMEWORK ' + json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'agent_framework')))\n"
    "print('BUDGET ' + str(namespace['BUDGET']))\n"
)


@pytest.fixture(scope="module")
def run() -> tuple[dict[str, Any], list[str], int]:
    completed = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", RUN, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = completed.stdout.splitlines()
    (framework,) = [json.loads(line.removeprefix("FRAMEWORK ")) for line in lines if line.startswith("FRAMEWORK ")]
    (budget,) = [int(line.removeprefix("BUDGET ")) for line in lines if line.startswith("BUDGET ")]
    outcome = json.loads("\n".join(line for line in lines if not line.startswith(("FRAMEWORK ", "BUDGET "))))
    return outcome, framework, budget


def test_the_custom_host_never_imports_agent_framework(run: tuple[dict[str, Any], list[str], int]) -> None:
    _, framework, _ = run

    assert framework == []


def test_the_custom_host_keeps_its_prompt_within_the_budget_by_records_and_summaries(
    run: tuple[dict[str, Any], list[str], int],
) -> None:
    outcome, _, budget = run

    assert outcome["prompt_tokens"] <= budget < outcome["full_tokens"]
    assert outcome["records"] >= 1
    assert outcome["summaries"] >= 1


def test_the_custom_host_keeps_every_code_in_the_prompt(run: tuple[dict[str, Any], list[str], int]) -> None:
    outcome, _, _ = run

    assert set(outcome["codes"]) <= set(outcome["codes_in_prompt"])


def test_the_custom_hosts_state_restored_from_json_replays_with_no_second_model_call(
    run: tuple[dict[str, Any], list[str], int],
) -> None:
    outcome, _, _ = run

    assert outcome["state_kind"] == "state"
    assert outcome["calls_after_restore"] == 0
    assert outcome["replayed_the_same"]
