"""The replay checks of maf_compaction.testing, run on every strategy's core over drawn histories.

The same checks a host runs on its own configuration (the README's "Check your own configuration"), here on
each strategy's core with budgets drawn as a share of the conversation's size (below the trigger, between the
trigger and the budget, and far over it). Properties, one sentence each:

- a later pass keeps every earlier decision byte for byte as the conversation grows;
- two lists stepped from one state (the stored history, and a copy with context injected for one call) agree;
- a list that kept a pass's flags but lost its insertions gets the same prompt from the next pass;
- a state stored as JSON and read back replays with no second effect call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, note
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn

from maf_compaction import core
from maf_compaction.testing import (
    check_a_list_that_lost_its_insertions_agrees,
    check_later_passes_keep_earlier_decisions,
    check_restored_state_replays,
    check_two_lists_agree,
    estimate_tokens,
    histories,
    history_chunks,
)

SHARES = (0.3, 0.6, 0.9, 1.2, 2.0)
KINDS = ("anchored", "records", "user_summaries", "composition")


@dataclass(frozen=True)
class Setup:
    """A strategy's core configured for one history, as a host would configure it."""

    kind: str
    config: Any
    step: Callable[..., Any]
    state: Any
    rule: core.PinRule | None

    def run(self, check: Callable[..., Any], value: Any) -> None:
        # What must stay may not fit: the composition raises, and nothing is decided.
        with contextlib.suppress(core.CompactionBudgetExceeded):
            check(value, step=self.step, config=self.config, state=self.state, measure=estimate_tokens, rule=self.rule)


def setup(kind: str, budget: int) -> Setup:
    anchored = core.AnchoredConfig(max_input_tokens=budget)
    records = core.RecordConfig(max_input_tokens=budget, fallback=anchored)
    users = core.UserSummaryConfig(max_input_tokens=budget)
    if kind == "anchored":
        return Setup(kind, anchored, core.anchored_step, core.AnchoredSnapshot(), None)
    if kind == "records":
        return Setup(kind, records, core.records_step, core.State(), core.record_rule(records))
    if kind == "user_summaries":
        return Setup(kind, users, core.user_summaries_step, core.State(), None)
    composition = core.CompositionConfig(records=records, users=users)
    return Setup(kind, composition, core.composition_step, core.State(), core.record_rule(composition))


def budget_of(history: core.History, share: float) -> int:
    return max(64, int(core.sent_tokens(history) * share))


@st.composite
def grown(draw: DrawFn, kind: str) -> tuple[Setup, tuple[core.History, ...]]:
    growth = draw(history_chunks(min_chunks=2, max_chunks=4, min_turns=3, max_turns=9))
    return setup(kind, budget_of(growth[-1], draw(st.sampled_from(SHARES)))), growth


@st.composite
def single(draw: DrawFn, kind: str) -> tuple[Setup, core.History]:
    history = draw(histories(min_turns=3, max_turns=9))
    return setup(kind, budget_of(history, draw(st.sampled_from(SHARES)))), history


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_a_later_pass_keeps_every_earlier_decision_byte_for_byte(kind: str, data: st.DataObject) -> None:
    chosen, growth = data.draw(grown(kind))
    note(f"budget {chosen.config.max_input_tokens}, sizes {[core.sent_tokens(h) for h in growth]}")
    chosen.run(check_later_passes_keep_earlier_decisions, growth)


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_two_lists_stepped_from_one_state_agree(kind: str, data: st.DataObject) -> None:
    chosen, history = data.draw(single(kind))
    chosen.run(check_two_lists_agree, history)


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_a_restored_state_replays_with_no_second_effect_call(kind: str, data: st.DataObject) -> None:
    chosen, history = data.draw(single(kind))
    chosen.run(check_restored_state_replays, history)


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_a_list_that_lost_a_passs_insertions_gets_the_same_prompt(kind: str, data: st.DataObject) -> None:
    chosen, history = data.draw(single(kind))
    chosen.run(check_a_list_that_lost_its_insertions_agrees, history)
