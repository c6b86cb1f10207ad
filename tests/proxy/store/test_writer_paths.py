"""Where the writer commits: on the event loop when nothing waits, on its thread
when something does; in order either way, and the WAL checkpointed off the loop."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from polar.ir import CompletionRecord, RecordStatus
from polar.proxy.store import SessionRow, SqliteStore
from polar.proxy.store.writer import CHECKPOINT_COMMITS
from proxy.store.test_durability import call


def _session(session_id: str) -> SessionRow:
    return SessionRow(
        id=session_id,
        key_hash=session_id * 8,
        created_at=0.0,
        closed_at=None,
        metadata={},
        last_seq=0,
    )


def _rows_in_the_database_file(path: Path) -> int:
    """Records in the main file alone (``immutable``: the WAL is not read), so
    only what a checkpoint has copied there."""
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM records").fetchone()[0])
    except sqlite3.OperationalError:  # no table yet in the main file
        return 0
    finally:
        conn.close()


def test_the_writers_thread_checkpoints_the_wal(tmp_path: Path) -> None:
    """The loop commits with SQLite's automatic checkpoint off; the rows still
    reach the database file, copied by the thread's checkpoints."""
    path = tmp_path / "r.db"
    store = SqliteStore(path)
    store.open()

    async def go() -> None:
        await store.insert_session(_session("s1"))
        for seq in range(1, CHECKPOINT_COMMITS + 11):
            await store.begin(call(seq))  # a commit each

    asyncio.run(go())
    deadline = time.monotonic() + 10
    while _rows_in_the_database_file(path) < CHECKPOINT_COMMITS and time.monotonic() < deadline:
        time.sleep(0.05)
    in_file = _rows_in_the_database_file(path)
    store.close()
    assert in_file >= CHECKPOINT_COMMITS
    assert len(SqliteStore(path).records("s1")) == CHECKPOINT_COMMITS + 10


@pytest.mark.parametrize(("seed", "member"), [(1, False), (2, False), (3, True)])
def test_two_loops_and_an_outside_writer_leave_every_call_in_order(
    tmp_path: Path, seed: int, member: bool
) -> None:
    """Two event loops on two threads write one store while another connection
    takes SQLite's write lock at random moments (seeded), as a gateway group's
    other workers do, so batches go now to the loop, now to the thread, and
    back. Every call's begin and outcome are stored, each session's in order.
    ``member``: the store opened as a group's worker opens it."""
    path = tmp_path / "r.db"
    parent = SqliteStore(path)  # a group's parent: the schema and the lock
    if member:
        parent.open()
    store = SqliteStore(path, write_timeout_s=30.0, member=member)
    store.open()
    rng = random.Random(seed)
    holds = [(rng.uniform(0, 0.01), rng.uniform(0, 0.02)) for _ in range(40)]
    stop = threading.Event()

    def outside() -> None:
        other = sqlite3.connect(path, isolation_level=None, timeout=30)
        try:
            for pause, held in holds:
                if stop.wait(pause):
                    return
                other.execute("BEGIN IMMEDIATE")
                time.sleep(held)
                other.execute("COMMIT")
        finally:
            other.close()

    def calls(session_id: str, n: int) -> None:
        async def go() -> None:
            await store.insert_session(_session(session_id))
            for seq in range(1, n + 1):
                begun = call(seq)
                await store.begin(_in(session_id, begun))
                if seq % 3:  # some outcomes land in the same turn as the next begin
                    await store.finish(_in(session_id, call(seq, RecordStatus.COMPLETED)))
                else:
                    asyncio.get_running_loop().create_task(
                        store.finish(_in(session_id, call(seq, RecordStatus.COMPLETED)))
                    )
            await asyncio.sleep(0.05)

        asyncio.run(go())

    threads = [threading.Thread(target=outside)] + [
        threading.Thread(target=calls, args=(f"s{i}", 150)) for i in (1, 2)
    ]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    stop.set()
    threads[0].join()
    state = store.state()
    store.close()
    parent.close()
    assert state.writing and state.failed_ops == 0, f"seed {seed}: {state}"
    for session_id in ("s1", "s2"):
        records = SqliteStore(path).records(session_id)
        assert [r.seq for r in records] == list(range(1, 151)), f"seed {seed}"
        assert {r.status for r in records} == {RecordStatus.COMPLETED}, f"seed {seed}"


def _in(session_id: str, record: CompletionRecord) -> CompletionRecord:
    return dataclasses.replace(record, session_id=session_id)
