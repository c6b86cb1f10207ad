"""GRPO training steps on the same sessions, from ``per_request`` and from
``prefix_merge`` samples.

    .venv/bin/python benchmarks/train_throughput.py [--turns 8,16] [--sessions 4]

The sessions are ``benchmarks/builders.py``'s synthetic coding-agent sessions
(real Qwen3 tokenizer and chat template, 12 tools, ~560 tokens of tool output
per turn), recorded as the gateway records them in token-in/token-out mode.
A group of ``--sessions`` such sessions (rewards 1, 0, 0, ...) is built
both ways and trained for one GRPO step (one optimizer step, the trainer's
default settings) by the reference trainer's step function on ``polar model
init``'s tiny Qwen3-architecture model, from the same initial weights.

Printed side by side: sequences and tokens the trainer processes, trainer
wall-clock, tokens/s, the loss and the gradient norm (the same loss tokens
with the same advantages under token-mean: equal up to float error, which
shows the merged samples lose nothing; both are small because the synthetic
records' logprobs are near 0 while the random model's are near -12, so the
truncated importance weights are tiny). Timings are wall-clock on this machine, one run each,
after one untimed warm-up step.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from builders import play
from polar.ir import CaptureMode
from polar.proxy.render.template import ChatTemplate
from polar.tinymodel.build import build_tiny_model
from polar.train.batch import Advantages, Group, ScoredSession, rows_of
from polar.train.grpo import Aggregation, MissingLogprob
from polar.train.step import LossSettings, StepSettings, train_step
from polar.trajectory import BuildConfig, PerRequest, PrefixMerge, TurnFormat
from polar.trajectory.export import samples_of


def group_of(builder: Any, records: list[Any], sessions: int) -> Group:
    scored = []
    for i in range(sessions):
        sid = f"ses_{i}"
        mine = [dataclasses.replace(r, session_id=sid) for r in records]
        samples = tuple(samples_of(builder.build(mine)))
        scored.append(ScoredSession(sid, 0.0, samples))
    return Group("task", "bench", "g", tuple(scored))


def step(model: Any, group: Group) -> tuple[dict[str, float], float]:
    advantages = Advantages(
        {s.session_id: (-0.5) ** i for i, s in enumerate(group.sessions)},
        zero_advantage_groups=0,
        groups=1,
    )
    rows = rows_of(
        [group],
        advantages,
        aggregation=Aggregation.TOKEN_MEAN,
        missing_logprob=MissingLogprob.TRUST,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    started = time.perf_counter()
    metrics = train_step(
        model,
        optimizer,
        rows,
        loss=LossSettings(),
        settings=StepSettings(pad_id=int(model.config.eos_token_id or 0)),
        policy_version=0,
    )
    return metrics, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", default="8,16")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from polar.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    template = ChatTemplate(tokenizer)
    config = BuildConfig(turns=TurnFormat.from_tokenizer(tokenizer))
    builders = {"per_request": PerRequest(config), "prefix_merge": PrefixMerge(config)}
    with tempfile.TemporaryDirectory() as tmp:
        initial = AutoModelForCausalLM.from_pretrained(
            str(build_tiny_model(Path(tmp) / "tiny")), dtype=torch.float32
        )
    warm = copy.deepcopy(initial)
    step(
        warm,
        group_of(
            builders["prefix_merge"], play(template, CaptureMode.TOKEN_IN_TOKEN_OUT, 2).records, 2
        ),
    )

    results = []
    for turns in [int(n) for n in args.turns.split(",")]:
        records = play(template, CaptureMode.TOKEN_IN_TOKEN_OUT, turns).records
        for name, builder in builders.items():
            metrics, seconds = step(
                copy.deepcopy(initial), group_of(builder, records, args.sessions)
            )
            results.append((turns, name, metrics, seconds))

    print(f"one GRPO step, {args.sessions} sessions, tiny Qwen3 model, torch threads "
          f"{torch.get_num_threads()}")  # fmt: skip
    print(f"{'turns':>5}{'builder':>14}{'sequences':>11}{'tokens':>11}{'loss tokens':>13}"
          f"{'seconds':>10}{'tokens/s':>11}{'loss':>13}{'grad norm':>12}")  # fmt: skip
    for turns, name, m, seconds in results:
        print(f"{turns:>5}{name:>14}{m['trainer/sequences']:>11.0f}{m['trainer/tokens']:>11,.0f}"
              f"{m['trainer/loss_tokens']:>13,.0f}{seconds:>10.2f}"
              f"{m['trainer/tokens'] / seconds:>11,.0f}{m['loss/pg']:>13.4e}"
              f"{m['trainer/grad_norm']:>12.4e}")  # fmt: skip
    by_turns: dict[int, dict[str, tuple[dict[str, float], float]]] = {}
    for turns, name, m, seconds in results:
        by_turns.setdefault(turns, {})[name] = (m, seconds)
    for turns, pair in by_turns.items():
        (each, t_each), (merged, t_merged) = pair["per_request"], pair["prefix_merge"]
        print(
            f"{turns} turns: per_request / prefix_merge: sequences "
            f"{each['trainer/sequences'] / merged['trainer/sequences']:.2f}x, tokens "
            f"{each['trainer/tokens'] / merged['trainer/tokens']:.2f}x, wall-clock "
            f"{t_each / t_merged:.2f}x; same loss tokens: "
            f"{each['trainer/loss_tokens'] == merged['trainer/loss_tokens']}"
        )


if __name__ == "__main__":
    main()
