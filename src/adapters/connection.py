"""The shell's connection: one conversation's state value, lock and binding, and the seams that share it.

A strategy owns one :class:`Connection`; the recall middleware shares it through the
strategy's ``take_reforce`` (a :class:`Reforce`, which carries the connection and the
strategy's parameters), so the two read and write one value.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from agent_framework import Message

from ..core import records as core
from ..core.records import RecordConfig, RecordState
from .convert import NOTE_KEY, WRITTEN_RECORD_KEY, is_injected, is_summary

logger = logging.getLogger("maf_compaction")

S = TypeVar("S")


class Connection(Generic[S]):
    """One conversation: its one state value, its lock and its binding (the shell's connection).

    A strategy owns its connection; the recall middleware wired to it (through
    :class:`Reforce`) shares the same connection, so they read and write one value and
    never call into each other. ``value`` is an immutable core value; only the shell
    replaces it.
    """

    def __init__(self, value: S) -> None:
        self.value = value
        self.conversation: tuple[str, ...] | None = None
        #: The chat client keeps the conversation on the server: passes change nothing (said once).
        self.provider_owned = False
        self._lock: asyncio.Lock | None = None

    @property
    def lock(self) -> asyncio.Lock:
        """Serializes passes on this conversation (created on first use, in the running loop)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

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


class Reforce:
    """A record strategy's ``take_reforce``: a callable that also carries the strategy's connection.

    Calling it takes the outstanding ask for uncovered groups (True once per ask), as a
    plain ``reforce`` callable would. A recall middleware given this object as its
    ``reforce`` shares :attr:`connection` instead of calling it, after checking that its
    budget and trigger are :attr:`config`'s.
    """

    __slots__ = ("config", "connection")

    def __init__(self, connection: Connection[RecordState], config: RecordConfig) -> None:
        self.connection = connection
        self.config = config

    def __call__(self) -> bool:
        """Take the outstanding ask for one pinned request: True once per ask."""
        connection = self.connection
        taken, decisions = core.take_reforce(connection.value.decisions)
        if taken:
            state = connection.value
            connection.value = RecordState(decisions=decisions, fallback=state.fallback, recall=state.recall)
            targets = decisions.ask.targets if decisions.ask is not None else ()
            logger.info("Asking again for a record of %d uncovered tool group(s)", len(targets))
        return taken
