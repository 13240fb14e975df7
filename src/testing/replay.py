"""Replay checks a host runs on its own configuration: the promises a state value makes, checked on histories.

Each check drives one strategy's core the way a host does (:func:`run_pass`: step, answer what it
needs, absorb, step again) and raises :class:`ReplayError` naming what broke:

- :func:`check_later_passes_keep_earlier_decisions`: as the conversation grows append-only, a later
  pass keeps every decision of an earlier one, byte for byte: what it excluded stays excluded (or is
  held for a record to quote), what
  it rewrote reads the same while it stays, what it inserted (records, summaries) stands with the
  same text, excluded only by a later decision that links to it;
- :func:`check_two_lists_agree`: two lists stepped from one state (the stored history, and a copy
  with context injected for one call) put the same conversation in the prompt;
- :func:`check_a_list_that_lost_its_insertions_agrees`: a list that kept the flags a pass wrote on its
  messages but not the messages the pass inserted (a chat client's per-call compaction over a session's
  stored history) gets the same prompt from the next pass;
- :func:`check_restored_state_replays`: a state stored as JSON and read back is the same value,
  and the next pass from it asks for nothing the first pass asked for and answers as the next pass
  from the state never stored does.

``step`` is any of the core's steps (``composition_step``, ...); ``answer`` stands in for the model
(:func:`quoting_answer` by default, deterministic), and ``rule`` (for a record strategy or the
composition: ``record_rule(config)``) wraps every pass in the recall protocol's two events, as a
host's model request does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from ..core import (
    AnchoredSnapshot,
    Done,
    History,
    MessageRecord,
    Needs,
    PinRule,
    Request,
    Route,
    State,
    absorb,
    history,
    message,
    read_snapshot,
    read_state,
    request_sent,
    request_starting,
    text_part,
)
from ..core.counting import Measure
from ..core.model import flagged
from ..core.values import distinctive_values

S = TypeVar("S", State, AnchoredSnapshot)
#: A strategy's configured step: ``step(config, state, history, measure, *, memo=None)``.
StepFunction = Callable[..., Any]
#: Stands in for the model: a request's answer, or ``None`` for a failure.
Answerer = Callable[[Request], "str | None"]
#: Rounds of effects one pass may ask for before the check calls it a loop.
MAX_ROUNDS = 64


class ReplayError(AssertionError):
    """A replay check found a broken promise; the message says which, and where."""


def quoting_answer(request: Request) -> str:
    """A deterministic stand-in for the model: the first line of what it is shown, and every distinctive value
    of it (what a record or summary must quote to be kept)."""
    if request.route is Route.CACHED_PREFIX and request.view is not None:
        shown = "\n".join(part.text for record in request.view if not record.excluded for part in record.parts)
    else:
        shown = request.transcript
    first = next((line.strip() for line in shown.splitlines() if line.strip()), "earlier turns")
    values = distinctive_values(shown)
    return f"{first[:80]}\nValues: {', '.join(values)}" if values else first[:80]


@dataclass(frozen=True, slots=True)
class Passed(Generic[S]):
    """One pass driven to its answer.

    Attributes:
        done: The step's answer.
        state: The state after it (the answers absorbed, the recall protocol's events applied).
        asked: Every request the pass asked for, in order.
    """

    done: Done[S, Any]
    state: S
    asked: tuple[Request, ...]


def run_pass(
    step: StepFunction,
    config: object,
    state: S,
    given: History,
    measure: Measure,
    *,
    answer: Answerer = quoting_answer,
    rule: PinRule | None = None,
) -> Passed[S]:
    """One pass over ``given`` as a host runs it: step, answer every request, absorb, step again.

    Raises:
        ReplayError: The pass asked again for an answer it already had, or never ended.
        CompactionBudgetExceeded: What must stay does not fit (the composition).
    """
    if rule is not None and isinstance(state, State):
        state = cast("S", request_starting(rule, state))
    asked: list[Request] = []
    seen: set[tuple[str, Route]] = set()
    result = step(config, state, given, measure)
    for _ in range(MAX_ROUNDS):
        if not isinstance(result, Needs):
            break
        keys = {(request.identity, request.route) for request in result.requests}
        if keys <= seen:
            raise ReplayError(f"the pass asked again for answers it already has: {sorted(k for k, _ in keys)}")
        seen |= keys
        asked.extend(result.requests)
        state = cast("S", absorb(cast("State", state), [(request, answer(request)) for request in result.requests]))
        result = step(config, state, given, measure)
    else:
        raise ReplayError(f"the pass still needed effects after {MAX_ROUNDS} rounds")
    done = cast("Done[S, Any]", result)
    after = done.state
    if rule is not None and isinstance(after, State):
        after = cast("S", request_sent(rule, after, done.history, measure))
    return Passed(done, after, tuple(asked))


# -- what a pass shows -------------------------------------------------------------------------------------


def shown(records: Iterable[MessageRecord]) -> list[tuple[str, str | None, tuple[tuple[str, str], ...]]]:
    """What the prompt of ``records`` carries, message by message (role, id, each part's kind and text), context
    injected for one call left out."""
    return [
        (record.role, record.message_id, tuple((part.kind, part.text) for part in record.parts))
        for record in records
        if not record.excluded and not record.injected
    ]


def with_injected_context(given: History, measure: Measure) -> History:
    """``given`` as a host's model call may see it: a todo list injected for this call first, then the history."""
    todo = message("user", [text_part("## Todo list\n- [ ] reconcile the totals", measure)], injected=True)
    moved = [_moved(record, 1) for record in given]
    return history([todo, *moved])


def _moved(record: MessageRecord, by: int) -> MessageRecord:
    origin = None if record.origin is None else record.origin + by
    return message(
        record.role,
        record.parts,
        message_id=record.message_id,
        origin=origin,
        preserved=record.preserved,
        injected=record.injected,
    )


def _read(config: object, state: S) -> S:
    data = json.loads(json.dumps(state.to_dict()))
    if isinstance(state, AnchoredSnapshot):
        return cast("S", read_snapshot(config, data))
    return cast("S", read_state(config, data))


# -- the checks --------------------------------------------------------------------------------------------


def check_later_passes_keep_earlier_decisions(
    growth: Sequence[History],
    *,
    step: StepFunction,
    config: object,
    state: S,
    measure: Measure,
    answer: Answerer = quoting_answer,
    rule: PinRule | None = None,
) -> S:
    """Each history of ``growth`` extends the one before append-only; a pass over each, carrying the state, keeps
    every decision of the pass before it, byte for byte. Returns the last state.

    A message the earlier pass excluded stays excluded (unless a record strategy holds it in the prompt for a
    record to quote: a tool group the anchored fallback shed before any record existed); one it rewrote (a
    result shortened or cut to its value lines) reads the same while it stays in the prompt, or leaves it; a
    message it inserted (a record, a summary) stands with the same text, or is replaced by a later decision (a
    summary that names it among the messages it replaces: a recompact, a fold).

    Raises:
        ReplayError: A later pass re-decided an earlier decision.
    """
    before: tuple[History, History] | None = None
    for given in growth:
        passed = run_pass(step, config, state, given, measure, answer=answer, rule=rule)
        state = passed.state
        if before is not None:
            _kept(*before, passed.done.history)
        before = (given, passed.done.history)
    return state


def _kept(earlier_given: History, earlier: History, later: History) -> None:
    by_origin = {record.origin: record for record in later if record.origin is not None}
    inserted = {record.message_id: record for record in later if record.origin is None and record.message_id}
    for record in earlier:
        if record.note:
            continue
        if record.origin is None:
            if not record.message_id:
                continue
            now = inserted.get(record.message_id)
            if now is None:
                if _superseded(record, earlier, by_origin, inserted):
                    continue
                raise ReplayError(f"inserted message {record.message_id} of an earlier pass is gone")
            if now.parts != record.parts:
                raise ReplayError(f"inserted message {record.message_id} of an earlier pass reads differently")
            continue
        now = by_origin.get(record.origin)
        if now is None:
            raise ReplayError(f"message {record.origin} of an earlier pass is gone")
        if record.excluded and not now.excluded and now.held is None:
            raise ReplayError(f"message {record.origin}, excluded by an earlier pass, is back in the prompt")
        rewritten = record.parts != earlier_given[record.origin].parts
        if rewritten and not now.excluded and now.parts != record.parts:
            raise ReplayError(f"message {record.origin}, rewritten by an earlier pass, reads differently")


def check_two_lists_agree(
    given: History,
    *,
    step: StepFunction,
    config: object,
    state: S,
    measure: Measure,
    answer: Answerer = quoting_answer,
    rule: PinRule | None = None,
) -> S:
    """The in-call copy (``given`` with context injected for one call) and the stored history, stepped one after
    the other from one state, put the same conversation in the prompt. Returns the state after both.

    As in a host's model request: the copy is compacted inside the request (with ``rule``, between the recall
    protocol's two events), the stored history after it has gone out.

    Raises:
        ReplayError: The two prompts differ.
        CompactionBudgetExceeded: A pass cannot fit what must stay (the injected context counts toward the budget).
    """
    # One model request: the in-call copy is compacted inside it, the stored history after it has gone out.
    if rule is not None and isinstance(state, State):
        state = cast("S", request_starting(rule, state))
    copy = run_pass(step, config, state, with_injected_context(given, measure), measure, answer=answer)
    after = copy.state
    if rule is not None and isinstance(after, State):
        after = cast("S", request_sent(rule, after, copy.done.history, measure))
    stored = run_pass(step, config, after, given, measure, answer=answer)
    if shown(copy.done.history) != shown(stored.done.history):
        raise ReplayError("the in-call copy and the stored history put different conversations in the prompt")
    return stored.state


def check_a_list_that_lost_its_insertions_agrees(
    given: History,
    *,
    step: StepFunction,
    config: object,
    state: S,
    measure: Measure,
    answer: Answerer = quoting_answer,
    rule: PinRule | None = None,
) -> S:
    """After a pass over ``given``, the list a host keeps when it writes the pass's flags onto its messages but drops
    what the pass inserted (records, summaries, notes: a chat client's per-call compaction over a session's stored
    history) puts the same conversation in the prompt on the next pass, and asks for no answer the state holds.
    Returns the state after that pass.

    Raises:
        ReplayError: The next pass asked again, or its prompt differs (a message excluded for a replacement the
            list lost left the prompt with nothing standing for it).
    """
    first = run_pass(step, config, state, given, measure, answer=answer, rule=rule)
    kept = history(
        flagged(record, origin=index)
        for index, record in enumerate(r for r in first.done.history if r.origin is not None)
    )
    # The same request's state, stepped again over the list the host kept (no new request: ``rule`` is not applied).
    again = run_pass(step, config, first.state, kept, measure, answer=answer)
    repeated = _asked_again(first.state, again)
    if repeated:
        raise ReplayError(f"the list that lost its insertions asked again for {repeated} answer(s)")
    if shown(first.done.history) != shown(again.done.history):
        raise ReplayError("the list that lost the pass's insertions puts another conversation in the prompt")
    return again.state


def _asked_again(state: S, later: Passed[S]) -> int:
    """How many answers ``state`` holds that ``later`` asked for again."""
    answered = {a.identity for a in state.answers} if isinstance(state, State) else set[str]()
    return len({request.identity for request in later.asked} & answered)


def check_restored_state_replays(
    given: History,
    *,
    step: StepFunction,
    config: object,
    state: S,
    measure: Measure,
    answer: Answerer = quoting_answer,
    rule: PinRule | None = None,
) -> S:
    """After a pass over ``given``, its state stored as JSON and read back (strictly, under ``config``) is the same
    value, and the next pass from it asks for no answer the state holds (no second effect call), and asks and
    answers as the next pass from the state never stored does. Returns the restored state after that pass.

    Raises:
        ReplayError: The restored state differs, asked again, or answered otherwise.
    """
    first = run_pass(step, config, state, given, measure, answer=answer, rule=rule)
    restored = _read(config, first.state)
    if restored != first.state:
        raise ReplayError("the state read back from JSON is not the state stored")
    kept = run_pass(step, config, first.state, given, measure, answer=answer, rule=rule)
    again = run_pass(step, config, restored, given, measure, answer=answer, rule=rule)
    repeated = _asked_again(first.state, again)
    if repeated:
        raise ReplayError(f"the restored state asked again for {repeated} answer(s) it already had")
    if [r.identity for r in again.asked] != [r.identity for r in kept.asked]:
        raise ReplayError("the restored state asks otherwise than the state never stored")
    if again.done.history != kept.done.history or again.state != kept.state:
        raise ReplayError("the restored state answers otherwise than the state never stored")
    return again.state


def _superseded(
    record: MessageRecord,
    earlier: History,
    by_origin: Mapping[int, MessageRecord],
    inserted: Mapping[str, MessageRecord],
) -> bool:
    """A later decision replaced ``record`` (an inserted summary, gone from the later pass): every message it
    replaced is replaced now by a message the later pass inserted (a recompact or a fold)."""
    replaced = [r.origin for r in earlier if r.origin is not None and r.replaced_by == record.message_id]
    successors = {by_origin[o].replaced_by if o in by_origin else None for o in replaced}
    return bool(replaced) and all(s is not None and s != record.message_id and s in inserted for s in successors)
