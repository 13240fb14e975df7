"""Stored sessions and snapshots restore and continue as they did when they were made.

The fixtures under ``fixtures/stored/`` were written once by ``fixtures/stored/make_stored.py``
against release 039d1db; each holds what a user stored (a strategy's
``decision_state().to_dict()``, ``CompactionStack.to_dict()``, ``AgentSession.to_dict()``)
and what continuing from it produced then (the compacted messages, the prompts the model
received, the summarizer's calls, the decisions read back through public values). When the
stored format started over at version 1 (one state per conversation), the stored values were
rewritten field for field in it; the continuations are still those the release produced, so
the same decisions in today's format continue with the same bytes. Version 5 added
``recall.ignored_summaries``, ``recall.seen.pending_tokens`` and the configuration parameter
``pin_rule.repeat_tokens``: the stored values stay at version 1, are upgraded as they are read
(each at what version 1 acted on), and a value written back carries version 5.

One deliberate exception, when the summary coverage rule landed (a summary must say something
of the turns it replaces): the release's scripted summarizer answered a bare ``Summary:`` for
turns without codes, which the rule refuses. The summarizer now answers their opening words
there, so two expected continuations changed in exactly that: ``user_summaries``' new
summary's text, and ``composition_fold``'s summarizer calls (1 -> 2: a stored bare summary's
answer is asked once more). The stored values are untouched.

A second, when the recall tool started answering a record with a receipt (the record is the call's
``values``, carried once; a stored result that repeats it still reads as its record): the
continuations of ``records_session`` and ``composition_session`` write a record, so they were
recorded again. In ``records`` exactly the new record's result changed, in each request that
carries it; in ``composition`` the requests up to the new record are the release's, and the
prompt, smaller by the record's second copy, then stays under the budget (``full`` false: five
requests and five summarizer calls, where the release ran out after three and two). The stored
values are untouched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from maf_compaction.core.envelope import VERSION
from stored_scenarios import anchored_continuation, continue_session, stack_continuation, user_continuation

STORED = Path(__file__).parent / "fixtures" / "stored"


def _load(name: str) -> dict[str, Any]:
    """A fixture, its expected continuation as this build writes it: the same decisions under today's version (the
    values were stored at version 1; a value written back carries the version of the build that wrote it)."""
    fixture = json.loads((STORED / f"{name}.json").read_text())
    return {**fixture, "expected": _written_today(fixture["expected"])}


def _written_today(value: Any) -> Any:
    if isinstance(value, dict):
        fields = {k: _written_today(v) for k, v in value.items()}
        return {**fields, "version": VERSION} if "kind" in fields and fields.get("version") == 1 else fields
    if isinstance(value, list):
        return [_written_today(item) for item in value]
    return value


async def test_a_stored_anchored_snapshot_restores_and_continues_with_the_same_bytes() -> None:
    fixture = _load("anchored")
    assert await anchored_continuation(fixture["stored"]) == fixture["expected"]


async def test_a_stored_user_summary_snapshot_restores_and_continues_with_the_same_bytes() -> None:
    fixture = _load("user_summaries")
    assert await user_continuation(fixture["stored"]) == fixture["expected"]


@pytest.mark.parametrize("name", ["records", "composition", "composition_fold"])
def test_a_stored_stack_restores_with_the_same_decisions(name: str) -> None:
    fixture = _load(f"{name}_stack")
    assert stack_continuation(fixture["kind"], fixture["budget"], fixture["stored"]) == fixture["expected"]


@pytest.mark.parametrize("name", ["records", "composition", "composition_fold"])
async def test_a_stored_session_restores_and_continues_with_the_same_prompts(name: str) -> None:
    fixture = _load(f"{name}_session")
    assert await continue_session(fixture["kind"], fixture["budget"], fixture["stored"]) == fixture["expected"]
