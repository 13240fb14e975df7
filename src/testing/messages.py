"""The messages the strategies draw: plain frozen values, in no framework's types.

A drawn conversation is a list of :class:`Drawn` messages whose contents are :class:`Text`,
:class:`Call`, :class:`Result`, :class:`Reasoning` and :class:`Media` values. :func:`to_history`
makes the core's :data:`~maf_compaction.core.History` of them (what a host's conversion does);
the package's own tests make Agent Framework messages of the same draws.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from ..core import History, MessageRecord, Part, history
from ..core.counting import Measure
from ..core.host import call_part, media_part, message, reasoning_part, result_part, text_part

#: The estimate a media part counts at unless a host says otherwise (the package's default).
MEDIA_TOKENS = 1_024


@dataclass(frozen=True, slots=True)
class Text:
    """Text the model reads."""

    text: str


@dataclass(frozen=True, slots=True)
class Media:
    """An image or a document: inline ``data`` or a ``uri``, with its media type."""

    media_type: str
    data: bytes | None = None
    uri: str | None = None

    @property
    def ref(self) -> str:
        """A stable reference to its bytes (a digest of inline data, or its URI) with its media type."""
        if self.data is not None:
            return f"data:{self.media_type}:sha256:{hashlib.sha256(self.data).hexdigest()}"
        return f"uri:{self.media_type}:{self.uri}"


@dataclass(frozen=True, slots=True)
class Call:
    """A function call: its id, its tool and its arguments (a JSON string or a mapping)."""

    call_id: str
    name: str
    arguments: str | Mapping[str, object]


@dataclass(frozen=True, slots=True)
class Result:
    """A function result: a string, or a rich value (text and media items); ``exception`` for a failed tool."""

    call_id: str
    result: str | tuple[Text | Media, ...]
    exception: str | None = None


@dataclass(frozen=True, slots=True)
class Reasoning:
    """Reasoning: an id, clear text, and an opaque provider payload (never counted)."""

    reasoning_id: str
    text: str
    protected_data: str | None = None


Content: TypeAlias = Text | Media | Call | Result | Reasoning


@dataclass(frozen=True, slots=True)
class Drawn:
    """One drawn message: its role, its contents in order, and its id (or ``None``)."""

    role: str
    contents: tuple[Content, ...]
    message_id: str | None = None


def to_part(content: Content, measure: Measure, *, media_tokens: int = MEDIA_TOKENS) -> Part:
    """The core's part for ``content``, counted with ``measure`` (media at ``media_tokens``)."""
    if isinstance(content, Text):
        return text_part(content.text, measure)
    if isinstance(content, Media):
        return media_part(content.ref, media_tokens, kind="data" if content.data is not None else "uri")
    if isinstance(content, Call):
        return call_part(content.call_id, content.name, content.arguments, measure)
    if isinstance(content, Reasoning):
        return reasoning_part(content.text, measure, opaque=content.protected_data)
    if isinstance(content.result, str):
        return result_part(content.call_id, content.result, measure)
    text = "\n".join(item.text for item in content.result if isinstance(item, Text))
    media = sum(media_tokens for item in content.result if isinstance(item, Media))
    return result_part(content.call_id, text, measure, media_tokens=media)


def to_record(drawn: Drawn, measure: Measure, *, origin: int, media_tokens: int = MEDIA_TOKENS) -> MessageRecord:
    """The core's message for ``drawn``, at ``origin`` in its list."""
    parts = [to_part(content, measure, media_tokens=media_tokens) for content in drawn.contents]
    return message(drawn.role, parts, message_id=drawn.message_id, origin=origin)


def to_history(messages: Sequence[Drawn], measure: Measure, *, media_tokens: int = MEDIA_TOKENS) -> History:
    """The core's history of ``messages``, each record carrying its index as ``origin``."""
    return history(
        to_record(drawn, measure, origin=index, media_tokens=media_tokens) for index, drawn in enumerate(messages)
    )
