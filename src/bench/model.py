"""The scripted model: deterministic, and it sees only the context it is sent.

:class:`ScriptedModel` answers one request from the request alone plus the scenario it
plays (turns, probes, summarizer requests, pinned record calls): ``docs/bench.md``,
"The scripted model".
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agent_framework import Content, Message

from ..core.tables import tables
from .scenario import RECALL_TOOL, Scenario, Turn

#: What a planted value looks like when the scenario does not list it (``TL-3FA9C2``).
VALUE_PATTERN: Final = re.compile(r"\b[A-Z]{2}-[0-9A-F]{6}\b")
_NUMBERED_ITEM: Final = re.compile(r"^\d+\. ")
_KEEP_WORDS: Final = re.compile(r"\b(requirement|correction|R\d+)\b", re.IGNORECASE)
#: Characters per token the model assumes when it sizes a summary or a record.
_CHARS_PER_TOKEN: Final = 4


@dataclass(frozen=True, slots=True)
class ModelOptions:
    """How well the scripted model writes records and summaries.

    Attributes:
        record_quality: Share of value lines a record keeps, in [0, 1].
        summary_quality: Share of value lines a summary keeps, in [0, 1].
        ignore_pin: Answer a pinned request as if it were not pinned.
        ignore_instruction: Answer a request that ends with an instruction to write a record
            (one asked over the cached prefix) as if the instruction were not there: the
            model carries on with the task.
        seed: Seeds which lines a lower quality drops.
    """

    record_quality: float = 1.0
    summary_quality: float = 1.0
    ignore_pin: bool = False
    ignore_instruction: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("record_quality", "summary_quality"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class _Quote:
    """A value-bearing line of a tool result, with its table's heading rows if it is a table row.

    Attributes:
        line: The line, stripped.
        heading: The table's heading row and separator row, or ``()`` outside a table.
        block: Identifies the table block (result, table), or ``None`` outside a table.
    """

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


def content_text(content: Content) -> str:
    """The text a model reads from one content part."""
    kind = content.type
    if kind in ("text", "text_reasoning"):
        return content.text or ""
    if kind == "function_call":
        arguments = content.arguments
        return arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True)
    if kind == "function_result":
        result = content.result
        if isinstance(result, str):
            return result
        if isinstance(result, list):
            return "\n".join(content_text(c) if isinstance(c, Content) else str(c) for c in result)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        return "" if result is None else str(result)
    return ""


def context_text(messages: Sequence[Message]) -> str:
    """Everything the model can read in ``messages``."""
    return "\n".join(content_text(c) for m in messages for c in m.contents)


def pinned_function(tool_choice: object) -> str | None:
    """The function a ``tool_choice`` requires, if it requires one."""
    if isinstance(tool_choice, Mapping):
        choice: Mapping[str, Any] = tool_choice  # pyright: ignore[reportUnknownVariableType]
        if choice.get("mode") == "required":
            name = choice.get("required_function_name")
            return name if isinstance(name, str) else None
    return None


#: What an instruction to write a record says (a model reads any instruction; the script
#: recognises this one, and answers it no better than a pinned request: the same knobs).
_RECORD_REQUEST: Final = re.compile(r"\bWrite a record of\b", re.IGNORECASE)


#: What an instruction to summarise named earlier messages says, and how it names them.
_SUMMARY_REQUEST: Final = re.compile(r"\bearlier messages of this conversation, named by their opening words\b")
_NAMED: Final = re.compile(r"^\d+\. \u00ab(.*)\u00bb$", re.MULTILINE)
#: How an instruction that asks for a record and a summary in one answer names the line between them.
_SECTION_LINE: Final = re.compile(r"\bwrite one line (\S+) and below it\b")


def asks_for_summary(message: Message) -> bool:
    """``message`` is a user message instructing the model to summarise earlier messages it names."""
    return message.role == "user" and bool(_SUMMARY_REQUEST.search(message.text or ""))


def _named_items(text: str) -> list[str]:
    """The opening words an instruction names its items by, in order."""
    return _NAMED.findall(text)


def asks_for_record(message: Message) -> bool:
    """``message`` is a user message instructing the model to write a record of earlier tool results."""
    return message.role == "user" and bool(_RECORD_REQUEST.search(message.text or ""))


class ScriptedModel:
    """Plays a scenario; see the module docstring for the rules.

    Args:
        scenario: The script.
        options: Record and summary quality.
    """

    def __init__(self, scenario: Scenario, options: ModelOptions | None = None) -> None:
        self.scenario = scenario
        self.options = options or ModelOptions()
        self._values = [f.value for f in scenario.facts]

    def respond(
        self,
        messages: Sequence[Message],
        *,
        tool_choice: object = None,
        max_tokens: int | None = None,
        summarizer: bool = False,
    ) -> Message:
        """The model's answer to one request."""
        if summarizer:
            return Message("assistant", [self.summary(messages, max_tokens)])
        if pinned_function(tool_choice) == RECALL_TOOL and not self.options.ignore_pin:
            return Message("assistant", [self._record_call(messages, max_tokens)])
        if messages and (asks_for_record(messages[-1]) or asks_for_summary(messages[-1])):
            if self.options.ignore_instruction:
                return self.respond(messages[:-1], tool_choice=tool_choice, max_tokens=max_tokens)
            if asks_for_summary(messages[-1]):
                # A model finds the messages the instruction names and summarises them, as well as
                # the summarizer would (the same quality knob).
                named = _named_items(messages[-1].text or "")
                items = [m for m in messages[:-1] if m.role == "user" and any(o in (m.text or "") for o in named)]
                summary = self.summary(items, max_tokens, named=len(named))
                section = _SECTION_LINE.search(messages[-1].text or "")
                if asks_for_record(messages[-1]) and section is not None:
                    # Asked for both: the record, then the section line the instruction names, then the summary.
                    record = self.record(messages[:-1], max_tokens)
                    return Message("assistant", [f"{record}\n{section.group(1)}\n{summary}"])
                return Message("assistant", [summary])
            # A model follows the instruction with what it can read: the record of every visible
            # tool result, as good as a pinned one (the same quality knob).
            return Message("assistant", [self.record(messages[:-1], max_tokens)])
        found = self._current_turn(messages)
        if found is None:
            return Message("assistant", ["Understood."])
        number, turn, start = found
        done = self._results_of_turn(messages[start:], number)
        if done < len(turn.calls) and tool_choice != "none":
            call = turn.calls[done]
            return Message(
                "assistant",
                [
                    Content.from_function_call(
                        call_id=f"call_{number}_{done}", name=call.name, arguments=dict(call.arguments)
                    )
                ],
            )
        if turn.probe is not None:
            others = [*messages[:start], *messages[start + 1 :]]  # the question itself shows no values
            return Message("assistant", [self.answer(others, turn.probe.expected)])
        return Message("assistant", [turn.reply or "Done."])

    # -- the pieces ------------------------------------------------------------------

    def answer(self, messages: Sequence[Message], expected: Sequence[str]) -> str:
        """Quote each expected value visible in ``messages``; name how many it cannot see."""
        text = context_text(messages)
        seen = [v for v in expected if v in text]
        missing = len(expected) - len(seen)
        answer = "Values: " + (", ".join(seen) if seen else "none visible") + "."
        return answer + (f" I cannot see {missing} of the values asked for." if missing else "")

    def summary(self, messages: Sequence[Message], max_tokens: int | None, *, named: int | None = None) -> str:
        """An extractive summary: the value-bearing lines of the transcript, in order.

        Its first line says how many numbered items it covers (``named`` when the items
        were named by an instruction rather than numbered in a transcript): a model
        rewrites its summary when its input changes, so re-summarising a summary with new
        turns gives new bytes even when the new turns add no value line.
        """
        lines: list[str] = []
        items = 0
        for message in messages:
            if message.role == "system":
                continue  # the summarizer's own instructions
            for line in context_text([message]).splitlines():
                items += bool(_NUMBERED_ITEM.match(line))
                if self._carries_value(line) or _KEEP_WORDS.search(line):
                    lines.append(line.strip())
        items = items if named is None else named
        kept = [line for line in lines if self._keeps(line, self.options.summary_quality, "summary")]
        title = (
            f"Summary of the earlier conversation ({items} items):" if items else "Summary of the earlier conversation:"
        )
        return self._fit(title, [[line] for line in kept], max_tokens)

    def record(self, messages: Sequence[Message], max_tokens: int | None = None) -> str:
        """A record: value-bearing lines of every visible tool result, grouped by tool.

        A kept Markdown table row is written under its table's heading row and separator
        row, once per table block and in the original order, so the record quotes the row
        verbatim under the same column headings; a heading is written only with a row.
        """
        # Which lines a lower quality drops is drawn afresh for each request (seeded by
        # what the request shows): a model does not forget the same lines every time, so
        # asking again for an uncovered batch can recover them.
        attempt = "record:" + hashlib.sha256(context_text(messages).encode()).hexdigest()[:16]
        names = {c.call_id: c.name for m in messages for c in m.contents if c.type == "function_call"}
        results = [c for m in messages for c in m.contents if c.type == "function_result"]
        by_tool: dict[str, list[_Quote]] = {}
        for number, content in enumerate(results):
            name = names.get(content.call_id) or "tool"
            if name != RECALL_TOOL:
                by_tool.setdefault(name, []).extend(self._quotes(content_text(content), number))
        chunks: list[list[str]] = []
        for name, quotes in by_tool.items():
            kept = [q for q in quotes if self._keeps(q.line, self.options.record_quality, attempt)]
            if kept:
                chunks += [[f"{name}:"], *_with_headings(kept)]
        return self._fit("Values from earlier tool results:", chunks, max_tokens)

    def _quotes(self, text: str, result: int) -> list[_Quote]:
        """The value-bearing lines of one tool result; table rows with their table's heading."""
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

    def _record_call(self, messages: Sequence[Message], max_tokens: int | None) -> Content:
        # The id depends on what the record quotes and which results it read, not on how the
        # request was framed (instructions as a system message on the wire, as an option in process).
        values = self.record(messages, max_tokens)
        read = [c.call_id or "" for m in messages for c in m.contents if c.type == "function_result"]
        digest = hashlib.sha256("\n".join([values, *read]).encode()).hexdigest()[:12]
        return Content.from_function_call(
            call_id=f"call_recall_{digest}", name=RECALL_TOOL, arguments={"values": values}
        )

    def _carries_value(self, line: str) -> bool:
        return bool(VALUE_PATTERN.search(line)) or any(v in line for v in self._values)

    def _keeps(self, line: str, quality: float, what: str) -> bool:
        """Whether a record or summary of ``quality`` keeps ``line`` (seeded, so the same every time)."""
        if quality >= 1:
            return True
        digest = hashlib.sha256(f"{self.options.seed}:{what}:{line}".encode()).digest()
        return int.from_bytes(digest[:4], "big") / 2**32 < quality

    @staticmethod
    def _fit(title: str, chunks: Sequence[Sequence[str]], max_tokens: int | None) -> str:
        """``title`` and the chunks' lines, whole chunks only, within ``max_tokens``."""
        lines = [line for chunk in chunks for line in chunk]
        text = "\n".join([title, *lines])
        if max_tokens is not None and len(text) > max_tokens * _CHARS_PER_TOKEN:
            limit = max_tokens * _CHARS_PER_TOKEN
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

    def _current_turn(self, messages: Sequence[Message]) -> tuple[int, Turn, int] | None:
        """(turn number, turn, index of its user message) of the newest scenario turn in context."""
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if message.role != "user":
                continue
            turn = self.scenario.turn_for(message.text)
            if turn is not None:
                return self.scenario.turns.index(turn) + 1, turn, index
        return None

    @staticmethod
    def _results_of_turn(messages: Sequence[Message], number: int) -> int:
        """How many of the turn's scripted calls are done: one past the latest step whose result it sees.

        The latest, not a count: a strategy may hide an earlier result of the same turn while
        the tool loop still runs, and the model should not redo a step it has moved past.
        """
        prefix = f"call_{number}_"
        done = 0
        for message in messages:
            for content in message.contents:
                call_id = content.call_id or ""
                if content.type == "function_result" and call_id.startswith(prefix):
                    step = call_id[len(prefix) :]
                    if step.isdigit():
                        done = max(done, int(step) + 1)
        return done
