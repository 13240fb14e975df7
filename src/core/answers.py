"""Absorbing answers: every answer is one insert into the state's table, keyed by its request's identity.

The shell performs the requests a step asked for (by the route the core chose) and hands
back each request with its text, ``None`` for a failure. :func:`absorb` puts them into the
conversation's one :class:`~.state.State`, whatever strategy asked; the next step finds
them there. Two answers say something about the route as well as about the request, and
are judged here: a record asked over the cached prefix is kept only when it quotes a value
of what it was shown (two that do not give the route up, :func:`.recall.judged_instruction`),
and a summary asked over the cached prefix that is not a summary of its items goes to the
summarizer (it is not remembered: the summarizer is asked), and so does every later summary once
two in a row were ignored (:func:`.recall.judged_summary`).
A request over the cached prefix that failed is no verdict on the model: it counts toward
the route's rest (:func:`.recall.failed`) and is asked again later.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from msgspec.structs import replace

from . import recall, records, user_summaries
from .effects import Request, Route, answered, remember
from .state import RequestKind, State

_ID_SUFFIX: Final = re.compile(r"(\d+)$")
#: The kinds a summary request over the cached prefix asks for (a record replacement always goes to the summarizer).
_SUMMARIES: Final = (RequestKind.SUMMARY, RequestKind.FOLD)


def absorb(state: State, answers: Sequence[tuple[Request, str | None]]) -> State:
    """``state`` with ``answers`` (each request with its text, ``None`` for a failure) in its table.

    A record asked with a summary in the same request answers both: each part goes to its own
    request (a part the answer lacks is no answer; its request is asked alone next).
    """
    for request, text in answers:
        if request.also is not None:
            record, summary = records.split_answer(request, text)
            state = _one(state, request, record)
            if summary is not None:
                state = _one(state, request.also, summary)
        else:
            state = _one(state, request, text)
    return state


def _one(state: State, request: Request, text: str | None) -> State:
    if request.kind is RequestKind.RECORD:
        if any(a.identity == request.identity for a in state.answers):
            return replace(state, recall=replace(state.recall, asking=None))  # answered already: nothing to judge
        if text is None:  # the provider did not answer: asked again on a later call, or the route rests
            return replace(state, recall=replace(recall.failed(state.recall), asking=None))
        kept = records.kept_record(request, text)
        judged = recall.judged_instruction(state.recall, followed=kept is not None)
        state = replace(state, recall=replace(judged, asking=None))
        return state if kept is None else remember(state, kept)
    if request.route is Route.CACHED_PREFIX:
        if text is None:  # remembered as any failure is (asked again once the conversation grows); toward a rest
            state = replace(state, recall=recall.failed(state.recall))
        else:
            followed = user_summaries.follows(request, text)
            state = replace(state, recall=recall.judged_summary(state.recall, followed=followed))
            if not followed:
                # An answer that ignored the instruction is no summary, and not even a failure: this summary goes to
                # the summarizer at once (every later one too after IGNORED_LIMIT in a row).
                return state
    elif request.route is Route.SUMMARIZER and text is not None and request.kind in _SUMMARIES:
        state = replace(state, recall=recall.summarized_aside(state.recall))
    answer = answered(request, text)
    state = remember(state, answer)
    if answer.text is None or request.kind not in _SUMMARIES:
        return state
    found = _ID_SUFFIX.search(request.message_id or "")
    allocated = (int(found.group(1)) if found else 0) + 1
    if request.kind is RequestKind.FOLD:
        return replace(state, folds=max(state.folds, allocated))
    return replace(state, compactions=max(state.compactions, allocated))
