"""Record store durability and cost: kill -9 rounds, and the price of dispatch-time rows.

    .venv/bin/python benchmarks/reliability.py store [--calls 2000] [--concurrency 1,32,256]
    .venv/bin/python benchmarks/reliability.py crash [--rounds 5] [--sessions 32] [--seed 1]
    .venv/bin/python benchmarks/reliability.py faults [--calls 1200] [--rate 0.1] [--seed 1]
    .venv/bin/python benchmarks/reliability.py kill-gateway [--rounds 5] [--sessions 32] [--seed 1]
    .venv/bin/python benchmarks/reliability.py big-prompts [--mb 4] [--count 3]
    .venv/bin/python benchmarks/reliability.py weight-sync [--calls 2000] [--sessions 32]
    .venv/bin/python benchmarks/reliability.py fuzz [--per-case 10000] [--seed 1] [--capture M,M]
    .venv/bin/python benchmarks/reliability.py kill-server [--rounds 5] [--sessions 32] [--seed 1]
    .venv/bin/python benchmarks/reliability.py load [--sessions 512] [--minutes 10]

``kill-server``: ``kill -9`` of a ``polar serve`` process (the rollout
server) while its tasks run on it and on a ``polar node``; see
``reliability_server.py``.

``load``: many concurrent streaming sessions against a ``polar gateway``
process for minutes; its RSS over time, added latency, errors; see
``reliability_load.py``.

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
is ok.

``kill-gateway``: the same, end to end: a ``polar gateway`` process (its
own CLI) in front of an engine in this process that streams like vLLM and
notes the ``x-request-id`` of every request that reaches it; ``--sessions``
clients stream calls in all three dialects; the gateway is ``kill -9``ed at
a random moment, restarted on the same store (which marks calls left in
flight ``interrupted``), and the store is checked: every call the engine saw
has its record (completed, failed or interrupted), every call a client saw
finish is completed, integrity ok.

``weight-sync``: a real gateway under ``--sessions`` streaming and
non-streaming clients is paused and resumed ``--syncs`` times, each time
with a new policy version, as a trainer loading new weights does; the engine
names the version of its weights at the start of each reply. Checks: no call
fails or is aborted, and every record is stamped with the version that
served it.

``fuzz``: a ``polar gateway`` process (each capture mode in turn) before
a scripted engine process; ``--per-case`` mutants of the golden requests the
real CLIs sent (``tests/fixtures/harness``) per dialect, with keys dropped,
values of the wrong type, nesting up to 1,000 deep, strings up to 1 MB, bodies
cut short or not UTF-8; 3% of them with the ``Authorization`` header sent twice
(must be a 400) and 2% with a 100 KB header (a 431). Reports statuses, 5xx,
dropped connections, the slowest reply, the gateway's RSS before and after,
and the header cases sent and answered otherwise.

``big-prompts``: token-in/token-out mode, where the gateway renders and
tokenizes prompts itself. A small streamed call is repeated on one session
while ``--count`` calls with a ``--mb`` MB user message arrive at once on
others; the small calls' latency is reported side by side with the same calls
with nothing big in flight, and the process's peak RSS. Rendering runs on
offload workers, so the event loop keeps serving the small calls. Such a
prompt cannot fit the scripted engine's context (32,768 tokens): each big call
must be refused (400, no record) without being tokenized whole; its time to
the refusal is reported, with the row of the fault table below.

``faults``: a real gateway (engine-rendered, vLLM wire, ``engine.max_model_len``
set, so every call first asks the engine's ``/tokenize`` for the prompt's
length) in front of an engine that answers like vLLM but fails ``--rate`` of
its chat replies and of its ``/tokenize`` replies (seeded). Chat: HTTP 500,
503, a connection reset, a stall past the gateway's timeouts, a stream or body
cut short, a reply of the wrong shape, a negative token id; ``/tokenize``: 500,
503, a reset, a stall. ``--calls`` calls across the three dialects, streamed
and not, from 16 concurrent sessions. Per fault kind (the first fault a call
met; ``none``: it met none), a table: calls; hung (no answer within 30 s); 5xx
without a record; wrong status (not what the call's last attempt's fault
gives: 502, or 504 for a stall, or an error event in a stream that had begun;
200 when the last attempt met no fault). It also checks that every request
that reached the engine has its attempt's record, and that no call the client
saw fail has a completed record (so none of its tokens can reach a trainer).
Then ``GET /v1/models`` faults (a stall, 500, a reset, a reply without
``max_model_len``; no ``engine.max_model_len``): a gateway per kind, its start
and ``--calls / 4`` calls; every call must be served (200) and none may wait on
the stalled answer; the table notes the start time, the slowest call, how many
times the engine was asked and what ``/health`` says of the context length.
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
import threading
import time
from pathlib import Path

import httpx
import orjson

from polar.ir import CaptureMode, CompletionRecord, Dialect, FinishReason, RecordStatus, Timings
from polar.proxy.engines.vllm_process import free_port
from polar.proxy.store import SessionRow, SqliteStore
from reliability_parts import (
    DIALECTS,
    MODELS_FAULTS,
    FaultyVllm,
    call_once,
    mutant,
    rss_mb,
    rss_of,
    start_gateway,
    wait_for,
)


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


EXPECTED = {
    None: {"ok"},
    "http500": {"error 502"},
    "http503": {"error 502"},
    "reset": {"error 502"},
    "stall": {"error 504"},
    "truncated": {"error 502", "stream-error"},
    "shape": {"error 502"},
    "bad_ids": {"error 502"},
    "tokenize_500": {"error 502"},
    "tokenize_503": {"error 502"},
    "tokenize_reset": {"error 502"},
    "tokenize_stall": {"error 504"},
}
"""What a client gets when its call's last attempt met the fault (earlier ones retried)."""


def _attempt_fault(entries: list[tuple[str, str | None]]) -> str | None:
    """The fault that decided an attempt: its chat request's when it had one (the
    count before it went through), else its count's (the last, if it was resent)."""
    chat = [fault for route, fault in entries if route == "chat"]
    counts = [fault for route, fault in entries if route == "tokenize"]
    return chat[-1] if chat else (counts[-1] if counts else None)


class _Tally:
    """Per fault kind: calls, hung, 5xx without a record, wrong status."""

    def __init__(self) -> None:
        self.rows: dict[str, list[int]] = {}

    def add(self, kind: str, *, hung: bool, unrecorded_5xx: bool, wrong: bool) -> None:
        row = self.rows.setdefault(kind, [0, 0, 0, 0])
        for i, value in enumerate((True, hung, unrecorded_5xx, wrong)):
            row[i] += value

    def print(self, extra: dict[str, str] | None = None) -> int:
        print(f"{'fault kind':>18} {'calls':>6} {'hung':>5} {'5xx w/o record':>15} "
              f"{'wrong status':>13}{'  ' + 'notes' if extra else ''}")  # fmt: skip
        total = [0, 0, 0, 0]
        for kind, row in sorted(self.rows.items()):
            note = f"  {extra[kind]}" if extra and kind in extra else ""
            print(f"{kind:>18} {row[0]:>6} {row[1]:>5} {row[2]:>15} {row[3]:>13}{note}")
            total = [a + b for a, b in zip(total, row, strict=True)]
        print(f"{'all':>18} {total[0]:>6} {total[1]:>5} {total[2]:>15} {total[3]:>13}")
        return total[1] + total[2] + total[3]


def _gateway(engine_url: str, tmp: str, **engine: object) -> tuple[object, str, object]:
    """A real gateway (engine-rendered, vLLM wire) on a server thread: (server, url, config)."""
    from polar.proxy.app import create_app
    from polar.proxy.config import GatewayConfig
    from polar.proxy.gateway import Gateway
    from polar.serverthread import ServerThread

    config = GatewayConfig.model_validate(
        {
            "admin_token": "bench-admin-token-0123456789",
            "engine": {
                "kind": "vllm",
                "base_url": engine_url,
                "model": "m",
                "read_timeout_s": 0.5,
                "idle_timeout_s": 0.5,
                "retry_backoff_s": 0.01,
                **engine,
            },
            "store": {"path": f"{tmp}/records.db"},
        }
    )
    server = ServerThread(create_app(Gateway(config))).start()
    return server, server.url, config


def _run_calls(
    url: str, token: str, sessions: int, per_session: int
) -> tuple[list[dict[str, str]], dict[tuple[str, int], tuple[str, float]]]:
    """``per_session`` calls from each of ``sessions`` concurrent sessions, across the
    dialects, streamed and not: the sessions made and each call's outcome and time
    (``hung``: no answer within 30 s)."""
    admin = httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"})
    made = [admin.post("/admin/sessions", json={}).json() for _ in range(sessions)]
    admin.close()
    per_call: dict[tuple[str, int], tuple[str, float]] = {}
    lock = threading.Lock()

    def run(index: int) -> None:
        sid, key = made[index]["session_id"], made[index]["api_key"]
        headers = {"authorization": f"Bearer {key}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            for seq in range(1, per_session + 1):
                dialect = list(DIALECTS)[(index + seq) % 3]
                started = time.monotonic()
                try:
                    outcome = call_once(client, dialect, stream=seq % 2 == 0)
                except httpx.TimeoutException:
                    outcome = "hung"
                except Exception as exc:
                    outcome = f"broken: {exc}"[:200]
                with lock:
                    per_call[(sid, seq)] = (outcome, time.monotonic() - started)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return made, per_call


def engine_faults(calls: int, rate: float, seed: int) -> None:
    """Call faults (chat and ``/tokenize``), then ``GET /v1/models`` faults; see the
    module docstring. Exits 1 on any call hung, 5xx without a record, wrong status,
    engine request without a record, or failed call with a completed record."""
    bad = 0
    sessions = 16
    with tempfile.TemporaryDirectory() as tmp:
        engine = FaultyVllm(rate, seed, tokenize_rate=rate)
        # A known context length: every call asks the engine's /tokenize first.
        server, url, config = _gateway(engine.url, tmp, max_model_len=4096)
        started = time.monotonic()
        made, per_call = _run_calls(url, config.admin_token, sessions, calls // sessions)
        elapsed = time.monotonic() - started
        server.stop()  # type: ignore[attr-defined]
        engine.stop()
        reader = SqliteStore(config.store.path)
        records: dict[tuple[str, int], list[CompletionRecord]] = {}
        keys: set[str] = set()
        for m in made:
            for r in reader.records(m["session_id"]):
                records.setdefault((r.session_id, r.seq), []).append(r)
                keys.add(f"{r.session_id}/{r.seq}.{r.attempt}")
        with engine.lock:
            faults = dict(engine.faults)
        by_call: dict[str, list[tuple[int, list[tuple[str, str | None]]]]] = {}
        for request_id, entries in faults.items():
            call, _, attempt = request_id.rpartition(".")
            if attempt.isdigit():  # (a request without its record's key: counted below)
                by_call.setdefault(call, []).append((int(attempt), entries))
        tally = _Tally()
        trainable_failures = 0
        for (sid, seq), (outcome, _) in per_call.items():
            attempts = sorted(by_call.get(f"{sid}/{seq}", []))
            # The call's kind: the first fault any of its requests met (a reset count
            # sent again at once included); what it should end with: its last attempt's.
            kinds = [fault for _, entries in attempts for _, fault in entries if fault]
            kind = kinds[0] if kinds else "none"
            last = _attempt_fault(attempts[-1][1]) if attempts else None
            got = records.get((sid, seq), [])
            tally.add(
                kind,
                hung=outcome == "hung",
                unrecorded_5xx=outcome.startswith("error 5") and not got,
                wrong=outcome not in EXPECTED[last],
            )
            if outcome != "ok" and any(r.status is RecordStatus.COMPLETED for r in got):
                trainable_failures += 1
        unrecorded = sorted(set(faults) - keys)
        print(f"seed {seed}, fault rate {rate:g} (chat and /tokenize), {len(per_call)} calls "
              f"from {sessions} sessions in {elapsed:.1f} s")  # fmt: skip
        print(f"faults injected: {dict(sorted(engine.injected.items()))}")
        outcomes: dict[str, int] = {}
        for outcome, _ in per_call.values():
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        print(f"client outcomes: {dict(sorted(outcomes.items()))}")
        bad += tally.print()
        print(f"engine requests (attempts) without a record: {len(unrecorded)} {unrecorded[:5]}")
        print(f"failed calls with a completed record: {trainable_failures}")
        bad += len(unrecorded) + trainable_failures

    # GET /v1/models failing at start: calls must go ahead, none waits on it.
    print()
    print("GET /v1/models failing (no engine.max_model_len): every call must be served")
    tally = _Tally()
    notes: dict[str, str] = {}
    per_kind = max(sessions, calls // 4)
    for kind in MODELS_FAULTS:
        with tempfile.TemporaryDirectory() as tmp:
            engine = FaultyVllm(0.0, seed, models_fault=kind)
            t0 = time.monotonic()
            # A stalled answer costs the read timeout; every call waiting on it would show.
            server, url, config = _gateway(engine.url, tmp, read_timeout_s=5.0)
            start_s = time.monotonic() - t0
            made, per_call = _run_calls(url, config.admin_token, sessions, per_kind // sessions)
            context = httpx.get(f"{url}/health").json().get("context", {})
            server.stop()  # type: ignore[attr-defined]
            engine.stop()
            reader = SqliteStore(config.store.path)
            recorded = {
                (r.session_id, r.seq) for m in made for r in reader.records(m["session_id"])
            }
            for (sid, seq), (outcome, _) in per_call.items():
                tally.add(
                    kind,
                    hung=outcome == "hung",
                    unrecorded_5xx=outcome.startswith("error 5") and (sid, seq) not in recorded,
                    wrong=outcome != "ok",
                )
            slowest = max(t for _, t in per_call.values())
            notes[kind] = (
                f"start {start_s:.1f} s, slowest call {slowest * 1e3:.0f} ms, /v1/models asked "
                f"{engine.models_asked}x, /health context: {context.get('source')}"
                f"{' + warning' if 'warning' in context else ''}"
            )
    bad += tally.print(notes)
    if bad:
        raise SystemExit(1)


# ---------------------------------------------------------------- weight sync


def weight_sync(calls: int, sessions: int, syncs: int) -> None:
    from polar.proxy.app import create_app
    from polar.proxy.config import GatewayConfig
    from polar.proxy.gateway import Gateway
    from polar.serverthread import ServerThread

    engine = FaultyVllm(0.0, 0, token_delay_s=0.005)
    with tempfile.TemporaryDirectory() as tmp:
        config = GatewayConfig.model_validate(
            {
                "admin_token": "bench-admin-token-0123456789",
                "engine": {"kind": "vllm", "base_url": engine.url, "model": "m"},
                "store": {"path": f"{tmp}/records.db"},
            }
        )
        server = ServerThread(create_app(Gateway(config))).start()
        admin = httpx.Client(
            base_url=server.url,
            headers={"authorization": f"Bearer {config.admin_token}"},
            timeout=120,
        )
        made = [admin.post("/admin/sessions", json={}).json() for _ in range(sessions)]
        outcomes: dict[str, int] = {}
        lock = threading.Lock()
        running = threading.Event()
        running.set()

        def client(index: int) -> None:
            key = made[index]["api_key"]
            headers = {"authorization": f"Bearer {key}", "x-api-key": key}
            with httpx.Client(base_url=server.url, headers=headers, timeout=120) as http:
                for n in range(calls // sessions):
                    try:
                        outcome = call_once(
                            http, list(DIALECTS)[(index + n) % 3], stream=n % 2 == 0
                        )
                    except Exception as exc:
                        outcome = f"broken: {type(exc).__name__}"
                    with lock:
                        outcomes[outcome] = outcomes.get(outcome, 0) + 1

        threads = [threading.Thread(target=client, args=(i,)) for i in range(sessions)]
        started = time.monotonic()
        for t in threads:
            t.start()
        pauses: list[float] = []
        for _ in range(syncs):
            time.sleep(0.1)
            t0 = time.monotonic()
            paused = admin.post("/admin/pause", json={})
            pauses.append(time.monotonic() - t0)
            if paused.status_code != 200:
                raise SystemExit(f"pause failed: {paused.status_code} {paused.text}")
            engine.version += 1  # new weights load while nothing is in flight
            admin.post("/admin/resume", json={"policy_version": engine.version}).raise_for_status()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        server.stop()
        engine.stop()
        reader = SqliteStore(config.store.path)
        statuses: dict[str, int] = {}
        mismatched = 0
        versions: set[int] = set()
        for m in made:
            for r in reader.records(m["session_id"]):
                statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
                text = r.message.text if r.message is not None else ""
                served_by = int(text.split()[0][1:]) if text.startswith("v") else -1
                versions.add(r.policy_version)
                mismatched += served_by != r.policy_version
    total = sum(outcomes.values())
    print(f"{total} calls from {sessions} sessions in {elapsed:.1f} s, {syncs} pause/resume cycles")
    print(f"client outcomes: {dict(sorted(outcomes.items()))}")
    print(f"records by status: {dict(sorted(statuses.items()))}")
    print(f"versions stamped: {len(versions)} distinct, {min(versions)}..{max(versions)}")
    print(f"records stamped with a version other than the one that served them: {mismatched}")
    print(f"pause (drain) time: p50 {sorted(pauses)[len(pauses) // 2] * 1e3:.0f} ms, "
          f"max {max(pauses) * 1e3:.0f} ms")  # fmt: skip
    if mismatched or outcomes.get("ok", 0) != total or set(statuses) != {"completed"}:
        raise SystemExit(1)


def fuzz(per_case: int, seed: int, modes: list[str]) -> None:
    fixtures = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "harness"
    bases: dict[Dialect, list[dict[str, object]]] = {d: [] for d in DIALECTS}
    for path in sorted(fixtures.glob("*/*.json")):
        fixture = orjson.loads(path.read_bytes())
        bases[Dialect(fixture["dialect"])].append(fixture["body"])
    token = "bench-admin-token-0123456789"
    print(f"seed {seed}, {per_case} mutants per dialect and capture mode")
    print(f"{'mode':>19} {'dialect':>19} {'2xx':>6} {'4xx':>6} {'5xx':>4} {'dropped':>7} "
          f"{'slowest s':>9} {'RSS MB 0/10%/end/max':>19} {'wall s':>7} "
          f"{'heads 400/431 wrong':>19}")  # fmt: skip
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.json"
        script.write_bytes(orjson.dumps({"turns": [{"text": "ok"}], "cycle": True}))
        engine_port = free_port()
        engine = subprocess.Popen(
            [sys.executable, "-m", "polar", "engine", "scripted", "--script", str(script),
             "--port", str(engine_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(f"http://127.0.0.1:{engine_port}/v1/models")
        for mode in modes:
            port = free_port()
            command = [
                sys.executable, "-m", "polar", "gateway", "--port", str(port),
                "--admin-token", token, "--engine-url", f"http://127.0.0.1:{engine_port}",
                "--engine-model", "scripted", "--store", f"{tmp}/{mode}.db", "--capture", mode,
            ]  # fmt: skip
            gateway = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            url = f"http://127.0.0.1:{port}"
            wait_for(f"{url}/health")
            admin = httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"})
            key = admin.post("/admin/sessions", json={}).json()["api_key"]
            headers = {
                "authorization": f"Bearer {key}",
                "x-api-key": key,
                "anthropic-version": "2023-06-01",
                "content-type": "application/json",
            }
            for dialect, (path, _) in DIALECTS.items():
                rng = random.Random(f"{seed}/{mode}/{dialect.value}")
                # Apart from the bodies' draws, so the mutants stay those of earlier runs.
                head_rng = random.Random(f"{seed}/{mode}/{dialect.value}/heads")
                heads = {400: 0, 431: 0, "wrong": 0}
                counts = {"2xx": 0, "4xx": 0, "5xx": 0, "dropped": 0}
                samples: list[str] = []
                slowest = 0.0
                rss_start = rss_of(gateway.pid)
                rss_tenth, peak, case_started = rss_start, rss_start, time.monotonic()
                with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
                    for n in range(per_case):
                        if n % 100 == 0:
                            peak = max(peak, rss_of(gateway.pid))
                        if n and n % 1000 == 0:
                            print(
                                f"   {mode} {dialect.value}: {n} sent, {counts}, slowest "
                                f"{slowest:.2f} s, RSS {rss_of(gateway.pid):.0f} MB, "
                                f"{time.monotonic() - case_started:.0f} s",
                                flush=True,
                            )
                        if n == per_case // 10:
                            rss_tenth = rss_of(gateway.pid)
                        raw = mutant(rng.choice(bases[dialect]), rng)
                        # 3% repeat the Authorization header (400), 2% a 100 KB header (431).
                        roll = head_rng.random()
                        expect = 400 if roll < 0.03 else 431 if roll < 0.05 else None
                        fields = list(headers.items())
                        if expect == 400:
                            fields.append(("authorization", "Bearer sk-polar-another"))
                        elif expect == 431:
                            fields.append(("x-padding", "p" * (100 << 10)))
                        t0 = time.monotonic()
                        try:
                            if expect is None:
                                reply = http.post(path, content=raw)
                            else:
                                request = httpx.Request(
                                    "POST", f"{url}{path}", headers=fields, content=raw
                                )
                                reply = http.send(request)
                                heads[expect] += 1
                                heads["wrong"] += reply.status_code != expect
                            status = reply.status_code
                            if status >= 500:
                                samples.append(f"{status} {reply.text[:300]!r} <- {raw[:200]!r}")
                        except httpx.HTTPError:
                            counts["dropped"] += 1
                            continue
                        slowest = max(slowest, time.monotonic() - t0)
                        counts[f"{status // 100}xx"] = counts.get(f"{status // 100}xx", 0) + 1
                rss_end = rss_of(gateway.pid)
                rss = f"{rss_start:.0f}/{rss_tenth:.0f}/{rss_end:.0f}/{max(peak, rss_end):.0f}"
                bad += counts["5xx"] + counts["dropped"] + heads["wrong"]
                c = counts
                h = f"{heads[400]}/{heads[431]} {heads['wrong']}"
                print(
                    f"{mode:>19} {dialect.value:>19} {c['2xx']:>6} {c['4xx']:>6} {c['5xx']:>4} "
                    f"{c['dropped']:>7} {slowest:>9.2f} {rss:>19} "
                    f"{time.monotonic() - case_started:>7.0f} {h:>19}",
                    flush=True,
                )
                for sample in samples[:3]:
                    print("   5xx:", sample)
            gateway.terminate()
            gateway.wait()
        engine.terminate()
        engine.wait()
    if bad:
        raise SystemExit(1)


def kill_gateway(rounds: int, sessions: int, seed: int) -> None:
    rng = random.Random(seed)
    engine = FaultyVllm(0.0, seed, token_delay_s=0.01)
    token = "bench-admin-token-0123456789"
    print(f"seed {seed}, {sessions} concurrent streaming sessions, kill -9 of the gateway")
    print(
        f"{'round':>5} {'engine saw':>10} {'recorded':>8} {'acked':>6} {'completed':>9} "
        f"{'interrupted':>11} {'ok':>4}"
    )
    all_ok = True
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "records.db"
        for round_ in range(1, rounds + 1):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            proc = start_gateway(port, engine.url, store, token)
            admin = httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"})
            made = [admin.post("/admin/sessions", json={}).json() for _ in range(sessions)]
            admin.close()
            acked: dict[str, int] = {}
            stop = threading.Event()

            def client(
                index: int,
                made: list[dict[str, str]] = made,
                url: str = url,
                stop: threading.Event = stop,
                acked: dict[str, int] = acked,
            ) -> None:
                sid, key = made[index]["session_id"], made[index]["api_key"]
                headers = {"authorization": f"Bearer {key}", "x-api-key": key}
                with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
                    n = 0
                    while not stop.is_set():
                        n += 1
                        try:
                            outcome = call_once(http, list(DIALECTS)[(index + n) % 3], stream=True)
                        except (httpx.HTTPError, AssertionError, ValueError):
                            return  # the gateway died under it
                        if outcome == "ok":
                            acked[sid] = acked.get(sid, 0) + 1

            with engine.lock:
                engine.seen.clear()
            threads = [threading.Thread(target=client, args=(i,)) for i in range(sessions)]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.5, 2.0))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            stop.set()
            for t in threads:
                t.join()
            # Restart on the same store: calls left in flight become interrupted.
            proc = start_gateway(port, engine.url, store, token)
            health = httpx.get(f"{url}/health").json()
            proc.terminate()
            proc.wait()
            reader = SqliteStore(store)
            keys: dict[str, RecordStatus] = {}
            completed_per: dict[str, int] = {}
            for m in made:
                for r in reader.records(m["session_id"]):
                    keys[f"{r.session_id}/{r.seq}.{r.attempt}"] = r.status
                    if r.status is RecordStatus.COMPLETED:
                        completed_per[r.session_id] = completed_per.get(r.session_id, 0) + 1
            with engine.lock:
                seen = set(engine.seen)
            with sqlite3.connect(store) as conn:
                integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
            statuses = set(keys.values())
            ok = (
                seen <= set(keys)
                and all(completed_per.get(sid, 0) >= n for sid, n in acked.items())
                and RecordStatus.IN_FLIGHT not in statuses
                and integrity == "ok"
            )
            all_ok &= ok
            interrupted = sum(1 for v in keys.values() if v is RecordStatus.INTERRUPTED)
            print(
                f"{round_:>5} {len(seen):>10} {len(keys):>8} {sum(acked.values()):>6} "
                f"{sum(completed_per.values()):>9} {interrupted:>11} {'yes' if ok else 'NO':>4}"
                f"  (health after restart: interrupted_at_start="
                f"{health['store']['interrupted_at_start']})"
            )
    engine.stop()
    print("all rounds ok" if all_ok else "SOME ROUND FAILED")
    if not all_ok:
        raise SystemExit(1)


def big_prompts(mb: float, count: int) -> None:
    import resource

    from polar.proxy.app import create_app
    from polar.proxy.config import GatewayConfig
    from polar.proxy.gateway import Gateway
    from polar.serverthread import ServerThread

    with tempfile.TemporaryDirectory() as tmp:
        # The engine is its own process (as vLLM is), so only the gateway is measured.
        script = Path(tmp) / "script.json"
        script.write_bytes(orjson.dumps({"turns": [{"text": "ok"}], "cycle": True}))
        port = free_port()
        engine = subprocess.Popen(
            [sys.executable, "-m", "polar", "engine", "scripted", "--script", str(script),
             "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(f"http://127.0.0.1:{port}/v1/models")
        config = GatewayConfig.model_validate(
            {
                "admin_token": "bench-admin-token-0123456789",
                "capture": "token_in_token_out",
                "engine": {
                    "kind": "vllm",
                    "base_url": f"http://127.0.0.1:{port}",
                    "model": "scripted",
                },
                "store": {"path": f"{tmp}/records.db"},
            }
        )
        server = ServerThread(create_app(Gateway(config))).start()
        admin = httpx.Client(
            base_url=server.url, headers={"authorization": f"Bearer {config.admin_token}"}
        )
        made = [admin.post("/admin/sessions", json={}).json() for _ in range(count + 1)]
        keys = [m["api_key"] for m in made]
        sids = [m["session_id"] for m in made]

        def post(key: str, text: str, timeout: float = 300) -> tuple[int, float]:
            """The reply's status (0: none within ``timeout``) and how long it took."""
            started = time.perf_counter()
            with httpx.Client(base_url=server.url, timeout=timeout) as http:
                try:
                    reply = http.post(
                        "/v1/chat/completions",
                        headers={"authorization": f"Bearer {key}"},
                        json={
                            "model": "m",
                            "stream": True,
                            "messages": [{"role": "user", "content": text}],
                        },
                    )
                except httpx.TimeoutException:
                    return 0, time.perf_counter() - started
            return reply.status_code, time.perf_counter() - started

        def small_calls(until: threading.Event | None, n: int) -> list[float]:
            out = []
            while (until is not None and not until.is_set()) or (until is None and len(out) < n):
                status, took = post(keys[0], "hi")
                if status != 200:
                    raise SystemExit(f"a small call got {status}")
                out.append(took)
            return out

        alone = small_calls(None, 30)
        rss_before = rss_mb()
        big_text = " ".join(["word"] * int(mb * (1 << 20) / 5))
        done = threading.Event()
        big_times: list[float] = []
        big_statuses: list[int] = []

        def big(key: str) -> None:
            status, took = post(key, big_text)
            big_statuses.append(status)
            big_times.append(took)

        bigs = [threading.Thread(target=big, args=(k,)) for k in keys[1:]]
        for t in bigs:
            t.start()
        waiter = threading.Thread(target=lambda: ([t.join() for t in bigs], done.set()))
        waiter.start()
        during = small_calls(done, 0)
        waiter.join()
        store = SqliteStore(config.store.path)
        big_records = sum(len(store.records(sid)) for sid in sids[1:])
        server.stop()
        engine.terminate()
        engine.wait()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3

    print(f"{count} calls of {mb:g} MB at once, token-in/token-out, one small call repeated")
    print(f"{'small calls':>22} {'n':>4} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8}")
    for name, xs in (("alone", alone), ("during the big calls", during)):
        p50, p90, top = pct(xs, 0.5), pct(xs, 0.9), max(xs) * 1e3
        print(f"{name:>22} {len(xs):>4} {p50:>8.1f} {p90:>8.1f} {top:>8.1f}")
    print(f"big calls: {', '.join(f'{t:.2f} s' for t in sorted(big_times))}")
    print(f"RSS before the big calls {rss_before:.0f} MB, peak {peak:.0f} MB")
    # A prompt of megabytes cannot fit the scripted engine's 32,768 tokens: refused.
    tally = _Tally()
    for status in big_statuses:
        tally.add(
            "huge_prompt", hung=status == 0, unrecorded_5xx=status >= 500, wrong=status != 400
        )
    note = (
        f"refused in {min(big_times):.2f}-{max(big_times):.2f} s (status 400 expected), "
        f"{big_records} records"
    )
    if tally.print({"huge_prompt": note}) or big_records:
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
    p_faults = sub.add_parser("faults", help="engine faults behind a real gateway")
    p_faults.add_argument("--calls", type=int, default=1200)
    p_faults.add_argument("--rate", type=float, default=0.1)
    p_faults.add_argument("--seed", type=int, default=1)
    p_kill = sub.add_parser("kill-gateway", help="kill -9 rounds of a gateway process")
    p_kill.add_argument("--rounds", type=int, default=5)
    p_kill.add_argument("--sessions", type=int, default=32)
    p_kill.add_argument("--seed", type=int, default=1)
    p_big = sub.add_parser("big-prompts", help="small calls while big prompts render")
    p_big.add_argument("--mb", type=float, default=4.0)
    p_big.add_argument("--count", type=int, default=3)
    p_sync = sub.add_parser("weight-sync", help="pause/resume under load")
    p_sync.add_argument("--calls", type=int, default=2000)
    p_sync.add_argument("--sessions", type=int, default=32)
    p_sync.add_argument("--syncs", type=int, default=20)
    p_fuzz = sub.add_parser("fuzz", help="mutated CLI requests against a gateway process")
    p_fuzz.add_argument("--per-case", type=int, default=10000)
    p_fuzz.add_argument("--seed", type=int, default=1)
    p_fuzz.add_argument("--capture", default="engine_rendered,token_in_token_out")
    p_server = sub.add_parser("kill-server", help="kill -9 rounds of the rollout server")
    p_server.add_argument("--rounds", type=int, default=5)
    p_server.add_argument("--sessions", type=int, default=32)
    p_server.add_argument("--queued", type=int, default=8, help="sessions beyond capacity")
    p_server.add_argument("--seed", type=int, default=1)
    p_server.add_argument("--calls", type=int, default=4, help="chat calls per session")
    p_server.add_argument("--pause-s", type=float, default=1.0, help="between calls")
    p_load = sub.add_parser("load", help="many streaming sessions for minutes: RSS, latency")
    p_load.add_argument("--sessions", type=int, default=512)
    p_load.add_argument("--minutes", type=float, default=10.0)
    p_load.add_argument("--seed", type=int, default=1)
    p_load.add_argument("--think-s", type=float, default=2.0, help="mean pause between calls")
    p_load.add_argument("--tokens", type=int, default=32, help="tokens per reply")
    p_load.add_argument("--token-delay-s", type=float, default=0.02)
    p_load.add_argument("--calls-per-session", type=int, default=20)
    p_load.add_argument("--direct", type=int, default=16, help="agents calling the engine")
    p_load.add_argument("--sample-s", type=float, default=10.0, help="RSS sampling period")
    p_load.add_argument("--capture", default="engine_rendered")
    args = parser.parse_args()
    if args.command == "load":
        from reliability_load import load

        load(
            args.sessions, args.minutes, args.seed, args.think_s, args.tokens,
            args.token_delay_s, args.calls_per_session, args.direct, args.sample_s, args.capture,
        )  # fmt: skip
    elif args.command == "kill-server":
        from reliability_server import kill_server

        kill_server(args.rounds, args.sessions, args.queued, args.seed, args.calls, args.pause_s)
    elif args.command == "fuzz":
        fuzz(args.per_case, args.seed, args.capture.split(","))
    elif args.command == "weight-sync":
        weight_sync(args.calls, args.sessions, args.syncs)
    elif args.command == "big-prompts":
        big_prompts(args.mb, args.count)
    elif args.command == "kill-gateway":
        kill_gateway(args.rounds, args.sessions, args.seed)
    elif args.command == "store":
        store_cost(args.calls, [int(c) for c in args.concurrency.split(",")])
    elif args.command == "crash":
        crash_rounds(args.rounds, args.sessions, args.seed)
    else:
        engine_faults(args.calls, args.rate, args.seed)


if __name__ == "__main__":
    main()
