"""Sessions: who may call the gateway, and the sequence numbers of their calls.

A session is created by the rollout side (admin API or Python API) and gets an
API key; the harness sends that key as its bearer token. Only the key's
SHA-256 is stored. Unknown or closed keys are refused: the gateway never mints
sessions on its own.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from polar.proxy.errors import InvalidRequest, NotFound
from polar.proxy.store import SessionRow, SqliteStore

SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


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

    def next_seq(self) -> int:
        """The next call's sequence number; assigned when the call arrives."""
        self.last_seq += 1
        return self.last_seq


@dataclass(frozen=True, slots=True)
class NewSession:
    session: Session
    api_key: str


class SessionRegistry:
    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._by_id: dict[str, Session] = {}
        self._by_hash: dict[str, Session] = {}

    def load(self) -> None:
        """Load the open sessions of an existing store (after a restart)."""
        for row in self._store.load_sessions():
            self._add(
                Session(
                    id=row.id,
                    key_hash=row.key_hash,
                    created_at=row.created_at,
                    metadata=row.metadata,
                    last_seq=row.last_seq,
                )
            )

    def _add(self, session: Session) -> None:
        self._by_id[session.id] = session
        self._by_hash[session.key_hash] = session

    async def create(
        self, *, session_id: str | None = None, metadata: dict[str, Any] | None = None
    ) -> NewSession:
        sid = session_id or f"ses_{secrets.token_hex(12)}"
        if not SESSION_ID.match(sid):
            raise InvalidRequest(
                "session_id must match [A-Za-z0-9][A-Za-z0-9_.-]{0,127}", param="session_id"
            )
        if sid in self._by_id or self._store.session(sid) is not None:
            raise InvalidRequest(f"session {sid!r} already exists", param="session_id")
        api_key = f"sk-polar-{secrets.token_urlsafe(32)}"
        session = Session(
            id=sid, key_hash=hash_key(api_key), created_at=time.time(), metadata=metadata or {}
        )
        await self._store.insert_session(
            SessionRow(
                id=sid,
                key_hash=session.key_hash,
                created_at=session.created_at,
                closed_at=None,
                metadata=session.metadata,
                last_seq=0,
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
        await self._store.close_session(session.id, time.time())

    def open_sessions(self) -> list[Session]:
        return list(self._by_id.values())
