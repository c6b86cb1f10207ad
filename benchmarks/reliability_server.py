"""``reliability.py kill-server``: ``kill -9`` of the rollout server mid-task.

Real processes only: a ``polar engine scripted`` process (the model), a
``polar serve`` process (the rollout server and its own node, ``head``) and a
``polar node`` process (``worker``) joined to it. Each round submits tasks
whose ``--sessions`` sessions all run at once, split over the two nodes, and
``--queued`` more that wait for a free slot. Each session is a real bubblewrap
sandbox where a small agent run by the ``shell`` harness makes a few chat calls
through its node's gateway, and the ``command`` evaluator scores it. At a
random moment (seeded) the ``polar serve`` process is killed with SIGKILL (the
server and the head node with it; the head's sandboxes die with it) and
started again on the same database and ports.

Checks per round: every session of every task ends (no task stuck), each one
either completed with reward 1 or ended with its reason; sessions the worker
node was running when the server died are resumed (their results taken by the
new server), and queued ones are dispatched by it; no sandbox process of the
killed node is left; the server's database passes ``PRAGMA integrity_check``.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import orjson
import yaml

from polar.rollout.client import RolloutClient, RolloutError
from polar.rollout.protocol import HarnessSpec, SessionStatus, TaskSubmission, TaskView
from polar.tasks.model import DirectoryWorkspace, EvaluatorSpec, Task
from reliability_parts import free_port, wait_for
from rollout import AGENT  # steps of: a pause (its tool), then a chat call

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-control-token-0123456789"


def _node_section(root: Path, name: str, engine_url: str, run: int) -> dict[str, object]:
    return {
        "node_id": name,
        "heartbeat_interval_s": 0.5,
        "result_retry_s": 0.2,
        "sessions_dir": str(root / name / "sessions"),
        "files_dir": str(root / name / "files"),
        "harness_cache": str(ROOT / ".cache" / "harness"),
        "keep_sessions": "never",
        "capacity": {"prepare": 4, "run": run, "postrun": 4, "ahead": 0},
        "gateway": {
            "port": free_port(),
            "engine": {"base_url": engine_url, "model": "scripted"},
            "store": {"path": str(root / name / "records.db")},
        },
        "control_port": free_port(),
    }


def _start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def _sandboxes(needle: str) -> list[int]:
    """Host pids whose command line names ``needle`` (a node's sessions directory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if needle in cmdline:
                pids.append(int(entry.name))
    return pids


def kill_server(
    rounds: int, sessions: int, queued: int, seed: int, calls: int, pause_s: float
) -> None:
    rng = random.Random(seed)
    print(
        f"seed {seed}, {rounds} rounds, {sessions} concurrent sessions per round and {queued} "
        f"more queued behind them ({calls} chat calls each, {pause_s} s apart), "
        "kill -9 of `polar serve`"
    )
    polar = [sys.executable, "-m", "polar"]
    root = Path(ROOT / "runs" / "bench-kill-server")
    if root.exists():
        subprocess.run(["rm", "-rf", str(root)], check=True)
    root.mkdir(parents=True)
    (root / "agent").mkdir()
    (root / "agent" / "agent.py").write_text(AGENT)
    script = root / "script.json"
    script.write_bytes(orjson.dumps({"turns": [{"text": "ok"}], "cycle": True}))
    engine_port = free_port()
    engine = _start(
        [*polar, "engine", "scripted", "--script", str(script), "--port", str(engine_port)],
        root / "engine.log",
    )
    engine_url = f"http://127.0.0.1:{engine_port}"
    wait_for(f"{engine_url}/v1/models")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    half = (sessions + 1) // 2
    serve_yaml = root / "serve.yaml"
    serve_yaml.write_text(
        yaml.safe_dump(
            {
                "server": {"port": port, "db": str(root / "rollout.db"), "node_timeout_s": 3.0},
                "node": _node_section(root, "head", engine_url, half),
            }
        )
    )
    node_yaml = root / "node.yaml"
    node_yaml.write_text(
        yaml.safe_dump({"server_url": url, **_node_section(root, "worker", engine_url, half)})
    )
    serve_cmd = [*polar, "serve", "-c", str(serve_yaml), "--token", TOKEN, "--log-level", "warning"]
    node_cmd = [*polar, "node", "-c", str(node_yaml), "--token", TOKEN, "--log-level", "warning"]
    serve = _start(serve_cmd, root / "serve.log")
    wait_for(f"{url}/health")
    worker = _start(node_cmd, root / "node.log")
    client = RolloutClient(url, token=TOKEN, timeout_s=10)
    deadline = time.monotonic() + 60
    while len(client.nodes()) < 2:
        if time.monotonic() > deadline:
            raise SystemExit("the nodes did not register")
        time.sleep(0.2)
    task = Task(
        id="kill-server",
        instruction="run the agent",
        workspace=DirectoryWorkspace(path=root / "agent"),
        evaluator=EvaluatorSpec(kind="command", config={"command": "test -f done"}),
    )
    harness = HarnessSpec(name="shell", options={"command": f"python3 agent.py {calls} {pause_s}"})
    per_task = 8
    print(
        f"{'round':>5} {'kill at s':>9} {'running head/worker':>19} {'completed':>9} "
        f"{'resumed':>7} {'queued':>6} {'failed':>6} {'stuck':>5} {'orphans':>7} "
        f"{'round s':>7} {'ok':>3}"
    )
    reasons: Counter[str] = Counter()
    all_ok = True
    for round_ in range(1, rounds + 1):
        started = time.monotonic()
        task_ids = []
        for n in range(0, sessions + queued, per_task):
            submission = TaskSubmission(
                task=task, harness=harness, num_samples=min(per_task, sessions + queued - n),
                session_timeout_s=120,
            )  # fmt: skip
            task_ids.append(client.submit(submission).task_id)
        kill_at = rng.uniform(1.0, 2.0 + calls * pause_s)
        time.sleep(kill_at)
        views = [client.task(t) for t in task_ids]
        running: dict[str, str] = {
            s.session_id: s.node_id or "-"
            for v in views
            for s in v.sessions
            if not s.status.terminal and s.node_id
        }
        waiting = sum(1 for v in views for s in v.sessions if s.status is SessionStatus.QUEUED)
        serve.send_signal(signal.SIGKILL)
        serve.wait()
        time.sleep(0.5)
        orphans = _sandboxes(str(root / "head" / "sessions"))
        serve = _start(serve_cmd, root / "serve.log")
        wait_for(f"{url}/health")
        stuck = 0
        results = []
        for tid in task_ids:
            try:
                results.append(client.wait(tid, timeout_s=180))
            except (RolloutError, TimeoutError, httpx.HTTPError) as exc:
                stuck += 1
                print(f"   task {tid} did not finish: {exc}")
        completed = failed = resumed = silent = 0
        for result in results:
            for r in result.results:
                if r.status is SessionStatus.COMPLETED and r.reward == 1.0:
                    completed += 1
                    resumed += running.get(r.session_id) == "worker"
                elif r.status is not SessionStatus.COMPLETED and r.error:
                    failed += 1
                    reasons[f"{r.status.value}: {_shape(r.error)}"] += 1
                else:
                    silent += 1
                    print(f"   {r.session_id}: {r.status.value}, reward {r.reward}, no reason")
        on_head = sum(1 for n in running.values() if n == "head")
        ok = not stuck and not silent and not orphans
        ok &= completed + failed == sessions + queued
        all_ok &= ok
        print(
            f"{round_:>5} {kill_at:>9.1f} {f'{on_head}/{len(running) - on_head}':>19} "
            f"{completed:>9} {resumed:>7} {waiting:>6} {failed:>6} {stuck:>5} {len(orphans):>7} "
            f"{time.monotonic() - started:>7.1f} {'yes' if ok else 'NO':>3}"
        )
    final = client.tasks()
    client.close()
    for proc in (worker, serve, engine):
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    with sqlite3.connect(root / "rollout.db") as conn:
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
    print(f"tasks on the server: {len(final)}, {Counter(v.status.value for v in final)}")
    print(f"rollout database integrity: {integrity}")
    for reason, count in reasons.most_common():
        print(f"   {count:>4} x {reason}")
    all_ok &= integrity == "ok" and all(_done(v) for v in final)
    print("all rounds ok" if all_ok else "SOME ROUND FAILED")
    if not all_ok:
        raise SystemExit(1)


def _done(view: TaskView) -> bool:
    return view.status.value != "running" and all(s.status.terminal for s in view.sessions)


def _shape(error: str) -> str:
    """An error with its session id taken out, so equal reasons count together."""
    return " ".join("<id>" if "-s" in word else word for word in error.split())[:100]
