"""Three faults of a compaction pass, found by fault injection (issue 21, item 5), each pinned here.

(a) A pass that ends in ``CompactionBudgetExceeded`` still counts and warns the replacements
    it refused, and its error names them. (b) A summarizer answer the tokenizer cannot count
    is kept like any answer: no second call for it. (c) A pass over a pass's output changes
    nothing (see also the properties in the strategies' property files).
"""

from __future__ import annotations

import asyncio
import copy
import pickle

import pytest

from maf_compaction import CompactionBudgetExceeded
from test_composition_chain import budget_for, build, conversation, lossy

# --- (a) refusals on a pass that fails -------------------------------------------------------------


def test_refusals_on_a_pass_that_exceeds_the_budget_are_counted_warned_and_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    messages = conversation()
    strategy, client = build(lossy, budget_for(messages), overflow_policy="raise")
    with caplog.at_level("WARNING", logger="maf_compaction"), pytest.raises(CompactionBudgetExceeded) as raised:
        asyncio.run(strategy(messages))
    assert client.calls == 3  # the merge, then both harder rewrites: each drops values
    assert strategy.replacements_refused == 3
    assert "Refused 3 record replacement" in " ".join(r.getMessage() for r in caplog.records)
    assert "3 record replacement(s) or emergency fold(s) refused" in str(raised.value)
    assert len(raised.value.refused) == 3
    assert pickle.loads(pickle.dumps(raised.value)) == raised.value
    caplog.clear()
    with caplog.at_level("WARNING", logger="maf_compaction"), pytest.raises(CompactionBudgetExceeded):
        asyncio.run(strategy(copy.deepcopy(messages)))
    assert strategy.replacements_refused == 3, "a refusal is counted once"
    assert "Refused" not in " ".join(r.getMessage() for r in caplog.records), "and warned once"
