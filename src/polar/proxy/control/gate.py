"""The weight-sync gate: pause new engine calls, drain in-flight ones, resume.

A trainer pauses the gateway before it loads new weights into the engine, and
resumes it with the new ``policy_version``, which is stamped on every record
admitted afterwards. (:meth:`polar.proxy.gateway.Gateway.resume` persists the
version first, so a restarted gateway resumes at it.) Calls that arrive while
paused wait (up to a limit) rather than fail, so harnesses see a slow call
instead of an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from polar.proxy.errors import GatewayPaused


@dataclass(frozen=True, slots=True)
class GateStatus:
    paused: bool
    inflight: int
    policy_version: int
    waiting: int = 0
    """Calls waiting at the closed gate."""


@dataclass(frozen=True, slots=True)
class PauseOutcome:
    drained: bool
    waited_s: float
    drained_calls: int
    """Calls that were in flight when the gate closed: they finish (or are still
    finishing, if not ``drained``) under the old policy version."""


class Gate:
    def __init__(self, *, policy_version: int = 0) -> None:
        self._policy_version = policy_version
        self._inflight = 0
        self._waiting = 0
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()

    def status(self) -> GateStatus:
        return GateStatus(
            paused=not self._open.is_set(),
            inflight=self._inflight,
            policy_version=self._policy_version,
            waiting=self._waiting,
        )

    @contextlib.asynccontextmanager
    async def admit(self, *, wait_s: float) -> AsyncIterator[int]:
        """Hold one in-flight slot; yields the policy version the call runs under."""
        if not self._open.is_set():
            self._waiting += 1
            try:
                await asyncio.wait_for(self._open.wait(), timeout=wait_s)
            except TimeoutError:
                raise GatewayPaused(
                    f"the gateway is paused for a weight update and stayed paused for {wait_s:g}s"
                ) from None
            finally:
                self._waiting -= 1
        self._inflight += 1
        self._idle.clear()
        try:
            yield self._policy_version
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    async def pause(self, *, timeout_s: float) -> PauseOutcome:
        """Close the gate and wait for in-flight calls to finish.

        On timeout the gate stays closed: the caller decides whether to resume.
        """
        self._open.clear()
        inflight = self._inflight
        start = time.monotonic()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=timeout_s)
        except TimeoutError:
            return PauseOutcome(False, time.monotonic() - start, inflight)
        return PauseOutcome(True, time.monotonic() - start, inflight)

    def resume(self, *, policy_version: int | None = None) -> None:
        if policy_version is not None:
            self._policy_version = policy_version
        self._open.set()

    def set_policy_version(self, policy_version: int) -> None:
        self._policy_version = policy_version
