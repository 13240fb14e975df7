"""Sessions shared by replicas: a per-session lease, a fenced session store, and the wiring between them.

Several processes serving one agent may each receive the next request of the same conversation. Two of them must
never run a turn of one session at the same time, and a replica that lost its lease (paused past its time to live,
cut off from the store) must never overwrite what the newer holder saved. The two protocols here say what an engine
must provide for that:

- :class:`SessionLeases` hands out a :class:`SessionLease` per session: one holder at a time, a *fencing token* that
  strictly increases with every acquisition of that session, renewed while held, released on exit.
- :class:`SessionStore` loads and saves the ``AgentSession.to_dict()`` payload of a session, and refuses a save whose
  lease token is no longer the session's newest one (:class:`StaleLeaseError`).

:func:`leased_session` puts them together around one turn. ``maf_compaction.redis`` implements both protocols on
Redis; a host can plug in another engine by implementing the two protocols. Nothing here decides anything about
compaction: the session's compaction state travels inside ``AgentSession.state`` like any other provider's state.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

from agent_framework import AgentSession

from ..core.checks import AtLeastOne, describe_value, is_async_callable, require
from ..core.errors import ErrorValue

logger = logging.getLogger("maf_compaction")


class SessionLeaseError(ErrorValue):
    """Base class of the errors of session leases and session stores."""


class LeaseTimeoutError(SessionLeaseError):
    """Another holder kept the session's lease for longer than the caller was willing to wait."""

    def __init__(self, session_id: str, waited_s: float) -> None:
        super().__init__(
            f"could not acquire the lease of session {session_id!r} within {waited_s:g} s: another holder still has it"
        )
        self.session_id = session_id
        self.waited_s = waited_s

    def _arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.session_id, self.waited_s), {}


class StaleLeaseError(SessionLeaseError):
    """A write under a lease whose fencing token is no longer the session's newest: a newer holder has acquired since.

    The write is refused as a whole; whatever the newer holder saved stays. ``newest`` is the token the store holds
    (0 when it holds none).
    """

    def __init__(self, session_id: str, token: int, newest: int) -> None:
        why = (
            "so another holder acquired the session after this lease (the lease expired or was lost)"
            if newest > token
            else "older than this lease's: the store lost or rolled back the session's fence while this lease was "
            "held (a reset, a restart without persistence, a restore from an older snapshot), so what it holds for "
            "the session may not be what this holder loaded"
        )
        super().__init__(
            f"refused to save session {session_id!r} under lease token {token}: the session's newest fencing token "
            f"is {newest}, {why}"
        )
        self.session_id = session_id
        self.token = token
        self.newest = newest

    def _arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.session_id, self.token, self.newest), {}


class SessionPayloadError(SessionLeaseError):
    """A stored session payload is malformed, belongs to another session, or cannot be serialized."""

    def __init__(self, session_id: str, problem: str) -> None:
        super().__init__(f"session {session_id!r}: {problem}")
        self.session_id = session_id
        self.problem = problem

    def _arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.session_id, self.problem), {}


class SessionStoreError(SessionLeaseError):
    """The lease or store engine failed or could not be reached (an outage); the engine's error is the cause.

    Nothing is known to have been written; whether a turn ran is for the host to decide
    (``leased_session`` saves nothing it could not save under the lease).
    """

    def __init__(self, session_id: str, problem: str) -> None:
        super().__init__(f"session {session_id!r}: the session store failed: {problem}")
        self.session_id = session_id
        self.problem = problem

    def _arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.session_id, self.problem), {}


class SessionVanishedError(SessionLeaseError):
    """A session the host continues is not in the store: the store lost it (a reset, a restart without persistence).

    Raised by ``leased_session(...)`` (whose ``create`` is false unless the host says the turn starts a session)
    instead of starting the conversation over empty. ``token`` is the lease the turn would have run under (it is
    released).
    """

    def __init__(self, session_id: str, token: int) -> None:
        super().__init__(
            f"session {session_id!r} is not in the session store (lease token {token}): the store lost it (reset, "
            "flushed, or restarted without persistence) or it was never saved; refusing to continue it as a new, "
            "empty session (use create=True for a session's first turn)"
        )
        self.session_id = session_id
        self.token = token

    def _arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.session_id, self.token), {}


@runtime_checkable
class SessionLease(Protocol):
    """A lease currently held on one session."""

    @property
    def session_id(self) -> str:
        """The session this lease is for."""
        ...

    @property
    def token(self) -> int:
        """The fencing token: strictly greater than the token of every earlier acquisition of this session.

        Also across a reset of the engine's state: a holder whose lease was lost to a reset
        must never be able to save over a later holder.
        """
        ...


@dataclass(frozen=True, slots=True)
class HeldLease:
    """A plain :class:`SessionLease` value, for engines that need nothing more."""

    session_id: str
    token: int


class SessionLeases(Protocol):
    """Hands out one lease per session at a time."""

    def hold(self, session_id: str) -> AbstractAsyncContextManager[SessionLease]:
        """Acquire the session's lease, keep it renewed while the block runs, release it on every exit.

        Waits for another holder up to the engine's timeout, then raises :class:`LeaseTimeoutError`. Release happens
        on normal exit, on an exception and on cancellation. A lease is not re-entrant: holding a session again
        inside its own hold waits for itself until the timeout.
        """
        ...


class SessionStore(Protocol):
    """Stores ``AgentSession.to_dict()`` payloads, fenced by the lease token."""

    async def load(self, session_id: str, lease: SessionLease) -> Mapping[str, Any] | None:
        """The payload saved for ``session_id``, or ``None`` when nothing is stored."""
        ...

    async def save(self, session_id: str, payload: Mapping[str, Any], lease: SessionLease) -> None:
        """Store ``payload`` for ``session_id`` unless a newer holder acquired the session after ``lease``.

        Raises:
            StaleLeaseError: ``lease.token`` is not the session's newest fencing token; nothing was written.
        """
        ...


def require_session_id(name: str, value: object) -> None:
    """``value`` is a non-empty string (a session id)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {describe_value(value)}")


def require_lease_for(session_id: str, lease: object) -> SessionLease:
    """``lease`` is a :class:`SessionLease` of ``session_id`` with a token >= 1 (stores call this first)."""
    if not isinstance(lease, SessionLease):
        raise ValueError(f"lease must be a SessionLease (session_id and token), got {describe_value(lease)}")
    if lease.session_id != session_id:
        raise ValueError(f"lease must be held on session {session_id!r}, got a lease on {lease.session_id!r}")
    require("lease.token", lease.token, AtLeastOne)
    return lease


def restore_session(session_id: str, payload: Mapping[str, Any] | None) -> AgentSession:
    """The session a store returned, or a new one when it returned ``None``.

    Raises:
        SessionPayloadError: The payload is not an ``AgentSession.to_dict()`` export of ``session_id``.
    """
    if payload is None:
        return AgentSession(session_id=session_id)
    if not isinstance(payload, Mapping):
        raise SessionPayloadError(session_id, f"the stored payload is not an object: {describe_value(payload)}")
    data = dict(cast(Mapping[str, Any], payload))
    if data.get("type", "session") != "session" or "session_id" not in data:
        raise SessionPayloadError(
            session_id, 'the stored payload is not an AgentSession.to_dict() export ("type": "session", "session_id")'
        )
    if data["session_id"] != session_id:
        raise SessionPayloadError(
            session_id, f"the stored payload belongs to session {data['session_id']!r}; refusing to continue it here"
        )
    try:
        return AgentSession.from_dict(data)
    except Exception as error:  # whatever the framework's state decoders raise on a damaged payload
        raise SessionPayloadError(session_id, f"the framework cannot restore the stored payload: {error}") from error


@asynccontextmanager
async def leased_session(
    session_id: str, *, leases: SessionLeases, store: SessionStore, create: bool = False
) -> AsyncIterator[AgentSession]:
    """Hold ``session_id``'s lease, load its session, yield it, save it, release the lease.

    What is saved when:

    - On entry the lease is acquired (waiting as ``leases`` does, :class:`LeaseTimeoutError` past its timeout) and the
      stored payload is loaded under it: ``AgentSession.from_dict(payload)``. Nothing stored raises
      :class:`SessionVanishedError`: a store that lost the session (a reset, a restart without persistence, an
      eviction) is reported instead of the conversation silently starting over empty. Only ``create=True``, which
      the host passes on a session's first turn (it knows the session is new), starts a new
      ``AgentSession(session_id=session_id)`` when nothing is stored. Nothing is written on entry.
    - When the block ends normally, or raises an ordinary exception (an :class:`Exception`), ``session.to_dict()`` as
      the block left it is saved under the same lease, and then the lease is released. After an exception the
      exception propagates; if that save fails too, the save's error is logged at WARNING and attached to the
      propagating exception as a note.
    - When the block is cancelled (or interrupted by another ``BaseException``) nothing is saved: the turn did not
      finish, and the stored payload stays what the previous holder saved. The lease is still released.
    - A save under a lease that a newer holder has superseded (this one expired or was lost meanwhile) is refused by
      the store with :class:`StaleLeaseError`; nothing of this holder's session is written.

    Raises:
        ValueError: ``session_id``, ``leases``, ``store`` or ``create`` is not what is described above.
        SessionPayloadError: The stored payload is malformed or belongs to another session.
        SessionVanishedError: The store holds nothing for the session and ``create`` is false (the default).
        SessionStoreError: The engine failed or is unreachable (raised by the engine; its error is the cause).
    """
    require_session_id("session_id", session_id)
    if not callable(getattr(leases, "hold", None)):
        raise ValueError(
            f"leases must implement SessionLeases (a hold(session_id) method), got {describe_value(leases)}"
        )
    if not (is_async_callable(getattr(store, "load", None)) and is_async_callable(getattr(store, "save", None))):
        raise ValueError(
            "store must implement SessionStore (async load(session_id, lease) and async save(session_id, payload, "
            f"lease) methods), got {describe_value(store)}"
        )
    if not isinstance(create, bool):
        raise ValueError(f"create must be True or False, got {describe_value(create)}")
    async with leases.hold(session_id) as lease:
        payload = await store.load(session_id, lease)
        if payload is None and not create:
            logger.warning("Session %r is not in the session store; refusing to start it over empty", session_id)
            raise SessionVanishedError(session_id, lease.token)
        session = restore_session(session_id, payload)
        try:
            yield session
        except Exception as error:  # not cancellation (a BaseException): an unfinished turn is not saved
            try:
                await store.save(session_id, session.to_dict(), lease)
            except Exception as save_error:
                logger.warning(
                    "Session %r was not saved after the turn raised %s: %s",
                    session_id,
                    type(error).__name__,
                    save_error,
                )
                error.add_note(f"maf_compaction: session {session_id!r} was not saved: {save_error}")
            raise
        await store.save(session_id, session.to_dict(), lease)
