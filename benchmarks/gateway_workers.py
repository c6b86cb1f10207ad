"""``benchmarks/gateway.py --workers 1,2``: throughput of a gateway group, and the router's hop.

Started side by side on one fake engine (``gateway.py``'s: vLLM's chat wire
format, engine-rendered capture): ``polar gateway`` as it runs by default (one
process, no router), the same behind the router with one worker (the hop
alone), and ``polar gateway --workers N`` for each N asked past 1. Rounds
alternate between them so all see the same machine noise. Reported per load:

* calls per second with many sessions calling back to back, and the ratio to
  the lone gateway;
* CPU-seconds per 1,000 calls of the router (the parent process: the hop's CPU)
  and of the workers together, from ``/proc/PID/stat`` (all threads);
* with one session calling back to back, p50 latency without and with the
  router: the hop's added latency.

The load generator and the fake engine are one Python process each on the
same machine: on a machine with few cores they compete with the workers, so
the throughput of N workers is bounded by what is left; the CPU figures hold
regardless.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gateway import ADMIN, OUTPUT_TOKENS, ROOT, Connection, _free_port, _pct, _wait

_GROUP = (
    "import sys; from polar.proxy.config import GatewayConfig; "
    "from polar.proxy.workers.supervisor import run_group; "
    "run_group(GatewayConfig.model_validate_json(sys.stdin.read()))"
)


@dataclass
class Target:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    routed: bool
    keys: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    """The processes that serve calls (asked once: asking costs the router CPU)."""

    def ready(self, sessions: int) -> None:
        _wait(self.port, timeout=600, process=self.process)
        self.keys = [_new_key(self.port) for _ in range(sessions)]
        if self.routed:
            self.pids = [w["pid"] for w in _get(self.port, "/health")["workers"]]
        else:
            self.pids = [self.process.pid]

    def cpu(self) -> tuple[float, float]:
        """CPU-seconds so far: (router, workers)."""
        workers = sum(_cpu_s(pid) for pid in self.pids)
        return (_cpu_s(self.process.pid) if self.routed else 0.0), workers


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _get(port: int, path: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as reply:
        return dict(json.loads(reply.read()))


def _new_key(port: int) -> str:
    import urllib.request

    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/admin/sessions",
        data=b"{}",
        method="POST",
        headers={"authorization": f"Bearer {ADMIN}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return str(json.loads(reply.read())["api_key"])


def _config(port: int, engine_port: int, store: Path, workers: int) -> str:
    return json.dumps(
        {
            "port": port,
            "admin_token": ADMIN,
            "engine": {"base_url": f"http://127.0.0.1:{engine_port}", "model": "m"},
            "store": {"path": str(store)},
            "log_level": "error",
            "workers": workers,
        }
    )


def _start(name: str, engine_port: int, workdir: Path, workers: int, routed: bool) -> Target:
    port = _free_port()
    store = workdir / f"{name.replace(' ', '_')}.db"
    if routed:
        process = subprocess.Popen([sys.executable, "-c", _GROUP], stdin=subprocess.PIPE, cwd=ROOT)
        assert process.stdin is not None
        process.stdin.write(_config(port, engine_port, store, workers).encode())
        process.stdin.close()
    else:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "polar", "gateway", "--port", str(port),
                "--admin-token", ADMIN, "--engine-url", f"http://127.0.0.1:{engine_port}",
                "--engine-model", "m", "--store", str(store), "--log-level", "error",
            ],
            cwd=ROOT,
        )  # fmt: skip
    return Target(name, port, process, routed)


def _body(size: str, stream: bool, n: int) -> bytes:
    if size == "small":
        messages = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "hi"},
        ]
    else:  # agent-sized: ~150 KB of history (~37k prompt ids from the fake engine)
        messages = [{"role": "system", "content": "You are a coding agent. " * 400}]
        for turn in range(24):
            messages.append({"role": "user", "content": f"step {turn} {n}: " + "output\n" * 700})
            messages.append({"role": "assistant", "content": "w" * OUTPUT_TOKENS})
        messages.append({"role": "user", "content": "go on"})
    return json.dumps(
        {
            "model": "m",
            "messages": messages,
            "stream": stream,
            "max_tokens": OUTPUT_TOKENS,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        }
    ).encode()


async def _batch(port: int, keys: list[str], calls: int, size: str, stream: bool) -> list[float]:
    totals: list[float] = []

    async def session(n: int, key: str) -> None:
        conn = Connection(port)
        body = _body(size, stream, n)
        for _ in range(calls):
            _, total, _ = await conn.post(
                "/v1/chat/completions", body, {"authorization": f"Bearer {key}"}
            )
            totals.append(total)
        assert conn.writer is not None
        conn.writer.close()

    await asyncio.gather(*(session(n, k) for n, k in enumerate(keys)))
    return totals


@dataclass
class Tally:
    calls: int = 0
    wall_s: float = 0.0
    router_s: float = 0.0
    workers_s: float = 0.0
    latencies: list[float] = field(default_factory=list)


def _run(target: Target, tally: Tally, sessions: int, calls: int, size: str, stream: bool) -> None:
    router0, workers0 = target.cpu()
    start = time.perf_counter()
    got = asyncio.run(_batch(target.port, target.keys[:sessions], calls, size, stream))
    tally.wall_s += time.perf_counter() - start
    router1, workers1 = target.cpu()
    tally.calls += len(got)
    tally.router_s += router1 - router0
    tally.workers_s += workers1 - workers0
    tally.latencies += got


def main(counts: list[int], sessions: int, calls: int, rounds: int) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="polar-bench-workers-"))
    engine_port = _free_port()
    engine = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gateway.py"),
            "--serve-engine",
            str(engine_port),
        ]
    )
    targets = [_start("1 worker", engine_port, workdir, 1, routed=False)]
    targets.append(_start("1 + router", engine_port, workdir, 1, routed=True))
    for n in counts:
        if n > 1:
            targets.append(_start(f"{n} + router", engine_port, workdir, n, routed=True))
    try:
        for target in targets:
            target.ready(sessions)
        print(
            f"cores={os.cpu_count()}, load average {os.getloadavg()[0]:.1f}; {sessions} sessions "
            f"x {calls} calls back to back per round, {rounds} rounds alternating; "
            f"{OUTPUT_TOKENS} output tokens per call; engine-rendered capture"
        )
        print(
            f"{'load':<7}{'mode':<7}{'target':<13}{'calls/s':>9}{'x 1 worker':>11}"
            f"{'p50 ms':>9}{'router CPU s/1k':>17}{'workers CPU s/1k':>18}"
        )
        loads = [
            ("small", False, calls),
            ("small", True, calls),
            ("agent", False, max(1, calls // 8)),
        ]
        for size, stream, n_calls in loads:
            tallies = {t.name: Tally() for t in targets}
            for target in targets:  # warm-up, not counted
                _run(target, Tally(), sessions, 1, size, stream)
            for _ in range(rounds):
                for target in targets:
                    _run(target, tallies[target.name], sessions, n_calls, size, stream)
            base = tallies["1 worker"].calls / tallies["1 worker"].wall_s
            for target in targets:
                tally = tallies[target.name]
                rate = tally.calls / tally.wall_s
                router = (
                    f"{1000 * tally.router_s / tally.calls:>17.3f}"
                    if target.routed
                    else "-".rjust(17)
                )
                print(
                    f"{size:<7}{'stream' if stream else 'whole':<7}{target.name:<13}"
                    f"{rate:>9.0f}{rate / base:>10.2f}x{_pct(tally.latencies, 0.5):>9.2f}"
                    f"{router}{1000 * tally.workers_s / tally.calls:>18.3f}"
                )
        # The hop alone: one session, calls one after another.
        lone, routed = targets[0], targets[1]
        for size in ("small", "agent"):
            hop = {lone.name: Tally(), routed.name: Tally()}
            for _ in range(rounds * 2):
                for target in (lone, routed):
                    _run(target, hop[target.name], 1, 50 if size == "small" else 10, size, False)
            p_lone = _pct(hop[lone.name].latencies, 0.5)
            p_routed = _pct(hop[routed.name].latencies, 0.5)
            router_ms = 1000 * hop[routed.name].router_s / hop[routed.name].calls
            print(
                f"hop, {size} calls, one session: p50 {p_lone:.2f} ms alone, {p_routed:.2f} ms "
                f"through the router (+{p_routed - p_lone:.2f} ms); router CPU "
                f"{router_ms:.3f} ms per call"
            )
    finally:
        for target in targets:
            target.process.terminate()
        for target in targets:
            target.process.wait(30)
        engine.terminate()
        engine.wait(10)
