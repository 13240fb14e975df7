"""The Redis lease + load + save round trip of one session turn on loopback (``... bench redis --help``).

What a replica pays around each turn when sessions live in Redis (``maf_compaction.redis``): acquire the session's
lease, load and restore its ``AgentSession``, serialize and save it under the lease, release the lease. The session
is realistic in size: ``messages`` messages of history in the framework's ``InMemoryHistoryProvider`` state (user
questions, assistant tool calls, tool results of several hundred characters, assistant answers) and ``state_kb`` KB
of JSON-safe compaction state under ``state["maf_compaction"]`` (a stand-in of the stack's snapshot, same shape of
data: ids, counts and summary text).

Phases (milliseconds, median and p95 over ``sessions x repeats`` round trips, one after another on one client):

- ``acquire``: ``RedisSessionLeases.hold`` entered (one Lua script: SET NX PX + the fencing counter raised;
  starts the renewal task).
- ``load``: ``RedisSessionStore.load`` (GET + JSON decode) and ``AgentSession.from_dict``.
- ``save``: ``session.to_dict()`` and ``RedisSessionStore.save`` (JSON encode + the fenced Lua write).
- ``release``: the hold's exit (renewal task cancelled, Lua compare-and-DEL).
- ``round_trip``: all four, i.e. what ``leased_session`` adds to a turn.

``decode`` and ``encode`` break out the framework's share (``from_dict`` and ``to_dict``) of ``load`` and ``save``;
``excl_codec`` is each round trip without them: the lease scripts, GET, the fenced write and the JSON text.
Without ``--url`` the command starts its own ``redis-server`` on a free loopback port and stops it afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import redis.asyncio as aioredis  # before ..redis: a missing client names the extra to install
from agent_framework import AgentSession, Content, InMemoryHistoryProvider, Message

from ..adapters.leases import require_session_id
from ..core.checks import AtLeastOne, AtLeastZero, require
from ..redis import RedisSessionLeases, RedisSessionStore
from .args import positive_int, program_name
from .local_redis import RedisServerUnavailable, local_redis_server

PHASES: Final = ("acquire", "load", "save", "release", "round_trip", "decode", "encode", "excl_codec")
DEFAULT_SESSIONS: Final = 20
DEFAULT_REPEATS: Final = 25
DEFAULT_MESSAGES: Final = 200
DEFAULT_STATE_KB: Final = 4
#: Keys of the bench's sessions live under this prefix (never the library's default), and are deleted afterwards.
BENCH_PREFIX: Final = "maf_compaction_bench"
_RESULT_TEXT: Final = (
    "deployment {n}: service=checkout-{n} region=eu-west-{r} image=registry.local/checkout:{n}.{r}.7 "
    "replicas=3 status=healthy last_change=2026-11-{d:02d}T10:{r:02d}:00Z owner=team-payments "
    "notes=rolled forward after canary; error budget 99.93% remaining; p95 latency 182 ms; "
)


def session_payload(session_id: str, *, messages: int, state_kb: int) -> AgentSession:
    """A session as a replica would hold it after ``messages`` messages of tool-using conversation.

    Every fourth message starts a turn: a user question, an assistant tool call, its result (about 600 characters)
    and the assistant's answer; plus ``state_kb`` KB of JSON-safe compaction state under ``"maf_compaction"``.
    """
    require_session_id("session_id", session_id)
    require("messages", messages, AtLeastOne)
    require("state_kb", state_kb, AtLeastZero)
    history: list[Message] = []
    for n in range(messages):
        turn, step = divmod(n, 4)
        call_id = f"call_{turn}"
        if step == 0:
            history.append(Message("user", [f"What is the current deployment of checkout-{turn}?"], message_id=f"u{n}"))
        elif step == 1:
            call = Content.from_function_call(call_id, "lookup_deployment", arguments={"service": f"checkout-{turn}"})
            history.append(Message("assistant", [call], message_id=f"a{n}"))
        elif step == 2:
            text = (_RESULT_TEXT * 2).format(n=turn, r=turn % 9, d=turn % 28 + 1)
            history.append(Message("tool", [Content.from_function_result(call_id, result=text)], message_id=f"t{n}"))
        else:
            answer = f"checkout-{turn} runs image {turn}.{turn % 9}.7 in eu-west-{turn % 9}; it is healthy."
            history.append(Message("assistant", [answer], message_id=f"a{n}"))
    session = AgentSession(session_id=session_id)
    session.state[InMemoryHistoryProvider().source_id] = {"messages": history}
    session.state["maf_compaction"] = _compaction_state(state_kb)
    return session


def _compaction_state(state_kb: int) -> dict[str, Any]:
    """JSON-safe state of about ``state_kb`` KB: a stand-in of the stack's snapshot (decisions and summaries)."""
    records: dict[str, Any] = {}
    size = 0
    index = 0
    while size < state_kb * 1_024:
        summary = f"Record {index}: checkout-{index} runs {index}.{index % 9}.7 in eu-west-{index % 9}, healthy. " * 2
        records[f"r{index}"] = {"covers": [f"t{4 * index + 2}"], "source_count": 1, "summary": summary}
        size += len(json.dumps(records[f"r{index}"])) + len(f"r{index}") + 4
        index += 1
    return {"kind": "stack", "version": 4, "records": records, "gate": {"armed": False}}


def _ms(start: int, end: int) -> float:
    return (end - start) / 1e6


def _stats(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p95_ms": round(p95, 3),
        "max_ms": round(ordered[-1], 3),
        "n": len(ordered),
    }


async def redis_round_trip(
    url: str,
    *,
    sessions: int = DEFAULT_SESSIONS,
    repeats: int = DEFAULT_REPEATS,
    messages: int = DEFAULT_MESSAGES,
    state_kb: int = DEFAULT_STATE_KB,
) -> dict[str, Any]:
    """Time ``sessions x repeats`` lease + load + save + release round trips against the Redis at ``url``.

    Returns a JSON-safe dict: the settings, ``payload_bytes`` (the stored JSON of one session), and for each phase
    of :data:`PHASES` its ``median_ms``, ``p95_ms``, ``max_ms`` and ``n``. The bench's keys (prefix
    ``maf_compaction_bench``) are deleted afterwards.
    """
    require("sessions", sessions, AtLeastOne)
    require("repeats", repeats, AtLeastOne)
    client = aioredis.Redis.from_url(url)
    try:
        leases = RedisSessionLeases(client, prefix=BENCH_PREFIX, wait_timeout_s=0)
        store = RedisSessionStore(client, prefix=BENCH_PREFIX)
        ids = [f"bench-{index}" for index in range(sessions)]
        payload_bytes = 0
        for session_id in ids:  # seed every session once
            async with leases.hold(session_id) as lease:
                payload = session_payload(session_id, messages=messages, state_kb=state_kb).to_dict()
                await store.save(session_id, payload, lease)
            payload_bytes = len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode())
        samples: dict[str, list[float]] = {phase: [] for phase in PHASES}
        for _ in range(repeats):
            for session_id in ids:
                t0 = time.perf_counter_ns()
                hold = leases.hold(session_id)
                lease = await hold.__aenter__()
                t1 = time.perf_counter_ns()
                try:
                    stored = await store.load(session_id, lease)
                    t_decode = time.perf_counter_ns()
                    session = AgentSession.from_dict(dict(stored or {}))
                    t2 = time.perf_counter_ns()
                    data = session.to_dict()
                    t_encode = time.perf_counter_ns()
                    await store.save(session_id, data, lease)
                    t3 = time.perf_counter_ns()
                finally:
                    await hold.__aexit__(None, None, None)
                t4 = time.perf_counter_ns()
                samples["acquire"].append(_ms(t0, t1))
                samples["load"].append(_ms(t1, t2))
                samples["decode"].append(_ms(t_decode, t2))
                samples["save"].append(_ms(t2, t3))
                samples["encode"].append(_ms(t2, t_encode))
                samples["release"].append(_ms(t3, t4))
                samples["round_trip"].append(_ms(t0, t4))
                samples["excl_codec"].append(_ms(t0, t4) - _ms(t_decode, t2) - _ms(t2, t_encode))
        await client.delete(*[key for sid in ids for key in _keys(sid)])
    finally:
        await client.aclose()
    return {
        "url": url,
        "sessions": sessions,
        "repeats": repeats,
        "messages": messages,
        "state_kb": state_kb,
        "payload_bytes": payload_bytes,
        "phases": {phase: _stats(values) for phase, values in samples.items()},
    }


def _keys(session_id: str) -> list[str]:
    return [f"{BENCH_PREFIX}:{kind}:{{{session_id}}}" for kind in ("lease", "fence", "session")]


def render(result: dict[str, Any]) -> str:
    """The figures as a text table."""
    lines = [
        f"Redis lease + load + save round trip on {result['url']}: {result['sessions']} sessions x "
        f"{result['repeats']} repeats, {result['messages']} messages + {result['state_kb']} KB compaction state "
        f"= {result['payload_bytes']:,} bytes of JSON per session; Python {platform.python_version()}",
        "",
        f"{'phase':<12} {'median ms':>10} {'p95 ms':>10} {'max ms':>10}",
    ]
    for phase in PHASES:
        figures = result["phases"][phase]
        lines.append(f"{phase:<12} {figures['median_ms']:>10.3f} {figures['p95_ms']:>10.3f} {figures['max_ms']:>10.3f}")
    lines.append(
        "(decode/encode: the framework's from_dict/to_dict inside load/save; excl_codec: round_trip without them)"
    )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The command line."""
    cli = argparse.ArgumentParser(
        prog=f"{program_name()} redis",
        description="Time the Redis lease + load + save + release round trip of one session turn on loopback.",
    )
    cli.add_argument(
        "--url", default=None, help="a Redis to use, e.g. redis://127.0.0.1:6379/0 (default: start a redis-server)"
    )
    cli.add_argument("--sessions", type=positive_int, default=DEFAULT_SESSIONS, help="default: %(default)s")
    cli.add_argument("--repeats", type=positive_int, default=DEFAULT_REPEATS, help="default: %(default)s")
    cli.add_argument(
        "--messages", type=positive_int, default=DEFAULT_MESSAGES, help="history messages (default: %(default)s)"
    )
    cli.add_argument(
        "--state-kb", type=int, default=DEFAULT_STATE_KB, help="KB of compaction state (default: %(default)s)"
    )
    cli.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the figures to FILE")
    return cli


def main(argv: Sequence[str] | None = None) -> int:
    """Run the round trip bench; prints the table (and writes ``--json``)."""
    args = parser().parse_args(argv)
    if args.state_kb < 0:
        parser().error(f"--state-kb must be >= 0, got {args.state_kb}")

    def run(url: str) -> dict[str, Any]:
        return asyncio.run(
            redis_round_trip(
                url, sessions=args.sessions, repeats=args.repeats, messages=args.messages, state_kb=args.state_kb
            )
        )

    if args.url is not None:
        result = run(args.url)
    else:
        try:
            with local_redis_server() as url:
                result = run(url)
        except RedisServerUnavailable as missing:
            print(f"redis: error: {missing} (or pass --url)", file=sys.stderr)
            return 2
    print(render(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
