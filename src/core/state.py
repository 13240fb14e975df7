"""One conversation's state: every decision history cannot show, as one value of frozen msgspec Structs.

A stack (the record strategy or the composition, with its recall middleware and gate) and
the user-turn strategy keep one :class:`State` per conversation; the anchored strategy
keeps one :class:`AnchoredSnapshot`. Each part is declared once, here, as a frozen
``msgspec.Struct`` whose annotations are its schema (:data:`~.envelope.Count`,
:data:`~.envelope.Text`...), and every answer a model or a hook gave, whatever it
answered, sits in one table (:attr:`State.answers`), keyed by the identity of its request.

A stored value carries one version number, at its top (:mod:`.envelope`); what the
types cannot say (distinct positions, watermarks, ids of the right form) each part checks
in its ``checked`` once read.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import ClassVar, Final, Literal, TypeAlias

import msgspec
from msgspec.structs import replace

from .checks import shown
from .envelope import Count, Pair, Positive, Stored, Text, distinct, error
from .errors import SnapshotError

PinKind: TypeAlias = Literal["size", "reforce"]


class RecordRoute(Enum):
    """How the conversation's next record is asked for; it only moves down the list.

    ``PINNED``: one request is forced to call the recall tool. ``CACHED_PREFIX``: the host
    asks over the conversation's cached prefix (the request it repeats plus one
    instruction). ``PINS_IGNORED``: pinning was given up (two pins ignored, or a pinned
    request failed) and records are asked over the cached prefix instead. ``NONE``: that
    route was given up too (two instructions ignored): no record can be asked for, and the
    safety net takes the record's place.
    """

    PINNED = "pinned"
    CACHED_PREFIX = "cached_prefix"
    PINS_IGNORED = "pins_ignored"
    NONE = "none"


class RequestKind(Enum):
    """What a request asks for, and so what its answer is."""

    RECORD = "record"
    """A record of the tool results a request over the cached prefix shows."""
    SUMMARY = "summary"
    FOLD = "fold"
    MEDIA = "media"
    """A description of a media part, from the host's hook."""
    MERGE = "merge"
    REWRITE = "rewrite"
    EMERGENCY_FOLD = "emergency_fold"


#: The kinds of answer the user half keeps ``remembered_requests`` of (the newest); every other kind is kept.
BOUNDED_KINDS: Final = frozenset({RequestKind.SUMMARY, RequestKind.FOLD})
#: The kinds the composition's chain asks for while over the budget (record replacements and emergency folds).
CHAIN_KINDS: Final = frozenset({RequestKind.MERGE, RequestKind.REWRITE, RequestKind.EMERGENCY_FOLD})
#: The message ids each kind allocates (a summary's id becomes a message id: it must be one we allocate).
_IDS: Final[dict[RequestKind, re.Pattern[str]]] = {
    RequestKind.RECORD: re.compile(r"compaction_record_[0-9a-f]{16}"),
    RequestKind.SUMMARY: re.compile(r"user_summary_(0|[1-9][0-9]*)"),
    RequestKind.FOLD: re.compile(r"user_summary_fold_(0|[1-9][0-9]*)"),
    RequestKind.MERGE: re.compile(r"record_replacement_(0|[1-9][0-9]*)"),
    RequestKind.REWRITE: re.compile(r"record_replacement_(0|[1-9][0-9]*)"),
    RequestKind.EMERGENCY_FOLD: re.compile(r"user_summary_emergency_fold_(0|[1-9][0-9]*)"),
}


class AnchoredSnapshot(Stored, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every decision of the anchored rules, as watermarks over band positions.

    Every decision is a watermark or a short list, so the value stays small however long the
    conversation grows, and the same value means the same sheds on the in-call copies, on the
    stored history and after a restore.

    Attributes:
        tools_shed: Band tool groups at positions below this are shed...
        texts_shed: ...and band assistant replies at positions below this.
        shortened: Band tool groups at positions below this are committed to being
            shortened (the minimum-gain floor accepted them; it never takes that back).
        spared_tools: Positions below ``tools_shed`` a shed passed over because they
            were preserved at the time; they are never shed later by replay.
        spared_texts: The same for assistant replies.
        shed_sizes: ``(position, members)`` of each shed tool group when it was shed.
            A group that grows since (a result arriving for a shed call, a tool message
            joining its run) is shed whole again, and the newcomers are reported.
        distilled: Positions of band tool groups whose results were cut to the lines
            that carry their distinctive values (:mod:`.distill`).
        keep_head_groups: The head size the positions were counted under (``None``
            before the first pass); positions mean nothing under another head.
    """

    KIND: ClassVar[str] = "anchored"

    tools_shed: Count = 0
    texts_shed: Count = 0
    shortened: Count = 0
    spared_tools: tuple[Count, ...] = ()
    spared_texts: tuple[Count, ...] = ()
    shed_sizes: tuple[Pair, ...] = ()
    distilled: tuple[Count, ...] = ()
    keep_head_groups: Count | None = None

    def checked(self, *, path: str = "", keep_head_groups: int | None = None) -> AnchoredSnapshot:
        """The value, refused when inconsistent; positions sorted (a position list is a set).

        A spared position lies below its lane's watermark; a size is recorded only for a
        tool group that was shed; a value holding any decision names the head it was
        counted under, and is refused under another ``keep_head_groups``.
        """
        at = f"{path}." if path else ""
        for name in ("spared_tools", "spared_texts", "distilled"):
            distinct(f"{at}{name}", getattr(self, name))
        distinct(f"{at}shed_sizes", [p for p, _ in self.shed_sizes])
        lists = ("spared_tools", "spared_texts", "distilled", "shed_sizes")
        value = replace(self, **{name: tuple(sorted(getattr(self, name))) for name in lists})
        for name, watermark in (("spared_tools", "tools_shed"), ("spared_texts", "texts_shed")):
            limit = getattr(value, watermark)
            beyond = next((p for p in getattr(value, name) if p >= limit), None)
            if beyond is not None:
                raise error(f"{at}{name}", f"position {beyond} is not below {watermark}={limit}")
        for position, _ in value.shed_sizes:
            if position >= value.tools_shed:
                raise error(f"{at}shed_sizes", f"position {position} is not below tools_shed={value.tools_shed}")
            if position in value.spared_tools:
                raise error(f"{at}shed_sizes", f"position {position} is spared, so it was never shed")
        if value.keep_head_groups is None and value.decided:
            raise error(
                f"{at}keep_head_groups",
                "null, but the snapshot holds decisions; their positions mean nothing without the head they were "
                "counted under",
            )
        refused = None if keep_head_groups is None else value.config_error(keep_head_groups=keep_head_groups)
        if refused is not None:
            raise refused
        return value

    @property
    def decided(self) -> bool:
        """The anchored rules have shed or committed something that must replay (their sheds stand)."""
        return bool(self.tools_shed or self.texts_shed or self.shortened or self.distilled)

    def config_error(self, *, keep_head_groups: int) -> SnapshotError | None:
        """Why this value cannot be restored into anchored rules with ``keep_head_groups``, or ``None``.

        Band positions count from the first group after the head, so under another head every
        watermark and spared position would name other groups. The tail, the budget and the
        shares only change how much a position keeps, not which group it is.
        """
        made = self.keep_head_groups
        if made is None or made == keep_head_groups:
            return None
        return SnapshotError(
            f"snapshot field 'keep_head_groups': the snapshot was made with keep_head_groups={made}, this "
            f"strategy has keep_head_groups={keep_head_groups}; positions would name other groups"
        )


class Ask(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An outstanding request for a record of an uncovered batch.

    Attributes:
        targets: Ordinals of the tool groups the ask is for: the batch that was
            uncovered when it was made. Groups that arrive later wait for the next ask.
        records_at_ask: Records the model had written when the ask was made
            (:func:`~.records.records_written`: replaced ones count); a higher count
            later means the asked-for record arrived.
        responses_at_ask: Model responses when the ask was made (:func:`~.records.responses`);
            two more without a new record mean the ask failed.
        taken: The recall middleware has taken the ask (``take_reforce``): each ask pins
            one request at most.
    """

    targets: tuple[Count, ...]
    records_at_ask: Count
    responses_at_ask: Count
    taken: bool = False


class RecordDecisions(Stored, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The record rules' decisions that history cannot show.

    Coverage itself is recomputed from the history and its records on every pass; what is
    remembered is which uncovered tool groups were *settled* (asked for twice without
    success, held until a later record quotes them) and the one outstanding *ask*. Groups
    are named by their ordinal among all the conversation's tool groups, the same on every
    copy of the conversation and after a restore.

    Attributes:
        settled: Ordinals of uncovered groups held for good.
        ask: The outstanding ask, if any.
    """

    KIND: ClassVar[str] = "records"

    settled: tuple[Count, ...] = ()
    ask: Ask | None = None

    def checked(self, *, path: str = "", keep_head_groups: int | None = None) -> RecordDecisions:
        """The value, refused when inconsistent: settled groups are a set; an ask names at least one group and
        none that is settled; positions sorted."""
        del keep_head_groups  # a group's ordinal counts all tool groups: no parameter moves it
        at = f"{path}." if path else ""
        distinct(f"{at}settled", self.settled)
        ask = self.ask
        if ask is not None:
            distinct(f"{at}ask.targets", ask.targets)
            if not ask.targets:
                raise error(f"{at}ask.targets", "must name at least one group")
            overlap = sorted(set(ask.targets) & set(self.settled))
            if overlap:
                raise error(
                    f"{at}ask.targets", f"position {overlap[0]} is also settled (a settled group is never asked for)"
                )
            ask = replace(ask, targets=tuple(sorted(ask.targets)))
        return RecordDecisions(settled=tuple(sorted(self.settled)), ask=ask)


class RecallStatus(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the recall protocol knows of the last request sent.

    Attributes:
        included_tokens: Tokens of the messages it sent (not excluded).
        records: Active records in it.
        pending_groups: Tool groups (other than recall groups) after the newest record,
            or in the whole conversation without one; excluded groups do not count.
        pending_tokens: Tokens those groups send (their included messages), but for groups
            the newest record quotes a value of: it was shown them (with thinking on, a record
            stands before the groups of its turn).
    """

    included_tokens: Count
    records: Count
    pending_groups: Count
    pending_tokens: Count = 0


class RecallState(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything the recall protocol remembers about one conversation.

    Attributes:
        next_pin: The record decided for the next request (``"reforce"`` when it serves an
            outstanding ask for uncovered groups), or ``None``.
        in_flight: A pinned request is being sent (compaction passes inside it run before
            the record it asks for exists).
        awaiting_record: The last completed call was forced; its record is not judged yet.
        ignored_streak: Consecutive pinned responses without a recall call.
        route: How records are asked for (:class:`RecordRoute`).
        seen: The last request sent, as the middleware saw it on the way out (its size is
            what a request over the cached prefix repeats).
        armed: The recall gate's one-shot permission to record (the middleware arms it for a
            pinned request; the recall tool spends it).
        asking: A record is due on this request and is asked for over the cached prefix
            (the compaction pass inside the request asks), with why.
        ignored_instructions: Consecutive answers over the cached prefix to record requests
            that did not follow the instruction (no value of what they were shown).
        summaries_to_summarizer: A summary asked over the cached prefix was ignored: the next
            summary goes to the summarizer (every later one too, once ``ignored_summaries`` reaches
            :data:`~.recall.IGNORED_LIMIT`).
        ignored_summaries: Consecutive answers over the cached prefix to summary requests that
            were no summary of their items (:func:`~.user_summaries.follows`).
        failed_requests: Consecutive requests over the cached prefix (records and summaries)
            that failed (an error, a time-out, a cancellation); any answer resets it.
        resting: Model calls left before requests over the cached prefix are tried again:
            set when ``failed_requests`` reaches :data:`~.recall.FAILURE_LIMIT` (and doubled on
            each failure past it), counted down by each request the middleware sees.
    """

    next_pin: PinKind | None = None
    in_flight: bool = False
    awaiting_record: bool = False
    ignored_streak: Count = 0
    route: RecordRoute = RecordRoute.PINNED
    seen: RecallStatus | None = None
    armed: bool = False
    asking: PinKind | None = None
    ignored_instructions: Count = 0
    summaries_to_summarizer: bool = False
    ignored_summaries: Count = 0
    failed_requests: Count = 0
    resting: Count = 0


class ChainDecisions(Stored, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The composition's own decisions that history cannot show (its replacements are answers: see :class:`State`).

    Attributes:
        wait_since: The conversation clock when the user half began waiting for an expected
            record, or ``None``.
        declined_behind: The record count a wait ended behind: no new wait behind it.
        shed: The shed policy's decisions (watermarks over band tool groups).
    """

    KIND: ClassVar[str] = "chain"

    wait_since: Count | None = None
    declined_behind: Count | None = None
    shed: AnchoredSnapshot = AnchoredSnapshot()

    def checked(self, *, path: str = "", keep_head_groups: int | None = None) -> ChainDecisions:
        """The value, its shed policy's watermarks checked."""
        at = f"{path}." if path else ""
        return replace(self, shed=self.shed.checked(path=f"{at}shed", keep_head_groups=keep_head_groups))


def record_message_id(identity: str) -> str:
    """The message id of the record that answers the request ``identity`` over the cached prefix (one per request,
    so a restored or another replica's pass recognises the record it already placed)."""
    return f"compaction_record_{identity[:16]}"


class Answer(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What came back for one request: the one shape every answer is remembered in.

    Attributes:
        identity: The request's identity (a digest of everything that determines its answer).
        kind: What the request asked for.
        text: The answer; ``None`` when the call failed or returned nothing usable (for a
            record asked over the cached prefix: no record, the model did not follow).
        message_id: The id the answer's message carries once kept (allocated with the
            request); ``None`` for a media description.
        sources: How many items the request held (a summary's turns, a replacement's records).
        turns: For a failure, the user turns the conversation had when it failed: the
            failure stands for that conversation state only, and a later state asks again.
        after: For a record written over the cached prefix, how many messages of the
            conversation precede it (:func:`~.records.record_place`).
    """

    identity: Text
    kind: RequestKind
    text: Text | None = None
    message_id: Text | None = None
    sources: Positive | None = None
    turns: Count | None = None
    after: Count | None = None

    def stands(self, turns: int) -> bool:
        """The answer applies to a conversation with ``turns`` user turns (a failure only to its own state)."""
        return self.text is not None or self.turns is None or self.turns >= turns


class State(Stored, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One conversation's state: a record strategy's, a composition's or a user-turn strategy's.

    Attributes:
        records: The record rules' decisions.
        fallback: The record strategy's in-pass anchored fallback (its safety net's cuts too).
        recall: The recall protocol's state, shared with the recall middleware and gate.
        chain: The composition's wait and shed policy.
        answers: Every remembered answer, oldest first, one per request identity: records
            written over the cached prefix, user summaries and folds (the newest
            ``remembered_requests`` of them), media descriptions, record replacements and
            emergency folds.
        compactions: User summaries accepted so far (they allocate ``user_summary_<n>`` ids).
        folds: Folds accepted so far (``user_summary_fold_<n>``).
    """

    KIND: ClassVar[str] = "state"

    records: RecordDecisions = RecordDecisions()
    fallback: AnchoredSnapshot = AnchoredSnapshot()
    recall: RecallState = RecallState()
    chain: ChainDecisions = ChainDecisions()
    answers: tuple[Answer, ...] = ()
    compactions: Count = 0
    folds: Count = 0

    def checked(self, *, path: str = "", keep_head_groups: int | None = None) -> State:
        """The value, each part checked; answers refused unless they are what :func:`~.effects.absorb` writes.

        One answer per identity; an answer with text carries no failure date; a message id of
        the form its kind allocates, none for a description; a place only for a record; a
        fold of two summaries at least.
        """
        at = f"{path}." if path else ""
        distinct(f"{at}answers", [a.identity for a in self.answers], what="identity")
        for index, a in enumerate(self.answers):
            here = f"{at}answers[{index}]"
            if a.text is not None and a.turns is not None:
                raise error(f"{here}.turns", f"an answer with text carries no turns, got {a.turns}")
            form = _IDS.get(a.kind)
            fits = a.message_id is None if form is None else bool(a.message_id and form.fullmatch(a.message_id))
            if a.kind is RequestKind.RECORD:  # its id is its request's: another would place the record twice
                fits = a.message_id == record_message_id(a.identity)
            if not fits:
                wanted = "null" if form is None else f"an id of the form {form.pattern}"
                if a.kind is RequestKind.RECORD:
                    wanted = f"{record_message_id(a.identity)!r} (the id its request allocates)"
                raise error(
                    f"{here}.message_id", f"must be {wanted} for a {a.kind.value} answer, got {shown(a.message_id)}"
                )
            if (a.after is not None) != (a.kind is RequestKind.RECORD):
                raise error(
                    f"{here}.after", f"a {a.kind.value} answer {'needs' if a.after is None else 'has no'} place"
                )
            if a.kind is RequestKind.EMERGENCY_FOLD and (a.sources or 0) < 2:
                raise error(f"{here}.sources", f"must be an integer in [2, {2**31 - 1}], got {a.sources}")
        return replace(
            self,
            records=self.records.checked(path=f"{at}records"),
            fallback=self.fallback.checked(path=f"{at}fallback", keep_head_groups=keep_head_groups),
            chain=self.chain.checked(path=f"{at}chain", keep_head_groups=keep_head_groups),
        )

    def answered(self, kind: RequestKind) -> tuple[Answer, ...]:
        """The remembered answers of ``kind``, oldest first."""
        return tuple(a for a in self.answers if a.kind is kind)
