"""Offline SFT data generation: K attempts per task through the rollout service,
scored, judged, exported. Resumable.

Each attempt is one rollout task of one session (``num_samples=1``, no
resampling: an attempt that fails is an attempt that failed), submitted with a
task id of our own, ``<run>.<task>.a<k>`` (``sft.<task>.a<k>`` on the private
local service), so its session is ``<that>-s0`` and a rerun knows what to look
for on the server. It
asks for every trace and each one's conversation (side calls are filtered
here, where the user chose to).

The loop keeps at most ``max_in_flight`` attempts submitted: worker threads
submit and long-poll the rollout server; the main thread alone writes the
journal (:mod:`polar.sft.journal`), one durable commit per result, and
updates the display. On a rerun, acknowledged attempts are kept; attempts an
earlier run started are run again, or, when the rollout server outlived the
generator (``reattach``), their rollout tasks are waited on instead, and
resubmitted under a new id (``.r<n>``) only if the server no longer has them.

At the end (also after Ctrl-C), verdicts (:mod:`polar.sft.verdict`), the
statistics (``stats.json``), one line per attempt (``attempts.jsonl``) and the
exports (:mod:`polar.sft.export`) are computed from the journal alone, in the
task file's order: what was written depends on the results, not on timing.
"""

from __future__ import annotations

import concurrent.futures as futures
import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from polar.atomicfile import atomic_path
from polar.rollout.client import RolloutClient, RolloutError
from polar.rollout.protocol import (
    HarnessSpec,
    SessionResult,
    SessionStatus,
    TaskResult,
    TaskSubmission,
)
from polar.sft.accept import Acceptance
from polar.sft.export import (
    ExportCounts,
    ExportFormat,
    chat_row,
    token_row,
    write_exports,
)
from polar.sft.journal import Journal, RunSettings
from polar.sft.stats import GenerationStats
from polar.sft.verdict import (
    AttemptKey,
    AttemptSummary,
    Filters,
    Outcome,
    Verdict,
    judge,
    summarize,
)
from polar.tasks.model import Task

JOURNAL = "journal.sqlite"
STATS = "stats.json"
ATTEMPTS = "attempts.jsonl"
POLL_S = 5.0
"""How long one long poll for a result waits on the server."""
RETRY_FOR_S = 300.0
"""How long a worker keeps retrying an unreachable rollout server before giving up."""


class GenerateConfig(BaseModel):
    """One generation run (``polar generate``'s options)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    out: Path
    harness: HarnessSpec
    attempts: int = Field(ge=1, le=100_000)
    """Attempts per task."""
    accept: str = "reward >= 1"
    """The acceptance rule (:mod:`polar.sft.accept`)."""
    session_timeout_s: float = Field(default=1800.0, gt=0)
    builder: str = "prefix_merge"
    max_in_flight: int = Field(default=64, ge=1, le=10_000)
    dedupe: bool = True
    keep_side_calls: bool = False
    max_tokens: int | None = Field(default=None, ge=1)
    per_task_cap: int | None = Field(default=None, ge=1)
    formats: tuple[ExportFormat, ...] = (ExportFormat.JSONL, ExportFormat.PARQUET)

    @field_validator("accept")
    @classmethod
    def _rule(cls, value: str) -> str:
        Acceptance.parse(value)
        return value

    @field_validator("formats")
    @classmethod
    def _formats(cls, value: tuple[ExportFormat, ...]) -> tuple[ExportFormat, ...]:
        if not value:
            raise ValueError("at least one export format")
        if len(set(value)) != len(value):
            raise ValueError("each export format at most once")
        return value

    @property
    def acceptance(self) -> Acceptance:
        return Acceptance.parse(self.accept)

    @property
    def filters(self) -> Filters:
        return Filters(
            dedupe=self.dedupe,
            keep_side_calls=self.keep_side_calls,
            max_tokens=self.max_tokens,
            per_task_cap=self.per_task_cap,
        )

    @property
    def settings(self) -> RunSettings:
        return RunSettings(
            harness=self.harness.model_dump_json(),
            builder=self.builder,
            session_timeout_s=self.session_timeout_s,
        )


@dataclass(frozen=True, slots=True)
class GenerationReport:
    stats: GenerationStats
    verdicts: tuple[Verdict, ...]
    exports: ExportCounts
    interrupted: bool
    incarnation: int
    """Which run of this journal this was (1 for the first)."""


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def rollout_task_id(run_id: str, key: AttemptKey, resubmission: int = 0) -> str:
    """``<run>.<task>.a<k>`` (``.r<n>`` when resubmitted); a digest stands in for
    characters a session id cannot hold and for task ids too long to keep."""
    name = key.task
    if _UNSAFE.search(name) or len(name) > 80:
        digest = hashlib.sha256(name.encode()).hexdigest()[:10]
        name = f"{_UNSAFE.sub('-', name)[:60]}-{digest}"
    suffix = f".r{resubmission}" if resubmission else ""
    return f"{run_id}.{name}.a{key.attempt}{suffix}"


def last_result(task: TaskResult) -> SessionResult:
    """The attempt's one session result; a task that ended without one (cancelled
    on the server before it ran) is an attempt that ended in an error."""
    if task.results:
        return task.results[-1]
    return SessionResult(
        session_id=f"{task.task_id}-s0",
        task_id=task.task_id,
        sample_index=0,
        status=SessionStatus.CANCELLED,
        error=f"the rollout task ended {task.status.value} without a session result",
    )


ProgressCallback = Callable[[GenerationStats], None]


class Generation:
    """Runs one generation against a rollout server (see the module docstring)."""

    def __init__(
        self,
        config: GenerateConfig,
        tasks: Sequence[Task],
        *,
        reattach: bool,
        server: str = "",
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self.config = config
        self.tasks = {t.id: t for t in tasks}
        self.reattach = reattach
        self.on_progress = on_progress or (lambda stats: None)
        self.plan = [AttemptKey(t.id, k) for t in tasks for k in range(config.attempts)]
        config.out.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(
            config.out / JOURNAL, settings=config.settings, tasks=tasks, server=server
        )
        self._stop = threading.Event()

    def close(self) -> None:
        self.journal.close()

    def __enter__(self) -> Generation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- the run

    def run(self, client: RolloutClient) -> GenerationReport:
        """Run what is left of the plan on ``client``'s server, then write the
        outputs. Ctrl-C stops early; the outputs are still written, from what was
        acknowledged. (The journal was opened and checked by the constructor, so
        a caller can refuse a mismatched rerun before starting a service.)"""
        self.client = client
        planned = set(self.plan)
        summaries = {k: s for k, s in self.journal.summaries().items() if k in planned}
        interrupted = False
        try:
            self._loop(summaries)
        except KeyboardInterrupt:
            interrupted = True
        except BaseException:
            self.finish(summaries, interrupted=True)
            raise
        return self.finish(summaries, interrupted=interrupted)

    def _loop(self, summaries: dict[AttemptKey, AttemptSummary]) -> None:
        self.on_progress(self.stats(summaries))
        waiting, starting = self._resume(summaries)
        resumed = {key for key, _, _ in waiting + starting}
        order = {key: i for i, key in enumerate(self.plan)}
        fresh = [
            (key, self._fresh_id(key), True)
            for key in self.plan
            if key not in summaries and key not in resumed
        ]
        # Picked-up tasks first (they are running already), then the plan's order.
        todo = waiting + sorted(starting + fresh, key=lambda item: order[item[0]])
        pool = futures.ThreadPoolExecutor(self.config.max_in_flight, "polar-generate")
        running: dict[futures.Future[tuple[AttemptKey, SessionResult]], AttemptKey] = {}
        try:
            while todo or running:
                while todo and len(running) < self.config.max_in_flight:
                    key, rollout_id, submit = todo.pop(0)
                    if submit:
                        self.journal.submitted(key, rollout_id)
                    job = pool.submit(self._attempt, key, rollout_id, submit)
                    running[job] = key
                done, _ = futures.wait(running, timeout=0.5, return_when="FIRST_COMPLETED")
                for job in done:
                    key = running.pop(job)
                    _, result = job.result()
                    summary = summarize(result)
                    if self.journal.finish(key, result, summary):
                        summaries[key] = summary
                        self.on_progress(self.stats(summaries))
        finally:
            self._stop.set()
            pool.shutdown(wait=True, cancel_futures=True)

    @property
    def _prefix(self) -> str:
        # A server shared with other runs needs this run's id in its task ids; the
        # private local service does not, and then the sessions' paths (which the
        # harnesses show the model) are the same in every run into the same --out.
        return self.journal.run_id if self.reattach else "sft"

    def _fresh_id(self, key: AttemptKey) -> str:
        return rollout_task_id(self._prefix, key)

    def _resume(
        self, summaries: dict[AttemptKey, AttemptSummary]
    ) -> tuple[list[tuple[AttemptKey, str, bool]], list[tuple[AttemptKey, str, bool]]]:
        """Attempts an earlier run left in flight: (to wait on, to start again)."""
        waiting, starting = [], []
        planned = set(self.plan)
        for pending in self.journal.pending():
            if pending.key not in planned or pending.key in summaries:
                continue
            if not self.reattach:
                # A fresh local service: nothing of the earlier run is left on it.
                starting.append((pending.key, self._fresh_id(pending.key), True))
                continue
            try:
                self.client.task(pending.rollout_id)
            except RolloutError as exc:
                if exc.status != 404:
                    raise
                again = rollout_task_id(self._prefix, pending.key, self.journal.incarnation)
                starting.append((pending.key, again, True))
                continue
            waiting.append((pending.key, pending.rollout_id, False))
        return waiting, starting

    def _attempt(self, key: AttemptKey, rollout_id: str, submit: bool) -> tuple[AttemptKey, Any]:
        """Worker thread: submit (unless picking up), then wait for the one result."""
        if submit:
            submission = TaskSubmission(
                task=self.tasks[key.task],
                harness=self.config.harness,
                num_samples=1,
                task_id=rollout_id,
                builder=self.config.builder,
                session_timeout_s=self.config.session_timeout_s,
                all_traces=True,
                conversations=True,
                metadata={"sft_attempt": str(key)},
            )
            try:
                self._retrying(lambda: self.client.submit(submission))
            except RolloutError as exc:
                if exc.status != 409:  # 409: it is there already (submitted before a crash)
                    raise
        while True:
            outcome = self._retrying(lambda: self.client.result(rollout_id, wait_s=POLL_S))
            if isinstance(outcome, TaskResult):
                return key, last_result(outcome)
            if self._stop.is_set():
                raise futures.CancelledError()

    def _retrying(self, call: Callable[[], Any]) -> Any:
        """``call()``, retried with backoff while the server is unreachable or failing."""
        deadline = time.monotonic() + RETRY_FOR_S
        wait = 0.5
        while True:
            try:
                return call()
            except RolloutError as exc:
                transient = exc.status == 0 or exc.status >= 500
                if not transient or time.monotonic() > deadline or self._stop.is_set():
                    raise
            self._stop.wait(wait)
            wait = min(wait * 2, 15.0)

    # ---------------------------------------------------------------- results

    def verdicts(self, summaries: dict[AttemptKey, AttemptSummary]) -> list[Verdict]:
        acceptance, filters = self.config.acceptance, self.config.filters
        by_task: dict[str, list[tuple[AttemptKey, AttemptSummary]]] = {t: [] for t in self.tasks}
        for key, summary in summaries.items():
            by_task[key.task].append((key, summary))
        return [v for attempts in by_task.values() for v in judge(attempts, acceptance, filters)]

    def stats(self, summaries: dict[AttemptKey, AttemptSummary]) -> GenerationStats:
        return GenerationStats.of(
            self.config.accept,
            self.config.filters,
            dict.fromkeys(self.tasks, self.config.attempts),
            self.verdicts(summaries),
        )

    def finish(
        self, summaries: dict[AttemptKey, AttemptSummary], *, interrupted: bool = False
    ) -> GenerationReport:
        """Write ``stats.json``, ``attempts.jsonl`` and the exports from the journal."""
        out = self.config.out
        verdicts = self.verdicts(summaries)
        stats = GenerationStats.of(
            self.config.accept,
            self.config.filters,
            dict.fromkeys(self.tasks, self.config.attempts),
            verdicts,
        )
        with atomic_path(out / STATS) as path:
            path.write_bytes(orjson.dumps(stats.to_json(), option=orjson.OPT_INDENT_2) + b"\n")
        with atomic_path(out / ATTEMPTS) as path, path.open("wb") as f:
            for v in verdicts:
                s = summaries[v.key]
                line = {
                    "task": v.key.task,
                    "attempt": v.key.attempt,
                    "outcome": v.outcome.value,
                    "reason": v.reason.value if v.reason else None,
                    "reward": s.reward,
                    "resolved": s.resolved,
                    "status": s.status.value,
                    "session_id": s.session_id,
                    "error": s.error,
                }
                f.write(orjson.dumps(line) + b"\n")
        accepted = [v for v in verdicts if v.outcome is Outcome.ACCEPTED]
        exports = write_exports(out, self._rows(accepted), self.config.formats)
        return GenerationReport(
            stats, tuple(verdicts), exports, interrupted, self.journal.incarnation
        )

    def _rows(
        self, accepted: Sequence[Verdict]
    ) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None, str | None]]:
        for verdict in accepted:
            result = self.journal.result(verdict.key)
            conversations = {c["trace_id"]: c for c in result.conversations}
            samples = {s["trace_id"]: s for s in result.samples}
            for trace_id in verdict.kept:
                sample = samples[trace_id]
                conversation = conversations.get(trace_id)
                problem = None if conversation is None else conversation.get("problem")
                chat = None
                if conversation is not None and problem is None:
                    chat = chat_row(verdict.key, sample, conversation)
                yield token_row(verdict.key, sample), chat, problem
