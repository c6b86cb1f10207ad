"""The generation journal: which attempts were started, and what came of each (SQLite).

Durability contract: :meth:`Journal.finish` returns only after the transaction
holding the attempt's result has committed, in WAL mode with
``synchronous=FULL`` (the commit is on disk: it survives a SIGKILL of the
generator and a power cut). An attempt is *acknowledged* once that commit is
done, and only acknowledged attempts count: in the live display, the
statistics and the exports. A killed run therefore loses at most the attempts
that were in flight; the rerun starts those again (or, against a rollout server
that kept running, picks their results up). Each fsync costs about a
millisecond, nothing next to a session's minutes.

An attempt is keyed by ``(task, attempt index)``. Its first result is kept; a
second one for the same key (a rollout task picked up again after a restart)
is ignored, so nothing is counted twice. A rollout task id is stored *before*
the task is submitted, so a rerun always knows what it may find on the server.

What makes a run the same run is checked on every open: the harness, the
trajectory builder and the session timeout, and a digest of each task's
definition. A rerun with another of these is refused with a message naming
it. The acceptance rule, filters, export formats and the number of attempts may
change between runs: statistics and exports are computed from the stored
results every time.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from polar.rollout.protocol import SessionResult
from polar.sft.verdict import AttemptKey, AttemptSummary
from polar.tasks.model import Task

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (task TEXT PRIMARY KEY, digest TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    incarnation INTEGER PRIMARY KEY,
    started_at REAL NOT NULL,
    pid INTEGER NOT NULL,
    server TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS attempts (
    task TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    rollout_id TEXT NOT NULL,
    incarnation INTEGER NOT NULL,
    state TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    finished_at REAL,
    summary BLOB,
    result BLOB,
    PRIMARY KEY (task, attempt)
);
"""


class JournalError(Exception):
    """A journal that cannot be used for this run (the message says why)."""


class AttemptState(StrEnum):
    SUBMITTED = "submitted"
    """Its rollout task was (about to be) submitted; no result yet."""
    DONE = "done"
    """Its result is stored: acknowledged."""


@dataclass(frozen=True, slots=True)
class RunSettings:
    """What makes a rerun the same run (see the module docstring)."""

    harness: str
    """The harness spec as JSON."""
    builder: str
    session_timeout_s: float

    def items(self) -> dict[str, str]:
        return {
            "harness": self.harness,
            "builder": self.builder,
            "session_timeout_s": repr(self.session_timeout_s),
        }


@dataclass(frozen=True, slots=True)
class Pending:
    """An attempt started by an earlier run whose result never arrived."""

    key: AttemptKey
    rollout_id: str
    incarnation: int


def task_digest(task: Task) -> str:
    return hashlib.sha256(task.model_dump_json().encode()).hexdigest()


class Journal:
    """One generation run's journal; one writer (the generator's main thread)."""

    def __init__(self, path: Path, *, settings: RunSettings, tasks: Sequence[Task], server: str):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        try:
            self._db = sqlite3.connect(path, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"{path}: not a usable journal ({exc})") from None
        try:
            self.run_id = self._check_run(settings, tasks)
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                cursor = self._db.execute(
                    "INSERT INTO runs (started_at, pid, server) VALUES (?, ?, ?)",
                    (time.time(), os.getpid(), server),
                )
            assert cursor.lastrowid is not None
            self.incarnation: int = cursor.lastrowid
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_run(self, settings: RunSettings, tasks: Sequence[Task]) -> str:
        """The run id: a new one for a new journal; checked settings for an old one."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
            if not meta:
                meta = {
                    "version": str(SCHEMA_VERSION),
                    "run_id": secrets.token_hex(4),
                    **settings.items(),
                }
                self._db.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
            elif meta.get("version") != str(SCHEMA_VERSION):
                raise JournalError(
                    f"{self.path}: journal version {meta.get('version')}, "
                    f"this Polar reads {SCHEMA_VERSION}"
                )
            for name, value in settings.items().items():
                if meta.get(name) != value:
                    raise JournalError(
                        f"{self.path}: this run used {name} {meta.get(name)}, not {value}; "
                        "use another --out for other settings"
                    )
            known = dict(self._db.execute("SELECT task, digest FROM tasks").fetchall())
            for task in tasks:
                digest = task_digest(task)
                if known.get(task.id, digest) != digest:
                    raise JournalError(
                        f"{self.path}: task {task.id} is not the task this run started with "
                        "(its definition changed); use another --out"
                    )
                if task.id not in known:
                    self._db.execute("INSERT INTO tasks VALUES (?, ?)", (task.id, digest))
        return str(meta["run_id"])

    # ---------------------------------------------------------------- writes

    def submitted(self, key: AttemptKey, rollout_id: str) -> None:
        """Record that ``key`` runs as rollout task ``rollout_id`` (before submitting it)."""
        with self._db:
            self._db.execute(
                "INSERT INTO attempts (task, attempt, rollout_id, incarnation, state, "
                "submitted_at) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (task, attempt) DO UPDATE SET rollout_id = excluded.rollout_id, "
                "incarnation = excluded.incarnation, submitted_at = excluded.submitted_at "
                "WHERE state = ?",
                (
                    key.task,
                    key.attempt,
                    rollout_id,
                    self.incarnation,
                    AttemptState.SUBMITTED.value,
                    time.time(),
                    AttemptState.SUBMITTED.value,
                ),
            )

    def finish(self, key: AttemptKey, result: SessionResult, summary: AttemptSummary) -> bool:
        """Store ``key``'s result (durably, see the contract); False if it already had one."""
        with self._db:
            cursor = self._db.execute(
                "UPDATE attempts SET state = ?, finished_at = ?, summary = ?, result = ? "
                "WHERE task = ? AND attempt = ? AND state = ?",
                (
                    AttemptState.DONE.value,
                    time.time(),
                    summary.to_json(),
                    zlib.compress(result.model_dump_json().encode(), 6),
                    key.task,
                    key.attempt,
                    AttemptState.SUBMITTED.value,
                ),
            )
        return cursor.rowcount == 1

    # ---------------------------------------------------------------- reads

    def summaries(self) -> dict[AttemptKey, AttemptSummary]:
        """Every acknowledged attempt's summary."""
        rows = self._db.execute(
            "SELECT task, attempt, summary FROM attempts WHERE state = ?",
            (AttemptState.DONE.value,),
        ).fetchall()
        return {AttemptKey(t, a): AttemptSummary.from_json(s) for t, a, s in rows}

    def pending(self) -> list[Pending]:
        """Attempts an earlier run started and never finished."""
        rows = self._db.execute(
            "SELECT task, attempt, rollout_id, incarnation FROM attempts "
            "WHERE state = ? AND incarnation < ? ORDER BY task, attempt",
            (AttemptState.SUBMITTED.value, self.incarnation),
        ).fetchall()
        return [Pending(AttemptKey(t, a), r, i) for t, a, r, i in rows]

    def result(self, key: AttemptKey) -> SessionResult:
        row = self._db.execute(
            "SELECT result FROM attempts WHERE task = ? AND attempt = ? AND state = ?",
            (key.task, key.attempt, AttemptState.DONE.value),
        ).fetchone()
        if row is None:
            raise KeyError(key)
        return SessionResult.model_validate_json(zlib.decompress(row[0]))

    def results(self, keys: Sequence[AttemptKey]) -> Iterator[tuple[AttemptKey, SessionResult]]:
        """Stored results, one at a time (a run's results need not fit in memory)."""
        for key in keys:
            yield key, self.result(key)

    def rollout_ids(self) -> dict[AttemptKey, str]:
        rows = self._db.execute("SELECT task, attempt, rollout_id FROM attempts").fetchall()
        return {AttemptKey(t, a): r for t, a, r in rows}
