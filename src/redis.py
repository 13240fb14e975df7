"""Session leases and a fenced session store on Redis (extra ``redis``: ``pip install ".[redis]"`` in a checkout).

Replicas that serve one agent share conversations through Redis: before a turn a replica holds the session's lease
(:class:`RedisSessionLeases`), loads the ``AgentSession.to_dict()`` payload (:class:`RedisSessionStore`), runs the
turn, saves the session under the same lease and releases it. :func:`maf_compaction.leased_session` does exactly
that::

    import redis.asyncio as redis
    from maf_compaction import leased_session
    from maf_compaction.redis import RedisSessionLeases, RedisSessionStore

    client = redis.Redis.from_url("redis://localhost:6379/0")
    leases, store = RedisSessionLeases(client), RedisSessionStore(client)

    # create=True on a session's first turn only: later, a session the store lost raises
    # SessionVanishedError instead of the conversation silently starting over empty.
    async with leased_session(session_id, leases=leases, store=store, create=first_turn) as session:
        await agent.run(user_text, session=session)

How the guarantees are kept, per session id ``S`` under ``prefix`` ``P``:

- ``P:fence:{S}`` is the fencing counter. Acquiring runs one Lua script: ``SET P:lease:{S} OWNER NX PX ttl_ms`` and,
  only when that succeeded, sets the counter to the larger of its value plus one and the Redis server's clock in
  microseconds (``TIME``); that value is the lease's token. So every acquisition gets a token greater than every
  earlier one, across all replicas, and the tokens keep rising across a store that lost its counters (``FLUSHALL``,
  a restart without persistence, a restore from an older snapshot): a holder whose lease was lost to such a reset
  can never save over a later holder. This holds while the server's clock does not run back past the tokens
  already handed out (a server moved to a host whose clock is behind by more than the time since); the count is
  otherwise kept by the counter itself.
- While the lease is held a background task renews it every ``renew_every_ms`` with a compare-and-``PEXPIRE``
  (only if the lease key still holds this holder's random ``OWNER`` value). If the key is gone or another holder
  has it, the renewal stops and logs a WARNING: the lease is lost. Release is a compare-and-``DEL``, on every exit.
- ``P:session:{S}`` holds the session payload as JSON. A save runs one Lua script that writes it only when the
  lease's token still equals ``P:fence:{S}``, so a holder whose lease expired and was acquired by another replica
  is refused (:class:`~maf_compaction.adapters.leases.StaleLeaseError`), even if it no longer knows it lost the lease.

- A Redis failure while acquiring, loading or saving (connection refused or lost, a timeout) raises
  :class:`~maf_compaction.adapters.leases.SessionStoreError` with the Redis error as its cause. A session the store
  lost comes back as nothing stored; ``leased_session`` reports it unless the turn says it starts the session
  (:class:`~maf_compaction.adapters.leases.SessionVanishedError`) instead of starting the conversation over empty.

The braces make the three keys of a session share a Redis Cluster hash slot, so the scripts also run on a cluster.
Use the same ``prefix`` (and database) for the leases and the store. Payloads have no expiry: retain and delete them
under the same policy as the conversation history they contain.

Beside a history provider that keeps messages in Redis itself (such as agent-framework-redis's), the payload here
carries the session's state (our compaction decisions included) and that provider keeps the messages. Hold the lease
around the whole turn all the same: it is what keeps two replicas from running one session at once. That provider's
own writes are not fenced by this lease's token, so a replica that lost its lease mid-turn can still append messages
there, while its session state is refused here.
"""

from __future__ import annotations

from .core.extras import install_hint

try:
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError, ResponseError
except ImportError as _missing:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        f"maf_compaction.redis needs the redis client, which is not installed: {install_hint('redis')}"
    ) from _missing

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated, Any, Final, NoReturn, cast

from msgspec import Meta

from .adapters.leases import (
    HeldLease,
    LeaseTimeoutError,
    SessionLease,
    SessionPayloadError,
    SessionStoreError,
    StaleLeaseError,
    require_lease_for,
    require_session_id,
)
from .core.checks import AtLeastOne, describe_value, is_number, require

logger = logging.getLogger("maf_compaction")

__all__ = ["DEFAULT_PREFIX", "RedisSessionLeases", "RedisSessionStore"]

#: The key prefix both classes use unless told otherwise.
DEFAULT_PREFIX: Final = "maf_compaction"
#: The range of ``ttl_ms``, in milliseconds.
_TTL_MS = Annotated[int, Meta(ge=10)]

# A fence that is not a number (written by something else) is answered with an error starting with _BAD_FENCE.
_BAD_FENCE: Final = "BADFENCE "

# KEYS[1] lease, KEYS[2] fence; ARGV[1] owner, ARGV[2] ttl_ms. The new token, or 0 when another holder has the lease.
# The token is the larger of the counter plus one and the server clock in microseconds, so tokens keep rising across
# a store that lost its counters (FLUSHALL, a restart without persistence, a restore from an older snapshot).
_ACQUIRE: Final = """
local fence = redis.call('GET', KEYS[2])
if fence and not tonumber(fence) then
  return redis.error_reply('BADFENCE ' .. fence)
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local now = redis.call('TIME')
  local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local token = math.max(tonumber(fence or '0') + 1, clock)
  redis.call('SET', KEYS[2], string.format('%.0f', token))
  return token
end
return 0
"""

# KEYS[1] lease; ARGV[1] owner, ARGV[2] ttl_ms. 1 when renewed, 0 when the lease is no longer this owner's.
_RENEW: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS[1] lease; ARGV[1] owner. 1 when released, 0 when the lease was no longer this owner's.
_RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS[1] fence, KEYS[2] session; ARGV[1] token, ARGV[2] payload. {1, newest} when written, {0, newest} when refused.
_SAVE: Final = """
local fence = redis.call('GET', KEYS[1])
local newest = tonumber(fence or '0')
if not newest then
  return redis.error_reply('BADFENCE ' .. fence)
end
if newest ~= tonumber(ARGV[1]) then
  return {0, newest}
end
redis.call('SET', KEYS[2], ARGV[2])
return {1, newest}
"""


def _require_client(value: object) -> aioredis.Redis | aioredis.RedisCluster:
    if not isinstance(value, (aioredis.Redis, aioredis.RedisCluster)):
        raise ValueError(
            "client must be an asyncio Redis client (redis.asyncio.Redis or redis.asyncio.RedisCluster), "
            f"got {describe_value(value)}"
        )
    return value


def _require_prefix(value: object) -> str:
    if not isinstance(value, str) or not value or "{" in value or "}" in value:
        raise ValueError(f"prefix must be a non-empty string without '{{' or '}}', got {describe_value(value)}")
    return value


def _outage(session_id: str, doing: str, error: BaseException) -> SessionStoreError | SessionPayloadError:
    """Our typed error for a Redis failure (raise it ``from error``, so the cause stays attached).

    A script's refusal of a fence that is not a number is no outage: it is data another writer left, named with the
    way out.
    """
    if isinstance(error, ResponseError) and str(error).startswith(_BAD_FENCE):
        return _bad_fence(session_id, str(error).removeprefix(_BAD_FENCE))
    return SessionStoreError(session_id, f"Redis failed while {doing}: {type(error).__name__}: {error}")


def _bad_fence(session_id: str, value: object) -> SessionPayloadError:
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return SessionPayloadError(
        session_id,
        f"its fencing token in Redis is not a whole number ({text[:40]!r}): something else wrote the key; delete it "
        "(the next lease's token still rises above every earlier one)",
    )


def _no_constant(name: str) -> NoReturn:
    """``json.loads``' hook for NaN and Infinity, which JSON does not allow and a later save would refuse."""
    raise ValueError(f"{name} is not a JSON number")


def _key(prefix: str, kind: str, session_id: str) -> str:
    # The braces are a Redis Cluster hash tag: a session's lease, fence and payload share one slot.
    return f"{prefix}:{kind}:{{{session_id}}}"


class RedisSessionLeases:
    """Per-session leases on Redis with fencing tokens: implements ``SessionLeases``.

    Args:
        client: A ``redis.asyncio.Redis`` (or ``RedisCluster``) client. It is shared, never closed here.
        prefix: Key prefix, shared with the :class:`RedisSessionStore` of the same sessions (no braces).
        ttl_ms: Lease time to live in milliseconds (>= 10). A holder that stops renewing (a crashed or paused
            replica) blocks the session at most this long.
        renew_every_ms: Renewal period while held, in ``[1, ttl_ms - 1]`` ms; ``None`` means ``ttl_ms // 3``.
        wait_timeout_s: How long :meth:`hold` waits for another holder, in seconds (>= 0; 0 tries once), before
            raising ``LeaseTimeoutError``.
        poll_interval_ms: How often a waiting :meth:`hold` tries again, in milliseconds (>= 1).
    """

    def __init__(
        self,
        client: aioredis.Redis | aioredis.RedisCluster,
        *,
        prefix: str = DEFAULT_PREFIX,
        ttl_ms: int = 30_000,
        renew_every_ms: int | None = None,
        wait_timeout_s: float = 30.0,
        poll_interval_ms: int = 50,
    ) -> None:
        self._client = _require_client(client)
        self._prefix = _require_prefix(prefix)
        require("ttl_ms", ttl_ms, _TTL_MS)
        require("renew_every_ms", renew_every_ms, AtLeastOne | None)
        if renew_every_ms is not None and renew_every_ms >= ttl_ms:
            raise ValueError(
                f"renew_every_ms must be an integer in [1, ttl_ms - 1] = [1, {ttl_ms - 1}] or None, "
                f"got {renew_every_ms!r}"
            )
        if not is_number(wait_timeout_s) or wait_timeout_s < 0:
            raise ValueError(f"wait_timeout_s must be a finite number >= 0 (seconds), got {wait_timeout_s!r}")
        require("poll_interval_ms", poll_interval_ms, AtLeastOne)
        self._ttl_ms = ttl_ms
        self._renew_every_ms = renew_every_ms if renew_every_ms is not None else max(1, ttl_ms // 3)
        self._wait_timeout_s = float(wait_timeout_s)
        self._poll_interval_ms = poll_interval_ms
        self._acquire_script = self._client.register_script(_ACQUIRE)
        self._renew_script = self._client.register_script(_RENEW)
        self._release_script = self._client.register_script(_RELEASE)

    @property
    def prefix(self) -> str:
        """The key prefix."""
        return self._prefix

    @property
    def ttl_ms(self) -> int:
        """The lease time to live in milliseconds."""
        return self._ttl_ms

    @property
    def renew_every_ms(self) -> int:
        """The renewal period in milliseconds (``ttl_ms // 3`` unless given)."""
        return self._renew_every_ms

    @property
    def wait_timeout_s(self) -> float:
        """How long :meth:`hold` waits for another holder, in seconds."""
        return self._wait_timeout_s

    @property
    def poll_interval_ms(self) -> int:
        """How often a waiting :meth:`hold` tries again, in milliseconds."""
        return self._poll_interval_ms

    def hold(self, session_id: str) -> AbstractAsyncContextManager[SessionLease]:
        """Acquire ``session_id``'s lease, renew it while the block runs, release it on every exit.

        Waits up to ``wait_timeout_s`` for another holder (logged at INFO), then raises ``LeaseTimeoutError``. The
        yielded lease's ``token`` is the session's new fencing token. Release happens on normal exit, on exceptions
        and on cancellation; a release that fails (Redis unreachable) is logged at WARNING and the lease then lapses
        after ``ttl_ms``. A Redis failure while acquiring raises ``SessionStoreError`` with the Redis error as its
        cause. Not re-entrant: holding the same session again inside the block waits for itself until the timeout.

        Raises:
            ValueError: ``session_id`` is not a non-empty string.
            SessionPayloadError: (on entering) the session's fencing token in Redis is not a whole number.
        """
        require_session_id("session_id", session_id)
        return self._hold(session_id)

    async def fencing_token(self, session_id: str) -> int:
        """The session's newest fencing token (0 when it was never leased): for tests and operators."""
        require_session_id("session_id", session_id)
        try:
            value = await cast(Any, self._client.get(_key(self._prefix, "fence", session_id)))
        except (RedisError, OSError) as error:
            raise _outage(session_id, "reading the fencing token", error) from error
        if value is None:
            return 0
        try:
            return int(value)
        except ValueError:
            raise _bad_fence(session_id, value) from None

    @asynccontextmanager
    async def _hold(self, session_id: str) -> AsyncIterator[SessionLease]:
        lease_key = _key(self._prefix, "lease", session_id)
        owner = uuid.uuid4().hex
        token = await self._acquire(session_id, lease_key, owner)
        lease = HeldLease(session_id, token)
        renewal = asyncio.create_task(self._renew(lease, lease_key, owner), name=f"maf_compaction lease {session_id}")
        try:
            yield lease
        finally:
            renewal.cancel()
            # Shielded: a second cancellation while releasing must not leave the lease to lapse by its ttl.
            await asyncio.shield(self._release(lease, lease_key, owner))

    async def _acquire(self, session_id: str, lease_key: str, owner: str) -> int:
        keys = [lease_key, _key(self._prefix, "fence", session_id)]
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self._wait_timeout_s
        waiting = False
        while True:
            try:
                token = int(await self._acquire_script(keys=keys, args=[owner, self._ttl_ms]))
            except (RedisError, OSError) as error:
                raise _outage(session_id, "acquiring the lease", error) from error
            now = loop.time()
            if token > 0:
                if waiting:
                    logger.info(
                        "Acquired the lease on session %r (token %d) after waiting %.0f ms",
                        session_id,
                        token,
                        (now - started) * 1_000,
                    )
                return token
            if now >= deadline:
                logger.warning(
                    "Gave up waiting for the lease on session %r after %.0f ms: another holder still has it",
                    session_id,
                    (now - started) * 1_000,
                )
                raise LeaseTimeoutError(session_id, self._wait_timeout_s)
            if not waiting:
                logger.info(
                    "Session %r is leased by another holder; waiting up to %g s", session_id, self._wait_timeout_s
                )
                waiting = True
            await asyncio.sleep(min(self._poll_interval_ms / 1_000, deadline - now))

    async def _renew(self, lease: HeldLease, lease_key: str, owner: str) -> None:
        while True:
            await asyncio.sleep(self._renew_every_ms / 1_000)
            try:
                renewed = int(await self._renew_script(keys=[lease_key], args=[owner, self._ttl_ms]))
            except (RedisError, OSError) as error:
                logger.warning(
                    "Could not renew the lease on session %r (token %d): %s; trying again in %d ms",
                    lease.session_id,
                    lease.token,
                    error,
                    self._renew_every_ms,
                )
                continue
            if not renewed:
                logger.warning(
                    "Lost the lease on session %r (token %d): it expired before renewal or another holder took it; "
                    "a save under it is refused once another holder has acquired the session",
                    lease.session_id,
                    lease.token,
                )
                return

    async def _release(self, lease: HeldLease, lease_key: str, owner: str) -> None:
        try:
            released = int(await self._release_script(keys=[lease_key], args=[owner]))
        except (RedisError, OSError) as error:
            logger.warning(
                "Could not release the lease on session %r (token %d): %s; it lapses within %d ms",
                lease.session_id,
                lease.token,
                error,
                self._ttl_ms,
            )
            return
        if not released:
            logger.warning(
                "The lease on session %r (token %d) had already expired or been taken by another holder at release",
                lease.session_id,
                lease.token,
            )


class RedisSessionStore:
    """``AgentSession.to_dict()`` payloads as JSON on Redis, written only under the newest lease: ``SessionStore``.

    Args:
        client: A ``redis.asyncio.Redis`` (or ``RedisCluster``) client. It is shared, never closed here.
        prefix: Key prefix; the same as the :class:`RedisSessionLeases` that hands out the leases (no braces).
    """

    def __init__(self, client: aioredis.Redis | aioredis.RedisCluster, *, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = _require_client(client)
        self._prefix = _require_prefix(prefix)
        self._save_script = self._client.register_script(_SAVE)

    @property
    def prefix(self) -> str:
        """The key prefix."""
        return self._prefix

    async def load(self, session_id: str, lease: SessionLease) -> dict[str, Any] | None:
        """The payload saved for ``session_id``, or ``None`` when nothing is stored.

        Raises:
            ValueError: ``session_id`` is not a non-empty string, or ``lease`` is not a lease on it.
            SessionPayloadError: The stored value is not a JSON object (or holds NaN or Infinity, or is nested too
                deeply to load).
            SessionStoreError: Redis failed or is unreachable (its error is the cause).
        """
        require_session_id("session_id", session_id)
        require_lease_for(session_id, lease)
        try:
            raw = await cast(Any, self._client.get(_key(self._prefix, "session", session_id)))
        except (RedisError, OSError) as error:
            raise _outage(session_id, "loading the session", error) from error
        if raw is None:
            return None
        try:
            payload = json.loads(raw, parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError) as error:
            raise SessionPayloadError(session_id, f"the stored payload is not valid JSON: {error}") from error
        except RecursionError:
            raise SessionPayloadError(session_id, "the stored payload is nested too deeply to load") from None
        if not isinstance(payload, dict):
            raise SessionPayloadError(session_id, f"the stored payload is not a JSON object: {describe_value(payload)}")
        return cast(dict[str, Any], payload)

    async def save(self, session_id: str, payload: Mapping[str, Any], lease: SessionLease) -> None:
        """Store ``payload`` as JSON if ``lease.token`` is still the session's newest fencing token.

        Raises:
            ValueError: ``session_id`` is not a non-empty string, or ``lease`` is not a lease on it.
            SessionPayloadError: ``payload`` is not a mapping or not JSON-serializable (nothing written), or the
                session's fencing token in Redis is not a whole number.
            StaleLeaseError: A newer holder acquired the session after ``lease`` (nothing written; WARNING logged).
            SessionStoreError: Redis failed or is unreachable (its error is the cause; the write may or may not
                have landed, as with any write whose reply was lost).
        """
        require_session_id("session_id", session_id)
        held = require_lease_for(session_id, lease)
        if not isinstance(payload, Mapping):
            raise SessionPayloadError(session_id, f"the payload to save is not a mapping: {describe_value(payload)}")
        try:
            text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as error:
            raise SessionPayloadError(session_id, f"the payload to save is not JSON-serializable: {error}") from error
        except RecursionError:
            raise SessionPayloadError(session_id, "the payload to save is nested too deeply to serialize") from None
        keys = [_key(self._prefix, "fence", session_id), _key(self._prefix, "session", session_id)]
        try:
            reply = await self._save_script(keys=keys, args=[held.token, text])
        except (RedisError, OSError) as error:
            raise _outage(session_id, "saving the session", error) from error
        written, newest = (int(v) for v in reply)
        if not written:
            logger.warning(
                "Refused a stale write to session %r: lease token %d, but the newest fencing token is %d",
                session_id,
                held.token,
                newest,
            )
            raise StaleLeaseError(session_id, held.token, newest)
