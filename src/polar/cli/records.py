"""``polar records``: print a session's completion records from a record store."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import orjson
import typer

from polar.cli.errors import fail
from polar.ir.codec import record_to_json
from polar.proxy.store import SqliteStore
from polar.proxy.store.sqlite import StoreError


class RecordFormat(StrEnum):
    JSONL = "jsonl"
    JSON = "json"
    SUMMARY = "summary"


def records(
    session: Annotated[str, typer.Argument(help="Session id.")],
    store: Annotated[Path, typer.Option(help="SQLite record store the gateway wrote.")] = Path(
        "runs/gateway/records.db"
    ),
    format: Annotated[
        RecordFormat,
        typer.Option("--format", "-f", help="jsonl (one record per line), json, or summary."),
    ] = RecordFormat.JSONL,
) -> None:
    """Print every record of SESSION (failed and aborted calls included), oldest first."""
    db = SqliteStore(store)
    try:
        if db.session(session) is None:
            fail("records", f"no session {session!r} in {store}", code=1)
        rows = db.records(session)
    except StoreError as exc:
        fail("records", str(exc), code=1)
    out = sys.stdout.buffer
    match format:
        case RecordFormat.JSONL:
            for record in rows:
                out.write(orjson.dumps(record_to_json(record)) + b"\n")
        case RecordFormat.JSON:
            out.write(orjson.dumps([record_to_json(r) for r in rows], option=orjson.OPT_INDENT_2))
            out.write(b"\n")
        case RecordFormat.SUMMARY:
            for r in rows:
                line = (
                    f"{r.seq:>4}.{r.attempt} {r.status.value:<9} "
                    f"{(r.finish_reason.value if r.finish_reason else '-'):<10} "
                    f"prompt={len(r.prompt_ids):<6} output={len(r.output_ids):<5} "
                    f"policy={r.policy_version}"
                )
                if r.error:
                    line += f" error={r.error.kind.value}: {r.error.message}"
                # What the call produced, as far as it got (an aborted call's too).
                said = r.message.preview() if r.message is not None else ""
                if said:
                    line += f"\n       {said}"
                out.write(line.encode() + b"\n")
    out.flush()
