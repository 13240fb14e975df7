"""The shell's conversation: one conversation's state value, lock, binding and last request, shared by its parts.

h11's ``Connection`` for compaction: one :class:`Conversation` per conversation holds its
one state value (a :class:`~maf_compaction.core.state.State`; the anchored strategy's
:class:`~maf_compaction.core.state.AnchoredSnapshot`). The strategy steps the core over
it; the recall middleware advances the recall protocol in it and records the head of each
request it sees sent; the gate keeps its one-shot permission in it; a composition and its
record half, and a ``CompactionStack``'s parts, hold the same object. None of them calls
into another: they read and write one value.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any, Generic, TypeVar

from agent_framework import Message

from ..core.model import MessageRecord
from .convert import NOTE_KEY, WRITTEN_RECORD_KEY, is_injected, is_summary

S = TypeVar("S")
#: The (reason, message) pairs already named (most recent last; see ``CompactionAdapter.share_named``).
NamedSets = OrderedDict[tuple[str, str], None]


class Conversation(Generic[S]):
    """One conversation: its one state value, its lock, its binding and the head of its last request.

    ``value`` is an immutable core value; only the shell replaces it, whole.
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
        #: A recall middleware reads and writes this conversation (a record strategy cannot ask without one).
        self.recall_shared = False
        #: Model requests the recall middleware saw, and passes that needed it (a middleware built but never
        #: installed in the agent sees none: said once).
        self.requests_seen = 0
        self.recall_passes = 0
        #: What the strategy named in log lines already (kept across stacks of one session by its registry).
        self.named: NamedSets = OrderedDict()
        #: The prompt the last traced pass left (telemetry: whether the next pass keeps it as its prefix).
        self.last_prompt: tuple[MessageRecord, ...] | None = None

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
        if bound is None or prefix[: len(bound)] == bound:  # new, or the same conversation grown
            self.conversation = prefix
            return
        # The same conversation seen shorter, or our own inserts moved and nothing was lost.
        if bound[: len(prefix)] == prefix or set(bound) <= {message_key(m) for m in messages}:
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
    history = (m for m in messages if not (_ours(m) or is_summary(m) or is_injected(m)))
    return tuple(message_key(message) for message in islice(history, _KEY_MESSAGES))


def _ours(message: Message) -> bool:
    return NOTE_KEY in message.additional_properties or WRITTEN_RECORD_KEY in message.additional_properties
