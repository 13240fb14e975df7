"""The shell's connection: one conversation's state value, lock and binding, and the views that share it.

A strategy owns one :class:`Connection` and reads and writes its state through a
:class:`StateView`. A composition owns the connection of the conversation and adopts its record
half, whose view then reads and writes the record part of the composition's one value. The
recall middleware (through the strategy's ``take_reforce``, a :class:`Reforce` carrying the
view and the strategy's parameters) and the recall gate (attached by a ``CompactionStack``)
hold that same view, so every part of a stack reads and writes one value by construction.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Generic, TypeVar

from agent_framework import Message

from ..core import records as core
from ..core.records import RecordConfig, RecordState
from .convert import NOTE_KEY, WRITTEN_RECORD_KEY, is_injected, is_summary

logger = logging.getLogger("maf_compaction")

S = TypeVar("S")
P = TypeVar("P")


class Connection(Generic[S]):
    """One conversation: its one state value, its lock and its binding (the shell's connection).

    Strategies, the recall middleware and (once a ``CompactionStack`` attaches it) the gate
    read and write it through views (:class:`StateView`), so they share one value and never
    call into each other. ``value``
    is an immutable core value; only the shell replaces it.
    """

    def __init__(self, value: S) -> None:
        self.value = value
        self.conversation: tuple[str, ...] | None = None
        #: The chat client keeps the conversation on the server: passes change nothing (said once).
        self.provider_owned = False
        #: Serializes passes on this conversation (an asyncio lock binds to a loop only when first contended).
        self.lock = asyncio.Lock()
        #: The head (chat client, options) of the conversation's last unpinned request, as the recall
        #: middleware saw it sent: a request over the cached prefix repeats it (``adapters.aligned``).
        self.head: Any = None

    def bind(self, messages: Sequence[Message], owner: str) -> None:
        """Bind to the conversation ``messages`` belong to; refuse another one.

        A conversation is known by its first few messages of history (each by its id, or a
        digest of role and text when it has none), so a copy of the same conversation
        (loaded copies, stored history, a deep copy, a restore) is the same conversation,
        and two conversations that only share a system prompt or a templated first turn
        are not. The known prefix grows with the conversation up to :data:`_KEY_MESSAGES`.
        """
        prefix = conversation_key(messages)
        if not prefix:
            return
        bound = self.conversation
        if bound is None:
            self.conversation = prefix
            return
        shared = min(len(bound), len(prefix))
        if prefix[:shared] == bound[:shared]:
            if len(prefix) > len(bound):
                self.conversation = prefix
            return
        present = {message_key(m) for m in messages}
        if all(key in present for key in bound):  # our own inserts moved, nothing was lost
            return
        raise RuntimeError(
            f"{owner} serves one conversation (starting {bound[0][:24]}...) but was called with another "
            f"(starting {prefix[0][:24]}...): build one strategy (and middleware, gate) per conversation, or "
            "serve many through the session registry. If this is one conversation, the chat client may keep it "
            f"on the server and send only new messages: {STORE_FALSE_HINT}"
        )


#: The one setting that gives client-side compaction its history back.
STORE_FALSE_HINT = (
    "client-side compaction needs client-side history; build the agent with default_options={'store': False} "
    "(the OpenAI Responses client stores history on the server unless store=False)"
)

#: How many first messages of history identify a conversation.
_KEY_MESSAGES = 3


def message_key(message: Message) -> str:
    """A message's identity for conversation binding: its id, or a digest of role and text."""
    if message.message_id:
        return f"id:{message.message_id}"
    digest = hashlib.sha256(f"{message.role}\x00{message.text}".encode()).hexdigest()
    return f"sha256:{digest}"


def conversation_key(messages: Iterable[Message]) -> tuple[str, ...]:
    """The keys of the first messages of history (injected context and our own messages aside)."""
    keys: list[str] = []
    for message in messages:
        props = message.additional_properties
        if NOTE_KEY in props or WRITTEN_RECORD_KEY in props or is_summary(message) or is_injected(message):
            continue
        keys.append(message_key(message))
        if len(keys) == _KEY_MESSAGES:
            break
    return tuple(keys)


class StateView(Generic[P]):
    r"""One strategy's part of a conversation's state, read and written through the connection that owns it.

    A strategy alone owns its connection and its view is the whole value. A composition
    :meth:`adopt`\ s its record half: the half's view then reads and writes the record part
    of the composition's value, and whoever holds that view (the recall middleware, the
    gate) follows, so wiring before or after the composition is built shares one value.
    """

    __slots__ = ("_get", "_put", "connection")

    def __init__(self, value: P) -> None:
        self.connection: Connection[Any] = Connection(value)
        self._get: Callable[[Any], P] = lambda whole: whole
        self._put: Callable[[Any, P], Any] = lambda _, part: part

    @property
    def value(self) -> P:
        """This part of the connection's value."""
        return self._get(self.connection.value)

    @value.setter
    def value(self, value: P) -> None:
        connection = self.connection
        connection.value = self._put(connection.value, value)

    def adopt(self, connection: Connection[S], get: Callable[[S], P], put: Callable[[S, P], S]) -> None:
        """Read and write this part of ``connection``'s value from now on (a composition adopting its half)."""
        self.connection, self._get, self._put = connection, get, put


class Reforce:
    """A record strategy's ``take_reforce``: a callable that also carries the strategy's state view.

    Calling it takes the outstanding ask for uncovered groups (True once per ask), as a
    plain ``reforce`` callable would. A recall middleware given this object as its
    ``reforce`` shares :attr:`cell` (after checking that its budget and trigger are
    :attr:`config`'s) and calls it like any other.
    """

    __slots__ = ("cell", "config")

    def __init__(self, cell: StateView[RecordState], config: RecordConfig) -> None:
        self.cell = cell
        self.config = config

    def __call__(self) -> bool:
        """Take the outstanding ask for one pinned request: True once per ask."""
        cell = self.cell
        taken, decisions = core.take_reforce(cell.value.decisions)
        if taken:
            cell.value = replace(cell.value, decisions=decisions)
            targets = decisions.ask.targets if decisions.ask is not None else ()
            logger.info("Asking again for a record of %d uncovered tool group(s)", len(targets))
        return taken
