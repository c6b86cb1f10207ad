"""A gateway node: runs the sessions a rollout server dispatches, next to the
gateway that records their calls.

The node keeps every session it holds in memory until the server acknowledges
its result (``DELETE /node/sessions/{id}``), re-sending undelivered results
with backoff; its heartbeat lists them, so a restarted server can tell which of
its dispatched sessions are still alive, finished, or lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
from pydantic import ValidationError

import polar
from polar.harness import DEFAULT_PATH
from polar.proxy.gateway import Gateway
from polar.rollout.config import NodeConfig
from polar.rollout.files import FileCache, FilesError, unfinished
from polar.rollout.node.lifecycle import (
    NodeSession,
    Pipeline,
    PipelineSettings,
    RuntimeFactory,
    stale_session_dirs,
)
from polar.rollout.node.policy import check_dispatch
from polar.rollout.protocol import (
    GatewayAccess,
    HeartbeatReply,
    NodeHeartbeat,
    NodeRegistration,
    SessionDispatch,
    SessionResult,
)
from polar.runtime import cgroups, disk
from polar.runtime.base import GatewayAddress, Mount, RuntimeSpec
from polar.runtime.lease import Lease, LeaseHeld
from polar.runtime.reap import reap
from polar.runtime.registry import create_runtime
from polar.trajectory import BuildConfig

_log = logging.getLogger(__name__)


POLAR_PACKAGE = Path(polar.__file__).resolve().parent
"""This package's directory: hidden in every sandbox (it holds the built-in
tasks' hidden tests and patches, and is under ``sys.prefix`` when installed
from a wheel)."""


def node_runtime_spec(config: NodeConfig) -> RuntimeSpec:
    """The configured runtime plus what every session needs inside: the harness
    CLIs and (``share_python``, local backend) this node's Python; with the
    node's limits, its id as the owner, and this package hidden."""
    spec = config.runtime
    cache = config.harness_cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    paths = [cache]
    env = dict(spec.env)
    if config.share_python and spec.backend == "local":
        paths += [Path(sys.prefix), Path(sys.base_prefix)]
        env.setdefault("PATH", f"{Path(sys.executable).parent}:{DEFAULT_PATH}")
    have = {mount.path for mount in spec.mounts}
    mounts = (
        *spec.mounts,
        *(Mount(path=path) for path in dict.fromkeys(paths) if path not in have),
    )
    limits = config.limits
    return spec.model_copy(
        update={
            "mounts": mounts,
            "env": env,
            "hidden": (*spec.hidden, POLAR_PACKAGE),
            "owner": config.node_id,
            "pids": limits.pids,
            "memory_mb": limits.memory_mb,
            "cpus": limits.cpus,
            "cpu_time_s": limits.cpu_time_s,
            "tmp_mb": limits.tmp_mb,
        }
    )


def check_node(config: NodeConfig) -> None:
    """Refuse to start a node whose sandboxes could not be given its limits
    (rather than fail every session): raises UnsupportedSpec with the reason."""
    spec = node_runtime_spec(config)
    disk.check(config.limits.workspace_mb)
    if spec.backend == "local" and spec.sandbox:
        cgroups.check(
            Path(spec.options["cgroup_root"]) if "cgroup_root" in spec.options else None,
            cgroups.Limits(spec.cpus, spec.memory_mb, spec.pids, spec.cpu_time_s),
        )


def node_leases(config: NodeConfig) -> tuple[str, ...]:
    """What a node takes a lease on before it reaps or creates anything
    (:mod:`polar.runtime.lease`): its id (the name of its cgroups, state
    directories and containers), and the directories it clears at start or
    writes alone (sessions, task files, records)."""
    return (
        f"node id {config.node_id}",
        f"sessions_dir {config.sessions_dir.resolve()}",
        f"files_dir {config.files_dir.resolve()}",
        f"gateway.store.path {config.gateway.store.path.resolve()}",
    )


def claim_node(config: NodeConfig) -> list[Lease]:
    """The node's leases; raises :class:`NodeConflict` (one line) when a live
    process holds one of them."""
    held: list[Lease] = []
    try:
        for what in node_leases(config):
            held.append(Lease.take(what, f"node {config.node_id}"))
    except LeaseHeld as exc:
        for lease in held:
            lease.release()
        raise NodeConflict(
            f"{exc}; every node on a machine needs its own node_id, sessions_dir, files_dir "
            "and gateway.store.path"
        ) from None
    return held


class NodeConflict(LeaseHeld):
    """Another live node on this machine has this node's id or one of its directories."""


class NotStarted(Exception):
    """The node's API answered before the node started."""


class DispatchConflict(Exception):
    """A session id the node already holds, for another task."""


class Node:
    def __init__(
        self,
        config: NodeConfig,
        gateway: Gateway,
        build: BuildConfig,
        *,
        runtime_factory: RuntimeFactory = create_runtime,
        on_change: Callable[[NodeSession], None] | None = None,
        leases: list[Lease] | None = None,
    ) -> None:
        """``leases``: the node's leases, already taken (:func:`claim_node`); else
        :meth:`claim` or :meth:`start` takes them."""
        self.config = config
        self._leases = leases or []
        self.gateway = gateway
        self._build = build
        self._factory = runtime_factory
        self._on_change = on_change
        self.sessions: dict[str, NodeSession] = {}
        self._pipeline: Pipeline | None = None
        self._loops: list[asyncio.Task[None]] = []
        self._http: httpx.AsyncClient | None = None
        self._stopping = False
        self._engine_problem: str | None = None
        self.url = config.url
        self.gateway_url = config.public_gateway_url or (
            f"http://{config.gateway.host}:{config.gateway.port}"
        )
        """Where trainers reach the gateway (told the rollout server when registering)."""

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def pipeline(self) -> Pipeline:
        if self._pipeline is None:
            raise RuntimeError("the node is not started")
        return self._pipeline

    def claim(self) -> None:
        """Take the node's leases (:func:`claim_node`) unless it holds them: a node
        whose id or directories a live process on this machine holds raises
        :class:`NodeConflict` and touches nothing."""
        if not self._leases:
            self._leases = claim_node(self.config)

    async def start(self, address: GatewayAddress) -> None:
        """Start serving; ``address`` is where this node's gateway listens.

        First takes the node's leases (:meth:`claim`), then removes what a killed
        instance of this node left (its containers, cgroups, state directories,
        mounted session directories, and session directories that were not kept
        on purpose): holding the leases proves that no live process owns them."""
        config = self.config
        self.claim()
        await self._reap()
        self._pipeline = Pipeline(
            PipelineSettings(
                node_id=config.node_id,
                sessions_dir=config.sessions_dir.resolve(),
                runtime=node_runtime_spec(config),
                harness_cache=config.harness_cache.resolve(),
                capacity=config.capacity,
                gateway_address=address,
                build=self._build,
                model=config.model,
                prepare_timeout_s=config.prepare_timeout_s,
                keep_sessions=config.keep_sessions,
                workspace_mb=config.limits.workspace_mb,
            ),
            self.gateway,
            runtime_factory=self._factory,
            on_change=self._on_change,
            files=FileCache(
                config.files_dir.resolve(), self._fetch_file if config.server_url else None
            ),
        )
        headers = {"authorization": f"Bearer {config.control_token}"}
        self._http = httpx.AsyncClient(headers=headers, timeout=30)
        if config.server_url:
            self._loops.append(asyncio.ensure_future(self._heartbeats()))

    async def _fetch_file(self, digest: str, into: Path) -> None:
        """Download a task archive from the rollout server (see :mod:`polar.rollout.files`)."""
        assert self._http is not None and self.config.server_url
        url = f"{self.config.server_url}/files/{digest}"
        try:
            async with self._http.stream("GET", url, timeout=600) as reply:
                if reply.status_code != 200:
                    raise FilesError(f"GET {url} answered HTTP {reply.status_code}")
                with into.open("wb") as out:
                    async for chunk in reply.aiter_bytes(1 << 20):
                        out.write(chunk)
        except httpx.HTTPError as exc:
            raise FilesError(f"GET {url} failed: {exc}") from None

    async def _reap(self) -> None:
        sessions_dir = self.config.sessions_dir.resolve()
        root = self.config.runtime.options.get("cgroup_root")
        reaped = await reap(
            self.config.node_id,
            cgroup_root=Path(root) if root is not None else None,
            sessions_dir=sessions_dir,
        )
        stale = await asyncio.to_thread(stale_session_dirs, sessions_dir)
        partial = await asyncio.to_thread(unfinished, self.config.files_dir.resolve())
        for path in (*stale, *partial):
            await asyncio.to_thread(shutil.rmtree, path, True)
        if reaped.total or stale or partial:
            _log.warning(
                "node %s: removed what a killed instance left: %d containers, %d cgroups, "
                "%d state directories, %d session mounts, %d session directories, "
                "%d unfinished task-file downloads",
                self.config.node_id,
                reaped.containers,
                reaped.cgroups,
                reaped.state_dirs,
                reaped.disks,
                len(stale),
                len(partial),
            )

    async def stop(self) -> None:
        """Cancel every session (killing its processes) and stop; results not yet
        delivered are dropped (the server reports those sessions lost)."""
        self._stopping = True
        for loop in self._loops:
            loop.cancel()
        running = [
            session.task
            for session in self.sessions.values()
            if session.task and not session.task.done()
        ]
        for task in running:
            task.cancel()
        await asyncio.gather(*self._loops, *running, return_exceptions=True)
        self._loops.clear()
        if self._http is not None:
            await self._http.aclose()
        for lease in self._leases:
            lease.release()
        self._leases = []

    # ---------------------------------------------------------------- sessions

    def dispatch(self, dispatch: SessionDispatch) -> NodeSession:
        """Take a session (idempotent for the same dispatch) if the node's policy
        allows what it asks for (:class:`PolicyViolation` otherwise)."""
        if self._pipeline is None:
            raise NotStarted(f"node {self.config.node_id} is starting")
        check_dispatch(dispatch, self.config)
        held = self.sessions.get(dispatch.session_id)
        if held is not None:
            if held.dispatch.task_id != dispatch.task_id:
                raise DispatchConflict(
                    f"session {dispatch.session_id} is held for task {held.dispatch.task_id}"
                )
            return held
        session = NodeSession(dispatch=dispatch)
        self.sessions[dispatch.session_id] = session
        session.task = asyncio.ensure_future(self._life(session))
        return session

    async def _life(self, session: NodeSession) -> SessionResult:
        result = await self.pipeline.run(session)
        await self._deliver(session)
        return result

    async def cancel(self, session_id: str) -> NodeSession | None:
        session = self.sessions.get(session_id)
        if session is None:
            return None
        if session.task is not None and not session.task.done():
            session.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(session.task)
        return session

    def forget(self, session_id: str) -> bool:
        """Drop a finished session (the server has its result)."""
        session = self.sessions.get(session_id)
        if session is None or not session.status.terminal:
            return False
        del self.sessions[session_id]
        return True

    def load(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for session in self.sessions.values():
            counts[session.status.value] = counts.get(session.status.value, 0) + 1
        return counts

    # ---------------------------------------------------------------- server link

    async def _deliver(self, session: NodeSession) -> None:
        """POST the result to the dispatch's result URL, retrying with backoff
        (the heartbeat keeps advertising it meanwhile)."""
        url = session.dispatch.result_url
        if url is None or session.result is None or self._stopping:
            return
        assert self._http is not None
        wait = self.config.result_retry_s
        while True:
            try:
                reply = await self._http.post(url, content=session.result.model_dump_json())
                if reply.status_code < 300:
                    session.reported = True
                    return
                if 400 <= reply.status_code < 500 and reply.status_code not in (404, 408, 429):
                    _log.error("result of %s refused: %s", session.id, reply.text[:300])
                    return
            except httpx.HTTPError as exc:
                _log.warning("result of %s not delivered yet: %s", session.id, exc)
            if self.stopping:
                return
            await asyncio.sleep(wait)
            wait = min(wait * 2, 60.0)

    async def _register(self) -> None:
        assert self._http is not None and self.config.server_url
        config = self.config
        body = NodeRegistration(
            node_id=config.node_id,
            url=self.url,
            capacity=config.capacity,
            heartbeat_interval_s=config.heartbeat_interval_s,
            gateway=GatewayAccess(
                node_id=config.node_id,
                url=self.gateway_url,
                admin_token=config.gateway.admin_token,
            ),
        )
        reply = await self._http.post(
            f"{config.server_url}/nodes/register", content=body.model_dump_json()
        )
        reply.raise_for_status()

    async def _heartbeats(self) -> None:
        assert self._http is not None and self.config.server_url
        config = self.config
        registered = False
        while True:
            try:
                if not registered:
                    await self._register()
                    registered = True
                beat = NodeHeartbeat(
                    sessions={sid: session.status for sid, session in self.sessions.items()},
                    engine_error=await self.check_engine(),
                )
                reply = await self._http.post(
                    f"{config.server_url}/nodes/{config.node_id}/heartbeat",
                    content=beat.model_dump_json(),
                )
                if reply.status_code == 404:  # the server restarted: register again
                    registered = False
                    continue
                reply.raise_for_status()
                await self._obey(HeartbeatReply.model_validate_json(reply.content))
            except (httpx.HTTPError, ValidationError) as exc:
                _log.warning("rollout server %s unreachable: %s", config.server_url, exc)
                registered = False
            await asyncio.sleep(config.heartbeat_interval_s)

    async def check_engine(self) -> str | None:
        """Whether the gateway's engine answers ``GET /v1/models`` (any reply below 500
        counts: an engine without that route still answers); why not, in one line."""
        engine = self.config.gateway.engine
        url = f"{engine.base_url.rstrip('/')}/v1/models"
        headers = {"authorization": f"Bearer {engine.api_key}"} if engine.api_key else {}
        wait = min(5.0, self.config.heartbeat_interval_s)
        problem: str | None = None
        try:
            # Its own client: the control token is for the rollout server only.
            async with httpx.AsyncClient(timeout=wait) as client:
                reply = await client.get(url, headers=headers)
        except httpx.HTTPError as exc:
            problem = f"engine {engine.base_url} unreachable: {str(exc) or type(exc).__name__}"
        else:
            if reply.status_code >= 500:
                problem = f"engine {engine.base_url} answered HTTP {reply.status_code}"
        if problem != self._engine_problem:
            if problem is not None:
                _log.warning("node %s: %s", self.config.node_id, problem)
            elif self._engine_problem is not None:
                _log.info("node %s: engine %s answers again", self.config.node_id, url)
            self._engine_problem = problem
        return problem

    async def _obey(self, reply: HeartbeatReply) -> None:
        for sid in reply.forget:
            self.forget(sid)
        for sid in reply.cancel:
            _log.warning("cancelling session %s: the rollout server does not want it", sid)
            await self.cancel(sid)
            self.forget(sid)
