"""Counting messages on our basis, with media at an estimate and a content-keyed cache.

The basis itself (what text a part shows the model, what is opaque) is pure and lives
in :mod:`maf_compaction.core.counting`; this module reads framework ``Content``
objects, asks the tokenizer, and remembers the answers.
"""

from __future__ import annotations

import hashlib
import operator
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol, cast

from agent_framework import Content, Message

from ..core import counting as basis
from ..core.checks import AtLeastOne, describe_value, require, require_sync_callable, require_tokenizer
from ..core.model import MEDIA_KINDS, TOOL_CALL_KINDS, Part

DEFAULT_IMAGE_TOKENS = 1_024
DEFAULT_OTHER_MEDIA_TOKENS = 1_024

#: Entries kept per cache; a long conversation's distinct texts fit comfortably.
_CACHE_SIZE = 65_536


class Tokenizer(Protocol):
    """Anything with ``count_tokens(text) -> int``, like the framework's tokenizers.

    ``count_tokens`` must be synchronous and return an integer >= 0; any other answer
    raises when it is counted, naming the tokenizer and the value.
    """

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text``."""
        ...


class MediaTokenEstimator:
    """A tokenizer that also prices media parts at a fixed, configurable estimate.

    Every ``data``, ``uri`` and ``hosted_file`` part (including media inside a tool
    result) counts ``image_tokens`` when its media type is an image and
    ``other_media_tokens`` otherwise, or whatever ``estimate_media(content)`` returns.
    Inline base64 and URLs never count by their string length. Estimates must be
    positive integers; they are not provider usage measurements.

    Pass the same estimator to every strategy (and recall middleware) so they agree.

    Args:
        tokenizer: The text tokenizer to wrap: it must have a synchronous
            ``count_tokens(text)`` that returns an integer >= 0.
        image_tokens: Estimate for an image part.
        other_media_tokens: Estimate for any other media part (audio, documents...).
        estimate_media: Optional pure (not async) ``(content) -> int`` overriding both
            estimates.

    Raises:
        ValueError: A parameter is of the wrong kind or outside its range (the message
            names it).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        image_tokens: int = DEFAULT_IMAGE_TOKENS,
        other_media_tokens: int = DEFAULT_OTHER_MEDIA_TOKENS,
        estimate_media: Callable[[Content], int] | None = None,
    ) -> None:
        require_tokenizer("tokenizer", tokenizer)
        require("image_tokens", image_tokens, AtLeastOne)
        require("other_media_tokens", other_media_tokens, AtLeastOne)
        if estimate_media is not None:
            require_sync_callable("estimate_media", estimate_media, kind="a callable (content) -> int or None")
        self._tokenizer = tokenizer
        self._image_tokens = image_tokens
        self._other_media_tokens = other_media_tokens
        self._estimate_media = estimate_media
        self._parts = PartCounter(self)

    @property
    def parts(self) -> PartCounter:
        """The estimator's part counter and cache (shared by every strategy using this estimator)."""
        return self._parts

    @property
    def tokenizer(self) -> Tokenizer:
        """The wrapped text tokenizer."""
        return self._tokenizer

    @property
    def image_tokens(self) -> int:
        """Estimate for an image part."""
        return self._image_tokens

    @property
    def other_media_tokens(self) -> int:
        """Estimate for a non-image media part."""
        return self._other_media_tokens

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text``, from the wrapped tokenizer.

        Raises:
            TypeError: The tokenizer returned something other than an integer.
            ValueError: It returned a negative integer.
        """
        value = self._tokenizer.count_tokens(text)
        if type(value) is int and value >= 0:  # the usual answer: one check
            return value
        # An integer-like value (``numpy.int64``, anything with ``__index__``) is its int; a bool, a float (even
        # ``12.0``), a string or ``None`` is not a count.
        problem = f"tokenizer {self._tokenizer!r} returned {value!r} from count_tokens; it must return an integer >= 0"
        try:
            count = None if isinstance(value, bool) else operator.index(value)
        except TypeError:
            count = None
        if count is None:
            raise TypeError(problem)
        if count < 0:
            raise ValueError(problem)
        return count

    def estimate(self, content: Content) -> int:
        """The estimate for one media part; raises ``ValueError`` for a bad callback answer."""
        if self._estimate_media is not None:
            value = self._estimate_media(content)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"estimate_media must return a positive integer, got {value!r}")
            return value
        return self._image_tokens if (content.media_type or "").startswith("image/") else self._other_media_tokens

    def count_message_tokens(self, message: Message) -> int:
        """Tokens of ``message`` on maf-compaction's counting basis.

        Raises:
            TypeError: ``message`` is not a ``Message``, or its contents are malformed.
        """
        if not isinstance(message, Message):
            raise TypeError(f"message must be an agent_framework Message, got {describe_value(message)}")
        return basis.message_tokens(part.tokens for part in self._parts.parts(message))

    def decision_identity(self) -> dict[str, object]:
        """What changes this estimator's counts: the media estimates, the hook and the wrapped tokenizer."""
        return {
            "image_tokens": self._image_tokens,
            "other_media_tokens": self._other_media_tokens,
            "estimate_media": self._estimate_media,
            "tokenizer": self._tokenizer,
        }


def as_estimator(tokenizer: Tokenizer) -> MediaTokenEstimator:
    """``tokenizer`` itself if it is an estimator, else one with the default estimates."""
    return tokenizer if isinstance(tokenizer, MediaTokenEstimator) else MediaTokenEstimator(tokenizer)


class PartCounter:
    """Converts ``Content`` into core :class:`Part` values, counting each distinct text once.

    The cache is keyed by the counting basis version, the part kind and the text the
    model sees; it belongs to one estimator, so another tokenizer never reuses a count.
    Strings a conversation keeps (a stored tool result) keep their hash, so a warm
    lookup costs a dictionary probe.
    """

    def __init__(self, estimator: MediaTokenEstimator) -> None:
        self._estimator = estimator
        self._tokens: OrderedDict[tuple[int, str], int] = OrderedDict()

    def parts(self, message: Message, *, where: str = "message") -> tuple[Part, ...]:
        """The message's parts on the counting basis.

        Args:
            message: The message to convert.
            where: How an error names the message (``"messages[3]"``).

        Raises:
            TypeError: ``contents`` is not a list of ``Content``; the message names the
                message (``where``), the field and the position.
        """
        contents: object = message.contents
        if not isinstance(contents, list):
            raise TypeError(f"{where}.contents must be a list of Content, got {describe_value(contents)}")
        for position, content in enumerate(cast("list[object]", contents)):
            if not isinstance(content, Content):
                raise TypeError(f"{where}.contents[{position}] must be a Content, got {describe_value(content)}")
        return tuple(self.part(content) for content in message.contents)

    def part(self, content: Content) -> Part:
        """One content part on the counting basis (the rules are the core's)."""
        kind = content.type
        if kind in MEDIA_KINDS:
            media = self._estimator.estimate(content)
            return Part(kind=kind, tokens=media, media_tokens=media, ref=media_ref(content))
        name = (content.name or getattr(content, "tool_name", None)) if kind in TOOL_CALL_KINDS else None
        if kind in basis.RULED_KINDS:
            text = basis.visible_text(
                kind,
                text=content.text,
                name=name,
                arguments=content.arguments,
                result=content.result,
                protected_data=content.protected_data,
            )
        else:
            text = basis.other_text(content.to_dict(exclude_none=True))
        result = kind == "function_result"
        items = (content.items or ()) if result else ()  # media inside a tool result
        media = sum(self._estimator.estimate(item) for item in items if item.type in MEDIA_KINDS)
        structured = result and (any(item.type != "text" for item in items) or basis.is_json_container(text))
        return Part(
            kind=kind,
            text=text,
            tokens=self.measure(text) + media,
            media_tokens=media,
            call_id=content.call_id,
            name=name,
            structured=structured,
        )

    def measure(self, text: str) -> int:
        """Tokens of ``text`` (cached); the core's injected ``measure``."""
        if not text:
            return 0
        key = (basis.BASIS_VERSION, text)
        cached = self._tokens.get(key)
        if cached is not None:
            return cached
        value = self._estimator.count_tokens(text)
        self._tokens[key] = value
        if len(self._tokens) > _CACHE_SIZE:
            self._tokens.popitem(last=False)
        return value


def media_ref(content: Content) -> str:
    """A stable reference to a media part: its URI, a digest of inline data, or a hosted file id."""
    media_type = content.media_type or ""
    if content.type == "hosted_file":
        return f"file:{content.file_id}"
    uri = content.uri or ""
    if content.type == "data" or uri.startswith("data:"):
        return f"data:{media_type}:sha256:{hashlib.sha256(uri.encode()).hexdigest()}"
    return f"uri:{media_type}:{uri}"
