"""maf_compaction.testing: its public names, its extra, and what its checks catch."""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings

import maf_compaction.testing
from maf_compaction import core
from maf_compaction.testing import (
    ReplayError,
    check_later_passes_keep_earlier_decisions,
    check_restored_state_replays,
    estimate_tokens,
    histories,
    history_chunks,
    run_pass,
)

BUDGET = 1_500
CONFIG = core.CompositionConfig(
    records=core.RecordConfig(max_input_tokens=BUDGET, fallback=core.AnchoredConfig(max_input_tokens=BUDGET)),
    users=core.UserSummaryConfig(max_input_tokens=BUDGET),
)


def run_code(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=False)


#: Type aliases and a constant: documented where they are defined (they have no docstring of their own).
ALIASES = {"Answerer", "Chunks", "Content", "MEDIA_TOKENS"}


@pytest.mark.parametrize("name", sorted(set(maf_compaction.testing.__all__) - ALIASES))
def test_every_public_object_of_the_testing_module_has_its_own_docstring(name: str) -> None:
    assert (getattr(maf_compaction.testing, name).__doc__ or "").strip() != ""


def test_without_hypothesis_the_import_names_the_extra_to_install() -> None:
    completed = run_code("import sys; sys.modules['hypothesis'] = None; import maf_compaction.testing")

    assert completed.returncode != 0
    assert "ImportError: maf_compaction.testing needs hypothesis" in completed.stderr
    assert "pip install '.[testing]' in a checkout of this project" in completed.stderr


def test_the_testing_module_never_loads_agent_framework() -> None:
    completed = run_code("import sys, maf_compaction.testing; print('agent_framework' in sys.modules)")

    assert (completed.returncode, completed.stdout.strip()) == (0, "False"), completed.stderr


@settings(max_examples=10)
@given(histories(min_turns=2, max_turns=5))
def test_drawn_histories_are_counted_core_values_with_their_origins(history: core.History) -> None:
    assert [record.origin for record in history] == list(range(len(history)))
    assert all(record.tokens >= 4 for record in history)  # the per-message overhead at least
    assert {record.role for record in history} <= {"system", "user", "assistant", "tool"}


@settings(max_examples=10)
@given(history_chunks(min_chunks=2, max_chunks=3))
def test_drawn_growth_is_append_only(growth: tuple[core.History, ...]) -> None:
    for shorter, longer in itertools.pairwise(growth):
        assert list(longer[: len(shorter)]) == list(shorter)
        assert len(longer) > len(shorter)


def big_history() -> core.History:
    """A conversation well over :data:`BUDGET`: four looked-up tool results with codes."""
    records: list[core.MessageRecord] = [
        core.message("system", [core.text_part("You are an assistant.", estimate_tokens)], origin=0)
    ]
    for turn in range(10):
        rows = "\n".join(f"| row {n} | value {n * turn} |" for n in range(40))
        code = f"TL-{turn:06X}"
        for role, part in (
            ("user", core.text_part(f"Look up item {turn}", estimate_tokens)),
            ("assistant", core.call_part(f"c{turn}", "lookup", {"item": turn}, estimate_tokens)),
            ("tool", core.result_part(f"c{turn}", f"code={code}\n{rows}", estimate_tokens)),
            ("assistant", core.text_part(f"Item {turn} has code {code}.", estimate_tokens)),
        ):
            records.append(core.message(role, [part], origin=len(records)))
    return core.history(records)


def test_a_restored_state_replays_on_a_conversation_over_the_budget() -> None:
    state = check_restored_state_replays(
        big_history(),
        step=core.composition_step,
        config=CONFIG,
        state=core.State(),
        measure=estimate_tokens,
        rule=core.record_rule(CONFIG),
    )

    assert state.answers  # the check ran a pass that asked, answered and absorbed


def test_a_check_names_a_step_that_re_decides_an_earlier_decision() -> None:
    """A step that forgets its state (an anchored step handed a fresh snapshot on every pass) is caught."""
    growth = (big_history()[:9], big_history())

    def forgetful(config: Any, state: Any, history: core.History, measure: Any, **_: Any) -> Any:
        done = core.anchored_step(config, core.AnchoredSnapshot(), history, measure)
        return done if len(history) < 10 else core.anchored_step(config, state, history[:1], measure)

    config = core.AnchoredConfig(max_input_tokens=200)
    with pytest.raises(ReplayError, match="earlier pass"):
        check_later_passes_keep_earlier_decisions(
            growth, step=forgetful, config=config, state=core.AnchoredSnapshot(), measure=estimate_tokens
        )


def test_run_pass_refuses_a_step_that_asks_again_for_what_it_has() -> None:
    request = core.Request("same", core.RequestKind.SUMMARY, prompt="p", transcript="1. text")

    def stubborn(*_: Any, **__: Any) -> core.Needs:
        return core.Needs((request,))

    with pytest.raises(ReplayError, match="asked again"):
        run_pass(stubborn, CONFIG, core.State(), big_history(), estimate_tokens)


def test_a_later_summary_that_replaces_an_earlier_one_is_a_later_decision() -> None:
    """Found by the long profile: in the default mode (recompact) a later summary replaces the earlier summary with
    the turns after it, so the earlier one is gone from the later pass. The check takes that as a later decision
    (every turn the earlier summary replaced is now replaced by a summary the later pass inserted) and still names
    an inserted summary that is gone with nothing in its place."""
    from maf_compaction.core.model import flagged
    from maf_compaction.testing.replay import _kept  # pyright: ignore[reportPrivateUsage]

    def said(role: str, text: str, **ids: Any) -> core.MessageRecord:
        return core.message(role, [core.text_part(text, estimate_tokens)], **ids)

    turns = [said("user", f"turn {n}: keep RC-{n:04d}", origin=n) for n in range(3)]
    given = core.history(turns)
    first = said("user", "summary: RC-0000", message_id="user_summary_0")
    earlier = core.history([flagged(turns[0], excluded=True, replaced_by="user_summary_0"), first, *turns[1:]])
    second = said("user", "summary: RC-0000, RC-0001", message_id="user_summary_1")
    replaced = [flagged(t, excluded=True, replaced_by="user_summary_1") for t in turns[:2]]
    _kept(given, earlier, core.history([replaced[0], second, replaced[1], turns[2]]))  # replaced: a later decision
    with pytest.raises(ReplayError, match="user_summary_0 of an earlier pass is gone"):
        _kept(given, earlier, core.history([flagged(turns[0], excluded=True), *turns[1:]]))
