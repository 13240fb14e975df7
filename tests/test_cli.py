"""The bench's command line as a newcomer meets it (issue 11): every finding reproduced, and fixed.

Most tests call ``main`` in process; those about the program's name, the working
directory and missing packages run the real console script or interpreter in a
subprocess, because that is where the finding was.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import maf_compaction
from maf_compaction.bench import __main__ as bench_main
from maf_compaction.bench import grid, runner
from maf_compaction.bench.rows import ROW_DESCRIPTIONS
from maf_compaction.core.extras import install_hint

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "maf-compaction"
SMALL = ["--context-window", "8192", "--max-output-tokens", "1024", "--tool-turns", "3", "--markers-per-tool", "4"]
ONE_CELL = [*SMALL, "--fill", "1.5", "--seeds", "1", "--jobs", "1", "--quiet"]
TINY_WORKLOAD = {
    "version": 1,
    "name": "tiny",
    "system": "Be brief.",
    "tools": [{"name": "lookup"}],
    "turns": [
        {"user": "look it up", "calls": [{"name": "lookup", "arguments": {"n": 1}, "result": "code=TL-ABCDEF"}]},
        {"user": "what was the code?", "probe": {"scope": "lookup", "expected": ["TL-ABCDEF"]}},
    ],
}


def run(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = bench_main.main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any cell that runs fails the test: the command must stop before the grid."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the grid ran")

    monkeypatch.setattr(grid, "run_grid", refuse)


@pytest.fixture
def rows_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with the user's row modules, which is NOT on sys.path (as under the console script)."""
    (tmp_path / "cli_rows.py").write_text(
        textwrap.dedent(
            """
            from agent_framework import TruncationStrategy

            calls = 0


            def make(context):
                return TruncationStrategy(
                    max_n=int(context.budget * 0.6), compact_to=int(context.budget * 0.4), tokenizer=context.tokenizer
                )


            def broken(context):
                raise ValueError("boom: no budget for me")


            def not_a_strategy(context):
                return 42


            def flaky(context):
                global calls
                calls += 1
                if calls > 1:
                    raise RuntimeError("second call fails")
                return make(context)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cli_rows", raising=False)
    return tmp_path


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(extra)
    return env


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter of this environment (our experimental warning silenced)."""
    argv = [sys.executable, "-W", "ignore:maf-compaction is experimental", "-c", code]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=subprocess_env(), check=False, timeout=60)


# -- missing optional dependencies: one line naming the extra, before any work -----------------------


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize(
    ("missing", "argv", "extra"),
    [
        ("matplotlib", ["--plot", "out.png"], "plot"),
        ("tiktoken", [], "bench"),
        ("aiohttp", ["--client", "openai-responses"], "bench"),
    ],
)
def test_a_missing_optional_dependency_is_one_line_before_any_work(
    missing: str, argv: list[str], extra: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else real(name, *a))
    status, _, err = run(["bench", *ONE_CELL, *argv], capsys)
    assert status == 2
    assert len(err.strip().splitlines()) == 1, err
    assert f"needs {missing}, which is not installed" in err
    assert f"pip install '.[{extra}]' in a checkout of this project" in err
    assert "pip install 'maf-compaction[" not in err  # that name installs another project


@pytest.mark.usefixtures("no_work")
def test_every_missing_package_is_named_in_the_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    absent = {"tiktoken", "matplotlib"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in absent else real(name, *a))
    status, _, err = run(["bench", *ONE_CELL, "--plot", "out.png"], capsys)
    assert status == 2
    assert err.strip().endswith(
        "error: the bench needs tiktoken; --plot needs matplotlib, which are not installed: "
        f"{install_hint('bench', 'plot')}"
    )


def test_a_missing_package_in_a_fresh_interpreter_is_one_line(tmp_path: Path) -> None:
    """The finding: tiktoken absent gave a worker traceback per cell; now one line and exit 2."""
    code = (
        "import sys; sys.modules['tiktoken'] = None\n"  # as if not installed
        "from maf_compaction.bench.__main__ import main\n"
        "sys.exit(main(['bench', '--rows', 'none', '--seeds', '1', '--fill', '0.9']))\n"
    )
    done = run_python(code, tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "python -m maf_compaction.bench bench: error: the bench needs tiktoken, which is not installed: "
        f"{install_hint('bench')}"
    ]
    assert done.stdout == ""


def test_a_command_module_missing_a_package_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command whose module cannot import a third-party package (msgspec, say): one line, not a traceback."""

    def failing_import(name: str, *args: Any) -> types.ModuleType:
        raise ModuleNotFoundError("No module named 'msgspec'", name="msgspec")

    monkeypatch.setattr(bench_main.importlib, "import_module", failing_import)
    status, _, err = run(["bench"], capsys)
    assert status == 2
    assert err.strip() == (
        "python -m maf_compaction.bench: error: the 'bench' command needs msgspec, which is not installed: "
        f"{install_hint('bench')}"
    )


@pytest.mark.usefixtures("no_work")
def test_an_unavailable_vocabulary_is_one_line_before_any_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from maf_compaction import TokenizerUnavailableError

    def unavailable() -> Any:
        raise TokenizerUnavailableError("could not load the 'o200k_base' vocabulary. Tried: everything.")

    monkeypatch.setattr(runner, "_tokenizer", unavailable)
    status, _, err = run(["bench", *ONE_CELL], capsys)
    assert status == 2
    assert len(err.strip().splitlines()) == 1
    assert "tokenizer is unavailable: could not load the 'o200k_base' vocabulary" in err


# -- --json and --plot checked up front ----------------------------------------------------------------


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_an_unwritable_output_path_is_refused_before_any_work(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    status, _, err = run(["bench", *ONE_CELL, flag, str(blocker / "out.x")], capsys)
    assert status == 2
    assert f"{flag} {blocker / 'out.x'}: {blocker} is not a directory" in err
    status, _, err = run(["bench", *ONE_CELL, flag, str(tmp_path)], capsys)
    assert status == 2
    assert "is a directory; give a file name" in err


# -- --strategy ---------------------------------------------------------------------------------------------


def test_a_strategy_module_in_the_current_directory_imports(rows_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["bench", *ONE_CELL, "--rows", "none,mine", "--strategy", "mine=cli_rows:make"], capsys)
    assert status == 0, err
    assert "  mine " in out


def test_the_console_script_imports_a_strategy_module_from_the_current_directory(rows_dir: Path) -> None:
    """The finding: the console script does not put the working directory on sys.path."""
    done = subprocess.run(
        [str(SCRIPT), "bench", *ONE_CELL, "--rows", "none,mine", "--strategy", "mine=cli_rows:make"],
        cwd=rows_dir,
        capture_output=True,
        text=True,
        env=subprocess_env(),
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "  mine " in done.stdout


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        ("broken", "row 'bad': its factory raised ValueError: boom: no budget for me (--strategy bad=cli_rows:broken)"),
        ("not_a_strategy", "row 'bad': a row factory must return a CompactionStrategy or a RowSetup, got int"),
    ],
)
@pytest.mark.usefixtures("rows_dir")
def test_a_failing_factory_names_its_row_in_one_line(
    factory: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run(["bench", *ONE_CELL, "--rows", "none,bad", "--strategy", f"bad=cli_rows:{factory}"], capsys)
    assert status == 2
    assert len(err.strip().splitlines()) == 1, err
    assert expected in err


@pytest.mark.usefixtures("rows_dir")
def test_a_factory_failing_inside_a_cell_names_the_row_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["bench", *ONE_CELL, "--rows", "flaky", "--strategy", "flaky=cli_rows:flaky"], capsys)
    assert status == 1
    prog = "python -m maf_compaction.bench bench"
    assert err.strip() == f"{prog}: error: row 'flaky': its factory raised RuntimeError: second call fails"


@pytest.mark.usefixtures("no_work")
def test_a_strategy_may_not_replace_a_built_in_row(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["bench", "--strategy", "anchored=cli_rows:make"], capsys)
    assert status == 2
    assert "'anchored' is a built-in row; give your row another name" in err


@pytest.mark.usefixtures("no_work")
def test_a_strategy_given_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["bench", "--strategy", "mine=a:b", "--strategy", "mine=c:d"], capsys)
    assert status == 2
    assert "the row 'mine' is already given as 'a:b'" in err


@pytest.mark.usefixtures("rows_dir")
def test_a_strategy_left_out_of_rows_is_warned_about(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["bench", *ONE_CELL, "--rows", "none", "--strategy", "mine=cli_rows:make"], capsys)
    assert status == 0
    assert "warning: --strategy mine is not in --rows, so it does not run (add it: --rows none,mine)" in err
    assert "  mine " not in out


@pytest.mark.usefixtures("no_work", "rows_dir")
def test_a_strategy_left_out_of_rows_is_still_imported(capsys: pytest.CaptureFixture[str]) -> None:
    """The finding: ``--rows none --strategy mine=nope.mod:make`` exited 0 without importing anything."""
    status, _, err = run(["bench", "--rows", "none", "--strategy", "mine=nope.mod:make"], capsys)
    assert status == 2
    assert "row 'mine': --strategy: cannot import module 'nope.mod'" in err


# -- file workloads ----------------------------------------------------------------------------------------


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(TINY_WORKLOAD))
    return path


def test_generator_options_ignored_under_a_workload_are_named(
    workload: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "--workload", str(workload), "--rows", "none", "--jobs", "1"]
    status, _, err = run([*argv, "--seeds", "5", "--fill", "3", "--tool-share", "0.2", "--results", "dense"], capsys)
    assert status == 0
    assert (
        "warning: --workload replays its file once, as written: --fill, --seeds, --tool-share, --results ignored" in err
    )
    status, _, err = run([*argv, "--context-window", "16000"], capsys)  # a setting the replay does use
    assert status == 0
    assert "ignored" not in err


def test_the_workload_name_is_in_the_table_and_the_json(
    workload: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.json"
    status, out, _ = run(
        ["bench", "--workload", str(workload), "--rows", "none", "--jobs", "1", "--json", str(report)], capsys
    )
    assert status == 0
    assert out.startswith("cache rule openai (in process): OpenAI: exact prefix of the whole request")
    assert f"\nworkload 'tiny' ({workload}) at a 32,000-token window" in out
    assert json.loads(report.read_text())["workload"] == {"name": "tiny", "kind": "workload", "file": str(workload)}


def test_the_generated_workload_is_named_in_the_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "r.json"
    status, _, _ = run(["bench", *ONE_CELL, "--rows", "none", "--json", str(report)], capsys)
    assert status == 0
    assert json.loads(report.read_text())["workload"] == {"name": "generated", "kind": "generated", "file": None}


def test_facts_that_never_occur_are_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = {**TINY_WORKLOAD, "facts": [{"label": "code", "value": "TL-ABCDEF", "scope": "lookup"}]}
    data["facts"].append({"label": "typo", "value": "TL-ABCDEG", "scope": "lookup"})
    path = tmp_path / "w.json"
    path.write_text(json.dumps(data))
    status, _, err = run(["bench", "--workload", str(path), "--rows", "none", "--jobs", "1"], capsys)
    assert status == 0
    assert "warning: 1 of 2 fact(s) never occur in the conversation, so no row can keep them: typo='TL-ABCDEG'" in err


# -- --version, --help, the program's name ---------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"maf-compaction {maf_compaction.__version__}"
    with pytest.raises(SystemExit) as exited:
        grid.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"maf-compaction {maf_compaction.__version__}"


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        grid.main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for text in (
        "tokens (default: 32000)",
        "comma-separated (default: 0.9,1.5,3.0)",
        "seeds 1..N per cell (default: 3)",
        "share of tokens in tool results (default: 0.6)",
        "lookups (default: 6)",
        "codes per lookup (default: 8)",
        "output reservation (default: 2048)",
        "anthropic (layered invalidation, breakpoints, write premium); docs/bench.md (default: openai)",
        "price profile (default: 'default', or 'anthropic-5m' with --cache anthropic)",
        "(default: inprocess)",
    ):
        assert text in shown, text
    assert "(default: None)" not in shown
    assert "(default: False)" not in shown


def test_help_lists_every_row_within_120_columns(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        grid.main(["--help"])
    out = capsys.readouterr().out
    epilog = out[out.rindex("\nrows:\n") :]
    assert max(len(line) for line in epilog.splitlines()) <= 120
    shown = " ".join(epilog.split())
    for name, text in ROW_DESCRIPTIONS.items():
        assert f"{name} {' '.join(text.split())}" in shown, name


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["--help"], "usage: maf-compaction [COMMAND] [options]"),
        (["bench", "--help"], "usage: maf-compaction bench [-h]"),
        (["--version"], f"maf-compaction {maf_compaction.__version__}"),
    ],
)
def test_the_console_script_calls_itself_maf_compaction(argv: list[str], usage: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(SCRIPT), *argv], cwd=tmp_path, capture_output=True, text=True, env=subprocess_env(), check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(usage)


def test_python_m_calls_itself_python_m(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "maf_compaction.bench", "bench", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=subprocess_env(),
        check=False,
    )
    assert done.stdout.startswith("usage: python -m maf_compaction.bench bench [-h]")


def test_the_console_script_prints_no_experimental_warning(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(SCRIPT), "--version"], cwd=tmp_path, capture_output=True, text=True, env=subprocess_env(), check=False
    )
    assert done.returncode == 0
    assert "MafCompactionExperimentalWarning" not in done.stderr


def test_python_m_prints_no_experimental_warning_but_an_import_does(tmp_path: Path) -> None:
    """``python -m maf_compaction.bench`` is the console script's documented equivalent (issue 18: its stderr
    stays empty); a program that imports the library still gets the warning."""
    quiet = [sys.executable, "-m", "maf_compaction.bench", "--version"]
    loud = [sys.executable, "-c", "import maf_compaction.bench"]
    for argv, warned in ((quiet, False), (loud, True)):
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=subprocess_env(), check=False)
        assert done.returncode == 0
        assert ("MafCompactionExperimentalWarning" in done.stderr) is warned, done.stderr


# -- the progress bar ----------------------------------------------------------------------------------------


class Terminal:
    """Stands in for a stream attached to a terminal (``isatty()`` is true)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def isatty(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def test_the_progress_bar_only_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", *SMALL, "--fill", "1.5", "--seeds", "1", "--jobs", "1", "--rows", "none,anchored"]
    status, _, err = run(argv, capsys)  # captured: not a terminal, as with `> log.txt`
    assert status == 0
    assert "\r" not in err
    assert "cells," not in err
    monkeypatch.setattr(sys, "stdout", Terminal(sys.stdout))
    monkeypatch.setattr(sys, "stderr", Terminal(sys.stderr))
    status, _, err = run(argv, capsys)
    assert status == 0
    assert "\r[" in err
    assert "2/2 cells" in err
    status, _, err = run([*argv, "--quiet"], capsys)
    assert "\r" not in err


# -- the plot ----------------------------------------------------------------------------------------------


def test_the_plot_names_its_settings_and_seed_and_shares_one_y_axis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt

    from maf_compaction.bench.report import plot
    from maf_compaction.bench.runner import CellResult, Settings

    drawn: list[Any] = []
    monkeypatch.setattr(plt, "close", drawn.append)
    results = [
        CellResult(
            row=row, fill=fill, seed=seed, prompts=[int(1_000 * (i + 1) * (1 + fill)) for i in range(8)], cached=[0] * 8
        )
        for fill in (0.9, 3.0)
        for row in ("none", "anchored")
        for seed in (1, 2)
    ]
    results[0].prompts = [90_000] * 8  # one panel far taller than the others
    plot(results, tmp_path / "p.png", Settings())
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    (figure,) = drawn
    texts = [t.get_text() for t in figure.texts]
    assert "Prompt and cached tokens per model call" in texts
    about = next(t for t in texts if "window" in t)
    for part in (
        "generated workload",
        "32,000-token window",
        "budget 29,952",
        "openai cache",
        "seed 1 (the first of 2",
    ):
        assert part in about.replace("\n", " "), part
    axes = [a for a in figure.axes if a.get_visible()]
    assert len(axes) == 4
    assert {a.get_ylim() for a in axes} == {axes[0].get_ylim()}  # one shared y axis
    assert axes[0].get_ylim()[1] >= 90_000
    assert all(a.get_title().split(":")[0] in ("none", "anchored") for a in axes)
    sizes = [label.get_fontsize() for a in axes for label in a.get_yticklabels()]
    assert min(sizes) >= 8
    assert min(a.title.get_fontsize() for a in axes) >= 10
    assert min(t.get_fontsize() for t in figure.texts) >= 10


@pytest.mark.parametrize("command", ["redis", "sessions", "speed", "docs", "bench"])
def test_every_commands_usage_names_the_program_it_was_run_as(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``maf-compaction redis --help`` printed ``usage: python -m maf_compaction.bench redis``."""
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/maf-compaction", command, "--help"])
    with pytest.raises(SystemExit) as exited:
        bench_main.main([command, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: maf-compaction {command}"), out[:120]


def test_no_install_hint_names_the_other_pypi_project() -> None:
    """``pip install 'maf-compaction[plot]'`` installs another project: every hint names a checkout of this one."""
    hint = install_hint("plot")
    assert hint.startswith("pip install '.[plot]' in a checkout of this project")
    assert "maf-compaction[" not in hint
    assert install_hint("plot", "bench") == install_hint("bench,plot")
    sources = [p for p in (Path(maf_compaction.__file__).parent).rglob("*.py") if p.name != "extras.py"]
    offenders = [str(p) for p in sources if "maf-compaction[" in p.read_text(encoding="utf-8")]
    assert offenders == []


@pytest.mark.parametrize("missing", ["aiohttp", "openai"])
def test_the_offline_provider_without_the_bench_extra_names_it(missing: str, tmp_path: Path) -> None:
    """The finding: ``import maf_compaction.bench.offline`` without the extra raised a bare "No module named"."""
    code = f"import sys; sys.modules[{missing!r}] = None\nimport maf_compaction.bench.offline\n"
    done = run_python(code, tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"ImportError: maf_compaction.bench.offline needs {missing}, which the bench extra installs: "
        f"{install_hint('bench')}"
    )
