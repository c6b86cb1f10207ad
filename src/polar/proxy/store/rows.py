"""The record store's schema and the mapping between records and rows.

A record's prompt is stored as a delta on an earlier row (``prompt_base``,
``prompt_shared``, ``prompt_tail``) and its request bodies as skeletons over
content-addressed blobs (:mod:`polar.proxy.store.packing`); this module only
turns the remaining fields into column values and back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
    behaviour_from_json,
    behaviour_to_json,
    delivery_flags_from_json,
    delivery_flags_to_json,
    lineage_from_json,
    lineage_to_json,
    message_from_json,
    message_to_json,
    usage_from_json,
    usage_to_json,
)
from polar.ir.tokenids import pack, pack_floats, unpack, unpack_floats
from polar.proxy.store.packing import join_body

SCHEMA_VERSION = 6

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    key_hash TEXT UNIQUE NOT NULL,
    created_at REAL NOT NULL,
    closed_at REAL,
    metadata TEXT NOT NULL,
    sampling TEXT
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
    behaviour TEXT,
    UNIQUE (session_id, seq, attempt)
);
CREATE INDEX IF NOT EXISTS records_in_flight ON records(status) WHERE status = 'in_flight';
"""

# Statements that bring a store of version N-1 to version N.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: (
        "ALTER TABLE records ADD COLUMN lineage TEXT",
        "ALTER TABLE records ADD COLUMN malformed TEXT",
    ),
    3: ("ALTER TABLE records ADD COLUMN edits TEXT",),
    4: ("ALTER TABLE records ADD COLUMN delivery TEXT",),
    # 5: statuses in_flight / interrupted, and the partial index over in-flight rows
    # (created by SCHEMA); older readers would not know the statuses.
    5: (),
    6: (
        "ALTER TABLE records ADD COLUMN behaviour TEXT",
        "ALTER TABLE sessions ADD COLUMN sampling TEXT",
    ),
}

RECORD_COLUMNS = (
    "rowid, session_id, seq, attempt, status, dialect, capture, engine, model, policy_version, "
    "stream, finish_reason, error, timings, usage, message, original_request, engine_request, "
    "prompt_base, prompt_shared, prompt_tail, output_ids, output_logprobs, "
    "lineage, malformed, edits, delivery, behaviour"
)

# Columns a finished call changes on the row written when it was dispatched.
OUTCOME_COLUMNS = (
    "status",
    "finish_reason",
    "error",
    "timings",
    "usage",
    "message",
    "output_ids",
    "output_logprobs",
    "lineage",
    "malformed",
    "edits",
    "delivery",
    "behaviour",
)


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def error_json(e: CallError) -> dict[str, Any]:
    return {"kind": e.kind.value, "message": e.message, "status": e.status}


def timings_json(t: Timings) -> dict[str, float | None]:
    return {
        "arrived": t.arrived,
        "engine_started": t.engine_started,
        "first_token": t.first_token,
        "finished": t.finished,
    }


def outcome_values(record: CompletionRecord) -> tuple[Any, ...]:
    """Values of :data:`OUTCOME_COLUMNS` for ``record``, in that order."""
    return (
        record.status.value,
        record.finish_reason.value if record.finish_reason else None,
        dumps(error_json(record.error)) if record.error else None,
        dumps(timings_json(record.timings)),
        dumps(usage_to_json(record.usage)) if record.usage else None,
        dumps(message_to_json(record.message)) if record.message else None,
        pack(record.output_ids),
        pack_floats(record.output_logprobs),
        dumps(lineage_to_json(record.lineage)) if record.lineage else None,
        (
            dumps([{"raw": m.raw, "reason": m.reason} for m in record.malformed_tool_calls])
            if record.malformed_tool_calls
            else None
        ),
        (
            dumps([{"kind": e.kind.value, "detail": e.detail} for e in record.edits])
            if record.edits
            else None
        ),
        (dumps(delivery_flags_to_json(record.delivery_flags)) if record.delivery_flags else None),
        dumps(behaviour_to_json(record.behaviour)) if record.behaviour else None,
    )


def record_from_row(
    row: tuple[Any, ...], prompt: bytes, load_blob: Callable[[bytes], bytes]
) -> CompletionRecord:
    timings = orjson.loads(row[13])
    error = orjson.loads(row[12]) if row[12] else None
    prompt_ids = unpack(prompt)
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
        output_ids=unpack(row[21]),
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
        behaviour=behaviour_from_json(orjson.loads(row[27])) if row[27] else None,
    )
