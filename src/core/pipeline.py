"""One pass as an ordered list of sub-steps over one view of the history.

A sub-step speaks the protocol's ``step -> Needs | Done`` over the pass's view: it
either asks for effects (:class:`~.protocol.Needs`) or answers with the history and the pass's working state after it
(:class:`~.protocol.Done`). :func:`run` threads one sub-step's answer into the next
and stops at the first ``Needs``: the next pass recomputes everything from the absorbed
answer. The view is derived again only when a sub-step changed the history (from the
last one, so a change of flags costs no regrouping); a sub-step that already holds the
view of its output hands it on as its ``Done.memo``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeAlias, TypeVar

from .model import History
from .protocol import Done, Measure, Needs
from .view import View, view

ConfigT = TypeVar("ConfigT")
StateT = TypeVar("StateT")
ReportT = TypeVar("ReportT")

#: ``(config, state, view, measure) -> Needs | Done``: one sub-step of a pass.
SubStep: TypeAlias = Callable[[ConfigT, StateT, View, Measure], Needs | Done[StateT, ReportT]]


def run(
    steps: Sequence[SubStep[ConfigT, StateT, ReportT]], config: ConfigT, state: StateT, seen: View, measure: Measure
) -> Needs | tuple[History, StateT]:
    """Run ``steps`` in order from ``state`` over ``seen``: the first ``Needs``, else the last history and state."""
    history, handed = seen.history, None
    for sub in steps:
        if history is not seen.history:  # derived only when a sub-step follows (the last one's output is not read)
            seen = view(history, handed if isinstance(handed, View) else seen)
        answer = sub(config, state, seen, measure)
        if isinstance(answer, Needs):
            return answer
        history, state, handed = answer.history, answer.state, answer.memo
    return history, state
