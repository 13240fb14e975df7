"""Where a prefix break comes from: the first element in which a request stops extending the previous one.

A model call *breaks* when its canonical request (:class:`~.rendering.RenderedRequest`, the value
both the in-process client and the loopback server price) does not start with the previous
model request of the conversation (``SimulatedProvider`` flags it). :func:`break_cause` names the
first element that differs, in the cache's order: a head field (``tool_choice``...), the tool
declarations, the instructions, then the first message that differs and how (a participant
``name``, opaque reasoning state, messages dropped, inserted or rewritten). The loopback
cases and who can fix each: ``docs/wire-cache.md``.

``python -m maf_compaction.bench.breaks`` prints the tables of that page (the cells it runs
are listed in :data:`DOC_ROWS` and :data:`DOC_CLIENTS`); ``--write``, run from the repository
root, regenerates them in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .rendering import OPAQUE_MARKER, RenderedRequest, common_prefix

#: A message entry's role line, with the participant ``name`` a Chat request may carry.
_ROLE_LINE: Final = re.compile(r"\A<\|(\w+)(?: name=([^|]*))?\|>")
#: The rows, clients and cell ``docs/wire-cache.md`` tabulates.
DOC_ROWS: Final = (
    "none",
    "context_window",
    "tool_summary_anchored",
    "tool_summary_anchored_pinned",
    "tool_and_user_summary_anchored",
    "tool_and_user_summary_anchored_pinned",
)
DOC_CLIENTS: Final = ("openai-chat", "openai-responses")
DOC_FILL: Final = 1.5
DOC_SEED: Final = 1


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


# ---------------------------------------------------------------------------------------
# The tables of docs/wire-cache.md
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RowCauses:
    """One row's breaks by cause, with its cost and cached share (a column of :func:`causes_table`)."""

    row: str
    causes: Mapping[str, int]
    cost: float
    hit: float
    pinned_cost: float = 0.0


def causes_table(columns: Sequence[RowCauses]) -> list[str]:
    """Markdown lines: one column per row, one line per cause, then the breaks, the cost and the hit rate."""
    labels = sorted({label for column in columns for label in column.causes})
    lines = ["| cause | " + " | ".join(c.row for c in columns) + " |", "|---|" + "---:|" * len(columns)]
    lines += [f"| {label} | " + " | ".join(str(c.causes.get(label, 0)) for c in columns) + " |" for label in labels]
    lines.append("| **breaks** | " + " | ".join(f"**{sum(c.causes.values())}**" for c in columns) + " |")
    lines.append("| cost $ | " + " | ".join(f"{c.cost:.4f}" for c in columns) + " |")
    lines.append("| of it: pinned calls $ | " + " | ".join(f"{c.pinned_cost:.4f}" for c in columns) + " |")
    lines.append("| hit% | " + " | ".join(f"{100 * c.hit:.1f}" for c in columns) + " |")
    return lines


@contextlib.contextmanager
def named_loop_messages() -> Iterator[None]:
    """The framework fix ``docs/wire-cache.md`` proposes, as a patch for the length of the block.

    The per-service-call history middleware persists each model call's answer as it comes;
    the agent names its answers (``author_name``) only when the run ends, so the tool loop
    sends its own assistant messages without the name the next turn replays. Patched, the
    answer is named as the agent will name it before it is persisted.
    """
    from agent_framework._sessions import (  # noqa: PLC0415
        PerServiceCallHistoryPersistingMiddleware as Persisting,  # pyright: ignore[reportPrivateUsage]
    )

    original = Persisting._persist_service_call_response  # pyright: ignore[reportPrivateUsage]

    async def persist(self: Any, *, service_call_context: Any, response: Any) -> None:
        for message in response.messages:
            if message.role == "assistant" and message.author_name is None:
                message.author_name = self._agent._get_agent_name()
        await original(self, service_call_context=service_call_context, response=response)

    Persisting._persist_service_call_response = persist  # pyright: ignore[reportPrivateUsage]
    try:
        yield
    finally:
        Persisting._persist_service_call_response = original  # pyright: ignore[reportPrivateUsage]


async def _doc_columns(client: str) -> list[RowCauses]:
    from .runner import Cell, Settings, play_cell  # noqa: PLC0415 (the runner imports the provider, which imports us)

    settings = Settings(client=client)  # pyright: ignore[reportArgumentType]
    columns: list[RowCauses] = []
    for row in DOC_ROWS:
        result, _ = await play_cell(Cell(row, DOC_FILL, DOC_SEED), settings)
        columns.append(RowCauses(row, result.break_causes, result.cost, result.hit, result.pinned_cost))
    return columns


def tables(*, named: bool = False) -> str:
    """The break-cause tables of ``docs/wire-cache.md``, one per client (``named``: with the framework fix)."""
    parts: list[str] = []
    for client in DOC_CLIENTS:
        with named_loop_messages() if named else contextlib.nullcontext():
            columns = asyncio.run(_doc_columns(client))
        parts.append(f"`--client {client}`, fill {DOC_FILL:g}, seed {DOC_SEED}, 32K window, `--cache openai`:\n")
        parts.append("\n".join(causes_table(columns)) + "\n")
    return "\n".join(parts)


def regions(text: str) -> list[tuple[str, int, int]]:
    """The ``<!-- breaks:NAME -->`` ... ``<!-- /breaks -->`` regions of ``text``: name, body start, body end."""
    found: list[tuple[str, int, int]] = []
    for opening in re.finditer(r"<!-- breaks:(\w+) -->\n", text):
        end = text.index("<!-- /breaks -->", opening.end())
        found.append((opening.group(1), opening.end(), end))
    return found


def render_page(text: str) -> str:
    """``text`` (``docs/wire-cache.md``) with its ``wire`` and ``named`` regions regenerated."""
    rendered = {"wire": tables(), "named": tables(named=True)}
    for name, start, end in reversed(regions(text)):
        text = text[:start] + rendered[name] + text[end:]
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Print the break-cause tables of ``docs/wire-cache.md``; ``--write`` regenerates them in that page.

    ``--named-loop-messages`` prints them under :func:`named_loop_messages` (the proposed framework fix).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if "--write" in args:
        page = Path("docs/wire-cache.md")
        page.write_text(render_page(page.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"wrote {page}")
        return 0
    print(tables(named="--named-loop-messages" in args), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
