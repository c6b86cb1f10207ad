"""Keeping groups generating while the trainer steps.

:class:`RolloutFeed` keeps up to ``inflight`` groups submitted to the rollout
server (one task with ``group_size`` sessions each) and hands finished ones
out in the order they finish. Each submission is stamped with the policy
version current when it was submitted; the version that actually sampled each
token is on the samples (the gateway stamps it), and that is what staleness is
measured on (:meth:`polar.train.batch.Group.staleness`).

Tasks are visited in a seeded order, reshuffled on every pass; the position
(``cursor``) is saved with checkpoints so a resumed run continues the sequence.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from polar.proxy.call.behaviour import SamplingPolicy
from polar.rollout.client import RolloutClient, RolloutError
from polar.rollout.protocol import HarnessSpec, TaskResult, TaskSubmission
from polar.tasks.model import Task

CLOSE_POLL_S = 5.0
"""How often a thread waiting for a group asks whether the feed closed: a closing
trainer waits at most this long (plus one request) for the groups it cancelled,
never for a group the server does not finish (a cancellation that did not reach
a node, a session stuck in a sandbox)."""


@dataclass(frozen=True, slots=True)
class TaskOrder:
    """Which task comes ``n``-th: passes over the tasks, each in its own seeded order."""

    tasks: tuple[Task, ...]
    seed: int
    shuffle: bool

    def at(self, n: int) -> Task:
        epoch, index = divmod(n, len(self.tasks))
        order = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return self.tasks[order[index]]


@dataclass(frozen=True, slots=True)
class GroupRequest:
    harness: HarnessSpec
    group_size: int
    builder: str
    session_timeout_s: float
    max_resamples: int
    wait_s: float
    sampling: SamplingPolicy | None = None
    """Enforced on every call of the group's sessions (none: the harness's own)."""


class RolloutFeed:
    def __init__(
        self,
        connect: Callable[[], RolloutClient],
        order: TaskOrder,
        request: GroupRequest,
        *,
        inflight: int,
        cursor: int = 0,
    ) -> None:
        self._connect = connect
        self._client = connect()
        self._order = order
        self._request = request
        self._inflight = inflight
        self.cursor = cursor
        """How many groups were submitted so far (the next task's position)."""
        self._pool = ThreadPoolExecutor(max_workers=inflight, thread_name_prefix="polar-feed")
        self._local = threading.local()
        self._clients: list[RolloutClient] = [self._client]
        self._lock = threading.Lock()
        self._pending: dict[Future[TaskResult], str] = {}
        self._closing = threading.Event()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def fill(self, policy_version: int) -> None:
        """Submit groups until ``inflight`` are generating."""
        while len(self._pending) < self._inflight:
            task = self._order.at(self.cursor)
            submission = TaskSubmission(
                task=task,
                harness=self._request.harness,
                num_samples=self._request.group_size,
                builder=self._request.builder,
                session_timeout_s=self._request.session_timeout_s,
                max_resamples=self._request.max_resamples,
                policy_version=policy_version,
                sampling=self._request.sampling,
            )
            view = self._client.submit(submission)
            self.cursor += 1
            self._pending[self._pool.submit(self._wait, view.task_id)] = view.task_id

    def next(self) -> TaskResult:
        """The next group to finish (blocks); errors of the rollout service propagate."""
        if not self._pending:
            raise RuntimeError("no group is generating: call fill() first")
        done, _ = wait(list(self._pending), return_when=FIRST_COMPLETED)
        future = min(done, key=lambda f: list(self._pending).index(f))
        del self._pending[future]
        return future.result()

    def close(self) -> list[str]:
        """Cancel the groups still generating and stop waiting for them (returns
        their task ids). Returns within one poll (``CLOSE_POLL_S``) of the
        cancellations, whether or not the server has finished them by then."""
        left = list(self._pending.values())
        for task_id in left:
            with contextlib.suppress(RolloutError):
                self._client.cancel(task_id)
        self._pending.clear()
        self._closing.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for client in self._clients:
                client.close()
        return left

    def _wait(self, task_id: str) -> TaskResult:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._connect()
            with self._lock:
                self._clients.append(client)
        return client.wait(
            task_id, self._request.wait_s, abandon=self._closing, poll_s=CLOSE_POLL_S
        )


def task_order(tasks: Sequence[Task], *, seed: int, shuffle: bool) -> TaskOrder:
    if not tasks:
        raise ValueError("no tasks to train on")
    return TaskOrder(tuple(tasks), seed, shuffle)
