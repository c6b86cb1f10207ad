"""Sessions per minute on one node: staged worker pools vs a naive loop.

    .venv/bin/python benchmarks/rollout.py [--sessions 16] [--workers 4]
        [--prepare-s 2] [--calls 3] [--tool-s 1] [--tokens 40] [--token-delay-s 0.01]

Every session is real: the task's workspace is copied, a bubblewrap sandbox
starts, the task's set-up runs (``sleep --prepare-s``, standing in for a repo
install or an image pull), the agent (a small Python process run by the
``shell`` harness) runs ``--calls`` steps, each a ``--tool-s`` tool and a chat
call through the real gateway to the scripted engine (``--tokens`` tokens at
``--token-delay-s`` each), the
trajectory is built, the ``command`` evaluator scores it, and the sandbox is
torn down. Only the model is scripted.

Three ways to run the same N sessions, side by side in one process:

* ``sequential``: one session at a time, every stage inline;
* ``naive xW``: W workers, each running its sessions' stages inline (the
  runtime is prepared while an agent slot waits);
* ``staged xW``: the node's pipeline: W agent slots, preparation in its own
  pool (W slots) up to W sessions ahead of a free agent slot, build +
  evaluate in their own pool (2 slots).

It prints sessions/min, the agent slots' utilisation (time agents ran / (wall
x slots)), and how much of the preparation time was hidden behind running
agents.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvicorn

from polar.rollout.config import NodeConfig
from polar.rollout.deploy import listening_socket, node_service
from polar.rollout.node.lifecycle import NodeSession, Pipeline
from polar.rollout.protocol import HarnessSpec, NodeCapacity, SessionDispatch, SessionStatus
from polar.tasks.model import DirectoryWorkspace, EvaluatorSpec, Task
from polar.testing.scripted import ScriptedEngine, script_from_dict
from polar.tokenizer import load_tokenizer

AGENT = """
import json, os, sys, time, urllib.request
for i in range(int(sys.argv[1])):
    time.sleep(float(sys.argv[2]))  # the agent's tool call
    body = {"model": "m", "messages": [{"role": "user", "content": f"step {i}"}]}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "content-type": "application/json"})
    urllib.request.urlopen(request, timeout=120).read()
open("done", "w").write("1")
"""


def make_task(root: Path, prepare_s: float) -> Task:
    repo = root / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "agent.py").write_text(AGENT)
    (repo / "README.md").write_text("a benchmark task\n")
    return Task(
        id="bench",
        instruction="run the agent",
        workspace=DirectoryWorkspace(path=repo),
        setup=(f"sleep {prepare_s}",),
        evaluator=EvaluatorSpec(kind="command", config={"command": "test -f done"}),
    )


async def run_mode(
    base: Pipeline, mode: str, workers: int, sessions: list[SessionDispatch]
) -> dict[str, Any]:
    if mode == "staged":
        capacity = NodeCapacity(prepare=workers, run=workers, postrun=2, ahead=workers)
    else:
        big = len(sessions) + 1
        capacity = NodeCapacity(prepare=big, run=big, postrun=big, ahead=0)
    pipeline = Pipeline(dataclasses.replace(base.settings, capacity=capacity), base.gateway)
    states = [NodeSession(dispatch=d) for d in sessions]
    started = time.monotonic()
    if mode == "staged":
        results = await asyncio.gather(*(pipeline.run(s) for s in states))
    else:
        queue = list(states)
        results = []

        async def worker() -> None:
            while queue:
                results.append(await pipeline.run(queue.pop(0)))

        await asyncio.gather(*(worker() for _ in range(workers)))
    wall = time.monotonic() - started
    failed = [r for r in results if r.status is not SessionStatus.COMPLETED or r.reward != 1.0]
    if failed:
        raise SystemExit(f"{mode}: {len(failed)} sessions failed: {failed[0].error}")
    running = sum(r.timings.get("running", 0.0) for r in results)
    preparing = sum(r.timings.get("preparing", 0.0) for r in results)
    return {
        "wall_s": wall,
        "per_min": len(results) / wall * 60,
        "utilisation": running / (wall * workers),
        "prepare_s": statistics.mean(r.timings.get("preparing", 0.0) for r in results),
        "run_s": statistics.mean(r.timings.get("running", 0.0) for r in results),
        "post_s": statistics.mean(
            r.timings.get("building", 0.0) + r.timings.get("evaluating", 0.0) for r in results
        ),
        "prepare_total_s": preparing,
        "running_total_s": running,
    }


async def main(args: argparse.Namespace) -> None:
    tokenizer = load_tokenizer()
    modes = [("sequential", 1), ("naive", args.workers), ("staged", args.workers)]
    total = args.sessions * len(modes)
    words = " ".join(["word"] * args.tokens)
    script = {"sessions": [{"turns": [{"text": words}] * args.calls}] * total}
    engine = ScriptedEngine(
        script_from_dict(script), tokenizer, token_delay_s=args.token_delay_s
    ).start()
    with tempfile.TemporaryDirectory(prefix="polar-bench-") as tmp:
        root = Path(tmp)
        task = make_task(root, args.prepare_s)
        config = NodeConfig.model_validate(
            {
                "control_token": "benchmark-control-token-0123",
                "sessions_dir": str(root / "sessions"),
                "files_dir": str(root / "files"),
                "keep_sessions": "never",
                "harness_cache": str(root / "harness"),
                "gateway": {
                    "admin_token": "benchmark-admin-token-0123",
                    "capture": "token_in_token_out",
                    "port": 0,
                    "engine": {"kind": "vllm", "base_url": engine.url, "model": "scripted"},
                    "store": {"path": str(root / "records.db")},
                },
            }
        )
        service = node_service(config)
        sock = listening_socket("127.0.0.1", 0)
        service.bind(*sock.getsockname()[:2])
        server = uvicorn.Server(
            uvicorn.Config(service.app, log_level="warning", lifespan="on", loop="asyncio")
        )
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        # uvicorn offers no event to wait on
        while not server.started:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        try:
            harness = HarnessSpec(
                name="shell", options={"command": f"python3 agent.py {args.calls} {args.tool_s}"}
            )
            print(
                f"{args.sessions} sessions per mode; set-up {args.prepare_s:g} s; agent: "
                f"{args.calls} x ({args.tool_s:g} s tool + a call of {args.tokens} tokens "
                f"at {args.token_delay_s * 1000:g} ms)"
            )
            print(
                f"{'mode':<14}{'wall s':>8}{'sess/min':>10}{'agent util':>12}"
                f"{'prepare s':>11}{'run s':>8}{'post s':>8}"
            )
            rows: dict[str, dict[str, Any]] = {}
            counter = 0
            for mode, workers in modes:
                dispatches = []
                for _ in range(args.sessions):
                    dispatches.append(
                        SessionDispatch(
                            session_id=f"bench-{counter}",
                            task_id="bench",
                            sample_index=counter,
                            task=task,
                            harness=harness,
                            builder="prefix_merge",
                            session_timeout_s=300,
                            group_id="bench",
                        )
                    )
                    counter += 1
                row = await run_mode(service.node.pipeline, mode, workers, dispatches)
                label = mode if mode == "sequential" else f"{mode} x{workers}"
                rows[label] = row
                print(
                    f"{label:<14}{row['wall_s']:>8.1f}{row['per_min']:>10.1f}"
                    f"{row['utilisation']:>12.0%}{row['prepare_s']:>11.2f}"
                    f"{row['run_s']:>8.2f}{row['post_s']:>8.2f}"
                )
            naive = rows[f"naive x{args.workers}"]
            staged = rows[f"staged x{args.workers}"]
            sequential = rows["sequential"]
            # Preparation hidden: of the time a naive worker spends preparing (its agent
            # slot idle), how much the staged pipeline saved on the wall clock.
            exposed = naive["prepare_total_s"] / args.workers
            saved = naive["wall_s"] - staged["wall_s"]
            print(
                f"staged vs sequential: {staged['per_min'] / sequential['per_min']:.2f}x "
                f"sessions/min; staged vs naive x{args.workers}: "
                f"{staged['per_min'] / naive['per_min']:.2f}x"
            )
            print(
                f"preparation on the naive workers' critical path: {exposed:.1f} s; "
                f"the staged pipeline finished {saved:.1f} s sooner "
                f"({saved / exposed:.0%} of it hidden)"
            )
        finally:
            server.should_exit = True
            with contextlib.suppress(Exception):
                await serving
            engine.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--prepare-s", type=float, default=2.0)
    parser.add_argument("--tool-s", type=float, default=1.0)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--token-delay-s", type=float, default=0.01)
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
