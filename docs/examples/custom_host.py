"""A host with its own agent loop: an OpenAI-format message list compacted by ``maf_compaction.core``.

No Agent Framework: the host keeps its conversation as a list of OpenAI chat message dicts
(``role``, ``content``, ``tool_calls``, ``tool_call_id``), calls its model through one plain async
function it owns (:func:`complete`), and keeps the compaction state as JSON in a file. Before every
model request it runs the composition's core (records for tool results, summaries for user turns):

1. build the core's history from the list (:func:`to_history`: conversion only, counted by the core);
2. step; while the core needs effects, perform them with :func:`complete` (:func:`perform`) and absorb the
   answers into the state; step again;
3. apply the answer: send the prompt it leaves (:func:`to_messages`), and store the new state.

The list itself is never rewritten: the next request is compacted from the full list and the stored state,
which replays every decision already made (the same records and summaries, with no second model call).
Every compaction rule is in the core; this file only converts, calls the core's public functions, performs
effects and applies results.

Run it (no key, no network: :func:`complete` is a scripted model standing in for the host's client)::

    python docs/examples/custom_host.py
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from maf_compaction import core

Message = dict[str, Any]

#: The prompt budget: the model's window less its output reservation and what the request carries beside messages.
BUDGET = 4_000
CONFIG = core.CompositionConfig(
    records=core.RecordConfig(max_input_tokens=BUDGET, fallback=core.AnchoredConfig(max_input_tokens=BUDGET)),
    users=core.UserSummaryConfig(max_input_tokens=BUDGET),
)
#: When a record is due: asked over the cached prefix (this conversation's own request plus one instruction).
RULE = core.record_rule(CONFIG)
SYSTEM = "You are an operations assistant."
#: Every model call the host made, for the printout: ("agent" | "summary" | "record", messages sent).
CALLS: list[tuple[str, int]] = []


def measure(text: str) -> int:
    """The host's token counter (any pure function of text; a real host uses its model's tokenizer)."""
    return (len(text) + 3) // 4


# -- the host's model ------------------------------------------------------------------------------------


async def complete(messages: Sequence[Message], max_tokens: int | None = None) -> Message:
    """The host's one model call: OpenAI-format messages in, an assistant message out, at most ``max_tokens``.

    A scripted model stands in for a real client (``await client.chat.completions.create(...)``): it looks a
    service up with the ``lookup`` tool, answers with the code the tool returned, and follows a compaction
    instruction or a summarizer's prompt by quoting every code it was shown (within ``max_tokens``).
    """
    del max_tokens  # its answers are short; a real client sends it, and reports a cut answer as a "length" finish
    last = messages[-1]
    text = str(last.get("content") or "")
    codes = sorted({code for m in messages for code in re.findall(r"TL-[0-9A-F]{6}", str(m.get("content") or ""))})
    record = text.startswith("[compaction request]")  # the core's instruction over this conversation's request
    summary = messages[0]["content"] != SYSTEM  # the summarizer's own instructions, then the numbered items
    if record or summary:
        CALLS.append(("record" if record else "summary", len(messages)))
        return {"role": "assistant", "content": "Codes so far: " + ", ".join(codes)}
    CALLS.append(("agent", len(messages)))
    if last["role"] == "user":
        service = text.rsplit(maxsplit=1)[-1]
        arguments = json.dumps({"service": service})
        call = {"id": f"call_{len(CALLS)}", "type": "function", "function": {"name": "lookup", "arguments": arguments}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "assistant", "content": f"The code is {codes[-1] if codes else 'unknown'}."}


def lookup(service: str, turn: int) -> str:
    """The host's tool: a long status page with one code in it."""
    rows = "\n".join(f"| {service}-{n} | healthy | {100 + turn * 7 + n} ms |" for n in range(30))
    return f"# {service}\n| node | state | latency |\n|---|---|---|\n{rows}\ncode={code_of(turn)}"


def code_of(turn: int) -> str:
    """The code the tool returns on ``turn``."""
    return f"TL-{0x3FA9C2 + turn * 4099:06X}"


# -- conversion: the host's dicts to the core's values ---------------------------------------------------------


def to_history(messages: Sequence[Message]) -> core.History:
    """The core's history of ``messages``: each message with its parts, counted, and its index as ``origin``."""
    records: list[core.MessageRecord] = []
    for index, item in enumerate(messages):
        parts: list[core.Part] = []
        content = item.get("content")
        if item["role"] == "tool":
            parts.append(core.result_part(item["tool_call_id"], content or "", measure))
        elif isinstance(content, str):
            parts.append(core.text_part(content, measure))
        else:
            for piece in content or ():
                if piece["type"] == "text":
                    parts.append(core.text_part(piece["text"], measure))
                else:  # an image or a file, at the default estimate
                    parts.append(core.media_part(json.dumps(piece, sort_keys=True), 1_024))
        for call in item.get("tool_calls") or ():
            function = call["function"]
            parts.append(core.call_part(call["id"], function["name"], function["arguments"], measure))
        records.append(core.message(item["role"], parts, message_id=item.get("id"), origin=index))
    return core.history(records)


def to_messages(
    records: Sequence[core.MessageRecord], given: core.History, messages: Sequence[Message]
) -> list[Message]:
    """The OpenAI-format messages of what the core answered: the host's own where it left them as they were, the
    others (records, summaries, notes and results cut to their value lines) written from their text."""
    sent: list[Message] = []
    for record in core.prompt(records):
        if core.unchanged(record, given):
            sent.append(messages[record.origin])  # type: ignore[index]  # unchanged() says origin is set
            continue
        text = "\n".join(part.text for part in record.parts if part.kind in ("text", "function_result"))
        original = messages[record.origin] if record.origin is not None else {"role": record.role}
        sent.append({**original, "content": text})
    return sent


# -- the compaction pass ---------------------------------------------------------------------------------------


async def perform(request: core.Request, given: core.History, messages: Sequence[Message]) -> str | None:
    """One effect the core asked for, performed with the host's model; ``None`` when it failed."""
    if request.route is core.Route.SUMMARIZER:  # the summarizer: its instructions, then the numbered items
        asked = [{"role": "system", "content": request.prompt}, {"role": "user", "content": request.transcript}]
    elif request.route is core.Route.CACHED_PREFIX:  # this conversation's request as sent, plus one instruction
        assert request.view is not None
        asked = [*to_messages(request.view, given, messages), {"role": "user", "content": request.instruction}]
    else:  # a media description (only with UserSummaryConfig(describe_media=True)): this host has no hook
        return None
    try:  # the cap: what the answer must stay under to be kept, and room to reason (a "length" finish: no answer)
        answer = await complete(asked, max_tokens=core.max_answer_tokens(request, measure))
    except Exception:  # a failed request is an answer too: the core asks again later
        return None
    return answer.get("content") or ""


async def compact(messages: Sequence[Message], state: core.State) -> tuple[list[Message], core.State, core.History]:
    """The prompt for the next request, the state after the pass, and the history the request sends."""
    given = to_history(messages)
    problem = core.composition_check(CONFIG, state, given)
    if problem is not None:
        raise core.SnapshotError(f"the stored state is not this conversation's: {problem}")
    step = core.composition_step(CONFIG, state, given, measure)
    while isinstance(step, core.Needs):
        answers = [(request, await perform(request, given, messages)) for request in step.requests]
        state = core.absorb(state, answers)
        step = core.composition_step(CONFIG, state, given, measure)
    return to_messages(step.history, given, messages), step.state, step.history


# -- the host's agent loop -----------------------------------------------------------------------------------


async def model_request(messages: list[Message], store: Path) -> Message:
    """One model request of the conversation, compacted, with the state read from and written to ``store``."""
    state = core.read_state(CONFIG, json.loads(store.read_text())) if store.exists() else core.State()
    state = core.request_starting(RULE, state)
    prompt, state, sent = await compact(messages, state)
    reply = await complete(prompt)
    state = core.request_sent(RULE, state, sent, measure)
    store.write_text(json.dumps(state.to_dict()))
    return reply


async def conversation(turns: int, store: Path) -> list[Message]:
    """A conversation of ``turns`` questions, each answered after one tool call."""
    messages: list[Message] = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Please look up the status of service svc{turn}"})
        while True:
            reply = await model_request(messages, store)
            messages.append(reply)
            if not reply.get("tool_calls"):
                break
            for call in reply["tool_calls"]:
                service = json.loads(call["function"]["arguments"])["service"]
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": lookup(service, turn)})
    return messages


async def main(turns: int = 14) -> dict[str, Any]:
    """Run a conversation, then restore its stored state and compact it again; what happened, as a dict."""
    with tempfile.TemporaryDirectory() as directory:
        store = Path(directory) / "state.json"
        messages = await conversation(turns, store)
        stored = json.loads(store.read_text())
        full = core.sent_tokens(to_history(messages))
        calls = len(CALLS)
        # A restored state replays every decision: the same prompt, and no second model call.
        restored = core.read_state(CONFIG, stored)
        first, _, _ = await compact(messages, restored)
        again, _, _ = await compact(messages, core.read_state(CONFIG, json.loads(json.dumps(stored))))
    prompt_tokens = core.sent_tokens(to_history(first))
    return {
        "messages": len(messages),
        "full_tokens": full,
        "prompt_tokens": prompt_tokens,
        "records": sum(kind == "record" for kind, _ in CALLS),
        "summaries": sum(kind == "summary" for kind, _ in CALLS),
        "agent_calls": sum(kind == "agent" for kind, _ in CALLS),
        "calls_after_restore": len(CALLS) - calls,
        "replayed_the_same": first == again,
        "codes_in_prompt": sorted(set(re.findall(r"TL-[0-9A-F]{6}", json.dumps(first)))),
        "codes": [code_of(turn) for turn in range(turns)],
        "state_kind": stored["kind"],
    }


if __name__ == "__main__":
    outcome = asyncio.run(main())
    print(json.dumps(outcome, indent=2))
    kept = set(outcome["codes"]) <= set(outcome["codes_in_prompt"])
    print(
        f"{outcome['messages']} messages, {outcome['full_tokens']} tokens uncompacted; the prompt is "
        f"{outcome['prompt_tokens']} tokens (budget {BUDGET}) after {outcome['records']} record(s) and "
        f"{outcome['summaries']} summary request(s); every code still in the prompt: {kept}",
        file=sys.stderr,
    )
