"""The rollout server's durable state: tasks, their sessions, every result, and the nodes.

One SQLite file (WAL). Everything the server decides is written here before it
acts on it, so a restarted server knows each task, which node holds which
session, and every result already received: it resumes queued sessions,
reconciles dispatched ones with the nodes' heartbeats, and reports the rest.
It also knows its nodes (where they are, their capacity, which are draining, when
each was last heard from), so it dispatches to them again without waiting for them
to re-register; the cost is one small write per heartbeat.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from polar.rollout.failure import FailureReason
from polar.rollout.protocol import (
    NodeRegistration,
    SessionResult,
    SessionStatus,
    SessionView,
    TaskResult,
    TaskStatus,
    TaskSubmission,
    TaskView,
    inferred_failure,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    submission TEXT NOT NULL,
    status TEXT NOT NULL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    early_stopped INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    finished_at REAL,
    callback_done INTEGER NOT NULL DEFAULT 0,
    callback_error TEXT
);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES tasks(task_id),
    sample_index INTEGER NOT NULL,
    status TEXT NOT NULL,
    node_id TEXT,
    dispatched_at REAL,
    updated_at REAL NOT NULL,
    error TEXT,
    failure TEXT,
    replaced_by TEXT,
    result TEXT,
    UNIQUE (task_id, sample_index)
);
CREATE TABLE IF NOT EXISTS task_tokens (
    task_id TEXT PRIMARY KEY REFERENCES tasks(task_id),
    token_sha256 TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY,
    registration TEXT NOT NULL,
    draining INTEGER NOT NULL DEFAULT 0,
    last_seen REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_status ON sessions (status);
CREATE INDEX IF NOT EXISTS sessions_by_task ON sessions (task_id);
"""

ADDED_COLUMNS = {"sessions": {"failure": "TEXT"}}
"""Columns a database written by an older server lacks (added on open; NULL in old rows)."""


@dataclass(frozen=True, slots=True)
class TaskRow:
    task_id: str
    submission: TaskSubmission
    status: TaskStatus
    cancel_requested: bool
    early_stopped: bool
    created_at: float
    finished_at: float | None
    callback_done: bool
    callback_error: str | None


@dataclass(frozen=True, slots=True)
class SessionRow:
    session_id: str
    task_id: str
    sample_index: int
    status: SessionStatus
    node_id: str | None
    dispatched_at: float | None
    updated_at: float
    error: str | None
    failure: FailureReason | None
    """Why it failed, for a session the server ended itself (lost, cancelled while
    queued, refused); a node's result carries its own."""
    replaced_by: str | None
    result: SessionResult | None


@dataclass(frozen=True, slots=True)
class NodeRow:
    registration: NodeRegistration
    draining: bool
    last_seen: float
    """Wall-clock time the node was last heard from."""


class RolloutStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)
        self._add_columns()

    def _add_columns(self) -> None:
        for table, columns in ADDED_COLUMNS.items():
            have = {row["name"] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for name, kind in columns.items():
                if name not in have:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    def close(self) -> None:
        self._db.close()

    # ---------------------------------------------------------------- nodes

    def save_node(self, registration: NodeRegistration, *, draining: bool) -> None:
        with self._db:
            self._db.execute(
                "INSERT INTO nodes (node_id, registration, draining, last_seen) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (node_id) DO UPDATE SET "
                "registration = excluded.registration, draining = excluded.draining, "
                "last_seen = excluded.last_seen",
                (
                    registration.node_id,
                    # the gateway's admin token stays in memory: a node that is
                    # back registers again (and sends it again)
                    registration.model_dump_json(exclude={"gateway"}),
                    draining,
                    time.time(),
                ),
            )

    def set_draining(self, node_id: str, draining: bool) -> None:
        with self._db:
            self._db.execute("UPDATE nodes SET draining = ? WHERE node_id = ?", (draining, node_id))

    def node_seen(self, node_id: str) -> None:
        with self._db:
            self._db.execute(
                "UPDATE nodes SET last_seen = ? WHERE node_id = ?", (time.time(), node_id)
            )

    def drop_node(self, node_id: str) -> None:
        with self._db:
            self._db.execute("DELETE FROM nodes WHERE node_id = ?", (node_id,))

    def nodes(self) -> list[NodeRow]:
        rows = self._db.execute("SELECT * FROM nodes ORDER BY node_id").fetchall()
        return [
            NodeRow(
                registration=NodeRegistration.model_validate_json(row["registration"]),
                draining=bool(row["draining"]),
                last_seen=row["last_seen"],
            )
            for row in rows
        ]

    # ---------------------------------------------------------------- writes

    def add_task(self, task_id: str, submission: TaskSubmission, token_sha256: str) -> None:
        """Store a submitted task, its queued sessions, and the digest of its read token."""
        now = time.time()
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute(
                "INSERT INTO tasks (task_id, submission, status, created_at) VALUES (?, ?, ?, ?)",
                (task_id, submission.model_dump_json(), TaskStatus.RUNNING.value, now),
            )
            self._db.execute(
                "INSERT INTO task_tokens (task_id, token_sha256) VALUES (?, ?)",
                (task_id, token_sha256),
            )
            for index in range(submission.num_samples):
                self._insert_session(task_id, index, now)

    def add_session(self, task_id: str, sample_index: int) -> str:
        with self._db:
            return self._insert_session(task_id, sample_index, time.time())

    def _insert_session(self, task_id: str, index: int, now: float) -> str:
        sid = f"{task_id}-s{index}"
        self._db.execute(
            "INSERT INTO sessions (session_id, task_id, sample_index, status, updated_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (sid, task_id, index, SessionStatus.QUEUED.value, now),
        )
        return sid

    def set_session(
        self,
        session_id: str,
        status: SessionStatus,
        *,
        node_id: str | None = None,
        dispatched: bool = False,
        error: str | None = None,
        failure: FailureReason | None = None,
        clear_node: bool = False,
    ) -> None:
        now = time.time()
        self._db.execute(
            "UPDATE sessions SET status = ?, updated_at = ?, "
            "node_id = CASE WHEN ? THEN NULL ELSE COALESCE(?, node_id) END, "
            "dispatched_at = CASE WHEN ? THEN ? WHEN ? THEN NULL ELSE dispatched_at END, "
            "error = COALESCE(?, error), failure = COALESCE(?, failure) WHERE session_id = ?",
            (
                status.value,
                now,
                clear_node,
                node_id,
                dispatched,
                now,
                clear_node,
                error,
                failure.value if failure is not None else None,
                session_id,
            ),
        )

    def set_result(self, result: SessionResult) -> None:
        self._db.execute(
            "UPDATE sessions SET status = ?, updated_at = ?, error = ?, failure = ?, "
            "result = ?, node_id = COALESCE(?, node_id) WHERE session_id = ?",
            (
                result.status.value,
                time.time(),
                result.error,
                result.failure.value if result.failure is not None else None,
                result.model_dump_json(),
                result.node_id,
                result.session_id,
            ),
        )

    def set_replaced(self, session_id: str, replacement: str) -> None:
        self._db.execute(
            "UPDATE sessions SET replaced_by = ? WHERE session_id = ?", (replacement, session_id)
        )

    def update_task(self, task_id: str, **fields: object) -> None:
        allowed = {
            "status",
            "cancel_requested",
            "early_stopped",
            "finished_at",
            "callback_done",
            "callback_error",
        }
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"unknown task fields {sorted(unknown)}")
        values = [
            value.value if isinstance(value, TaskStatus) else value for value in fields.values()
        ]
        assignments = ", ".join(f"{name} = ?" for name in fields)
        self._db.execute(
            f"UPDATE tasks SET {assignments} WHERE task_id = ?",
            (*values, task_id),
        )

    # ---------------------------------------------------------------- reads

    def token_sha256(self, task_id: str) -> str | None:
        row = self._db.execute(
            "SELECT token_sha256 FROM task_tokens WHERE task_id = ?", (task_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    def task(self, task_id: str) -> TaskRow | None:
        row = self._db.execute("SELECT * FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        return None if row is None else _task_row(row)

    def tasks(self, *, status: TaskStatus | None = None, limit: int = 100) -> list[TaskRow]:
        if status is None:
            rows = self._db.execute(
                "SELECT * FROM tasks ORDER BY created_at DESC LIMIT ?", (limit,)
            ).fetchall()
        else:
            rows = self._db.execute(
                "SELECT * FROM tasks WHERE status = ? ORDER BY created_at DESC LIMIT ?",
                (status.value, limit),
            ).fetchall()
        return [_task_row(row) for row in rows]

    def session(self, session_id: str) -> SessionRow | None:
        row = self._db.execute(
            "SELECT * FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        return None if row is None else _session_row(row)

    def sessions_of(self, task_id: str) -> list[SessionRow]:
        rows = self._db.execute(
            "SELECT * FROM sessions WHERE task_id = ? ORDER BY sample_index", (task_id,)
        ).fetchall()
        return [_session_row(row) for row in rows]

    def queued(self) -> list[SessionRow]:
        """Queued sessions of running tasks, oldest task first."""
        rows = self._db.execute(
            "SELECT s.* FROM sessions s JOIN tasks t USING (task_id) "
            "WHERE s.status = ? AND t.status = ? ORDER BY t.created_at, s.sample_index",
            (SessionStatus.QUEUED.value, TaskStatus.RUNNING.value),
        ).fetchall()
        return [_session_row(row) for row in rows]

    def in_flight(self) -> list[SessionRow]:
        """Sessions handed to a node and not ended."""
        terminal = [status.value for status in SessionStatus if status.terminal] + [
            SessionStatus.QUEUED.value
        ]
        marks = ", ".join("?" for _ in terminal)
        rows = self._db.execute(
            f"SELECT * FROM sessions WHERE status NOT IN ({marks})",
            terminal,
        ).fetchall()
        return [_session_row(row) for row in rows]

    # ---------------------------------------------------------------- views

    def view(self, task_id: str) -> TaskView | None:
        task = self.task(task_id)
        if task is None:
            return None
        sessions = self.sessions_of(task_id)
        counts: dict[str, int] = {}
        for session in sessions:
            counts[session.status.value] = counts.get(session.status.value, 0) + 1
        rewards = [
            session.result.reward
            for session in sessions
            if session.result is not None and session.result.usable
        ]
        return TaskView(
            task_id=task.task_id,
            task=task.submission.task.id,
            group_id=task.submission.group_id or task.task_id,
            status=task.status,
            harness=task.submission.harness.name,
            num_samples=task.submission.num_samples,
            created_at=task.created_at,
            finished_at=task.finished_at,
            sessions=[
                SessionView(
                    session_id=session.session_id,
                    sample_index=session.sample_index,
                    status=session.status,
                    node_id=session.node_id,
                    reward=session.result.reward if session.result is not None else None,
                    error=session.error,
                    failure=session.failure,
                    replaced_by=session.replaced_by,
                )
                for session in sessions
            ],
            counts=counts,
            mean_reward=_mean([reward for reward in rewards if reward is not None]),
            callback_error=task.callback_error,
        )

    def result(self, task_id: str) -> TaskResult | None:
        task = self.task(task_id)
        if task is None:
            return None
        sessions = self.sessions_of(task_id)
        results = [session.result or _synthetic(session) for session in sessions]
        usable = [result for result in results if result.usable]
        return TaskResult(
            task_id=task_id,
            task=task.submission.task.id,
            group_id=task.submission.group_id or task_id,
            status=task.status,
            policy_version=task.submission.policy_version,
            results=results,
            replaced=[
                session.session_id for session in sessions if session.replaced_by is not None
            ],
            usable=len(usable),
            mean_reward=_mean([result.reward for result in usable if result.reward is not None]),
        )


def _synthetic(session: SessionRow) -> SessionResult:
    """The result of a session that never produced one on a node."""
    return SessionResult(
        session_id=session.session_id,
        task_id=session.task_id,
        sample_index=session.sample_index,
        node_id=session.node_id,
        status=session.status,
        error=session.error,
        failure=session.failure,
    )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _task_row(row: sqlite3.Row) -> TaskRow:
    return TaskRow(
        task_id=row["task_id"],
        submission=TaskSubmission.model_validate_json(row["submission"]),
        status=TaskStatus(row["status"]),
        cancel_requested=bool(row["cancel_requested"]),
        early_stopped=bool(row["early_stopped"]),
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        callback_done=bool(row["callback_done"]),
        callback_error=row["callback_error"],
    )


def _session_row(row: sqlite3.Row) -> SessionRow:
    raw = row["result"]
    status = SessionStatus(row["status"])
    result = SessionResult.model_validate(json.loads(raw)) if raw else None
    return SessionRow(
        session_id=row["session_id"],
        task_id=row["task_id"],
        sample_index=row["sample_index"],
        status=status,
        node_id=row["node_id"],
        dispatched_at=row["dispatched_at"],
        updated_at=row["updated_at"],
        error=row["error"],
        failure=_failure(row["failure"], status),
        replaced_by=row["replaced_by"],
        result=result,
    )


def _failure(stored: str | None, status: SessionStatus) -> FailureReason | None:
    """The stored reason; for a row an older server ended, what its status meant."""
    return FailureReason(stored) if stored is not None else inferred_failure(status)
