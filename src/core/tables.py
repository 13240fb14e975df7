"""Markdown table rows in tool results, and the partial record that releases them.

A large result often carries its values in a pipe-delimited table. When the record
quotes a row verbatim under the same column headings, that row can leave the result
without losing anything, while the rest of the result stays. The rules are strict,
because a wrong release loses a fact silently:

- only rows of a table (a heading row, a separator row, then body rows of the same
  width) outside code fences count, in the result and in the record alike;
- a row qualifies only if it holds a distinctive value, contains no backslash, and the
  record holds the same cells under the same headings (a changed row does not qualify);
- a row that occurs more than once under the same headings anywhere in the loaded tool
  results stays: its source is ambiguous;
- headings and every other row stay, and one marker line after the table names the
  omitted rows by their distinctive values, so the result's set of values is unchanged
  and coverage reads the same before and after the release.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Final

from .values import distinctive_values

#: Starts the line that replaces released rows; the entries name each row's values.
PARTIAL_MARKER_PREFIX: Final = "[compaction: table rows omitted here, quoted verbatim in the compaction record: "
PARTIAL_MARKER_SUFFIX: Final = "]"
_ENTRY_SEPARATOR: Final = "; "

_SEPARATOR_CELL: Final = re.compile(r":?-+:?")
_FENCE: Final = ("```", "~~~")

Cells = tuple[str, ...]
RowKey = tuple[Cells, Cells]
"""A row's identity: (its table's heading cells, its own cells)."""


@dataclass(frozen=True, slots=True)
class Table:
    """One Markdown table found in a text.

    Attributes:
        heading: The heading cells, stripped.
        rows: ``(line index, cells)`` of each body row, in order.
        end: Index of the line after the table's last row.
    """

    heading: Cells
    rows: tuple[tuple[int, Cells], ...]
    end: int


def cells(line: str) -> Cells | None:
    """The cells of a pipe-delimited row, or ``None`` if ``line`` is not one."""
    stripped = line.strip()
    if len(stripped) < 2 or not stripped.startswith("|") or not stripped.endswith("|"):
        return None
    return tuple(cell.strip() for cell in stripped[1:-1].split("|"))


def _is_separator(line: str, width: int) -> bool:
    found = cells(line)
    return found is not None and len(found) == width and all(_SEPARATOR_CELL.fullmatch(c) for c in found)


def tables(text: str) -> list[Table]:
    """Every table of ``text`` outside code fences, in order."""
    lines = text.split("\n")
    found: list[Table] = []
    fenced = False
    end = 0  # the line after the last table found
    for index, line in enumerate(lines):
        if line.lstrip().startswith(_FENCE):  # a fence line is never a row
            fenced = not fenced
        heading = None if fenced or index < end else cells(line)
        if heading is None or index + 1 >= len(lines) or not _is_separator(lines[index + 1], len(heading)):
            continue
        rows: list[tuple[int, Cells]] = []
        end = index + 2
        while end < len(lines) and (row := cells(lines[end])) is not None and len(row) == len(heading):
            rows.append((end, row))
            end += 1
        found.append(Table(heading=heading, rows=tuple(rows), end=end))
    return found


def row_keys(text: str) -> list[RowKey]:
    """``(heading, cells)`` of every body row of every table in ``text``."""
    return [(table.heading, row) for table in tables(text) for _, row in table.rows]


def repeated_rows(texts: Iterable[str]) -> frozenset[RowKey]:
    """Rows that occur more than once, under the same headings, across ``texts``."""
    seen: set[RowKey] = set()
    repeated: set[RowKey] = set()
    for text in texts:
        for key in row_keys(text):
            (repeated if key in seen else seen).add(key)
    return frozenset(repeated)


def release_rows(text: str, quoted: Collection[RowKey], ambiguous: Collection[RowKey]) -> tuple[str, int]:
    """``text`` without the rows a record quotes verbatim; returns (text, rows released).

    Returns ``text`` itself (the same object) when nothing qualifies, so an unchanged
    result keeps its identity.
    """
    lines = text.split("\n")
    dropped: set[int] = set()
    markers: dict[int, list[str]] = {}
    for table in tables(text):
        entries: list[str] = []
        for line_index, row in table.rows:
            key = (table.heading, row)
            if key not in quoted or key in ambiguous or "\\" in lines[line_index]:
                continue
            values = distinctive_values(" | ".join(row))
            if values:
                dropped.add(line_index)
                entries.append(" ".join(values))
        if entries:
            markers[table.end] = entries
    if not dropped:
        return text, 0
    output: list[str] = []
    for index, line in enumerate(lines):
        entries = markers.pop(index, [])
        existing = _marker_entries(line) if entries else None  # an earlier release left a marker here: extend it
        if entries:
            output.append(_marker([*(existing or []), *entries]))
        if index not in dropped and existing is None:
            output.append(line)
    output.extend(_marker(entries) for entries in markers.values())  # tables that end the text
    return "\n".join(output), len(dropped)


def _marker(entries: list[str]) -> str:
    return PARTIAL_MARKER_PREFIX + _ENTRY_SEPARATOR.join(entries) + PARTIAL_MARKER_SUFFIX


def _marker_entries(line: str) -> list[str] | None:
    if not line.startswith(PARTIAL_MARKER_PREFIX) or not line.endswith(PARTIAL_MARKER_SUFFIX):
        return None
    body = line[len(PARTIAL_MARKER_PREFIX) : -len(PARTIAL_MARKER_SUFFIX)]
    return body.split(_ENTRY_SEPARATOR) if body else []
