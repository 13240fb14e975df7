"""The break-cause tables of ``docs/wire-cache.md``: every break of a few rows, by cause, on both real clients.

``python -m maf_compaction.bench.breaks`` prints the tables of that page (the cells it runs are
listed in :data:`DOC_ROWS` and :data:`DOC_CLIENTS`); ``--write``, run from the repository root,
regenerates them in place. How a break is attributed: :mod:`.causes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .causes import Break, break_cause, tally
from .runner import Cell, Settings, play_cell

__all__ = ["DOC_CLIENTS", "DOC_FILL", "DOC_ROWS", "DOC_SEED", "Break", "break_cause", "main", "tables", "tally"]

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
