"""Effect requests: what the core needs from the outside world, as values.

The core never calls a model. When a pass needs a summary or a media description it
answers with requests; the shell performs them, records each answer (or failure) into
the snapshot with :func:`~maf_compaction.core.user_summaries.absorb`, and steps again.
Each request has an *identity*, a digest of everything that determines its answer, so
the same request on the other list (the in-call copies or the stored history), after a
session restore or on another replica finds its answer in the snapshot instead of
being sent twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol, TypeAlias, TypeVar

from .envelope import Count, Positive, Text
from .model import History, history


def identity(kind: str, *fields: object) -> str:
    """A stable digest of a request's kind and fields (JSON-encoded, so unambiguous)."""
    payload = json.dumps([kind, *fields], ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


#: What a :class:`Summarize` asks for (see :attr:`Summarize.kind`).
SummaryKind: TypeAlias = Literal["summary", "fold", "merge", "rewrite", "emergency_fold"]


@dataclass(frozen=True, slots=True)
class Summarize:
    """Ask the summarizer for one summary.

    The shell sends ``[system(prompt), user(transcript)]`` and answers with the text.

    Attributes:
        identity: The request's identity (see the module docstring).
        prompt: The summarizer's instructions.
        transcript: The numbered items to summarise.
        sources: How many items the transcript holds.
        summary_id: The id the summary will carry if accepted (allocated with the
            request, so both lists use the same one).
        kind: ``"summary"`` for user turns, ``"fold"`` for earlier summaries, ``"merge"``
            and ``"rewrite"`` for the composition's record replacements, ``"emergency_fold"``
            for the composition's fold of user summaries over the budget.
        turns: User turns in the conversation when the request was made: a failed
            answer is replayed (not retried) until the conversation has more.
        openings: The opening words of each item, in order: a request over the cached
            prefix names the items by them instead of repeating them.
        instruction: Set with ``view``: the one message a request over the cached prefix
            appends (the prompt, then the items by their opening words).
        view: When set, the request goes over the cached prefix (see :class:`Aligned`):
            these messages, then ``instruction``; otherwise to the summarizer as
            ``[system(prompt), user(transcript)]``. Neither is part of the identity: the
            answer is the same summary either way.
    """

    identity: str
    prompt: str
    transcript: str
    sources: int
    summary_id: str
    kind: SummaryKind = "summary"
    turns: int = 0
    openings: tuple[str, ...] = field(default=(), compare=False)
    instruction: str = field(default="", compare=False)
    view: History | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class DescribeMedia:
    """Ask the host's ``describe_media`` hook for a description of one media part.

    Attributes:
        identity: Message id, ordered content and surrounding text, digested.
        origin: Index of the user turn in the list the shell converted.
        part: Index of the media part within that turn.
        turns: User turns in the conversation when the request was made (see
            :attr:`Summarize.turns`).
    """

    identity: str
    origin: int
    part: int
    turns: int = 0


#: How every instruction a request over the cached prefix appends begins.
COMPACTION_REQUEST: Final = "[compaction request]"
#: How the shell reports an answer over the cached prefix that called a tool instead (``[a call of NAME]``):
#: no record and no summary, whatever it is asked about.
CALLED_INSTEAD: Final = "[a call of "


@dataclass(frozen=True, slots=True)
class Aligned:
    """Ask the conversation's own model for one text over its cached prefix.

    The shell sends the request the conversation sends now (``view``: this pass's
    history under the decisions that stand, which repeats the last request byte for byte
    and adds what arrived since) with the head of the last request (instructions, tools,
    ``tool_choice``, options) unchanged, and appends ``instruction`` as one user message
    at the end. Nothing before the instruction differs from what the provider cached, so
    the request's input is read from the cache. The request itself never enters history;
    the answer does, as what ``kind`` says.

    Attributes:
        identity: The request's identity (see the module docstring): the instruction and
            the tool results the view shows.
        instruction: The one message appended at the end.
        record_id: The id the answer will carry if kept (allocated with the request).
        after: How many messages of the conversation (injected context and compaction's
            own aside) precede the record: a kept record stands right after them, on every
            later pass (at the end of the conversation as it was when asked).
        kind: What the answer becomes: ``"record"``, a written record of the tool results.
        turns: User turns in the conversation when the request was made (see
            :attr:`Summarize.turns`).
        view: The history to send (not part of the request's identity).
        also: A summary asked in the same request (over the same view; ``instruction`` then
            asks for both, the summary after a section line): the answer is split, and each
            part is the answer to its own request (not part of the record's identity).
    """

    identity: str
    instruction: str
    record_id: str
    after: int
    kind: Literal["record"] = "record"
    turns: int = 0
    view: History = field(default_factory=history, compare=False, repr=False)
    also: Summarize | None = field(default=None, compare=False, repr=False)


Request: TypeAlias = Summarize | DescribeMedia | Aligned


class _Keyed(Protocol):
    @property
    def identity(self) -> str: ...


A = TypeVar("A", bound=_Keyed)


@dataclass(frozen=True, slots=True)
class Answer:
    """What came back for a request.

    Attributes:
        identity: The request's identity.
        text: The summary or description; ``None`` when the call failed or returned
            nothing usable.
        summary_id: For summaries, the id allocated with the request.
        sources: For summaries, how many items the transcript held (a legacy answer
            without it matches any count).
        turns: For a failure, the user turns the conversation had when it failed: the
            failure stands for that conversation state only, and a later state (a new
            user turn) asks again, so one transient error does not stop compaction.
    """

    identity: Text
    text: Text | None
    summary_id: Text | None = None
    sources: Positive | None = None
    turns: Count | None = None

    def stands(self, turns: int) -> bool:
        """The answer applies to a conversation with ``turns`` user turns."""
        return self.text is not None or self.turns is None or self.turns >= turns


def answered(request: Request, text: str | None) -> Answer:
    """The answer to ``request``: blank text is a failure, dated by the request's turns."""
    clean = text.strip() if isinstance(text, str) and text.strip() else None
    turns = None if clean is not None else request.turns  # a failure stands for this conversation state
    if isinstance(request, DescribeMedia):
        return Answer(request.identity, clean, turns=turns)
    if isinstance(request, Aligned):
        return Answer(request.identity, clean, summary_id=request.record_id, turns=turns)
    return Answer(request.identity, clean, summary_id=request.summary_id, sources=request.sources, turns=turns)


def find(table: Sequence[A], identity: str) -> A | None:
    """The answer in ``table`` to the request ``identity``, if any (the newest: see :func:`remember`)."""
    return next((answer for answer in reversed(table) if answer.identity == identity), None)


def standing(table: Sequence[Answer], identity: str, turns: int) -> Answer | None:
    """The answer in ``table`` to the request ``identity``, unless it is a failure from an earlier state
    (one with fewer than ``turns`` user turns): that request is asked again."""
    answer = find(table, identity)
    return answer if answer is not None and answer.stands(turns) else None


def remember(table: Sequence[A], answer: A) -> tuple[A, ...]:
    """``table`` (keyed by request identity, oldest first) with ``answer`` replacing the one it supersedes, newest."""
    return (*(a for a in table if a.identity != answer.identity), answer)
