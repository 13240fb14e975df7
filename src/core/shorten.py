"""Shortening a tool result to a token budget: keep its head and its tail.

The cut leaves an exact marker line between the two ends, so a shortened text is
recognised and never shortened again (idempotence: the same bytes on every later
pass, whichever list it runs on). Cuts snap to line boundaries when one is near, so a
``code_7=TL-3FA9C2`` line is kept whole or dropped whole, never split.
"""

from __future__ import annotations

import re

from .counting import Measure

MARKER_TEMPLATE = "\n[... removed by compaction: {removed:,} characters]\n"
_MARKER_RE = re.compile(r"\n\[\.\.\. removed by compaction: [\d,]+ characters\]\n")

#: Refinement passes when converting a token target into a character count.
_FIT_PASSES = 4
#: A cut within this many percent under its token target is accepted without refining (sparing tokenizer passes).
_FIT_SLACK_PERCENT = 3
#: A cut moves back to a line boundary found within this share of the slice.
_SNAP_SHARE = 0.2


def is_shortened(text: str) -> bool:
    """The text already carries our marker line."""
    return _MARKER_RE.search(text) is not None


def shorten(text: str, budget: int, measure: Measure, tokens: int | None = None) -> str:
    """Return ``text`` cut to about ``budget`` tokens, head and tail kept.

    ``tokens`` is ``measure(text)`` when the caller already knows it. The text is
    returned unchanged when it fits, when it is already shortened, when the budget is
    negative, or when cutting would not make it smaller (the marker costs tokens too).
    A budget of 0 keeps only the marker line.
    """
    if budget < 0:
        return text
    total = measure(text) if tokens is None else tokens
    if total <= budget or is_shortened(text):
        return text
    head_end = _fit_head(text, budget // 2, total, measure)
    tail_start = _fit_tail(text, budget - budget // 2, total, measure, floor=head_end)
    removed = tail_start - head_end
    if removed <= 0:
        return text
    result = text[:head_end] + MARKER_TEMPLATE.format(removed=removed) + text[tail_start:]
    return result if measure(result) < total else text


def _fit_head(text: str, target: int, total: int, measure: Measure) -> int:
    """Largest prefix length (found in a few passes) whose tokens stay within ``target``."""
    if target <= 0:
        return 0
    best = 0
    guess = max(1, len(text) * target // max(total, 1))
    for _ in range(_FIT_PASSES):
        guess = min(guess, len(text))
        used = measure(text[:guess])
        if used <= target:
            best = max(best, guess)
            if used >= target - target * _FIT_SLACK_PERCENT // 100 or guess == len(text):
                break
            guess = guess * target // max(used, 1) if used else guess * 2
            if guess <= best:
                break
        else:
            guess = guess * target // used
    return _snap_back(text, best)


def _fit_tail(text: str, target: int, total: int, measure: Measure, *, floor: int) -> int:
    """Smallest start index (found in a few passes) whose suffix stays within ``target``."""
    length = len(text)
    if target <= 0:
        return length
    best = length
    size = max(1, length * target // max(total, 1))
    for _ in range(_FIT_PASSES):
        size = min(size, length - floor)
        if size <= 0:
            break
        used = measure(text[length - size :])
        if used <= target:
            best = min(best, length - size)
            if used >= target - target * _FIT_SLACK_PERCENT // 100 or length - size == floor:
                break
            grown = size * target // max(used, 1) if used else size * 2
            if grown <= size:
                break
            size = grown
        else:
            size = size * target // used
    return _snap_forward(text, best, floor)


def _snap_back(text: str, end: int) -> int:
    """Move a head cut back to just after a newline, if one is close."""
    if end <= 0 or end >= len(text):
        return end
    newline = text.rfind("\n", end - max(1, int(end * _SNAP_SHARE)), end)
    return newline + 1 if newline >= 0 else end


def _snap_forward(text: str, start: int, floor: int) -> int:
    """Move a tail cut forward to just after a newline, if one is close."""
    length = len(text)
    if start >= length or start <= floor:
        return start
    newline = text.find("\n", start, start + max(1, int((length - start) * _SNAP_SHARE)))
    return newline + 1 if newline >= 0 else start
