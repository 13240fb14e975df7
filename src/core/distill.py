"""Distilling a tool result to the lines that carry its distinctive values.

The safety net under the records: when a tool group must leave the prompt and no
record covers it (the model ignored the pin, a request failed, a record came back
incomplete), the facts need not go with it. A result's facts are its distinctive
values (:mod:`.values`: the identifiers, codes, versions and dates a paraphrase cannot
keep), and in the results agents read they sit on a few lines among many. So the
result is cut to those lines, verbatim and in order, under one marker line that says
how many lines were left out. No model is asked, so it cannot be refused or ignored.

The rule reads only the text, so it gives the same bytes on every pass and on every
copy of the conversation. A distilled text starts with the marker and is never
distilled again. The text's first line stays as its title (what the result is), and
a Markdown table keeps its heading and separator rows above any row it keeps, so a
kept row still reads under its column names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Final

from .model import MessageRecord
from .tables import tables
from .values import distinctive_values

MARKER_TEMPLATE: Final = (
    "[compacted: {left:,} line(s) of this result without distinctive values were left out; "
    "the {kept:,} below are kept verbatim and in order]"
)
REMNANT_TEMPLATE: Final = (
    "[compacted: the compaction record quotes this result's other values; kept here, verbatim and in order, "
    "the {kept:,} line(s) with values it does not quote; {left:,} other line(s) were left out]"
)


def _pattern(template: str) -> re.Pattern[str]:
    """The marker lines ``template`` makes, whatever its counts."""
    count = r"[\d,]+"
    return re.compile(re.escape(template).replace(re.escape("{left:,}"), count).replace(re.escape("{kept:,}"), count))


_MARKER: Final = _pattern(MARKER_TEMPLATE)
_REMNANT: Final = _pattern(REMNANT_TEMPLATE)


def is_remnant(text: str) -> bool:
    """``text`` starts with the remnant marker line (see :func:`remnant`)."""
    return _REMNANT.fullmatch(text.split("\n", 1)[0]) is not None


def is_distilled(text: str) -> bool:
    """``text`` starts with the distillation marker line."""
    return _MARKER.fullmatch(text.split("\n", 1)[0]) is not None


def distill(text: str) -> str:
    """``text`` cut to its title line and the lines with distinctive values, under a marker.

    Returns ``text`` itself (the same object) when it is already distilled or a remnant
    (:func:`remnant`), or when no line would be left out. Every distinctive value of ``text`` is still in the result
    (a value lies within one line), and the kept lines keep their order and bytes.
    """
    if is_distilled(text) or is_remnant(text):  # a remnant is already cut to values no record quotes
        return text
    return _cut(text, lambda line: bool(distinctive_values(line)), MARKER_TEMPLATE)


def remnant(text: str, quoted: Collection[str]) -> str:
    """What stays of a result the records cover in part: its title line and the lines with a value they do not quote.

    A record that quotes ``coverage_share`` of a group's values covers it, and the group
    leaves the prompt; the values it does not quote would leave with it. This keeps them,
    verbatim, under a marker. Returns ``text`` itself when no line would be left out.
    """
    return _cut(text, lambda line: any(v not in quoted for v in distinctive_values(line)), REMNANT_TEMPLATE)


def _cut(text: str, wanted: Callable[[str], bool], template: str) -> str:
    lines = text.split("\n")
    keep = {index for index, line in enumerate(lines) if wanted(line)}
    title = next((index for index, line in enumerate(lines) if line.strip()), None)
    if title is not None:
        keep.add(title)
    for table in tables(text):
        if any(index in keep for index, _ in table.rows):
            heading = table.end - len(table.rows) - 2
            keep.update((heading, heading + 1))
    left = sum(1 for index, line in enumerate(lines) if index not in keep and line.strip())
    if not left:
        return text
    kept = [lines[index] for index in sorted(keep)]
    return "\n".join([template.format(kept=len(kept), left=left), *kept])


def newly_distilled(before: Sequence[MessageRecord], after: Iterable[MessageRecord]) -> list[int]:
    """Origins (indices into ``before``) of the included results a pass distilled, for the shell to name."""
    return [
        r.origin
        for r in after
        if r.origin is not None and not r.excluded and _distilled(r) and not _distilled(before[r.origin])
    ]


def _distilled(record: MessageRecord) -> bool:
    return any(p.kind == "function_result" and is_distilled(p.text) for p in record.parts)
