"""Turns per second through the registry and through Redis, beside the no-compaction baseline (``bench load``).

``python -m maf_compaction.bench load --help``. One process, one event loop, a plain ``Agent`` over an instant
client (it answers at once: a ``lookup`` call after each user message, then a short text), so the figures are the
framework's and our own overhead, not a model's latency. ``--sessions`` sessions run concurrently, each ``--turns``
turns in a row, in four configurations, in one run:

- ``baseline``: the agent with no compaction, sessions in memory;
- ``registry``: the plain-Agent session wiring (``SessionCompactionProvider``, ``SessionToolResultRecallMiddleware``,
  ``make_session_recall_tool`` over one ``SessionCompactionRegistry``), sessions in memory;
- ``baseline+redis`` and ``registry+redis``: the same, each turn inside ``leased_session`` with
  ``RedisSessionLeases`` and ``RedisSessionStore`` (lease, load, run, save, release; ``create=False`` after a
  session's first turn).

Each configuration runs ``--repeats`` times, the configurations interleaved, and the median is reported. Every
run checks what it measured: each session holds all its turns, and under the registry each session carries the
registry's entry. The Redis rows use ``--redis-url``, or a ``redis-server`` started on loopback (``--no-redis``
leaves them out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from agent_framework import (
    Agent,
    AgentSession,
    BaseChatClient,
    CharacterEstimatorTokenizer,
    ChatResponse,
    Content,
    Message,
)
from agent_framework._middleware import ChatMiddlewareLayer
from agent_framework._tools import FunctionInvocationLayer

from ..adapters.leases import leased_session
from ..adapters.sessions import (
    DEFAULT_STATE_KEY,
    SessionCompactionProvider,
    SessionCompactionRegistry,
    SessionToolResultRecallMiddleware,
    make_session_recall_tool,
)
from .args import program_name
from .local_redis import RedisServerUnavailable, local_redis_server
from .sessions import make_builder

CONFIGURATIONS: Final = ("baseline", "registry", "baseline+redis", "registry+redis")
#: A budget no conversation here reaches: the registry's and the stack's overhead, not compaction work, is measured.
BUDGET: Final = 1_000_000
TOKENIZER: Final = CharacterEstimatorTokenizer()


def lookup(q: str) -> str:
    """Look up the code of an item."""
    return f"{q}: code=XR-{len(q)}"


class InstantClient(FunctionInvocationLayer, ChatMiddlewareLayer, BaseChatClient):
    """Answers at once: a ``lookup`` call after a user message, a short text after a tool result."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse]:
        self.requests += 1
        last = messages[-1]

        async def respond() -> ChatResponse:
            if last.role == "user":
                content = Content.from_function_call(f"c{len(messages)}", "lookup", arguments={"q": last.text[:20]})
            else:
                content = Content.from_text("done")
            return ChatResponse(messages=[Message("assistant", [content])], response_id=f"r{len(messages)}")

        return respond()


def agent_for(configuration: str, client: InstantClient) -> tuple[Agent, SessionCompactionRegistry | None]:
    """The plain agent of ``configuration`` (with the registry it uses, if any)."""
    if not configuration.startswith("registry"):
        return Agent(client, "Be terse.", tools=[lookup]), None
    registry = SessionCompactionRegistry(make_builder("records", BUDGET, TOKENIZER, None), max_cached_sessions=128)
    agent = Agent(
        client,
        "Be terse.",
        tools=[lookup, make_session_recall_tool(registry)],
        middleware=[SessionToolResultRecallMiddleware(registry)],
        context_providers=[SessionCompactionProvider(registry, tokenizer=TOKENIZER)],
    )
    return agent, registry


@dataclass(frozen=True, slots=True)
class Run:
    """One timed run of one configuration."""

    configuration: str
    sessions: int
    turns: int
    seconds: float

    @property
    def turns_per_second(self) -> float:
        """Turns served per second of wall time."""
        return self.sessions * self.turns / self.seconds


def _check(configuration: str, session: AgentSession, turns: int, registry: SessionCompactionRegistry | None) -> None:
    """The run did what it claims: every turn is in the session, and the registry's entry too."""
    stored = [value for value in session.state.values() if isinstance(value, dict) and "messages" in value]
    messages = len(stored[0]["messages"]) if stored else 0
    if messages != 4 * turns:  # user, lookup call, lookup result, answer
        raise AssertionError(f"{configuration}: session {session.session_id} holds {messages} messages")
    if registry is not None and DEFAULT_STATE_KEY not in session.state:
        raise AssertionError(f"{configuration}: session {session.session_id} has no registry entry")


async def run_once(configuration: str, *, sessions: int, turns: int, redis_url: str | None, prefix: str) -> Run:
    """Serve ``sessions`` sessions of ``turns`` turns each, concurrently, with ``configuration``; timed."""
    client = InstantClient()
    agent, registry = agent_for(configuration, client)
    ids = [f"{prefix}-{n}" for n in range(sessions)]
    redis_client: Any = None
    leases: Any = None
    store: Any = None
    if configuration.endswith("+redis"):
        import redis.asyncio as aioredis  # noqa: PLC0415 - the redis extra is needed only here

        from ..redis import RedisSessionLeases, RedisSessionStore  # noqa: PLC0415

        assert redis_url is not None
        redis_client = aioredis.Redis.from_url(redis_url, max_connections=max(64, 4 * sessions))
        leases, store = RedisSessionLeases(redis_client, poll_interval_ms=1), RedisSessionStore(redis_client)
    finals: dict[str, AgentSession] = {}

    async def converse(session_id: str) -> None:
        if leases is None:
            session = AgentSession(session_id=session_id)
            for turn in range(turns):
                await agent.run(f"turn {turn} of {session_id}", session=session)
            finals[session_id] = session
            return
        for turn in range(turns):
            async with leased_session(session_id, leases=leases, store=store, create=turn == 0) as session:
                await agent.run(f"turn {turn} of {session_id}", session=session)
            finals[session_id] = session

    try:
        started = time.perf_counter()
        await asyncio.gather(*(converse(session_id) for session_id in ids))
        seconds = time.perf_counter() - started
    finally:
        if redis_client is not None:
            await redis_client.aclose()
    for session_id in ids:
        _check(configuration, finals[session_id], turns, registry)
    return Run(configuration, sessions, turns, seconds)


async def measure(
    *, sessions: int, turns: int, repeats: int, redis_url: str | None, progress: Callable[[str], None]
) -> list[Run]:
    """Every configuration ``repeats`` times, interleaved (Redis ones only with a URL)."""
    chosen = [c for c in CONFIGURATIONS if redis_url is not None or not c.endswith("+redis")]
    runs: list[Run] = []
    for repeat in range(repeats):
        for configuration in chosen:
            progress(f"{configuration}: run {repeat + 1} of {repeats}")
            prefix = f"load-{configuration}-{repeat}-{time.time_ns()}"
            runs.append(
                await run_once(configuration, sessions=sessions, turns=turns, redis_url=redis_url, prefix=prefix)
            )
    return runs


def summary(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per configuration: the median turns per second, its range, and its share of the baseline's."""
    rows: list[dict[str, Any]] = []
    medians: dict[str, float] = {}
    for configuration in CONFIGURATIONS:
        rates = [r.turns_per_second for r in runs if r.configuration == configuration]
        if not rates:
            continue
        medians[configuration] = statistics.median(rates)
        rows.append(
            {
                "configuration": configuration,
                "turns_per_s": medians[configuration],
                "min": min(rates),
                "max": max(rates),
            }
        )
    for row in rows:
        base = medians["baseline+redis" if row["configuration"].endswith("+redis") else "baseline"]
        row["of_baseline"] = row["turns_per_s"] / base
    return rows


def render(rows: Sequence[Mapping[str, Any]], *, sessions: int, turns: int, repeats: int) -> str:
    """The table the command prints."""
    lines = [
        f"{sessions} sessions x {turns} turns, concurrently, one process, instant client; median of {repeats}",
        "",
        f"{'configuration':<16} {'turns/s':>9} {'range':>17} {'of baseline':>12}",
    ]
    for row in rows:
        spread = f"{row['min']:,.0f}-{row['max']:,.0f}"
        lines.append(f"{row['configuration']:<16} {row['turns_per_s']:>9,.0f} {spread:>17} {row['of_baseline']:>11.0%}")
    lines.append("")
    lines.append("(a +redis row's baseline is baseline+redis: the same Redis round trips without compaction)")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The command line of ``bench load``."""
    cli = argparse.ArgumentParser(
        prog=f"{program_name()} load",
        description="Turns per second through the session registry and through Redis, beside the no-compaction "
        "baseline, in one run (one process, plain Agent, instant client).",
    )
    cli.add_argument("--sessions", type=int, default=50, help="sessions served concurrently (default 50)")
    cli.add_argument("--turns", type=int, default=10, help="turns per session (default 10)")
    cli.add_argument("--repeats", type=int, default=3, help="runs per configuration; the median is reported")
    cli.add_argument("--redis-url", default=None, help="a Redis to use (default: start redis-server on loopback)")
    cli.add_argument("--no-redis", action="store_true", help="leave out the Redis rows")
    cli.add_argument("--json", type=Path, default=None, help="write every run and the summary here")
    return cli


def main(argv: Sequence[str] | None = None) -> int:
    """Run the load bench; prints the table (and writes ``--json``)."""
    cli = parser()
    args = cli.parse_args(argv)
    for name in ("sessions", "turns", "repeats"):
        if getattr(args, name) < 1:
            cli.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def run(url: str | None) -> list[Run]:
        return asyncio.run(
            measure(sessions=args.sessions, turns=args.turns, repeats=args.repeats, redis_url=url, progress=progress)
        )

    if args.no_redis or args.redis_url is not None:
        runs = run(None if args.no_redis else args.redis_url)
    else:
        try:
            with local_redis_server() as url:
                runs = run(url)
        except RedisServerUnavailable as missing:
            print(f"load: error: {missing} (or pass --redis-url, or --no-redis)", file=sys.stderr)
            return 2
    rows = summary(runs)
    print(render(rows, sessions=args.sessions, turns=args.turns, repeats=args.repeats))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"runs": [asdict(r) | {"turns_per_s": r.turns_per_second} for r in runs], "summary": rows}
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
