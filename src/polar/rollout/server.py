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
(:mod:`polar.rollout.store`). A node silent for ``node_timeout_s`` gets no new
sessions; after twice that, its sessions end ERROR (and are resampled if
allowed). A heartbeat that lists a session the server does not know gets it
cancelled (no orphans); a dispatched session a node no longer lists is
reported lost. After a restart, queued sessions resume, dispatched ones are
reconciled with their node's heartbeats once it re-registers, and those whose
node never comes back are reported as lost.

Its HTTP API is :mod:`polar.rollout.server_app`; this module is the domain
object alone, driven by that app's handlers and its lifespan.
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
from dataclasses import dataclass, field

import httpx

from polar.harness import InvalidHarnessOptions, UnknownHarness, check_harness
from polar.rollout.callbacks import signed_headers
from polar.rollout.config import ServerConfig
from polar.rollout.events import EventHub
from polar.rollout.failure import FailureReason, replaceable
from polar.rollout.files import FileStore, unfinished
from polar.rollout.http import ApiError
from polar.rollout.protocol import (
    EventKind,
    GatewayAccess,
    HeartbeatReply,
    NodeHeartbeat,
    NodeRegistration,
    NodeView,
    SessionDispatch,
    SessionResult,
    SessionStatus,
    TaskStatus,
    TaskSubmission,
)
from polar.rollout.store import RolloutStore, SessionRow

_log = logging.getLogger(__name__)

LOST_GRACE_S = 10.0
"""A dispatched session absent from its node's heartbeat this long after dispatch is lost."""


@dataclass(slots=True)
class NodeState:
    registration: NodeRegistration
    last_seen: float = field(default_factory=time.monotonic)
    draining: bool = False
    engine_error: str | None = None

    @property
    def id(self) -> str:
        return self.registration.node_id


class RolloutServer:
    def __init__(self, config: ServerConfig, *, public_url: str | None = None) -> None:
        self.config = config
        self.public_url = public_url or f"http://{config.host}:{config.port}"
        self.store = RolloutStore(config.db)
        self.files = FileStore(config.db.parent / "files")
        """Tasks' host paths packed at submission, for nodes (:mod:`polar.rollout.files`)."""
        self.events = EventHub()
        self.nodes: dict[str, NodeState] = {}
        self._wake = asyncio.Event()
        self._finished = asyncio.Condition()
        self._loops: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._http: httpx.AsyncClient | None = None
        """For nodes: carries the control token."""
        self._callbacks: httpx.AsyncClient | None = None
        """For callback URLs: carries no credential."""
        self._started_at = time.monotonic()

    # ---------------------------------------------------------------- life

    async def start(self) -> None:
        headers = {"authorization": f"Bearer {self.config.control_token}"}
        self._http = httpx.AsyncClient(headers=headers, timeout=30)
        self._callbacks = httpx.AsyncClient(timeout=30)
        self._started_at = time.monotonic()
        for partial in unfinished(self.files.root):
            partial.unlink(missing_ok=True)
        self._recover()
        self._loops = [
            asyncio.ensure_future(self._dispatch_loop()),
            asyncio.ensure_future(self._monitor_loop()),
        ]

    async def stop(self) -> None:
        self.events.close()
        for task in [*self._loops, *self._background]:
            task.cancel()
        await asyncio.gather(*self._loops, *self._background, return_exceptions=True)
        for client in (self._http, self._callbacks):
            if client is not None:
                await client.aclose()
        self.store.close()

    def _recover(self) -> None:
        """After a restart: know the nodes again, finish tasks whose sessions all ended,
        re-send owed callbacks."""
        now, wall = time.monotonic(), time.time()
        for row in self.store.nodes():
            self.nodes[row.registration.node_id] = NodeState(
                row.registration,
                last_seen=now - max(0.0, wall - row.last_seen),
                draining=row.draining,
            )
        for task in self.store.tasks(limit=1_000_000):
            if task.status is TaskStatus.RUNNING:
                self._maybe_finish(task.task_id)
            elif not task.callback_done and task.submission.callback_url:
                self._spawn(self._callback(task.task_id))
        in_flight = self.store.in_flight()
        if in_flight:
            _log.info(
                "%d sessions were on nodes when the server stopped; waiting for their nodes",
                len(in_flight),
            )

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---------------------------------------------------------------- tasks

    def submit(self, submission: TaskSubmission) -> tuple[str, str]:
        """Store a submission; its task id and its read token (shown once). A harness
        that could not run (unknown, or options it refuses) is refused here, 422,
        rather than failing every session."""
        harness = submission.harness
        try:
            check_harness(harness.name, harness.options)
        except UnknownHarness as exc:
            raise ApiError(422, f"harness.name: {exc}") from None
        except InvalidHarnessOptions as exc:
            raise ApiError(422, f"harness.options: {exc}") from None
        task_id = submission.task_id or f"t-{uuid.uuid4().hex[:16]}"
        if self.store.task(task_id) is not None:
            raise ApiError(409, f"task {task_id} already exists", "conflict")
        token = secrets.token_urlsafe(32)
        self.store.add_task(task_id, submission, hashlib.sha256(token.encode()).hexdigest())
        self.events.publish(
            EventKind.TASK_SUBMITTED,
            task_id=task_id,
            task=submission.task.id,
            num_samples=submission.num_samples,
        )
        self._wake.set()
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
            raise ApiError(404, f"no task {task_id}", "not_found")
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
                self._session_event(session.session_id)
            elif not session.status.terminal and session.node_id is not None:
                self._spawn(self._cancel_on_node(session.node_id, session.session_id))
        self._maybe_finish(task_id)

    async def _cancel_on_node(self, node_id: str, session_id: str) -> None:
        node = self.nodes.get(node_id)
        if node is None or self._http is None:
            return  # the heartbeat reconciliation cancels it when the node returns
        try:
            reply = await self._http.post(
                f"{node.registration.url}/node/sessions/{session_id}/cancel"
            )
            if reply.status_code == 404:
                self._lost(session_id, f"node {node_id} no longer holds the session")
        except httpx.HTTPError as exc:
            _log.warning("could not cancel %s on %s: %s", session_id, node_id, exc)

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
        self._spawn(self._notify_finished())
        if task.submission.callback_url:
            self._spawn(self._callback(task_id))

    async def _notify_finished(self) -> None:
        async with self._finished:
            self._finished.notify_all()

    async def _callback(self, task_id: str) -> None:
        """POST the task's result to its callback URL, signed, without a token."""
        task = self.store.task(task_id)
        result = self.store.result(task_id)
        url = task.submission.callback_url if task is not None else None
        if task is None or result is None or url is None or self._callbacks is None:
            return
        body = result.model_dump_json().encode()
        secret = task.submission.callback_secret or self.config.control_token
        wait, error = 1.0, None
        for attempt in range(1, self.config.callback_attempts + 1):
            try:
                reply = await self._callbacks.post(
                    url, content=body, headers=signed_headers(body, secret)
                )
                if reply.status_code < 300:
                    self.store.update_task(task_id, callback_done=1, callback_error=None)
                    return
                error = f"HTTP {reply.status_code}: {reply.text[:200]}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            _log.warning("callback for %s failed (attempt %d): %s", task_id, attempt, error)
            if attempt < self.config.callback_attempts:
                await asyncio.sleep(wait)
                wait *= 2
        self.store.update_task(
            task_id,
            callback_done=1,
            callback_error=f"{self.config.callback_attempts} attempts failed; last: {error}",
        )

    # ---------------------------------------------------------------- results

    def accept_result(self, result: SessionResult) -> None:
        session = self.store.session(result.session_id)
        if session is None or session.task_id != result.task_id:
            raise ApiError(404, f"no session {result.session_id} of task {result.task_id}")
        if session.status.terminal:
            return  # delivered twice (a retry after a lost reply): already stored
        if not result.status.terminal:
            raise ApiError(422, f"status {result.status.value} is not a final status")
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

    def _lost(
        self, session_id: str, reason: str, failure: FailureReason = FailureReason.NODE_LOST
    ) -> None:
        session = self.store.session(session_id)
        if session is None or session.status.terminal:
            return
        _log.warning("session %s lost: %s", session_id, reason)
        self.store.set_session(session_id, SessionStatus.ERROR, error=reason, failure=failure)
        self._session_event(session_id)
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
                self._spawn(self._cancel_sessions(task_id, "early stop: the group is full"))
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
            self._wake.set()
            return
        self._maybe_finish(task_id)

    def _session_event(self, session_id: str) -> None:
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
        old = self.nodes.get(registration.node_id)
        draining = old.draining if old else False
        self.store.save_node(registration, draining=draining)
        self.nodes[registration.node_id] = NodeState(registration, draining=draining)
        self.events.publish(
            EventKind.NODE_REGISTERED, node_id=registration.node_id, url=registration.url
        )
        self._wake.set()

    def heartbeat(self, node_id: str, beat: NodeHeartbeat) -> HeartbeatReply:
        node = self.nodes.get(node_id)
        if node is None:
            raise ApiError(404, f"node {node_id} is not registered", "not_found")
        node.last_seen = time.monotonic()
        node.engine_error = beat.engine_error  # the node logs the change
        self.store.node_seen(node_id)
        forget: list[str] = []
        cancel: list[str] = []
        for sid, status in beat.sessions.items():
            session = self.store.session(sid)
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
                self.store.set_session(sid, status, node_id=node_id)
                self._session_event(sid)
        held = set(beat.sessions)
        wall = time.time()
        for session in self.store.in_flight():
            if (
                session.node_id == node_id
                and session.session_id not in held
                and (session.dispatched_at is None or wall - session.dispatched_at > LOST_GRACE_S)
            ):
                self._lost(session.session_id, f"node {node_id} no longer holds the session")
        return HeartbeatReply(forget=forget, cancel=cancel)

    def node_died(self, node_id: str, reason: str) -> None:
        """A node known to be gone (its Ray actor died): forgotten now, and its sessions
        end ERROR with ``reason`` (resampled where allowed), without waiting for the
        heartbeat timeout."""
        if self.nodes.pop(node_id, None) is not None:
            self.store.drop_node(node_id)
            self.events.publish(EventKind.NODE_LOST, node_id=node_id)
        for session in self.store.in_flight():
            if session.node_id == node_id:
                self._lost(session.session_id, f"node {node_id} died: {reason}")

    async def _fetch_result(self, node: NodeState, session_id: str) -> None:
        """Pull a finished session's result that the node has not delivered yet."""
        assert self._http is not None
        try:
            reply = await self._http.get(f"{node.registration.url}/node/sessions/{session_id}")
            reply.raise_for_status()
            raw = reply.json().get("result")
            if raw is not None:
                self.accept_result(SessionResult.model_validate(raw))
        except (httpx.HTTPError, ValueError, ApiError) as exc:
            _log.warning("could not fetch the result of %s: %s", session_id, exc)

    def drain(self, node_id: str, draining: bool) -> NodeView:
        node = self.nodes.get(node_id)
        if node is None:
            raise ApiError(404, f"node {node_id} is not registered", "not_found")
        self.store.set_draining(node_id, draining)
        node.draining = draining
        if not draining:
            self._wake.set()
        return self.node_view(node)

    def _healthy(self, node: NodeState) -> bool:
        """The node answers its heartbeats (what dispatch needs: a harness that makes no
        model call runs without an engine; whether the engine answers is reported apart)."""
        return time.monotonic() - node.last_seen < self.config.node_timeout_s

    def _active(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for session in self.store.in_flight():
            if session.node_id is not None:
                counts[session.node_id] = counts.get(session.node_id, 0) + 1
        return counts

    def gateways(self) -> list[GatewayAccess]:
        """Every registered node's gateway that said how a trainer reaches it."""
        return [
            node.registration.gateway
            for node in self.nodes.values()
            if node.registration.gateway is not None
        ]

    def node_view(self, node: NodeState) -> NodeView:
        return NodeView(
            node_id=node.id,
            url=node.registration.url,
            capacity=node.registration.capacity,
            healthy=self._healthy(node) and node.engine_error is None,
            draining=node.draining,
            active=self._active().get(node.id, 0),
            last_seen=round(time.monotonic() - node.last_seen, 3),
            engine_error=node.engine_error,
        )

    # ---------------------------------------------------------------- loops

    async def _dispatch_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.dispatch_interval_s * 10)
            self._wake.clear()
            try:
                await self._dispatch_queued()
            except Exception:
                _log.exception("dispatch failed")
                await asyncio.sleep(self.config.dispatch_interval_s)

    async def _dispatch_queued(self) -> None:
        queued = self.store.queued()
        if not queued:
            return
        active = self._active()
        for session in queued:
            candidates = [
                candidate
                for candidate in self.nodes.values()
                if self._healthy(candidate)
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

    async def _send(self, node: NodeState, session: SessionRow) -> bool:
        assert self._http is not None
        task = self.store.task(session.task_id)
        assert task is not None
        sub = task.submission
        dispatch = SessionDispatch(
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
        # Stored first: a crash between here and the node's answer is reconciled
        # by the node's heartbeat (it holds the session, or it is lost).
        self.store.set_session(
            session.session_id, SessionStatus.DISPATCHED, node_id=node.id, dispatched=True
        )
        try:
            reply = await self._http.post(
                f"{node.registration.url}/node/sessions", content=dispatch.model_dump_json()
            )
        except httpx.HTTPError as exc:
            _log.warning("node %s unreachable: %s", node.id, exc)
            node.last_seen = time.monotonic() - self.config.node_timeout_s  # unhealthy now
            self.store.set_session(session.session_id, SessionStatus.QUEUED, clear_node=True)
            return False
        if reply.status_code >= 500:
            self.store.set_session(session.session_id, SessionStatus.QUEUED, clear_node=True)
            return False
        if reply.status_code >= 400:
            self._lost(
                session.session_id,
                f"node {node.id} refused the session: {_reason(reply)}",
                FailureReason.REFUSED,
            )
            return False
        self._session_event(session.session_id)
        return True

    async def _monitor_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.config.node_timeout_s / 4))
            try:
                self._check_nodes()
            except Exception:
                _log.exception("node check failed")

    def _check_nodes(self) -> None:
        now = time.monotonic()
        limit = 2 * self.config.node_timeout_s
        for node in list(self.nodes.values()):
            if now - node.last_seen > limit:
                self.store.drop_node(node.id)
                del self.nodes[node.id]
                self.events.publish(EventKind.NODE_LOST, node_id=node.id)
        if now - self._started_at <= limit:
            return  # nodes that held sessions before a restart may still come back
        for session in self.store.in_flight():
            if session.node_id is not None and session.node_id not in self.nodes:
                self._lost(session.session_id, f"node {session.node_id} stopped answering")


def _reason(reply: httpx.Response) -> str:
    """The one-line message of an API error answer (its body's start otherwise)."""
    try:
        return str(reply.json()["error"]["message"])[:500]
    except (ValueError, KeyError, TypeError):
        return reply.text[:300]
