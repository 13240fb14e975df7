"""The pass pipeline threads sub-steps over one view, rebuilt only when a sub-step changed the history."""

from __future__ import annotations

from dataclasses import replace

from pyrsistent import pvector

from maf_compaction.core import pipeline
from maf_compaction.core.effects import Request
from maf_compaction.core.model import MessageRecord, Part, flagged
from maf_compaction.core.protocol import Done, Measure, Needs
from maf_compaction.core.state import RequestKind
from maf_compaction.core.view import View, view

_Answer = Needs | Done[tuple[View, ...], None]

_ASKED = Request("x", RequestKind.SUMMARY, prompt="p", transcript="t", sources=1, message_id="user_summary_0")


def _message(role: str, text: str) -> MessageRecord:
    return MessageRecord(role=role, parts=(Part(kind="text", text=text, tokens=len(text)),), tokens=len(text) + 4)


def _seen(config: None, state: tuple[View, ...], seen: View, measure: Measure) -> _Answer:
    """Records the view it was handed, and leaves the history as it is."""
    return Done(seen.history, (*state, seen), None)


def _exclude_first(config: None, state: tuple[View, ...], seen: View, measure: Measure) -> _Answer:
    history = seen.history.set(0, flagged(seen.history[0], excluded=True, reason="test"))
    return Done(history, (*state, seen), None)


def _ask(config: None, state: tuple[View, ...], seen: View, measure: Measure) -> _Answer:
    return Needs((_ASKED,))


def test_the_view_is_shared_until_a_sub_step_changes_the_history() -> None:
    history = pvector([_message("user", "hello"), _message("assistant", "hi there")])
    seen = view(history)
    ran = pipeline.run((_seen, _seen, _exclude_first, _seen), None, (), seen, len)
    assert not isinstance(ran, Needs)
    output, views = ran
    assert all(v is seen for v in views[:3])
    assert views[3].history is output
    assert output[0].excluded
    assert views[3].sent == seen.sent - history[0].tokens
    assert views[3] == replace(view(output), grouping=views[3].grouping)


def test_the_first_needs_ends_the_pass() -> None:
    seen = view(pvector([_message("user", "hello")]))
    ran = pipeline.run((_seen, _ask, _exclude_first), None, (), seen, len)
    assert isinstance(ran, Needs)
    assert ran.requests == (_ASKED,)
