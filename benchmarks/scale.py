"""Scaling out: sessions per minute against gateway-node actors on Ray, and engine-pool affinity.

    .venv/bin/python benchmarks/scale.py [--actors 1,2,4] [--sessions 24] [--calls 2]
        [--tool-s 1.0] [--run-slots 2] [--pool-engines 3] [--pool-sessions 48]
        [--pool-calls 8] [--seed 0]

**Part 1, actors.** For each count N in ``--actors``, in one run: a Ray cluster of one
machine (this one) with N ``sandbox`` units, ``polar serve --backend ray --ray-nodes N``
as a real subprocess, the scripted engine in this process; ``--sessions`` real sessions
(bubblewrap sandbox, the ``shell`` harness's small agent making ``--calls`` chat calls
with a ``--tool-s`` pause before each, the trajectory built, the ``command`` evaluator)
submitted as groups of 4. It prints sessions/min, the agent slots (N x ``--run-slots``),
and what the rollout server process (scheduler, API, Ray driver) spent: its CPU seconds
per session, read from ``/proc``, and the share of the wall clock that is. The
scheduler is not the bottleneck when its CPU share stays small while sessions/min grows
with the slots (on this 2-core machine the sandboxes saturate the cores first).

**Part 2, engine pool.** A gateway in this process over ``--pool-engines`` scripted
engines (``engine.pool``); ``--pool-sessions`` sessions make ``--pool-calls`` calls
each, all at once; half-way one engine is stopped. It prints, from what each engine
received: the share of a session's calls served by the engine its first call went to
(before and after the stop), sessions per engine, and the calls that failed (the
gateway retries a refused call on another engine, so none should).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import yaml

from polar.proxy.app import create_app
from polar.proxy.call.capture import build_capture
from polar.proxy.config import GatewayConfig
from polar.proxy.engines.vllm_process import free_port
from polar.proxy.gateway import Gateway
from polar.rollout.client import RolloutClient, RolloutError
from polar.rollout.protocol import HarnessSpec, SessionStatus, TaskSubmission
from polar.serverthread import ServerThread
from polar.testing.scripted import ScriptedEngine, script_from_dict
from polar.tokenizer import load_tokenizer
from rollout import make_task

REPO = Path(__file__).resolve().parents[1]
TOKEN = "scale-benchmark-token-0123456789"
OK = {"turns": [{"text": "ok"}], "cycle": True}
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its reaped children (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / TICKS


# ---------------------------------------------------------------- part 1: node actors


def run_actors(n: int, args: argparse.Namespace, engine_url: str, root: Path) -> dict[str, Any]:
    from ray.cluster_utils import Cluster

    root.mkdir(parents=True)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 64,  # logical: node actors reserve none; sandboxes use the real cores
            "resources": {"sandbox": n},
            "include_dashboard": False,
        },
    )
    port = free_port()
    config = {
        "backend": "ray",
        "ray": {"address": cluster.address, "nodes": n, "num_cpus": 0, "sandbox": 1},
        "server": {"port": port, "db": str(root / "rollout.db"), "node_timeout_s": 60},
        "node": {
            "node_id": "scale",
            "control_token": TOKEN,
            "sessions_dir": str(root / "sessions"),
            "files_dir": str(root / "files"),
            "harness_cache": str(REPO / ".cache" / "harness"),
            "keep_sessions": "never",
            "heartbeat_interval_s": 1.0,
            "capacity": {"run": args.run_slots, "ahead": args.run_slots},
            "limits": {"workspace_mb": None},
            "gateway": {
                "capture": "token_in_token_out",
                "admin_token": TOKEN,
                "engine": {"kind": "vllm", "base_url": engine_url, "model": "scripted"},
                "store": {"path": str(root / "records.db")},
            },
        },
    }
    (root / "serve.yaml").write_text(yaml.safe_dump(config))
    log = (root / "serve.log").open("w")
    serve = subprocess.Popen(
        [sys.executable, "-m", "polar", "serve", "-c", str(root / "serve.yaml")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        with RolloutClient(f"http://127.0.0.1:{port}", token=TOKEN) as client:
            deadline = time.monotonic() + 300
            while True:
                if serve.poll() is not None:
                    raise SystemExit((root / "serve.log").read_text()[-3000:])
                with contextlib.suppress(RolloutError):
                    if len(client.nodes()) == n:
                        break
                if time.monotonic() > deadline:
                    raise SystemExit(f"{n} node actors did not register in 300 s")
                time.sleep(0.5)
            task = make_task(root / "task", 0.0)
            harness = HarnessSpec(
                name="shell",
                options={"command": f"python3 agent.py {args.calls} {args.tool_s}"},
            )
            cpu_before, started = cpu_seconds(serve.pid), time.monotonic()
            ids = [
                client.submit(TaskSubmission(task=task, harness=harness, num_samples=4)).task_id
                for _ in range(args.sessions // 4)
            ]
            results = [client.wait(task_id, timeout_s=1800) for task_id in ids]
            wall = time.monotonic() - started
            server_cpu = cpu_seconds(serve.pid) - cpu_before
    finally:
        serve.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            serve.wait(timeout=60)
        log.close()
        cluster.shutdown()
    sessions = [r for result in results for r in result.results]
    failed = [r for r in sessions if r.status is not SessionStatus.COMPLETED or r.reward != 1.0]
    if failed:
        raise SystemExit(f"{n} actors: {len(failed)} sessions failed: {failed[0].error}")
    per_node = Counter(r.node_id for r in sessions)
    return {
        "actors": n,
        "slots": n * args.run_slots,
        "sessions": len(sessions),
        "wall_s": wall,
        "per_min": len(sessions) / wall * 60,
        "server_cpu_per_session_ms": server_cpu / len(sessions) * 1000,
        "server_cpu_share": server_cpu / wall,
        "spread": sorted(per_node.values()),
    }


# ---------------------------------------------------------------- part 2: engine pool


async def pool_affinity(args: argparse.Namespace, tokenizer: Any, root: Path) -> dict[str, Any]:
    engines = [
        ScriptedEngine(script_from_dict(OK), tokenizer).start() for _ in range(args.pool_engines)
    ]
    urls = [engine.url for engine in engines]
    config = GatewayConfig.model_validate(
        {
            "admin_token": TOKEN,
            "capture": "token_in_token_out",
            "engine": {
                "kind": "vllm",
                "base_url": urls[0],
                "pool": urls[1:],
                "model": "scripted",
                "retry_backoff_s": 0.01,
            },
            "store": {"path": str(root / "pool-records.db")},
        }
    )
    server = ServerThread(create_app(Gateway(config, capture=build_capture(config)))).start()
    rng = random.Random(args.seed)
    failures = 0
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            auth = {"authorization": f"Bearer {TOKEN}"}
            keys: dict[str, str] = {}
            for _ in range(args.pool_sessions):
                reply = await http.post("/admin/sessions", json={}, headers=auth)
                body = reply.json()
                keys[body["session_id"]] = body["api_key"]

            async def calls(key: str, count: int) -> None:
                nonlocal failures
                for _ in range(count):
                    await asyncio.sleep(rng.uniform(0, 0.05))
                    reply = await http.post(
                        "/v1/chat/completions",
                        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                        headers={"authorization": f"Bearer {key}"},
                    )
                    failures += reply.status_code != 200

            # First calls one at a time, so each session's first engine is known.
            for key in keys.values():
                await calls(key, 1)
            first = {
                session: engine.url
                for engine in engines
                for session in engine.sessions
                if session is not None
            }
            half = args.pool_calls // 2
            await asyncio.gather(*(calls(key, half - 1) for key in keys.values()))
            before = _served(engines, urls)
            stopped = urls[-1]
            engines[-1].stop()
            await asyncio.gather(*(calls(key, args.pool_calls - half) for key in keys.values()))
            after = _served(engines, urls)
    finally:
        server.stop()
        for engine in engines:
            engine.stop()
    return {
        "engines": urls,
        "stopped": stopped,
        "before": _affinity(before, first),
        "after": _affinity(after, first),
        "sessions_per_engine": dict(sorted(Counter(first.values()).items())),
        "failed_calls": failures,
    }


def _served(engines: list[ScriptedEngine], urls: list[str]) -> dict[str, Counter[str]]:
    """Calls received so far, per engine URL and session (a stopped engine keeps its count)."""
    return {
        url: Counter(s for s in e.sessions if s is not None)
        for e, url in zip(engines, urls, strict=True)
    }


def _affinity(served: dict[str, Counter[str]], first: dict[str, str]) -> float:
    """The share of all calls that went to their session's first engine."""
    total = sum(sum(counts.values()) for counts in served.values())
    home = sum(served[url][session] for session, url in first.items())
    return home / total if total else 0.0


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", default="1,2,4")
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--tool-s", type=float, default=1.0)
    parser.add_argument("--run-slots", type=int, default=2)
    parser.add_argument("--pool-engines", type=int, default=3)
    parser.add_argument("--pool-sessions", type=int, default=48)
    parser.add_argument("--pool-calls", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tokenizer = load_tokenizer(None)
    with tempfile.TemporaryDirectory(prefix="polar-scale-") as tmp:
        root = Path(tmp)
        print(f"seed {args.seed}; {os.cpu_count()} cores")
        affinity = asyncio.run(pool_affinity(args, tokenizer, root))
        print(
            f"engine pool: {len(affinity['engines'])} engines, {args.pool_sessions} sessions x "
            f"{args.pool_calls} calls; sessions per engine {affinity['sessions_per_engine']}\n"
            f"  share of a session's calls on its first engine: "
            f"{affinity['before']:.3f} before stopping one engine, "
            f"{affinity['after']:.3f} over the whole run; failed calls {affinity['failed_calls']}"
        )
        engine = ScriptedEngine(script_from_dict(OK), tokenizer).start()
        rows = []
        try:
            for n in (int(v) for v in args.actors.split(",")):
                row = run_actors(n, args, engine.url, root / f"actors-{n}")
                rows.append(row)
                print(
                    f"{n} node actor(s), {row['slots']} agent slots: {row['sessions']} sessions "
                    f"in {row['wall_s']:.1f} s = {row['per_min']:.1f}/min; sessions per node "
                    f"{row['spread']}; rollout server CPU {row['server_cpu_per_session_ms']:.0f} "
                    f"ms/session ({row['server_cpu_share']:.1%} of the wall clock)",
                    flush=True,
                )
        finally:
            engine.stop()
        base = rows[0]["per_min"]
        print("sessions/min relative to 1 actor: " + ", ".join(
            f"{r['actors']}: x{r['per_min'] / base:.2f}" for r in rows
        ))  # fmt: skip


if __name__ == "__main__":
    main()
