"""One session's life on a gateway node, through staged worker pools.

Stages and their pools (sizes from :class:`~polar.rollout.protocol.NodeCapacity`):

1. **prepare** (``prepare`` slots): give the session directory its own
   size-limited filesystem (``workspace_mb``), materialize the workspace, open
   the gateway session (its key), create and start the runtime (whose relay
   lets only that key through), run the task's set-up and record the baseline;
2. **ready**: prepared, waiting for an agent slot — at most ``ahead`` sessions
   wait here, so preparation overlaps running agents without hoarding runtimes;
3. **run** (``run`` slots): the harness runs; the session's timeout starts
   here, never while it queued. A fresh evaluation runtime is pre-warmed
   meanwhile when the evaluator wants one. The key is closed when it ends;
4. **post-run** (``postrun`` slots): build the trajectory from the gateway's
   records, then evaluate;
5. **teardown**: stop runtimes, drop the session directory (kept on failure
   by default, marked so a restarted node keeps it).

Outcomes: COMPLETED (built and scored), TIMEOUT (the harness ran past its
budget: the partial trajectory is built, not scored), ERROR (preparation,
harness, build or evaluation failed, or the sandbox hit one of its limits;
the reason is kept, and so is whatever trajectory could be built), CANCELLED
(the whole process tree is killed). Every failure names its
:class:`~polar.rollout.failure.FailureReason`, decided here, in the stage
that failed; how the run stage ended is judged from the harness's end and the
gateway's records of the session's calls (:func:`~polar.rollout.failure.run_failure`).

Evaluation runtimes created for scoring (``fresh_runtime``) get no gateway:
the agent's key is closed by then, and an evaluator has no model to call.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from polar.harness import load_harness
from polar.proxy.gateway import Gateway
from polar.reward.base import EvalContext, EvalResult
from polar.reward.registry import evaluate
from polar.rollout.conversation import conversation_json
from polar.rollout.failure import NO_CALLS, Calls, FailureReason, RunEnd, run_failure
from polar.rollout.files import FileCache, FilesError
from polar.rollout.node.agent import AgentRun, installed_executable, run_agent
from polar.rollout.protocol import (
    NodeCapacity,
    SessionAccounting,
    SessionDispatch,
    SessionResult,
    SessionStatus,
)
from polar.runtime.base import GatewayAddress, Runtime, RuntimeSpec
from polar.runtime.disk import SizedDir
from polar.runtime.registry import create_runtime
from polar.tasks.baseline import Baseline
from polar.tasks.model import ImageWorkspace
from polar.tasks.workspace import materialize, run_setup, runtime_spec_for, workspace_path
from polar.trajectory import BuildConfig, Trajectory, resolve_builder, row_of, samples_of
from polar.trajectory.export import SampleRow

_log = logging.getLogger(__name__)

KeepPolicy = Literal["never", "failed", "always"]
RuntimeFactory = Callable[[RuntimeSpec, Path, GatewayAddress | None], Runtime]


class SessionFailed(Exception):
    """A stage failed; the message is the session's ``error``, ``reason`` its failure."""

    def __init__(self, reason: FailureReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class PipelineSettings:
    node_id: str
    sessions_dir: Path
    runtime: RuntimeSpec
    harness_cache: Path
    capacity: NodeCapacity
    gateway_address: GatewayAddress
    build: BuildConfig
    model: str = "policy"
    prepare_timeout_s: float = 900.0
    keep_sessions: KeepPolicy = "failed"
    workspace_mb: int | None = None
    """Each session directory's size limit (its own filesystem); None: unlimited."""


KEPT_MARKER = ".polar-kept"
"""In a session directory kept on purpose: a restarted node leaves it alone."""


def stale_session_dirs(sessions_dir: Path) -> list[Path]:
    """Session directories a killed node left mid-session (not marked as kept)."""
    if not sessions_dir.is_dir():
        return []
    return [
        path
        for path in sessions_dir.iterdir()
        if path.is_dir() and not path.name.startswith(".") and not (path / KEPT_MARKER).exists()
    ]


@dataclass(slots=True)
class NodeSession:
    dispatch: SessionDispatch
    status: SessionStatus = SessionStatus.QUEUED
    since: float = field(default_factory=time.monotonic)
    timings: dict[str, float] = field(default_factory=dict)
    runtime: Runtime | None = None
    fresh: list[Runtime] = field(default_factory=list)
    prewarmed: asyncio.Task[Runtime] | None = None
    api_key: str | None = None
    gateway_open: bool = False
    disks: list[SizedDir] = field(default_factory=list)
    baseline: Baseline | None = None
    result: SessionResult | None = None
    task: asyncio.Task[SessionResult] | None = None
    reported: bool = False
    records: int = 0
    calls: Calls = NO_CALLS
    """What the gateway's records say about the session's calls (after the run)."""
    conversations: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Trace id -> its conversation, when the dispatch asks for them."""
    shipped_hidden: Path | None = None
    """The hidden tests' path as submitted, when the node runs them from its file
    cache: hidden from the sandbox too, in case it exists here."""

    @property
    def id(self) -> str:
        return self.dispatch.session_id

    def enter(self, status: SessionStatus) -> None:
        now = time.monotonic()
        key = self.status.value
        self.timings[key] = round(self.timings.get(key, 0.0) + now - self.since, 4)
        self.status, self.since = status, now


class Pipeline:
    """Runs sessions through the stages; one instance per node."""

    def __init__(
        self,
        settings: PipelineSettings,
        gateway: Gateway,
        *,
        runtime_factory: RuntimeFactory = create_runtime,
        on_change: Callable[[NodeSession], None] | None = None,
        files: FileCache | None = None,
    ) -> None:
        self.settings = settings
        self.gateway = gateway
        self._files = files
        self._factory = runtime_factory
        self._on_change = on_change or (lambda session: None)
        capacity = settings.capacity
        self._admission = asyncio.Semaphore(capacity.sessions)
        self._prepare = asyncio.Semaphore(capacity.prepare)
        self._run = asyncio.Semaphore(capacity.run)
        self._post = asyncio.Semaphore(capacity.postrun)

    def _enter(self, session: NodeSession, status: SessionStatus) -> None:
        session.enter(status)
        self._on_change(session)

    # ---------------------------------------------------------------- the life

    async def run(self, session: NodeSession) -> SessionResult:
        """The whole life of ``s``; always returns its result (never raises
        except for the node shutting down)."""
        trajectory: Trajectory | None = None
        agent: AgentRun | None = None
        evaluation: EvalResult | None = None
        error: str | None = None
        failure: FailureReason | None = None
        status = SessionStatus.COMPLETED
        try:
            await self._admission.acquire()
            try:
                async with self._prepare:
                    self._enter(session, SessionStatus.PREPARING)
                    await self._prepare_stage(session)
                self._enter(session, SessionStatus.READY)
                async with self._run:
                    self._enter(session, SessionStatus.RUNNING)
                    agent = await self._run_stage(session)
            finally:
                self._admission.release()
                await self._close_key(session)
            async with self._post:
                self._enter(session, SessionStatus.BUILDING)
                trajectory = await self._build(session)
                limit = self._limit_hit(session)
                end = RunEnd(
                    exited_ok=agent.ok,
                    timed_out=agent.timed_out,
                    limit_hit=limit is not None,
                    calls=session.calls,
                )
                failure = run_failure(end)
                if failure is not None:
                    status, error = _run_outcome(session, agent, limit, failure)
                else:
                    self._enter(session, SessionStatus.EVALUATING)
                    evaluation = await self._evaluate(session)
                    limit = self._limit_hit(session)
                    if limit is not None:
                        raise SessionFailed(FailureReason.EVALUATOR, limit)
                    if trajectory is not None:
                        trajectory = trajectory.with_reward(evaluation.reward)
        except asyncio.CancelledError:
            status, error = SessionStatus.CANCELLED, "cancelled"
            failure = FailureReason.CANCELLED
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        except SessionFailed as exc:
            status, error, failure = SessionStatus.ERROR, str(exc), exc.reason
        except Exception as exc:  # a bug or an unexpected failure: never lose the session
            _log.exception("session %s failed", session.id)
            status, error = SessionStatus.ERROR, f"internal error: {type(exc).__name__}: {exc}"
            failure = FailureReason.INTERNAL
        if trajectory is None and status is not SessionStatus.COMPLETED:
            with contextlib.suppress(Exception):
                trajectory = await self._build(session)
        await self._teardown(session, failed=status is not SessionStatus.COMPLETED)
        self._enter(session, status)
        session.result = self._result(
            session, status, error, failure, agent, evaluation, trajectory
        )
        return session.result

    # ---------------------------------------------------------------- stages

    async def _prepare_stage(self, session: NodeSession) -> None:
        if session.dispatch.task.files:
            session.shipped_hidden = session.dispatch.task.hidden_tests
            session.dispatch = await self._localized(session.dispatch)
        dispatch = session.dispatch
        session_dir = self.settings.sessions_dir / dispatch.session_id
        if session_dir.exists():
            raise SessionFailed(
                FailureReason.PREPARATION, f"session directory {session_dir} already exists"
            )
        try:
            async with asyncio.timeout(self.settings.prepare_timeout_s):
                created = await self.gateway.sessions.create(
                    session_id=dispatch.session_id,
                    metadata={
                        "task_id": dispatch.task_id,
                        "task": dispatch.task.id,
                        "group_id": dispatch.group_id,
                        "sample_index": dispatch.sample_index,
                        "harness": dispatch.harness.name,
                        "node_id": self.settings.node_id,
                    },
                    sampling=dispatch.sampling.distribution() if dispatch.sampling else None,
                )
                session.api_key, session.gateway_open = created.api_key, True
                address = self.settings.gateway_address
                relayed = GatewayAddress(address.host, address.port, api_key=created.api_key)
                session.runtime = await self._runtime_for(session, session_dir, relayed)
                session.baseline = await run_setup(
                    dispatch.task, session.runtime, timeout_s=self.settings.prepare_timeout_s
                )
        except TimeoutError:
            raise SessionFailed(
                FailureReason.PREPARATION,
                f"the preparation timeout fired: preparation took longer than "
                f"{self.settings.prepare_timeout_s:g} s (the node's prepare_timeout_s)",
            ) from None
        except SessionFailed:
            raise
        except Exception as exc:
            raise SessionFailed(FailureReason.PREPARATION, f"preparation failed: {exc}") from exc

    async def _localized(self, dispatch: SessionDispatch) -> SessionDispatch:
        """The dispatch with its task's shipped paths on this node (fetched once)."""
        if self._files is None:
            raise SessionFailed(
                FailureReason.PREPARATION,
                "the task's files were shipped, and this node keeps no file cache",
            )
        try:
            task = await self._files.localize(dispatch.task)
        except FilesError as exc:
            raise SessionFailed(FailureReason.PREPARATION, f"preparation failed: {exc}") from None
        return dispatch.model_copy(update={"task": task})

    async def _runtime_for(
        self, session: NodeSession, session_dir: Path, gateway: GatewayAddress | None
    ) -> Runtime:
        """A started runtime over a fresh copy of the session's task workspace, in a
        session directory of its own (size-limited when the node says so)."""
        task = session.dispatch.task
        if self.settings.workspace_mb is not None:
            session.disks.append(await SizedDir.create(session_dir, self.settings.workspace_mb))
        else:
            await asyncio.to_thread(session_dir.mkdir, parents=True, exist_ok=True)
        try:
            await materialize(task, session_dir)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise SessionFailed(
                    FailureReason.PREPARATION,
                    f"the task's workspace does not fit in the session directory's "
                    f"{self.settings.workspace_mb} MB",
                ) from None
            raise
        spec = runtime_spec_for(task, self.settings.runtime)
        hidden = [
            path.resolve()
            for path in (task.hidden_tests, session.shipped_hidden)
            if path is not None
        ]
        spec = spec.model_copy(
            update={
                "hidden": (*spec.hidden, *hidden),
                "writable_root": isinstance(task.workspace, ImageWorkspace),
            }
        )
        runtime = self._factory(spec, session_dir, gateway)
        try:
            await runtime.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await runtime.stop()
            raise
        return runtime

    def _limit_hit(self, session: NodeSession) -> str | None:
        """Which limit the session's sandboxes hit, if one did (for people)."""
        for runtime in (session.runtime, *session.fresh):
            hit = runtime.limit_hit if runtime is not None else None
            if hit is not None:
                return hit.message
        return None

    async def _run_stage(self, session: NodeSession) -> AgentRun:
        dispatch = session.dispatch
        runtime = session.runtime
        assert runtime is not None and session.api_key is not None
        if dispatch.task.evaluator.fresh_runtime:
            session.prewarmed = asyncio.ensure_future(self._fresh_copy(session))
        try:
            harness = load_harness(dispatch.harness.name, dispatch.harness.options)
            executable = await installed_executable(harness, self.settings.harness_cache)
        except Exception as exc:
            raise SessionFailed(
                FailureReason.HARNESS, f"harness {dispatch.harness.name}: {exc}"
            ) from exc
        return await run_agent(
            harness,
            runtime,
            executable=executable,
            api_key=session.api_key,
            model=self.settings.model,
            instruction=dispatch.task.instruction,
            workdir=workspace_path(dispatch.task, runtime),
            timeout_s=dispatch.session_timeout_s,
        )

    async def _fresh_copy(self, session: NodeSession) -> Runtime:
        index = len(session.fresh) + (1 if session.prewarmed is not None else 0)
        session_dir = self.settings.sessions_dir / f"{session.id}.eval{index}"
        runtime = await self._runtime_for(session, session_dir, None)
        session.fresh.append(runtime)
        await run_setup(session.dispatch.task, runtime, timeout_s=self.settings.prepare_timeout_s)
        return runtime

    async def _close_key(self, session: NodeSession) -> None:
        if session.gateway_open:
            session.gateway_open = False
            with contextlib.suppress(Exception):
                await self.gateway.sessions.close(session.id)

    async def _build(self, session: NodeSession) -> Trajectory | None:
        """The session's trajectory; None when the harness never called the model."""
        # Its harness has ended: wait until every call of the session is recorded
        # (cutting off orphaned ones), so none is missing from traces or accounting.
        with contextlib.suppress(TimeoutError):
            await self.gateway.settle(session.id)
        records = await self.gateway.records(session.id)
        session.records = len(records)
        session.calls = Calls.of(records)
        if not records:
            return None
        builder = resolve_builder(session.dispatch.builder)(self.settings.build)
        try:
            trajectory = await asyncio.to_thread(
                builder.build, records, group_id=session.dispatch.group_id
            )
        except Exception as exc:
            raise SessionFailed(
                FailureReason.BUILD, f"building the trajectory failed: {exc}"
            ) from exc
        if session.dispatch.conversations:
            by_key = {record.key: record for record in records}
            session.conversations = {
                trace.id: await asyncio.to_thread(conversation_json, trace, by_key)
                for trace in trajectory.traces
            }
        return trajectory

    async def _evaluate(self, session: NodeSession) -> EvalResult:
        dispatch = session.dispatch
        runtime = session.runtime
        assert runtime is not None

        async def fresh() -> Runtime:
            if session.prewarmed is not None:
                prewarmed, session.prewarmed = session.prewarmed, None
                return await prewarmed
            return await self._fresh_copy(session)

        ctx = EvalContext(
            task=dispatch.task,
            runtime=runtime,
            fresh_runtime=fresh,
            timeout_s=dispatch.task.evaluator.timeout_s,
            baseline=session.baseline,
        )
        try:
            return await evaluate(ctx)
        except Exception as exc:
            raise SessionFailed(FailureReason.EVALUATOR, str(exc)) from exc

    async def _teardown(self, session: NodeSession, *, failed: bool) -> None:
        await self._close_key(session)
        if session.prewarmed is not None:
            session.prewarmed.cancel()
            with contextlib.suppress(BaseException):
                await session.prewarmed
        runtimes = [runtime for runtime in (session.runtime, *session.fresh) if runtime is not None]
        await asyncio.gather(*(runtime.stop() for runtime in runtimes), return_exceptions=True)
        keep = self.settings.keep_sessions
        kept = keep == "always" or (keep == "failed" and failed)
        for sized in session.disks:
            with contextlib.suppress(Exception):
                await sized.remove(keep=kept)
        session.disks.clear()
        directories = [
            self.settings.sessions_dir / session.id,
            *(runtime.session_dir for runtime in session.fresh),
        ]
        for directory in directories:
            if kept:
                with contextlib.suppress(OSError):
                    await asyncio.to_thread((directory / KEPT_MARKER).touch)
            else:
                await asyncio.to_thread(shutil.rmtree, directory, True)

    # ---------------------------------------------------------------- result

    def _result(
        self,
        session: NodeSession,
        status: SessionStatus,
        error: str | None,
        failure: FailureReason | None,
        agent: AgentRun | None,
        evaluation: EvalResult | None,
        trajectory: Trajectory | None,
    ) -> SessionResult:
        dispatch = session.dispatch
        samples: list[SampleRow] = []
        conversations: list[dict[str, Any]] = []
        accounting: SessionAccounting | None = None
        if trajectory is not None:
            kept = samples_of(trajectory, include_untrainable=dispatch.all_traces)
            samples = [row_of(sample) for sample in kept]
            if dispatch.conversations:
                conversations = [session.conversations[sample.trace_id] for sample in kept]
            accounting = SessionAccounting.of(trajectory.accounting)
        return SessionResult(
            session_id=dispatch.session_id,
            task_id=dispatch.task_id,
            sample_index=dispatch.sample_index,
            node_id=self.settings.node_id,
            status=status,
            reward=evaluation.reward if evaluation is not None else None,
            resolved=evaluation.resolved if evaluation is not None else None,
            error=error,
            failure=failure,
            evaluation=(
                {"details": dict(evaluation.details), "log": evaluation.log[-4000:]}
                if evaluation is not None
                else {}
            ),
            agent=agent.as_json() if agent is not None else {},
            timings=dict(session.timings),
            accounting=accounting,
            samples=samples,
            conversations=conversations,
            records=session.records,
        )


def _run_outcome(
    session: NodeSession, agent: AgentRun, limit: str | None, failure: FailureReason
) -> tuple[SessionStatus, str]:
    """The status and error of a run stage that ended in ``failure``: TIMEOUT when the
    harness ran past its budget (and no limit was hit), ERROR otherwise. The message
    starts with what ended the run (the limit that fired, the session timeout, the
    exit code), for ``engine`` after which call error came first, and ends with the
    last lines of the agent's output."""
    if limit is not None:
        status, message = SessionStatus.ERROR, limit
    elif agent.timed_out:
        budget = session.dispatch.session_timeout_s
        status, message = (
            SessionStatus.TIMEOUT,
            f"the session timeout fired: the harness ran past its {budget:g} s budget "
            "(session_timeout_s) and was killed",
        )
    elif agent.ok:
        status, message = SessionStatus.ERROR, "the harness exited 0"
    elif agent.exit_code < 0:
        status, message = (
            SessionStatus.ERROR,
            f"the harness was killed (signal {-agent.exit_code}) after {agent.duration_s:.1f} s",
        )
    else:
        status, message = (
            SessionStatus.ERROR,
            f"the harness exited with code {agent.exit_code} after {agent.duration_s:.1f} s",
        )
    call = session.calls.last_error
    if failure is FailureReason.ENGINE and call is not None:
        message = (
            f"the session's last model call failed ({call.kind.value}: {call.message}); {message}"
        )
    elif failure is FailureReason.HARNESS and session.calls.answered == 0:
        message = f"{message} (the model answered no call)"
    output = agent.last_output()
    return status, f"{message}; last output: {output}" if output else f"{message}; no output"
