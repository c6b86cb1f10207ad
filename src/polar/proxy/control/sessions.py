"""Sessions: who may call the gateway, and the sequence numbers of their calls.

A session is created by the rollout side (admin API or Python API) and gets an
API key; the harness sends that key as its bearer token. Only the key's
SHA-256 is stored. Unknown or closed keys are refused: the gateway never mints
sessions on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import secrets
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from polar.ir import Distribution
from polar.proxy.errors import InvalidRequest, NotFound
from polar.proxy.store import SessionRow, SqliteStore

SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A session id, whole (``fullmatch``: no trailing newline, nothing around it)."""


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


@dataclass(slots=True)
class Session:
    """Live state of one session (mutable: the sequence counter advances)."""

    id: str
    key_hash: str
    created_at: float
    metadata: dict[str, Any] = field(default_factory=dict)
    closed: bool = False
    last_seq: int = 0
    sampling: Distribution | None = None
    """The session's sampling policy, enforced on every call (:mod:`polar.proxy.call.behaviour`)."""

    def next_seq(self) -> int:
        """The next call's sequence number; assigned when the call arrives."""
        self.last_seq += 1
        return self.last_seq


@dataclass(frozen=True, slots=True)
class NewSession:
    session: Session
    api_key: str


class SessionRegistry:
    def __init__(
        self, store: SqliteStore, *, on_close: Callable[[str], None] = lambda _: None
    ) -> None:
        """``on_close(session_id)`` runs when a session closes: what the gateway
        keeps in memory for it goes then."""
        self._store = store
        self._on_close = on_close
        self._by_id: dict[str, Session] = {}
        self._by_hash: dict[str, Session] = {}

    def load(self, owns: Callable[[str], bool] = lambda _: True) -> None:
        """Load the open sessions of an existing store (after a restart); of a
        worker of a group, only the sessions it ``owns``."""
        for row in self._store.load_sessions():
            if not owns(row.id):
                continue
            self._add(
                Session(
                    id=row.id,
                    key_hash=row.key_hash,
                    created_at=row.created_at,
                    metadata=row.metadata,
                    last_seq=row.last_seq,
                    sampling=row.sampling,
                )
            )

    def _add(self, session: Session) -> None:
        self._by_id[session.id] = session
        self._by_hash[session.key_hash] = session

    async def create(
        self,
        *,
        session_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        sampling: Distribution | None = None,
    ) -> NewSession:
        sid = f"ses_{secrets.token_hex(12)}" if session_id is None else session_id
        if not isinstance(sid, str) or not SESSION_ID.fullmatch(sid):
            raise InvalidRequest(
                "session_id must match [A-Za-z0-9][A-Za-z0-9_.-]{0,127}", param="session_id"
            )
        if sid in self._by_id or self._store.session(sid) is not None:
            raise InvalidRequest(f"session {sid!r} already exists", param="session_id")
        api_key = f"sk-polar-{secrets.token_urlsafe(32)}"
        session = Session(
            id=sid,
            key_hash=hash_key(api_key),
            created_at=time.time(),
            metadata=metadata or {},
            sampling=sampling,
        )
        await self._store.insert_session(
            SessionRow(
                id=sid,
                key_hash=session.key_hash,
                created_at=session.created_at,
                closed_at=None,
                metadata=session.metadata,
                last_seq=0,
                sampling=sampling,
            )
        )
        self._add(session)
        return NewSession(session=session, api_key=api_key)

    def authenticate(self, api_key: str | None) -> Session | None:
        if not api_key:
            return None
        session = self._by_hash.get(hash_key(api_key))
        if session is None or session.closed:
            return None
        return session

    def get(self, session_id: str) -> Session:
        session = self._by_id.get(session_id)
        if session is None:
            raise NotFound(f"no open session {session_id!r}")
        return session

    async def close(self, session_id: str) -> None:
        """Close a session: its key stops working at once; its records stay."""
        session = self.get(session_id)
        session.closed = True
        del self._by_id[session.id]
        del self._by_hash[session.key_hash]
        self._on_close(session.id)
        await self._store.close_session(session.id, time.time())

    def open_sessions(self) -> list[Session]:
        return list(self._by_id.values())


class CallTracker:
    """The calls each session has in flight: the barrier a trajectory build waits on.

    A call counts from its arrival until its record's outcome is committed.
    :meth:`settle` waits for a session's calls to end; once its harness has
    ended, whatever is still running serves nobody, so after a grace period
    the calls are cut off (recorded ``aborted``, ``session_ended``).
    """

    def __init__(self) -> None:
        self._calls: dict[str, set[asyncio.Task[Any]]] = {}
        self._idle: dict[str, asyncio.Event] = {}
        self._cut: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()

    @contextlib.contextmanager
    def track(self, session_id: str) -> Iterator[None]:
        task = asyncio.current_task()
        assert task is not None
        self._calls.setdefault(session_id, set()).add(task)
        try:
            yield
        finally:
            calls = self._calls.get(session_id)
            if calls is not None:
                calls.discard(task)
                if not calls:
                    del self._calls[session_id]
                    idle = self._idle.pop(session_id, None)
                    if idle is not None:
                        idle.set()

    def in_flight(self, session_id: str) -> int:
        return len(self._calls.get(session_id, ()))

    def was_cut(self, task: asyncio.Task[Any] | None) -> bool:
        """Whether ``task`` (a call's) was cancelled by :meth:`settle`."""
        return task is not None and task in self._cut

    async def settle(self, session_id: str, *, grace_s: float, timeout_s: float) -> int:
        """Wait until ``session_id`` has no call in flight (each one recorded).

        Waits ``grace_s`` for calls to end on their own, then cancels the rest
        and waits up to ``timeout_s`` for their records. Returns how many calls
        were cut off; raises ``TimeoutError`` if some are still not recorded.
        """
        if await self._wait_idle(session_id, grace_s):
            return 0
        calls = list(self._calls.get(session_id, ()))
        for task in calls:
            self._cut.add(task)
            task.cancel()
        if not await self._wait_idle(session_id, timeout_s):
            raise TimeoutError(
                f"session {session_id}: {self.in_flight(session_id)} calls still in flight "
                f"{timeout_s:g} s after they were cancelled"
            )
        return len(calls)

    async def _wait_idle(self, session_id: str, timeout_s: float) -> bool:
        if not self._calls.get(session_id):
            return True
        idle = self._idle.setdefault(session_id, asyncio.Event())
        try:
            async with asyncio.timeout(timeout_s):
                await idle.wait()
        except TimeoutError:
            return False
        return True
