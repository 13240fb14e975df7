"""The public surface of ``maf_compaction``: names, docstrings, protocols, signatures, the import warning."""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import Any

import agent_framework
import pytest
from agent_framework import CharacterEstimatorTokenizer

import maf_compaction
from maf_compaction import (
    AnchoredCompactionStrategy,
    MafCompactionExperimentalWarning,
    MediaTokenEstimator,
    MinimumGainAnchoredCompactionStrategy,
    TiktokenTokenizer,
)

# --- helpers ---------------------------------------------------------------------------------

EMPTY = inspect.Parameter.empty
KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY
POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
PUBLIC_OBJECTS = sorted(name for name in maf_compaction.__all__ if not name.startswith("__"))


def parameters(callable_: Any) -> dict[str, tuple[Any, Any]]:
    """name -> (kind, default) of a callable's parameters, ``self`` left out."""
    return {
        name: (parameter.kind, parameter.default)
        for name, parameter in inspect.signature(callable_).parameters.items()
        if name != "self"
    }


def import_in_subprocess(*warning_options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *warning_options, "-c", "import maf_compaction"],
        capture_output=True,
        text=True,
        check=False,
    )


ANCHORED_PARAMETERS: dict[str, tuple[Any, Any]] = {
    "max_input_tokens": (KEYWORD_ONLY, EMPTY),
    "tokenizer": (KEYWORD_ONLY, EMPTY),
    "keep_head_groups": (KEYWORD_ONLY, 3),
    "keep_tail_groups": (KEYWORD_ONLY, 4),
    "keep_tokens": (KEYWORD_ONLY, None),
    "band_share": (KEYWORD_ONLY, 0.25),
    "collapse_assistant_text": (KEYWORD_ONLY, True),
}


# --- names and docstrings ----------------------------------------------------------------------


@pytest.mark.parametrize("name", maf_compaction.__all__)
def test_every_public_name_is_importable(name: str) -> None:
    namespace: dict[str, Any] = {}

    exec(f"from maf_compaction import {name}", namespace)

    assert namespace[name] is getattr(maf_compaction, name)


@pytest.mark.parametrize("name", PUBLIC_OBJECTS)
def test_every_public_object_has_its_own_docstring(name: str) -> None:
    assert (getattr(maf_compaction, name).__doc__ or "").strip() != ""


def test_version_is_a_string() -> None:
    assert isinstance(maf_compaction.__version__, str)


# --- the framework protocol --------------------------------------------------------------------


@pytest.mark.parametrize("cls", [AnchoredCompactionStrategy, MinimumGainAnchoredCompactionStrategy])
def test_strategy_is_a_framework_compaction_strategy(cls: type[AnchoredCompactionStrategy]) -> None:
    instance = cls(max_input_tokens=1_000, tokenizer=CharacterEstimatorTokenizer())

    assert isinstance(instance, agent_framework.CompactionStrategy)


@pytest.mark.parametrize("cls", [AnchoredCompactionStrategy, MinimumGainAnchoredCompactionStrategy])
def test_strategy_call_is_a_coroutine_function(cls: type[AnchoredCompactionStrategy]) -> None:
    assert inspect.iscoroutinefunction(cls.__call__)


def test_minimum_gain_strategy_is_an_anchored_strategy() -> None:
    assert issubclass(MinimumGainAnchoredCompactionStrategy, AnchoredCompactionStrategy)


# --- the experimental warning ------------------------------------------------------------------


def test_experimental_warning_is_a_user_warning() -> None:
    assert issubclass(MafCompactionExperimentalWarning, UserWarning)


def test_import_succeeds_when_warnings_are_errors() -> None:
    completed = import_in_subprocess("-W", "error")

    assert (completed.returncode, completed.stderr) == (0, "")


def test_import_emits_exactly_one_experimental_warning() -> None:
    completed = import_in_subprocess("-W", "always")

    assert (completed.returncode, completed.stderr.count("MafCompactionExperimentalWarning")) == (0, 1)


# --- signatures as in the README ---------------------------------------------------------------


def test_anchored_signature_matches_the_readme() -> None:
    actual = parameters(AnchoredCompactionStrategy)

    assert {name: actual.get(name) for name in ANCHORED_PARAMETERS} == ANCHORED_PARAMETERS


def test_anchored_takes_keyword_arguments_only() -> None:
    assert {kind for kind, _ in parameters(AnchoredCompactionStrategy).values()} == {KEYWORD_ONLY}


def test_minimum_gain_signature_adds_min_gain_fraction() -> None:
    actual = parameters(MinimumGainAnchoredCompactionStrategy)

    assert {name: actual.get(name) for name in [*ANCHORED_PARAMETERS, "min_gain_fraction"]} == {
        **ANCHORED_PARAMETERS,
        "min_gain_fraction": (KEYWORD_ONLY, 0.29),
    }


def test_minimum_gain_takes_every_anchored_parameter() -> None:
    assert set(parameters(AnchoredCompactionStrategy)) <= set(parameters(MinimumGainAnchoredCompactionStrategy))


def test_media_token_estimator_signature_matches_the_readme() -> None:
    assert parameters(MediaTokenEstimator) == {
        "tokenizer": (POSITIONAL, EMPTY),
        "image_tokens": (KEYWORD_ONLY, 1_024),
        "other_media_tokens": (KEYWORD_ONLY, 1_024),
        "estimate_media": (KEYWORD_ONLY, None),
    }


def test_tiktoken_tokenizer_defaults_to_o200k_base() -> None:
    assert parameters(TiktokenTokenizer)["encoding"] == (POSITIONAL, "o200k_base")


# --- the pure core's public API ----------------------------------------------------------------

#: The core's public names: removing or renaming one breaks custom hosts, like any name of the package.
CORE_NAMES = [
    "AnchoredConfig",
    "AnchoredReport",
    "AnchoredSnapshot",
    "Answer",
    "CacheMarks",
    "CompactionBudgetExceeded",
    "CompositionConfig",
    "CompositionReport",
    "Done",
    "History",
    "Measure",
    "MessageRecord",
    "Needs",
    "Outcome",
    "Part",
    "PinRule",
    "RecordConfig",
    "RecordReport",
    "Request",
    "RequestKind",
    "Route",
    "SnapshotError",
    "SnapshotVersionError",
    "State",
    "Step",
    "UserReport",
    "UserSummaryConfig",
    "absorb",
    "anchored_check",
    "anchored_step",
    "answer_room",
    "call_part",
    "composition_check",
    "composition_step",
    "cut_answer",
    "history",
    "max_answer_tokens",
    "media_part",
    "message",
    "prompt",
    "read_snapshot",
    "read_state",
    "reasoning_part",
    "record_rule",
    "records_check",
    "records_step",
    "request_sent",
    "request_starting",
    "result_part",
    "sent_tokens",
    "strategy_marks",
    "text_part",
    "unchanged",
    "user_summaries_check",
    "user_summaries_step",
]
#: Type aliases: documented in docs/core.md (an alias has no docstring of its own).
CORE_ALIASES = {"History", "Measure", "Step"}


def test_the_core_exports_exactly_its_public_names() -> None:
    import maf_compaction.core

    assert sorted(maf_compaction.core.__all__) == CORE_NAMES


@pytest.mark.parametrize("name", CORE_NAMES)
def test_every_core_name_is_importable(name: str) -> None:
    import maf_compaction.core

    namespace: dict[str, Any] = {}

    exec(f"from maf_compaction.core import {name}", namespace)

    assert namespace[name] is getattr(maf_compaction.core, name)


@pytest.mark.parametrize("name", sorted(set(CORE_NAMES) - CORE_ALIASES))
def test_every_core_object_has_its_own_docstring(name: str) -> None:
    import maf_compaction.core

    assert (getattr(maf_compaction.core, name).__doc__ or "").strip() != ""


@pytest.mark.parametrize("name", sorted(CORE_ALIASES))
def test_every_core_alias_is_documented_in_docs_core(name: str) -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "core.md").read_text(encoding="utf-8")

    assert f"`{name}`" in text


def test_the_core_imports_no_framework_module() -> None:
    import ast
    from pathlib import Path

    imported: set[str] = set()
    for path in (Path(__file__).resolve().parents[1] / "src" / "core").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module)

    assert not {name for name in imported if name.split(".")[0] in {"agent_framework", "maf_compaction"}}


@pytest.mark.parametrize("module", ["maf_compaction.core", "maf_compaction.errors", "maf_compaction"])
def test_importing_the_package_or_its_core_never_loads_agent_framework(module: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", f"import sys, {module}; print('agent_framework' in sys.modules)"],
        capture_output=True,
        text=True,
        check=False,
    )

    assert (completed.returncode, completed.stdout.strip()) == (0, "False"), completed.stderr


def test_an_adapter_name_loads_its_module_on_first_use_and_dir_lists_every_name() -> None:
    code = (
        "import sys, maf_compaction as m\n"
        "names = set(dir(m))\n"
        "before = 'maf_compaction.adapters.records' in sys.modules\n"
        "from maf_compaction import ToolResultAnchoredSummarizationCompactionStrategy as S\n"
        "print(before, 'maf_compaction.adapters.records' in sys.modules, set(m.__all__) <= names, S.__name__)"
    )
    completed = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=False
    )

    assert completed.stdout.split() == ["False", "True", "True", "ToolResultAnchoredSummarizationCompactionStrategy"]


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = maf_compaction.no_such_name  # type: ignore[attr-defined]
