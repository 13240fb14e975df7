"""Where a prefix break comes from: the first element in which a request stops extending the previous one.

A model call *breaks* when its canonical request (:class:`~.rendering.RenderedRequest`, the value
both the in-process client and the loopback server price) does not start with the previous
model request of the conversation (``SimulatedProvider`` flags it). :func:`break_cause` names the
first element that differs, in the cache's order: a head field (``tool_choice``...), the tool
declarations, the instructions, then the first message that differs and how (a participant
``name``, opaque reasoning state, messages dropped, inserted or rewritten). The loopback
cases and who can fix each: ``docs/wire-cache.md``.

The tables of that page come from :mod:`.breaks`, which runs cells; this module runs nothing (the
simulated provider calls it on every request).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from .rendering import OPAQUE_MARKER, RenderedRequest, common_prefix

#: A message entry's role line, with the participant ``name`` a Chat request may carry.
_ROLE_LINE: Final = re.compile(r"\A<\|(\w+)(?: name=([^|]*))?\|>")


@dataclass(frozen=True, slots=True)
class Break:
    """The first difference between a request and the previous one.

    Attributes:
        element: ``"head <field>"``, ``"tools"``, ``"instructions"`` or ``"message"``.
        cause: What differs, without positions (the key the tables count by).
        index: The first differing message's index (for a head, tools or instructions break, the
            messages' own first difference, if any; ``None`` when they extend).
        then: For a head, tools or instructions break, what differs in the messages too
            (``None`` when they extend the previous messages): the break the head hides.
    """

    element: str
    cause: str
    index: int | None = None
    then: str | None = None

    @property
    def label(self) -> str:
        """``element: cause`` (and the messages' own cause), the key :func:`tally` counts."""
        if self.element == "message":
            return self.cause
        return f"{self.element}: {self.cause}" + (f", and {self.then}" if self.then else "")

    def __str__(self) -> str:
        if self.element == "message":
            return f"message {self.index}: {self.cause}"
        return self.element + f": {self.cause}" + (f" + message {self.index}: {self.then}" if self.then else "")


def _role(entry: str) -> tuple[str, str | None]:
    """An entry's role and participant name (``("reasoning", None)`` for opaque reasoning alone)."""
    found = _ROLE_LINE.match(entry)
    if found is None:
        return ("reasoning" if OPAQUE_MARKER.search(entry) else "item"), None
    return found.group(1), found.group(2)


def _unnamed(entry: str) -> str:
    return _ROLE_LINE.sub(lambda m: f"<|{m.group(1)}|>", entry, count=1)


def _tool_choice(value: str | None) -> str:
    if value is None:
        return "auto"
    found = re.search(r'"required_function_name":"([^"]+)"', value)
    return f"pinned to {found.group(1)}" if found else value


def _message_cause(previous: Sequence[str], current: Sequence[str], index: int) -> str:
    """What makes ``current`` leave ``previous`` at message ``index`` (``previous[index]`` exists)."""
    before = previous[index]
    if index >= len(current):
        return "trailing messages dropped"
    now = current[index]
    (role, old_name), (_, new_name) = _role(before), _role(now)
    if _unnamed(before) == _unnamed(now) and old_name != new_name:
        change = "added" if old_name is None else "removed" if new_name is None else "changed"
        return f"{role} message: participant name {change}"
    if before not in current[index:] and now in previous[index + 1 :]:
        return "messages dropped"
    if now not in previous and before in current[index + 1 :]:
        return f"{_role(now)[0]} message inserted"
    if OPAQUE_MARKER.sub("", before) == OPAQUE_MARKER.sub("", now):
        return f"{role} message: opaque reasoning state changed"
    return f"{role} message replaced"


def break_cause(
    previous: RenderedRequest, current: RenderedRequest, *, ignore_head: Iterable[str] = ()
) -> Break | None:
    """The first element in which ``current`` stops extending ``previous``; ``None`` when it extends it.

    Head fields come first (in name order; ``ignore_head`` leaves some out, as a cache rule
    that does not key on them does), then the tool declarations, the instructions and the
    messages. A request that is ``previous`` with messages appended (or ``previous`` itself)
    extends it.
    """
    index = common_prefix(previous.messages, current.messages)
    then = _message_cause(previous.messages, current.messages, index) if index < len(previous.messages) else None
    found = _head_cause(previous, current, frozenset(ignore_head))
    if found is not None:
        return Break(*found, index=index if then else None, then=then)
    return None if then is None else Break("message", then, index)


def _head_cause(previous: RenderedRequest, current: RenderedRequest, ignored: frozenset[str]) -> tuple[str, str] | None:
    """The first head field, tool declaration or instruction change, as ``(element, cause)``."""
    old_head, new_head = dict(previous.head), dict(current.head)
    for name in sorted((set(old_head) | set(new_head)) - ignored):
        old, new = old_head.get(name), new_head.get(name)
        if old != new:
            if name == "tool_choice":
                return f"head {name}", f"{_tool_choice(old)} -> {_tool_choice(new)}"
            return f"head {name}", f"{old} -> {new}"
    if previous.tools != current.tools:
        return "tools", "tool declarations changed"
    if previous.instructions != current.instructions:
        return "instructions", "instructions changed"
    return None


def tally(breaks: Iterable[Break | None]) -> dict[str, int]:
    """How many breaks each :attr:`Break.label` accounts for, most frequent first (``None`` entries skipped)."""
    counts = Counter(b.label for b in breaks if b is not None)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
