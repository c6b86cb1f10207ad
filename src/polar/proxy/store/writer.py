"""The record store's writer: one connection, group commit, on the event loop
when that needs no waiting and on its own thread when it does.

Every write is an operation; the operations of one event-loop turn are applied
together in one transaction, so the cost of a commit is shared by every call
that arrived meanwhile. When a batch fails its operations are retried one per
transaction, so a bad operation fails alone.

Where a turn's batch is applied (``inline`` writers: ``synchronous=normal``):

* **On the event loop, at the end of the turn**, when nothing is queued for the
  thread and SQLite's write lock is free (``BEGIN IMMEDIATE`` without a busy
  wait: the workers of a gateway group share the file, and take turns). A
  commit with ``synchronous=normal`` is a write into the WAL, not a disk
  flush, so this costs the loop what the transaction costs and saves the
  thread's wake-up, the hand-over of the GIL and the wake-up of the loop to
  settle the callers (measured in ``benchmarks/gateway.py --scale``).
* **On the thread** otherwise: while it still has batches (so batches commit
  in the order they were made), while another connection holds the write lock
  (the thread waits for it, the loop does not), a batch that failed on the
  loop (rolled back; the thread retries it one operation per transaction),
  and always for a writer that is not ``inline`` (``synchronous=full``
  flushes the disk at every commit).

WAL checkpoints (the only disk flushes with ``synchronous=normal``) are the
thread's, on a connection of its own, so the loop never waits for the disk:
an ``inline`` writer turns SQLite's automatic checkpoint off and the thread
checkpoints every ``CHECKPOINT_COMMITS`` commits or ``CHECKPOINT_S`` seconds.

The writer never dies of an operation: any exception (a value SQLite cannot
store, a body that cannot be serialised, a bug) becomes that operation's
outcome and a one-line log naming it; an outcome that cannot be stored marks
its row ``failed`` with the reason instead. Should the thread end anyway,
everything still queued is failed at once and :meth:`Writer.state` says so.

In-memory caches (known blobs, prompt bases, list memos) are updated only after
a commit, so a rolled-back write never leaves a reference to rows that are not
there. The loop and the thread never use the connection or the caches at the
same time: whoever applies a batch holds ``_using``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, assert_never

from polar.ir import CallError, CompletionRecord, Distribution, ErrorKind, RecordStatus
from polar.ir.codec import distribution_to_json
from polar.ir.tokenids import WIDTH, TokenRun, best_shared_prefix, pack
from polar.proxy.logtext import describe
from polar.proxy.store.packing import ListMemo, encode_blob, split_body
from polar.proxy.store.rows import OUTCOME_COLUMNS, dumps, error_json, outcome_values

_log = logging.getLogger(__name__)

BATCH = 512
CHECKPOINT_COMMITS = 256
CHECKPOINT_S = 0.5
_BUSY_WAIT_MS = 10_000


class StoreError(Exception):
    """The record store could not do what was asked (corrupt file, schema mismatch,
    closed, not writing)."""


@dataclass(frozen=True, slots=True)
class SessionRow:
    id: str
    key_hash: str
    created_at: float
    closed_at: float | None
    metadata: dict[str, Any]
    last_seq: int
    sampling: Distribution | None = None
    """The session's sampling policy: every call's settings replaced by it."""


@dataclass(frozen=True, slots=True)
class InsertSession:
    row: SessionRow


@dataclass(frozen=True, slots=True)
class CloseSession:
    session_id: str
    closed_at: float


@dataclass(frozen=True, slots=True)
class AppendRecord:
    """A finished record in one go."""

    record: CompletionRecord


@dataclass(frozen=True, slots=True)
class BeginRecord:
    """The row of a call about to be sent to the engine (status ``in_flight``)."""

    record: CompletionRecord
    prompt: bytes | None = None
    """``record.prompt_ids`` packed, when the caller has them so already."""


@dataclass(frozen=True, slots=True)
class FinishRecord:
    """A dispatched call's outcome, written over its ``in_flight`` row."""

    record: CompletionRecord
    ids: TokenRun | None = None
    """The record's prompt then output ids, packed, when the caller has them so
    already (kept as a delta base, sharing memory with the caller's copy)."""


@dataclass(frozen=True, slots=True)
class SetMeta:
    key: str
    value: str


@dataclass(frozen=True, slots=True)
class MarkFailed:
    """Last resort for an outcome that could not be stored."""

    session_id: str
    seq: int
    attempt: int
    message: str


Op = InsertSession | CloseSession | AppendRecord | BeginRecord | FinishRecord | SetMeta | MarkFailed


def label(op: Op) -> str:
    """A short name for logs (never the op's data)."""
    match op:
        case AppendRecord(record=r) | BeginRecord(record=r) | FinishRecord(record=r):
            return f"{type(op).__name__} {r.key}"
        case InsertSession(row=row):
            return f"InsertSession {row.id}"
        case CloseSession(session_id=sid):
            return f"CloseSession {sid}"
        case SetMeta(key=key):
            return f"SetMeta {key}"
        case MarkFailed(session_id=sid, seq=seq, attempt=attempt):
            return f"MarkFailed {sid}/{seq}.{attempt}"
        case _:
            assert_never(op)


@dataclass(frozen=True, slots=True)
class WriterState:
    alive: bool
    """The writer thread is running."""
    healthy: bool
    """Its last transaction committed (or it has not needed one yet)."""
    queued: int
    failed_ops: int
    """Operations that failed since start (bad records included)."""
    last_error: str | None


class DeltaBases:
    """Recent ``prompt + output`` id strings per session, to encode new prompts as deltas.

    Bounded by a global byte budget (each string counted whole, though runs
    share their prefixes); evicting only costs compression (the next prompt of
    an evicted session is stored in full). A closed session's go at once.
    """

    def __init__(self, per_session: int, byte_budget: int) -> None:
        self._per_session = per_session
        self._budget = byte_budget
        self._bytes = 0
        self._sessions: OrderedDict[str, deque[tuple[int, TokenRun]]] = OrderedDict()

    def best(self, session_id: str, prompt: bytes) -> tuple[int | None, int]:
        entries = self._sessions.get(session_id)
        if not entries:
            return None, 0
        self._sessions.move_to_end(session_id)
        # The newest string sharing the most (the last call's, as a rule).
        found = best_shared_prefix(prompt, entries, lambda entry: entry[1])
        if found is None:
            return None, 0
        (rowid, _), shared = found
        return rowid, shared

    def add(self, session_id: str, rowid: int, full: TokenRun) -> None:
        entries = self._sessions.setdefault(session_id, deque())
        self._sessions.move_to_end(session_id)
        entries.append((rowid, full))
        self._bytes += len(full) * WIDTH
        if len(entries) > self._per_session:
            self._bytes -= len(entries.popleft()[1]) * WIDTH
        while self._bytes > self._budget and self._sessions:
            _, dropped = self._sessions.popitem(last=False)
            self._bytes -= sum(len(full) for _, full in dropped) * WIDTH

    def drop(self, session_id: str) -> None:
        dropped = self._sessions.pop(session_id, None)
        if dropped is not None:
            self._bytes -= sum(len(full) for _, full in dropped) * WIDTH


Item = tuple[Op, "asyncio.Future[None] | None", "asyncio.AbstractEventLoop | None"]


class Writer:
    """Owns the write connection: :meth:`apply_now` applies on the caller's
    thread when it can without waiting, :meth:`put` queues for the thread.

    ``checkpoint``: a second connection to the file, for the thread's WAL
    checkpoints; given, the writer is ``inline`` (see the module's text) and
    ``conn`` must not wait for SQLite's write lock (``busy_timeout`` 0)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        delta_window: int,
        delta_budget: int,
        checkpoint: sqlite3.Connection | None = None,
    ) -> None:
        self._conn = conn
        self._checkpoint_conn = checkpoint
        if checkpoint is not None:
            conn.execute("PRAGMA wal_autocheckpoint=0")
        self._queue: queue.SimpleQueue[list[Item] | None] = queue.SimpleQueue()  # None: stop
        # Held by whoever applies a batch (the loop or the thread).
        self._using = threading.Lock()
        # Batches put for the thread and not yet applied (changed under _counting).
        self._counting = threading.Lock()
        self._outstanding = 0
        self._commits = 0
        self._checkpointed = 0
        self._checkpoint_asked = False
        self._bases = DeltaBases(delta_window, delta_budget)
        self._known_blobs: OrderedDict[bytes, None] = OrderedDict()
        # Per (session, body kind): the lists of its last stored request body.
        self._memos: OrderedDict[tuple[str, str], ListMemo] = OrderedDict()
        self._pending_blobs: list[bytes] = []
        self._pending_bases: list[tuple[str, int, TokenRun]] = []
        self._pending_closed: list[str] = []
        # Rows begun in flight, by (session, seq, attempt): their rowid and how
        # their prompt was stored, so finishing one needs no SELECT. Kept from
        # commit until the call's outcome is written (a miss falls back to SELECT).
        self._begun: dict[tuple[str, int, int], tuple[int, int, int]] = {}
        self._pending_begun: list[tuple[tuple[str, int, int], tuple[int, int, int]]] = []
        self._pending_memos: list[tuple[tuple[str, str], ListMemo]] = []
        self._healthy = True
        self._failed_ops = 0
        self._last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="polar-store-writer", daemon=True)
        self._thread.start()

    def put(self, items: list[Item]) -> None:
        """Queue ``items`` (the writes of one event-loop turn: one wake-up of the thread)."""
        if not items:
            return
        with self._counting:
            self._outstanding += 1
        self._queue.put(items)

    def apply_now(self, items: list[Item]) -> bool:
        """Commit ``items`` here, on the calling event loop's thread, and settle
        their futures, if that needs no waiting; else change nothing and return
        False (the caller puts them for the thread).

        A batch that fails is left to the thread too, which retries it one
        operation per transaction, waiting for the lock between them."""
        if self._checkpoint_conn is None or not self._using.acquire(blocking=False):
            return False
        try:
            if self._outstanding:
                return False  # the thread's batches commit first
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error:
                return False  # another connection writes: the thread waits for it
            if self._transaction([op for op, _, _ in items], begun=True) is not None:
                return False  # rolled back: nothing of it was written
        finally:
            self._using.release()
        _settle_all([(future, None) for _, future, _ in items if future is not None])
        if self._commits - self._checkpointed >= CHECKPOINT_COMMITS and not self._checkpoint_asked:
            self._checkpoint_asked = True
            self._queue.put([])  # wakes the thread; an empty batch is no work
        return True

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def state(self) -> WriterState:
        return WriterState(
            alive=self.alive,
            healthy=self._healthy,
            queued=self._queue.qsize(),
            failed_ops=self._failed_ops,
            last_error=self._last_error,
        )

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._conn.close()
        if self._checkpoint_conn is not None:
            self._checkpoint_conn.close()

    # ---------------------------------------------------------------- the thread

    def _run(self) -> None:
        timeout = None if self._checkpoint_conn is None else CHECKPOINT_S
        try:
            while True:
                try:
                    got = self._queue.get(timeout=timeout)
                except queue.Empty:
                    self._checkpoint()
                    continue
                if got is None:
                    return
                items, taken = list(got), 1 if got else 0
                while len(items) < BATCH:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        self._queue.put(None)
                        break
                    items.extend(more)
                    taken += 1 if more else 0
                if not items:  # apply_now asking for a checkpoint
                    self._checkpoint()
                    continue
                with self._using:
                    if timeout is not None:  # here the write lock is waited for
                        self._conn.execute(f"PRAGMA busy_timeout={_BUSY_WAIT_MS}")
                    try:
                        outcomes = self._apply_batch([op for op, _, _ in items])
                    except BaseException as exc:  # a bug here must not end the writer
                        _log.error("record store: a batch failed outright: %s", describe(exc))
                        outcomes = [exc for _ in items]
                    finally:
                        if timeout is not None:
                            self._conn.execute("PRAGMA busy_timeout=0")
                with self._counting:
                    self._outstanding -= taken
                settled: dict[asyncio.AbstractEventLoop, list[Settlement]] = {}
                for (op, future, loop), outcome in zip(items, outcomes, strict=True):
                    if outcome is not None:
                        self._failed_ops += 1
                        _log.error("record store: %s failed: %s", label(op), describe(outcome))
                    if future is not None and loop is not None:
                        settled.setdefault(loop, []).append((future, outcome))
                for loop, settlements in settled.items():
                    _settle_from_thread(loop, settlements)
                if timeout is not None and self._commits - self._checkpointed >= CHECKPOINT_COMMITS:
                    self._checkpoint()
        except BaseException as exc:
            self._last_error = f"the writer stopped: {describe(exc)}"
            _log.critical("record store: %s", self._last_error)
        finally:
            self._healthy = False if self._last_error else self._healthy
            self._fail_queued()

    def _checkpoint(self) -> None:
        """Copy the WAL's committed pages into the database file (the thread's,
        on its own connection: it waits for the disk, writers do not wait for it)."""
        conn, commits = self._checkpoint_conn, self._commits
        self._checkpoint_asked = False
        if conn is None or commits == self._checkpointed:
            return
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:  # the next commits ask again
            _log.warning("record store: a WAL checkpoint failed: %s", describe(exc))
            return
        self._checkpointed = commits

    def _fail_queued(self) -> None:
        """Fail whatever is still queued: nothing will write it any more."""
        error = StoreError("the record store's writer has stopped")
        while True:
            try:
                got = self._queue.get_nowait()
            except queue.Empty:
                return
            for _, future, loop in got or ():
                if future is not None and loop is not None:
                    _settle_from_thread(loop, [(future, error)])

    def _apply_batch(self, ops: list[Op]) -> list[BaseException | None]:
        error = self._transaction(ops)
        if error is None:
            return [None] * len(ops)
        outcomes: list[BaseException | None] = (
            [error] if len(ops) == 1 else [self._transaction([op]) for op in ops]
        )
        for op, outcome in zip(ops, outcomes, strict=True):
            if outcome is not None and isinstance(op, FinishRecord):
                r = op.record
                fallback = MarkFailed(
                    r.session_id,
                    r.seq,
                    r.attempt,
                    f"the call's outcome could not be stored: {describe(outcome)}",
                )
                if self._transaction([fallback]) is not None:
                    _log.error("record store: %s failed too", label(fallback))
        return outcomes

    def _transaction(self, ops: list[Op], *, begun: bool = False) -> BaseException | None:
        """``begun``: the caller has opened it already."""
        conn = self._conn
        self._pending_blobs.clear()
        self._pending_bases.clear()
        self._pending_memos.clear()
        self._pending_closed.clear()
        self._pending_begun.clear()
        try:
            if not begun:
                conn.execute("BEGIN IMMEDIATE")
            for op in ops:
                self._apply(op)
            conn.execute("COMMIT")
        except Exception as exc:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error as rollback:
                exc.add_note(f"rollback failed: {rollback}")
            if _store_level(exc):
                self._healthy = False
                self._last_error = describe(exc)
            return exc
        self._healthy = True
        self._commits += 1
        for key in self._pending_blobs:
            self._known_blobs[key] = None
            self._known_blobs.move_to_end(key)
        while len(self._known_blobs) > 200_000:
            self._known_blobs.popitem(last=False)
        for session_id, rowid, full in self._pending_bases:
            self._bases.add(session_id, rowid, full)
        for memo_key, memo in self._pending_memos:
            self._memos[memo_key] = memo
            self._memos.move_to_end(memo_key)
        while len(self._memos) > 4096:
            self._memos.popitem(last=False)
        if len(self._begun) > _BEGUN_LIMIT:  # outcomes never written (a bug): forget, SELECT
            self._begun.clear()
        self._begun.update(self._pending_begun)
        for session_id in self._pending_closed:
            # A closed session makes no more calls: its delta bases and memos serve nobody.
            self._bases.drop(session_id)
            self._memos.pop((session_id, "original"), None)
            self._memos.pop((session_id, "engine"), None)
        return None

    def _apply(self, op: Op) -> None:
        conn = self._conn
        match op:
            case InsertSession(row=row):
                conn.execute(
                    "INSERT INTO sessions "
                    "(id, key_hash, created_at, closed_at, metadata, sampling) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        row.id,
                        row.key_hash,
                        row.created_at,
                        row.closed_at,
                        dumps(row.metadata),
                        dumps(distribution_to_json(row.sampling)) if row.sampling else None,
                    ),
                )
            case CloseSession(session_id=session_id, closed_at=closed_at):
                conn.execute(
                    "UPDATE sessions SET closed_at = ? WHERE id = ? AND closed_at IS NULL",
                    (closed_at, session_id),
                )
                self._pending_closed.append(session_id)
            case AppendRecord(record=record):
                self._insert_record(record, base=True)
            case BeginRecord(record=record, prompt=prompt):
                self._insert_record(record, base=False, prompt=prompt)
            case FinishRecord(record=record, ids=ids):
                self._finish_record(record, ids)
            case SetMeta(key=key, value=value):
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES (?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (key, value),
                )
            case MarkFailed(session_id=sid, seq=seq, attempt=attempt, message=message):
                error = CallError(kind=ErrorKind.INTERNAL, message=message)
                conn.execute(
                    "UPDATE records SET status = ?, error = ? "
                    "WHERE session_id = ? AND seq = ? AND attempt = ? AND status = ?",
                    (
                        RecordStatus.FAILED.value,
                        dumps(error_json(error)),
                        sid,
                        seq,
                        attempt,
                        RecordStatus.IN_FLIGHT.value,
                    ),
                )
            case _:
                assert_never(op)

    def _insert_blobs(self, session_id: str, blobs: list[tuple[bytes, bytes]]) -> None:
        for key, data in blobs:
            if key in self._known_blobs:
                self._known_blobs.move_to_end(key)
                continue
            self._conn.execute(
                "INSERT OR IGNORE INTO blobs (key, data, session_id) VALUES (?, ?, ?)",
                (key, encode_blob(data), session_id),
            )
            self._pending_blobs.append(key)

    def _insert_record(
        self, record: CompletionRecord, *, base: bool, prompt: bytes | None = None
    ) -> None:
        sid = record.session_id
        if prompt is None:
            prompt = pack(record.prompt_ids)
        original, original_blobs, original_memo = split_body(
            record.original_request, self._memos.get((sid, "original"))
        )
        engine_body, engine_blobs, engine_memo = split_body(
            record.engine_request, self._memos.get((sid, "engine")), prompt
        )
        self._pending_memos += [((sid, "original"), original_memo), ((sid, "engine"), engine_memo)]
        self._insert_blobs(sid, original_blobs + engine_blobs)
        prompt_base, shared = self._bases.best(sid, prompt)
        values = (
            sid,
            record.seq,
            record.attempt,
            record.dialect.value,
            record.capture.value,
            record.engine,
            record.model,
            record.policy_version,
            int(record.stream),
            original,
            engine_body,
            prompt_base,
            shared,
            prompt[shared * 4 :],
            *outcome_values(record),
        )
        cursor = self._conn.execute(_INSERT, values)
        rowid = cursor.lastrowid
        assert rowid is not None
        if not base:
            key = (sid, record.seq, record.attempt)
            self._pending_begun.append((key, (rowid, shared, len(prompt) - shared * WIDTH)))
        if base:
            full = TokenRun.of(prompt).then(pack(record.output_ids))
            self._pending_bases.append((sid, rowid, full))

    def _finish_record(self, record: CompletionRecord, ids: TokenRun | None) -> None:
        key = (record.session_id, record.seq, record.attempt)
        row = (
            self._begun.pop(key, None)
            or self._conn.execute(
                "SELECT rowid, prompt_shared, length(prompt_tail) FROM records "
                "WHERE session_id = ? AND seq = ? AND attempt = ?",
                key,
            ).fetchone()
        )
        n = len(record.prompt_ids)
        if ids is None or len(ids) != n + len(record.output_ids):
            ids = TokenRun.of(pack(record.prompt_ids)).then(pack(record.output_ids))
        if row is None:  # never begun (a store opened afresh): write it whole
            self._insert_record(record, base=True, prompt=ids.packed()[: n * WIDTH])
            return
        rowid, shared, tail_bytes = row
        if shared + tail_bytes // WIDTH != n:
            prompt = ids.packed()[: n * WIDTH]
            # The prompt became known only from the engine (engine-rendered
            # capture): written with the outcome, in the same statement.
            prompt_base, shared = self._bases.best(record.session_id, prompt)
            self._conn.execute(
                _UPDATE_PROMPT_AND_OUTCOME,
                (prompt_base, shared, prompt[shared * 4 :], *outcome_values(record), rowid),
            )
        else:
            self._conn.execute(_UPDATE_OUTCOME, (*outcome_values(record), rowid))
        self._pending_bases.append((record.session_id, rowid, ids))


_IDENTITY_COLUMNS = (
    "session_id",
    "seq",
    "attempt",
    "dialect",
    "capture",
    "engine",
    "model",
    "policy_version",
    "stream",
    "original_request",
    "engine_request",
    "prompt_base",
    "prompt_shared",
    "prompt_tail",
)
_INSERT = (
    f"INSERT INTO records ({', '.join(_IDENTITY_COLUMNS + OUTCOME_COLUMNS)}) "
    f"VALUES ({', '.join('?' * (len(_IDENTITY_COLUMNS) + len(OUTCOME_COLUMNS)))})"
)


_UPDATE_OUTCOME = (
    f"UPDATE records SET {', '.join(f'{column} = ?' for column in OUTCOME_COLUMNS)} WHERE rowid = ?"
)
_UPDATE_PROMPT_AND_OUTCOME = (
    "UPDATE records SET prompt_base = ?, prompt_shared = ?, prompt_tail = ?, "
    f"{', '.join(f'{column} = ?' for column in OUTCOME_COLUMNS)} WHERE rowid = ?"
)
_BEGUN_LIMIT = 1 << 16


def _store_level(error: BaseException) -> bool:
    """Whether a failure is the store's (disk, locks, corruption), not one record's."""
    return isinstance(error, sqlite3.OperationalError) or type(error) in (
        sqlite3.DatabaseError,
        sqlite3.InternalError,
    )


Settlement = tuple["asyncio.Future[None]", BaseException | None]


def _settle_from_thread(loop: asyncio.AbstractEventLoop, settlements: list[Settlement]) -> None:
    """Settle a batch's futures of one loop with one wake-up of that loop."""
    # A closed loop (RuntimeError) means nobody is waiting any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_settle_all, settlements)


def _settle_all(settlements: list[Settlement]) -> None:
    for future, outcome in settlements:
        if future.done():
            continue
        if outcome is None:
            future.set_result(None)
        elif isinstance(outcome, StoreError):
            future.set_exception(outcome)
        else:
            future.set_exception(StoreError(f"record store write failed: {describe(outcome)}"))
