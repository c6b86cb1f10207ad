"""SQLite record store: one writer thread with group commit, WAL readers.

Durability contract: ``await store.append(record)`` returns only after the
transaction holding the record has committed. The gateway awaits it before
sending the last byte of a reply, so an answered call survives a crash of the
gateway process. With ``synchronous="normal"`` (the default; WAL mode) a power
cut or kernel crash can lose the last transactions; ``"full"`` fsyncs every
commit and survives those too, for about 0.6 ms more per call. A caller that
is cancelled while waiting does not cancel the write.

All writes go through one thread (SQLite allows one writer); concurrent calls
are batched into one transaction per wake-up, which keeps the fsync cost per
call small at high concurrency. Reads open their own connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from polar.ir import (
    CallError,
    CaptureMode,
    CompletionRecord,
    Dialect,
    EditKind,
    ErrorKind,
    FinishReason,
    MalformedToolCall,
    RecordStatus,
    RequestEdit,
    Timings,
)
from polar.ir.codec import (
    delivery_flags_from_json,
    delivery_flags_to_json,
    lineage_from_json,
    lineage_to_json,
    message_from_json,
    message_to_json,
    usage_from_json,
    usage_to_json,
)
from polar.proxy.store.packing import (
    ListMemo,
    common_prefix_tokens,
    decode_blob,
    encode_blob,
    join_body,
    pack_floats,
    pack_ids,
    split_body,
    unpack_floats,
    unpack_ids,
)

_log = logging.getLogger(__name__)

SCHEMA_VERSION = 4

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    key_hash TEXT UNIQUE NOT NULL,
    created_at REAL NOT NULL,
    closed_at REAL,
    metadata TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS blobs (
    key BLOB PRIMARY KEY,
    data BLOB NOT NULL,
    session_id TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    rowid INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    seq INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    status TEXT NOT NULL,
    dialect TEXT NOT NULL,
    capture TEXT NOT NULL,
    engine TEXT NOT NULL,
    model TEXT NOT NULL,
    policy_version INTEGER NOT NULL,
    stream INTEGER NOT NULL,
    finish_reason TEXT,
    error TEXT,
    timings TEXT NOT NULL,
    usage TEXT,
    message TEXT,
    original_request BLOB NOT NULL,
    engine_request BLOB NOT NULL,
    prompt_base INTEGER,
    prompt_shared INTEGER NOT NULL,
    prompt_tail BLOB NOT NULL,
    output_ids BLOB NOT NULL,
    output_logprobs BLOB NOT NULL,
    lineage TEXT,
    malformed TEXT,
    edits TEXT,
    delivery TEXT,
    UNIQUE (session_id, seq, attempt)
);
"""

# Statements that bring a store of version N-1 to version N.
_MIGRATIONS = {
    2: (
        "ALTER TABLE records ADD COLUMN lineage TEXT",
        "ALTER TABLE records ADD COLUMN malformed TEXT",
    ),
    3: ("ALTER TABLE records ADD COLUMN edits TEXT",),
    4: ("ALTER TABLE records ADD COLUMN delivery TEXT",),
}

_RECORD_COLUMNS = (
    "rowid, session_id, seq, attempt, status, dialect, capture, engine, model, policy_version, "
    "stream, finish_reason, error, timings, usage, message, original_request, engine_request, "
    "prompt_base, prompt_shared, prompt_tail, output_ids, output_logprobs, "
    "lineage, malformed, edits, delivery"
)


class StoreError(Exception):
    """The record store could not do what was asked (corrupt file, schema mismatch, closed)."""


@dataclass(frozen=True, slots=True)
class SessionRow:
    id: str
    key_hash: str
    created_at: float
    closed_at: float | None
    metadata: dict[str, Any]
    last_seq: int


@dataclass(frozen=True, slots=True)
class StoreStats:
    """What one session costs on disk, against storing every call in full."""

    records: int
    stored_bytes: int
    naive_bytes: int


@dataclass(frozen=True, slots=True)
class _InsertSession:
    row: SessionRow


@dataclass(frozen=True, slots=True)
class _CloseSession:
    session_id: str
    closed_at: float


@dataclass(frozen=True, slots=True)
class _AppendRecord:
    record: CompletionRecord


@dataclass(frozen=True, slots=True)
class _SetPolicyVersion:
    version: int


_Op = _InsertSession | _CloseSession | _AppendRecord | _SetPolicyVersion
_STOP = object()


class _DeltaBases:
    """Recent ``prompt + output`` id strings per session, to encode new prompts as deltas.

    Bounded by a global byte budget; evicting only costs compression (the next
    prompt of an evicted session is stored in full).
    """

    def __init__(self, per_session: int, byte_budget: int) -> None:
        self._per_session = per_session
        self._budget = byte_budget
        self._bytes = 0
        self._sessions: OrderedDict[str, deque[tuple[int, bytes]]] = OrderedDict()

    def best(self, session_id: str, prompt: bytes) -> tuple[int | None, int]:
        entries = self._sessions.get(session_id)
        if not entries:
            return None, 0
        self._sessions.move_to_end(session_id)
        best_row, best_len = None, 0
        for rowid, full in entries:
            shared = common_prefix_tokens(full, prompt)
            if shared > best_len:
                best_row, best_len = rowid, shared
        return best_row, best_len

    def add(self, session_id: str, rowid: int, full: bytes) -> None:
        entries = self._sessions.setdefault(session_id, deque())
        self._sessions.move_to_end(session_id)
        entries.append((rowid, full))
        self._bytes += len(full)
        if len(entries) > self._per_session:
            self._bytes -= len(entries.popleft()[1])
        while self._bytes > self._budget and self._sessions:
            _, dropped = self._sessions.popitem(last=False)
            self._bytes -= sum(len(full) for _, full in dropped)


class SqliteStore:
    """Sessions and completion records in one SQLite file."""

    def __init__(
        self,
        path: Path,
        *,
        synchronous: Literal["full", "normal"] = "normal",
        delta_window: int = 4,
        delta_budget_bytes: int = 256 << 20,
    ) -> None:
        self.path = path
        self._synchronous = synchronous.upper()
        self._bases = _DeltaBases(delta_window, delta_budget_bytes)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._writer: sqlite3.Connection | None = None
        self._known_blobs: OrderedDict[bytes, None] = OrderedDict()
        # Cache updates of the open transaction; applied only once it commits,
        # so a rolled-back write can never leave a reference to rows that are not there.
        self._pending_blobs: list[bytes] = []
        self._pending_bases: list[tuple[str, int, bytes]] = []
        # Per (session, body kind): the lists of its last stored request body.
        self._memos: OrderedDict[tuple[str, str], ListMemo] = OrderedDict()
        self._pending_memos: list[tuple[tuple[str, str], ListMemo]] = []

    # ---------------------------------------------------------------- lifecycle

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = self._connect()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a usable record store ({exc})") from exc
        try:
            conn.executescript(_SCHEMA)
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
                    for statement in _MIGRATIONS[version]:
                        conn.execute(statement)
                conn.execute(
                    "UPDATE meta SET value = ? WHERE key = 'schema_version'",
                    (str(SCHEMA_VERSION),),
                )
            conn.commit()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(f"{self.path}: not a usable record store ({exc})") from exc
        self._writer = conn
        self._thread = threading.Thread(target=self._run, name="polar-store-writer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join()
        self._thread = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

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

    # ---------------------------------------------------------------- writes

    async def insert_session(self, row: SessionRow) -> None:
        await self._submit(_InsertSession(row))

    async def close_session(self, session_id: str, closed_at: float) -> None:
        await self._submit(_CloseSession(session_id, closed_at))

    async def append(self, record: CompletionRecord) -> None:
        """Persist ``record``; returns once it is committed."""
        await self._submit(_AppendRecord(record))

    async def set_policy_version(self, version: int) -> None:
        """Persist the gateway's policy version (read back by :meth:`policy_version`)."""
        await self._submit(_SetPolicyVersion(version))

    def append_nowait(self, record: CompletionRecord) -> None:
        """Queue ``record`` without waiting (for calls whose client is already gone).

        The write still happens; a failure is logged instead of raised.
        """
        if self._thread is None:
            raise StoreError("record store is not open")
        self._queue.put((_AppendRecord(record), None, None))

    async def _submit(self, op: _Op) -> None:
        if self._thread is None:
            raise StoreError("record store is not open")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        # Once queued, the write happens even if this caller is cancelled.
        self._queue.put((op, future, loop))
        await future

    def _run(self) -> None:
        assert self._writer is not None
        conn = self._writer
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            batch = [item]
            while len(batch) < 512:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    self._queue.put(_STOP)
                    break
                batch.append(nxt)
            outcomes = self._apply_batch(conn, [op for op, _, _ in batch])
            for (op, future, loop), outcome in zip(batch, outcomes, strict=True):
                if future is not None:
                    loop.call_soon_threadsafe(_settle, future, outcome)
                elif outcome is not None:
                    _log.error("record store: queued write %r failed: %s", op, outcome)

    def _transaction(self, conn: sqlite3.Connection, ops: list[_Op]) -> BaseException | None:
        self._pending_blobs.clear()
        self._pending_bases.clear()
        self._pending_memos.clear()
        try:
            conn.execute("BEGIN IMMEDIATE")
            for op in ops:
                self._apply(conn, op)
            conn.execute("COMMIT")
        except Exception as exc:
            conn.execute("ROLLBACK")
            return exc
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
        return None

    def _apply_batch(self, conn: sqlite3.Connection, ops: list[_Op]) -> list[BaseException | None]:
        error = self._transaction(conn, ops)
        if error is None:
            return [None] * len(ops)
        if len(ops) == 1:
            return [error]
        # Isolate the failing operation: retry each in its own transaction.
        return [self._transaction(conn, [op]) for op in ops]

    def _apply(self, conn: sqlite3.Connection, op: _Op) -> None:
        match op:
            case _InsertSession(row=row):
                conn.execute(
                    "INSERT INTO sessions (id, key_hash, created_at, closed_at, metadata) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (row.id, row.key_hash, row.created_at, row.closed_at, _dumps(row.metadata)),
                )
            case _CloseSession(session_id=session_id, closed_at=closed_at):
                conn.execute(
                    "UPDATE sessions SET closed_at = ? WHERE id = ? AND closed_at IS NULL",
                    (closed_at, session_id),
                )
            case _AppendRecord(record=record):
                self._insert_record(conn, record)
            case _SetPolicyVersion(version=version):
                conn.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('policy_version', ?)",
                    (str(version),),
                )

    def _insert_blobs(
        self, conn: sqlite3.Connection, session_id: str, blobs: list[tuple[bytes, bytes]]
    ) -> None:
        for key, data in blobs:
            if key in self._known_blobs:
                self._known_blobs.move_to_end(key)
                continue
            conn.execute(
                "INSERT OR IGNORE INTO blobs (key, data, session_id) VALUES (?, ?, ?)",
                (key, encode_blob(data), session_id),
            )
            self._pending_blobs.append(key)

    def _insert_record(self, conn: sqlite3.Connection, record: CompletionRecord) -> None:
        sid = record.session_id
        original, original_blobs, original_memo = split_body(
            record.original_request, self._memos.get((sid, "original"))
        )
        engine_body, engine_blobs, engine_memo = split_body(
            record.engine_request, self._memos.get((sid, "engine")), record.prompt_ids
        )
        self._pending_memos += [((sid, "original"), original_memo), ((sid, "engine"), engine_memo)]
        self._insert_blobs(conn, sid, original_blobs + engine_blobs)
        prompt = pack_ids(record.prompt_ids)
        output = pack_ids(record.output_ids)
        base, shared = self._bases.best(record.session_id, prompt)
        cursor = conn.execute(
            f"INSERT INTO records ({_RECORD_COLUMNS}) VALUES "
            "(NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.session_id,
                record.seq,
                record.attempt,
                record.status.value,
                record.dialect.value,
                record.capture.value,
                record.engine,
                record.model,
                record.policy_version,
                int(record.stream),
                record.finish_reason.value if record.finish_reason else None,
                _dumps(_error_json(record.error)) if record.error else None,
                _dumps(_timings_json(record.timings)),
                _dumps(usage_to_json(record.usage)) if record.usage else None,
                _dumps(message_to_json(record.message)) if record.message else None,
                original,
                engine_body,
                base,
                shared,
                prompt[shared * 4 :],
                output,
                pack_floats(record.output_logprobs),
                _dumps(lineage_to_json(record.lineage)) if record.lineage else None,
                (
                    _dumps(
                        [{"raw": m.raw, "reason": m.reason} for m in record.malformed_tool_calls]
                    )
                    if record.malformed_tool_calls
                    else None
                ),
                (
                    _dumps([{"kind": e.kind.value, "detail": e.detail} for e in record.edits])
                    if record.edits
                    else None
                ),
                (
                    _dumps(delivery_flags_to_json(record.delivery_flags))
                    if record.delivery_flags
                    else None
                ),
            ),
        )
        rowid = cursor.lastrowid
        assert rowid is not None
        self._pending_bases.append((record.session_id, rowid, prompt + output))

    # ---------------------------------------------------------------- reads

    def policy_version(self) -> int:
        """The last persisted policy version; a store from before versions were
        persisted: the newest one on a record; an empty store: 0."""
        with self._reader() as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'policy_version'").fetchone()
            if row is not None:
                return int(row[0])
            newest = conn.execute("SELECT MAX(policy_version) FROM records").fetchone()
        return int(newest[0]) if newest and newest[0] is not None else 0

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
                "COALESCE((SELECT MAX(seq) FROM records r WHERE r.session_id = s.id), 0) "
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
            )
            for r in rows
        ]

    def records(self, session_id: str) -> list[CompletionRecord]:
        """All records of a session in ``(seq, attempt)`` order, prompts reconstructed."""
        with self._reader() as conn:
            rows = conn.execute(
                f"SELECT {_RECORD_COLUMNS} FROM records WHERE session_id = ? ORDER BY seq, attempt",
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
                out.append(_record_from_row(row, prompt, load_blob))
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
            len(_dumps(r.original_request))
            + len(_dumps(r.engine_request))
            + 4 * (len(r.prompt_ids) + len(r.output_ids))
            + 8 * len(r.output_logprobs)
            for r in records
        )
        return StoreStats(
            records=int(record_bytes[0]),
            stored_bytes=int(record_bytes[1]) + int(blob_bytes),
            naive_bytes=naive,
        )


def _settle(future: asyncio.Future[None], outcome: BaseException | None) -> None:
    if future.done():
        return
    if outcome is None:
        future.set_result(None)
    else:
        future.set_exception(StoreError(f"record store write failed: {outcome}"))


def _prompt(base: int | None, shared: int, tail: bytes, full_of: Callable[[int], bytes]) -> bytes:
    if base is None:
        return bytes(tail)
    return full_of(base)[: shared * 4] + tail


def _dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def _timings_json(t: Timings) -> dict[str, float | None]:
    return {
        "arrived": t.arrived,
        "engine_started": t.engine_started,
        "first_token": t.first_token,
        "finished": t.finished,
    }


def _error_json(e: CallError) -> dict[str, Any]:
    return {"kind": e.kind.value, "message": e.message, "status": e.status}


def _record_from_row(
    row: tuple[Any, ...], prompt: bytes, load_blob: Callable[[bytes], bytes]
) -> CompletionRecord:
    timings = orjson.loads(row[13])
    error = orjson.loads(row[12]) if row[12] else None
    prompt_ids = unpack_ids(prompt)
    return CompletionRecord(
        session_id=row[1],
        seq=row[2],
        attempt=row[3],
        status=RecordStatus(row[4]),
        dialect=Dialect(row[5]),
        capture=CaptureMode(row[6]),
        engine=row[7],
        model=row[8],
        policy_version=row[9],
        stream=bool(row[10]),
        finish_reason=FinishReason(row[11]) if row[11] else None,
        error=(
            CallError(
                kind=ErrorKind(error["kind"]), message=error["message"], status=error["status"]
            )
            if error
            else None
        ),
        timings=Timings(**timings),
        usage=usage_from_json(orjson.loads(row[14])) if row[14] else None,
        message=message_from_json(orjson.loads(row[15])) if row[15] else None,
        original_request=join_body(row[16], load_blob),
        engine_request=join_body(row[17], load_blob, prompt_ids),
        prompt_ids=prompt_ids,
        output_ids=unpack_ids(row[21]),
        output_logprobs=unpack_floats(row[22]),
        lineage=lineage_from_json(orjson.loads(row[23])) if row[23] else None,
        malformed_tool_calls=tuple(
            MalformedToolCall(raw=m["raw"], reason=m["reason"])
            for m in (orjson.loads(row[24]) if row[24] else ())
        ),
        edits=tuple(
            RequestEdit(kind=EditKind(e["kind"]), detail=e["detail"])
            for e in (orjson.loads(row[25]) if row[25] else ())
        ),
        delivery_flags=delivery_flags_from_json(orjson.loads(row[26]) if row[26] else ()),
    )
