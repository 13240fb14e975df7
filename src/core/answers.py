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

What an answer may cost is bounded before it is asked (:func:`max_answer_tokens`): every
answer the rules could keep is smaller than what it replaces, so the shell sends each request
with an output cap of that size and as much again for reasoning (at least 4,096 tokens). An
answer the provider cut at the cap is no record or summary: from the summarizer it counts as a
failure, over the cached prefix as an answer that did not follow the instruction (asked again,
it would be cut again). A runaway answer costs at most the cap, and never enters history. Over the
cached prefix the cap never rises above the conversation's own; an answer cut there, below the size
a kept answer may have, is no runaway: its complete lines are judged like any answer
(:func:`cut_answer`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Final

from msgspec.structs import replace

from . import recall, records, user_summaries
from .effects import Request, Route, answered, remember
from .state import RequestKind, State

_ID_SUFFIX: Final = re.compile(r"(\d+)$")
#: The kinds a summary request over the cached prefix asks for (a record replacement always goes to the summarizer).
_SUMMARIES: Final = (RequestKind.SUMMARY, RequestKind.FOLD)
#: The least room a compaction request gets beyond the size its answer must stay under to be kept: a reasoning
#: model's thinking counts as output, and the provider's tokenizer is not ours.
ANSWER_HEADROOM_TOKENS: Final = 4_096


def answer_bound(request: Request, measure: Callable[[str], int]) -> int | None:
    """The size an answer to ``request`` must stay under to be kept, in tokens; ``None`` for a host hook's.

    A record must be shorter than the tool results its request shows (:func:`.records.kept_record`);
    a user summary, a fold, a record merge or rewrite and an emergency fold smaller than the items
    they replace, which their transcript numbers. A record asked with a summary answers both, with
    the section line between them.
    """
    if request.route is Route.HOOK:
        return None
    if request.kind is not RequestKind.RECORD:
        return measure(request.transcript)
    bound = measure("\n".join(records.shown_result_texts(request.view)))
    also = None if request.also is None else answer_bound(request.also, measure)
    return bound if also is None else bound + measure(f"\n{records.SUMMARY_SECTION}\n") + also


def max_answer_tokens(
    request: Request, measure: Callable[[str], int], *, limit: int | None = None, thinking: int = 0
) -> int | None:
    """The output cap ``request`` is sent with, or ``None`` (a host hook's: the host bounds it).

    Its :func:`answer_bound`, then as much again for reasoning (at least
    :data:`ANSWER_HEADROOM_TOKENS`: a model reasons more over more), plus ``thinking``: a thinking
    budget the request spends before it answers (Anthropic's extended thinking counts toward the
    cap, which must exceed the budget). Never above ``limit``, the cap the conversation's own
    request carries when the request repeats it. An answer over the bound would be refused
    anyway, so the cap refuses nothing a rule could keep; it bounds what a runaway answer costs.

    Raises:
        ValueError: ``thinking`` is negative, or ``limit`` is below 1.
    """
    if thinking < 0 or (limit is not None and limit < 1):
        raise ValueError(f"thinking must be >= 0 and limit None or >= 1, got {thinking} and {limit}")
    bound = answer_bound(request, measure)
    if bound is None:
        return None
    cap = bound + max(bound, ANSWER_HEADROOM_TOKENS) + thinking
    return cap if limit is None else min(limit, cap)


def answer_room(limit: int | None, thinking: int = 0) -> int | None:
    """What an answer over the cached prefix may hold when its request repeats an output cap of ``limit`` (the
    conversation's own ``max_tokens``) with a thinking budget of ``thinking`` spent before it: ``None`` when no cap
    is set. What :attr:`.composition.CompositionConfig.answer_tokens` is set to on each pass."""
    return None if limit is None else max(1, limit - max(0, thinking))


def cut_answer(request: Request, text: str | None, measure: Callable[[str], int], *, limit: int | None) -> str:
    """What an answer over the cached prefix the provider cut at its output cap counts as.

    Cut at a cap the request's bound gave (:func:`max_answer_tokens` without ``limit``, or a
    ``limit`` at or above :func:`answer_bound`), it is a runaway: ``""``, an answer that did not
    follow the instruction (asked again, it would be cut again). Cut at the conversation's own
    ``limit``, below the size a kept answer may have, it is no runaway: what it wrote up to its last
    complete line (the cut fell in the last one, so its last value may be the start of another),
    judged as any answer is; ``""`` when no line is complete.
    """
    bound = answer_bound(request, measure)
    if limit is None or bound is None or limit >= bound or not text:
        return ""
    complete, newline, _ = text.rstrip("\n").rpartition("\n")
    return complete.rstrip() if newline else ""


def absorb(state: State, answers: Sequence[tuple[Request, str | None]]) -> State:
    """``state`` with ``answers`` (each request with its text, ``None`` for a failure) in its table.

    A record asked with a summary in the same request answers both: each part goes to its own
    request (a part the answer lacks is no answer; its request is asked alone next). A summary part
    that is no summary of its items (:func:`.user_summaries.follows`) is lacking too, not an ignored
    instruction: it shared the answer's room with the record, so it says nothing of how the model
    follows a summary request of its own.
    """
    for request, text in answers:
        if request.also is not None:
            record, summary = records.split_answer(request, text)
            state = _one(state, request, record)
            if summary is not None and user_summaries.follows(request.also, summary):
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
