"""What a summary must carry of the text it replaces: the summary coverage rule.

A summary replaces user turns (or earlier summaries, in a fold), and the user's
requirements, constraints and corrections live there. A model may paraphrase, so the
rule asks for what paraphrase keeps, checked on the replaced items and the answer alone:

- **Every distinctive value** of the items (:func:`~.values.distinctive_values`: codes,
  versions, dates, counts) appears in the answer, exactly, as a record must quote them.
- **Every directive line** of the items (:func:`directive_lines`: a line with a word that
  states a requirement, a constraint or a correction, and the list items under such a
  line) is carried: its values quoted, or, for a line without values, at least half of
  its content words (four letters or more, case, endings and function words aside)
  present in the answer.
- **Substance**: when the items have content words, the answer shares at least one or
  quotes one of their values. An answer like "Understood." summarises nothing.

A summary that misses any of it is refused; :func:`reask_prompt` names what it missed for
one more request, and what is still missing then keeps its turns verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from .checks import share_of
from .values import distinctive_values, word_set

#: Words that state a requirement, a constraint or a correction (whole words, any case).
DIRECTIVE: Final = re.compile(
    r"\b(?:must|mustn't|never|always|only|requires?|required|requirements?|constraints?|corrections?"
    r"|instead|should|shouldn't|do not|don't|does not|doesn't|avoid|prefer|no longer|not allowed|at most"
    r"|at least|forbidden|mandatory|make sure|ensure)\b",
    re.IGNORECASE,
)
_BULLET: Final = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+")
_WORD: Final = re.compile(r"[A-Za-z][A-Za-z'\-]{3,}")
#: Function words of four letters or more that carry no requirement of their own.
_FUNCTION_WORDS: Final = frozenset(
    [
        "about",
        "above",
        "after",
        "again",
        "also",
        "been",
        "before",
        "being",
        "both",
        "could",
        "does",
        "done",
        "each",
        "from",
        "have",
        "here",
        "into",
        "just",
        "more",
        "most",
        "much",
        "must",
        "never",
        "only",
        "other",
        "over",
        "same",
        "should",
        "some",
        "such",
        "than",
        "that",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "under",
        "until",
        "very",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "will",
        "with",
        "would",
        "your",
        "always",
        "every",
    ]
)
#: The share of a directive line's content words a summary must carry.
LINE_SHARE: Final = 0.5


def directive_lines(text: str) -> tuple[str, ...]:
    """The lines of ``text`` that state a requirement, a constraint or a correction, in order.

    A line with a :data:`DIRECTIVE` word, and every list item right after such a line (a
    list under "Requirements:" states requirements even where an item has no such word).
    """
    found: list[str] = []
    listing = False
    for line in text.split("\n"):
        stripped = line.strip()
        if not stripped:
            listing = False
            continue
        if DIRECTIVE.search(stripped) or (listing and _BULLET.match(stripped)):
            found.append(stripped)
            listing = True
        else:
            listing = False
    return tuple(dict.fromkeys(found))


def content_words(text: str) -> frozenset[str]:
    """The words of ``text`` that carry its content: four letters or more, lowercased, function words aside, each
    without a plural or tense ending (``rollouts`` and ``rollout`` are one word)."""
    return frozenset(_stem(w.lower()) for w in _WORD.findall(text) if w.lower() not in _FUNCTION_WORDS)


_ENDINGS: Final = ("ing", "ed", "es", "s")


def _stem(word: str) -> str:
    return next((word[: -len(e)] for e in _ENDINGS if word.endswith(e) and len(word) - len(e) >= 4), word)


@dataclass(frozen=True, slots=True)
class Omission:
    """What a summary left out of the items it replaces (all empty: nothing).

    Attributes:
        values: Distinctive values of the items the answer does not quote, in order.
        lines: Directive lines of the items the answer does not carry, in order.
        substance: The answer shares no content word and no value with items that have content words.
    """

    values: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()
    substance: bool = False

    def __bool__(self) -> bool:
        return bool(self.values or self.lines or self.substance)

    def described(self) -> str:
        """One line naming what is missing, for a log."""
        parts = [
            *([f"values {', '.join(self.values)}"] if self.values else []),
            *([f"{len(self.lines)} requirement, constraint or correction line(s)"] if self.lines else []),
            *(["anything of what it replaces"] if self.substance else []),
        ]
        return "; ".join(parts)


def carried(line: str, answer_words: frozenset[str], answer_content: frozenset[str]) -> bool:
    """Whether an answer (its exact words, its content words) carries the directive ``line``: every value of it
    quoted, which is enough for a line that has values (they name what it is about, however tersely the answer
    restates it); a line without one needs :data:`LINE_SHARE` of its content words."""
    values = distinctive_values(line)
    if values:
        return all(value in answer_words for value in values)
    wanted = content_words(_BULLET.sub("", line, count=1))
    return not wanted or len(wanted & answer_content) >= share_of(len(wanted), LINE_SHARE)


def omissions(items: Sequence[str], answer: str) -> Omission:
    """What ``answer`` leaves out of ``items`` by the rule of the module docstring."""
    source = "\n".join(items)
    exact = word_set(answer)
    content = content_words(answer)
    values = tuple(v for v in distinctive_values(source) if v not in exact)
    lines = tuple(line for line in _lines(items) if not carried(line, exact, content))
    quoted_any = any(v in exact for v in distinctive_values(source))
    substance = bool(content_words(source)) and not content_words(source) & content and not quoted_any
    return Omission(values, lines, substance)


def owed(items: Sequence[str]) -> str:
    """The least a summary of ``items`` must say to pass the rule: their distinctive values, and, for each
    directive line without a value, the share of its content words :func:`carried` asks for (a value names
    its line, so a line with one owes nothing more). What the answer's size is estimated from."""
    source = "\n".join(items)
    words = [
        " ".join(sorted(wanted)[: share_of(len(wanted), LINE_SHARE)])
        for line in _lines(items)
        if not distinctive_values(line) and (wanted := content_words(_BULLET.sub("", line, count=1)))
    ]
    return " ".join([*dict.fromkeys(distinctive_values(source)), *words])


def _lines(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(line for item in items for line in directive_lines(item)))


def reask_prompt(prompt: str, missing: Omission) -> str:
    """``prompt`` with what an earlier answer left out named, for one more request."""
    named = [
        "An earlier summary of these items left out what follows. Write the summary again and carry each of them.",
        *([f"Quote exactly: {', '.join(missing.values)}."] if missing.values else []),
        *([f"Keep: {line}" for line in missing.lines]),
    ]
    return f"{prompt}\n\n" + "\n".join(named)
