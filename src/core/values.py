"""Distinctive values: the exact strings a record must quote for a tool result to leave.

A model that writes a record can paraphrase prose without loss, but not an identifier,
a code, a version or a count. So coverage is judged on *distinctive values*: words of at
least four characters that contain a digit (``TL-3FA9C2``, ``v1.23.0``, ``2026-10-12``),
compared exactly, with their case.

Words are cut at the separators below; ``- _ . / \\ :`` are deliberately not separators,
so paths, versions, timestamps and hyphenated codes stay whole. Punctuation is stripped
from both ends of a word, and ``key=value`` keeps only the value, so ``code_7=TL-3FA9C2``
and ``| TL-3FA9C2 |`` yield the same value.
"""

from __future__ import annotations

import string
from collections import Counter
from typing import Final

#: Characters that end a word.
SEPARATORS: Final = ",;|\"'`()[]{}<>"
#: The shortest word that can be a distinctive value.
MIN_VALUE_LENGTH: Final = 4

_TO_SPACE: Final = str.maketrans(dict.fromkeys(SEPARATORS, " "))
_PUNCTUATION: Final = string.punctuation


def words(text: str) -> list[str]:
    """The words of ``text``, in order, duplicates kept (see the module docstring)."""
    found: list[str] = []
    for piece in text.translate(_TO_SPACE).split():
        word = piece.strip(_PUNCTUATION)
        if "=" in word:
            word = word.rsplit("=", 1)[1].strip(_PUNCTUATION)
        if word:
            found.append(word)
    return found


def is_distinctive(word: str) -> bool:
    """At least :data:`MIN_VALUE_LENGTH` characters, one of them a digit."""
    return len(word) >= MIN_VALUE_LENGTH and any(c.isdigit() for c in word)


def distinctive_values(text: str) -> tuple[str, ...]:
    """The distinct distinctive values of ``text``, in order of first appearance."""
    return tuple(dict.fromkeys(w for w in words(text) if is_distinctive(w)))


def word_set(text: str) -> frozenset[str]:
    """Every word of ``text``, for exact membership tests."""
    return frozenset(words(text))


def name_mentions(text: str) -> dict[str, int]:
    """How often each lowercased word occurs in ``text`` (tool names are matched this way)."""
    return dict(Counter(word.lower() for word in words(text)))
