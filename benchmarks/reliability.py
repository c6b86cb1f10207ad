"""Record store durability and cost: kill -9 rounds, and the price of dispatch-time rows.

    .venv/bin/python benchmarks/reliability.py store [--calls 2000] [--concurrency 1,32,256]
    .venv/bin/python benchmarks/reliability.py crash [--rounds 5] [--sessions 32] [--seed 1]

``store``: the same calls written two ways, side by side in one run: one
``append`` per call (the old way: a call left no trace until it finished)
against ``begin`` before the engine + ``finish`` after (every call that reached
the engine is on disk). Reports wall time per call and the ratio, per number of
concurrent callers (group commit shares a transaction between them).

``crash``: a child process runs ``--sessions`` concurrent sessions against a
store, each call written at dispatch and finished a few ms later, printing
every acknowledged dispatch and finish; the parent ``kill -9``s it at a random
moment (seeded) and reopens the store. Each round checks: every acknowledged
finish is ``completed``; every acknowledged dispatch is in the store
(``completed`` or ``interrupted``); no other status; ``PRAGMA integrity_check``
is ok. This is the store's half of the issue's crash test; the gateway-process
half (HTTP clients, engine) is not in this benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from polar.ir import CaptureMode, CompletionRecord, Dialect, FinishReason, RecordStatus, Timings
from polar.proxy.store import SessionRow, SqliteStore


def record(session: str, seq: int, status: RecordStatus) -> CompletionRecord:
    done = status is not RecordStatus.IN_FLIGHT
    # A coding agent's call: ~1-2k prompt tokens, 50 sampled (bounded, so a long
    # run measures the writes, not ever-growing rows).
    prompt = tuple(range(1000, 1000 + 1000 + (seq % 20) * 50))
    return CompletionRecord(
        session_id=session,
        seq=seq,
        attempt=1,
        status=status,
        dialect=Dialect.OPENAI_CHAT,
        capture=CaptureMode.TOKEN_IN_TOKEN_OUT,
        engine="vllm",
        model="m",
        policy_version=1,
        stream=True,
        original_request={
            "messages": [
                {"role": "user", "content": f"turn {i} of {session}"} for i in range(seq % 20)
            ]
        },
        engine_request={"prompt": list(prompt)},
        timings=Timings(arrived=1.0, engine_started=1.0),
        prompt_ids=prompt,
        output_ids=tuple(range(50)) if done else (),
        output_logprobs=tuple(-0.1 for _ in range(50)) if done else (),
        finish_reason=FinishReason.STOP if done else None,
    )


def session_row(sid: str) -> SessionRow:
    return SessionRow(
        id=sid, key_hash=f"hash-{sid}", created_at=0.0, closed_at=None, metadata={}, last_seq=0
    )


# ---------------------------------------------------------------- store cost


async def _write_calls(store: SqliteStore, calls: int, concurrency: int, dispatch: bool) -> float:
    sessions = [f"s{i}" for i in range(concurrency)]
    for sid in sessions:
        await store.insert_session(session_row(sid))

    async def session(sid: str, count: int) -> None:
        for seq in range(1, count + 1):
            if dispatch:
                await store.begin(record(sid, seq, RecordStatus.IN_FLIGHT))
                await store.finish(record(sid, seq, RecordStatus.COMPLETED))
            else:
                await store.append(record(sid, seq, RecordStatus.COMPLETED))

    per = max(1, calls // concurrency)
    started = time.perf_counter()
    await asyncio.gather(*(session(sid, per) for sid in sessions))
    return (time.perf_counter() - started) / (per * concurrency)


def store_cost(calls: int, levels: list[int]) -> None:
    print(f"{'concurrent':>10} {'append ms/call':>15} {'begin+finish ms/call':>21} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for concurrency in levels:
            results = {}
            for dispatch in (False, True):
                store = SqliteStore(Path(tmp) / f"{concurrency}-{dispatch}.db")
                store.open()
                results[dispatch] = asyncio.run(_write_calls(store, calls, concurrency, dispatch))
                store.close()
            print(
                f"{concurrency:>10} {results[False] * 1e3:>15.3f} {results[True] * 1e3:>21.3f} "
                f"{results[True] / results[False]:>6.2f}"
            )


# ---------------------------------------------------------------- crash rounds


async def _child(path: Path, sessions: int, seed: int) -> None:
    rng = random.Random(seed)
    store = SqliteStore(path)
    store.open()

    async def session(sid: str) -> None:
        await store.insert_session(session_row(sid))
        seq = 0
        while True:
            seq += 1
            await store.begin(record(sid, seq, RecordStatus.IN_FLIGHT))
            print(f"begun {sid} {seq}", flush=True)
            await asyncio.sleep(rng.uniform(0.001, 0.02))  # the engine call
            await store.finish(record(sid, seq, RecordStatus.COMPLETED))
            print(f"done {sid} {seq}", flush=True)

    print("ready", flush=True)
    await asyncio.gather(*(session(f"r{seed}-s{i}") for i in range(sessions)))


def crash_rounds(rounds: int, sessions: int, seed: int) -> None:
    rng = random.Random(seed)
    print(f"seed {seed}, {sessions} concurrent sessions, kill -9 at a random moment")
    print(f"{'round':>5} {'begun':>6} {'acked':>6} {'found':>6} {'interrupted':>11} {'ok':>4}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "records.db"
        all_ok = True
        for round_ in range(1, rounds + 1):
            child = subprocess.Popen(
                [sys.executable, __file__, "_child", str(path), str(sessions), str(seed + round_)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
            deadline = time.monotonic() + rng.uniform(0.3, 1.5)
            begun: set[tuple[str, int]] = set()
            acked: set[tuple[str, int]] = set()
            while time.monotonic() < deadline:
                kind, sid, seq = child.stdout.readline().split()
                (begun if kind == "begun" else acked).add((sid, int(seq)))
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            child.stdout.close()
            store = SqliteStore(path)
            store.open()  # marks what was in flight interrupted
            interrupted = store.state().interrupted_at_open
            store.close()
            reader = SqliteStore(path)
            found: dict[tuple[str, int], RecordStatus] = {}
            for i in range(sessions):
                sid = f"r{seed + round_}-s{i}"
                for r in reader.records(sid):
                    found[(sid, r.seq)] = r.status
            with sqlite3.connect(path) as conn:
                integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
            ok = (
                all(found.get(k) is RecordStatus.COMPLETED for k in acked)
                and all(k in found for k in begun)
                and set(found.values()) <= {RecordStatus.COMPLETED, RecordStatus.INTERRUPTED}
                and integrity == "ok"
            )
            all_ok &= ok
            print(
                f"{round_:>5} {len(begun):>6} {len(acked):>6} {len(found):>6} "
                f"{interrupted:>11} {'yes' if ok else 'NO':>4}"
            )
        print("all rounds ok" if all_ok else "SOME ROUND FAILED")
        if not all_ok:
            raise SystemExit(1)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        asyncio.run(_child(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_store = sub.add_parser("store", help="cost of dispatch-time rows")
    p_store.add_argument("--calls", type=int, default=2000)
    p_store.add_argument("--concurrency", default="1,32,256")
    p_crash = sub.add_parser("crash", help="kill -9 rounds")
    p_crash.add_argument("--rounds", type=int, default=5)
    p_crash.add_argument("--sessions", type=int, default=32)
    p_crash.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.command == "store":
        store_cost(args.calls, [int(c) for c in args.concurrency.split(",")])
    else:
        crash_rounds(args.rounds, args.sessions, args.seed)


if __name__ == "__main__":
    main()
