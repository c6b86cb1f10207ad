"""The toy learning benchmark: SFT warm start, then GRPO through the whole stack,
on a task family meant for a tiny random model on a CPU (the real-model
benchmark is ``benchmarks/learning.py``).

    .venv/bin/python benchmarks/learning_toy.py [--small] [--out runs/learning]

Everything is real except the model's size: the ``shell`` harness preset runs
a small agent program (``AGENT`` below, standard library only) in a bubblewrap
sandbox of the ``local`` runtime on a gateway node; the gateway runs in
token-in/token-out mode; the rollout server groups the sessions; each task's
``command`` evaluator scores the answer file; ``prefix_merge`` builds the
samples; the reference trainer (:func:`polar.train.trainer.train`) steps GRPO
and pushes every new version of the weights to the embedded engine through the
gateway's pause/drain.

Why the ``shell`` preset and not mini-swe-agent: mini-swe-agent's system and
instance prompts are about 1,500 tokens of instructions that a 9.8 M-parameter
model cannot follow, and its protocol (a bash tool call, then a second call
that submits) would make the task about format rather than the answer; the
``shell`` preset is the product's own harness for "any agent program".

The task family (``make_tasks``): "The secret number of <name> is <d>.
Answer with the number only." Instances are (name, digit) pairs; a seeded
split holds some pairs out (every digit and every name is seen in training,
never the held-out pair). The reward (``SCORER``, run by the task's
``command`` evaluator) is 1 for exactly ``<d>``, 0.25 for the right number
among other words ("7 is the number."), 0 otherwise. Two skills make a
reward of 1: copying the digit (specific to each instance) and stopping after
it, as the instruction asks (one behaviour shared by every instance). A random
model never answers a bare digit, so:

1. **SFT data through the same pipeline** (:class:`polar.sft.Generation`): a
   scripted expert (the scripted engine) answers every training task; it says
   the right digit on ``--expert-accuracy`` of the attempts and a wrong one
   otherwise, and on ``--expert-bare`` of them the digit alone, else the digit
   followed by " is the number."; the rollout service runs and scores each
   attempt; the acceptance rule ``reward > 0`` keeps the right numbers in
   either form; the token export is the SFT data.
2. **Warm start**: :func:`polar.sft.finetune`. It learns to copy the digit,
   and it imitates the expert's mixture of forms, many of its answers carrying
   the extra words, so its reward starts low although the number is mostly
   right (an exact imitation of ``--expert-bare 0.3`` would score 0.3 + 0.7 x
   0.25 = 0.475 with every number right; the warm start's own mixture varies
   with the seed, so this is no bound).
3. **GRPO**: the reference trainer, groups of ``--group-size`` sessions,
   asynchronous (``max_inflight_groups`` above ``groups_per_step``), held-out
   and a fixed subset of training tasks evaluated every ``--eval-every`` steps
   through the same rollout service (sampled at temperature 1, like training).
   Within a group, the answers that stop after the digit score above those
   that do not, on every task alike: GRPO moves the shared behaviour the
   warm start samples too rarely, and held-out instances gain with the
   training ones.

Outputs under ``--out``: ``learning.json`` (settings, the SFT statistics, the
SFT-only baseline, per-step figures, the exact-answer fraction beside each
mean reward, wall times) and ``learning.png`` (mean reward per step on
training groups, on the training-task evaluation and on held-out instances,
against the SFT-only baseline).

Measured here (default settings, seed 0, 2 shared cores under load; figures
and plot in ``docs/figures/learning-toy.{json,png}``): 85 of 110 expert attempts
accepted, 24 of them bare; the warm start scores 0.41 on held-out instances
(exact answers 0.23: the number is right in about 95 % of its answers, bare in
a quarter) and 0.58 on the training-task evaluation; held-out evaluations at
GRPO steps 0, 6, 12, 18, 24, 30: 0.41, 0.98, 0.93, 0.80, 0.80, 0.93 (40
sessions each; after step 6 every right number is bare, the errors left are
wrong digits). 33 minutes in all (24 of them GRPO, 20-50 s a step with the
machine's load). What GRPO learns in this benchmark is the instruction's form,
a behaviour every instance shares; the copy skill comes from SFT. Seed 1
(``docs/figures/learning-toy-seed1.{json,png}``): warm start 0.55, above the 0.5
asked for, then 0.46, 0.73, 0.93, 0.66, 0.85 (35 minutes). An earlier
design (reward 1 only for the exact digit, the expert always bare, 130 SFT
steps) did not learn: the copy skill forms late and abruptly in SFT, a warm
start at 0.5 sat in the middle of that transition, and 30 GRPO steps of 4
tasks each did not move it (held-out 0.50 -> 0.55).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TOKEN = "learning-benchmark-control-token"
NAMES = [
    "ada",
    "alan",
    "bob",
    "carol",
    "dave",
    "erin",
    "frank",
    "grace",
    "heidi",
    "ivan",
    "judy",
    "karl",
    "lena",
    "mike",
    "nina",
    "oscar",
    "paul",
    "quinn",
    "rosa",
    "sam",
]

AGENT = """\
import json, os, sys, urllib.request

body = {
    "model": os.environ["OPENAI_MODEL"],
    "messages": [{"role": "user", "content": sys.argv[1]}],
    "max_tokens": 12,
    "temperature": 1.0,
}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "content-type": "application/json"},
)
with urllib.request.urlopen(request, timeout=300) as reply:
    message = json.load(reply)["choices"][0]["message"]
open("answer.txt", "w").write(message.get("content") or "")
"""
"""The agent: one chat call with the instruction, the answer's content to a file."""

SCORER = (
    'python3 -c \'import re, sys; a = open("answer.txt").read().strip(); d = sys.argv[1]; '
    'r = "1" if a == d else "0.25" if re.findall("[0-9]+", a) == [d] else "0"; '
    'open("reward.txt", "w").write(r)\' {answer}'
)
"""Reward 1 for exactly the number, 0.25 for the right number with other words
around it (the instruction asks for the number only), 0 otherwise."""


# ---------------------------------------------------------------- the task family


def instruction(name: str, digit: int) -> str:
    return f"The secret number of {name} is {digit}. Answer with the number only."


def task_row(workspace: Path, name: str, digit: int) -> dict[str, Any]:
    return {
        "id": f"{name}-{digit}",
        "instruction": instruction(name, digit),
        "workspace": {"kind": "directory", "path": str(workspace)},
        "evaluator": {
            "kind": "command",
            "config": {"command": SCORER.format(answer=digit), "reward_file": "reward.txt"},
            "timeout_s": 60,
        },
        "metadata": {"name": name, "answer": str(digit)},
    }


def make_tasks(
    root: Path, *, names: int, heldout: int, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training and held-out task rows: every (name, digit) pair of the first
    ``names`` names, ``heldout`` pairs held out (seeded), so that each name and
    each digit still appears in training."""
    workspace = root / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "agent.py").write_text(AGENT)
    pairs = [(n, d) for n in NAMES[:names] for d in range(10)]
    rng = random.Random(seed)
    rng.shuffle(pairs)
    held: list[tuple[str, int]] = []
    for name, digit in pairs:
        if len(held) == heldout:
            break
        if all(name != n and digit != d for n, d in held):
            held.append((name, digit))
    train = [p for p in pairs if p not in held]
    return [task_row(workspace, *p) for p in train], [task_row(workspace, *p) for p in held]


def write_tasks(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


HARNESS = {"name": "shell", "options": {"command": "python3 agent.py {instruction}"}}


# ---------------------------------------------------------------- the rollout service


@contextmanager
def rollout_service(root: Path, engine: dict[str, Any], model: str) -> Iterator[tuple[str, str]]:
    """A rollout server and a gateway node (token-in/token-out, local sandbox)
    in this process; yields (server URL, gateway URL)."""
    from polar.rollout.config import NodeConfig, ServerConfig
    from polar.rollout.deploy import NodeThread, node_service
    from polar.rollout.server.app import create_server_app
    from polar.rollout.server.service import RolloutServer
    from polar.serverthread import ServerThread

    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    server_config = ServerConfig.model_validate(
        {"port": 0, "db": str(root / "rollout.db"), "control_token": TOKEN}
    )
    rollout = RolloutServer(server_config)
    server = ServerThread(create_server_app(rollout), port=0)
    rollout.public_url = server.url
    server.start()
    node_config = NodeConfig.model_validate(
        {
            "node_id": f"node-{root.name}",
            "server_url": server.url,
            "control_token": TOKEN,
            "sessions_dir": str(root / "sessions"),
            "harness_cache": str(REPO / ".cache" / "harness"),
            "keep_sessions": "never",
            "model": model,
            "capacity": {"run": 4, "ahead": 4, "prepare": 2, "postrun": 2},
            "gateway": {
                "port": 0,
                "admin_token": TOKEN,
                "capture": "token_in_token_out",
                "engine": engine,
                "store": {"path": str(root / "records.db")},
            },
        }
    )
    node = NodeThread(node_service(node_config)).start()
    try:
        yield server.url, node.gateway_url
    finally:
        node.stop()
        server.stop()


# ---------------------------------------------------------------- stage 1: SFT data


def expert_script(
    tasks: list[dict[str, Any]], attempts: int, accuracy: float, bare: float, seed: int
) -> Any:
    """The scripted expert: attempt ``k`` of each task says the right digit
    with probability ``accuracy`` (seeded), a wrong one otherwise; a right
    digit alone with probability ``bare``, else followed by " is the number."
    (the right number, but not the number only)."""
    rng = random.Random(seed)
    sessions = []
    for task in tasks:
        answer = int(task["metadata"]["answer"])
        for k in range(attempts):
            right = rng.random() < accuracy
            said = str(answer if right else (answer + rng.randint(1, 9)) % 10)
            if rng.random() >= bare:
                said += " is the number."
            sessions.append(
                {
                    "session": re.escape(f"sft.{task['id']}.a{k}-s0") + "$",
                    "turns": [{"text": said}],
                }
            )
    return {"sessions": sessions}


def generate_sft(
    root: Path, tokenizer: Any, tasks: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    from polar.rollout.client import RolloutClient
    from polar.sft import ExportFormat, GenerateConfig, Generation
    from polar.tasks.model import Task
    from polar.testing.scripted import ScriptedEngine, script_from_dict

    script = expert_script(
        tasks, args.sft_attempts, args.expert_accuracy, args.expert_bare, args.seed
    )
    engine = ScriptedEngine(script_from_dict(script), tokenizer).start()
    out = root / "sft-data"
    shutil.rmtree(out, ignore_errors=True)
    config = GenerateConfig.model_validate(
        {
            "out": str(out),
            "harness": HARNESS,
            "attempts": args.sft_attempts,
            "accept": "reward > 0",
            "session_timeout_s": 120,
            "max_in_flight": 8,
            "formats": [ExportFormat.JSONL],
        }
    )
    started = time.monotonic()
    try:
        with rollout_service(
            root / "sft-service",
            {"kind": "vllm", "base_url": engine.url, "model": "scripted"},
            "scripted",
        ) as (url, _):
            task_models = [Task.model_validate(t) for t in tasks]
            with (
                Generation(config, task_models, reattach=False) as generation,
                RolloutClient(url, token=TOKEN) as client,
            ):
                report = generation.run(client)
    finally:
        engine.stop()
    stats = json.loads((out / "stats.json").read_text())
    overall = stats.get("overall", stats)
    print(f"SFT data: {report.exports} ({time.monotonic() - started:.0f} s)", flush=True)
    return {"dir": str(out), "stats": overall, "seconds": time.monotonic() - started}


# ---------------------------------------------------------------- stage 2 and 3


def warm_start(root: Path, model: Path, data: str, args: argparse.Namespace) -> Path:
    from polar.sft import FinetuneConfig, finetune

    out = root / "warm"
    shutil.rmtree(out, ignore_errors=True)
    report = finetune(
        FinetuneConfig(
            data=Path(data),
            model=model,
            out=out,
            epochs=100,
            max_steps=args.sft_steps,
            batch_size=16,
            learning_rate=args.sft_lr,
            seed=args.seed,
            device="cpu",
        )
    )
    print(f"warm start: {report.steps} SFT steps on {report.rows} rows", flush=True)
    return out


def run_grpo(
    root: Path,
    warm: Path,
    train_file: Path,
    heldout_file: Path,
    train_eval: list[Any],
    args: argparse.Namespace,
) -> tuple[Any, list[dict[str, float]]]:
    from polar.proxy.engines.embedded import ModelRunner, create_engine_app
    from polar.rollout.client import RolloutClient
    from polar.serverthread import ServerThread
    from polar.train.config import TrainConfig
    from polar.train.evaluation import evaluate
    from polar.train.feed import GroupRequest
    from polar.train.trainer import Hooks, train

    runner = ModelRunner(warm, max_batch=8)
    engine = ServerThread(create_engine_app(runner, served_name="tiny")).start()
    evaluations: list[dict[str, float]] = []
    try:
        with rollout_service(
            root / "grpo-service",
            {"kind": "embedded", "base_url": engine.url, "model": "tiny"},
            "tiny",
        ) as (url, gateway):
            config = TrainConfig.model_validate(
                {
                    "model": str(warm),
                    "output_dir": str(root / "grpo"),
                    "steps": args.steps,
                    "seed": args.seed,
                    "rollout": {
                        "server_url": url,
                        "control_token": TOKEN,
                        "tasks": str(train_file),
                        "harness": HARNESS,
                        "group_size": args.group_size,
                        "groups_per_step": args.groups_per_step,
                        "max_inflight_groups": args.groups_per_step + 2,
                        "max_staleness": 1,
                        "session_timeout_s": 120,
                        "group_timeout_s": 900,
                    },
                    "weight_sync": {
                        "gateways": [{"url": gateway, "admin_token": TOKEN}],
                        "engines": [{"kind": "embedded", "url": engine.url}],
                        "drain_timeout_s": 300,
                    },
                    "optim": {"lr": args.lr, "threads": 1},
                    "log": {"progress": False},
                    "checkpoint": {"every": 0, "resume": "never"},
                    "eval": {
                        "tasks": str(heldout_file),
                        "every": args.eval_every,
                        "group_size": args.eval_group_size,
                    },
                }
            )
            request = GroupRequest(
                harness=config.rollout.harness,
                group_size=args.eval_group_size,
                builder="prefix_merge",
                session_timeout_s=120,
                max_resamples=0,
                wait_s=900,
            )

            def train_evaluation(step: int, version: int) -> dict[str, float]:
                with RolloutClient(url, token=TOKEN) as client:
                    found = evaluate(client, train_eval, request, policy_version=version)
                return {f"train_{k}": v for k, v in found.items()}

            def on_step(step: int, metrics: dict[str, float]) -> None:
                print(
                    f"step {step}: train reward {metrics['reward/mean']:.3f} "
                    f"(zero-advantage groups {metrics['groups/zero_advantage_fraction']:.2f})",
                    flush=True,
                )

            result = train(config, Hooks(on_step=on_step, evaluate=train_evaluation))
    finally:
        engine.stop()
        runner.close()
    metrics = root / "grpo" / "metrics.jsonl"
    evaluations = [
        row
        for row in (json.loads(line) for line in metrics.read_text().splitlines())
        if "eval/reward_mean" in row
    ]
    return result, evaluations


# ---------------------------------------------------------------- figures


def plot(figures: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    steps = [row["step"] for row in figures["steps"]]
    ax.plot(
        steps,
        [row["train_reward"] for row in figures["steps"]],
        "o-",
        ms=3,
        alpha=0.6,
        label="train groups (GRPO samples)",
    )
    evals = figures["evaluations"]
    ax.plot(
        [e["step"] for e in evals],
        [e["train_eval_reward"] for e in evals],
        "s-",
        label="train instances (eval)",
    )
    ax.plot(
        [e["step"] for e in evals],
        [e["heldout_reward"] for e in evals],
        "D-",
        label="held-out instances (eval)",
    )
    base = figures["sft_only"]["heldout_reward"]
    ax.axhline(base, color="grey", ls="--", label=f"SFT-only held-out ({base:.2f})")
    ax.axhline(0.8, color="green", ls=":", lw=1, label="target 0.8")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Tiny model, SFT warm start then GRPO (whole stack, CPU)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="a quick smoke run")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "learning")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--names", type=int, default=12)
    parser.add_argument("--heldout", type=int, default=10)
    parser.add_argument("--sft-attempts", type=int, default=1)
    parser.add_argument("--expert-accuracy", type=float, default=0.8)
    parser.add_argument("--expert-bare", type=float, default=0.3)
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--sft-lr", type=float, default=1e-2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval-every", type=int, default=6)
    parser.add_argument("--eval-group-size", type=int, default=4)
    parser.add_argument("--train-eval", type=int, default=8)
    args = parser.parse_args(argv)
    if args.small:
        args.names, args.heldout, args.steps, args.group_size = 4, 3, 2, 4
        args.groups_per_step, args.eval_every, args.eval_group_size, args.train_eval = 1, 1, 2, 3
        args.sft_steps = 3

    from polar.tasks.model import Task
    from polar.tinymodel.build import build_tiny_model
    from polar.tokenizer import load_tokenizer

    started = time.monotonic()
    root = args.out.resolve()
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer()
    model = build_tiny_model(root / "tiny-model")
    train_rows, held_rows = make_tasks(
        root / "tasks", names=args.names, heldout=args.heldout, seed=args.seed
    )
    train_file = write_tasks(root / "tasks" / "train.jsonl", train_rows)
    heldout_file = write_tasks(root / "tasks" / "heldout.jsonl", held_rows)
    train_eval = [Task.model_validate(row) for row in train_rows[: args.train_eval]]
    print(f"{len(train_rows)} training tasks, {len(held_rows)} held out", flush=True)

    sft = generate_sft(root, tokenizer, train_rows, args)
    t_sft = time.monotonic()
    warm = warm_start(root, model, sft["dir"], args)
    t_warm = time.monotonic()
    result, evaluations = run_grpo(root, warm, train_file, heldout_file, train_eval, args)
    t_grpo = time.monotonic()

    figures: dict[str, Any] = {
        "command": " ".join(["benchmarks/learning_toy.py", *(argv or sys.argv[1:])]),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "tasks": {"train": len(train_rows), "heldout": len(held_rows)},
        "sft_data": sft["stats"],
        "steps": [
            {
                "step": int(row["step"]),
                "train_reward": row["reward/mean"],
                "zero_advantage_fraction": row["groups/zero_advantage_fraction"],
                "stale_dropped_total": row.get("groups/stale_dropped_total", 0.0),
                "clip_fraction": row.get("clip_fraction"),
                "mismatch_kl": row.get("mismatch/kl"),
            }
            for row in result.history
        ],
        "evaluations": [
            {
                "step": int(e["step"]),
                "policy_version": int(e.get("policy_version", 0)),
                "heldout_reward": e["eval/reward_mean"],
                "heldout_sessions": e["eval/counted"],
                "heldout_exact": e["eval/solved_fraction"],
                "train_eval_reward": e["train_eval/reward_mean"],
                "train_eval_sessions": e["train_eval/counted"],
                "train_eval_exact": e["train_eval/solved_fraction"],
            }
            for e in evaluations
        ],
        "wall_s": {
            "sft_generation": t_sft - started,
            "sft_finetune": t_warm - t_sft,
            "grpo": t_grpo - t_warm,
            "total": t_grpo - started,
        },
    }
    first = figures["evaluations"][0]
    last = figures["evaluations"][-1]
    figures["sft_only"] = {
        "heldout_reward": first["heldout_reward"],
        "train_eval_reward": first["train_eval_reward"],
    }
    figures["final"] = {
        "heldout_reward": last["heldout_reward"],
        "train_eval_reward": last["train_eval_reward"],
        "target_heldout": 0.8,
        "target_met": last["heldout_reward"] >= 0.8,
        "warm_start_at_most_0_5": first["heldout_reward"] <= 0.5,
    }
    (root / "learning.json").write_text(json.dumps(figures, indent=2) + "\n")
    plot(figures, root / "learning.png")
    print(
        f"held-out reward: SFT-only {first['heldout_reward']:.3f} -> after "
        f"{result.steps} GRPO steps {last['heldout_reward']:.3f} (target 0.8); "
        f"train instances {first['train_eval_reward']:.3f} -> {last['train_eval_reward']:.3f}; "
        f"{t_grpo - started:.0f} s in all; {root / 'learning.json'}, {root / 'learning.png'}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    raise SystemExit(main())
