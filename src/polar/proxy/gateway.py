"""The gateway's services, wired from one config: the Python API of the proxy.

``Gateway`` is what handlers reach through ``request.app.state.gateway`` and
what Python callers (tests, the rollout node) use directly::

    gateway = Gateway(config)
    await gateway.start()
    new = await gateway.sessions.create()
    ...  # point a harness at the app with new.api_key
    records = await gateway.records(new.session.id)
    await gateway.stop()
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from polar.ir import CompletionRecord, Dialect
from polar.proxy.capture import Capture
from polar.proxy.config import GatewayConfig
from polar.proxy.engines.registry import build_capture
from polar.proxy.errors import AuthenticationFailed
from polar.proxy.gate import Gate
from polar.proxy.relay import Relay
from polar.proxy.render.splice import Transcripts
from polar.proxy.sessions import Session, SessionRegistry
from polar.proxy.store import SqliteStore

_log = logging.getLogger(__name__)


class Gateway:
    def __init__(self, config: GatewayConfig, *, capture: Capture | None = None) -> None:
        self.config = config
        self.store = SqliteStore(config.store.path, synchronous=config.store.synchronous)
        self.sessions = SessionRegistry(self.store)
        self.gate = Gate()
        self.transcripts = Transcripts()
        self.capture = capture if capture is not None else build_capture(config)
        self.relay = Relay(
            self.capture,
            self.store,
            self.gate,
            self.transcripts,
            max_attempts=config.engine.max_attempts,
            retry_backoff_s=config.engine.retry_backoff_s,
            pause_wait_s=config.limits.pause_wait_s,
        )
        self._unknown_fields: set[tuple[Dialect, str]] = set()

    async def start(self) -> None:
        self.store.open()
        self.sessions.load()
        # a restarted gateway goes on at the version it was last resumed with
        self.gate.set_policy_version(self.store.policy_version())

    async def stop(self) -> None:
        await self.capture.aclose()
        self.store.close()

    def authenticate(self, api_key: str | None) -> Session:
        session = self.sessions.authenticate(api_key)
        if session is None:
            if not api_key:
                raise AuthenticationFailed(
                    "missing API key: send the session key as 'Authorization: Bearer <key>'"
                )
            raise AuthenticationFailed("unknown or closed session key")
        return session

    def note_unknown_fields(self, dialect: Dialect, fields: Iterable[str]) -> None:
        """Log each request field the dialect does not know, once per gateway."""
        for field in fields:
            if (dialect, field) not in self._unknown_fields:
                self._unknown_fields.add((dialect, field))
                _log.warning("%s: ignoring unknown request field %r", dialect.value, field)

    async def records(self, session_id: str) -> list[CompletionRecord]:
        return await asyncio.to_thread(self.store.records, session_id)
