"""Effect requests: what the core needs from the outside world, as values, and how answers come back.

The core never calls a model. When a pass needs a record, a summary or a media description
it answers with :class:`Request` s; the shell performs them (by the route the core chose),
records each answer (or failure) into the state with :func:`absorb`, and steps again. Each
request has an *identity*, a digest of everything that determines its answer, so the same
request on the other list (the in-call copies or the stored history), after a session
restore or on another replica finds its answer in the state instead of being sent twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from msgspec.structs import replace

from .model import History
from .state import BOUNDED_KINDS, Answer, RequestKind, State


def identity(kind: str, *fields: object) -> str:
    """A stable digest of a request's kind and fields (JSON-encoded, so unambiguous)."""
    payload = json.dumps([kind, *fields], ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


class Route(Enum):
    """How the shell performs a request; the core chooses it when it makes the request."""

    SUMMARIZER = "summarizer"
    """``[system(prompt), user(transcript)]`` to the summarizer client."""
    CACHED_PREFIX = "cached_prefix"
    """The conversation's own request (``view``, with its last request's head) plus one ``instruction``."""
    HOOK = "hook"
    """The host's ``describe_media`` hook, for the media part ``part`` of the message at ``origin``."""


#: How every instruction a request over the cached prefix appends begins.
COMPACTION_REQUEST: Final = "[compaction request]"
#: How the shell reports an answer over the cached prefix that called a tool instead (``[a call of NAME]``):
#: no record and no summary, whatever it is asked about.
CALLED_INSTEAD: Final = "[a call of "


@dataclass(frozen=True, slots=True)
class Request:
    """Ask the outside world for one text.

    Attributes:
        identity: The request's identity (see the module docstring).
        kind: What it asks for, and so what its answer becomes.
        route: How the shell performs it.
        prompt: The summarizer's instructions.
        transcript: The numbered items to summarise (the summarizer's user message).
        sources: How many items the transcript holds.
        message_id: The id the answer's message will carry if kept (allocated with the
            request, so both lists use the same one); ``None`` for a media description.
        turns: User turns in the conversation when the request was made: a failed
            answer is replayed (not retried) until the conversation has more.
        openings: The opening words of each item, in order (an instruction over the cached
            prefix names the items by them).
        items: The items' texts, in order (what the transcript numbers).
        instruction: Over the cached prefix: the one message appended to ``view``.
        view: Over the cached prefix: the history to send (the conversation's last request,
            cut between groups to fit), with the head of its last request.
        after: A record: how many messages of the conversation precede it once kept.
        also: A record asked with a summary in the same request (``instruction`` asks for
            both, the summary after a section line): each part answers its own request.
        origin: A media part's message, as an index into the list the shell converted.
        part: The media part's index within that message.
    """

    identity: str
    kind: RequestKind
    route: Route = Route.SUMMARIZER
    prompt: str = ""
    transcript: str = ""
    sources: int = 0
    message_id: str | None = None
    turns: int = 0
    openings: tuple[str, ...] = field(default=(), compare=False)
    items: tuple[str, ...] = field(default=(), compare=False, repr=False)
    instruction: str = field(default="", compare=False)
    view: History | None = field(default=None, compare=False, repr=False)
    after: int = 0
    also: Request | None = field(default=None, compare=False, repr=False)
    origin: int = 0
    part: int = 0


def answered(request: Request, text: str | None) -> Answer:
    """The answer to ``request``: blank text is a failure, dated by the request's turns."""
    clean = text.strip() if isinstance(text, str) and text.strip() else None
    return Answer(
        identity=request.identity,
        kind=request.kind,
        text=clean,
        message_id=request.message_id,
        sources=request.sources or None,
        turns=None if clean is not None else request.turns,  # a failure stands for this conversation state
        after=request.after if request.kind is RequestKind.RECORD else None,
    )


def standing(table: Sequence[Answer], identity: str, turns: int) -> Answer | None:
    """The answer in ``table`` to the request ``identity``, unless it is a failure from an earlier state
    (one with fewer than ``turns`` user turns): that request is asked again."""
    answer = next((answer for answer in reversed(table) if answer.identity == identity), None)  # the newest
    return answer if answer is not None and answer.stands(turns) else None


def remember(state: State, answer: Answer) -> State:
    """``state`` with ``answer`` in its table, newest, replacing the one it supersedes (the same identity)."""
    kept = tuple(a for a in state.answers if a.identity != answer.identity)
    return replace(state, answers=(*kept, answer))


def trimmed(state: State, keep: int) -> State:
    """``state`` with only the ``keep`` newest user summaries and folds (other answers are kept)."""
    bounded = [a for a in state.answers if a.kind in BOUNDED_KINDS]
    if len(bounded) <= keep:
        return state
    dropped = {id(a) for a in bounded[:-keep]}
    return replace(state, answers=tuple(a for a in state.answers if id(a) not in dropped))
