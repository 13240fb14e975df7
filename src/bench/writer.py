"""How the scripted model writes records and summaries: the plausible writer (the default) and the oracle.

Both answer the same two questions from what the request shows: a *record* of tool results
and a *summary* of numbered items (user turns, earlier summaries, records to merge). Neither
reads the library's wording or the workload's value pattern (``docs/bench.md``, "The scripted
model"):

- :class:`PlausibleWriter` writes as a model does. It opens with prose, a sentence or more per
  message it covers, then copies values by a generic rule (:func:`candidates`: key=value pairs,
  numbers with units, tokens that look like identifiers), restates requirement lines
  (:func:`requirement_lines`), and stops at an answer length; what does not fit is left out.
  Fields that repeat down a result (a log's ``status=``, a column of line numbers) are told
  as a range, not copied one by one. It is lossy as models are, each loss a knob drawn from
  the seed and the request: a requirement line left out, a value mis-copied, a record that
  answers part of what was asked, a share of values dropped.
- :class:`OracleWriter` is the earlier minimal, perfect writer, kept for comparison only: it
  copies exactly the lines that carry a planted value (it knows the scenario's values and
  their pattern), with no prose.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from ..core.tables import tables
from .scenario import prose

#: Characters per token the model assumes when it sizes what it writes (its answer length).
CHARS_PER_TOKEN: Final = 4


@dataclass(frozen=True, slots=True)
class Source:
    """One message a record or a summary covers.

    Attributes:
        text: What the model reads in it.
        name: The tool that produced it (a record's results); ``""`` for a summary's items.
    """

    text: str
    name: str = ""


class Writer(Protocol):
    """Writes the text of a record or a summary (see the module docstring)."""

    def record(self, results: Sequence[Source], max_tokens: int | None, key: str) -> str:
        """A record of ``results`` (tool results), within ``max_tokens`` when given.

        ``key`` identifies the request (what it shows, never how it is worded): it seeds the draws.
        """
        ...

    def summary(
        self,
        items: Sequence[Source],
        max_tokens: int | None,
        key: str,
        *,
        named: int | None = None,
        values_only: bool = False,
    ) -> str:
        """A summary of ``items`` (``named``: how many items an instruction named), within ``max_tokens``;
        ``values_only``: without prose (a record rewritten shorter)."""
        ...


def digest(*parts: str) -> str:
    """A short stable digest of ``parts`` (keys the model's draws: the same request draws the same)."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def chance(seed: int, *parts: str) -> float:
    """A deterministic draw in [0, 1) from ``seed`` and ``parts``."""
    value = hashlib.sha256(f"{seed}\x1f{chr(31).join(parts)}".encode()).digest()
    return int.from_bytes(value[:6], "big") / 2**48


# ---------------------------------------------------------------------------------------
# The generic value rule
# ---------------------------------------------------------------------------------------

_KEY_VALUE: Final = re.compile(r"(?<![\w.\-/])([A-Za-z_][\w.\-]*)=([^\s,;|()\[\]{}<>\"']+)")
_WITH_UNIT: Final = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ns|us|µs|ms|s|sec|min|h|B|KB|KiB|MB|MiB|GB|GiB|TB|%)(?![\w/])"
)
_TOKEN: Final = re.compile(r"[\w][\w.:/@#+\-]*")
_EDGES: Final = ".:-/#+@"
_CAMEL: Final = re.compile(r"[a-z][A-Z]|[A-Z]{2}[a-z]")
_DOTTED: Final = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_NUMBER: Final = re.compile(r"\d+(?:\.\d+)?")
#: A value that is a number, with a unit at most (``42``, ``3.5``, ``120ms``): a column of them is told as a range;
#: identifiers (a ticket, a host) are copied one by one, up to the answer length.
_MEASURE: Final = re.compile(r"[-+]?\d+(?:\.\d+)?[A-Za-z%]{0,3}")
_LETTERS_OR_DIGITS: Final = re.compile(r"[A-Za-z]+|\d+")


def identifier_like(token: str) -> bool:
    """A token a model copies rather than paraphrases: codes, versions, long numbers, names in code and paths.

    ``TL-3FA9C2``, ``v1.23.0``, ``2026-11-03``, ``8192``, ``_siftdown_max``, ``JSONDecoder``,
    ``json.encoder``, ``Lib/heapq.py``; not ``345``, ``rollout`` or ``region``.
    """
    word = token.strip(_EDGES)
    if len(word) < 3:
        return False
    if any(c.isdigit() for c in word):
        return len(word) >= 4 or any(c.isalpha() for c in word)
    if "_" in word.strip("_") or "/" in word:
        return True
    return bool(_CAMEL.search(word) or _DOTTED.fullmatch(word))


@dataclass(frozen=True, slots=True)
class Candidate:
    """A value a model would copy from a line.

    Attributes:
        text: What it copies (``key=value``, ``345 ms``, ``TL-3FA9C2``).
        value: The value itself (for a key=value pair, the part after ``=``).
        field: What the value is an instance of (a key, or a position and shape in its
            line): values of one field that repeat down a result form a column.
    """

    text: str
    value: str
    field: tuple[str, ...]


def _shape(token: str) -> str:
    return _LETTERS_OR_DIGITS.sub(lambda m: "9" if m.group().isdigit() else "a", token)


def candidates(line: str) -> list[Candidate]:
    """The values a model copies from one line, in order (the generic rule; see the module docstring)."""
    found: list[tuple[int, Candidate]] = []
    rest = list(line)

    def take(start: int, end: int) -> None:
        rest[start:end] = " " * (end - start)

    for match in _KEY_VALUE.finditer(line):
        value = match.group(2).rstrip(_EDGES)
        if value:
            found.append((match.start(), Candidate(f"{match.group(1)}={value}", value, ("key", match.group(1)))))
            take(*match.span())
    blanked = "".join(rest)
    for match in _WITH_UNIT.finditer(blanked):
        unit = match.group().lstrip("0123456789. ")
        position = len(blanked[: match.start()].split())
        found.append((match.start(), Candidate(match.group(), match.group(), ("unit", str(position), unit))))
        take(*match.span())
    blanked = "".join(rest)
    for match in _TOKEN.finditer(blanked):
        word = match.group().strip(_EDGES)
        if identifier_like(word):
            position = len(blanked[: match.start()].split())
            found.append((match.start(), Candidate(word, word, ("at", str(position), _shape(word)))))
    return [candidate for _, candidate in sorted(found, key=lambda pair: pair[0])]


#: Occurrences of one field in one result from which a model tells the field as a range instead of copying it.
COLUMN_LINES: Final = 6
#: A column with at most this many distinct values is listed value by value.
COLUMN_LISTED: Final = 4


@dataclass(frozen=True, slots=True)
class Reading:
    """What a model takes from one message: the values it copies and the columns it tells as ranges.

    Attributes:
        values: Values to copy, in order, each once.
        rows: Table rows that carry a value, each as (heading row, separator row, row).
        columns: One clause per repeating field (``took run from 3 to 999``).
    """

    values: tuple[Candidate, ...] = ()
    rows: tuple[tuple[str, str, str], ...] = ()
    columns: tuple[str, ...] = ()


def _range(values: Sequence[str]) -> str:
    numbers = [(float(m.group()), v) for v in values if (m := _NUMBER.search(v))]
    if len(numbers) == len(values):
        low, high = min(numbers)[1], max(numbers)[1]
        return f"from {low} to {high}"
    return f"{len(set(values))} distinct values such as {values[0]} and {values[-1]}"


def _field_name(field_key: tuple[str, ...]) -> str:
    if field_key[0] == "key":
        return field_key[1]
    ordinal = int(field_key[1]) + 1
    return f"the values in word {ordinal} of each line"


def read(text: str, *, skip: Callable[[str], bool] = lambda _: False) -> Reading:
    """What a model copies from ``text``: table rows with values, other values, repeating fields as ranges.

    ``skip`` leaves lines out (a summary restates requirement lines whole instead).
    """
    lines = text.split("\n")
    in_table: dict[int, tuple[str, str]] = {}
    for table in tables(text):
        start = table.end - len(table.rows) - 2
        for index, _ in table.rows:
            in_table[index] = (lines[start].strip(), lines[start + 1].strip())
    rows: list[tuple[str, str, str]] = []
    found: list[Candidate] = []
    for index, line in enumerate(lines):
        if skip(line):
            continue
        got = candidates(line)
        if index in in_table:
            if got:
                rows.append((*in_table[index], line.strip()))
            continue
        found += got
    by_field: dict[tuple[str, ...], list[Candidate]] = {}
    for candidate in found:
        by_field.setdefault(candidate.field, []).append(candidate)
    told: list[str] = []
    columns: set[tuple[str, ...]] = set()
    for key, members in by_field.items():
        distinct = list(dict.fromkeys(c.value for c in members))
        if len(members) >= COLUMN_LINES and len(distinct) > COLUMN_LISTED and all(map(_MEASURE.fullmatch, distinct)):
            columns.add(key)
            told.append(f"{_field_name(key)} run {_range(distinct)}")
    values = {c.text: c for c in found if c.field not in columns}
    return Reading(tuple(values.values()), tuple(rows), tuple(told))


_DIRECTIVE: Final = re.compile(
    r"\b(must|never|always|only|require[sd]?|requirements?|constraints?|corrections?|corrected|instead|"
    r"should|do not|don't|avoid|prefer)\b",
    re.IGNORECASE,
)
_BULLET: Final = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+")


def requirement_lines(text: str) -> list[str]:
    """The lines of ``text`` that state a requirement, constraint or correction, in order.

    The scripted model's own notion, kept apart from the library's summary coverage rule
    (``maf_compaction.core.summary_check.directive_lines``, a wider word list) on purpose: the
    model a figure is measured with must not share the rule that judges it.

    A line with a directive word (must, never, always, only, require, constraint, correction,
    instead, should, do not, avoid, prefer), and every list item right after such a line (a
    list under "Requirements:" states requirements even where an item has no such word).
    """
    found: list[str] = []
    listing = False
    for line in text.split("\n"):
        stripped = line.strip()
        if not stripped:
            listing = False
            continue
        if _DIRECTIVE.search(stripped) or (listing and _BULLET.match(stripped)):
            found.append(stripped)
            listing = True
        else:
            listing = False
    return found


# ---------------------------------------------------------------------------------------
# The plausible writer
# ---------------------------------------------------------------------------------------

_WORDS: Final = (
    "the",
    "result",
    "shows",
    "entries",
    "for",
    "service",
    "rollout",
    "with",
    "several",
    "lines",
    "about",
    "status",
    "checks",
    "and",
    "notes",
    "on",
    "timing",
    "in",
    "order",
    "user",
    "asked",
    "that",
    "a",
    "of",
    "details",
    "mentions",
    "context",
    "summary",
    "recorded",
    "earlier",
)
#: Characters per token of the writer's prose (common short words).
_PROSE_CHARS_PER_TOKEN: Final = 5.0


def miscopied(value: str, draw: float) -> str:
    """``value`` with one character changed (a digit or a letter, at a position ``draw`` picks)."""
    places = [i for i, c in enumerate(value) if c.isalnum()]
    if not places:
        return value
    at = places[int(draw * len(places)) % len(places)]
    c = value[at]
    if c.isdigit():
        new = str((int(c) + 1) % 10)
    elif c.isupper():
        new = chr((ord(c) - 65 + 1) % 26 + 65) if c.isascii() else c
    else:
        new = chr((ord(c) - 97 + 1) % 26 + 97) if c.isascii() else c
    return value[:at] + new + value[at + 1 :]


@dataclass(frozen=True, slots=True)
class Losses:
    """How a plausible model falls short, each a share drawn per item from the seed and the request.

    Attributes:
        drop_requirements: A requirement, constraint or correction line left out of a summary.
        miscopy: A copied value with one character changed.
        partial_records: A record that covers only the first half of what it was asked about.
        record_quality: Share of values a record keeps (the rest left out).
        summary_quality: Share of values a summary keeps.
    """

    drop_requirements: float = 0.05
    miscopy: float = 0.01
    partial_records: float = 0.05
    record_quality: float = 1.0
    summary_quality: float = 1.0

    def __post_init__(self) -> None:
        for name in ("drop_requirements", "miscopy", "partial_records", "record_quality", "summary_quality"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class PlausibleWriter:
    """Writes records and summaries as a model does (see the module docstring).

    Attributes:
        seed: Seeds every draw (with the request's content).
        prose_tokens: The range of prose tokens per message covered.
        answer_tokens: The longest answer the model writes; past it, values are left out.
        losses: What it gets wrong, and how often.
    """

    seed: int = 0
    prose_tokens: tuple[int, int] = (30, 60)
    answer_tokens: int = 1_500
    losses: Losses = field(default_factory=Losses)

    def __post_init__(self) -> None:
        low, high = self.prose_tokens
        if not 0 <= low <= high:
            raise ValueError(f"prose_tokens must be a range (low, high) with 0 <= low <= high, got {self.prose_tokens}")
        if self.answer_tokens < 1:
            raise ValueError(f"answer_tokens must be >= 1, got {self.answer_tokens}")

    def _chance(self, *parts: str) -> float:
        return chance(self.seed, *parts)

    def _sentences(self, key: str, sources: Sequence[Source], opening: Callable[[int, Source], str]) -> list[str]:
        low, high = self.prose_tokens
        out: list[str] = []
        for number, source in enumerate(sources, start=1):
            rng = random.Random(f"{self.seed}:{key}:prose:{number}")
            words = prose(
                rng, rng.randint(low, high), words=_WORDS, chars_per_token=_PROSE_CHARS_PER_TOKEN, sentence=(8, 14)
            )
            out.append(f"{opening(number, source)} {words}".strip())
        return out

    def _copy(self, key: str, candidate: Candidate) -> str:
        """The candidate as the model writes it: now and then with one character of its value changed."""
        draw = self._chance(key, "miscopy", candidate.text)
        if draw >= self.losses.miscopy:
            return candidate.text
        changed = miscopied(candidate.value, draw / self.losses.miscopy)
        head, _, _ = candidate.text.rpartition(candidate.value)
        return f"{head}{changed}"

    def _copy_line(self, key: str, line: str) -> str:
        for candidate in candidates(line):
            copied = self._copy(key, candidate)
            if copied != candidate.text:
                line = line.replace(candidate.text, copied, 1)
        return line

    def _limit(self, max_tokens: int | None) -> int:
        tokens = self.answer_tokens if max_tokens is None else min(self.answer_tokens, max_tokens)
        return tokens * CHARS_PER_TOKEN

    def record(self, results: Sequence[Source], max_tokens: int | None, key: str) -> str:
        """Prose about each result, then its values and value-bearing table rows, within the answer length."""
        key = f"record:{key}"
        shown = list(results)
        if len(shown) > 0 and self._chance(key, "partial") < self.losses.partial_records:
            if len(shown) > 1:
                shown = shown[: math.ceil(len(shown) / 2)]
            else:
                lines = shown[0].text.split("\n")
                shown = [Source("\n".join(lines[: math.ceil(len(lines) / 2)]), shown[0].name)]
        readings = [read(r.text) for r in shown]

        def opening(number: int, source: Source) -> str:
            told = readings[number - 1].columns
            about = f"; {', '.join(told)}" if told else ""
            lines = source.text.count("\n") + 1
            return f"The {source.name or 'tool'} result {number} has {lines} lines{about}."

        pieces: list[_Piece] = []
        for number, (source, reading) in enumerate(zip(shown, readings, strict=True), start=1):
            kept = [
                _Piece((self._copy(key, c),), listed=True)
                for c in reading.values
                if self._chance(key, "keep", c.text) < self.losses.record_quality
            ]
            rows = [r for r in reading.rows if self._chance(key, "keep", r[2]) < self.losses.record_quality]
            if kept or rows:
                pieces.append(_Piece((f"{source.name or 'tool'} result {number}:",)))
                pieces += kept
                pieces += _table_pieces(rows, lambda line: self._copy_line(key, line))
        return _fit(self._sentences(key, shown, opening), pieces, self._limit(max_tokens))

    def summary(
        self,
        items: Sequence[Source],
        max_tokens: int | None,
        key: str,
        *,
        named: int | None = None,
        values_only: bool = False,
    ) -> str:
        """Prose about each item, its requirement lines restated, then its other values, within the answer length
        (``values_only``: no prose, as a model rewriting a record of its own shorter writes)."""
        key = f"summary:{key}"
        losses = self.losses

        def opening(number: int, source: Source) -> str:
            return f"Item {number} is about the task."

        stated: list[_Piece] = []
        values: list[_Piece] = []
        rows: list[tuple[str, str, str]] = []
        for item in items:
            lines = requirement_lines(item.text)
            for line in lines:
                if self._chance(key, "drop", line) >= losses.drop_requirements:
                    stated.append(_Piece((f"- {self._copy_line(key, _BULLET.sub('', line, count=1))}",)))
            reading = read(item.text, skip=set(lines).__contains__)
            values += [
                _Piece((self._copy(key, c),), listed=True)
                for c in reading.values
                if self._chance(key, "keep", c.text) < losses.summary_quality
            ]
            rows += [r for r in reading.rows if self._chance(key, "keep", r[2]) < losses.summary_quality]
        pieces: list[_Piece] = []
        if stated:
            pieces += [_Piece(("Requirements, constraints and corrections:",)), *stated]
        if values or rows:
            pieces += [_Piece(("Values:",)), *values, *_table_pieces(rows, lambda line: self._copy_line(key, line))]
        sentences = [] if values_only else self._sentences(key, items, opening)
        return _fit(sentences, pieces, self._limit(max_tokens))


@dataclass(frozen=True, slots=True)
class _Piece:
    """Lines of an answer that are written whole or not at all.

    Attributes:
        lines: The lines.
        listed: A single value: consecutive listed pieces share a line, comma-separated, as a model lists them.
    """

    lines: tuple[str, ...]
    listed: bool = False


def _table_pieces(rows: Iterable[tuple[str, str, str]], copy: Callable[[str], str]) -> list[_Piece]:
    """Table rows as pieces: a table's heading and separator rows come with its first row, after a blank line."""
    pieces: list[_Piece] = []
    heading: tuple[str, str] | None = None
    for head, separator, row in rows:
        if (head, separator) != heading:
            pieces.append(_Piece(("", head, separator, copy(row))))
            heading = (head, separator)
        else:
            pieces.append(_Piece((copy(row),)))
    return pieces


def _fit(sentences: Sequence[str], pieces: Sequence[_Piece], limit: int) -> str:
    """The prose (cut at a sentence when it alone is too long), then whole pieces while they fit ``limit``."""
    paragraph = ""
    for sentence in sentences:
        grown = f"{paragraph} {sentence}".strip()
        if len(grown) > limit and paragraph:
            break
        paragraph = grown
    size = len(paragraph)
    lines: list[str] = [paragraph]
    listing = False
    for piece in pieces:
        joins = piece.listed and listing
        added = len(piece.lines[0]) + 2 if joins else sum(len(line) + 1 for line in piece.lines)
        if size + added > limit:
            break
        if joins:
            lines[-1] = f"{lines[-1]}, {piece.lines[0]}"
        else:
            lines += piece.lines
        listing = piece.listed
        size += added
    return "\n".join(lines).strip()


# ---------------------------------------------------------------------------------------
# The oracle
# ---------------------------------------------------------------------------------------

#: What a planted value looks like when the scenario does not list it (``TL-3FA9C2``): the oracle's shortcut.
VALUE_PATTERN: Final = re.compile(r"\b[A-Z]{2}-[0-9A-F]{6}\b")
_NUMBERED_ITEM: Final = re.compile(r"^\d+\. ")
_KEEP_WORDS: Final = re.compile(r"\b(requirement|correction|R\d+)\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class _Quote:
    """A value-bearing line of a tool result, with its table's heading rows if it is a table row."""

    line: str
    heading: tuple[str, ...] = ()
    block: tuple[int, int] | None = None


def _with_headings(quotes: Sequence[_Quote]) -> list[list[str]]:
    """The quoted lines as chunks; a table block's first kept row carries its heading rows.

    A heading that follows another table's row directly gets an empty line first, so
    the two tables stay apart for a Markdown reader.
    """
    chunks: list[list[str]] = []
    block: tuple[int, int] | None = None
    previous_row = False
    for quote in quotes:
        chunk = [quote.line]
        if quote.block is not None and quote.block != block:
            chunk = [*([""] if previous_row else []), *quote.heading, quote.line]
        chunks.append(chunk)
        block = quote.block
        previous_row = quote.block is not None
    return chunks


@dataclass(frozen=True, slots=True)
class OracleWriter:
    """The minimal, perfect writer of earlier figures (comparison only; see the module docstring).

    Attributes:
        values: The scenario's planted values (the oracle knows them).
        record_quality: Share of value lines a record keeps.
        summary_quality: Share of value lines a summary keeps.
        seed: Seeds which lines a lower quality drops.
    """

    values: tuple[str, ...] = ()
    record_quality: float = 1.0
    summary_quality: float = 1.0
    seed: int = 0

    def summary(
        self,
        items: Sequence[Source],
        max_tokens: int | None,
        key: str,
        *,
        named: int | None = None,
        values_only: bool = False,
    ) -> str:
        """An extractive summary: the value-bearing lines of the items, in order (it writes no prose anyway).

        Its first line says how many items it covers: a model rewrites its summary when its
        input changes, so re-summarising a summary with new turns gives new bytes even when
        the new turns add no value line.
        """
        lines: list[str] = []
        count = 0
        for item in items:
            for line in item.text.splitlines():
                count += bool(_NUMBERED_ITEM.match(line))
                if self._carries_value(line) or _KEEP_WORDS.search(line):
                    lines.append(line.strip())
        count = count if named is None else named
        kept = [line for line in lines if self._keeps(line, self.summary_quality, "summary")]
        title = (
            f"Summary of the earlier conversation ({count} items):" if count else "Summary of the earlier conversation:"
        )
        return _fit_whole(title, [[line] for line in kept], max_tokens)

    def record(self, results: Sequence[Source], max_tokens: int | None, key: str) -> str:
        """A record: value-bearing lines of every result, grouped by tool (table rows under their headings)."""
        # Which lines a lower quality drops is drawn afresh for each request (seeded by what the
        # request shows): asking again for an uncovered batch can recover them.
        attempt = f"record:{key}"
        by_tool: dict[str, list[_Quote]] = {}
        for number, result in enumerate(results):
            by_tool.setdefault(result.name or "tool", []).extend(self._quotes(result.text, number))
        chunks: list[list[str]] = []
        for name, quotes in by_tool.items():
            kept = [q for q in quotes if self._keeps(q.line, self.record_quality, attempt)]
            if kept:
                chunks += [[f"{name}:"], *_with_headings(kept)]
        return _fit_whole("Values from earlier tool results:", chunks, max_tokens)

    def _quotes(self, text: str, result: int) -> list[_Quote]:
        lines = text.splitlines()
        in_table: dict[int, tuple[tuple[str, str], tuple[int, int]]] = {}
        for number, table in enumerate(tables("\n".join(lines))):
            start = table.end - len(table.rows) - 2
            heading = (lines[start].strip(), lines[start + 1].strip())
            for index, _ in table.rows:
                in_table[index] = (heading, (result, number))
        quotes: list[_Quote] = []
        for index, line in enumerate(lines):
            if not self._carries_value(line):
                continue
            heading, block = in_table.get(index, ((), None))
            quotes.append(_Quote(line.strip(), heading, block))
        return quotes

    def _carries_value(self, line: str) -> bool:
        return bool(VALUE_PATTERN.search(line)) or any(v in line for v in self.values)

    def _keeps(self, line: str, quality: float, what: str) -> bool:
        if quality >= 1:
            return True
        value = hashlib.sha256(f"{self.seed}:{what}:{line}".encode()).digest()
        return int.from_bytes(value[:4], "big") / 2**32 < quality


def _fit_whole(title: str, chunks: Sequence[Sequence[str]], max_tokens: int | None) -> str:
    """``title`` and the chunks' lines, whole chunks only, within ``max_tokens``."""
    lines = [line for chunk in chunks for line in chunk]
    text = "\n".join([title, *lines])
    if max_tokens is not None and len(text) > max_tokens * CHARS_PER_TOKEN:
        limit = max_tokens * CHARS_PER_TOKEN
        out = [title]
        size = len(title)
        for chunk in chunks:
            grown = size + sum(len(line) + 1 for line in chunk)
            if grown > limit:
                break
            out += chunk
            size = grown
        text = "\n".join(out)
    return text
