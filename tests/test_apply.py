"""Applying the core's answer onto the framework's list (adapters/apply.py), and what a request then sends.

A message the core created on a pass (a written record, a user-turn summary) may be replaced on the same pass: a
record the model wrote over the cached prefix that the composition's merge takes in at once. It stays in stored
history, excluded, as evidence for later passes, and must not be sent: it was inserted included, and the request
after the pass carried both the record and its merge, over the window on value-dense output.
"""

from __future__ import annotations

import asyncio

from agent_framework import CharacterEstimatorTokenizer, Message
from agent_framework._compaction import EXCLUDE_REASON_KEY, EXCLUDED_KEY

from maf_compaction import MediaTokenEstimator
from maf_compaction.adapters.apply import apply
from maf_compaction.adapters.convert import SUMMARIZED_BY_KEY, WRITTEN_RECORD_KEY, to_history
from maf_compaction.bench.runner import Cell, Settings, run_cell
from maf_compaction.core import history
from maf_compaction.core.records import HOLD_RECORD, RECORD_PREFIX, REPLACED_REASON
from maf_compaction.core.user_summaries import message as created_message
from maf_compaction.testing import estimate_tokens

ESTIMATOR = MediaTokenEstimator(CharacterEstimatorTokenizer())
COUNTER = ESTIMATOR._parts  # pyright: ignore[reportPrivateUsage]


def test_a_message_made_and_replaced_on_one_pass_is_stored_excluded_with_its_replacement() -> None:
    messages = [Message("user", ["Find the deployment."]), Message("assistant", ["TL-3FA9C2 is live."])]
    before = to_history(messages, COUNTER, note_kind="anchored")
    kept = created_message(
        "assistant",
        f"{RECORD_PREFIX}\nTL-3FA9C2 and TL-77AB01.",
        "rec_2",
        estimate_tokens,
        written_record=True,
        held=HOLD_RECORD,
    )
    taken_in = created_message(
        "assistant",
        f"{RECORD_PREFIX}\nTL-77AB01.",
        "rec_1",
        estimate_tokens,
        written_record=True,
        excluded=True,
        reason=REPLACED_REASON,
        replaced_by="rec_2",
    )
    apply(messages, before, history([*before, taken_in, kept]), note_kind="anchored")

    assert [m.message_id for m in messages[2:]] == ["rec_1", "rec_2"]
    replaced, merge = messages[2].additional_properties, messages[3].additional_properties
    assert replaced[EXCLUDED_KEY] is True
    assert replaced[EXCLUDE_REASON_KEY] == REPLACED_REASON
    assert replaced[SUMMARIZED_BY_KEY] == "rec_2"
    assert replaced[WRITTEN_RECORD_KEY] is True, "still a record: later passes judge by it"
    assert not merge.get(EXCLUDED_KEY)
    assert [m.message_id for m in messages[:2]] == [None, None]


def test_no_request_carries_a_record_a_merge_took_in_on_the_same_pass() -> None:
    """Records with long prose over source files: the answer over the cached prefix is merged at once by the
    composition's chain. Each request sent was what the pass left, under the budget, so none is over the window
    (two requests were, by 3K tokens: the record and its merge went out together). A record asked for every group
    (the ungated row): the gated composition learns that such records do not pay and asks for too few to merge. At
    3x the window: at 2x every record and summary now fits (each asked alone when the two would not fit one answer
    under the 2,048-token cap), and nothing needs merging there."""
    settings = Settings(results="stdlib", answer_tokens=4_000, prose_tokens=(300, 600))
    result = asyncio.run(run_cell(Cell("tool_and_user_summary_anchored_ungated", 3.0, 3), settings))
    assert result.error is None, result.error
    assert result.counters["records_replaced"] >= 1, result.counters
    assert result.dq == 0, f"{result.dq} request(s) over the window"
