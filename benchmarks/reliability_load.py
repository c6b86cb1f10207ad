"""``reliability.py load``: many concurrent streaming sessions for minutes.

A ``polar gateway`` process (its own CLI, a SQLite store) in front of a
``polar engine scripted`` process (vLLM's wire, ``--tokens`` tokens streamed
``--token-delay-s`` apart: the fast fake engine). ``--sessions`` virtual
agents each stream calls through the gateway for ``--minutes``, rotating the
three dialects, pausing ``--think-s`` (uniform 0..2x, seeded) between calls as
an agent runs its tools, and starting a new gateway session every
``--calls-per-session`` calls (the old one is closed, as a rollout does).

At the same time ``--direct`` agents make the same chat call straight to the
engine: the latency the engine alone gives under the same load, measured side
by side. Added latency = gateway percentile - direct percentile, for the
first byte and for the whole stream.

Reports the gateway's RSS sampled every ``--sample-s`` seconds, errors by
kind (any non-200, a stream that did not finish, a connection error), and the
latency percentiles. The client runs in this process (asyncio + httpx); on a
small machine it competes with the gateway for CPU, which inflates both
sides' latency alike.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import orjson

from polar.ir import Dialect
from reliability_parts import DIALECTS, free_port, rss_of, start_gateway, wait_for

TOKEN = "bench-admin-token-0123456789"
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "runs", "away")


def _body(dialect: Dialect) -> dict[str, object]:
    _, field = DIALECTS[dialect]
    body: dict[str, object] = {
        "model": "scripted",
        field: [{"role": "user", "content": "write a sentence"}],
        "stream": True,
    }
    if dialect is Dialect.ANTHROPIC_MESSAGES:
        body["max_tokens"] = 256
    return body


def _finished(dialect: Dialect, text: str) -> bool:
    if dialect is Dialect.OPENAI_CHAT:
        return text.rstrip().endswith("data: [DONE]") and '"error"' not in text
    if dialect is Dialect.ANTHROPIC_MESSAGES:
        return "event: message_stop" in text and "event: error" not in text
    return "event: response.completed" in text


class Tally:
    def __init__(self) -> None:
        self.first: dict[str, list[float]] = {}
        self.total: dict[str, list[float]] = {}
        self.errors: Counter[str] = Counter()
        self.calls = 0

    def add(self, kind: str, first: float, total: float) -> None:
        self.first.setdefault(kind, []).append(first)
        self.total.setdefault(kind, []).append(total)
        self.calls += 1


async def _stream(
    http: httpx.AsyncClient, path: str, body: dict[str, object], dialect: Dialect
) -> tuple[float, float, str | None]:
    """One streamed call: (first byte s, total s, error kind or None)."""
    t0 = time.monotonic()
    first = 0.0
    chunks = []
    try:
        async with http.stream("POST", path, json=body) as reply:
            async for chunk in reply.aiter_bytes():
                if not first:
                    first = time.monotonic() - t0
                chunks.append(chunk)
            status = reply.status_code
    except httpx.HTTPError as exc:
        return 0.0, 0.0, f"{type(exc).__name__}"
    total = time.monotonic() - t0
    if status != 200:
        return first, total, f"HTTP {status}: {_shape('- - ' + _message(b''.join(chunks)))}"
    if not _finished(dialect, b"".join(chunks).decode("utf-8", "replace")):
        return first, total, "stream not finished"
    return first, total, None


async def _agent(
    index: int,
    url: str,
    until: float,
    think_s: float,
    per_session: int,
    tally: Tally,
    rng: random.Random,
) -> None:
    admin_headers = {"authorization": f"Bearer {TOKEN}"}
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        await asyncio.sleep(rng.uniform(0, think_s * 2))  # a staggered start
        while time.monotonic() < until:
            try:
                made = (await http.post("/admin/sessions", json={}, headers=admin_headers)).json()
            except (httpx.HTTPError, ValueError) as exc:
                tally.errors[f"open session: {type(exc).__name__}"] += 1
                await asyncio.sleep(1.0)
                continue
            key = made["api_key"]
            headers = {"authorization": f"Bearer {key}", "x-api-key": key}
            http.headers.update(headers)
            for n in range(per_session):
                if time.monotonic() >= until:
                    break
                dialect = list(DIALECTS)[(index + n) % 3]
                path, _ = DIALECTS[dialect]
                first, total, error = await _stream(http, path, _body(dialect), dialect)
                if error:
                    tally.errors[f"{dialect.value}: {error}"] += 1
                else:
                    tally.add(dialect.value, first, total)
                await asyncio.sleep(rng.uniform(0, think_s * 2))
            try:
                await http.delete(f"/admin/sessions/{made['session_id']}", headers=admin_headers)
            except httpx.HTTPError as exc:
                tally.errors[f"close session: {type(exc).__name__}"] += 1


async def _direct(url: str, until: float, think_s: float, tally: Tally, rng: random.Random) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        await asyncio.sleep(rng.uniform(0, think_s * 2))
        while time.monotonic() < until:
            body = _body(Dialect.OPENAI_CHAT)
            first, total, error = await _stream(
                http, "/v1/chat/completions", body, Dialect.OPENAI_CHAT
            )
            if error:
                tally.errors[f"direct: {error}"] += 1
            else:
                tally.add("direct", first, total)
            await asyncio.sleep(rng.uniform(0, think_s * 2))


async def _sampler(pid: int, until: float, every_s: float, out: list[tuple[float, float]]) -> None:
    start = time.monotonic()
    while True:
        out.append((time.monotonic() - start, rss_of(pid)))
        if time.monotonic() >= until:
            return
        await asyncio.sleep(min(every_s, max(0.0, until - time.monotonic())))


def _pct(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def load(
    sessions: int,
    minutes: float,
    seed: int,
    think_s: float,
    tokens: int,
    token_delay_s: float,
    per_session: int,
    direct: int,
    sample_s: float,
    capture: str,
) -> None:
    rng = random.Random(seed)
    print(
        f"seed {seed}: {sessions} streaming sessions for {minutes} min through `polar gateway` "
        f"({capture}), {direct} direct to the engine; {tokens} tokens {token_delay_s} s apart, "
        f"think 0..{2 * think_s} s, a new gateway session every {per_session} calls"
    )
    polar = [sys.executable, "-m", "polar"]
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.json"
        text = " ".join(WORDS[i % len(WORDS)] for i in range(tokens))
        script.write_bytes(orjson.dumps({"turns": [{"text": text}], "cycle": True}))
        engine_port = free_port()
        engine = subprocess.Popen(
            [*polar, "engine", "scripted", "--script", str(script), "--port", str(engine_port),
             "--token-delay-s", str(token_delay_s)],
            stdout=(Path(tmp) / "engine.log").open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        engine_url = f"http://127.0.0.1:{engine_port}"
        wait_for(f"{engine_url}/v1/models")
        port = free_port()
        gateway = start_gateway(
            port,
            engine_url,
            Path(tmp) / "records.db",
            TOKEN,
            ("--capture", capture, "--engine-model", "scripted"),
            log=Path(tmp) / "gateway.log",
        )
        url = f"http://127.0.0.1:{port}"
        tally = Tally()
        rss: list[tuple[float, float]] = []

        async def run() -> None:
            until = time.monotonic() + minutes * 60
            jobs = [
                _agent(i, url, until, think_s, per_session, tally, random.Random(rng.random()))
                for i in range(sessions)
            ]
            jobs += [
                _direct(engine_url, until, think_s, tally, random.Random(rng.random()))
                for _ in range(direct)
            ]
            await asyncio.gather(_sampler(gateway.pid, until, sample_s, rss), *jobs)

        started = time.monotonic()
        asyncio.run(run())
        wall = time.monotonic() - started
        records = httpx.get(f"{url}/health").json()
        gateway.send_signal(signal.SIGTERM)
        gateway.wait()
        with sqlite3.connect(Path(tmp) / "records.db") as conn:
            statuses = Counter(
                dict(conn.execute("SELECT status, count(*) FROM records GROUP BY 1"))
            )
            failures = Counter(
                _shape("- - " + str(orjson.loads(e)["message"]))
                for (e,) in conn.execute("SELECT error FROM records WHERE error IS NOT NULL")
            )
        engine.send_signal(signal.SIGTERM)
        engine.wait()
        logs = {name: (Path(tmp) / f"{name}.log").read_text(errors="replace") for name in
                ("gateway", "engine")}  # fmt: skip
    print(f"wall {wall:.0f} s, {tally.calls} calls ok ({tally.calls / wall:.1f}/s)")
    print(f"gateway health at the end: {records.get('status')}, store {records.get('store')}")
    print("errors:", dict(tally.errors) if tally.errors else "none")
    print(f"records: {dict(statuses)}")
    for message, count in failures.most_common(6):
        print(f"   {count:>6} x {message}")
    print("gateway RSS (MB) over time:")
    step = max(1, len(rss) // 20)
    print("   " + ", ".join(f"{t:.0f}s {m:.0f}" for t, m in [*rss[::step], rss[-1]]))
    tenth = rss[max(1, len(rss) // 10)][1]
    print(
        f"   first {rss[0][1]:.0f}, at 10% {tenth:.0f}, last {rss[-1][1]:.0f}, "
        f"max {max(m for _, m in rss):.0f}; last - at 10% = {rss[-1][1] - tenth:+.0f} MB"
    )
    print(f"{'latency ms':>22} {'calls':>7} {'first p50':>9} {'first p99':>9} "
          f"{'total p50':>9} {'total p99':>9}")  # fmt: skip
    for kind in sorted(tally.total):
        f, t = tally.first[kind], tally.total[kind]
        print(
            f"{kind:>22} {len(t):>7} {_pct(f, 0.5) * 1e3:>9.1f} {_pct(f, 0.99) * 1e3:>9.1f} "
            f"{_pct(t, 0.5) * 1e3:>9.1f} {_pct(t, 0.99) * 1e3:>9.1f}"
        )
    through = [x for k, xs in tally.total.items() if k != "direct" for x in xs]
    first = [x for k, xs in tally.first.items() if k != "direct" for x in xs]
    if through and "direct" in tally.total:
        d_first, d_total = tally.first["direct"], tally.total["direct"]
        print(
            "added by the gateway (all dialects - direct), ms: "
            f"first byte p50 {(_pct(first, 0.5) - _pct(d_first, 0.5)) * 1e3:+.1f}, "
            f"p99 {(_pct(first, 0.99) - _pct(d_first, 0.99)) * 1e3:+.1f}; "
            f"whole stream p50 {(_pct(through, 0.5) - _pct(d_total, 0.5)) * 1e3:+.1f}, "
            f"p99 {(_pct(through, 0.99) - _pct(d_total, 0.99)) * 1e3:+.1f} "
            f"(mean whole stream {statistics.mean(through) * 1e3:.1f} vs "
            f"{statistics.mean(d_total) * 1e3:.1f})"
        )
    for name, text in logs.items():
        lines = [line for line in text.splitlines() if "WARNING" in line or "ERROR" in line]
        print(f"{name} log: {len(lines)} warnings/errors")
        for line in Counter(_shape(line) for line in lines).most_common(8):
            print(f"   {line[1]:>6} x {line[0]}")
    if tally.errors:
        raise SystemExit(1)


def _message(raw: bytes) -> str:
    try:
        return str(orjson.loads(raw)["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return repr(raw[:100])


def _shape(line: str) -> str:
    """A log line without its time stamp and ids, so equal lines count together."""
    words = line.split()[2:]
    return " ".join(w if not any(c.isdigit() for c in w) else "#" for w in words)[:160]
