"""``python -m maf_compaction.bench demo``: three ways through one long conversation, at one budget.

The same scripted ~60-turn, tool-heavy conversation runs through the framework's
``create_harness_agent`` three times with the same context window and output
reservation:

- ``none``: no compaction; the prompt grows past the budget (about three times it);
- ``framework default``: the harness's own ``ContextWindowCompactionStrategy``, which it
  builds for both phases when given the window and output sizes;
- ``anchored (ours)``: :class:`~maf_compaction.AnchoredCompactionStrategy` passed as both
  the before and the after strategy, as in the README's quickstart.

Every request the scripted provider receives is measured independently of the
strategies (see :mod:`maf_compaction.bench.measure`): its size in ``o200k_base`` tokens,
the share identical to the previous request's prefix (what a prompt cache can reuse),
and whether it breaks that prefix. A per-call table puts the three rows side by side,
and a summary table follows.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal

from agent_framework import Agent, AgentResponse, AgentSession, create_harness_agent

from ..adapters.anchored import AnchoredCompactionStrategy
from ..adapters.counting import MediaTokenEstimator
from ..adapters.tiktoken import TiktokenTokenizer
from .args import positive_int
from .measure import CallMeasure, PromptMeter, RunSummary, measure_calls, summarize
from .scripted import ScriptedChatClient
from .workload import DEFAULT_SEED, DEFAULT_TURNS, Workload, build_workload, lookup_deployment

#: The model's input limit. With the default workload the conversation grows to about
#: 109,000 tokens, a little over three times the 34,000-token budget.
DEFAULT_WINDOW: Final = 36_000
#: Reserved for the reply (becomes the harness's ``max_tokens``).
DEFAULT_OUTPUT_TOKENS: Final = 2_000

#: The harness features the measured runs switch off. The todo provider injects a
#: "### Current todo list" message at position 0 on the first model call of every run
#: (and not on the run's later calls), so it moves the head of the prompt on every turn
#: whatever the compaction does; the mode provider can change the instructions; the file
#: memory writes under the working directory; the scripted client has no web search.
#: With them off, every difference between the rows is the compaction's doing.
MEASURED_HARNESS_OPTIONS: Final[dict[str, bool]] = {
    "disable_todo": True,
    "disable_mode": True,
    "disable_file_memory": True,
    "disable_web_search": True,
}

#: Price of a cached input token relative to an uncached one (about a tenth at major providers).
CACHED_PRICE: Final = 0.1

RowName = Literal["none", "framework default", "anchored (ours)"]
ROWS: Final[tuple[RowName, ...]] = ("none", "framework default", "anchored (ours)")
CallsView = Literal["all", "events", "off"]

_LOGGERS: Final = ("agent_framework", "maf_compaction")


@dataclass(slots=True)
class WarningTally:
    """WARNING records of one logger with one message template.

    Attributes:
        logger: The logger's name.
        count: How many were logged.
        example: The first one, formatted.
    """

    logger: str
    count: int
    example: str


@dataclass(frozen=True, slots=True)
class RowResult:
    """One row of the demo: what the provider received and what it measured.

    Attributes:
        name: The row's name.
        measures: One measurement per model call.
        turn_of_call: The turn number of each model call.
        summary: The measurements summed up.
        seconds: Wall time of the conversation (measuring excluded).
        correct: Questions the scripted model answered correctly.
        questions: Questions asked (lookups and requirement recalls).
        warnings: The WARNINGs the framework and maf-compaction logged during the run.
    """

    name: RowName
    measures: list[CallMeasure]
    turn_of_call: list[int]
    summary: RunSummary
    seconds: float
    correct: int
    questions: int
    warnings: tuple[WarningTally, ...] = ()


def build_agent(
    row: RowName,
    client: ScriptedChatClient,
    workload: Workload,
    *,
    window: int,
    output_tokens: int,
    tokenizer: TiktokenTokenizer,
    **harness_options: Any,
) -> Agent:
    """The harness agent of ``row``, wired as a user would wire it.

    ``harness_options`` go to ``create_harness_agent`` as they are (the demo passes
    :data:`MEASURED_HARNESS_OPTIONS`).
    """
    common: dict[str, Any] = {
        "agent_instructions": workload.instructions,
        "tools": [lookup_deployment],
        **harness_options,
    }
    if row == "none":
        return create_harness_agent(client, disable_compaction=True, **common)
    sized: dict[str, Any] = {
        "max_context_window_tokens": window,
        "max_output_tokens": output_tokens,
        "tokenizer": tokenizer,
    }
    if row == "framework default":
        return create_harness_agent(client, **sized, **common)
    strategy = AnchoredCompactionStrategy(max_input_tokens=window - output_tokens, tokenizer=tokenizer)
    return create_harness_agent(
        client, before_compaction_strategy=strategy, after_compaction_strategy=strategy, **sized, **common
    )


@dataclass(frozen=True, slots=True)
class Conversation:
    """A finished run of a workload.

    Attributes:
        session: The session, with the stored history in ``state["in_memory"]["messages"]``.
        replies: The agent's final reply to each turn.
        turn_of_call: The turn number of each model call the client received.
    """

    session: AgentSession
    replies: list[str]
    turn_of_call: list[int]


async def run_workload(
    agent: Agent, client: ScriptedChatClient, workload: Workload, *, stream: bool = False
) -> Conversation:
    """Send every turn of ``workload`` to ``agent`` (built on ``client``) in one session."""
    session = agent.create_session()
    replies: list[str] = []
    turn_of_call: list[int] = []
    for turn in workload.turns:
        response: AgentResponse[Any]
        if stream:
            updates = agent.run(turn.text, session=session, stream=True)
            async for _ in updates:
                pass
            response = await updates.get_final_response()
        else:
            response = await agent.run(turn.text, session=session)
        replies.append(response.text)
        turn_of_call.extend([turn.number] * (len(client.requests) - len(turn_of_call)))
    return Conversation(session=session, replies=replies, turn_of_call=turn_of_call)


async def run_row(
    row: RowName,
    workload: Workload,
    *,
    window: int,
    output_tokens: int,
    tokenizer: TiktokenTokenizer,
    meter: PromptMeter,
) -> RowResult:
    """Run ``workload`` through ``row`` and measure every request."""
    client = ScriptedChatClient(meter=meter)
    agent = build_agent(
        row,
        client,
        workload,
        window=window,
        output_tokens=output_tokens,
        tokenizer=tokenizer,
        **MEASURED_HARNESS_OPTIONS,
    )
    with _captured_warnings() as warnings:
        started = time.perf_counter()
        conversation = await run_workload(agent, client, workload)
        seconds = time.perf_counter() - started
    requests = [(r.messages, r.options) for r in client.requests]
    measures = measure_calls(requests, meter, MediaTokenEstimator(tokenizer))
    asked = [(t.expected, reply) for t, reply in zip(workload.turns, conversation.replies, strict=True) if t.expected]
    return RowResult(
        name=row,
        measures=measures,
        turn_of_call=conversation.turn_of_call,
        summary=summarize(measures, window - output_tokens),
        seconds=seconds,
        correct=sum(expected in reply for expected, reply in asked),
        questions=len(asked),
        warnings=tuple(warnings),
    )


@contextmanager
def _captured_warnings() -> Iterator[list[WarningTally]]:
    """Tally WARNING records of the framework and of maf-compaction instead of printing them."""
    tallies: dict[tuple[str, str], WarningTally] = {}

    class _Tally(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            key = (record.name, str(record.msg))
            if key in tallies:
                tallies[key].count += 1
            else:
                tallies[key] = WarningTally(logger=record.name, count=1, example=record.getMessage())

    handler = _Tally(logging.WARNING)
    saved: list[tuple[logging.Logger, bool]] = []
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.propagate))
        logger.addHandler(handler)
        logger.propagate = False
    found: list[WarningTally] = []
    try:
        yield found
    finally:
        for logger, propagate in saved:
            logger.removeHandler(handler)
            logger.propagate = propagate
        found.extend(tallies.values())


def format_calls(results: Sequence[RowResult], budget: int, view: CallsView) -> list[str]:
    """The per-call table: one line per model call, the rows side by side.

    ``view`` ``"events"`` keeps only the calls where some row breaks its prefix.
    """
    if view == "off" or not results:
        return []
    cell = "| {:>7} {:>5} {:<9}"
    width = len(cell.format("", "", ""))
    lines = [
        (" " * 10 + " ".join(f"{'| ' + r.name:<{width}}" for r in results)).rstrip(),
        (f"{'call':>4} {'turn':>4} " + " ".join(cell.format("prompt", "reuse", "event") for _ in results)).rstrip(),
    ]
    calls = max(len(r.measures) for r in results)
    for index in range(calls):
        row = [r.measures[index] if index < len(r.measures) else None for r in results]
        if view == "events" and not any(m is not None and m.breaks for m in row):
            continue
        turn = next(r.turn_of_call[index] for r in results if index < len(r.turn_of_call))
        cells = [
            cell.format("", "", "")
            if m is None
            else cell.format(f"{m.prompt_tokens:,}", f"{m.reuse_share:.0%}", _event(m, budget))
            for m in row
        ]
        lines.append((f"{index + 1:>4} {turn:>4} " + " ".join(cells)).rstrip())
    return lines


def _event(measure: CallMeasure, budget: int) -> str:
    if measure.breaks:
        return f"break@{measure.first_change}"
    return "over" if measure.basis_tokens > budget else ""


def format_summary(results: Sequence[RowResult], budget: int) -> list[str]:
    """The summary table, one line per row."""
    columns = (
        ("row", "<18"),
        ("calls", ">5"),
        ("prompt tokens", ">13"),
        ("prefix reuse", ">12"),
        ("breaks", ">6"),
        ("kept at break", ">13"),
        ("max prompt/budget", ">17"),
        ("over budget", ">11"),
        ("billed input", ">12"),
        ("answers", ">7"),
        ("wall s", ">6"),
    )
    header = " ".join(f"{name:{spec}}" for name, spec in columns)
    lines = [header, "-" * len(header)]
    for r in results:
        s = r.summary
        kept = "-" if s.median_kept_at_break is None else f"{s.median_kept_at_break:.0%}"
        values = (
            r.name,
            s.model_calls,
            f"{s.prompt_tokens:,}",
            f"{s.reuse_share:.1%}",
            s.breaks,
            kept,
            f"{s.max_prompt / budget:.2f}",
            s.over_budget,
            f"{s.billed_input(CACHED_PRICE):,.0f}",
            f"{r.correct}/{r.questions}",
            f"{r.seconds:.1f}",
        )
        lines.append(" ".join(f"{value:{spec}}" for value, (_, spec) in zip(values, columns, strict=True)))
    return lines


def format_notes(results: Sequence[RowResult], workload: Workload, window: int, output_tokens: int) -> list[str]:
    """What the columns mean, and the WARNINGs each row logged."""
    budget = window - output_tokens
    lines = [
        f"workload: {len(workload.turns)} turns ({workload.lookups} lookups), seed {workload.seed}; "
        f"window {window:,} - output {output_tokens:,} = budget {budget:,} tokens",
        "prompt tokens, prefix reuse, max prompt: o200k_base over the rendered request (instructions, tool",
        "  declarations, messages), counted independently of the strategies; prefix reuse = tokens of the prefix",
        "  shared with the previous request, over all prompt tokens.",
        "breaks: requests that are not a prefix extension of the previous one (break@N: message N is the first",
        "  that changed); kept at break: the median share of the prompt such a request still reused.",
        "over budget: requests whose messages exceed the budget on the strategies' own counting basis",
        "  (MediaTokenEstimator(tokenizer).count_message_tokens summed over the request messages). Instructions and",
        "  tool declarations are outside that basis, so max prompt/budget can pass 1.00 with no request over it.",
        f"billed input: uncached + {CACHED_PRICE} x reused prompt tokens (a cache that matches whole messages of the",
        "  previous request, with no minimum length; providers' rules differ in detail).",
        "answers: lookups and requirement recalls the scripted model answered with the planted value.",
    ]
    for r in results:
        for tally in r.warnings:
            lines.append(f"{r.name}: {tally.count} WARNING(s) from {tally.logger}, first: {_first_line(tally.example)}")
    return lines


def format_verdict(results: Sequence[RowResult]) -> list[str]:
    """One line comparing ours with the framework default, when both rows ran."""
    rows = {r.name: r.summary for r in results}
    ours, default = rows.get("anchored (ours)"), rows.get("framework default")
    if ours is None or default is None:
        return []
    ours_billed, default_billed = ours.billed_input(CACHED_PRICE), default.billed_input(CACHED_PRICE)
    change = (ours_billed - default_billed) / default_billed if default_billed else 0.0
    return [
        f"ours vs framework default: prefix reuse {ours.reuse_share:.1%} vs {default.reuse_share:.1%}, "
        f"billed input {ours_billed:,.0f} vs {default_billed:,.0f} ({change:+.0%}), "
        f"requests over budget {ours.over_budget} vs {default.over_budget}"
    ]


def _first_line(message: str) -> str:
    text = message.splitlines()[0] if message else ""
    return text if len(text) <= 100 else text[:97] + "..."


async def run_demo(*, turns: int, window: int, output_tokens: int, seed: int) -> list[RowResult]:
    """Run every row of the demo and return the results, in :data:`ROWS` order."""
    tokenizer = TiktokenTokenizer()
    meter = PromptMeter(tokenizer)
    workload = build_workload(turns, seed)
    return [
        await run_row(row, workload, window=window, output_tokens=output_tokens, tokenizer=tokenizer, meter=meter)
        for row in ROWS
    ]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The demo's command line."""
    parser = argparse.ArgumentParser(
        prog="python -m maf_compaction.bench demo",
        description="Run one scripted conversation through create_harness_agent without compaction, with the "
        "framework's default compaction and with AnchoredCompactionStrategy, and compare prompt-cache reuse.",
    )
    parser.add_argument("--turns", type=positive_int, default=DEFAULT_TURNS, help="user turns (default %(default)s)")
    parser.add_argument(
        "--window", type=positive_int, default=DEFAULT_WINDOW, help="context window (default %(default)s)"
    )
    parser.add_argument(
        "--output-tokens",
        type=positive_int,
        default=DEFAULT_OUTPUT_TOKENS,
        help="output reservation (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="workload seed (default %(default)s)")
    parser.add_argument(
        "--calls",
        choices=("all", "events", "off"),
        default="all",
        help="per-call lines: every call, only calls where a row breaks its prefix, or none (default %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.output_tokens >= args.window:
        parser.error("--output-tokens must be smaller than --window")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo and print its tables; returns the process exit status."""
    args = parse_args(argv)
    print(f"running {args.turns} turns through {len(ROWS)} configurations ...", file=sys.stderr)
    results = asyncio.run(
        run_demo(turns=args.turns, window=args.window, output_tokens=args.output_tokens, seed=args.seed)
    )
    workload = build_workload(args.turns, args.seed)
    budget = args.window - args.output_tokens
    lines = format_calls(results, budget, args.calls)
    if lines:
        lines.append("")
    lines += format_summary(results, budget)
    lines += format_verdict(results)
    lines.append("")
    lines += format_notes(results, workload, args.window, args.output_tokens)
    print("\n".join(lines))
    return 0
