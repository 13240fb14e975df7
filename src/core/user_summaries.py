"""The user-turn strategy: earlier user turns replaced by a summary the model writes.

Records cannot touch user turns, and past a few times the window the user's own text
outgrows it. Requirements, constraints and corrections live there, so a summary must
keep them, cost a model call as rarely as possible, and give identical bytes on both
lists and after a restore. The rules, all pure:

- Nothing happens at or below ``trigger_fraction`` of the budget (the prompt's size is
  :func:`~.protocol.sent_tokens`: what the next request carries, injected context too),
  except that a remembered summary the other list made is applied (:func:`step`).
- The **anchors** are the first ``keep_head_user_turns`` and the last
  ``keep_tail_user_turns`` user turns (summaries count as turns). The **band** is what
  lies between: in ``recompact`` mode, or before any summary stands, every user turn
  between the anchors (a standing summary included, so it is re-read); in ``boundary``
  and ``fold`` modes, the turns after the newest standing summary.
- Turns the host preserved, turns with parts of unknown kinds, and turns with media
  (unless the host gave ``describe_media`` and every description came back usable)
  are protected: they stay verbatim and leave the band.
- The band must be worth a model call: its tokens at least ``min_band_share`` of the
  prompt (injected context aside, so both lists decide alike), checked on the whole
  eligible band.
- Each request is bounded by ``max_summary_input_tokens`` (instructions plus numbered
  transcript, and the two messages' overhead): the oldest whole items that fit are
  sent, none is truncated, nothing is sent when not even the oldest fits. Newer items
  wait for later passes. One request never spans a turn that stays verbatim, so each
  summary replaces one unbroken run of turns and stands where that run began.
- Requests and answers are effects (:mod:`.effects`): the pass answers
  :class:`Needs` until the state holds every answer it needs, so the same request is
  never sent twice for the same conversation state.
- An answer is judged by the summary coverage rule (:mod:`.summary_check`): it carries the
  items' distinctive values, their requirement, constraint and correction lines, and
  something of what they say. One that misses any of it is asked once more, the request
  naming what it left out; what the second answer still leaves out is copied after it
  from the turns, verbatim (:func:`with_verbatim`), and an answer that says nothing of
  its items keeps them verbatim (:attr:`Outcome.INCOMPLETE`).
- A summary is accepted only if it is smaller than what it replaces; a failure or a
  refusal changes nothing. An accepted summary is a user message starting with
  :data:`USER_SUMMARY_MARKER`, inserted where the first replaced turn stood.
- ``fold`` mode: when the band is not worth a call, two or more standing summaries
  are folded into one if the tokens folding would save (all but the largest of the
  selected summaries) reach ``min_band_share`` of the prompt from the oldest summary on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import partial
from typing import Final, Literal, TypeAlias, get_args

from pyrsistent import pvector

from .checks import AtLeastOne, AtLeastZero, Floor, Fraction, NonEmpty, share_of, validate
from .counting import MESSAGE_OVERHEAD_TOKENS
from .effects import CALLED_INSTEAD, COMPACTION_REQUEST, Request, Route, identity, standing, trimmed
from .fingerprint import FINGERPRINT
from .model import MEDIA_KINDS, History, MessageRecord, Part, conversation_indices, flagged
from .protocol import Done, Needs, sent_tokens
from .state import RequestKind, State
from .summary_check import Omission, omissions, owed, reask_prompt
from .values import distinctive_values, word_set

Measure = Callable[[str], int]
SummaryMode: TypeAlias = Literal["recompact", "boundary", "fold"]
DEFAULT_SUMMARY_MODE: Final[SummaryMode] = "recompact"

USER_SUMMARY_MARKER: Final = "[earlier turns in this conversation, compacted]"
SUMMARY_ID_PREFIX: Final = "user_summary_"
FOLD_ID_PREFIX: Final = "user_summary_fold_"
SUMMARY_MODES: Final[tuple[SummaryMode, ...]] = get_args(SummaryMode)
#: Wraps a media description in a transcript: the summarizer must not take it for the user's words.
MEDIA_DESCRIPTION_PREFIX: Final = "[inferred description of attached media, not the user's words: "
MEDIA_DESCRIPTION_SUFFIX: Final = "]"

DEFAULT_PROMPT: Final = (
    "You compact the earlier turns of a conversation between a user and an assistant. The numbered items below are "
    "what the user wrote, in order (an item may itself be an earlier summary of user turns, or carry an inferred "
    "description of attached media, marked as such). Write one account, much shorter than the items, in the third "
    "person and in order, of what the user asked for. Keep every requirement, constraint, correction and "
    "preference exactly as stated; where a later item corrects an earlier one, keep the correction and say what it "
    "replaces. Quote verbatim every value that cannot be reconstructed: identifiers, codes, names, numbers, paths, "
    "URLs, versions, dates. Drop pleasantries, restatements and superseded details. Add nothing that is not in the "
    "items. Reply with the account only."
)
DEFAULT_FOLD_PROMPT: Final = (
    "The numbered items below are earlier summaries of a user's turns in one conversation. Each stands for turns "
    "that are no longer in the conversation: they are not padding, and nothing in them can be recovered elsewhere. "
    "Write one account that replaces all of them, in order, in the third person. Keep every requirement, "
    "constraint, correction and preference, and quote every identifier, code, name, number, path, URL, version and "
    "date verbatim. Drop only what a later item supersedes, and say what replaced it. Reply with the account only."
)

DEFAULT_KEEP_HEAD_USER_TURNS: Final = 1
DEFAULT_KEEP_TAIL_USER_TURNS: Final = 1
DEFAULT_TRIGGER_FRACTION: Final = 0.8
DEFAULT_MIN_BAND_SHARE: Final = 0.1
DEFAULT_REMEMBERED_REQUESTS: Final = 1

#: Why a summarised user turn is excluded, and why a folded summary is.
EXCLUDE_REASON: Final = "user_turn_summarized"
FOLD_EXCLUDE_REASON: Final = "user_summaries_folded"


@dataclass(frozen=True, slots=True)
class UserSummaryConfig:
    """Parameters of the user-turn strategy; invalid values raise ``ValueError``.

    Attributes:
        max_input_tokens: The input budget.
        keep_head_user_turns: User turns at the start that are never summarised.
        keep_tail_user_turns: User turns at the end that are never summarised.
        trigger_fraction: Nothing happens at or below this share of the budget.
        min_band_share: A band (or a fold's saving) must be at least this share of the prompt.
        summary_mode: ``"recompact"``, ``"boundary"`` or ``"fold"``.
        prompt: The summarizer's instructions for user turns.
        fold_prompt: The instructions for folding summaries.
        remembered_requests: Summary answers the state keeps.
        max_summary_input_tokens: Bound on every request (instructions plus transcript);
            ``None`` means half the budget, at least 1.
        describe_media: The host gave a ``describe_media`` hook, so media turns can be
            summarised once every description came back usable.
        min_gain_fraction: The break-even share a composition sets: while the prompt
            fits the budget, a summary whose turns are fewer tokens than this share of
            everything behind the first of them is not asked for (its prefix break would
            cost more than it saves); 0 never declines.
        keep_short_turns: Set by a composition: the user turns no larger than their summary is
            expected to be that open the band, right after the head and before the first summary,
            stay verbatim instead of being summarised (:func:`_verbatim_run`). Not fingerprinted (a rule,
            not a configuration): a session stored before it restores, and a summary still to be
            asked then leaves those turns out.
    """

    max_input_tokens: AtLeastOne
    keep_head_user_turns: AtLeastZero = DEFAULT_KEEP_HEAD_USER_TURNS
    keep_tail_user_turns: AtLeastZero = DEFAULT_KEEP_TAIL_USER_TURNS
    trigger_fraction: Fraction = DEFAULT_TRIGGER_FRACTION
    min_band_share: Floor = DEFAULT_MIN_BAND_SHARE
    summary_mode: SummaryMode = DEFAULT_SUMMARY_MODE
    prompt: NonEmpty = DEFAULT_PROMPT
    fold_prompt: NonEmpty = DEFAULT_FOLD_PROMPT
    remembered_requests: AtLeastOne = DEFAULT_REMEMBERED_REQUESTS
    max_summary_input_tokens: AtLeastOne | None = None
    describe_media: bool = False
    min_gain_fraction: Floor = 0.0
    # A rule of the composition's, not a configuration: not in the fingerprint, so an upgrade restores stored sessions.
    keep_short_turns: bool = field(default=False, metadata={FINGERPRINT: False})

    def __post_init__(self) -> None:
        validate(self)

    @property
    def trigger_tokens(self) -> int:
        """Prompt size above which the strategy acts."""
        return int(self.max_input_tokens * self.trigger_fraction)

    @property
    def summary_input_limit(self) -> int:
        """The bound on every summarizer request."""
        return self.max_summary_input_tokens or max(1, self.max_input_tokens // 2)  # never 0: AtLeastOne


class Outcome(Enum):
    """What a pass did; the outcomes partition every pass over a non-empty conversation."""

    BELOW_TRIGGER = "below_trigger"
    DECLINED = "declined"
    """The band was empty, only summaries, or too small to be worth a call (and no fold was due)."""
    NOTHING_FITS = "nothing_fits"
    """Not even the oldest item fits ``max_summary_input_tokens`` (two, for a fold)."""
    SUMMARIZED = "summarized"
    FOLDED = "folded"
    REFUSED = "refused"
    """The answer was not smaller than what it would replace."""
    INCOMPLETE = "incomplete"
    """The answer, and the one more request naming what it left out, said nothing of what it would replace, or
    missed values or lines whose verbatim copies beside it make it no smaller than the turns: its turns stay."""
    FAILED = "failed"
    """The summarizer failed or answered nothing."""


#: The outcomes that put a summary (or a fold) on the list.
APPLIED: Final = frozenset({Outcome.SUMMARIZED, Outcome.FOLDED})


@dataclass(frozen=True, slots=True)
class UserReport:
    """What a pass did.

    Attributes:
        tokens_before: Prompt tokens before the pass (:func:`~.protocol.sent_tokens`).
        tokens_after: Prompt tokens after it.
        outcome: See :class:`Outcome`.
        summary_id: The summary (or fold) applied, refused or failed on this pass.
        replaced: Origins of the messages the summary replaced.
        request: Identity of the request the outcome answered, if any.
        band_tokens: Tokens of the eligible band.
        protected: Band turns left verbatim (preserved, unknown parts, undescribed media).
        standing: Our summaries standing after the pass, and their tokens.
        summary_tokens: Tokens of the standing summaries.
        missing: What the last answer left out: on :attr:`Outcome.INCOMPLETE`, why its turns stay; on an applied
            summary, what it carries verbatim after the answer (:func:`with_verbatim`).
        kept: On :attr:`Outcome.INCOMPLETE`, the messages that stay verbatim for it (their ids, or where they stand).
        reasked: The answer kept or judged is the one more request's (the first one left something out).
    """

    tokens_before: int
    tokens_after: int
    outcome: Outcome
    summary_id: str | None = None
    replaced: tuple[int, ...] = ()
    request: str | None = None
    band_tokens: int = 0
    protected: int = 0
    standing: int = 0
    summary_tokens: int = 0
    missing: Omission | None = None
    kept: tuple[str, ...] = ()
    reasked: bool = False


UserDone = Done[State, UserReport]


@dataclass(frozen=True, slots=True)
class Item:
    """What a summary, a fold or a record replacement may stand for, as the summarizer will read it.

    Attributes:
        index: Where it stands: into the conversation's records (the user half's band) or
            the history (the composition's chain).
        text: Its body: a user turn's words, a summary without its marker, a record's values.
        tokens: Its size as a message (a record's as a written record).
        members: The history indices that leave the prompt with it (the chain's: a record's
            whole group, a summary alone).
        run: Runs are split by turns that stay verbatim; a request never spans two.
    """

    index: int
    text: str
    tokens: int
    members: tuple[int, ...] = ()
    run: int = 0


@dataclass(frozen=True, slots=True)
class _Pass:
    """What one pass reads, computed once (local to :func:`step`)."""

    config: UserSummaryConfig
    history: History
    state: State
    measure: Measure
    conversation: tuple[int, ...]  # history indices of the conversation (injected context and notes aside)
    records: tuple[MessageRecord, ...]  # the conversation's records
    tokens: int  # what is sent (protocol.sent_tokens)
    standing: tuple[int, ...]  # conversation indices of our included summaries
    user_turns: int  # the user's own turns, excluded ones too: grows with the conversation
    gates: bool = True  # the size trigger and the break-even gate apply
    band_tokens: int = 0  # of the band the pass asks about (its report's)
    protected: int = 0  # band turns left verbatim (its report's)

    def done(
        self,
        outcome: Outcome,
        *,
        request: str | None = None,
        summary_id: str | None = None,
        missing: Omission | None = None,
        kept: tuple[str, ...] = (),
        reasked: bool = False,
    ) -> UserDone:
        """The history unchanged, with a report of why."""
        report = UserReport(
            missing=missing,
            kept=kept,
            reasked=reasked,
            tokens_before=self.tokens,
            tokens_after=self.tokens,
            outcome=outcome,
            summary_id=summary_id,
            request=request,
            band_tokens=self.band_tokens,
            protected=self.protected,
            standing=len(self.standing),
            summary_tokens=sum(self.records[k].tokens for k in self.standing),
        )
        return Done(history=self.history, state=self.kept(), report=report)

    def kept(self) -> State:
        """The state with only the ``remembered_requests`` newest summary answers."""
        return trimmed(self.state, self.config.remembered_requests)


def step(
    config: UserSummaryConfig, state: State, history: History, measure: Measure, *, memo: object = None
) -> Needs | UserDone:
    """One pass over ``history`` (see the module docstring for the rules); ``memo`` is unused.

    Below the trigger, a remembered summary this list does not show yet is still applied:
    injected context may put only the other list over the trigger, and both must agree. An
    exclusion whose summary the list lost is undone first (:func:`relinked`).
    """
    del memo
    history = relinked(history)
    answer = pass_(config, state, history, measure)
    if isinstance(answer, Done) and answer.report.outcome is Outcome.BELOW_TRIGGER:
        return replayed(config, state, history, measure) or answer
    return answer


def replayed(config: UserSummaryConfig, state: State, history: History, measure: Measure) -> UserDone | None:
    """A remembered summary ``history`` does not show yet, applied whatever the gates; else ``None``.

    The other list (or a restored copy) made it: applying it asks nothing new, and both
    lists must show the same bytes.
    """
    present = {r.message_id for r in history if r.summary}
    if not any(
        a.text is not None and a.kind in (RequestKind.SUMMARY, RequestKind.FOLD) and a.message_id not in present
        for a in state.answers
    ):
        return None
    free = pass_(config, state, history, measure, gates=False)
    return free if isinstance(free, Done) and free.report.outcome in APPLIED else None


def pass_(
    config: UserSummaryConfig, state: State, history: History, measure: Measure, *, gates: bool = True
) -> Needs | UserDone:
    """:func:`step`'s answer, unwrapped: a composition calls it directly.

    Without ``gates``, the size trigger and the break-even gate do not apply: any
    non-empty prompt may be summarised (a composition riding on a break it pays anyway).
    """
    conversation = conversation_indices(history)
    records = tuple(history[i] for i in conversation)
    standing = tuple(k for k, r in enumerate(records) if r.summary and not r.excluded and r.role == "user")
    tokens, turns = sent_tokens(history), user_turns(records)
    p = _Pass(config, history, state, measure, conversation, records, tokens, standing, turns, gates)
    if p.tokens <= (config.trigger_tokens if gates else 0):
        return p.done(Outcome.BELOW_TRIGGER)
    items: list[Item] = []
    waiting: list[tuple[Item, tuple[Request, ...]]] = []  # media turns without descriptions yet
    eligible_tokens = protected = run = 0
    for k in _band(p):
        item = _item(p, k)
        if item is None:
            protected += 1
            run += 1
            continue
        eligible_tokens += records[k].tokens
        if isinstance(item, Item):
            items.append(replace(item, run=run))
        else:
            waiting.append((Item(k, "", records[k].tokens, run=run), tuple(item)))
            run += 1  # until it is described, the turn ends the run a request may cover
    verbatim = _verbatim_run(p, items, waiting)
    eligible_tokens -= sum(i.tokens for i in items[:verbatim])  # short turns that stay where they stand
    items = items[verbatim:]
    # Worth a call: user turns to summarise (not only our summaries), and enough of them.
    has_turns = bool(waiting) or any(not records[i.index].summary for i in items)
    # Of the conversation's own tokens: context injected into one list only must not tip
    # the decision, or the two lists would disagree.
    own = sent_tokens(r for r in history if not r.injected)
    worth = has_turns and eligible_tokens >= share_of(own, config.min_band_share)
    pending = _reachable_descriptions(p, items, waiting) if waiting else ()
    if pending and worth:
        # Descriptions first: the transcript (and so the request) depends on them.
        return Needs(pending)
    selected = [] if pending or not has_turns else select(config.prompt, items, config.summary_input_limit, measure)
    # A request must hold a user turn: our own summaries alone under the user-turn prompt
    # would be a fold in disguise, refused for not being smaller on every later pass.
    # Leading summaries that leave no room for a turn stay standing; the turns after them
    # are summarised instead, so a long history still progresses within the bound.
    while selected and all(records[i.index].summary for i in selected):
        items = items[1:]
        selected = select(config.prompt, items, config.summary_input_limit, measure)
    band = replace(p, band_tokens=eligible_tokens, protected=protected)
    if selected:
        summary_id = next_id(SUMMARY_ID_PREFIX, state.compactions, records)
        # A band too small to be worth a call still shows a summary already made of it (on the
        # other list, or on an earlier pass of this one, when the prompt was smaller): both lists
        # and every later pass show the same bytes.
        asked = _ask(band, RequestKind.SUMMARY, selected, summary_id, new=worth)
        if worth or (isinstance(asked, Done) and asked.report.outcome in APPLIED):
            return asked
    elif worth:
        return band.done(Outcome.NOTHING_FITS)
    return _fold(p) if config.summary_mode == "fold" and len(p.standing) >= 2 else band.done(Outcome.DECLINED)


def _short(p: _Pass, item: Item) -> bool:
    """A user turn no larger than its summary is expected to be: what it owes the summary check and
    :data:`SUMMARY_PROSE_TOKENS` of prose (a standing summary never is)."""
    record = p.records[item.index]
    return not record.summary and item.tokens <= _summary_size([item.text], 1, p.measure)


def _verbatim_run(p: _Pass, items: Sequence[Item], waiting: Sequence[tuple[Item, tuple[Request, ...]]]) -> int:
    """How many of ``items`` (from the first) are short turns that open the conversation's band and stay
    verbatim where they stand, when :attr:`UserSummaryConfig.keep_short_turns` is set (0 otherwise).

    A summary of a turn no larger than its summary would be (:func:`_short`) costs output and saves
    nothing. Only the run of such turns right after the head, before the conversation's first summary
    and before a longer turn, stays: the first summary stands after them, so the model still reads every
    turn in the order it was said, the run never grows once a summary stands, and no short turn ever
    stands between two summaries (a fold of them would move what the later one says before it). Every
    other short turn goes with its neighbours, and a band of short turns only is summarised whole
    (together they are what can make room).
    """
    if not p.config.keep_short_turns:
        return 0
    before = min(p.standing, default=None)  # indices into the conversation's records, as items' are
    first_waiting = min((w.index for w, _ in waiting), default=None)
    start = 0
    while (
        start < len(items)
        and (before is None or items[start].index < before)
        and (first_waiting is None or items[start].index < first_waiting)
        and _short(p, items[start])
    ):
        start += 1
    return start if start < len(items) else 0  # every turn short: summarised together they make room


def user_turns(history: Iterable[MessageRecord]) -> int:
    """The user's own turns in the conversation, excluded ones too (not our summaries, notes or injected context).

    It only grows, so it dates a failure: a failed request stands until it grows.
    """
    return sum(1 for r in history if r.role == "user" and r.in_conversation and not r.summary)


def _reachable_descriptions(
    p: _Pass, items: Sequence[Item], waiting: Sequence[tuple[Item, tuple[Request, ...]]]
) -> tuple[Request, ...]:
    """Descriptions of the media turns this pass's request could reach, oldest first.

    A usable description is never larger than the media it stands for, so a turn's own
    token count bounds its place in the transcript: only turns of the first run whose
    counts, added up from the band's start, fit the request bound are described now.
    The host is not asked about media a request could not carry yet.
    """
    entries = sorted([(i.index, i, ()) for i in items] + [(w.index, w, d) for w, d in waiting], key=lambda e: e[0])
    first = entries[0][1].run
    budget = p.config.summary_input_limit - p.measure(p.config.prompt) - 2 * MESSAGE_OVERHEAD_TOKENS
    used = 0
    found: list[Request] = []
    for _, entry, requests in entries:
        used += entry.tokens
        if entry.run != first or used > budget:
            break
        found.extend(requests)
    return tuple(found)


def _band(p: _Pass) -> list[int]:
    """Indices of the band's user turns (and, in recompact mode, standing summaries), oldest first."""
    config = p.config
    turns = [k for k, r in enumerate(p.records) if r.role == "user" and not r.excluded]
    end = len(turns) - config.keep_tail_user_turns
    between = turns[config.keep_head_user_turns : max(end, config.keep_head_user_turns)]
    if config.summary_mode == "recompact" or not p.standing:
        return between
    return [k for k in between if k > p.standing[-1]]


def _item(p: _Pass, index: int) -> Item | list[Request] | None:
    """The band item the record at ``index`` makes, the descriptions it still needs, or ``None`` if protected."""
    record, turns = p.records[index], p.user_turns
    if record.summary:
        return Item(index, summary_body(record), record.tokens)
    if record.preserved:
        return None
    pieces: list[str] = []
    needed: list[Request] = []
    for number, part in enumerate(record.parts):
        if part.kind == "text":
            pieces.append(part.text)
        elif part.kind in MEDIA_KINDS and p.config.describe_media:
            key = media_identity(record, number)
            answer = standing(p.state.answers, key, turns)  # a failure of an earlier state is asked again
            if answer is None:
                if record.origin is None:
                    return None  # nothing to hand the host
                needed.append(
                    Request(key, RequestKind.MEDIA, Route.HOOK, turns=turns, origin=record.origin, part=number)
                )
                continue
            text = (answer.text or "").strip()
            if not text or p.measure(text) > max(part.tokens, 1):
                return None  # failed, empty or larger than the media it stands for
            pieces.append(f"{MEDIA_DESCRIPTION_PREFIX}{text}{MEDIA_DESCRIPTION_SUFFIX}")
        else:
            return None  # media without a hook, or a kind we cannot put into words
    if needed:
        return needed
    text = "\n".join(p for p in pieces if p)
    return Item(index, text, record.tokens) if text.strip() else None


def media_identity(record: MessageRecord, part: int) -> str:
    """The identity of a media part's description: message id, ordered content, surrounding text."""
    content = [(p.kind, p.ref if p.kind in MEDIA_KINDS else p.text) for p in record.parts]
    return identity("describe_media", record.message_id, part, content)


def summary_body(record: MessageRecord) -> str:
    """A summary message's text without the marker (what a fold's transcript carries)."""
    text = "\n".join(p.text for p in record.parts if p.kind == "text")
    return text[len(USER_SUMMARY_MARKER) :].lstrip("\n") if text.startswith(USER_SUMMARY_MARKER) else text


def numbered(items: Sequence[Item]) -> str:
    """The request's transcript: the items' texts, numbered from 1."""
    return "\n".join(f"{number}. {item.text}" for number, item in enumerate(items, start=1))


def select(prompt: str, items: Sequence[Item], limit: int, measure: Measure, *, minimum: int = 1) -> list[Item]:
    """The oldest whole items whose request (instructions plus transcript) fits ``limit``.

    Items are added while the sum of their standalone counts fits and they belong to the
    first item's run (a summary stands where its first turn stood, so it must not reach
    past a turn that stays verbatim); the whole request, with the two messages' overhead,
    is then counted exactly and the newest item dropped until it fits, so no request
    ever exceeds the bound and no item is cut.
    """
    framing = 2 * MESSAGE_OVERHEAD_TOKENS
    budget = limit - measure(prompt) - framing
    chosen: list[Item] = []
    used = 0
    for number, item in enumerate(items, start=1):
        cost = measure(f"{number}. {item.text}")
        if used + cost > budget or item.run != items[0].run:
            break
        chosen.append(item)
        used += cost
    while len(chosen) >= minimum and measure(prompt) + measure(numbered(chosen)) + framing > limit:
        chosen.pop()
    return chosen if len(chosen) >= minimum else []


#: How the chain's requests are named in their identities (a merge and a rewrite are both record replacements).
_LABELS: Final = {
    RequestKind.MERGE: "record_replacement",
    RequestKind.REWRITE: "record_replacement",
    RequestKind.EMERGENCY_FOLD: "emergency_fold",
}


def request(kind: RequestKind, prompt: str, items: Sequence[Item], message_id: str, turns: int) -> Request:
    """The summarizer request of ``kind`` for ``items``, keyed by what it replaces (its kind, prompt, transcript and
    count; a replacement's in the order its identities were always made, so answers stored before stay found)."""
    transcript = numbered(items)
    label = _LABELS.get(kind)
    key = (kind.value, prompt, transcript, len(items)) if label is None else (label, prompt, len(items), transcript)
    return Request(
        identity(*key),
        kind,
        prompt=prompt,
        transcript=transcript,
        sources=len(items),
        message_id=message_id,
        turns=turns,
        openings=tuple(opening(item.text) for item in items),
        items=tuple(item.text for item in items),
    )


#: How much of an item's first line a request over the cached prefix quotes to name it.
OPENING_CHARACTERS: Final = 80


def opening(text: str) -> str:
    """The words that name an item in a request over the cached prefix: its first non-blank line, cut short."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= OPENING_CHARACTERS else line[:OPENING_CHARACTERS].rstrip()


#: What a summary asked over the cached prefix says first, after the request marker.
PREFIX_SUMMARY_LEAD: Final = "Do not continue the task."
#: What a summary asked over the cached prefix says after the summarizer's prompt.
PREFIX_ITEMS_HEADING: Final = (
    "The numbered items are these earlier messages of this conversation, named by their opening words:"
)


#: The prose a summary is expected to write about each item beside what it must carry (a sentence or two).
SUMMARY_PROSE_TOKENS: Final = 60


def expected_summary_tokens(request: Request, measure: Measure) -> int:
    """The size a summary answering ``request`` is expected to have: the least the summary check asks it to
    carry (:func:`.summary_check.owed`) and :data:`SUMMARY_PROSE_TOKENS` per item."""
    return _summary_size(request.items, len(request.openings), measure)


def _summary_size(texts: Sequence[str], count: int, measure: Measure) -> int:
    """What a summary of ``count`` items with ``texts`` owes the summary check, and its prose."""
    return measure(owed(texts)) + SUMMARY_PROSE_TOKENS * max(1, count)


def follows(request: Request, answer: str) -> bool:
    """Whether ``answer`` to ``request`` (asked over the cached prefix) is a summary of its items at all.

    A model that ignored the instruction answers about something else: when the items
    carry distinctive values it quotes none of them. Items without values cannot be
    told apart from a reply about something else, so any text is taken for them (it is
    linked from the summary like any other, and what it replaces stays in stored history).
    """
    if answer.lstrip().startswith(CALLED_INSTEAD):
        return False  # the model called a tool instead
    values = distinctive_values(request.transcript)
    return bool(set(values) & word_set(answer)) if values else bool(answer.strip())


def over_prefix(request: Request, view: History) -> Request | None:
    """``request`` sent over ``view`` (the cached prefix) plus one instruction, or ``None`` when ``view``
    lacks an item (every item must be an included message of ``view`` the instruction can name)."""
    texts = [
        "\n".join(p.text for p in r.parts) for r in view if r.role == "user" and r.in_conversation and not r.excluded
    ]
    if not request.openings or not all(any(o in text for text in texts) for o in request.openings):
        return None
    instruction = f"{COMPACTION_REQUEST} {PREFIX_SUMMARY_LEAD} {items_instruction(request)}"
    return replace(request, route=Route.CACHED_PREFIX, instruction=instruction, view=view)


def items_instruction(request: Request) -> str:
    """What a summary asked over the cached prefix is told: its prompt, then its items named by their opening
    words (the instruction :func:`over_prefix` sends after the request marker; a record asked with it carries
    the same, :func:`.records.with_summary`)."""
    named = "\n".join(f"{number}. \u00ab{o}\u00bb" for number, o in enumerate(request.openings, 1))
    return f"{request.prompt}\n\n{PREFIX_ITEMS_HEADING}\n{named}"


def next_id(prefix: str, count: int, records: Iterable[MessageRecord]) -> str:
    """``<prefix><n>``: past ``count`` (the ids of its kind answered) and every ``<prefix><digits>`` id in use,
    so ids never collide (another kind's ids, ``user_summary_fold_<n>`` under ``user_summary_``, are not numbers)."""
    used = [r.message_id[len(prefix) :] for r in records if r.message_id and r.message_id.startswith(prefix)]
    return f"{prefix}{max([count, *(int(suffix) + 1 for suffix in used if suffix.isdecimal())])}"


def summary_text(answer: str) -> str:
    """The text of a summary message: the marker, then the summarizer's answer."""
    return f"{USER_SUMMARY_MARKER}\n{answer.strip()}"


def summary_record(answer: str, summary_id: str, measure: Measure) -> MessageRecord:
    """The user message a summarizer's ``answer`` becomes (a summary, a fold, an emergency fold)."""
    return message("user", summary_text(answer), summary_id, measure, summary=True)


def message(role: str, text: str, message_id: str, measure: Measure, **flags: object) -> MessageRecord:
    """A one-text message compaction inserts (a summary, a written record), counted with its overhead."""
    tokens = measure(text)
    made = MessageRecord(
        role, (Part(kind="text", text=text, tokens=tokens),), MESSAGE_OVERHEAD_TOKENS + tokens, message_id
    )
    return flagged(made, **flags)


def _ask(
    p: _Pass, kind: RequestKind, selected: Sequence[Item], summary_id: str, *, new: bool = True
) -> Needs | UserDone:
    """The request for ``selected``: asked for (unless not ``new``), or answered from the state and applied."""
    folding = kind is RequestKind.FOLD
    prompt = p.config.fold_prompt if folding else p.config.prompt
    if _below_break_even(p, selected):
        return p.done(Outcome.DECLINED)
    asked = request(kind, prompt, selected, summary_id, p.user_turns)
    sources = [item.text for item in selected]
    # The one more request's answer, when there is one, is the one judged: the first one left something out.
    second = standing(p.state.answers, reask_identity(asked), asked.turns)
    answer = second or standing(p.state.answers, asked.identity, asked.turns)
    if answer is None:
        return Needs((asked,)) if new else p.done(Outcome.DECLINED)
    summary_id = answer.message_id or summary_id
    again = second is not None
    done = partial(p.done, request=answer.identity, summary_id=summary_id, reasked=again)
    if not answer.text or not answer.text.strip():
        return done(Outcome.FAILED)
    text = answer.text
    missing = omissions(sources, text)
    if missing and not again:
        # One more request names what the answer left out.
        return Needs((reasked(asked, missing, summary_id),)) if new else p.done(Outcome.DECLINED)
    replaced_tokens = sum(p.records[i.index].tokens for i in selected)
    repaired = with_verbatim(text, missing) if missing and not missing.substance else None
    if missing and (repaired is None or summary_record(repaired, summary_id, p.measure).tokens >= replaced_tokens):
        # Not even the turns' own lines beside it make a summary smaller than the turns: they stay verbatim.
        kept = tuple(p.records[i.index].message_id or f"<user turn at {p.conversation[i.index]}>" for i in selected)
        return done(Outcome.INCOMPLETE, missing=missing, kept=kept)
    summary = summary_record(repaired or text, summary_id, p.measure)
    if summary.tokens >= replaced_tokens:
        return done(Outcome.REFUSED)
    reason = FOLD_EXCLUDE_REASON if folding else EXCLUDE_REASON
    output = apply(p.history, [p.conversation[i.index] for i in selected], reason, summary)
    summaries = [r for r in output if r.summary and not r.excluded and not r.injected]
    report = replace(
        done(Outcome.FOLDED if folding else Outcome.SUMMARIZED).report,
        replaced=tuple(o for i in selected if (o := p.records[i.index].origin) is not None),
        tokens_after=p.tokens - replaced_tokens + summary.tokens,
        standing=len(summaries),
        summary_tokens=sum(r.tokens for r in summaries),
        reasked=again,
        missing=missing or None,
    )
    return Done(history=output, state=p.kept(), report=report)


#: What a summary says before the lines of its turns it carries verbatim because the answer left them out.
VERBATIM_HEADING: Final = "Kept verbatim from the turns (the summary left them out):"


def with_verbatim(answer: str, missing: Omission) -> str:
    """``answer`` with what it left out after it, copied from the turns: the lines verbatim, then the values no such
    line quotes. Nothing the rule asks for is lost, whatever the model wrote."""
    lines = list(missing.lines)
    quoted = word_set("\n".join(lines))
    values = [v for v in missing.values if v not in quoted]
    extra = [*lines, *([f"Values: {', '.join(values)}"] if values else [])]
    return "\n".join([answer.strip(), VERBATIM_HEADING, *extra])


def reask_identity(asked: Request) -> str:
    """The identity of the one more request for ``asked``: one per request, whatever its first answer missed (that
    answer is fixed for the request), so a pass finds the second answer even after the first one is trimmed."""
    return identity("reask", asked.identity)


def reasked(asked: Request, missing: Omission, summary_id: str) -> Request:
    """``asked`` once more, its prompt naming what the first answer left out (:func:`.summary_check.reask_prompt`)."""
    return replace(
        asked, identity=reask_identity(asked), prompt=reask_prompt(asked.prompt, missing), message_id=summary_id
    )


def apply(history: History, members: Iterable[int], reason: str, message: MessageRecord) -> History:
    """Exclude the messages at ``members`` (linked to ``message``, with ``reason``); insert ``message`` at the first.

    One rule for every replacement: a user summary, a fold, a record merge or rewrite.
    """
    indices = sorted(set(members))
    rebuilt = list(history)
    replaced_ids: list[str] = []
    for index in indices:
        record = rebuilt[index]
        if not record.excluded:
            rebuilt[index] = flagged(record, excluded=True, reason=reason, replaced_by=message.message_id)
            if record.message_id:
                replaced_ids.append(record.message_id)
    rebuilt.insert(indices[0], replace(message, replaces=tuple(replaced_ids)))
    return pvector(rebuilt)


def relinked(history: History) -> History:
    """``history`` with every exclusion whose replacement it does not hold undone (the one rule :func:`apply` needs
    read back).

    A message a replacement took in (a summary, a fold, a record merge or rewrite: :func:`apply`) names it in
    ``replaced_by``, and stays excluded only while that replacement is in the history. A host whose list keeps
    the flags on its messages but not the messages a pass inserted (a chat client's per-call compaction over a
    session's stored history, the harness wiring) hands the pass an exclusion whose replacement is gone: read
    as written, those messages would leave the prompt with nothing standing for them. Read as included, the pass
    decides them again, and a kept answer in the state puts the same replacement back (the same bytes, nothing
    asked).
    """
    linked = {r.replaced_by for r in history if r.excluded and r.replaced_by is not None}
    if not linked:  # the usual pass: nothing excluded by a replacement, no set of the others to build
        return history
    present = {r.message_id for r in history if r.message_id in linked and (r.summary or r.written_record)}
    if linked <= present:
        return history
    return pvector(
        flagged(r, excluded=False, reason=None, replaced_by=None)
        if r.excluded and r.replaced_by is not None and r.replaced_by not in present
        else r
        for r in history
    )


def _below_break_even(p: _Pass, selected: Sequence[Item]) -> bool:
    """While the prompt fits, would the summary save less than ``min_gain_fraction`` of what lies behind it?

    Its turns' tokens bound what it can save; everything from the first of them on is
    re-billed by the break. Over the budget the gate is off: room matters more.
    """
    gain = p.config.min_gain_fraction if p.gates else 0.0
    if gain <= 0 or p.tokens > p.config.max_input_tokens:
        return False
    start = p.conversation[selected[0].index]
    behind = sum(r.tokens for r in p.history[start:] if not r.excluded)
    return sum(i.tokens for i in selected) < share_of(behind, gain)


def _fold(p: _Pass) -> Needs | UserDone:
    """Fold the oldest standing summaries that fit, if the saving pays for the break it causes."""
    config, records = p.config, p.records
    items = [Item(k, summary_body(records[k]), records[k].tokens) for k in p.standing]
    selected = select(config.fold_prompt, items, config.summary_input_limit, p.measure, minimum=2)
    if not selected:
        return p.done(Outcome.NOTHING_FITS)
    sizes = [i.tokens for i in selected]
    saving = sum(sizes) - max(sizes)
    start = p.conversation[selected[0].index]
    behind = sum(r.tokens for r in p.history[start:] if not r.excluded and not r.injected)
    if saving < share_of(behind, config.min_band_share):
        return p.done(Outcome.DECLINED)
    fold_id = next_id(FOLD_ID_PREFIX, p.state.folds, records)
    return _ask(replace(p, band_tokens=sum(sizes)), RequestKind.FOLD, selected, fold_id)


def check(config: UserSummaryConfig, state: State, history: History) -> str | None:
    """Why ``state`` cannot be this conversation's, or ``None``.

    Answers are found by request identity only, so any of them may belong to this
    conversation; but a kept answer's id becomes a message id, so it must not be the id
    of a message in the history that is not that answer's (a forged or foreign state
    would otherwise give two messages one id, and links would name the wrong one).
    """
    del config
    ours = {r.message_id for r in history if r.message_id and (r.summary or r.written_record)}
    others = {r.message_id for r in history if r.message_id} - ours
    for number, answer in enumerate(state.answers):
        if answer.text is not None and answer.message_id in others:
            return (
                f"snapshot field 'answers[{number}].message_id' is {answer.message_id!r}, the id of another "
                "message in this conversation"
            )
    return None
