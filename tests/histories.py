"""Hypothesis strategies that build realistic histories of a tool-using agent.

A history is a list of framework ``Message`` objects, built fresh on every draw. It is
made of *steps*: the chunks of messages an agent run appends at once (a user turn, a
tool round with its results, an assistant reply). Cutting a history between steps
gives a prefix the harness could really have stored or sent, so append-only growth is
drawn as "the same steps, cut later".

What the generator covers, with realistic weights:

- an optional system message; user turns, a few with image or document parts;
- tool rounds: a single call, reasoning in the call's message (the Responses shape), a
  reasoning-only message before the call, a trailing reasoning-only message after it,
  parallel calls answered by one tool message or by one message per result, a result
  that arrives later (call, then a user message, then the result: the framework links
  them), a stray tool message whose call is gone, failing tools, and rich results that
  carry an image;
- tool results of 50 to 3,000 characters: markdown tables, prose and planted lines
  such as ``code_3=TL-3FA9C2`` that a compaction must not split;
- reasoning with empty or short clear text and an opaque ``protected_data`` payload
  (a base64 blob, JSON holding ``encrypted_content`` or a ``signature``, or a Chat
  Completions ``reasoning_details`` list whose ``reasoning.encrypted`` entry holds
  ciphertext under ``data``) of 40 to 4,000 characters;
- assistant text replies, sometimes with reasoning, sometimes after a reasoning-only
  message that is not followed by a call;
- message ids present or absent, in a mix; call ids usually unique, sometimes reused
  across turns as some clients do (call id = tool name).

Helpers build the other lists a pass sees: :func:`with_injected_context` (the harness's
todo list at position 0, loaded copies attributed to the history provider),
:func:`reshape_opaque_payloads` (the same history with opaque payloads of other lengths)
and :func:`describe` (a readable rendering for ``hypothesis.note``).
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from agent_framework import Content, Message
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn

__all__ = [
    "HISTORY_ATTRIBUTION",
    "NOTE_KEY",
    "TODO_ATTRIBUTION",
    "Chunks",
    "conversation_and_extension",
    "conversation_chunks",
    "conversations",
    "deep_copy_messages",
    "describe",
    "is_injected_todo",
    "reshape_opaque_payloads",
    "with_injected_context",
]

#: What ``SessionContext.extend_messages`` stamps on the copies a history provider loads.
HISTORY_ATTRIBUTION: dict[str, str] = {"source_id": "in_memory", "source_type": "InMemoryHistoryProvider"}
#: What the harness's todo list carries (``TodoProvider`` is a context provider, not history).
TODO_ATTRIBUTION: dict[str, str] = {"source_id": "todo", "source_type": "TodoProvider"}
#: The key our notes carry (mirrors ``maf_compaction.adapters.convert.NOTE_KEY``).
NOTE_KEY = "_maf_compaction_note"

Chunks = list[list[Message]]
_Step = list[Message]

_WORD_TEXT = """
invoice customer ticket refund shipment order warehouse latency error deploy region cluster budget quarter
revenue churn contract vendor policy audit backlog sprint release migration schema index query report metric
alert incident owner status pending approved blocked escalated resolved summary detail table column row value
"""
_WORDS = tuple(_WORD_TEXT.split())
_TOOLS = ("search_docs", "read_file", "run_sql", "list_tickets", "get_weather", "fetch_url")
#: A tool whose result carries an image (drawn rarely: each image costs a media estimate).
_SCREENSHOT = "take_screenshot"
#: Character ranges of tool results: mostly small, a third medium, a few large.
_RESULT_SIZES = ((50, 450),) * 6 + ((450, 1_500),) * 3 + ((1_500, 3_000),)
_STATUSES = ("open", "closed", "pending", "blocked", "done")


@dataclass
class _Counters:
    """Per-draw counters, so ids and planted codes are unique within one history."""

    message: int = 0
    call: int = 0
    reasoning: int = 0
    code: int = 0
    reuse_call_ids: bool = False

    def message_id(self, draw: DrawFn) -> str | None:
        self.message += 1
        return f"m{self.message:03d}" if draw(st.integers(0, 2)) else None

    def call_id(self, name: str) -> str:
        self.call += 1
        return name if self.reuse_call_ids else f"call_{self.call:03d}"


# ----------------------------------------------------------------------------- text


def _words(draw: DrawFn, low: int, high: int) -> str:
    return " ".join(draw(st.lists(st.sampled_from(_WORDS), min_size=low, max_size=high)))


def _filler(seed: int, length: int) -> str:
    """Deterministic prose of about ``length`` characters (cheap to draw: one integer)."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < length:
        word = rng.choice(_WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:length]


def _blob(seed: int, length: int) -> str:
    """An opaque base64 payload of exactly ``length`` characters."""
    raw = random.Random(seed).randbytes(length)
    return base64.b64encode(raw).decode("ascii")[:length]


def _result_text(draw: DrawFn, counters: _Counters, tool: str) -> str:
    """A multi-line tool result of 50 to 3,000 characters with planted facts and a table."""
    low, high = draw(st.sampled_from(_RESULT_SIZES))
    target = draw(st.integers(low, high))
    rng = random.Random(draw(st.integers(0, 2**16)))
    lines = [f"# {tool}: {rng.choice(_WORDS)} {rng.choice(_WORDS)}"]
    size = len(lines[0]) + 1
    row = 0
    while size < target:
        roll = rng.random()
        if roll < 0.15:
            counters.code += 1
            line = f"code_{counters.code}=TL-{rng.randrange(16**6):06X}"
        elif roll < 0.6:
            if row == 0:
                lines.append("| id | name | status | value |")
                lines.append("|---|---|---|---|")
            row += 1
            name = f"{rng.choice(_WORDS)}-{rng.choice(_WORDS)}"
            line = f"| {row} | {name} | {rng.choice(_STATUSES)} | {rng.randrange(10**5)} |"
        else:
            line = _filler(rng.randrange(2**16), rng.randrange(20, 120))
        lines.append(line)
        size += len(line) + 1
    text = "\n".join(lines)
    if len(text) < 50:
        text = text + "\n" + _filler(rng.randrange(2**16), 50)
    return text


def _protected_data(draw: DrawFn, reasoning_id: str) -> str | None:
    """None, an opaque base64 blob, or JSON whose opaque members hide in known keys."""
    shape = draw(
        st.sampled_from(["none", "blob", "blob", "encrypted", "encrypted_summary", "signature", "reasoning_details"])
    )
    if shape == "none":
        return None
    length = draw(st.integers(40, 400) | st.integers(400, 4_000))
    blob = _blob(draw(st.integers(0, 2**16)), length)
    if shape == "blob":
        return blob
    if shape == "encrypted":
        return json.dumps({"type": "reasoning", "id": reasoning_id, "encrypted_content": blob})
    if shape == "encrypted_summary":
        summary = [{"type": "summary_text", "text": _words(draw, 3, 12)}]
        return json.dumps({"type": "reasoning", "id": reasoning_id, "summary": summary, "encrypted_content": blob})
    if shape == "signature":
        return json.dumps({"type": "thinking", "signature": blob})
    # Chat Completions ``reasoning_details`` (OpenRouter): clear text, and ciphertext under ``data``.
    return json.dumps(
        [
            {"type": "reasoning.text", "text": _words(draw, 3, 12), "format": "unknown"},
            {"type": "reasoning.encrypted", "id": reasoning_id, "data": blob},
        ]
    )


def _reasoning(draw: DrawFn, counters: _Counters) -> Content:
    counters.reasoning += 1
    reasoning_id = f"rs_{counters.reasoning:03d}"
    text = draw(st.sampled_from(["", "", "short"]))
    if text == "short":
        text = "**Planning** " + _words(draw, 3, 25)
    return Content.from_text_reasoning(id=reasoning_id, text=text, protected_data=_protected_data(draw, reasoning_id))


# ----------------------------------------------------------------------------- messages


def _message(draw: DrawFn, counters: _Counters, role: str, contents: Sequence[Content]) -> Message:
    return Message(role, list(contents), message_id=counters.message_id(draw))


def _user(draw: DrawFn, counters: _Counters) -> Message:
    pasted = draw(st.integers(0, 19)) == 19  # now and then a user pastes a long text
    text = _filler(draw(st.integers(0, 2**16)), draw(st.integers(300, 1_500))) if pasted else _words(draw, 2, 30)
    contents = [Content.from_text(text)]
    media = draw(st.integers(0, 29))  # an attachment costs a full media estimate (1,024 tokens)
    if media == 28:
        contents.append(Content.from_data(b"\x89PNG\r\n\x1a\n" + bytes(draw(st.integers(8, 64))), "image/png"))
    elif media == 29:
        contents.append(
            Content.from_uri(f"https://files.example.com/{draw(st.integers(1, 999))}.pdf", media_type="application/pdf")
        )
    return _message(draw, counters, "user", contents)


def _call(draw: DrawFn, counters: _Counters) -> Content:
    name = _SCREENSHOT if draw(st.integers(0, 24)) == 24 else draw(st.sampled_from(_TOOLS))
    arguments: dict[str, object] = {"query": _words(draw, 1, 6), "limit": draw(st.integers(1, 50))}
    as_string = draw(st.booleans())
    return Content.from_function_call(
        call_id=counters.call_id(name),
        name=name,
        arguments=json.dumps(arguments) if as_string else arguments,
    )


def _result(draw: DrawFn, counters: _Counters, call: Content) -> Content:
    call_id = call.call_id or ""
    name = call.name or "tool"
    shape = draw(st.integers(0, 19))
    if shape == 18:
        error = f"{name} timed out after {draw(st.integers(5, 120))}s"
        return Content.from_function_result(
            call_id=call_id, result=f"Error: Function failed. Exception: {error}", exception=error
        )
    if shape == 19 or name == _SCREENSHOT:  # a rich result: text plus an image
        image = Content.from_data(b"\x89PNG\r\n\x1a\n" + bytes(draw(st.integers(8, 64))), "image/png")
        return Content.from_function_result(
            call_id=call_id, result=[Content.from_text(_result_text(draw, counters, name)), image]
        )
    return Content.from_function_result(call_id=call_id, result=_result_text(draw, counters, name))


def _results(draw: DrawFn, counters: _Counters, calls: Sequence[Content]) -> list[Message]:
    """The tool messages answering ``calls``: one message with all results, or one each."""
    results = [_result(draw, counters, call) for call in calls]
    if len(results) > 1 and draw(st.booleans()):
        return [_message(draw, counters, "tool", results)]
    return [_message(draw, counters, "tool", [result]) for result in results]


def _tool_round(draw: DrawFn, counters: _Counters) -> list[_Step]:
    """One model round that calls tools, as one or more steps."""
    shape = draw(
        st.sampled_from(
            [
                "single",
                "single",
                "single",
                "reasoning_inline",
                "reasoning_inline",
                "reasoning_before",
                "reasoning_after",
                "parallel",
                "parallel",
                "late_result",
                "stray",
            ]
        )
    )
    if shape == "stray":
        orphan = Content.from_function_call(call_id=f"gone_{draw(st.integers(0, 999))}", name="search_docs")
        return [_results(draw, counters, [orphan])]
    calls = [_call(draw, counters) for _ in range(draw(st.integers(2, 3)) if shape == "parallel" else 1)]
    inline: list[Content] = []
    if shape == "reasoning_inline" or (shape == "parallel" and draw(st.booleans())):
        inline.append(_reasoning(draw, counters))
    step: _Step = []
    if shape == "reasoning_before":
        step.append(_message(draw, counters, "assistant", [_reasoning(draw, counters)]))
    step.append(_message(draw, counters, "assistant", [*inline, *calls]))
    if shape == "reasoning_after":
        step.append(_message(draw, counters, "assistant", [_reasoning(draw, counters)]))
    if shape == "late_result":
        # The tool answers after the user has spoken again; the framework links the result
        # to its call across the user message.
        waiting: list[_Step] = [[_user(draw, counters)]]
        if draw(st.booleans()):
            waiting.append([_message(draw, counters, "assistant", [Content.from_text(_words(draw, 3, 15))])])
        return [step, *waiting, _results(draw, counters, calls)]
    step.extend(_results(draw, counters, calls))
    return [step]


def _reply(draw: DrawFn, counters: _Counters) -> _Step:
    """The assistant's text answer, with reasoning in a few shapes."""
    large = draw(st.integers(0, 7)) == 7
    text = _filler(draw(st.integers(0, 2**16)), draw(st.integers(400, 2_000))) if large else _words(draw, 3, 40)
    shape = draw(st.sampled_from(["plain", "plain", "plain", "reasoning_inline", "reasoning_only_before"]))
    if shape == "reasoning_inline":
        return [_message(draw, counters, "assistant", [_reasoning(draw, counters), Content.from_text(text)])]
    if shape == "reasoning_only_before":
        # A reasoning-only message that no call follows is an assistant_text group of its own.
        return [
            _message(draw, counters, "assistant", [_reasoning(draw, counters)]),
            _message(draw, counters, "assistant", [Content.from_text(text)]),
        ]
    return [_message(draw, counters, "assistant", [Content.from_text(text)])]


@st.composite
def _round_steps(draw: DrawFn, counters: _Counters) -> list[_Step]:
    return _tool_round(draw, counters)


@st.composite
def _turn_steps(draw: DrawFn, counters: _Counters) -> list[_Step]:
    steps: list[_Step] = [[_user(draw, counters)]]
    # Lists (not drawn counts) let the shrinker delete a round or a turn from the middle.
    for round_steps in draw(st.lists(_round_steps(counters), max_size=3)):
        steps.extend(round_steps)
    if draw(st.integers(0, 4)):
        steps.append(_reply(draw, counters))
    return steps


@st.composite
def _steps(draw: DrawFn, min_turns: int, max_turns: int) -> list[_Step]:
    counters = _Counters(reuse_call_ids=draw(st.integers(0, 9)) == 9)
    steps: list[_Step] = []
    if draw(st.integers(0, 3)):
        system = "You are a careful operations assistant. " + _words(draw, 3, 30)
        steps.append([_message(draw, counters, "system", [Content.from_text(system)])])
    for turn in draw(st.lists(_turn_steps(counters), min_size=min_turns, max_size=max_turns)):
        steps.extend(turn)
    return steps


def _flatten(steps: Sequence[_Step]) -> list[Message]:
    return [message for step in steps for message in step]


# ----------------------------------------------------------------------------- public strategies


def conversations(min_turns: int = 1, max_turns: int = 8) -> st.SearchStrategy[list[Message]]:
    """A fresh history of ``min_turns`` to ``max_turns`` user turns."""
    return _steps(min_turns, max_turns).map(_flatten)


@st.composite
def conversation_chunks(
    draw: DrawFn, min_chunks: int = 2, max_chunks: int = 4, min_turns: int = 1, max_turns: int = 8
) -> Chunks:
    """A history cut between steps into ``min_chunks`` to ``max_chunks`` non-empty chunks.

    ``chunks[0]`` is what was stored first; each later chunk is an append-only extension,
    so every ``sum(chunks[:i])`` is a valid history that starts the next one.
    """
    low = max(min_turns, min_chunks)  # every turn is at least one step
    steps: list[_Step] = draw(_steps(low, max(max_turns, low)))
    if len(steps) < min_chunks:
        return [_flatten(steps)]
    count = min(draw(st.integers(min_chunks, max_chunks)), len(steps))
    cuts = sorted(draw(st.sets(st.integers(1, len(steps) - 1), min_size=count - 1, max_size=count - 1)))
    bounds = [0, *cuts, len(steps)]
    return [_flatten(steps[a:b]) for a, b in itertools.pairwise(bounds)]


@st.composite
def conversation_and_extension(
    draw: DrawFn, min_turns: int = 1, max_turns: int = 8
) -> tuple[list[Message], list[Message]]:
    """``(prefix, extra)``: ``prefix + extra`` is a history and ``prefix`` is exactly its start."""
    chunks: Chunks = draw(conversation_chunks(min_chunks=2, max_chunks=2, min_turns=min_turns, max_turns=max_turns))
    if len(chunks) == 1:
        return chunks[0], []
    return chunks[0], chunks[1]


def deep_copy_messages(messages: Sequence[Message]) -> list[Message]:
    """Independent copies: compacting them never touches ``messages``."""
    return copy.deepcopy(list(messages))


def with_injected_context(messages: Sequence[Message], *, loaded: int | None = None) -> list[Message]:
    """The list a harness model call sees: a todo list at position 0, then the history.

    The first ``loaded`` messages (all by default) are copies a history provider loaded
    and carry its ``_attribution``; the rest are this run's own new messages.
    """
    count = len(messages) if loaded is None else loaded
    copies = deep_copy_messages(messages)
    for message in copies[:count]:
        message.additional_properties["_attribution"] = dict(HISTORY_ATTRIBUTION)
    todo = Message(
        "user",
        ["## Todo list\n- [x] gather the ticket history\n- [ ] reconcile the invoice totals\n- [ ] report back"],
        message_id="todo_context",
        additional_properties={"_attribution": dict(TODO_ATTRIBUTION)},
    )
    return [todo, *copies]


def is_injected_todo(message: Message) -> bool:
    """The message is the todo list :func:`with_injected_context` put in."""
    attribution = message.additional_properties.get("_attribution")
    return isinstance(attribution, dict) and attribution.get("source_type") == TODO_ATTRIBUTION["source_type"]


def reshape_opaque_payloads(messages: Sequence[Message], lengths: Sequence[int]) -> list[Message]:
    """Copies whose opaque reasoning payloads have other lengths (0 removes them).

    The i-th reasoning part with a payload gets ``lengths[i % len(lengths)]`` characters of
    opaque data: a bare blob is replaced (or dropped), and in a JSON payload only the
    ``encrypted_content`` or ``signature`` member, or the ``data`` of a
    ``reasoning.encrypted`` entry, changes (or is dropped). Clear text (reasoning text, a
    JSON summary) is left exactly as it was.
    """
    copies = deep_copy_messages(messages)
    index = 0
    for message in copies:
        for content in message.contents:
            if content.type != "text_reasoning" or not content.protected_data:
                continue
            length = lengths[index % len(lengths)] if lengths else 0
            content.protected_data = _reshaped(content.protected_data, length, seed=index)
            index += 1
    return copies


def _reshaped(payload: str, length: int, *, seed: int) -> str | None:
    try:
        parsed: object = json.loads(payload)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return json.dumps(_reshaped_entry(cast("dict[str, object]", parsed), length, seed))
    if isinstance(parsed, list):
        entries = cast("list[object]", parsed)
        return json.dumps(
            [_reshaped_entry(cast("dict[str, object]", e), length, seed) if isinstance(e, dict) else e for e in entries]
        )
    return _blob(seed, length) if length else None


def _reshaped_entry(entry: dict[str, object], length: int, seed: int) -> dict[str, object]:
    data = dict(entry)
    opaque = ["encrypted_content", "signature"]
    if data.get("type") == "reasoning.encrypted":
        opaque.append("data")
    for key in opaque:
        if key in data:
            if length:
                data[key] = _blob(seed, length)
            else:
                del data[key]
    return data


def describe(messages: Sequence[Message]) -> str:
    """A readable one-line-per-message rendering, for ``hypothesis.note`` on failure."""
    lines: list[str] = []
    for index, message in enumerate(messages):
        parts: list[str] = []
        for content in message.contents:
            if content.type == "function_call":
                parts.append(f"call({content.call_id}, {content.name})")
            elif content.type == "function_result":
                parts.append(f"result({content.call_id}, {len(str(content.result or ''))} chars)")
            elif content.type == "text_reasoning":
                parts.append(f"reasoning({len(content.text or '')} chars, opaque {len(content.protected_data or '')})")
            elif content.type == "text":
                parts.append(f"text({len(content.text or '')} chars)")
            else:
                parts.append(content.type)
        flags = " excluded" if message.additional_properties.get("_excluded") else ""
        flags += " injected" if is_injected_todo(message) else ""
        flags += " note" if message.additional_properties.get(NOTE_KEY) else ""
        lines.append(f"{index:3d} {message.role:<9} {message.message_id or '-'}{flags}: {', '.join(parts)}")
    return "\n".join(lines)
