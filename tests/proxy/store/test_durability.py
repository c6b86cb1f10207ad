"""What survives: bad records, a full disk, and ``kill -9`` in the middle of calls."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from polar.ir import (
    CaptureMode,
    CompletionRecord,
    Dialect,
    ErrorKind,
    FinishReason,
    RecordStatus,
    Timings,
)
from polar.proxy.store import SessionRow, SqliteStore, StoreError

SESSION = SessionRow(
    id="s1", key_hash="k" * 8, created_at=0.0, closed_at=None, metadata={}, last_seq=0
)


def call(seq: int, status: RecordStatus = RecordStatus.IN_FLIGHT) -> CompletionRecord:
    done = status is not RecordStatus.IN_FLIGHT
    return CompletionRecord(
        session_id="s1",
        seq=seq,
        attempt=1,
        status=status,
        dialect=Dialect.OPENAI_CHAT,
        capture=CaptureMode.TOKEN_IN_TOKEN_OUT,
        engine="vllm",
        model="m",
        policy_version=2,
        stream=True,
        original_request={"messages": [{"role": "user", "content": f"call {seq}"}]},
        engine_request={"prompt": [1, 2, 3, seq]},
        timings=Timings(arrived=1.0, engine_started=1.5),
        prompt_ids=(1, 2, 3, seq),
        output_ids=(7, 8) if done else (),
        output_logprobs=(-0.5, -0.25) if done else (),
        finish_reason=FinishReason.STOP if done else None,
    )


def opened(path: Path) -> SqliteStore:
    store = SqliteStore(path, write_timeout_s=5.0)
    store.open()
    return store


def test_a_record_that_cannot_be_stored_fails_alone_and_the_writer_lives(tmp_path: Path) -> None:
    store = opened(tmp_path / "r.db")

    async def go() -> list[BaseException | None]:
        await store.insert_session(SESSION)
        # An integer wider than 64 bits: JSON can carry it, SQLite and orjson cannot.
        bad = dataclasses.replace(call(2), original_request={"n": 2**70, "deep": [[[[]]]]})
        results = await asyncio.gather(
            store.begin(call(1)), store.begin(bad), store.begin(call(3)), return_exceptions=True
        )
        await store.begin(call(4))  # the writer still writes
        return list(results)

    results = asyncio.run(go())
    state = store.state()
    store.close()
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], StoreError)
    assert state.writing and state.failed_ops == 1
    assert [r.seq for r in SqliteStore(tmp_path / "r.db").records("s1")] == [1, 3, 4]


def test_a_full_disk_is_reported_fails_fast_and_recovers(tmp_path: Path) -> None:
    """The disk is filled by capping the file's pages (SQLite's ``max_page_count``):
    the writer gets SQLite's own ``database or disk is full`` error."""
    store = opened(tmp_path / "r.db")
    conn = store._writer._conn  # type: ignore[union-attr]

    async def go() -> None:
        await store.insert_session(SESSION)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        big = dataclasses.replace(call(1), original_request={"text": os.urandom(100_000).hex()})
        with pytest.raises(StoreError, match="full"):
            await store.begin(big)
        state = store.state()
        assert not state.writing and state.last_error and "full" in state.last_error
        conn.execute("PRAGMA max_page_count = 1073741823")
        await store.begin(big)
        assert store.state().writing

    asyncio.run(go())
    store.close()


def test_calls_left_in_flight_become_interrupted_and_the_version_is_kept(tmp_path: Path) -> None:
    store = opened(tmp_path / "r.db")

    async def go() -> None:
        await store.insert_session(SESSION)
        await store.set_policy_version(9)
        for seq in (1, 2, 3):
            await store.begin(call(seq))
        await store.finish(call(2, RecordStatus.COMPLETED))

    asyncio.run(go())
    store.close()  # closing does not finish anything: 1 and 3 stay in flight
    again = opened(tmp_path / "r.db")
    assert again.state().interrupted_at_open == 2
    assert again.policy_version() == 9
    again.close()
    records = SqliteStore(tmp_path / "r.db").records("s1")
    assert [r.status for r in records] == [
        RecordStatus.INTERRUPTED,
        RecordStatus.COMPLETED,
        RecordStatus.INTERRUPTED,
    ]
    assert records[0].error is not None and records[0].error.kind is ErrorKind.GATEWAY_STOPPED
    assert records[0].prompt_ids == (1, 2, 3, 1), "the prompt sent is kept"
    assert records[1].output_ids == (7, 8)


def test_a_second_writer_is_refused(tmp_path: Path) -> None:
    store = opened(tmp_path / "r.db")
    with pytest.raises(StoreError, match="another gateway process"):
        SqliteStore(tmp_path / "r.db").open()
    store.close()


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from proxy.store.test_durability import SESSION, call
    from polar.ir import RecordStatus
    from polar.proxy.store import SqliteStore

    async def main():
        store = SqliteStore(Path({path!r}))
        store.open()
        await store.insert_session(SESSION)
        for seq in range(1, 41):
            await store.begin(call(seq))
            if seq % 2 == 0:
                await store.finish(call(seq, RecordStatus.COMPLETED))
        print("ready", flush=True)
        # Keep writing until killed: calls begun, some finished.
        seq = 40
        while True:
            seq += 1
            await store.begin(call(seq))
            print(seq, flush=True)
            await store.finish(call(seq, RecordStatus.COMPLETED))

    asyncio.run(main())
    """
)


def test_kill_9_leaves_every_begun_call_in_the_store(tmp_path: Path) -> None:
    """A real process is killed with SIGKILL while it writes; the store it leaves
    holds every call whose dispatch row was acknowledged, none corrupt."""
    path = tmp_path / "r.db"
    tests = str(Path(__file__).resolve().parents[2])
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(tests=tests, path=str(path))],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    acknowledged = 40
    for _ in range(30):
        acknowledged = int(child.stdout.readline())
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()
    store = opened(path)
    store.close()
    records = SqliteStore(path).records("s1")
    seqs = [r.seq for r in records]
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(seqs) >= acknowledged
    for r in records:
        if r.seq <= 40:
            expected = RecordStatus.COMPLETED if r.seq % 2 == 0 else RecordStatus.INTERRUPTED
            assert r.status is expected
        assert r.status in (RecordStatus.COMPLETED, RecordStatus.INTERRUPTED)
        assert r.prompt_ids == (1, 2, 3, r.seq)
    with sqlite_check(path) as result:
        assert result == "ok"


class sqlite_check:
    def __init__(self, path: Path) -> None:
        import sqlite3

        self._conn = sqlite3.connect(path)

    def __enter__(self) -> str:
        return str(self._conn.execute("PRAGMA integrity_check").fetchone()[0])

    def __exit__(self, *exc: object) -> None:
        self._conn.close()


def test_a_stalled_writer_times_out_its_callers_and_a_cancelled_wait_still_writes(
    tmp_path: Path,
) -> None:
    """The writer stalls on the real thing: another connection holds SQLite's
    write lock. The event loop does not wait for it (its writes go to the
    writer's thread, which does); callers time out, and a cancelled caller's
    write still commits, in order, once the lock is free."""
    import sqlite3

    store = SqliteStore(tmp_path / "r.db", write_timeout_s=0.3)
    store.open()
    other = sqlite3.connect(tmp_path / "r.db", isolation_level=None)

    async def go() -> tuple[BaseException | None, BaseException | None, float]:
        await store.insert_session(SESSION)
        other.execute("BEGIN IMMEDIATE")
        waiting = asyncio.create_task(store.begin(call(1)))
        started = asyncio.get_running_loop().time()
        await asyncio.sleep(0.05)
        loop_waited = asyncio.get_running_loop().time() - started
        waiting.cancel()  # its caller stops waiting; the write stays queued
        cancelled = await asyncio.gather(waiting, return_exceptions=True)
        timed_out = await asyncio.gather(store.begin(call(2)), return_exceptions=True)
        other.execute("ROLLBACK")
        await store.begin(call(3))  # committed after 1 and 2: the writer is in order
        return timed_out[0], cancelled[0], loop_waited

    timed_out, cancelled, loop_waited = asyncio.run(go())
    other.close()
    assert loop_waited < 1.0, "the event loop never waits for the write lock"
    assert isinstance(timed_out, StoreError)
    assert "did not commit within 0.3 s" in str(timed_out)
    assert isinstance(cancelled, asyncio.CancelledError)
    store.close()
    assert [r.seq for r in SqliteStore(tmp_path / "r.db").records("s1")] == [1, 2, 3]
