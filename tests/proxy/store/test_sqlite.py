"""The SQLite record store: round trips, delta-encoded prompts, bounded growth."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from polar.ir import (
    CallError,
    CaptureMode,
    CompletionRecord,
    Dialect,
    ErrorKind,
    FinishReason,
    Message,
    ReasoningPart,
    RecordStatus,
    Role,
    TextPart,
    Timings,
    ToolCall,
    Usage,
)
from polar.proxy.store import SessionRow, SqliteStore
from polar.proxy.store.sqlite import StoreError


def _record(
    seq: int, prompt: list[int], output: list[int], messages: list[dict]
) -> CompletionRecord:
    return CompletionRecord(
        session_id="s1",
        seq=seq,
        attempt=1,
        status=RecordStatus.COMPLETED,
        dialect=Dialect.OPENAI_CHAT,
        capture=CaptureMode.ENGINE_RENDERED,
        engine="vllm",
        model="tiny",
        policy_version=3,
        stream=True,
        original_request={"model": "m", "messages": messages, "stream": True},
        engine_request={"model": "tiny", "messages": messages, "return_token_ids": True},
        timings=Timings(arrived=1.0, engine_started=1.5, first_token=2.0, finished=3.0),
        prompt_ids=tuple(prompt),
        output_ids=tuple(output),
        output_logprobs=tuple(-0.1 * (i + 1) for i in range(len(output))),
        finish_reason=FinishReason.TOOL_CALLS,
        message=Message(
            role=Role.ASSISTANT,
            parts=(ReasoningPart("r"), TextPart("t"), ToolCall("c1", "bash", '{"a": 1}')),
        ),
        usage=Usage(prompt_tokens=len(prompt), completion_tokens=len(output), cached_tokens=0),
    )


def _session(store: SqliteStore, sid: str = "s1") -> None:
    asyncio.run(
        store.insert_session(
            SessionRow(
                id=sid, key_hash=sid * 4, created_at=0.0, closed_at=None, metadata={}, last_seq=0
            )
        )
    )


def _conversation(turns: int, tokens_per_turn: int = 200) -> list[CompletionRecord]:
    prompt: list[int] = list(range(1000, 1000 + tokens_per_turn))
    messages: list[dict] = [{"role": "system", "content": "s" * 2000}]
    out = []
    for seq in range(1, turns + 1):
        messages = [*messages, {"role": "user", "content": f"turn {seq} " + "u" * 300}]
        output = [seq * 7 + i for i in range(40)]
        out.append(_record(seq, list(prompt), output, list(messages)))
        prompt = prompt + output + [5000 + seq * 3 + i for i in range(tokens_per_turn)]
        messages = [*messages, {"role": "assistant", "content": f"answer {seq}"}]
    return out


def _write(store: SqliteStore, records: list[CompletionRecord]) -> None:
    async def go() -> None:
        for record in records:
            await store.append(record)

    asyncio.run(go())


def test_records_round_trip_field_for_field(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "r.db")
    store.open()
    _session(store)
    records = _conversation(5)
    failed = CompletionRecord(
        **{
            **{f: getattr(records[0], f) for f in records[0].__dataclass_fields__},
            "seq": 6,
            "status": RecordStatus.FAILED,
            "finish_reason": None,
            "error": CallError(ErrorKind.ENGINE_HTTP, "boom", 502),
        }
    )
    _write(store, [*records, failed])
    store.close()
    assert SqliteStore(tmp_path / "r.db").records("s1") == [*records, failed]


def test_storage_grows_linearly_with_session_length(tmp_path: Path) -> None:
    sizes = {}
    for turns in (16, 32, 64):
        store = SqliteStore(tmp_path / f"{turns}.db")
        store.open()
        _session(store)
        _write(store, _conversation(turns))
        store.close()
        sizes[turns] = SqliteStore(tmp_path / f"{turns}.db").stats("s1")
    # Naive storage is quadratic; what is stored tracks what is new in each call.
    assert sizes[64].naive_bytes / sizes[32].naive_bytes > 3.5
    assert sizes[64].stored_bytes / sizes[32].stored_bytes < 2.3
    assert sizes[64].stored_bytes * 10 < sizes[64].naive_bytes


def test_a_failed_write_fails_its_caller_only(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "r.db")
    store.open()
    _session(store)
    good = _conversation(1)[0]

    async def go() -> list[BaseException | None]:
        orphan = CompletionRecord(
            **{**{f: getattr(good, f) for f in good.__dataclass_fields__}, "session_id": "nobody"}
        )
        results = await asyncio.gather(
            store.append(good), store.append(orphan), return_exceptions=True
        )
        return list(results)

    results = asyncio.run(go())
    store.close()
    assert results[0] is None
    assert isinstance(results[1], StoreError)
    assert len(SqliteStore(tmp_path / "r.db").records("s1")) == 1


def test_reading_something_that_is_not_a_store_fails_clearly(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.db"
    bogus.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a usable record store"):
        SqliteStore(bogus).open()
    with pytest.raises(StoreError, match="no record store here"):
        SqliteStore(tmp_path / "missing.db").records("s1")


def test_finishing_begun_calls_updates_each_its_own_row(tmp_path: Path) -> None:
    """The writer remembers where each begun row is, so finishing needs no lookup;
    whatever order calls finish in, across sessions, after a failed begin, in the
    same transaction as their begin (not remembered yet) or never begun, each
    outcome lands on its own row."""
    store = SqliteStore(tmp_path / "r.db")
    store.open()
    _session(store, "s1")
    _session(store, "s2")

    def call(sid: str, seq: int, prompt: list[int], output: list[int]) -> CompletionRecord:
        base = _record(seq, prompt, output, [{"role": "user", "content": f"{sid} {seq}"}])
        fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
        return CompletionRecord(**{**fields, "session_id": sid})

    def in_flight(record: CompletionRecord) -> CompletionRecord:
        fields = {f: getattr(record, f) for f in record.__dataclass_fields__}
        return CompletionRecord(
            **{**fields, "status": RecordStatus.IN_FLIGHT, "output_ids": (), "output_logprobs": ()}
        )

    done = [
        call("s1", 1, [1, 2, 3], [10, 11]),
        call("s2", 1, [1, 2, 3], [20]),
        call("s1", 2, [1, 2, 3, 10, 11, 4], [12, 13, 14]),
        call("s2", 2, [1, 2, 3, 20, 5], [21, 22]),
    ]
    orphan = call("nobody", 1, [9], [9])

    async def begin_and_finish() -> list[BaseException | None]:
        begun = await asyncio.gather(
            *(store.begin(in_flight(r)) for r in [*done[:3], orphan]), return_exceptions=True
        )
        await asyncio.gather(*(store.finish(r) for r in (done[2], done[0])))
        # One event-loop turn is one transaction: this row is found by looking it up.
        await asyncio.gather(store.begin(in_flight(done[3])), store.finish(done[3]))
        return list(begun)

    begun = asyncio.run(begin_and_finish())
    assert begun[:3] == [None, None, None] and isinstance(begun[3], StoreError)
    store.close()
    store = SqliteStore(tmp_path / "r.db")  # a restart: s2's call 1 is still in flight
    store.open()
    never = call("s1", 3, [7], [8])
    asyncio.run(store.finish(never))  # never begun: written whole
    store.close()
    reopened = SqliteStore(tmp_path / "r.db")
    by_key = {(r.session_id, r.seq): r for s in ("s1", "s2") for r in reopened.records(s)}
    assert by_key[("s2", 1)].status is RecordStatus.INTERRUPTED  # the restart marked it
    for record in (done[0], done[2], done[3], never):
        stored = by_key[(record.session_id, record.seq)]
        assert stored.status is RecordStatus.COMPLETED, record.session_id
        assert stored.prompt_ids == record.prompt_ids
        assert stored.output_ids == record.output_ids
        assert stored.output_logprobs == record.output_logprobs
