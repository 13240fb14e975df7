"""The record strategy: tool results leave the prompt once a record quotes their values.

Past the window, trimming trades facts for room. A *record* lets the model write down
the exact values of earlier tool results; once it has, the raw results can leave the
prompt without losing anything. The rules, all pure functions of the history, its
records and the :class:`~.state.RecordDecisions`:

- **Records** are results of ``recall_earlier_tool_results`` calls (matched by call id,
  anywhere in the list) that carry :data:`RECORD_MARKER`, and records compaction wrote.
  Excluded messages are never records. Records stay in the prompt: they are held, so
  the fallback leaves them whole.
- Records are asked for past ``trigger_fraction`` of the budget (by the recall
  middleware, which shares the fraction). Without a record the strategy waits; past
  ``fallback_fraction`` it gives up waiting and the shell runs the fallback with
  nothing held.
- Once a record exists, every pass applies the records, whatever the prompt's size, so
  the prompt is a function of the history and its records alone and changes only when
  a record arrives: every tool group after the head that ends before the newest record is
  judged by **coverage**, once: by the first record after it that quotes any of its
  distinct distinctive values (:mod:`.values`), with every record before that one (a
  later record never changes what stays of it). At least ``ceil(n * coverage_share)`` of
  them quoted covers it, and it leaves the prompt (or leaves a remnant of the values they
  do not quote). Fewer make it **thin**: it is cut on that pass to its lines with a value
  (the safety net's form, :mod:`.distill`), after a group larger than
  ``record_target_tokens`` released the table rows the records quote verbatim
  (:mod:`.tables`). A group without values is covered when each tool it called is
  mentioned by name at least as often as candidate groups call it. A group no record
  after it quotes is uncovered and **held** (the fallback must not shrink it).
- Uncovered groups are **asked** for once per batch (the middleware re-forces one
  request); an ask ends when a new record arrives or after two responses without one.
  When it ends with none of its batch covered, the batch is **settled**: held for good,
  released only when a later record quotes it.
- If the prompt is still over the budget, every remaining tool group is held too and
  the shell runs the fallback behind the record, which can then shed only narration.
- When no record can be asked for at all (:func:`.recall.no_route`), the fallback's safety
  net takes the record's place past the trigger: every group no record covers, after the
  head and before the newest group (:func:`fallback_for`), is cut to its value lines in one
  pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import partial
from itertools import accumulate
from typing import Final, TypeAlias

from msgspec.structs import replace as evolve
from pyrsistent import pvector

from . import anchored, recall, user_summaries
from .anchored import DEFAULT_KEEP_HEAD_GROUPS, DEFAULT_KEEP_TAIL_GROUPS, AnchoredConfig
from .checks import AtLeastOne, AtLeastZero, Fraction, share_of, validate
from .counting import MESSAGE_OVERHEAD_TOKENS
from .distill import distill, is_distilled, is_remnant, remnant
from .effects import COMPACTION_REQUEST, Request, RequestKind, Route, identity
from .grouping import Grouping, regroup
from .model import Group, History, MessageRecord, Part, conversation_records, flagged
from .protocol import Done, Needs, Step, sent_tokens
from .recall import no_route, pins_given_up
from .state import (
    AnchoredSnapshot,
    Answer,
    Ask,
    RecallState,
    RecallStatus,
    RecordDecisions,
    State,
    record_message_id,
)
from .tables import RowKey, release_rows, repeated_rows, row_keys
from .values import distinctive_values, name_mentions, word_set
from .view import RECALL_ARGUMENT, RECALL_TOOL_NAME, RecallCalls, View, call_values, find_recall_calls, view

Measure = Callable[[str], int]

RECORD_MARKER: Final = "[recorded by compaction]"
RECORD_PREAMBLE: Final = (
    "Earlier tool results may have been shortened or removed from this conversation; this is their "
    "compaction record. Treat its values as authoritative for the tool it names, and treat information "
    "as absent only if it appears nowhere, including here."
)
RECORD_PREFIX: Final = f"{RECORD_MARKER} {RECORD_PREAMBLE}"
#: What the recall tool answers a record with: the record is the call's own argument, which the prompt
#: already carries, so the result names it rather than repeating it (:func:`record_text` joins the two).
RECORD_IN_CALL: Final = f"The record is the `{RECALL_ARGUMENT}` this call was given."
RECORD_RECEIPT: Final = f"{RECORD_PREFIX}\n{RECORD_IN_CALL}"

#: Hold reasons, written on held messages so the fallback leaves them whole.
HOLD_UNCOVERED: Final = "tool_summary_uncovered"
HOLD_UNRECORDED: Final = "tool_summary_unrecorded"
HOLD_RECORD: Final = "tool_summary_record"
HOLD_REASONS: Final = frozenset({HOLD_UNCOVERED, HOLD_UNRECORDED, HOLD_RECORD})
#: Groups the safety net may distill over the budget: no record covers them (held as
#: uncovered or unrecorded, or not held at all when no record exists yet).
DISTILLABLE: Final[frozenset[str | None]] = frozenset({None, HOLD_UNCOVERED, HOLD_UNRECORDED})
#: Why the messages of a covered tool group are excluded (written on the messages).
EXCLUDE_REASON: Final = "tool_summary_anchored"

DEFAULT_TRIGGER_FRACTION: Final = recall.DEFAULT_TRIGGER_FRACTION
DEFAULT_FALLBACK_FRACTION: Final = 0.9
DEFAULT_COVERAGE_SHARE: Final = 0.8
DEFAULT_RECORD_TARGET_TOKENS: Final = 2_000
#: The payoff share the README's composition uses (:func:`record_pays`; :data:`.recall.PAYOFF_SHARE` says why).
PAYOFF_SHARE: Final = recall.PAYOFF_SHARE
#: The prose a record is expected to write about each tool group it covers, beside quoting the group's values
#: (a sentence or two: what the tool was asked and what it found).
RECORD_PROSE_TOKENS: Final = 60
#: Responses after an ask without a new record before the ask is judged failed.
ASK_RESPONSES: Final = 2
#: What a record must hold: the recall tool's description and the instruction of a record
#: asked for over the cached prefix say it in these words.
RECORD_GUIDANCE: Final = (
    "Everything from the earlier tool results, grouped by the tool that produced it, so that "
    "nothing is lost unnoticed. Quote verbatim every value that cannot be reconstructed: identifiers, "
    "codes, names, numbers, paths, URLs, versions, states and timestamps. Copy Markdown table rows "
    "verbatim, under their column heading and separator rows. Keep findings and conclusions as stated. "
    "Carry over unchanged any summary a tool wrote. Briefly summarise the rest. Include only what was "
    "actually present. When forced to choose, prefer exactness over brevity."
)
#: What a record is for: the recall tool's description and the instruction over the cached prefix say it so.
RECORD_PURPOSE: Final = (
    "what must survive from the earlier tool results in this conversation, so that it stays available "
    "after those results are removed to save space."
)
#: The one message a record asked for over the cached prefix appends to the conversation's request.
RECORD_INSTRUCTION: Final = (
    f"{COMPACTION_REQUEST} Do not continue the task and do not call a tool for it. Write a record of "
    f"{RECORD_PURPOSE} Answer with the record only (or with one "
    f"{RECALL_TOOL_NAME} call whose values argument holds it). The record holds: {RECORD_GUIDANCE}"
)
#: The line that opens the summary part of an answer to a record asked with a summary (:func:`with_summary`).
SUMMARY_SECTION: Final = "[summary]"
#: What a record asked with a summary adds after the record's instruction (``{section}``: the line between them).
WITH_SUMMARY: Final = "Then, after the record, write one line {section} and below it a summary, as follows."
#: The id prefix of records written over the cached prefix (a merge's or a rewrite's have others).
ALIGNED_RECORD_ID_PREFIX: Final = "compaction_record_"


@dataclass(frozen=True, slots=True)
class RecordConfig:
    """Parameters of the record strategy; invalid values raise ``ValueError``.

    Attributes:
        max_input_tokens: The input budget.
        keep_head_groups: Groups at the start that are never judged (task, requirements).
        keep_tail_groups: The tail the default fallback keeps.
        trigger_fraction: The recall middleware asks for a record above this share of
            the budget; records apply whatever the size once they exist.
        fallback_fraction: Without a record, the fallback runs from this share on.
        coverage_share: Share of a group's distinct values a record must quote, in
            (0, 1]: at 0 every group would count as covered with nothing quoted.
        record_target_tokens: Groups above this size may release quoted table rows;
            ``None`` disables partial release and the unreachable-coverage estimate.
        payoff_share: A record is asked for a tool group only when its expected size (its
            distinct values and :data:`RECORD_PROSE_TOKENS` of prose) is at most this share of
            the group's tokens (:func:`record_pays`); a group whose record would not pay is
            held like a settled one, never asked for, and left to the fallback. ``None``
            (default) asks for every group whatever its record costs; :data:`PAYOFF_SHARE` is
            what the README's composition uses.
        fallback: The anchored fallback run within the pass when no record can help;
            ``None`` when the host supplied a fallback of its own, which the shell runs
            after applying the pass (:attr:`RecordReport.fallback` says when).
    """

    max_input_tokens: AtLeastOne
    keep_head_groups: AtLeastZero = DEFAULT_KEEP_HEAD_GROUPS
    keep_tail_groups: AtLeastZero = DEFAULT_KEEP_TAIL_GROUPS
    trigger_fraction: Fraction = DEFAULT_TRIGGER_FRACTION
    fallback_fraction: Fraction = DEFAULT_FALLBACK_FRACTION
    coverage_share: Fraction = DEFAULT_COVERAGE_SHARE
    record_target_tokens: AtLeastOne | None = DEFAULT_RECORD_TARGET_TOKENS
    payoff_share: Fraction | None = None
    fallback: AnchoredConfig | None = None

    def __post_init__(self) -> None:
        validate(self)
        if self.fallback_fraction <= self.trigger_fraction:
            raise ValueError(
                f"fallback_fraction must be greater than trigger_fraction ({self.trigger_fraction!r}), "
                f"got {self.fallback_fraction!r}"
            )

    @property
    def trigger_tokens(self) -> int:
        """Prompt size above which records are asked for and applied."""
        return int(self.max_input_tokens * self.trigger_fraction)

    def prefix_tokens(self, recall_state: RecallState, instruction: int) -> int:
        """The most the messages of a request over the cached prefix send, beside its ``instruction`` tokens.

        What the conversation's last request sent (the recall protocol saw it on the way out):
        the prompt as it stands is that request byte for byte and then what arrived since, so
        the request repeats exactly what the provider cached and nothing it must write anew
        (a provider that bills cache writes writes the new part once, for the conversation's
        next request), and it is no larger than a request the provider took with this head.
        Never past the budget with the instruction; before any request was seen, the
        fallback's share of the budget (a margin for what a request carries beside its messages).
        """
        if recall_state.seen is None:  # the fallback's share is within the budget (a fraction is at most 1)
            return self.fallback_tokens - instruction
        return min(self.max_input_tokens - instruction, recall_state.seen.included_tokens)

    @property
    def fallback_tokens(self) -> int:
        """Prompt size from which the strategy stops waiting for a first record."""
        return int(self.max_input_tokens * self.fallback_fraction)


# ----------------------------------------------------------------------------------------
# Recognising records
# ----------------------------------------------------------------------------------------


def record_text(record: MessageRecord, recall_calls: RecallCalls) -> str:
    """The record text ``record`` carries: "" when it is not a record."""
    if record.excluded:
        return ""
    if record.written_record:
        text = "\n".join(p.text for p in record.parts if p.kind == "text")
        return text if text.startswith(RECORD_PREFIX) and not record.has_tool_call else ""
    return "\n".join(_recall_records(record, recall_calls))


def _recall_records(record: MessageRecord, recall_calls: RecallCalls) -> list[str]:
    """The records ``record`` carries as results of recall calls, excluded or not.

    A result that is the tool's receipt (:data:`RECORD_RECEIPT`) carries its call's record; an
    earlier release's result repeated the record after the prefix, and carries it itself.
    """
    if record.role != "tool":
        return []
    return [
        _receipted(part.text, recall_calls.get(part.call_id or "", ""))
        for part in record.parts
        if part.kind == "function_result" and part.call_id in recall_calls and RECORD_MARKER in part.text
    ]


def _receipted(result: str, call: str) -> str:
    """The record a recall result carries: its call's (:func:`.view.call_values`) when ``result`` is the tool's
    receipt (:data:`RECORD_RECEIPT`), else ``result`` itself."""
    if result.startswith(RECORD_PREFIX) and result.removeprefix(RECORD_PREFIX).strip() == RECORD_IN_CALL:
        return f"{RECORD_PREFIX}\n{call_values(call)}"
    return result


#: Why a record a composition's merge or rewrite replaced is excluded (written on its messages).
REPLACED_REASON: Final = "record_replaced"
#: The ids of the composition's record merges and rewrites (``record_replacement_<n>``): records the summarizer
#: wrote, not the conversation's model.
REPLACEMENT_ID_PREFIX: Final = "record_replacement_"


def _replaced_text(record: MessageRecord, recall_calls: RecallCalls) -> str:
    """The record text ``record`` carried before a merge or rewrite replaced it: "" when it is no such record."""
    if not (record.excluded and record.reason == REPLACED_REASON):
        return ""
    return record_text(replace(record, excluded=False), recall_calls)


def is_recall_group(records: Sequence[MessageRecord], group: Group, recall_calls: RecallCalls) -> bool:
    """``group`` is a call of the recall tool (a record the model wrote through it) or its result."""
    return any(
        RECALL_TOOL_NAME in records[i].call_names
        or any(p.kind == "function_result" and p.call_id in recall_calls for p in records[i].parts)
        for i in group.members
    )


def _pending(
    seen: View, gate: _Gate | None = None, pays: _PaysMemo | None = None
) -> tuple[list[str], list[tuple[int, Group]]]:
    """The active records' texts, in order, and (ordinal, group) of every tool group after the
    newest one that still has an included message and is not a recall group: new tool material
    (with ``gate``, only the groups whose own record would pay: :func:`record_pays`; ``pays`` is
    (the last call's decisions, this call's to fill), a memo that never changes the answer)."""
    records, recall_calls = seen.records, seen.recall_calls
    found = [(k, text) for k, r in enumerate(records) if (text := record_text(r, recall_calls))]
    newest = found[-1][0] if found else -1
    pending = [
        (ordinal, g)
        for ordinal, g in enumerate(g for g in seen.grouping.all if g.kind == "tool_call")
        if g.start > newest
        and not all(records[i].excluded for i in g.members)
        and not is_recall_group(records, g, recall_calls)
        and (gate is None or _pays_memo(records, g, gate, pays))
    ]
    return [text for _, text in found], pending


#: What :func:`record_pays` reads beside a group: the host's measure, the payoff share and the prose expected
#: (:func:`learned_prose`).
_Gate: TypeAlias = tuple[Measure, float, int]


def _gate(share: float | None, measure: Measure | None, seen: View) -> _Gate | None:
    """The payoff gate of ``share``, expecting the prose the records of ``seen`` carried (:func:`learned_prose`);
    ``None``: every record pays, or no measure to judge by."""
    if share is None or measure is None:
        return None
    return measure, share, expected_prose(seen, measure)


def expected_prose(seen: View, measure: Measure) -> int:
    """The prose the conversation's next record is expected to carry beside its values: :func:`learned_prose` of
    the records its model wrote (:func:`model_records`)."""
    return learned_prose(model_records(seen.records, seen.recall_calls), measure)


def model_records(records: Sequence[MessageRecord], recall_calls: RecallCalls) -> list[str]:
    """The texts of the records the conversation's model wrote, in order: the active ones and those a merge or
    rewrite replaced (they stay in the history, excluded), not the replacements (the summarizer writes those)."""
    return [
        t
        for r in records
        if not (r.message_id or "").startswith(REPLACEMENT_ID_PREFIX)
        and (t := record_text(r, recall_calls) or _replaced_text(r, recall_calls))
    ]


def learned_prose(texts: Sequence[str], measure: Measure) -> int:
    """The prose a record of this conversation is expected to carry beside the values it quotes: over the
    records ``texts`` the model wrote (:func:`model_records`), the mean of each one's tokens less those of its
    distinct distinctive values, joined; :data:`RECORD_PROSE_TOKENS` before the first record.

    A model writes as it writes: one that opens every record with a paragraph will do it
    again, so the estimate of the next record's size (:func:`record_pays`) is learned from
    the records the conversation already holds. They stay in the history (a merge or
    rewrite leaves the records it replaced there, excluded), so every pass, every replica
    and a restored copy read the same records and decide alike. The mean is over records,
    not over the groups each covers: a record of several groups counts its prose once, so
    the estimate errs toward asking less. What the records showed stands: once it declines
    every later group, no record comes to revise it (measured against counting the prior
    as one record more, which asked for records that cost more than they saved on reads of
    the standard library: docs/records.md).
    """
    if not texts:
        return RECORD_PROSE_TOKENS
    prose = [max(0, measure(t) - measure(" ".join(dict.fromkeys(distinctive_values(t))))) for t in texts]
    return round(sum(prose) / len(prose))


def expected_record_tokens(request: Request, seen: View, measure: Measure) -> int:
    """The size a record answering ``request`` (asked over the cached prefix) is expected to have, as
    :func:`record_pays` expects it: the distinct distinctive values of the tool results its view shows, which
    the coverage rule asks it to quote, and the prose the records of ``seen`` carried (:func:`expected_prose`)."""
    texts = shown_result_texts(request.view) if request.view is not None else []
    values = list(dict.fromkeys(v for t in texts for v in distinctive_values(t)))
    return _record_size(values, measure, expected_prose(seen, measure))


def _record_size(values: Sequence[str], measure: Measure, prose: int) -> int:
    """A record's expected size: the ``values`` it must quote and ``prose`` beside them."""
    return measure(" ".join(values)) + prose


def record_pays(
    values: Sequence[str], tokens: int, measure: Measure, share: float | None, *, prose: int = RECORD_PROSE_TOKENS
) -> bool:
    """Would a record of a tool group of ``tokens`` tokens with distinct distinctive ``values`` pay for itself?

    A record must quote the group's values (the coverage rule) and writes ``prose`` about it
    (what the conversation's records carried, :func:`learned_prose`; :data:`RECORD_PROSE_TOKENS`
    before the first); it is worth asking for only when that expected size is at most
    ``share`` of what it lets leave the prompt (:data:`.recall.PAYOFF_SHARE` says why). A pure
    function of the group's own text and the conversation's records, so every pass and every
    replica decide alike. ``share`` ``None``: every record pays.
    """
    if share is None:
        return True
    return _record_size(values, measure, prose) <= share * tokens


def _pays(records: Sequence[MessageRecord], group: Group, gate: _Gate, values: Sequence[str] | None = None) -> bool:
    """:func:`record_pays` for ``group`` as it was loaded: results an earlier pass cut count as their original
    (``values``: its distinct values, when known)."""
    measure, share, prose = gate
    members = [records[i] for i in group.members if not records[i].excluded]
    if values is None:
        values = tuple(dict.fromkeys(v for t in _judged_texts(members) for v in distinctive_values(t)))
    return record_pays(values, _uncut_tokens(members, measure), measure, share, prose=prose)


#: Payoff decisions by what decides them (:func:`_pays_key`): the last call's, and this call's to fill.
_PaysMemo: TypeAlias = tuple[Mapping[object, bool], dict[object, bool]]


def _pays_key(records: Sequence[MessageRecord], group: Group) -> object:
    """What :func:`_pays` reads of ``group``: its included messages' tokens and its results' texts, originals and
    counts (text objects the shell reuses hash and compare at once)."""
    members = [records[i] for i in group.members if not records[i].excluded]
    parts = tuple((p.text, p.original, p.tokens) for r in members for p in r.parts if p.kind == "function_result")
    return sum(r.tokens for r in members), parts


def _pays_memo(records: Sequence[MessageRecord], group: Group, gate: _Gate, pays: _PaysMemo | None) -> bool:
    """:func:`_pays`, read from (and written to) ``pays`` when given."""
    if pays is None:
        return _pays(records, group, gate)
    known, fresh = pays
    key = gate[2], _pays_key(records, group)
    fresh[key] = known[key] if key in known else _pays(records, group, gate)
    return fresh[key]


def _uncut_tokens(members: Iterable[MessageRecord], measure: Measure) -> int:
    """Tokens ``members`` send, with every result an earlier pass cut counted as its original."""
    total = 0
    for record in members:
        total += record.tokens
        for part in record.parts:
            if part.kind == "function_result" and (original := _judged_text(part)) != part.text:
                total += measure(original) - part.tokens
    return total


@dataclass(frozen=True, slots=True)
class StatusMemo:
    """What one :func:`recall_status` call hands the next: it saves work and never changes an answer.

    Attributes:
        grouping: The history's grouping (the next history regroups from it).
        pays: The payoff decisions of the groups it judged, by what decides them.
    """

    grouping: Grouping
    pays: Mapping[object, bool] = field(default_factory=dict[object, bool])


def recall_status(
    history: History,
    memo: StatusMemo | None = None,
    *,
    measure: Measure | None = None,
    payoff_share: float | None = None,
) -> tuple[RecallStatus, StatusMemo]:
    """Size, records and new tool material of ``history`` (for the recall middleware), with a memo for the next
    call (``memo`` is the last one's, and never changes the answer).

    With ``measure`` and ``payoff_share``, new tool material is the groups whose record would pay
    (:func:`record_pays`): a group whose record would cost more than it saves never makes one due.
    """
    seen = view(history, None if memo is None else memo.grouping)
    fresh: dict[object, bool] = {}
    texts, pending = _pending(seen, _gate(payoff_share, measure, seen), ({} if memo is None else memo.pays, fresh))
    records = seen.records
    quoted = word_set(texts[-1]) if texts else frozenset[str]()
    # A group the newest record quotes was shown to it (with thinking on, a record stands before its turn's groups):
    # its tokens do not make another record due alone. Without a record no group is quoted: no value is read.
    tokens = sum(
        records[i].tokens
        for _, g in pending
        if not (quoted and _result_values(records[i] for i in g.members) & quoted)
        for i in g.members
        if not records[i].excluded
    )
    status = RecallStatus(
        included_tokens=seen.sent, records=len(texts), pending_groups=len(pending), pending_tokens=tokens
    )
    return status, StatusMemo(seen.grouping, fresh)


def _result_values(records: Iterable[MessageRecord]) -> set[str]:
    """The distinctive values of the tool results ``records`` carry."""
    return {
        value
        for record in records
        for part in record.parts
        if part.kind == "function_result"
        for value in distinctive_values(part.text)
    }


def ask_for_pending(seen: View, decisions: RecordDecisions, config: RecordConfig, measure: Measure) -> RecordDecisions:
    """``decisions`` with an ask for the tool groups after the newest record (none outstanding yet).

    A composition near its budget asks for a record of what no record holds yet rather
    than shed it unrecorded; the recall middleware pins the next request for it. Only
    groups whose record would pay are asked for (``config.payoff_share``, :func:`record_pays`).
    Unchanged when an ask is outstanding or nothing is pending.
    """
    if decisions.ask is not None:
        return decisions
    records, settled = seen.records, decisions.settled
    ordinals = [
        o
        for o, g in _pending(seen, _gate(config.payoff_share, measure, seen))[1]
        if o not in settled and not any(records[i].preserved for i in g.members)
    ]
    if not ordinals:
        return decisions
    ask = Ask(targets=tuple(ordinals), records_at_ask=records_written(records), responses_at_ask=responses(records))
    return evolve(decisions, ask=ask)


def unpaying(seen: View, config: RecordConfig, measure: Measure) -> set[int | None]:
    """The origins of the messages of every tool group whose record would not pay (:func:`record_pays`, with the
    prose the conversation's records carried): no record to come would keep their values. Empty when every
    record pays (no ``payoff_share``)."""
    gate = _gate(config.payoff_share, measure, seen)
    if gate is None:
        return set()
    tools = [g for g in seen.grouping.all if g.kind == "tool_call"]
    return {seen.records[i].origin for g in tools if not _pays(seen.records, g, gate) for i in g.members}


# ----------------------------------------------------------------------------------------
# The pass
# ----------------------------------------------------------------------------------------


class Fallback(Enum):
    """Which fallback the shell must run after applying a pass."""

    NONE = "none"
    PLAIN = "plain"
    """No record at or past ``fallback_fraction``: the fallback runs with nothing held."""
    BEHIND_RECORD = "behind_record"
    """Over the budget with a record: every remaining tool group is held first."""


@dataclass(frozen=True, slots=True)
class RecordReport:
    """What a pass did.

    Attributes:
        tokens_before: Prompt tokens of the conversation before the pass.
        tokens_after: Prompt tokens after the pass (before any fallback).
        triggered: The prompt was over the trigger.
        records: Active records in the conversation.
        covered: Ordinals of the tool groups the records cover (left the prompt, or left a
            remnant: see ``remnants``), and of those they quote too thinly (see ``thin``).
        dropped: Origins of messages this pass newly excluded because a record covers them.
        joined: Origins of messages excluded to keep a tool group whole: the rest of an
            uncovered group found partly excluded (a late result for a covered call).
        thin: Ordinals of the groups the records quote below ``coverage_share``: cut to their
            value lines (see ``distilled``), not held, not asked for.
        uncovered: Ordinals of candidate groups no record after them quotes (held).
        settled: Ordinals of uncovered groups held for good.
        declined: Ordinals of uncovered groups whose record would not pay (:func:`record_pays`):
            held like settled ones, never asked for.
        asked: Ordinals of a new ask made on this pass (empty when none).
        rows_released: Table rows this pass newly released from held results.
        remnants: Results of groups the records cover in part, cut on this pass to their
            title line and the lines with a value the records do not quote (the rest left).
        distilled: Results of groups the records quote below ``coverage_share``, cut on
            this pass to their title line and every line with a value (the safety net's form).
        unreachable: Held groups whose cheapest sufficient value text exceeds
            ``record_target_tokens`` (a diagnostic estimate).
        held_unrecorded: Groups held so the fallback behind a record leaves them whole.
        fallback: The fallback the pass called for (run within it when configured).
        fallback_report: What the in-pass anchored fallback did, when it ran.
        overflow: Behind a record, the prompt is still over the budget after the in-pass
            fallback: the head, the records and the held groups do not fit.
    """

    tokens_before: int
    tokens_after: int
    triggered: bool = False
    records: int = 0
    covered: tuple[int, ...] = ()
    dropped: tuple[int, ...] = ()
    joined: tuple[int, ...] = ()
    thin: tuple[int, ...] = ()
    uncovered: tuple[int, ...] = ()
    settled: tuple[int, ...] = ()
    declined: tuple[int, ...] = ()
    asked: tuple[int, ...] = ()
    rows_released: int = 0
    remnants: int = 0
    distilled: int = 0
    unreachable: int = 0
    held_unrecorded: int = 0
    fallback: Fallback = Fallback.NONE
    fallback_report: anchored.Report | None = None
    overflow: bool = False


#: The records' texts, the words of each, and the words of each and every record before it (:func:`_judges`).
_Judges: TypeAlias = tuple[tuple[str, ...], tuple[frozenset[str], ...], tuple[frozenset[str], ...]]


@dataclass(frozen=True, slots=True)
class RecordMemo:
    """Work one pass of the record rules hands the next: it saves work and never changes an answer.

    Every entry is keyed by what it was derived from and checked against it on use, so
    a memo from another history (the other list, a restore) only costs a miss.

    Attributes:
        view: The view of the rules' output (:mod:`.view`): the next pass regroups from its
            grouping, and a composition reads it as its pass's view.
        values: The distinctive values of each tool result text the last pass judged,
            keyed by the text (the shell reuses the same text objects across passes).
        quoted: The records' text of the last pass with its name mentions.
        judges: The records' texts of the last pass with the words of each, and of each and
            every record before it (:func:`_judges`).
        band: The last fallback run's band (its ``Done.memo``).
    """

    view: View | None = None
    values: Mapping[str, tuple[str, ...]] = field(default_factory=dict[str, tuple[str, ...]])
    quoted: tuple[str, Mapping[str, int]] | None = None
    judges: _Judges | None = None
    band: object = None


@dataclass(frozen=True, slots=True)
class _Candidate:
    ordinal: int
    group: Group
    values: tuple[str, ...]
    names: tuple[str, ...]


def step(
    config: RecordConfig, state: State, history: History, measure: Measure, *, memo: object = None
) -> Step[State, RecordReport]:
    """One record pass over ``history``, with the anchored fallback when it is called for.

    The record rules run first (see the module docstring). When they call for the
    fallback and it is configured (:attr:`RecordConfig.fallback`), it runs on their
    answer with every held message protected, so it can shed only what no rule holds.
    ``memo`` is the previous pass's ``Done.memo``; it never changes the answer.
    """
    history = place_written(history, written(state), measure)
    band = memo.band if isinstance(memo, RecordMemo) else None
    stands = state.fallback.decided
    passed = rules(config, history, state.records, measure, memo=memo, fallback_stands=stands)
    # A record due on this request is asked over the prompt as it stands: the history handed in with every record
    # placed and applied (the last request and what came since, whatever list it is). When that shows nothing
    # unrecorded within what the last request sent, the pass goes on, and asks over its output at its end.
    asked = ask_over(config, state, passed.history, measure)
    if asked is not None:
        return Needs((asked,))
    memo = passed.memo
    assert isinstance(memo, RecordMemo)
    report, output, fallback_state = passed.report, passed.history, state.fallback
    # The fallback's decisions replay on every pass while they stand, whatever the size, so
    # both lists agree (the in-call copies carry injected context the stored history lacks).
    net = net_ceiling(config, state)
    due = report.fallback is not Fallback.NONE or stands or (net is not None and report.tokens_after > net)
    fallback = fallback_for(config, state)
    if due and fallback is not None:
        ran = run_with_holds(
            fallback, state.fallback, output, measure, memo=band, distillable=DISTILLABLE, distill_ceiling=net
        )
        output, fallback_state, band = ran.history, ran.state, ran.memo
        overflow = report.fallback is Fallback.BEHIND_RECORD and sent_tokens(output) > config.max_input_tokens
        report = replace(report, fallback_report=ran.report, overflow=overflow)
    asked = ask_over(config, state, output, measure)
    if asked is not None:
        return Needs((asked,))
    new_state = evolve(state, records=passed.state, fallback=fallback_state)
    return Done(history=output, state=new_state, report=report, memo=replace(memo, band=band))


def net_ceiling(config: RecordConfig, state: State) -> int | None:
    """Where the safety net takes the record's place (distilling at once, :func:`run_with_holds`); ``None`` while
    a route to a record is left (:func:`.recall.no_route`).

    First past the record trigger, where a record would have been asked for. Once it has
    distilled, the conversation is known to run long, and it keeps pace: each group is cut
    as soon as it stops being the newest (a ceiling of 0), when the break re-reads only the
    turn after it, instead of waiting for the prompt to pass the trigger again with more
    turns behind the group to re-read.
    """
    if not no_route(state.recall):
        return None
    return 0 if state.fallback.distilled else config.trigger_tokens


def fallback_for(config: RecordConfig, state: State) -> AnchoredConfig | None:
    """The fallback's rules as a pass runs them for ``state``.

    Once no record can be asked for (:func:`.recall.no_route`), its safety net stands in for
    the record, and like a record it leaves only the conversation's newest group whole: the
    tail keeps one group (none if the host keeps none), so the net's one break covers what a
    record would have covered. After that first cut, each group that stops being the newest
    is cut on the next pass, whatever the size (:func:`net_ceiling`: a small break near the
    prompt's end).
    """
    fallback = config.fallback
    if fallback is None or not no_route(state.recall):
        return fallback
    return net_rules(fallback)


def net_rules(fallback: AnchoredConfig) -> AnchoredConfig:
    """``fallback`` as the safety net runs it (:func:`fallback_for` with no route to a record): its tail keeps one
    group (none if the host keeps none), so its band is the widest the fallback runs with.

    The route may rest and come back (:func:`.recall.no_route`), so a state's positions may have been decided over
    this band while the fallback now keeps the configured tail: a check of a state's positions reads this band.
    """
    return replace(fallback, keep_tail_groups=min(fallback.keep_tail_groups, 1))


def run_with_holds(
    config: AnchoredConfig,
    state: AnchoredSnapshot,
    history: History,
    measure: Measure,
    *,
    releasable: frozenset[str] = frozenset(),
    distillable: frozenset[str | None] = frozenset(),
    distill_ceiling: int | None = None,
    memo: object = None,
    shorten: bool = True,
) -> anchored.AnchoredDone:
    """The anchored rules on ``history`` with every held message protected, except holds in ``releasable``.

    A hold is ours, not the host's preserve: the anchored rules see a held message as
    preserved, and the hold comes back on every message still included afterwards. Holds
    named in ``releasable`` do not protect, so the rules may shed those groups whole.
    Groups whose holds are in ``distillable`` are distilled over the budget before any
    shed (the safety net; see :func:`.anchored.run`), and all at once over ``distill_ceiling``.
    """
    keep = {r.origin: r.held for r in history if r.held is not None}
    ran = anchored.run(
        config,
        state,
        history,
        measure,
        memo=memo,
        releasable=releasable,
        distillable=distillable,
        distill_ceiling=distill_ceiling,
        shorten=shorten,
    )

    def restored(record: MessageRecord) -> MessageRecord:
        if record.excluded:  # an excluded message keeps no hold; one that protected stays protected
            protected = record.preserved or record.held not in releasable
            return record if record.held is None else flagged(record, held=None, preserved=protected)
        if record.origin not in keep or (record.held == keep[record.origin] and not record.preserved):
            return record
        return flagged(record, held=keep[record.origin], preserved=False)

    return replace(ran, history=pvector(map(restored, ran.history)))


def written(state: State) -> tuple[Answer, ...]:
    """The records the model wrote over the cached prefix (kept: they quote a value of what they were shown)."""
    return state.answered(RequestKind.RECORD)


# ----------------------------------------------------------------------------------------
# Records over the cached prefix
# ----------------------------------------------------------------------------------------


def fitting_prefix(prompt: History, budget: int) -> History | None:
    """The longest prefix of ``prompt`` that ends between two groups and sends at most ``budget`` tokens.

    A prefix of a prompt the provider cached is cached too, so a request over it plus an
    instruction is read from the cache; cutting between groups never separates a tool
    call from its result. ``None`` when not even the first group fits.
    """
    if sent_tokens(prompt) <= budget:
        return prompt
    seen = view(prompt)
    spans = sorted((seen.indices[g.members[0]], seen.indices[g.members[-1]]) for g in seen.grouping.all if g.members)
    # Prompt indices where a cut separates no group: no earlier group reaches past this one's start.
    reaches = accumulate((last for _, last in spans), max, initial=-1)
    cuts = [first for (first, _), reach in zip(spans, reaches, strict=False) if reach < first and first > 0]
    sizes = [0, *accumulate(0 if record.excluded else record.tokens for record in prompt)]
    return next((pvector(prompt[:cut]) for cut in reversed(cuts) if sizes[cut] <= budget), None)


def ask_over(config: RecordConfig, state: State, prompt: History, measure: Measure) -> Request | None:
    """The record due on this request, asked over ``prompt`` cut between groups to what the last request sent
    (:meth:`RecordConfig.prefix_tokens`), or ``None``.

    ``prompt`` is the prompt as it stands when the pass begins (the history handed in, with the
    records written before placed: the last request and what arrived since), so the request
    repeats what the provider cached; when that shows nothing unrecorded within what the last
    request sent, the pass decides first and asks over its output at its end."""
    if state.recall.asking is None:
        return None
    fitting = fitting_prefix(prompt, config.prefix_tokens(state.recall, instruction_tokens(measure)))
    return None if fitting is None else ask_aligned(fitting, state, prompt)


def instruction_tokens(measure: Measure, instruction: str | None = None) -> int:
    """The tokens a request over the cached prefix adds to the request it repeats: its one instruction message
    (a record's, :data:`RECORD_INSTRUCTION`, unless another ``instruction`` is given)."""
    return measure(RECORD_INSTRUCTION if instruction is None else instruction) + MESSAGE_OVERHEAD_TOKENS


def ask_aligned(view: History, state: State, conversation: History) -> Request | None:
    """The record to ask for over the cached prefix on this pass, or ``None``.

    Asked when the recall protocol says a record is due on this request
    (``recall.asking``) and the view shows a tool result no such record was asked over:
    the request is the view plus :data:`RECORD_INSTRUCTION`. Its identity is the
    instruction and the call ids of the results shown, so both lists and a restored or
    another replica's pass find the answer instead of asking again. The record will stand
    before ``conversation``'s newest group (:func:`record_place`).
    """
    if state.recall.asking is None:
        return None
    shown = _shown_results(view)
    if not shown or not _values_in(shown_result_texts(view)):
        return None  # no value a record could quote: its answer could not be kept, and would count as ignored
    key = identity("aligned_record", RECORD_INSTRUCTION, shown)
    if any(a.identity == key for a in written(state)):
        return None
    turns = sum(1 for r in view if r.role == "user" and r.in_conversation and not r.summary)
    return Request(
        key,
        RequestKind.RECORD,
        Route.CACHED_PREFIX,
        message_id=record_message_id(key),
        turns=turns,
        instruction=RECORD_INSTRUCTION,
        view=view,
        after=record_place(conversation),
    )


def with_summary(asked: Request, summary: Request) -> Request:
    """``asked`` asking, in the same request, for ``summary`` too (sent over the same view).

    Both would read the same cached prefix; one request reads it once. The instruction
    asks for the record, then a line :data:`SUMMARY_SECTION`, then the summary of the
    items ``summary`` names. The record's identity is unchanged, and the summary part
    answers ``summary`` under its own (:func:`split_answer`).
    """
    body = user_summaries.items_instruction(summary)
    instruction = f"{asked.instruction}\n\n{WITH_SUMMARY.format(section=SUMMARY_SECTION)} {body}"
    return replace(asked, instruction=instruction, also=replace(summary, view=asked.view))


def split_answer(request: Request, text: str | None) -> tuple[str | None, str | None]:
    """An answer to ``request``: (its record part, its summary part, ``None`` when absent or not asked)."""
    if request.also is None or text is None:
        return text, None
    lines = text.split("\n")
    marks = [i for i, line in enumerate(lines) if line.strip() == SUMMARY_SECTION]
    if not marks:
        return text, None
    record, summary = "\n".join(lines[: marks[0]]).strip(), "\n".join(lines[marks[0] + 1 :]).strip()
    return record or None, summary or None


def record_place(conversation: History) -> int:
    """How many of the conversation's own messages precede its newest group: where a record asked now stands.

    Right before the newest group (the user's message, or the newest tool call and its
    results), so every request still ends with what the conversation ends with (a
    request ending with an assistant message would read as a reply to continue), and what
    precedes the record is the part of the prompt the provider already cached. A newest
    group that is the model's turn opening with its reasoning (a tool call made while
    thinking) keeps its reasoning first: the record stands before the group before it, since
    a provider joins adjacent assistant messages into one turn, and Anthropic rejects a
    final assistant turn with thinking on that starts with anything but its thinking.
    """
    seen = view(conversation)
    groups = sorted((seen.indices[group.members[0]], group) for group in seen.grouping.all if group.members)
    if not groups:
        return originals(conversation)
    start, newest = groups[-1]
    if len(groups) > 1 and newest.has_reasoning and conversation[start].role == "assistant":
        start = groups[-2][0]
    return originals(conversation[:start])


def _original(record: MessageRecord) -> bool:
    """A message of the conversation itself: not injected context, not a note, summary or written record of ours."""
    return not (record.injected or record.note or record.inserted)


def originals(history: Iterable[MessageRecord]) -> int:
    """How many messages of the conversation itself ``history`` holds (see :func:`_original`)."""
    return sum(1 for record in history if _original(record))


def _shown_results(view: History) -> list[str]:
    """Call ids of the tool results ``view`` sends (recall results aside), in order."""
    recall_calls = find_recall_calls(conversation_records(view))
    return [
        part.call_id
        for record in view
        if not record.excluded and not record.injected and record.role == "tool"
        for part in record.parts
        if part.kind == "function_result" and part.call_id and part.call_id not in recall_calls
    ]


def shown_result_texts(view: History | None) -> list[str]:
    """The texts of the tool results a record request's ``view`` sends: what its record must be shorter than."""
    return [
        part.text
        for record in view or ()
        if not record.excluded and record.role == "tool"
        for part in record.parts
        if part.kind == "function_result"
    ]


def _values_in(results: Iterable[str]) -> set[str]:
    """The distinctive values of tool results' texts: what a record asked over them must quote one of."""
    return {value for text in results for value in distinctive_values(text)}


def kept_record(request: Request, text: str | None) -> Answer | None:
    """The record an answer to ``request`` becomes, or ``None``.

    Kept when it quotes at least one distinctive value of the tool results its request
    showed: a reply that ignored the instruction (small talk, a refusal, a call of another
    tool) is no record, and the coverage rule would find nothing it covers. And kept only
    when it is shorter than those results: a record as long as what it records saves
    nothing, and a runaway answer (an echo of the results, a reply that never ends) would
    hold the prompt for good.
    """
    body = (text or "").strip().removeprefix(RECORD_PREFIX).strip()
    results = shown_result_texts(request.view)
    if (
        not body
        or not _values_in(results) & word_set(body)
        or len(body) >= sum(len(result.strip()) for result in results)
    ):
        return None
    return Answer(
        identity=request.identity,
        kind=RequestKind.RECORD,
        text=body,
        message_id=request.message_id,
        after=request.after,
    )


def written_record(body: str, record_id: str, measure: Measure) -> MessageRecord:
    """The message a record compaction writes becomes (over the cached prefix, or a composition's merge or
    rewrite): our marker, then ``body``; held in the prompt."""
    text = f"{RECORD_PREFIX}\n{body.strip()}"
    return user_summaries.message("assistant", text, record_id, measure, written_record=True, held=HOLD_RECORD)


def place_written(history: History, written: Sequence[Answer], measure: Measure) -> History:
    """``history`` with each record of ``written`` right after the first ``after`` messages of the conversation.

    A record whose place this history does not reach (a list that never held those
    messages) is not placed; one already in the history (a list the shell applied an
    earlier pass to) is not placed twice.
    """
    if not written:
        return history
    present = {r.message_id for r in history if r.written_record}
    by_place: dict[int, list[Answer]] = {}
    for record in written:
        if record.message_id not in present:
            by_place.setdefault(record.after or 0, []).append(record)
    if not by_place:
        return history
    output: list[MessageRecord] = []
    count = 0
    for record in history:
        output.append(record)
        if _original(record):
            count += 1
            output.extend(written_record(w.text or "", w.message_id or "", measure) for w in by_place.pop(count, ()))
    return pvector(output)


def check(config: RecordConfig, state: State, history: History) -> str | None:
    """Why ``state`` cannot be this conversation's, or ``None``: ordinals must name its tool groups, and a
    record written over the cached prefix must stand within its messages."""
    records = conversation_records(history)
    own = originals(history)
    for number, answer in enumerate(state.answers):
        if answer.after is not None and answer.after > own:
            return (
                f"snapshot field 'answers[{number}].after' places a record after {answer.after} messages, "
                f"but this conversation has {own}"
            )
    groups = sum(1 for g in regroup(records).all if g.kind == "tool_call")
    ask = state.records.ask
    named = [("records.settled", o) for o in state.records.settled]
    named += [("records.ask.targets", o) for o in (ask.targets if ask is not None else ())]
    for name, ordinal in named:
        if ordinal >= groups:
            return f"snapshot field {name!r} names tool group {ordinal}, but this conversation has {groups}"
    if ask is not None and ask.responses_at_ask > (answered := responses(records)):
        return (
            f"snapshot field 'records.ask.responses_at_ask' is {ask.responses_at_ask}, but this conversation "
            f"has {answered} assistant responses (they only grow)"
        )
    # Positions decided while the route rested reach into the configured tail: judged by the net's band.
    fallback = config.fallback
    return None if fallback is None else anchored.check(net_rules(fallback), state.fallback, history)


def rules(
    config: RecordConfig,
    history: History | View,
    decisions: RecordDecisions,
    measure: Measure,
    *,
    memo: object = None,
    fallback_stands: bool = False,
    cut_thin: bool = True,
) -> Done[RecordDecisions, RecordReport]:
    """The record rules alone (see the module docstring).

    ``cut_thin=False`` holds a thinly quoted group whole and asks for it again instead of
    cutting it to its value lines (a composition under ``overflow_policy="raise"``, which
    cuts nothing it need not).

    ``fallback_stands`` says the in-pass fallback's sheds stand (its decisions shed or
    shortened something): the groups it was told to leave whole (the unrecorded hold)
    stay held, so a pass over a pass's output changes nothing.

    Notes are not conversation: they are neither grouped nor judged. Injected context is
    neither grouped nor judged either, but it counts toward every size rule, because
    the next request carries it. ``memo`` is the last answer's ``Done.memo``; it
    never changes the answer.
    """
    memo = memo if isinstance(memo, RecordMemo) else RecordMemo()
    seen = history if isinstance(history, View) else view(history, memo.view)
    records, recall_calls, grouping = seen.records, seen.recall_calls, seen.grouping
    tokens_before = seen.sent
    triggered = tokens_before > config.trigger_tokens
    found = [k for k, r in enumerate(records) if record_text(r, recall_calls)]
    if not found:  # every hold is released (holds are decided afresh on each pass, so both lists agree)
        fallback = Fallback.PLAIN if tokens_before >= config.fallback_tokens else Fallback.NONE
        report = RecordReport(tokens_before, tokens_before, triggered=triggered, fallback=fallback)
        return _done(seen, _with_holds(records, {}), decisions=decisions, report=report, memo=memo)

    text = "\n".join(record_text(records[k], recall_calls) for k in found)
    quoted = memo.quoted if memo.quoted is not None and memo.quoted[0] == text else (text, name_mentions(text))
    # The records that judge: the active ones, and those a composition's merge or rewrite replaced, where they
    # stood (a replacement stands where the first it replaced stood: without these, a group a later replaced
    # record judged would be judged again by the next record, at its old position).
    active = set(found)
    said = [
        (k, record_text(r, recall_calls) if k in active else _replaced_text(r, recall_calls))
        for k, r in enumerate(records)
    ]
    judging = [k for k, t in said if t]
    texts = tuple(t for _, t in said if t)
    judges = _judges(texts, memo.judges)
    values: dict[str, tuple[str, ...]] = {}
    candidates, gone = _candidates(config, records, grouping, found[-1], recall_calls, values=(memo.values, values))
    by_position = list(zip(judging, judges[1], judges[2], strict=True))
    covered, weak, uncovered = _coverage(config, candidates, quoted[1], gone, by_position)
    held_thin: list[_Candidate] = []
    if not cut_thin:  # held whole and asked for again (a large one releases the rows the records quote)
        held_thin, weak = [c for c, _ in weak], []
        uncovered = sorted([*uncovered, *held_thin], key=lambda c: c.ordinal)
    # Tool integrity: an uncovered group found partly excluded (a result that arrived
    # for a call a record covered, or another component's exclusion) goes whole.
    broken = [c for c in uncovered if any(records[i].excluded for i in c.group.members)]
    uncovered = [c for c in uncovered if c not in broken]
    # A group the records cover in part leaves only what they quote: the lines with a value
    # they do not quote stay, as its remnant (the group counts as covered: it is not asked for).
    cut = [(c, words) for c, words in covered if any(v not in words for v in c.values)]
    output = list(records)
    dropped = _exclude(output, [c for c, words in covered if all(v in words for v in c.values)])
    remnants = sum(_rewrite_results(output, c.group, partial(_remnant_of, words), measure)[0] for c, words in cut)
    # A group quoted too thinly: a large result first releases the table rows the judging records quote
    # verbatim, then every result keeps only its lines with a value (the marker names what left).
    # Repeated (ambiguous) table rows are read in the results as loaded (``records``), not in ``output``: a
    # remnant cut above has no original yet, and would hide rows a pass over this output reads again.
    rows, distilled = _cut_thin(
        config, output, weak, texts, judging, loaded=records, measure=measure, recall_calls=recall_calls
    )
    rows += _release_rows(config, output, held_thin, text, loaded=records, measure=measure, recall_calls=recall_calls)
    joined = _exclude(output, broken)
    # Every hold is decided afresh on each pass (so both lists agree on what stays): the
    # holds this pass gives, by index into ``records``; any other hold is released.
    holds = dict.fromkeys((i for c in uncovered for i in c.group.members), HOLD_UNCOVERED)
    # Every record is held with its group (the host's own preserve already protects a message).
    recorded = [g for g in grouping.all if any(i in active for i in g.members)]
    holds.update((i, HOLD_RECORD) for g in recorded for i in g.members if not output[i].preserved)
    # A group whose record would not pay is held like a settled one, and never asked for.
    gate = _gate(config.payoff_share, measure, seen)
    declined = [c for c in uncovered if gate is not None and not _pays(records, c.group, gate, c.values)]
    wanted = {c.ordinal for c in uncovered} - {c.ordinal for c in declined}
    decided, asked = _chain(decisions, wanted, records_written(records), responses(records))
    tokens_after = tokens_before + sent_tokens(output) - sent_tokens(records)
    over = tokens_after > config.max_input_tokens
    # Over the budget, the fallback behind the record runs; when its sheds stand, it replays them under these holds.
    held_unrecorded = _hold_unrecorded(output, grouping, recall_calls, holds) if over or fallback_stands else 0
    output = _with_holds(output, holds)
    report = RecordReport(
        tokens_before=tokens_before,
        tokens_after=tokens_after,
        triggered=triggered,
        records=len(found),
        covered=tuple(sorted(c.ordinal for c, _ in [*covered, *weak])),
        dropped=tuple(dropped),
        joined=tuple(joined),
        thin=tuple(c.ordinal for c, _ in weak),
        uncovered=tuple(c.ordinal for c in uncovered),
        settled=tuple(c.ordinal for c in uncovered if c.ordinal in decided.settled),
        declined=tuple(c.ordinal for c in declined),
        asked=asked,
        rows_released=rows,
        remnants=remnants,
        distilled=distilled,
        unreachable=_unreachable(config, uncovered, measure),
        held_unrecorded=held_unrecorded if over else 0,
        fallback=Fallback.BEHIND_RECORD if over else Fallback.NONE,
    )
    memo = RecordMemo(values=values, quoted=quoted, judges=judges)
    return _done(seen, output, decisions=decided, report=report, memo=memo)


def _with_holds(records: Sequence[MessageRecord], holds: Mapping[int, str]) -> list[MessageRecord]:
    """``records`` with exactly the holds in ``holds`` (by index); records whose hold is right stay as they are."""
    return [r if r.held == holds.get(k) else flagged(r, held=holds.get(k)) for k, r in enumerate(records)]


def _exclude(output: list[MessageRecord], candidates: Sequence[_Candidate]) -> list[int]:
    """Exclude every member of ``candidates`` in ``output``; origins of the newly excluded."""
    fresh = [i for c in candidates for i in c.group.members if not output[i].excluded]
    for index in fresh:
        output[index] = flagged(output[index], excluded=True, reason=EXCLUDE_REASON)
    return [r.origin for r in (output[i] for i in fresh) if r.origin is not None]


def _done(
    seen: View, records: Sequence[MessageRecord], *, decisions: RecordDecisions, report: RecordReport, memo: RecordMemo
) -> Done[RecordDecisions, RecordReport]:
    """The rules' answer: the decisions are its state; its memo carries the view of its history (the input's
    grouping: the rules change only flags and results' text)."""
    output = _placed(seen, records)
    changed = View(output, seen.indices, tuple(records), seen.grouping, seen.recall_calls, sent_tokens(output))
    return Done(history=output, state=decisions, report=report, memo=replace(memo, view=changed))


def _placed(seen: View, records: Sequence[MessageRecord]) -> History:
    """``seen``'s history with the messages of its view replaced by ``records`` (itself when none changed)."""
    if all(new is old for new, old in zip(records, seen.records, strict=True)):
        return seen.history
    output = list(seen.history)
    for index, record in zip(seen.indices, records, strict=True):
        output[index] = record
    return pvector(output)


def _candidates(
    config: RecordConfig,
    records: Sequence[MessageRecord],
    grouping: Grouping,
    anchor: int,
    recall_calls: RecallCalls,
    *,
    values: tuple[Mapping[str, tuple[str, ...]], dict[str, tuple[str, ...]]],
) -> tuple[list[_Candidate], list[tuple[str, ...]]]:
    """Tool groups after the head that end before the newest record, ours to judge; and the
    tool names of each such group already excluded (as one a pass covers is): they still count
    as judged groups calling those tools, so name coverage reads the same on a pass over a
    pass's output.

    ``values`` is (the last pass's distinctive values by result text, this pass's to
    fill): a group's values are those of its result texts in order, duplicates dropped,
    exactly as of the texts joined, so each text is read once per conversation.
    """
    known, seen = values
    found: list[_Candidate] = []
    gone: list[tuple[str, ...]] = []
    ordinal = position = -1
    for group in grouping.all:
        members = group.members
        # Our own inserts (user-turn summaries, written records) are not head groups: one
        # inserted in the head must not push a tool group out of it (the anchored rules
        # count positions alike), or a pass over its own output would judge that group.
        position += not all(records[i].inserted for i in members)
        if group.kind != "tool_call":
            continue
        ordinal += 1
        if position < config.keep_head_groups or members[-1] >= anchor:
            continue
        if any(records[i].preserved for i in members) or is_recall_group(records, group, recall_calls):
            continue  # another component's, or a recall group
        names = tuple(name for i in members for name in records[i].call_names)
        if all(records[i].excluded for i in members):  # already gone, judged all the same
            gone.append(names)
            continue
        texts = _judged_texts(records[i] for i in members)
        seen.update({t: known[t] if t in known else distinctive_values(t) for t in texts if t not in seen})
        group_values = seen[texts[0]] if len(texts) == 1 else tuple(dict.fromkeys(v for t in texts for v in seen[t]))
        found.append(_Candidate(ordinal, group, group_values, names))
    return found, gone


def _judged_texts(members: Iterable[MessageRecord]) -> list[str]:
    """The texts the results of ``members`` are judged by (:func:`_judged_text`), in order; empty ones left out."""
    return [_judged_text(p) for r in members for p in r.parts if p.kind == "function_result" and p.text]


def _judged_text(part: Part) -> str:
    """The text a result is judged by: a remnant's or a distilled result's original (so a pass over a pass's
    output judges alike, whichever rule cut it first)."""
    cut = is_remnant(part.text) or is_distilled(part.text)
    return part.original if part.original is not None and cut else part.text


def _remnant_of(quoted: frozenset[str], part: Part) -> tuple[str, int]:
    """A result's remnant under the words ``quoted`` of the records that judged it (:func:`.distill.remnant`)."""
    return remnant(_judged_text(part), quoted), 0


def _rewrite_results(
    output: list[MessageRecord],
    group: Group,
    cut: Callable[[Part], tuple[str, int]],
    measure: Measure,
    *,
    excluded_too: bool = False,
) -> tuple[int, int]:
    """Give each included (or, ``excluded_too``, every) plain-text result of ``group`` the text ``cut`` makes of it,
    in ``output``; (results changed, the sum of ``cut``'s counts for those)."""
    changed = counted = 0
    for index in group.members:
        record = output[index]
        if record.excluded and not excluded_too:
            continue
        parts = list(record.parts)
        for k, part in enumerate(parts):
            if part.kind != "function_result" or part.structured or not part.text:
                continue
            text, count = cut(part)
            if text != part.text:
                parts[k] = replace(part, text=text, tokens=measure(text) + part.media_tokens)
                changed, counted = changed + 1, counted + count
        tokens = record.tokens - sum(p.tokens for p in record.parts) + sum(p.tokens for p in parts)
        output[index] = replace(record, parts=tuple(parts), tokens=tokens)
    return changed, counted


def _cut_thin(
    config: RecordConfig,
    output: list[MessageRecord],
    weak: Sequence[tuple[_Candidate, int]],
    texts: Sequence[str],
    positions: Sequence[int],
    *,
    loaded: Sequence[MessageRecord],
    measure: Measure,
    recall_calls: RecallCalls,
) -> tuple[int, int]:
    """Cut the plain-text results of thinly quoted groups, in ``output``; (rows newly released, results newly cut).

    Each result is cut from its original text, against what stood when its judging record arrived (the records up
    to it, at ``positions``; the results loaded before it), so every later pass, on every list, gives the same
    bytes: a group larger than ``record_target_tokens`` first releases the table rows its judging records quote
    verbatim (:mod:`.tables`; a row repeated under the same headings in a result loaded before the judging record
    stays), then the result keeps its title and its lines with a value (:func:`.distill.distill`). The repeated
    rows are read in ``loaded`` (the pass's input), never in ``output``: a result this pass cut to its remnant has
    no original yet, so its quoted rows would be missing here and back on the next pass, which reads its original.
    """
    target = config.record_target_tokens
    rows = changed = 0
    for candidate, judge in weak:
        judging = "\n".join(texts[: judge + 1])
        quoted = frozenset(row_keys(judging)) if target is not None and "|" in judging else frozenset[RowKey]()
        results = [_judged_text(p) for p in _string_results(output, candidate.group) if p.text]
        large = bool(quoted) and target is not None and sum(map(measure, results)) > target
        ambiguous = _ambiguous_rows(loaded[: positions[judge]], recall_calls) if large else None
        cut = partial(_thinned, quoted, ambiguous)
        cut_now, released_now = _rewrite_results(output, candidate.group, cut, measure)
        changed, rows = changed + cut_now, rows + released_now
    return rows, changed


def _thinned(quoted: frozenset[RowKey], ambiguous: frozenset[RowKey] | None, part: Part) -> tuple[str, int]:
    """A thinly quoted result cut to its value lines (:func:`.distill.distill`), after releasing the ``quoted``
    table rows when ``ambiguous`` (the rows that must stay) is given; (its text, rows released)."""
    text, released = _judged_text(part), 0
    if ambiguous is not None:
        text, released = release_rows(text, quoted, ambiguous)
    return distill(text), released


def _coverage(
    config: RecordConfig,
    candidates: Sequence[_Candidate],
    mentions: Mapping[str, int],
    gone: Sequence[tuple[str, ...]],
    judges: Sequence[tuple[int, frozenset[str], frozenset[str]]],
) -> tuple[list[tuple[_Candidate, frozenset[str]]], list[tuple[_Candidate, int]], list[_Candidate]]:
    """Split candidates into covered (with the words that judged each), quoted too thinly (with the number of
    the record that judged each, counted from 0), and uncovered.

    ``mentions`` counts the tool names the records mention; ``gone`` holds the tool
    names of the judged groups already excluded; ``judges`` gives each record's index with
    its own words and the words of it and every record before it. A group with values is
    judged once, by the first record after it that itself quotes any of them, with the
    records up to that one (:func:`_judge`): a later record never changes what stays of it. A group without values
    is covered when each tool it called is named as often as candidate groups call it.
    """
    callers = Counter(name for names in [*(c.names for c in candidates), *gone] for name in set(names))
    covered: list[tuple[_Candidate, frozenset[str]]] = []
    weak: list[tuple[_Candidate, int]] = []
    uncovered: list[_Candidate] = []
    for candidate in candidates:
        names = set(candidate.names)
        judge = _judge(candidate, judges) if candidate.values else None
        if judge is not None:
            words = judges[judge][2]
            if sum(1 for v in candidate.values if v in words) >= share_of(len(candidate.values), config.coverage_share):
                covered.append((candidate, words))
            else:
                weak.append((candidate, judge))
        elif not candidate.values and names and all(mentions.get(n.lower(), 0) >= callers[n] for n in names):
            covered.append((candidate, frozenset()))
        else:
            uncovered.append(candidate)
    return covered, weak, uncovered


def _judge(candidate: _Candidate, judges: Sequence[tuple[int, frozenset[str], frozenset[str]]]) -> int | None:
    """Which record judges ``candidate`` (counted from 0): the first after it that itself quotes any of its
    values; ``None`` when no record after it does (a record before it that happens to hold a value does not)."""
    last = candidate.group.members[-1]
    quoting = (n for n, (at, own, _) in enumerate(judges) if at > last and any(v in own for v in candidate.values))
    return next(quoting, None)


def _judges(texts: tuple[str, ...], memo: _Judges | None) -> _Judges:
    """The records' ``texts`` with the words of each, and the words of each and every record before it (the
    memo's, when it read the same texts; a new record after them extends it)."""
    if memo is not None and memo[0] == texts:
        return memo
    if memo is None or texts[: len(memo[0])] != memo[0]:
        memo = ((), (), ())
    own, cumulative = list(memo[1]), list(memo[2])
    for text in texts[len(own) :]:
        words = word_set(text)
        own.append(words)
        cumulative.append(words | cumulative[-1] if cumulative else words)
    return texts, tuple(own), tuple(cumulative)


def _release_rows(
    config: RecordConfig,
    output: list[MessageRecord],
    uncovered: Sequence[_Candidate],
    record: str,
    *,
    loaded: Sequence[MessageRecord],
    measure: Measure,
    recall_calls: RecallCalls,
) -> int:
    """Release quoted table rows from large uncovered string results, in ``output`` (their excluded messages too).

    A row repeated under the same headings anywhere in the loaded tool results (records
    aside: they quote it) stays, because the record cannot say which result it is from.
    """
    target = config.record_target_tokens
    if target is None or "|" not in record:
        return 0
    large = [c for c in uncovered if sum(p.tokens - p.media_tokens for p in _string_results(output, c.group)) > target]
    quoted = frozenset(row_keys(record)) if large else frozenset[RowKey]()
    if not quoted:
        return 0
    ambiguous = _ambiguous_rows(loaded, recall_calls)

    def release(part: Part) -> tuple[str, int]:
        # A distilled result is the safety net's final form (every value already kept): releasing
        # rows from it later would change bytes a pass over its own output must keep.
        if "|" not in part.text or is_distilled(part.text):
            return part.text, 0
        return release_rows(part.text, quoted, ambiguous)

    return sum(_rewrite_results(output, c.group, release, measure, excluded_too=True)[1] for c in large)


def _ambiguous_rows(loaded: Iterable[MessageRecord], recall_calls: RecallCalls) -> frozenset[RowKey]:
    """Table rows repeated under the same headings in the ``loaded`` tool results (records aside)."""
    return repeated_rows(
        p.original or p.text
        for r in loaded
        for p in r.parts
        if p.kind == "function_result" and p.call_id not in recall_calls
    )


def _string_results(records: Sequence[MessageRecord], group: Group) -> Iterator[Part]:
    """The plain-text (not structured) tool results of ``group``."""
    return (p for i in group.members for p in records[i].parts if p.kind == "function_result" and not p.structured)


def responses(history: Iterable[MessageRecord]) -> int:
    """Model responses in the conversation: the one clock that asks and waits read; it only grows.

    Assistant messages count; reasoning-only ones do not (they belong to the response
    that follows), nor do the records compaction writes (a merge is not a response), our
    notes or injected context.
    """
    return sum(1 for r in history if _response(r))


def _response(record: MessageRecord) -> bool:
    """``record`` is a model response on the conversation's clock (see :func:`responses`)."""
    ours = record.written_record or record.note or record.injected  # a record compaction wrote, a note, context
    return record.role == "assistant" and not (record.is_reasoning_only or ours)


def written_by(history: Sequence[MessageRecord], clock: int) -> int:
    """:func:`records_written` in ``history`` before its ``clock``-th model response (:func:`responses`)."""
    answered = 0
    for index, r in enumerate(history):
        if _response(r):
            answered += 1
            if answered >= clock:
                return records_written(history[:index])
    return records_written(history)


def records_written(history: Iterable[MessageRecord]) -> int:
    """Records the model has written in the conversation, those a replacement now stands for included.

    The count asks and waits compare: it only grows, so a kept merge (which excludes the
    records it replaces and writes one of its own, never counted) is not read as fewer
    records, and a record that arrives after it is still a new one.
    """
    conversation = conversation_records(history)
    recall_calls = find_recall_calls(conversation)
    return sum(
        1
        for r in conversation
        if _recall_records(r, recall_calls)
        or (r.written_record and (r.message_id or "").startswith(ALIGNED_RECORD_ID_PREFIX))
    )


def _chain(
    decisions: RecordDecisions, uncovered: set[int], records: int, responses: int
) -> tuple[RecordDecisions, tuple[int, ...]]:
    """Resolve the outstanding ask and make the next one; returns (decisions, new ask targets).

    An ask whose record covered part of its batch continues for the rest of that batch
    only: groups that arrived meanwhile wait until the chain ends, so a chain retires at
    least one group per ask and cannot grow.
    """
    settled = set(decisions.settled)
    ask = decisions.ask
    if ask is not None:
        still = tuple(t for t in ask.targets if t in uncovered)
        if records > ask.records_at_ask and 0 < len(still) < len(ask.targets):  # the record covered part of them
            ask = Ask(targets=still, records_at_ask=records, responses_at_ask=responses)
            return RecordDecisions(settled=tuple(sorted(settled)), ask=ask), still
        if records > ask.records_at_ask or responses >= ask.responses_at_ask + ASK_RESPONSES:
            settled.update(still)  # a record came and covered none of them (or all), or the ask timed out
            ask = None
    asked = tuple(sorted(uncovered - settled)) if ask is None else ()
    if asked:
        ask = Ask(targets=asked, records_at_ask=records, responses_at_ask=responses)
    return RecordDecisions(settled=tuple(sorted(settled)), ask=ask), asked


def take_reforce(state: State) -> tuple[bool, State]:
    """Take the outstanding ask for one pinned request: True once per ask."""
    ask = state.records.ask
    if ask is None or ask.taken:
        return False, state
    return True, evolve(state, records=evolve(state.records, ask=evolve(ask, taken=True)))


def reforce_pending(decisions: RecordDecisions) -> bool:
    """An ask is outstanding and not yet taken (a preview; nothing is consumed)."""
    return decisions.ask is not None and not decisions.ask.taken


def on_recall(rule: recall.PinRule, state: State, event: recall.Event) -> tuple[State, recall.Action]:
    """The recall protocol's transition on the shared state (see :mod:`.recall`).

    An outstanding, untaken ask for uncovered groups comes first: the history seen on the
    way out of a call takes it for the next request, so one ask pins one request.
    """
    if isinstance(event, recall.HistorySeen) and not pins_given_up(state.recall) and reforce_pending(state.records):
        event = replace(event, reforce=True)
    recall_state, action = recall.advance(rule, state.recall, event)
    state = evolve(state, recall=recall_state)
    if isinstance(action, recall.TakeAsk):
        _, state = take_reforce(state)
    return state, action


def record_expected(state: State) -> bool:
    """Is a record expected: asked for, or about to be? (A composition waits on it.)

    Not the recall middleware's ``record_due`` preview (would the next request be pinned?):
    a record is still expected while the pinned request is in flight.

    True while an ask for uncovered groups is outstanding, while a pinned request is in
    flight (a pass inside it runs before its record exists), or when the recall protocol
    has decided to ask for one on the next request (pinned, or over the cached prefix, the
    route once pinning is disabled), or while this request asks over the cached prefix;
    never once both routes are disabled.
    """
    recall = state.recall
    if no_route(recall):
        return False  # neither route is left: nothing is worth waiting for
    return state.records.ask is not None or recall.next_pin is not None or recall.in_flight or recall.asking is not None


def _hold_unrecorded(
    output: Sequence[MessageRecord],
    grouping: Grouping,
    recall_calls: RecallCalls,
    holds: dict[int, str],
    *,
    shed_too: bool = False,
) -> int:
    """Hold (in ``holds``) every remaining tool group that is not held, preserved or a recall group.

    With ``shed_too``, an excluded group (a recall group included) is held as well: a group
    the shed policy shed, or a record a kept replacement stands for, was held on the pass
    that excluded it, so a later pass over that output treats it alike (see
    :func:`hold_unrecorded`).
    """
    held = 0
    for group in grouping.all:
        if group.kind != "tool_call" or any(output[i].preserved or holds.get(i) for i in group.members):
            continue
        excluded = all(output[i].excluded for i in group.members)
        if (excluded and shed_too) or (not excluded and not is_recall_group(output, group, recall_calls)):
            holds.update(dict.fromkeys(group.members, HOLD_UNRECORDED))
            held += 1
    return held


def hold_unrecorded(seen: View) -> History:
    """The view's history with every tool group that is not held, preserved, recorded or excluded held too.

    What a fallback behind a record does first, so it can shed only narration. Excluded
    tool groups are held too: a group the composition's shed policy shed was held while
    the fallback ran on the pass that shed it, so the fallback never shortened it; held
    again, a pass over that output leaves it as it is (else the fallback, which shortens
    excluded results, would rewrite its stored bytes, and the two lists would disagree).
    The same holds for records a kept replacement excluded (held as records on that pass).
    History does not say which rule excluded a group, so every excluded one is held.
    An excluded message is held the way :func:`run_with_holds` leaves it: protected
    (preserved) without the hold, which it would only drop again.
    """
    records = seen.records
    holds = {k: r.held for k, r in enumerate(records) if r.held is not None}
    if not _hold_unrecorded(records, seen.grouping, seen.recall_calls, holds, shed_too=True):
        return seen.history
    return _placed(seen, [_held(r, holds.get(k)) for k, r in enumerate(records)])


def _held(record: MessageRecord, hold: str | None) -> MessageRecord:
    """``record`` with ``hold``; an excluded message protected without it instead, which it would only drop."""
    if record.excluded and hold is not None:
        protected = record.held is None and record.preserved
        return record if protected else flagged(record, held=None, preserved=True)
    return record if record.held == hold else flagged(record, held=hold)


def release_unrecorded(seen: View) -> History:
    """The view's history with the unrecorded hold released (:data:`HOLD_UNRECORDED`).

    The record rules hold every unrecorded group when a record leaves the prompt over the
    budget, for the fallback behind it. In a composition a later sub-step (the user half's
    summary) can bring the prompt under the budget first; the fallback then does not run,
    and its holds are released, so a pass over that output (under the budget from the start,
    where the rules hold nothing) gives the same history.
    """
    return _placed(seen, [flagged(r, held=None) if r.held == HOLD_UNRECORDED else r for r in seen.records])


def _unreachable(config: RecordConfig, uncovered: Sequence[_Candidate], measure: Measure) -> int:
    """Held groups whose cheapest sufficient set of values alone exceeds the record target."""
    target = config.record_target_tokens
    if target is None:
        return 0
    return sum(
        1
        for c in uncovered
        if c.values and sum(sorted(map(measure, c.values))[: share_of(len(c.values), config.coverage_share)]) > target
    )
