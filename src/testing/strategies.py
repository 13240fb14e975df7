"""Hypothesis strategies that draw realistic conversations of a tool-using agent.

A conversation is a list of :class:`~.messages.Drawn` messages (plain values, in no framework's
types), built fresh on every draw. It is made of *steps*: the chunks of messages an agent run
appends at once (a user turn, a tool round with its results, an assistant reply). Cutting a
conversation between steps gives a prefix a host could really have stored or sent, so
append-only growth is drawn as "the same steps, cut later".

What the generator covers, with realistic weights:

- an optional system message; user turns, a few with image or document parts;
- tool rounds: a single call, reasoning in the call's message (the Responses shape), a
  reasoning-only message before the call, a trailing reasoning-only message after it,
  parallel calls answered by one tool message or by one message per result, a result
  that arrives later (call, then a user message, then the result), a stray tool message
  whose call is gone, failing tools, and rich results that carry an image;
- tool results of 50 to 3,000 characters: markdown tables, prose and planted lines
  such as ``code_3=TL-3FA9C2`` that a compaction must not split;
- reasoning with empty or short clear text and an opaque payload (a base64 blob, JSON
  holding ``encrypted_content`` or a ``signature``, or a Chat Completions
  ``reasoning_details`` list whose ``reasoning.encrypted`` entry holds ciphertext under
  ``data``) of 40 to 4,000 characters;
- assistant text replies, sometimes with reasoning, sometimes after a reasoning-only
  message that is not followed by a call;
- message ids present or absent, in a mix; call ids usually unique, sometimes reused
  across turns as some clients do (call id = tool name).

:func:`histories` and :func:`history_chunks` draw the same conversations as the core's
:data:`~maf_compaction.core.History`, counted with a host's ``measure``.
"""

from __future__ import annotations

import base64
import itertools
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.strategies import DrawFn

from ..core import History
from ..core.counting import Measure
from .messages import MEDIA_TOKENS, Call, Content, Drawn, Media, Reasoning, Result, Text, to_history

Chunks = list[list[Drawn]]
_Step = list[Drawn]

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


def opaque_blob(seed: int, length: int) -> str:
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
    blob = opaque_blob(draw(st.integers(0, 2**16)), length)
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


def _reasoning(draw: DrawFn, counters: _Counters) -> Reasoning:
    counters.reasoning += 1
    reasoning_id = f"rs_{counters.reasoning:03d}"
    text = draw(st.sampled_from(["", "", "short"]))
    if text == "short":
        text = "**Planning** " + _words(draw, 3, 25)
    return Reasoning(reasoning_id, text, _protected_data(draw, reasoning_id))


# ----------------------------------------------------------------------------- messages


def _message(draw: DrawFn, counters: _Counters, role: str, contents: Sequence[Content]) -> Drawn:
    return Drawn(role, tuple(contents), counters.message_id(draw))


def _user(draw: DrawFn, counters: _Counters) -> Drawn:
    pasted = draw(st.integers(0, 19)) == 19  # now and then a user pastes a long text
    text = _filler(draw(st.integers(0, 2**16)), draw(st.integers(300, 1_500))) if pasted else _words(draw, 2, 30)
    contents: list[Content] = [Text(text)]
    media = draw(st.integers(0, 29))  # an attachment costs a full media estimate (1,024 tokens)
    if media == 28:
        contents.append(Media("image/png", data=b"\x89PNG\r\n\x1a\n" + bytes(draw(st.integers(8, 64)))))
    elif media == 29:
        contents.append(Media("application/pdf", uri=f"https://files.example.com/{draw(st.integers(1, 999))}.pdf"))
    return _message(draw, counters, "user", contents)


def _call(draw: DrawFn, counters: _Counters) -> Call:
    name = _SCREENSHOT if draw(st.integers(0, 24)) == 24 else draw(st.sampled_from(_TOOLS))
    arguments: dict[str, object] = {"query": _words(draw, 1, 6), "limit": draw(st.integers(1, 50))}
    as_string = draw(st.booleans())
    return Call(counters.call_id(name), name, json.dumps(arguments) if as_string else arguments)


def _result(draw: DrawFn, counters: _Counters, call: Call) -> Result:
    call_id = call.call_id
    name = call.name
    shape = draw(st.integers(0, 19))
    if shape == 18:
        error = f"{name} timed out after {draw(st.integers(5, 120))}s"
        return Result(call_id, f"Error: Function failed. Exception: {error}", exception=error)
    if shape == 19 or name == _SCREENSHOT:  # a rich result: text plus an image
        image = Media("image/png", data=b"\x89PNG\r\n\x1a\n" + bytes(draw(st.integers(8, 64))))
        return Result(call_id, (Text(_result_text(draw, counters, name)), image))
    return Result(call_id, _result_text(draw, counters, name))


def _results(draw: DrawFn, counters: _Counters, calls: Sequence[Call]) -> list[Drawn]:
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
        orphan = Call(f"gone_{draw(st.integers(0, 999))}", "search_docs", "")
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
            waiting.append([_message(draw, counters, "assistant", [Text(_words(draw, 3, 15))])])
        return [step, *waiting, _results(draw, counters, calls)]
    step.extend(_results(draw, counters, calls))
    return [step]


def _reply(draw: DrawFn, counters: _Counters) -> _Step:
    """The assistant's text answer, with reasoning in a few shapes."""
    large = draw(st.integers(0, 7)) == 7
    text = _filler(draw(st.integers(0, 2**16)), draw(st.integers(400, 2_000))) if large else _words(draw, 3, 40)
    shape = draw(st.sampled_from(["plain", "plain", "plain", "reasoning_inline", "reasoning_only_before"]))
    if shape == "reasoning_inline":
        return [_message(draw, counters, "assistant", [_reasoning(draw, counters), Text(text)])]
    if shape == "reasoning_only_before":
        # A reasoning-only message that no call follows is an assistant_text group of its own.
        return [
            _message(draw, counters, "assistant", [_reasoning(draw, counters)]),
            _message(draw, counters, "assistant", [Text(text)]),
        ]
    return [_message(draw, counters, "assistant", [Text(text)])]


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
        steps.append([_message(draw, counters, "system", [Text(system)])])
    for turn in draw(st.lists(_turn_steps(counters), min_size=min_turns, max_size=max_turns)):
        steps.extend(turn)
    return steps


def _flatten(steps: Sequence[_Step]) -> list[Drawn]:
    return [message for step in steps for message in step]


# ----------------------------------------------------------------------------- public strategies


def conversations(min_turns: int = 1, max_turns: int = 8) -> st.SearchStrategy[list[Drawn]]:
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
def conversation_and_extension(draw: DrawFn, min_turns: int = 1, max_turns: int = 8) -> tuple[list[Drawn], list[Drawn]]:
    """``(prefix, extra)``: ``prefix + extra`` is a history and ``prefix`` is exactly its start."""
    chunks: Chunks = draw(conversation_chunks(min_chunks=2, max_chunks=2, min_turns=min_turns, max_turns=max_turns))
    if len(chunks) == 1:
        return chunks[0], []
    return chunks[0], chunks[1]


def estimate_tokens(text: str) -> int:
    """A token estimate of about four characters a token: the ``measure`` of the history strategies by default."""
    return (len(text) + 3) // 4


def histories(
    measure: Measure = estimate_tokens, *, min_turns: int = 1, max_turns: int = 8, media_tokens: int = MEDIA_TOKENS
) -> st.SearchStrategy[History]:
    """A conversation of ``min_turns`` to ``max_turns`` user turns as the core's history, counted with ``measure``
    (each record's ``origin`` its index)."""
    return conversations(min_turns, max_turns).map(lambda drawn: to_history(drawn, measure, media_tokens=media_tokens))


def history_chunks(
    measure: Measure = estimate_tokens,
    *,
    min_chunks: int = 2,
    max_chunks: int = 4,
    min_turns: int = 1,
    max_turns: int = 8,
    media_tokens: int = MEDIA_TOKENS,
) -> st.SearchStrategy[tuple[History, ...]]:
    """One conversation as it grows: ``min_chunks`` to ``max_chunks`` histories, each an append-only extension of
    the one before (cut between steps), counted with ``measure``."""

    def grown(chunks: Chunks) -> tuple[History, ...]:
        return tuple(
            to_history([m for chunk in chunks[: n + 1] for m in chunk], measure, media_tokens=media_tokens)
            for n in range(len(chunks))
        )

    return conversation_chunks(min_chunks, max_chunks, min_turns, max_turns).map(grown)
