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
import os
from collections.abc import Iterable
from typing import Any

from polar.ir import CompletionRecord, Dialect
from polar.proxy.call.behaviour import SamplingRules, defaults_over
from polar.proxy.call.capture import Capture, build_capture
from polar.proxy.call.offload import Offload
from polar.proxy.call.relay import Relay
from polar.proxy.config import GatewayConfig
from polar.proxy.control.gate import Gate
from polar.proxy.control.sessions import CallTracker, Session, SessionRegistry
from polar.proxy.engines.defaults import model_defaults
from polar.proxy.errors import AuthenticationFailed, StoreUnavailable
from polar.proxy.front.inbound import BodyLimits
from polar.proxy.render.splice import Transcripts
from polar.proxy.store import SqliteStore, StoreError
from polar.proxy.workers.affinity import WorkerSlot

_log = logging.getLogger(__name__)


# Distinct unknown request field names remembered (and logged once each).
MAX_UNKNOWN_FIELDS = 256


def sampling_rules(config: GatewayConfig) -> SamplingRules:
    """The sampling rules ``config`` describes: its policy, and for unset settings its
    defaults over the model's generation config (:mod:`polar.proxy.call.behaviour`)."""
    policy = config.sampling.policy
    return SamplingRules(
        defaults=defaults_over(
            config.sampling.defaults.sampling(), model_defaults(config.render.tokenizer)
        ),
        policy=policy.distribution() if policy is not None else None,
    )


class Gateway:
    def __init__(
        self,
        config: GatewayConfig,
        *,
        capture: Capture | None = None,
        worker: WorkerSlot | None = None,
    ) -> None:
        """``worker``: this gateway is one worker of a group (``--workers N``): it
        writes the group's store beside the others and serves the sessions it owns."""
        self.config = config
        self.worker = worker
        limits = config.limits
        self.store = SqliteStore(
            config.store.path,
            synchronous=config.store.synchronous,
            write_timeout_s=config.store.write_timeout_s,
            member=worker is not None,
        )
        self.transcripts = Transcripts(budget_bytes=limits.transcript_budget_bytes)
        self.sessions = SessionRegistry(self.store, on_close=self.transcripts.drop)
        self.calls = CallTracker()
        self.gate = Gate()
        self.offload = Offload(
            workers=limits.render_workers, budget_bytes=limits.render_budget_bytes
        )
        self.body_limits = BodyLimits(
            depth=limits.max_json_depth,
            string_chars=limits.max_string_chars,
            array_items=limits.max_array_items,
            messages=limits.max_messages,
            tools=limits.max_tools,
        )
        self.capture = (
            capture if capture is not None else build_capture(config, offload=self.offload)
        )
        self.relay = Relay(
            self.capture,
            self.store,
            self.gate,
            self.transcripts,
            self.calls,
            max_attempts=config.engine.max_attempts,
            retry_backoff_s=config.engine.retry_backoff_s,
            pause_wait_s=limits.pause_wait_s,
            sampling=sampling_rules(config),
        )
        self._unknown_fields: set[tuple[Dialect, str]] = set()
        self._unknown_overflow = False

    async def start(self) -> None:
        self.store.open()
        self.sessions.load(self.worker.owns if self.worker is not None else lambda _: True)
        # A restarted gateway stamps the version it last resumed with.
        self.gate.set_policy_version(self.store.policy_version())
        # The engine's context length, asked now rather than on a call's path.
        await self.capture.context.start()

    async def stop(self) -> None:
        await self.capture.context.aclose()
        await self.capture.aclose()
        self.store.close()
        self.offload.close()

    async def resume(self, *, policy_version: int | None = None) -> None:
        """Reopen the gate, with a new policy version if given (persisted first)."""
        if policy_version is not None:
            try:
                await self.store.set_policy_version(policy_version)
            except StoreError as exc:
                raise StoreUnavailable(f"cannot persist the policy version: {exc}") from None
        self.gate.resume(policy_version=policy_version)

    async def settle(
        self, session_id: str, *, grace_s: float = 5.0, timeout_s: float = 30.0
    ) -> int:
        """Wait until the session has no call in flight and every outcome is written.

        Call it once the session's harness has ended (and its key is closed):
        calls still running after ``grace_s`` serve nobody and are cut off,
        recorded as aborted. Returns how many were cut off.
        """
        return await self.calls.settle(session_id, grace_s=grace_s, timeout_s=timeout_s)

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether the gateway can serve and record calls, and the details."""
        store = self.store.state()
        healthy = store.open and store.writing
        where = {} if self.worker is None else {"worker": self.worker.index, "pid": os.getpid()}
        return healthy, {
            "status": "ok" if healthy else "degraded",
            **where,
            "store": {
                "open": store.open,
                "writing": store.writing,
                "queued": store.queued,
                "failed_writes": store.failed_ops,
                "interrupted_at_start": store.interrupted_at_open,
                "last_error": store.last_error,
            },
            "offload_bytes": self.offload.used_bytes,
            "context": self.capture.context.health(),
        }

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
        """Log each request field the dialect does not know, once per gateway.

        At most :data:`MAX_UNKNOWN_FIELDS` names are remembered, each cut to 64
        characters: a client inventing names cannot grow memory or the log."""
        for field in fields:
            name = field[:64]
            if (dialect, name) in self._unknown_fields:
                continue
            if len(self._unknown_fields) >= MAX_UNKNOWN_FIELDS:
                if not self._unknown_overflow:
                    self._unknown_overflow = True
                    _log.warning(
                        "more than %d unknown request field names seen; no longer logging them",
                        MAX_UNKNOWN_FIELDS,
                    )
                return
            self._unknown_fields.add((dialect, name))
            _log.warning("%s: ignoring unknown request field %r", dialect.value, name)

    async def records(self, session_id: str) -> list[CompletionRecord]:
        return await asyncio.to_thread(self.store.records, session_id)
