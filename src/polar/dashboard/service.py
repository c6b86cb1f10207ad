"""The dashboard's state and what it does with it, apart from HTTP.

One :class:`DashboardService` per app (``app.state.dashboard``): the control
token and the session cookie derived from it, the rollout server's client
(opened by :meth:`~DashboardService.start`, closed by
:meth:`~DashboardService.stop`; None without a server or outside the app's
lifespan), the record stores, and the cache of rebuilt trajectories. Builds run
in worker threads, one at a time (``build_lock``): the builders and the cache
are not thread-safe. Route handlers (:mod:`polar.dashboard.routes`) reach it
through the request and turn its :class:`~polar.dashboard.sources.SourceError`
into 404s, 500s and 502s.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import AsyncIterator

import orjson
from starlette.concurrency import run_in_threadpool

from polar.bearer import bearer_token
from polar.dashboard.config import DashboardConfig
from polar.dashboard.sources import RecordSource, RolloutSource, SourceError, task_of_session
from polar.dashboard.tokens import Built, Trajectories
from polar.rollout.protocol import SessionResult
from polar.tokenizer import Tokenizer
from polar.trajectory import TrajectoryError


class DashboardService:
    """The dashboard's state (rollout client, stores, trajectory cache, token)
    and its operations; ``tokenizer`` is the model's (it decodes tokens and gives
    the chat-template facts the builders need)."""

    def __init__(self, config: DashboardConfig, tokenizer: Tokenizer) -> None:
        self.config = config
        self.records = RecordSource(config.stores)
        self.trajectories = Trajectories(
            config.builder, tokenizer, capacity=config.trajectory_cache
        )
        self.rollout: RolloutSource | None = None
        self._token = config.control_token
        self._build_lock = threading.Lock()
        self.session_cookie = (
            hmac.new(self._token.encode(), b"polar dashboard session", hashlib.sha256).hexdigest()
            if self._token is not None
            else ""
        )
        """The login cookie's value: an HMAC of the token, never the token itself."""

    # ------------------------------------------------------------ lifespan

    async def start(self) -> None:
        if self.config.server_url is not None:
            assert self._token is not None  # DashboardConfig asks one of a server
            self.rollout = RolloutSource(
                self.config.server_url, self._token, timeout_s=self.config.server_timeout_s
            )

    async def stop(self) -> None:
        source, self.rollout = self.rollout, None
        if source is not None:
            await source.aclose()

    # ------------------------------------------------------------ access

    @property
    def needs_token(self) -> bool:
        """False only without a server, on a loopback address (:class:`DashboardConfig`)."""
        return self._token is not None

    def token_matches(self, given: str) -> bool:
        assert self._token is not None
        return hmac.compare_digest(given.encode(), self._token.encode())

    def authorized(self, authorization: str, cookie: str) -> bool:
        """Whether a request with this ``Authorization`` header and session cookie
        (each ``""`` when absent) may see the dashboard."""
        if self._token is None:
            return True
        given = bearer_token(authorization)
        if given is not None and self.token_matches(given):
            return True
        return hmac.compare_digest(cookie.encode(), self.session_cookie.encode())

    # ------------------------------------------------------------ rollout server

    def require_rollout(self) -> RolloutSource:
        if self.rollout is None:
            raise SourceError(404, "no rollout server given")
        return self.rollout

    async def session_result(self, session_id: str) -> SessionResult | None:
        """The rollout server's result of a session, None if it has none (yet)."""
        source = self.rollout
        task_id = task_of_session(session_id)
        if source is None or task_id is None:
            return None
        result = await source.result(task_id)
        if result is None:
            return None
        return next((r for r in result.results if r.session_id == session_id), None)

    def events(self) -> AsyncIterator[bytes]:
        """The rollout server's event stream as it comes, ended by a
        ``dashboard.error`` event if the server stops answering (404 at once
        without a server)."""
        source = self.require_rollout()

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in source.events():
                    yield chunk
            except SourceError as exc:
                data = orjson.dumps({"message": exc.message}).decode()
                yield f"event: dashboard.error\ndata: {data}\n\n".encode()

        return relay()

    # ------------------------------------------------------------ trajectories

    async def load_session(self, session_id: str) -> tuple[Built | None, str | None]:
        """The session's trajectory rebuilt from the record stores (None if no
        store has it), or why its records do not build."""
        try:
            return await run_in_threadpool(self._built_of, session_id), None
        except TrajectoryError as exc:
            return None, f"the session's records do not build: {exc}"

    def _built_of(self, session_id: str) -> Built | None:
        stored = self.records.find(session_id)
        if stored is None:
            return None
        found = self.records.records(stored)
        with self._build_lock:
            return self.trajectories.of(session_id, found)

    async def trace(self, session_id: str, raw_index: str) -> tuple[Built, int]:
        """The session's trajectory and the index of one of its traces, as a
        path gives it (404 if either is missing, 500 if the session does not build)."""
        built, problem = await self.load_session(session_id)
        if problem is not None:
            raise SourceError(500, problem)
        if built is None:
            raise SourceError(404, f"no session {session_id} in the record stores")
        count = len(built.trajectory.traces)
        if not raw_index.isdigit() or int(raw_index) >= count:
            raise SourceError(
                404, f"session {session_id} has no trace {raw_index} (it has {count})"
            )
        return built, int(raw_index)
