"""The rollout server's dispatcher: queued sessions onto nodes, and the leases it keeps.

A **lease** is a session handed to a node and not ended: the store names its
node and when it was dispatched, written before the node is asked, so that a
crash between the two is settled by the node's heartbeats (it holds the
session, or the session is lost).

- **Dispatch** (a loop, woken by new work or every ten ``dispatch_interval_s``):
  queued sessions of the oldest task first go to the healthy, non-draining
  node with the most free slots, never past its capacity. A node that does not
  answer is marked unhealthy and the session stays queued, as it does when the
  node answers 5xx; a node that refuses it (4xx, its policy) ends it
  ``refused``.
- **Heartbeats** reconcile a node's sessions with the leases: a session the
  server does not know, or already ended, is cancelled on the node (no
  orphans); a result the node holds and has not delivered is fetched; a
  leased session the node no longer lists, ``LOST_GRACE_S`` after its
  dispatch, is lost.
- **Monitor** (a loop, every ``min(1, node_timeout_s / 4)`` s): nodes silent
  for twice ``node_timeout_s`` are forgotten and their leases end
  (``node_lost``), except within that long after the start, while nodes that
  held sessions before a restart may still come back.

What a session's end means for its task (resampling, early stop, finishing)
is the task lifecycle's (:class:`~polar.rollout.server.service.RolloutServer`), told
through :class:`Outcomes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import httpx

from polar.rollout.config import ServerConfig
from polar.rollout.failure import FailureReason
from polar.rollout.protocol import (
    HeartbeatReply,
    NodeHeartbeat,
    SessionDispatch,
    SessionResult,
    SessionStatus,
)
from polar.rollout.server.errors import RolloutServerError
from polar.rollout.server.nodes import NodeRegistry, NodeState
from polar.rollout.server.store import RolloutStore, SessionRow

_log = logging.getLogger(__name__)

LOST_GRACE_S = 10.0
"""A dispatched session absent from its node's heartbeat this long after dispatch is lost."""

Spawn = Callable[[Coroutine[Any, Any, None]], None]
"""Runs a coroutine in the background, cancelled when the server stops."""


class Outcomes(Protocol):
    """What the dispatcher tells the task lifecycle about sessions."""

    def lost(
        self, session_id: str, reason: str, failure: FailureReason = FailureReason.NODE_LOST
    ) -> None:
        """The session ended ERROR on the server's side, for ``reason``."""

    def accept_result(self, result: SessionResult) -> None:
        """A node's result of a session (raises :class:`RolloutServerError` if refused)."""

    def session_changed(self, session_id: str) -> None:
        """The session's stored status changed (to be announced)."""


class Dispatcher:
    def __init__(
        self,
        config: ServerConfig,
        store: RolloutStore,
        nodes: NodeRegistry,
        outcomes: Outcomes,
        spawn: Spawn,
        *,
        public_url: str,
    ) -> None:
        self._config = config
        self._store = store
        self._nodes = nodes
        self._http: httpx.AsyncClient | None = None
        """For nodes: carries the control token."""
        self._outcomes = outcomes
        self._spawn = spawn
        self._wake = asyncio.Event()
        self._started_at = time.monotonic()
        self.public_url = public_url
        """Where nodes deliver results (``<public_url>/callbacks/sessions``)."""

    def start(self) -> None:
        headers = {"authorization": f"Bearer {self._config.control_token}"}
        self._http = httpx.AsyncClient(headers=headers, timeout=30)
        self._started_at = time.monotonic()
        self._spawn(self._dispatch_loop())
        self._spawn(self._monitor_loop())

    async def close(self) -> None:
        """After the loops and calls to nodes were cancelled."""
        if self._http is not None:
            await self._http.aclose()

    def wake(self) -> None:
        """There may be work: a queued session, or a node with room."""
        self._wake.set()

    # ---------------------------------------------------------------- dispatch

    async def _dispatch_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._config.dispatch_interval_s * 10)
            self._wake.clear()
            try:
                await self._dispatch_queued()
            except Exception:
                _log.exception("dispatch failed")
                await asyncio.sleep(self._config.dispatch_interval_s)

    async def _dispatch_queued(self) -> None:
        queued = self._store.queued()
        if not queued:
            return
        active = self._nodes.active()
        for session in queued:
            # Each send awaits a node: a cancel may have ended this session meanwhile
            # (read again here, with no await before it is marked dispatched).
            current = self._store.session(session.session_id)
            if current is None or current.status is not SessionStatus.QUEUED:
                continue
            candidates = [
                candidate
                for candidate in self._nodes
                if self._nodes.healthy(candidate)
                and not candidate.draining
                and active.get(candidate.id, 0) < candidate.registration.capacity.sessions
            ]
            if not candidates:
                return
            node = max(
                candidates,
                key=lambda candidate: (
                    candidate.registration.capacity.sessions - active.get(candidate.id, 0)
                ),
            )
            if await self._send(node, session):
                active[node.id] = active.get(node.id, 0) + 1

    def _dispatch_of(self, session: SessionRow) -> SessionDispatch:
        """What a node is told of a session: its task's submission, where to deliver."""
        task = self._store.task(session.task_id)
        assert task is not None
        sub = task.submission
        return SessionDispatch(
            session_id=session.session_id,
            task_id=session.task_id,
            sample_index=session.sample_index,
            task=sub.task,
            harness=sub.harness,
            builder=sub.builder,
            session_timeout_s=sub.session_timeout_s,
            group_id=sub.group_id or session.task_id,
            all_traces=sub.all_traces,
            conversations=sub.conversations,
            sampling=sub.sampling,
            metadata=sub.metadata,
            result_url=f"{self.public_url}/callbacks/sessions",
        )

    async def _send(self, node: NodeState, session: SessionRow) -> bool:
        assert self._http is not None
        dispatch = self._dispatch_of(session)
        # Stored first: a crash between here and the node's answer is reconciled
        # by the node's heartbeat (it holds the session, or it is lost).
        self._store.set_session(
            session.session_id, SessionStatus.DISPATCHED, node_id=node.id, dispatched=True
        )
        try:
            reply = await self._http.post(
                f"{node.registration.url}/node/sessions", content=dispatch.model_dump_json()
            )
        except httpx.HTTPError as exc:
            _log.warning("node %s unreachable: %s", node.id, exc)
            self._nodes.unreachable(node)
            self._store.set_session(session.session_id, SessionStatus.QUEUED, clear_node=True)
            return False
        if reply.status_code >= 500:
            self._store.set_session(session.session_id, SessionStatus.QUEUED, clear_node=True)
            return False
        if reply.status_code >= 400:
            self._outcomes.lost(
                session.session_id,
                f"node {node.id} refused the session: {_reason(reply)}",
                FailureReason.REFUSED,
            )
            return False
        self._outcomes.session_changed(session.session_id)
        return True

    # ---------------------------------------------------------------- leases

    def reconcile(self, node: NodeState, beat: NodeHeartbeat) -> HeartbeatReply:
        """Settle the sessions ``node`` says it holds with the leases; what it should
        forget (stored here) and cancel (not wanted here)."""
        forget: list[str] = []
        cancel: list[str] = []
        for sid, status in beat.sessions.items():
            session = self._store.session(sid)
            if session is None:
                cancel.append(sid)  # not ours: an orphan from a lost dispatch
                continue
            if session.status.terminal:
                # Stored or decided here (forget it), or ended here (cancelled while
                # the node was unreachable, declared lost) while the node still runs it.
                (forget if status.terminal else cancel).append(sid)
                continue
            if status.terminal:
                self._spawn(self._fetch_result(node, sid))
            elif status is not session.status and status is not SessionStatus.QUEUED:
                self._store.set_session(sid, status, node_id=node.id)
                self._outcomes.session_changed(sid)
        held = set(beat.sessions)
        wall = time.time()
        for session in self._store.in_flight():
            if (
                session.node_id == node.id
                and session.session_id not in held
                and (session.dispatched_at is None or wall - session.dispatched_at > LOST_GRACE_S)
            ):
                self._outcomes.lost(
                    session.session_id, f"node {node.id} no longer holds the session"
                )
        return HeartbeatReply(forget=forget, cancel=cancel)

    async def _fetch_result(self, node: NodeState, session_id: str) -> None:
        """Pull a finished session's result that the node has not delivered yet."""
        assert self._http is not None
        try:
            reply = await self._http.get(f"{node.registration.url}/node/sessions/{session_id}")
            reply.raise_for_status()
            raw = reply.json().get("result")
            if raw is not None:
                self._outcomes.accept_result(SessionResult.model_validate(raw))
        except (httpx.HTTPError, ValueError, RolloutServerError) as exc:
            _log.warning("could not fetch the result of %s: %s", session_id, exc)

    def cancel(self, node_id: str, session_id: str) -> None:
        """Ask the node to cancel the session (in the background)."""
        self._spawn(self._cancel_on_node(node_id, session_id))

    async def _cancel_on_node(self, node_id: str, session_id: str) -> None:
        node = self._nodes.get(node_id)
        if node is None or self._http is None:
            return  # the heartbeat reconciliation cancels it when the node returns
        try:
            reply = await self._http.post(
                f"{node.registration.url}/node/sessions/{session_id}/cancel"
            )
            if reply.status_code == 404:
                self._outcomes.lost(session_id, f"node {node_id} no longer holds the session")
        except httpx.HTTPError as exc:
            _log.warning("could not cancel %s on %s: %s", session_id, node_id, exc)

    def end_leases(self, node_id: str, reason: str) -> None:
        """Every session on ``node_id`` is lost, for ``reason``."""
        for session in self._store.in_flight():
            if session.node_id == node_id:
                self._outcomes.lost(session.session_id, reason)

    # ---------------------------------------------------------------- monitor

    async def _monitor_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self._config.node_timeout_s / 4))
            try:
                self._check_nodes()
            except Exception:
                _log.exception("node check failed")

    def _check_nodes(self) -> None:
        self._nodes.expire()
        if time.monotonic() - self._started_at <= 2 * self._config.node_timeout_s:
            return  # nodes that held sessions before a restart may still come back
        for session in self._store.in_flight():
            if session.node_id is not None and session.node_id not in self._nodes:
                self._outcomes.lost(session.session_id, f"node {session.node_id} stopped answering")


def _reason(reply: httpx.Response) -> str:
    """The one-line message of an API error answer (its body's start otherwise)."""
    try:
        return str(reply.json()["error"]["message"])[:500]
    except (ValueError, KeyError, TypeError):
        return reply.text[:300]
