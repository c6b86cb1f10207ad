"""Several engines serving one model, behind the one-engine transport interface.

:class:`EnginePool` stands where an :class:`~polar.proxy.engines.transport.EngineTransport`
stands (the engines call ``post_json``, ``stream_sse``, ``get_json``), so no engine knows
it is pooled. The contract:

- **Affinity.** A session's calls (the :data:`~polar.proxy.engines.base.SESSION_HEADER`
  on the request) go to the engine its first call went to, so the engine's prefix cache
  holds the session's prompt. Requests without a session (``/tokenize``, ``/v1/models``)
  go to the least busy engine.
- **Balance.** A session's first call goes to the healthy engine with the fewest
  requests outstanding, counted from the moment a request is sent until its reply is
  read or its stream closed (ties: the one given fewest sessions, then the one used
  least recently).
- **Ejection.** An engine that cannot be reached, drops a connection, or times out is
  taken out for ``eject_s`` seconds; its sessions move to another engine on their next
  call (the gateway's own retry of a call that failed before any byte reached the client
  already lands elsewhere; a request that changes nothing, such as ``/tokenize``, is sent
  to the next engine by the pool itself). After ``eject_s`` the next call tries it
  again; success puts it back. An HTTP error status is an answer, not an outage: it
  ejects nothing. When every engine is out, the one ejected longest ago is tried rather
  than failing unasked.

Cost: one dict lookup per call, and the affinity table: one entry per session seen,
the least recently used dropped past ``max_sessions`` (a dropped session is simply
placed again, by load).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from polar.proxy.engines.base import SESSION_HEADER
from polar.proxy.engines.transport import EngineTransport, SSEEvent
from polar.proxy.errors import EngineTimeout, EngineUnavailable


@dataclass(slots=True)
class Member:
    """One engine of the pool and what the pool knows about it."""

    transport: EngineTransport
    outstanding: int = 0
    sessions: int = 0
    """Sessions placed here (moved-away ones included)."""
    requests: int = 0
    failures: int = 0
    ejected_until: float = 0.0
    last_used: float = 0.0

    @property
    def url(self) -> str:
        return self.transport.base_url


@dataclass(frozen=True, slots=True)
class MemberView:
    """An engine's state, as ``/admin/status`` shows it."""

    url: str
    healthy: bool
    outstanding: int
    sessions: int
    requests: int
    failures: int


class EnginePool:
    """Engines of one model, chosen per session; see the module docstring."""

    def __init__(
        self,
        transports: Sequence[EngineTransport],
        *,
        eject_s: float = 10.0,
        max_sessions: int = 65536,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not transports:
            raise ValueError("an engine pool needs at least one engine")
        self._members = [Member(t) for t in transports]
        self._eject_s = eject_s
        self._max_sessions = max_sessions
        self._clock = clock
        self._affinity: OrderedDict[str, Member] = OrderedDict()
        self.base_url = self._members[0].url

    # ------------------------------------------------------------ choosing

    def _healthy(self, member: Member, now: float) -> bool:
        return member.ejected_until <= now

    def _least_busy(self, now: float) -> Member:
        healthy = [m for m in self._members if self._healthy(m, now)]
        if not healthy:  # every engine is out: try the one ejected longest ago
            return min(self._members, key=lambda m: m.ejected_until)
        return min(healthy, key=lambda m: (m.outstanding, m.sessions, m.last_used))

    def choose(self, session: str | None) -> Member:
        """The engine for a request of ``session`` (``None``: no session)."""
        now = self._clock()
        if session is None:
            return self._least_busy(now)
        member = self._affinity.get(session)
        if member is not None and self._healthy(member, now):
            self._affinity.move_to_end(session)
            return member
        member = self._least_busy(now)
        member.sessions += 1
        self._affinity[session] = member
        self._affinity.move_to_end(session)
        while len(self._affinity) > self._max_sessions:
            self._affinity.popitem(last=False)
        return member

    @contextmanager
    def _using(self, member: Member) -> Any:
        member.outstanding += 1
        member.requests += 1
        member.last_used = self._clock()
        try:
            yield
        except (EngineUnavailable, EngineTimeout):
            member.failures += 1
            member.ejected_until = self._clock() + self._eject_s
            raise
        else:
            member.ejected_until = 0.0
        finally:
            member.outstanding -= 1

    def view(self) -> list[MemberView]:
        now = self._clock()
        return [
            MemberView(
                m.url, self._healthy(m, now), m.outstanding, m.sessions, m.requests, m.failures
            )
            for m in self._members
        ]

    # ------------------------------------------------------------ the transport interface

    async def aclose(self) -> None:
        for member in self._members:
            await member.transport.aclose()

    async def get_json(self, path: str) -> Any:
        return await self._idempotent(None, lambda t: t.get_json(path))

    async def post_json(
        self,
        path: str,
        body: Any,
        headers: Mapping[str, str] | None = None,
        *,
        idempotent: bool = False,
    ) -> Any:
        session = (headers or {}).get(SESSION_HEADER)
        if idempotent:
            return await self._idempotent(
                session, lambda t: t.post_json(path, body, headers, idempotent=True)
            )
        member = self.choose(session)
        with self._using(member):
            return await member.transport.post_json(path, body, headers)

    async def _idempotent(
        self, session: str | None, send: Callable[[EngineTransport], Awaitable[Any]]
    ) -> Any:
        """A request that changes nothing on an engine (``/tokenize``, ``/v1/models``):
        when its engine is out, it is sent to the next one, each engine at most once."""
        for _ in range(len(self._members) - 1):
            member = self.choose(session)
            try:
                with self._using(member):
                    return await send(member.transport)
            except (EngineUnavailable, EngineTimeout):
                continue  # ejected by _using: the next choice is another engine
        member = self.choose(session)
        with self._using(member):
            return await send(member.transport)

    async def stream_sse(
        self, path: str, body: Any, headers: Mapping[str, str] | None = None
    ) -> AsyncGenerator[list[SSEEvent], None]:
        member = self.choose((headers or {}).get(SESSION_HEADER))
        with self._using(member):
            async for events in member.transport.stream_sse(path, body, headers):
                yield events
