"""A real rollout server whose sessions end with canned results, as if a node ran them.

No node, engine or sandbox: :class:`CannedRollouts` starts the real
:class:`~polar.rollout.server.service.RolloutServer` behind its HTTP API and a thread
that, for every queued session of a running task, POSTs to
``/callbacks/sessions`` (as a node does) the result that ``outcome(task,
sample_index)`` names. Whatever reads the results (the trainer's feed, its
evaluation, every bridge) talks to the server as in production; only the node
is canned. The failed sessions are the ones a node reports
(:mod:`polar.rollout.node.lifecycle`): a timed-out or failed agent keeps the samples
of the calls it made.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from polar.rollout.config import ServerConfig
from polar.rollout.failure import FailureReason
from polar.rollout.protocol import SessionResult, SessionStatus, TaskStatus, TaskView
from polar.rollout.server.app import create_server_app
from polar.rollout.server.service import RolloutServer
from polar.serverthread import ServerThread
from polar.trajectory.export import row_of

from support.rollout import CONTROL_TOKEN
from support.training import sample

PROMPT = (9, 10, 11)
"""Every canned sample's prompt ids."""


@dataclass(frozen=True)
class Canned:
    """One session's end, as its node would report it."""

    status: SessionStatus
    failure: FailureReason | None = None
    reward: float | None = None
    resolved: bool | None = None
    response: tuple[int, ...] = ()
    """The sampled ids of its one trace (empty: no trace)."""

    def result(self, task_id: str, session_id: str, index: int) -> SessionResult:
        samples = (
            [sample(session_id, PROMPT, self.response, reward=self.reward)] if self.response else []
        )
        return SessionResult(
            session_id=session_id,
            task_id=task_id,
            sample_index=index,
            node_id="canned",
            status=self.status,
            reward=self.reward,
            resolved=self.resolved,
            error=None if self.failure is None else f"canned {self.failure.value}",
            failure=self.failure,
            samples=[orjson.loads(orjson.dumps(row_of(s))) for s in samples],
            records=1 if self.response else 0,
        )


def scored(reward: float, response: Sequence[int]) -> Canned:
    return Canned(SessionStatus.COMPLETED, None, reward, reward == 1.0, tuple(response))


def timed_out(response: Sequence[int]) -> Canned:
    """The agent ran past its budget after its calls: the partial trajectory, no score."""
    return Canned(SessionStatus.TIMEOUT, FailureReason.TIMEOUT, response=tuple(response))


def failed(failure: FailureReason, response: Sequence[int] = ()) -> Canned:
    """An ERROR for ``failure``, with the trace of the calls made before it (if any)."""
    return Canned(SessionStatus.ERROR, failure, response=tuple(response))


Outcome = Callable[[str, int], Canned]
"""``(dataset task id, sample index) -> how that session ends``."""


def task_file(root: Path, task_ids: Sequence[str]) -> Path:
    """A JSONL task file of tasks never really run (a directory workspace, a command)."""
    workspace = root / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "id": task_id,
            "instruction": f"do {task_id}",
            "workspace": {"kind": "directory", "path": str(workspace)},
            "evaluator": {"kind": "command", "config": {"command": "true"}},
        }
        for task_id in task_ids
    ]
    path = root / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@dataclass
class CannedRollouts:
    """The rollout server at :attr:`url`, its sessions ended by ``outcome``."""

    root: Path
    outcome: Outcome
    poll_s: float = 0.05
    posted: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        config = ServerConfig(port=0, db=self.root / "rollout.db", control_token=CONTROL_TOKEN)
        self.server = RolloutServer(config)
        self._thread = ServerThread(create_server_app(self.server)).start()
        self.url = self._thread.url
        self.server.public_url = self.url
        self._http = httpx.Client(
            base_url=self.url, headers={"authorization": f"Bearer {CONTROL_TOKEN}"}, timeout=30
        )
        self._stop = threading.Event()
        self._node = threading.Thread(target=self._run, name="canned-node", daemon=True)
        self._node.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                reply = self._http.get("/tasks", params={"status": TaskStatus.RUNNING.value})
                for raw in reply.json():
                    self._end_queued(TaskView.model_validate(raw))
            except Exception as exc:  # reported by close()
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _end_queued(self, view: TaskView) -> None:
        for session in view.sessions:
            if session.status is not SessionStatus.QUEUED or session.session_id in self.posted:
                continue
            canned = self.outcome(view.task, session.sample_index)
            result = canned.result(view.task_id, session.session_id, session.sample_index)
            reply = self._http.post("/callbacks/sessions", content=result.model_dump_json())
            if reply.status_code >= 300:
                self.errors.append(f"{session.session_id}: HTTP {reply.status_code} {reply.text}")
            self.posted.add(session.session_id)

    def result_json(self, task_id: str) -> dict[str, Any]:
        reply = self._http.get(f"/tasks/{task_id}/result")
        reply.raise_for_status()
        body: dict[str, Any] = reply.json()
        return body

    def close(self) -> None:
        self._stop.set()
        self._node.join(timeout=10)
        self._http.close()
        self._thread.stop()
        assert not self.errors, self.errors


# ---------------------------------------------------------------- one mixed group

SCORED_IDS = (20, 21, 22)
TIMED_OUT_IDS = (30, 31)
ENGINE_FAILED_IDS = (40, 41, 42, 43)

MIXED = {
    "ok": scored(1.0, SCORED_IDS),
    "slow": timed_out(TIMED_OUT_IDS),
    "broken": failed(FailureReason.ENGINE, ENGINE_FAILED_IDS),
    "unprepared": failed(FailureReason.PREPARATION),
}
"""By dataset task: scored 1.0; the agent timed out after its calls (trained, 0.0);
the engine failed after a call (a trace, masked); preparation failed (no trace, masked)."""

GROUP_TASK = "group"
"""The task whose sample ``i`` ends as the ``i``-th of :data:`MIXED`."""


def mixed(task: str, index: int) -> Canned:
    """:data:`MIXED` by task, or in sample order for :data:`GROUP_TASK`."""
    return list(MIXED.values())[index] if task == GROUP_TASK else MIXED[task]


def mixed_task_file(root: Path) -> Path:
    return task_file(root, [GROUP_TASK, *MIXED])
