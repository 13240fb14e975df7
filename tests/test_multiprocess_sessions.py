"""Two replica processes share 20 sessions through one Redis: no lost decision, no overlap, no repeated summary.

Each replica (``tests/replica_worker.py``) is the README's shared agent (``SessionCompactionRegistry`` of
composition stacks under ``create_harness_agent``) over the bench's scripted model, serving turns as a load
balancer routes them: the 20 sessions' turns sit in one Redis list and whichever replica pops a turn first serves
it, four at a time, each inside ``leased_session`` with ``RedisSessionLeases`` and ``RedisSessionStore``. A replica
hands a session's next turn on before it saves the session and releases the lease, so the other replica often
takes the next turn at once and must wait for the lease.

Every session plays the same 15 turns of the bench's fill-3.0 conversation (records, a forced re-ask, two
user-turn summaries). The test proves, per session:

- no lost decision: its requests, turn by turn, are byte for byte (SHA-256) what a private single-session stack
  sends for the same conversation, wherever each turn ran;
- no repeated summarizer call: it made exactly the private stack's summarizer calls;
- no overlap: its journal alternates ``enter``/``exit`` of one turn at a time, each turn under its own fencing
  token, the tokens strictly rising.

Halfway through, the store is reset under the replicas' feet: every lease and fencing counter is deleted at once
(what ``FLUSHALL`` or a restart without persistence does to them; the session payloads are kept, as a restore from
a backup would), while turns hold leases. A holder whose lease was lost to the reset must never save over a later
holder: its save is refused (``StaleLeaseError``), the replica serves the turn again, and every session still ends
with the private stack's requests and summarizer calls (nothing lost), the tokens still rising across the reset.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import redis.asyncio as aioredis

from maf_compaction.redis import RedisSessionLeases
from replica_worker import DONE, ERRORS, JOURNAL, REFUSED, RESULT, STOP, TURNS, WORK, private_baseline

HERE = Path(__file__).resolve().parent
SESSIONS = 20
REPLICAS = ("replica-a", "replica-b")


#: Deletes every lease and fencing counter of the default prefix in one step; returns the leases it took away.
RESET = """
local held = redis.call('KEYS', 'maf_compaction:lease:*')
for _, key in ipairs(held) do redis.call('DEL', key) end
for _, key in ipairs(redis.call('KEYS', 'maf_compaction:fence:*')) do redis.call('DEL', key) end
return #held
"""


def _text(entry: object) -> str:
    return entry.decode() if isinstance(entry, bytes) else str(entry)


async def test_two_replicas_serve_twenty_sessions_like_private_stacks(redis_url: str, tmp_path: Path) -> None:
    expected, expected_summaries = await private_baseline()
    assert len(expected) == TURNS
    assert expected_summaries >= 2, "the conversation must reach user-turn summaries"

    redis = aioredis.Redis.from_url(redis_url)
    sessions = [f"session-{n:02d}" for n in range(SESSIONS)]
    await redis.rpush(WORK, *(f"{session} 0" for session in sessions))
    command = [sys.executable, "-W", "ignore", str(HERE / "replica_worker.py"), redis_url]
    # Both replicas share one working directory, as replicas share a volume (the harness keeps file memory there).
    workers = [subprocess.Popen([*command, name], cwd=tmp_path, stderr=subprocess.PIPE) for name in REPLICAS]
    try:
        deadline = time.monotonic() + 240
        reset_taken = 0  # leases the reset took away from their holders
        while int(await redis.get(DONE) or 0) < SESSIONS * TURNS:
            if not reset_taken and int(await redis.get(DONE) or 0) >= SESSIONS * TURNS // 2:
                reset_taken = int(await redis.eval(RESET, 0))  # pyright: ignore[reportGeneralTypeIssues]
            errors = [_text(e) for e in await redis.lrange(ERRORS, 0, -1)]
            assert not errors, errors
            stopped = [w for w in workers if w.poll() is not None]
            assert not stopped, [w.communicate()[1].decode()[-3000:] for w in stopped]
            assert time.monotonic() < deadline, f"{int(await redis.get(DONE) or 0)} of {SESSIONS * TURNS} turns"
            await asyncio.sleep(0.1)
        await redis.rpush(WORK, *([STOP] * len(workers)))
        for worker in workers:
            _, err = await asyncio.to_thread(worker.communicate, timeout=60)
            assert worker.returncode == 0, err.decode()[-3000:]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()

    results = [json.loads(_text(await redis.get(f"{RESULT}:{name}"))) for name in REPLICAS]
    leases = RedisSessionLeases(redis)
    served = Counter[str]()
    for session in sessions:
        # No overlap: one turn at a time, each under the next fencing token.
        journal = [_text(e).split() for e in await redis.lrange(f"{JOURNAL}:{session}", 0, -1)]
        assert [e[0] for e in journal] == ["enter", "exit"] * (len(journal) // 2)
        turns = journal[::2]
        assert [(e[1], e[2], e[3]) for e in turns] == [(e[1], e[2], e[3]) for e in journal[1::2]]
        tokens = [int(e[2]) for e in turns]
        assert tokens == sorted(set(tokens)), f"{session}: the fencing tokens went back: {tokens}"
        # Every turn once, in order, but for the attempts whose save was refused (served again after them).
        refused = [
            (int(t), int(k))
            for s, t, k in (_text(e).split() for e in await redis.lrange(REFUSED, 0, -1))
            if s == session
        ]
        kept = [int(e[3]) for e in turns if (int(e[3]), int(e[2])) not in refused]
        assert kept == list(range(TURNS)), f"{session}: turns {kept}"
        assert await leases.fencing_token(session) >= tokens[-1]
        served.update(e[1] for e in turns)
        # No lost decision: each turn sent the private stack's requests, whichever replica served it.
        sent: dict[int, list[str]] = {}
        for result in results:
            for turn, digests in result["requests"].get(session, {}).items():
                assert int(turn) not in sent, f"{session} turn {turn} served twice"
                sent[int(turn)] = digests
        assert sent == expected, f"{session}: turns {[t for t in expected if sent.get(t) != expected[t]]} differ"
        # No repeated summarizer call.
        assert sum(r["summarizer"].get(session, 0) for r in results) == expected_summaries
    # The load balancer really spread the turns (and so the sessions moved between replicas).
    assert all(served[name] > SESSIONS * TURNS // 5 for name in REPLICAS), served
    # The reset took leases from holders in the middle of their turns, and their saves were refused.
    assert reset_taken > 0, "the reset found no lease held: it tested nothing"
    assert await redis.llen(REFUSED) > 0, "no save was refused after the reset took leases away"
    await redis.aclose()
