"""SQLite record store: one writer thread with group commit, WAL readers.

Durability contract (what is on disk, and when):

* ``await store.begin(record)`` returns once the row of a call about to be
  sent to the engine has committed: status ``in_flight``, the client's and the
  engine's request bodies, and the prompt ids when the gateway rendered them.
  The relay awaits it before it calls the engine, so every call that reached
  an engine is in the store even if the gateway is killed the next instant.
* ``await store.finish(record)`` writes the call's outcome over that row
  (completed, failed or aborted; sampled ids, logprobs, message, usage,
  error). The relay awaits it before the last byte of a reply, so an answered
  call is durable before the client knows it was answered.
* :meth:`SqliteStore.open` marks rows still ``in_flight`` from an earlier
  process ``interrupted``: they were sent and never finished. One gateway
  process writes a store at a time (an exclusive lock on ``<path>.lock``), so
  rows in flight at open can only be a dead process's. The exception is a
  gateway group (``--workers N``): its parent holds the lock and recovers, its
  workers open the store as ``member`` and write it together (SQLite's write
  lock orders their transactions); the parent marks a dead worker's calls with
  :meth:`SqliteStore.interrupt_in_flight`.
* ``await store.append(record)`` writes a finished record in one go.

With ``synchronous="normal"`` (the default; WAL mode) commits survive a crash
or ``kill -9`` of the gateway process; a power cut or kernel crash can lose the
last transactions. ``"full"`` fsyncs every commit and survives those too.

Cost: the writes of one event-loop turn share one transaction (group commit),
so the dispatch row costs less than a second commit per call, and the outcome
is written by the rowid the writer kept from the begin (one UPDATE, no lookup).
With ``synchronous="normal"`` the loop commits its turn's transaction itself
at the turn's end when SQLite's write lock is free (a commit there writes the
WAL and flushes nothing; the writer's thread takes the batches that would wait,
for the lock a gateway group's other workers hold, say, and the WAL
checkpoints): no thread hand-over per write. ``"full"`` always commits on the
thread.
``benchmarks/reliability.py store`` measures begin + finish against one append
per call, side by side in one run, at several concurrency levels.

A caller cancelled while waiting does not cancel its write. A write that does
not commit within ``write_timeout_s`` raises :class:`StoreError` instead of
hanging (the gateway answers 503), and :meth:`SqliteStore.state` reports
whether the writer is alive and its last transaction committed, for
``/health``. Reads open their own connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from polar.ir import CallError, CompletionRecord, ErrorKind, RecordStatus
from polar.ir.codec import distribution_from_json
from polar.ir.tokenids import TokenRun
from polar.proxy.store.packing import decode_blob
from polar.proxy.store.rows import (
    MIGRATIONS,
    RECORD_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    dumps,
    error_json,
    record_from_row,
)
from polar.proxy.store.writer import (
    AppendRecord,
    BeginRecord,
    CloseSession,
    FinishRecord,
    InsertSession,
    Item,
    Op,
    SessionRow,
    SetMeta,
    StoreError,
    Writer,
)

__all__ = ["SessionRow", "SqliteStore", "StoreError", "StoreState", "StoreStats"]

_log = logging.getLogger(__name__)

_POLICY_VERSION = "policy_version"


@dataclass(frozen=True, slots=True)
class StoreStats:
    """What one session costs on disk, against storing every call in full."""

    records: int
    stored_bytes: int
    naive_bytes: int


@dataclass(frozen=True, slots=True)
class StoreState:
    """The store's health, as ``/health`` reports it."""

    open: bool
    writing: bool
    """The writer thread is alive and its last transaction committed."""
    queued: int
    failed_ops: int
    interrupted_at_open: int
    """Calls an earlier process left in flight, marked ``interrupted`` at open."""
    last_error: str | None


class SqliteStore:
    """Sessions and completion records in one SQLite file."""

    def __init__(
        self,
        path: Path,
        *,
        synchronous: Literal["full", "normal"] = "normal",
        delta_window: int = 4,
        delta_budget_bytes: int = 256 << 20,
        write_timeout_s: float = 30.0,
        member: bool = False,
    ) -> None:
        """``member``: one of the worker processes of a gateway started with
        ``--workers N`` (:mod:`polar.proxy.workers`), which write this store
        together. Their parent holds the lock and recovers calls left in flight;
        a member does neither."""
        self.path = path
        self._member = member
        self._synchronous = synchronous.upper()
        self._delta_window = delta_window
        self._delta_budget = delta_budget_bytes
        self._write_timeout = write_timeout_s
        self._writer: Writer | None = None
        # Per event loop, the writes of its current turn (see _hold).
        self._held: dict[asyncio.AbstractEventLoop, _Turn] = {}
        self._lock_fd: int | None = None
        self.interrupted_at_open = 0

    # ---------------------------------------------------------------- lifecycle

    def open(self) -> None:
        """Open for writing: schema, migrations, recovery of calls left in flight."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self._member:
            self._lock()
        try:
            conn = self._connect()
        except sqlite3.DatabaseError as exc:
            self._unlock()
            raise StoreError(f"{self.path}: not a usable record store ({exc})") from exc
        try:
            conn.executescript(SCHEMA)
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
            elif int(row[0]) > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: record store schema version {row[0]} is newer than "
                    f"this Polar's ({SCHEMA_VERSION})"
                )
            else:
                for version in range(int(row[0]) + 1, SCHEMA_VERSION + 1):
                    for statement in MIGRATIONS[version]:
                        conn.execute(statement)
                conn.execute(
                    "UPDATE meta SET value = ? WHERE key = 'schema_version'",
                    (str(SCHEMA_VERSION),),
                )
            conn.commit()
            if not self._member:
                self.interrupted_at_open = self._recover(conn)
        except (sqlite3.DatabaseError, StoreError) as exc:
            conn.close()
            self._unlock()
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"{self.path}: not a usable record store ({exc})") from exc
        checkpoint = None
        if self._synchronous == "NORMAL":
            # Commits that do not flush: the event loop can commit its own writes
            # when the lock is free (see polar.proxy.store.writer).
            conn.execute("PRAGMA busy_timeout=0")
            checkpoint = self._connect()
        self._writer = Writer(
            conn,
            delta_window=self._delta_window,
            delta_budget=self._delta_budget,
            checkpoint=checkpoint,
        )

    def _recover(self, conn: sqlite3.Connection) -> int:
        error = CallError(
            kind=ErrorKind.GATEWAY_STOPPED,
            message="the gateway stopped while this call was in flight",
        )
        cursor = conn.execute(
            "UPDATE records SET status = ?, error = ? WHERE status = ?",
            (
                RecordStatus.INTERRUPTED.value,
                dumps(error_json(error)),
                RecordStatus.IN_FLIGHT.value,
            ),
        )
        conn.commit()
        if cursor.rowcount:
            _log.warning(
                "record store: %d calls were in flight when the last gateway stopped; "
                "marked interrupted",
                cursor.rowcount,
            )
        return int(cursor.rowcount)

    def interrupt_in_flight(self, owned: Callable[[str], bool]) -> int:
        """Mark ``interrupted`` the calls in flight of the sessions ``owned`` says
        are a dead worker's (a group's parent calls it before the worker restarts)."""
        conn = self._connect()
        try:
            rows = conn.execute(
                "SELECT rowid, session_id FROM records WHERE status = ?",
                (RecordStatus.IN_FLIGHT.value,),
            ).fetchall()
            rowids = [(rowid,) for rowid, session_id in rows if owned(session_id)]
            error = CallError(
                kind=ErrorKind.GATEWAY_STOPPED,
                message="the gateway worker serving this call stopped while it was in flight",
            )
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "UPDATE records SET status = ?, error = ? WHERE rowid = ? AND status = ?",
                [
                    (RecordStatus.INTERRUPTED.value, dumps(error_json(error)), rowid,
                     RecordStatus.IN_FLIGHT.value)
                    for (rowid,) in rowids
                ],
            )  # fmt: skip
            conn.execute("COMMIT")
        finally:
            conn.close()
        return len(rowids)

    def close(self) -> None:
        if self._writer is None:
            return
        for loop in list(self._held):  # writes held in a turn that has not ended
            turn = self._held.pop(loop, None)
            if turn is not None:
                self._writer.put(turn.items)
        self._writer.stop()
        self._writer = None
        self._unlock()

    def _lock(self) -> None:
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(
                f"{self.path}: another gateway process is writing this record store"
            ) from None
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the lock
            self._lock_fd = None

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        if not self.path.exists():
            raise StoreError(f"{self.path}: no record store here")
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        try:
            conn.execute("PRAGMA busy_timeout=10000")
            yield conn
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: cannot read record store ({exc})") from exc
        finally:
            conn.close()

    def state(self) -> StoreState:
        writer = self._writer
        if writer is None:
            return StoreState(
                open=False,
                writing=False,
                queued=0,
                failed_ops=0,
                interrupted_at_open=self.interrupted_at_open,
                last_error=None,
            )
        w = writer.state()
        return StoreState(
            open=True,
            writing=w.alive and w.healthy,
            queued=w.queued,
            failed_ops=w.failed_ops,
            interrupted_at_open=self.interrupted_at_open,
            last_error=w.last_error,
        )

    # ---------------------------------------------------------------- writes

    async def insert_session(self, row: SessionRow) -> None:
        await self._submit(InsertSession(row))

    async def close_session(self, session_id: str, closed_at: float) -> None:
        await self._submit(CloseSession(session_id, closed_at))

    async def begin(self, record: CompletionRecord, *, prompt: bytes | None = None) -> None:
        """Persist the row of a call about to reach the engine (status ``in_flight``).
        ``prompt``: its prompt ids already packed, if the caller has them."""
        if record.status is not RecordStatus.IN_FLIGHT:
            raise ValueError(f"begin() takes an in-flight record, not {record.status.value}")
        await self._submit(BeginRecord(record, prompt))

    async def finish(self, record: CompletionRecord, *, ids: TokenRun | None = None) -> None:
        """Persist the outcome of a call written by :meth:`begin`; returns once committed.
        ``ids``: its prompt then output ids already packed, if the caller has them."""
        if record.status is RecordStatus.IN_FLIGHT:
            raise ValueError("finish() takes a finished record")
        await self._submit(FinishRecord(record, ids))

    async def append(self, record: CompletionRecord) -> None:
        """Persist a finished ``record`` in one go; returns once it is committed."""
        await self._submit(AppendRecord(record))

    async def set_policy_version(self, version: int) -> None:
        """Persist the policy version the gateway stamps on new calls."""
        await self._submit(SetMeta(_POLICY_VERSION, str(version)))

    def policy_version(self) -> int:
        """The last persisted policy version; a store from before versions were
        persisted: the newest one on a record; an empty store: 0."""
        with self._reader() as conn:
            row = conn.execute(
                "SELECT value FROM meta WHERE key = ?", (_POLICY_VERSION,)
            ).fetchone()
            if row is not None:
                return int(row[0])
            newest = conn.execute("SELECT MAX(policy_version) FROM records").fetchone()
        return int(newest[0]) if newest and newest[0] is not None else 0

    async def _submit(self, op: Op) -> None:
        writer = self._writer
        if writer is None:
            raise StoreError("record store is not open")
        if not writer.alive:
            raise StoreError("the record store's writer has stopped")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        # Once queued, the write happens even if this caller is cancelled (which
        # cancels only its wait) or times out.
        self._hold(writer, loop).add(op, future)
        await future

    def _hold(self, writer: Writer, loop: asyncio.AbstractEventLoop) -> _Turn:
        """The writes of this event-loop turn: queued together at its end, so the
        writer thread wakes once per turn, not once per write, and one timer
        (not one per write) fails those not committed in time."""
        turn = self._held.get(loop)
        if turn is None:
            turn = self._held[loop] = _Turn(self._write_timeout)
            loop.call_soon(self._send_held, writer, loop)
        return turn

    def _send_held(self, writer: Writer, loop: asyncio.AbstractEventLoop) -> None:
        turn = self._held.pop(loop, None)
        if turn is not None and not writer.apply_now(turn.items):
            writer.put(turn.items)
            turn.start_timer(loop)

    # ---------------------------------------------------------------- reads

    def load_sessions(self, *, include_closed: bool = False) -> list[SessionRow]:
        where = "" if include_closed else "WHERE s.closed_at IS NULL"
        return self._sessions(where, ())

    def session(self, session_id: str) -> SessionRow | None:
        rows = self._sessions("WHERE s.id = ?", (session_id,))
        return rows[0] if rows else None

    def _sessions(self, where: str, args: tuple[Any, ...]) -> list[SessionRow]:
        with self._reader() as conn:
            rows = conn.execute(
                "SELECT s.id, s.key_hash, s.created_at, s.closed_at, s.metadata, "
                "COALESCE((SELECT MAX(seq) FROM records r WHERE r.session_id = s.id), 0), "
                "s.sampling "
                f"FROM sessions s {where} ORDER BY s.created_at",
                args,
            ).fetchall()
        return [
            SessionRow(
                id=r[0],
                key_hash=r[1],
                created_at=r[2],
                closed_at=r[3],
                metadata=orjson.loads(r[4]),
                last_seq=r[5],
                sampling=distribution_from_json(orjson.loads(r[6])) if r[6] else None,
            )
            for r in rows
        ]

    def records(self, session_id: str) -> list[CompletionRecord]:
        """All records of a session in ``(seq, attempt)`` order, prompts reconstructed."""
        with self._reader() as conn:
            rows = conn.execute(
                f"SELECT {RECORD_COLUMNS} FROM records WHERE session_id = ? ORDER BY seq, attempt",
                (session_id,),
            ).fetchall()
            fulls: dict[int, bytes] = {}
            blob_cache: dict[bytes, bytes] = {}

            def load_blob(key: bytes) -> bytes:
                if key not in blob_cache:
                    got = conn.execute("SELECT data FROM blobs WHERE key = ?", (key,)).fetchone()
                    if got is None:
                        raise StoreError(f"{self.path}: missing blob {key.hex()}")
                    blob_cache[key] = decode_blob(got[0])
                return blob_cache[key]

            def full_of(rowid: int) -> bytes:
                if rowid not in fulls:
                    got = conn.execute(
                        "SELECT prompt_base, prompt_shared, prompt_tail, output_ids "
                        "FROM records WHERE rowid = ?",
                        (rowid,),
                    ).fetchone()
                    if got is None:
                        raise StoreError(f"{self.path}: missing base record {rowid}")
                    fulls[rowid] = _prompt(got[0], got[1], got[2], full_of) + got[3]
                return fulls[rowid]

            out = []
            for row in rows:
                prompt = _prompt(row[18], row[19], row[20], full_of)
                fulls[row[0]] = prompt + row[21]
                out.append(record_from_row(row, prompt, load_blob))
            return out

    def stats(self, session_id: str) -> StoreStats:
        """Bytes this session occupies, and what storing each call in full would take."""
        records = self.records(session_id)
        with self._reader() as conn:
            record_bytes = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(original_request) + LENGTH(engine_request) "
                "+ LENGTH(prompt_tail) + LENGTH(output_ids) + LENGTH(output_logprobs) "
                "+ LENGTH(timings) + COALESCE(LENGTH(message), 0) + COALESCE(LENGTH(usage), 0) "
                "+ COALESCE(LENGTH(error), 0) + 64), 0) FROM records WHERE session_id = ?",
                (session_id,),
            ).fetchone()
            blob_bytes = conn.execute(
                "SELECT COALESCE(SUM(LENGTH(data) + 40), 0) FROM blobs WHERE session_id = ?",
                (session_id,),
            ).fetchone()[0]
        naive = sum(
            len(dumps(r.original_request))
            + len(dumps(r.engine_request))
            + 4 * (len(r.prompt_ids) + len(r.output_ids))
            + 8 * len(r.output_logprobs)
            for r in records
        )
        return StoreStats(
            records=int(record_bytes[0]),
            stored_bytes=int(record_bytes[1]) + int(blob_bytes),
            naive_bytes=naive,
        )


class _Turn:
    """One event-loop turn's writes, and the timer that fails those of them
    still not committed ``timeout_s`` after they were queued."""

    __slots__ = ("items", "pending", "timeout_s", "timer")

    def __init__(self, timeout_s: float) -> None:
        self.items: list[Item] = []
        self.pending = 0
        self.timeout_s = timeout_s
        self.timer: asyncio.TimerHandle | None = None

    def add(self, op: Op, future: asyncio.Future[None]) -> None:
        self.items.append((op, future, future.get_loop()))
        self.pending += 1
        future.add_done_callback(self._settled)

    def start_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.pending:
            self.timer = loop.call_later(self.timeout_s, self._expire)

    def _settled(self, future: asyncio.Future[None]) -> None:
        if not future.cancelled():
            future.exception()  # seen: its caller may have stopped waiting
        self.pending -= 1
        if not self.pending and self.timer is not None:
            self.timer.cancel()

    def _expire(self) -> None:
        message = f"the record store did not commit within {self.timeout_s:g} s"
        for _, future, _ in self.items:
            if future is not None and not future.done():
                future.set_exception(StoreError(message))


def _prompt(base: int | None, shared: int, tail: bytes, full_of: Callable[[int], bytes]) -> bytes:
    if base is None:
        return bytes(tail)
    return full_of(base)[: shared * 4] + tail
