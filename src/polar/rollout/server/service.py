"""The rollout server: tasks in, groups of scored sessions out.

A submitted task becomes ``num_samples`` queued sessions (one GRPO group). The
dispatcher hands queued sessions to healthy, non-draining nodes, the least
loaded first, never more than a node's capacity. Nodes POST each finished
session's result to ``/callbacks/sessions``; the server stores it, then
acknowledges it on the next heartbeat. A task finishes when all its sessions
ended, or early once ``early_stop_at`` of them are usable (the rest are
cancelled). Sessions the infrastructure failed (a lost node, a sandbox that
could not be prepared, a failed engine: :mod:`polar.rollout.failure`) are
resampled while ``max_resamples`` allows; the agent's failures are results.

**Nothing is lost silently.** Every decision is stored before it is acted on
(:mod:`polar.rollout.server.store`). A node silent for ``node_timeout_s`` gets no new
sessions; after twice that, its sessions end ERROR (and are resampled if
allowed). A heartbeat that lists a session the server does not know gets it
cancelled (no orphans); a dispatched session a node no longer lists is
reported lost. After a restart, queued sessions resume, dispatched ones are
reconciled with their node's heartbeats once it re-registers, and those whose
node never comes back are reported as lost.

This module is the task lifecycle, composing the parts: the node registry
(:mod:`polar.rollout.server.nodes`), the dispatcher and its leases
(:mod:`polar.rollout.server.dispatch`), and the callbacks' delivery
(:mod:`polar.rollout.server.delivery`). It refuses with the typed errors of
:mod:`polar.rollout.server.errors` and speaks no HTTP: its API is
:mod:`polar.rollout.server.app`, which drives it from its handlers and its
lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
import uuid
from collections.abc import Coroutine
from typing import Any

from polar.harness import InvalidHarnessOptions, UnknownHarness, check_harness
from polar.rollout.config import ServerConfig
from polar.rollout.failure import FailureReason, replaceable
from polar.rollout.files import FilesError, FileStore, unfinished
from polar.rollout.protocol import (
    EventKind,
    HeartbeatReply,
    NodeHeartbeat,
    NodeRegistration,
    NodeView,
    SessionResult,
    SessionStatus,
    TaskStatus,
    TaskSubmission,
)
from polar.rollout.server.delivery import CallbackDelivery
from polar.rollout.server.dispatch import Dispatcher
from polar.rollout.server.errors import (
    InvalidResult,
    InvalidSubmission,
    SessionUnknown,
    TaskExists,
    TaskNotFound,
)
from polar.rollout.server.events import EventHub
from polar.rollout.server.nodes import NodeRegistry
from polar.rollout.server.store import RolloutStore

_log = logging.getLogger(__name__)


class Background:
    """Work started and not awaited (the dispatcher's loops, calls to nodes,
    callbacks, cancellations): all of it cancelled when the server stops."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def cancel(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class RolloutServer:
    def __init__(self, config: ServerConfig, *, public_url: str | None = None) -> None:
        self.config = config
        self.store = RolloutStore(config.db)
        self.files = FileStore(config.db.parent / "files")
        """Tasks' host paths packed at submission, for nodes (:mod:`polar.rollout.files`)."""
        self.events = EventHub()
        self.nodes = NodeRegistry(self.store, self.events, config.node_timeout_s)
        self._background = Background()
        self.dispatcher = Dispatcher(
            config,
            self.store,
            self.nodes,
            self,
            self._background.spawn,
            public_url=public_url or f"http://{config.host}:{config.port}",
        )
        self.callbacks = CallbackDelivery(config, self.store)
        self._finished = asyncio.Condition()

    @property
    def public_url(self) -> str:
        """Where nodes reach this server (their results' URL)."""
        return self.dispatcher.public_url

    @public_url.setter
    def public_url(self, url: str) -> None:
        self.dispatcher.public_url = url

    # ---------------------------------------------------------------- life

    async def start(self) -> None:
        self.callbacks.open()
        for partial in unfinished(self.files.root):
            partial.unlink(missing_ok=True)
        self._recover()
        self.dispatcher.start()

    async def stop(self) -> None:
        self.events.close()
        await self._background.cancel()
        await self.dispatcher.close()
        await self.callbacks.close()
        self.store.close()

    def _recover(self) -> None:
        """After a restart: know the nodes again, finish tasks whose sessions all ended,
        re-send owed callbacks."""
        self.nodes.recover()
        for task in self.store.tasks(limit=1_000_000):
            if task.status is TaskStatus.RUNNING:
                self._maybe_finish(task.task_id)
            elif not task.callback_done and task.submission.callback_url:
                self._background.spawn(self.callbacks.deliver(task.task_id))
        in_flight = self.store.in_flight()
        if in_flight:
            _log.info(
                "%d sessions were on nodes when the server stopped; waiting for their nodes",
                len(in_flight),
            )

    # ---------------------------------------------------------------- tasks

    async def submit(self, submission: TaskSubmission) -> tuple[str, str]:
        """Store a submission, its host paths packed for nodes that do not share them;
        its task id and its read token (shown once). A harness that could not run
        (unknown, or options it refuses) or a path that cannot be packed is refused
        here rather than failing every session."""
        try:
            task = await asyncio.to_thread(self.files.ship, submission.task)
        except FilesError as exc:
            raise InvalidSubmission(str(exc)) from None
        submission = submission.model_copy(update={"task": task})
        harness = submission.harness
        try:
            check_harness(harness.name, harness.options)
        except UnknownHarness as exc:
            raise InvalidSubmission(f"harness.name: {exc}") from None
        except InvalidHarnessOptions as exc:
            raise InvalidSubmission(f"harness.options: {exc}") from None
        task_id = submission.task_id or f"t-{uuid.uuid4().hex[:16]}"
        if self.store.task(task_id) is not None:
            raise TaskExists(task_id)
        token = secrets.token_urlsafe(32)
        self.store.add_task(task_id, submission, hashlib.sha256(token.encode()).hexdigest())
        self.events.publish(
            EventKind.TASK_SUBMITTED,
            task_id=task_id,
            task=submission.task.id,
            num_samples=submission.num_samples,
        )
        self.dispatcher.wake()
        return task_id, token

    def may_read(self, task_id: str, given: bytes | None) -> bool:
        """Whether ``given`` (a bearer token) is ``task_id``'s own read token."""
        digest = self.store.token_sha256(task_id)
        if given is None or digest is None:
            return False
        return hmac.compare_digest(hashlib.sha256(given).hexdigest().encode(), digest.encode())

    async def cancel_task(self, task_id: str) -> None:
        task = self.store.task(task_id)
        if task is None:
            raise TaskNotFound(task_id)
        if task.status is not TaskStatus.RUNNING:
            return
        self.store.update_task(task_id, cancel_requested=1)
        await self._cancel_sessions(task_id, "the task was cancelled")

    async def _cancel_sessions(self, task_id: str, reason: str) -> None:
        for session in self.store.sessions_of(task_id):
            if session.status is SessionStatus.QUEUED:
                self.store.set_session(
                    session.session_id,
                    SessionStatus.CANCELLED,
                    error=reason,
                    failure=FailureReason.CANCELLED,
                )
                self.session_changed(session.session_id)
            elif not session.status.terminal and session.node_id is not None:
                self.dispatcher.cancel(session.node_id, session.session_id)
        self._maybe_finish(task_id)

    async def wait_finished(self, task_id: str, timeout_s: float) -> bool:
        async with self._finished:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._finished.wait_for(lambda: self._is_finished(task_id)), timeout_s
                )
        return self._is_finished(task_id)

    def _is_finished(self, task_id: str) -> bool:
        task = self.store.task(task_id)
        return task is not None and task.status is not TaskStatus.RUNNING

    def _maybe_finish(self, task_id: str) -> None:
        task = self.store.task(task_id)
        if task is None or task.status is not TaskStatus.RUNNING:
            return
        sessions = self.store.sessions_of(task_id)
        if any(not session.status.terminal for session in sessions):
            return
        if task.cancel_requested:
            status = TaskStatus.CANCELLED
        elif any(session.status is SessionStatus.COMPLETED for session in sessions):
            status = TaskStatus.COMPLETED
        else:
            status = TaskStatus.FAILED
        self.store.update_task(task_id, status=status, finished_at=time.time())
        view = self.store.view(task_id)
        assert view is not None
        self.events.publish(
            EventKind.TASK_FINISHED,
            task_id=task_id,
            status=status.value,
            counts=view.counts,
            mean_reward=view.mean_reward,
        )
        self._background.spawn(self._notify_finished())
        if task.submission.callback_url:
            self._background.spawn(self.callbacks.deliver(task_id))

    async def _notify_finished(self) -> None:
        async with self._finished:
            self._finished.notify_all()

    # ---------------------------------------------------------------- sessions

    def accept_result(self, result: SessionResult) -> None:
        session = self.store.session(result.session_id)
        if session is None or session.task_id != result.task_id:
            raise SessionUnknown(result.session_id, result.task_id)
        if session.status.terminal:
            return  # delivered twice (a retry after a lost reply): already stored
        if not result.status.terminal:
            raise InvalidResult(f"status {result.status.value} is not a final status")
        self.store.set_result(result)
        self.events.publish(
            EventKind.SESSION_RESULT,
            task_id=session.task_id,
            session_id=session.session_id,
            sample_index=session.sample_index,
            status=result.status.value,
            reward=result.reward,
            error=result.error,
            failure=result.failure.value if result.failure is not None else None,
        )
        self._after_session_ended(session.task_id, session.session_id, result.failure)

    def lost(
        self, session_id: str, reason: str, failure: FailureReason = FailureReason.NODE_LOST
    ) -> None:
        session = self.store.session(session_id)
        if session is None or session.status.terminal:
            return
        _log.warning("session %s lost: %s", session_id, reason)
        self.store.set_session(session_id, SessionStatus.ERROR, error=reason, failure=failure)
        self.session_changed(session_id)
        self._after_session_ended(session.task_id, session_id, failure)

    def _after_session_ended(
        self, task_id: str, session_id: str, failure: FailureReason | None
    ) -> None:
        task = self.store.task(task_id)
        assert task is not None
        sub = task.submission
        sessions = self.store.sessions_of(task_id)
        wanted = (
            task.status is TaskStatus.RUNNING
            and not task.cancel_requested
            and not task.early_stopped
        )
        if wanted and sub.early_stop_at is not None:
            usable_count = sum(
                1 for session in sessions if session.result is not None and session.result.usable
            )
            if usable_count >= sub.early_stop_at:
                self.store.update_task(task_id, early_stopped=1)
                self._background.spawn(
                    self._cancel_sessions(task_id, "early stop: the group is full")
                )
                return
        resampled = len(sessions) - sub.num_samples
        if wanted and replaceable(failure) and resampled < sub.max_resamples:
            index = max(session.sample_index for session in sessions) + 1
            replacement = self.store.add_session(task_id, index)
            self.store.set_replaced(session_id, replacement)
            self.events.publish(
                EventKind.SESSION_STATUS,
                task_id=task_id,
                session_id=replacement,
                sample_index=index,
                status=SessionStatus.QUEUED.value,
                replaces=session_id,
            )
            self.dispatcher.wake()
            return
        self._maybe_finish(task_id)

    def session_changed(self, session_id: str) -> None:
        session = self.store.session(session_id)
        if session is not None:
            self.events.publish(
                EventKind.SESSION_STATUS,
                task_id=session.task_id,
                session_id=session.session_id,
                sample_index=session.sample_index,
                status=session.status.value,
                node_id=session.node_id,
                error=session.error,
                failure=session.failure.value if session.failure is not None else None,
            )

    # ---------------------------------------------------------------- nodes

    def register(self, registration: NodeRegistration) -> None:
        self.nodes.register(registration)
        self.dispatcher.wake()

    def heartbeat(self, node_id: str, beat: NodeHeartbeat) -> HeartbeatReply:
        node = self.nodes.beat(node_id, beat.engine_error)
        return self.dispatcher.reconcile(node, beat)

    def drain(self, node_id: str, draining: bool) -> NodeView:
        node = self.nodes.drain(node_id, draining)
        if not draining:
            self.dispatcher.wake()
        return self.nodes.view(node)

    def node_died(self, node_id: str, reason: str) -> None:
        """A node known to be gone (its Ray actor died): forgotten now, and its sessions
        end ERROR with ``reason`` (resampled where allowed), without waiting for the
        heartbeat timeout."""
        self.nodes.forget(node_id)
        self.dispatcher.end_leases(node_id, f"node {node_id} died: {reason}")
