"""The scripted model: deterministic, and it sees only the context it is sent.

:class:`ScriptedModel` plays a scenario's turns (tool calls, replies, probe answers) and answers
compaction requests, which it tells from task turns by their *place*, never by their wording
(``docs/bench.md``, "The scripted model"):

- a request on the summarizer route, or one whose only message (but system ones) is not a scenario
  turn, is a summary of the numbered items its user message holds;
- a request whose ``tool_choice`` forces the recall tool asks for a record (a pinned record);
- a request that ends with a user message that is not one of the scenario's turns ends with an
  instruction. An instruction that quotes the opening words of earlier user messages asks for a
  summary of them; one that also names a section line (a bracketed word, ``[summary]``) asks for
  a record of the visible tool results, that line, then the summary; any other asks for a record.

What it writes is its :class:`~.writer.Writer`'s: the plausible writer by default, the oracle of
earlier figures with ``ModelOptions(model="oracle")``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Final, Literal, TypeAlias, get_args

from agent_framework import Content, Message

from .provider import TASK
from .scenario import RECALL_TOOL, Scenario, Turn
from .writer import CHARS_PER_TOKEN, Losses, OracleWriter, PlausibleWriter, Source, Writer, digest

ModelKind: TypeAlias = Literal["plausible", "oracle"]
MODEL_KINDS: Final[tuple[ModelKind, ...]] = get_args(ModelKind)
#: Reasoning tokens the plausible model spends (and bills as output) on every call: a short think.
DEFAULT_REASONING_TOKENS: Final = 256


@dataclass(frozen=True, slots=True)
class ModelKnobs:
    """Which model answers, how well it writes records and summaries, and what it spends (the bench's settings
    carry them too, one per cell).

    Attributes:
        model: ``"plausible"`` (the default: prose, a generic value rule, an answer length,
            losses) or ``"oracle"`` (the minimal, perfect writer of earlier figures).
        record_quality: Share of values a record keeps, in [0, 1].
        summary_quality: Share of values a summary keeps, in [0, 1].
        ignore_pin: Answer a pinned request as if it were not pinned.
        ignore_instruction: Answer a request that ends with a compaction instruction as if the
            instruction were not there: the model carries on with the task.
        prose_tokens: Plausible model: the range of prose tokens per message a record or summary covers.
        answer_tokens: Plausible model: the longest record or summary it writes.
        drop_requirements: Plausible model: chance a summary leaves a requirement line out.
        miscopy: Plausible model: chance a copied value has one character changed.
        partial_records: Plausible model: chance a record covers only half of what it was asked about.
        reasoning_tokens: Reasoning tokens billed as output on every call (``None``: 256 for the
            plausible model, 0 for the oracle).
    """

    model: ModelKind = "plausible"
    record_quality: float = 1.0
    summary_quality: float = 1.0
    ignore_pin: bool = False
    ignore_instruction: bool = False
    prose_tokens: tuple[int, int] = (30, 60)
    answer_tokens: int = 1_500
    drop_requirements: float = 0.05
    miscopy: float = 0.01
    partial_records: float = 0.05
    reasoning_tokens: int | None = None

    def knobs(self) -> dict[str, Any]:
        """The knobs as keyword arguments (for :class:`ModelOptions`)."""
        return {f.name: getattr(self, f.name) for f in fields(ModelKnobs)}


@dataclass(frozen=True, slots=True)
class ModelOptions(ModelKnobs):
    """:class:`ModelKnobs` for one conversation, with the seed that draws what the model loses; validated.

    Attributes:
        seed: Seeds every draw.
    """

    seed: int = 0

    def __post_init__(self) -> None:
        if self.model not in MODEL_KINDS:
            raise ValueError(f"model must be one of {', '.join(MODEL_KINDS)}, got {self.model!r}")
        if self.reasoning_tokens is not None and self.reasoning_tokens < 0:
            raise ValueError(f"reasoning_tokens must be >= 0, got {self.reasoning_tokens}")
        self.writer()  # validates the writer's knobs

    def without_losses(self) -> ModelOptions:
        """These options with no drawn loss: no requirement left out, no value mis-copied, every record whole."""
        return replace(self, drop_requirements=0.0, miscopy=0.0, partial_records=0.0)

    @property
    def reasoning(self) -> int:
        """Reasoning tokens per call."""
        if self.reasoning_tokens is not None:
            return self.reasoning_tokens
        return DEFAULT_REASONING_TOKENS if self.model == "plausible" else 0

    def writer(self, values: Sequence[str] = ()) -> Writer:
        """The writer these options describe (``values``: the planted values, which only the oracle reads)."""
        if self.model == "oracle":
            for name in ("record_quality", "summary_quality"):
                if not 0 <= getattr(self, name) <= 1:
                    raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
            return OracleWriter(tuple(values), self.record_quality, self.summary_quality, self.seed)
        losses = Losses(
            drop_requirements=self.drop_requirements,
            miscopy=self.miscopy,
            partial_records=self.partial_records,
            record_quality=self.record_quality,
            summary_quality=self.summary_quality,
        )
        return PlausibleWriter(self.seed, self.prose_tokens, self.answer_tokens, losses)


_logger = logging.getLogger("maf_compaction.bench")


@dataclass(frozen=True, slots=True)
class Reply:
    """The model's answer to one request, and what it took the request for.

    Attributes:
        message: The answer.
        label: :data:`~.provider.TASK`, or the compaction request it answered (``record``,
            ``summary``, ``record+summary``, ``merge``, ``rewrite``, ``fold``).
        instruction: The request ended with a compaction instruction (over the cached prefix).
        reasoning_tokens: Reasoning it spent, billed as output.
    """

    message: Message
    label: str = TASK
    instruction: bool = False
    reasoning_tokens: int = 0


def content_text(content: Content) -> str:
    """The text a model reads from one content part."""
    kind = content.type
    if kind in ("text", "text_reasoning"):
        return content.text or ""
    if kind == "function_call":
        arguments = content.arguments
        # As a provider sends them: JSON, non-ASCII as written (a record's values are the recall call's).
        return arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True, ensure_ascii=False)
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


def tool_results(messages: Sequence[Message]) -> list[Source]:
    """The tool results ``messages`` show (the recall tool's excepted), each with its tool's name."""
    names = {c.call_id: c.name for m in messages for c in m.contents if c.type == "function_call"}
    return [
        Source(content_text(c), names.get(c.call_id) or "tool")
        for m in messages
        for c in m.contents
        if c.type == "function_result" and names.get(c.call_id) != RECALL_TOOL
    ]


def request_key(messages: Sequence[Message], results: Sequence[Source]) -> str:
    """What a request shows, digested: its conversation's text and its tool results.

    Not how it was framed: system messages (instructions travel as one on some wires, as an option in
    process), messages without text (a replayed reasoning item) and the encoding of call arguments are
    left out, so every client draws the same.
    """
    shown = (f"{m.role}:{m.text}" for m in messages if m.role != "system" and m.text)
    return digest(*shown, *(r.text for r in results))


def numbered_items(text: str) -> list[Source]:
    """The items of a numbered list (``1. ...``, ``2. ...`` in sequence), each with its number; else ``text`` whole."""
    items: list[list[str]] = []
    for line in text.split("\n"):
        if line.startswith(f"{len(items) + 1}. "):
            items.append([line])
        elif items:
            items[-1].append(line)
    return [Source("\n".join(lines)) for lines in items] if items else [Source(text)]


#: A share of a length a request asks for (``about 60% of its current length``).
_SHARE: Final = re.compile(r"(?<![\d.])(\d{1,2})\s?%")


def _asked_share(messages: Sequence[Message]) -> float | None:
    """The share of the items' length a summarizer request's instructions ask the answer to keep, if they name one
    (a percentage below 100), as a model reads a length it is asked for; else ``None``."""
    found = [int(m.group(1)) for m in messages if m.role == "system" for m in _SHARE.finditer(m.text or "")]
    return found[0] / 100 if found else None


def _numbered(text: str) -> bool:
    """``text`` holds a numbered list (a line opening ``1. ``): what a summarizer is handed to summarise."""
    return any(line.startswith("1. ") for line in text.split("\n"))


def transcript_items(messages: Sequence[Message]) -> list[Source]:
    """What a summarizer request asks to summarise: the numbered items of its non-system messages."""
    return [item for m in messages if m.role != "system" for item in numbered_items(context_text([m]))]


#: Text an instruction quotes: between guillemets or double quotes.
_QUOTED: Final = re.compile(r"\u00ab([^\u00bb\n]+)\u00bb|\u201c([^\u201d\n]+)\u201d|\"([^\"\n]+)\"")
#: A section line an instruction names: one bracketed word standing alone (``[summary]``).
_SECTION: Final = re.compile(r"(?<!\S)\[\w+\](?!\S)")


def _opens_with(message: Message, quote: str) -> bool:
    """A line of ``message`` opens with ``quote`` (an instruction names a message by its opening words; a message
    of ours may open with a marker line first)."""
    return any(line.strip().startswith(quote) for line in (message.text or "").splitlines())


@dataclass(frozen=True, slots=True)
class Ask:
    """What an instruction asks for, read from its place and what it quotes (never its wording).

    Attributes:
        named: The earlier user messages whose opening words it quotes, in order.
        section: The section line it names, if any.
    """

    named: tuple[Message, ...] = ()
    section: str | None = None

    @property
    def label(self) -> str:
        """``record``, ``summary`` or ``record+summary``."""
        if not self.named:
            return "record"
        return "record+summary" if self.section else "summary"


def read_instruction(instruction: str, context: Sequence[Message]) -> Ask:
    """What ``instruction`` asks of ``context`` (see the module docstring)."""
    quotes = [q.strip() for match in _QUOTED.finditer(instruction) for q in match.groups() if q and q.strip()]
    users = [m for m in context if m.role == "user"]
    named: list[Message] = []
    start = 0
    for quote in quotes:  # each quote names the next user message that opens with it
        for index in range(start, len(users)):
            if _opens_with(users[index], quote):
                named.append(users[index])
                start = index + 1
                break
    # A bracketed word opening the instruction marks it (it names no section of the answer); a section line is
    # one the instruction asks for further on, outside what it quotes.
    body = _QUOTED.sub(" ", instruction.strip())
    opening = _SECTION.match(body)
    sections = _SECTION.findall(body[opening.end() :] if opening else body)
    return Ask(tuple(named), sections[0] if sections else None)


class ScriptedModel:
    """Plays a scenario and answers compaction requests; see the module docstring.

    Args:
        scenario: The script.
        options: Which writer, how well it writes, and what it spends on reasoning.
    """

    def __init__(self, scenario: Scenario, options: ModelOptions | None = None) -> None:
        self.scenario = scenario
        self.options = options or ModelOptions()
        self.writer = self.options.writer([f.value for f in scenario.facts])
        self._wrote: dict[str, str] = {}  # what it wrote -> "record" or "summary" (to tell merges and folds)
        #: User messages that matched no turn of the script and asked for nothing it can tell (answered
        #: "Understood."): a host's question the offline model was not given, named by the offline report.
        self.unmatched: list[str] = []

    def respond(
        self,
        messages: Sequence[Message],
        *,
        tool_choice: object = None,
        max_tokens: int | None = None,
        summarizer: bool = False,
    ) -> Message:
        """The model's answer to one request."""
        return self.reply(messages, tool_choice=tool_choice, max_tokens=max_tokens, summarizer=summarizer).message

    def is_instruction(self, message: Message) -> bool:
        """``message`` is a compaction instruction by its place: a user message that is not a scenario turn."""
        return message.role == "user" and self.scenario.turn_for(message.text) is None

    def reply(
        self,
        messages: Sequence[Message],
        *,
        tool_choice: object = None,
        max_tokens: int | None = None,
        summarizer: bool = False,
    ) -> Reply:
        """The model's answer to one request, and what it took the request for."""
        reasoning = self.options.reasoning
        conversation = [m for m in messages if m.role != "system"]
        if len(conversation) == 1 and self.is_instruction(conversation[0]) and _numbered(conversation[0].text or ""):
            summarizer = True  # a request that is nothing but numbered items is a summarizer's, whatever its route
        if summarizer:
            items = transcript_items(messages)
            label = self._kind_of(items)
            share = _asked_share(messages) if self.options.model == "plausible" else None  # the oracle reads none
            if share is not None and label == "merge":
                label = "rewrite"  # its own records, to be written shorter: a harder rewrite, however many
            if share is not None:  # "at most about N% of its length": that many characters, values only
                cap = math.ceil(share * sum(len(i.text) for i in items) / CHARS_PER_TOKEN)
                max_tokens = cap if max_tokens is None else min(max_tokens, cap)
            # A record of its own to rewrite: it writes it shorter, the values without the prose around them.
            text = self.summary(items, max_tokens, values_only=label == "rewrite" and share is not None)
            self._remember(text, "record" if label in ("merge", "rewrite") else "summary")
            return Reply(Message("assistant", [text]), label, reasoning_tokens=reasoning)
        if pinned_function(tool_choice) == RECALL_TOOL and not self.options.ignore_pin:
            return Reply(Message("assistant", [self._record_call(messages, max_tokens)]), "record", False, reasoning)
        if messages and self.is_instruction(messages[-1]):
            view = messages[:-1]
            ask = read_instruction(messages[-1].text or "", view)
            if not ask.named and not tool_results(view):  # no record of nothing: a turn it was not given
                text = messages[-1].text or ""
                if text not in self.unmatched:
                    self.unmatched.append(text)
                    _logger.warning("the scripted model was given no turn for the user message %r", text[:80])
                return Reply(Message("assistant", ["Understood."]), TASK, False, reasoning)
            if self.options.ignore_instruction:
                task = self.reply(view, tool_choice=tool_choice, max_tokens=max_tokens)
                return Reply(task.message, ask.label, True, reasoning)
            return Reply(Message("assistant", [self._answer(ask, view, max_tokens)]), ask.label, True, reasoning)
        return Reply(self._play(messages, tool_choice), TASK, False, reasoning)

    # -- compaction requests -----------------------------------------------------------

    def record(self, messages: Sequence[Message], max_tokens: int | None = None) -> str:
        """A record of every tool result ``messages`` show."""
        results = tool_results(messages)
        text = self.writer.record(results, max_tokens, request_key(messages, results))
        self._remember(text, "record")
        return text

    def summary(
        self, items: Sequence[Source], max_tokens: int | None, *, named: int | None = None, values_only: bool = False
    ) -> str:
        """A summary of ``items`` (``values_only``: no prose)."""
        key = digest(*(i.text for i in items))
        return self.writer.summary(items, max_tokens, key, named=named, values_only=values_only)

    def _answer(self, ask: Ask, view: Sequence[Message], max_tokens: int | None) -> str:
        if not ask.named:
            return self.record(view, max_tokens)
        record = self.record(view, max_tokens) if ask.section is not None else ""
        left = max_tokens
        if record and max_tokens is not None and self.options.model == "plausible":  # one cap for the whole answer
            left = max(1, max_tokens - math.ceil(len(record) / CHARS_PER_TOKEN))
        summary = self.summary([Source(context_text([m])) for m in ask.named], left, named=len(ask.named))
        self._remember(summary, "summary")
        if ask.section is None:
            return summary
        return f"{record}\n{ask.section}\n{summary}"

    def _record_call(self, messages: Sequence[Message], max_tokens: int | None) -> Content:
        # The id depends on what the record quotes and which results it read, not on how the
        # request was framed (instructions as a system message on the wire, as an option in process).
        values = self.record(messages, max_tokens)
        read = [c.call_id or "" for m in messages for c in m.contents if c.type == "function_result"]
        key = hashlib.sha256("\n".join([values, *read]).encode()).hexdigest()[:12]
        return Content.from_function_call(call_id=f"call_recall_{key}", name=RECALL_TOOL, arguments={"values": values})

    def _remember(self, text: str, kind: str) -> None:
        if len(text) >= 16:
            self._wrote[text.strip()] = kind

    def _kind_of(self, items: Sequence[Source]) -> str:
        """A summarizer request's kind, from what its items are: records it wrote, summaries it wrote, or turns."""

        def wrote(item: Source) -> str | None:
            return next((kind for text, kind in self._wrote.items() if text in item.text), None)

        kinds = [wrote(item) for item in items]
        if items and all(kind == "record" for kind in kinds):
            return "merge" if len(items) > 1 else "rewrite"
        if items and all(kind == "summary" for kind in kinds):
            return "fold"
        return "summary"

    # -- task turns ----------------------------------------------------------------------

    def _play(self, messages: Sequence[Message], tool_choice: object) -> Message:
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

    def answer(self, messages: Sequence[Message], expected: Sequence[str]) -> str:
        """Quote each expected value visible in ``messages``; name how many it cannot see."""
        text = context_text(messages)
        seen = [v for v in expected if v in text]
        missing = len(expected) - len(seen)
        answer = "Values: " + (", ".join(seen) if seen else "none visible") + "."
        return answer + (f" I cannot see {missing} of the values asked for." if missing else "")

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
