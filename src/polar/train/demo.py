"""The main job, small: a real pretrained model learns coding tasks on this machine.

``polar demo`` (the README's first command) runs it: SmolLM2-135M-Instruct
(``polar model smollm2``) on the embedded CPU engine, a rollout server and a
gateway node in this process (:mod:`polar.train.local`), the ``minicoder``
agent writing one Python function per ``pyfuncs`` task in a sandbox, the
pytest evaluator scoring it, and the reference GRPO trainer pushing new
weights into the engine after every step. Held-out tasks (templates and
parameter ranges never trained on) are evaluated before and after, at the
training's sampling policy. Each step's reward and policy version are printed
as they come, and every finished group and evaluated task shows, so no minute
passes in silence.

What a user gets to look at afterwards stays under ``workdir``: the gateway's
records (``polar records``, ``polar build``, ``polar dashboard --store``), the
trainer's metrics and checkpoints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar.harness.install import DEFAULT_CACHE_DIR

Echo = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class DemoSettings:
    model: Path
    workdir: Path = Path("runs/demo")
    train_tasks: str = "pyfuncs:train"
    heldout_tasks: str = "pyfuncs:heldout"
    heldout: int = 12
    """Held-out tasks evaluated before and after (spread over the templates)."""
    steps: int = 4
    groups_per_step: int = 2
    group_size: int = 4
    max_turns: int = 2
    max_tokens: int = 160
    temperature: float = 1.0
    lr: float = 2e-5
    seed: int = 0
    harness_cache: Path = DEFAULT_CACHE_DIR
    run_slots: int = 8
    extra: dict[str, Any] = field(default_factory=dict)
    """More ``TrainConfig`` fields (merged over the demo's)."""


@dataclass(frozen=True, slots=True)
class DemoResult:
    before: float
    after: float
    heldout: int
    steps: int
    policy_version: int
    minutes: float
    workdir: Path


def run_demo(settings: DemoSettings, echo: Echo) -> DemoResult:
    from polar.rollout.client import RolloutClient
    from polar.rollout.protocol import TaskResult
    from polar.tasks import load_tasks
    from polar.tasks.pyfuncs import spread
    from polar.train.batch import Group
    from polar.train.config import TrainConfig
    from polar.train.evaluation import evaluate, solved
    from polar.train.feed import GroupRequest
    from polar.train.local import LocalSettings, local_stack
    from polar.train.trainer import Hooks, train

    started = time.monotonic()
    harness = {
        "name": "minicoder",
        "options": {"max_turns": settings.max_turns, "max_tokens": settings.max_tokens},
    }
    sampling = {"temperature": settings.temperature}
    heldout = spread(load_tasks(settings.heldout_tasks), settings.heldout)
    local = LocalSettings(
        model=settings.model,
        root=settings.workdir,
        served_name="smollm2",
        harness_cache=settings.harness_cache,
        run_slots=settings.run_slots,
    )
    with local_stack(local) as stack:
        echo(
            f"[2/5] engine, rollout server and gateway node up; records in {stack.records}, "
            f"sessions sandboxed"
        )
        request = GroupRequest(
            harness=_harness(harness),
            group_size=1,
            builder="prefix_merge",
            session_timeout_s=300,
            max_resamples=1,
            wait_s=1800,
            sampling=_policy(sampling),
        )

        def evaluated(label: str, version: int) -> float:
            done = [0]

            def show(result: TaskResult) -> None:
                done[0] += 1
                mark = "solved" if any(solved(r) for r in result.current) else "not solved"
                echo(f"      {done[0]:>2}/{len(heldout)} {result.task}: {mark}")

            with RolloutClient(stack.server_url, token=stack.token) as client:
                found = evaluate(client, heldout, request, policy_version=version, on_result=show)
            fraction = found["eval/solved_fraction"]
            echo(f"      {label}: held-out pass@1 {fraction:.0%} ({len(heldout)} tasks)")
            return fraction

        echo(
            f"[3/5] before training: {len(heldout)} held-out tasks, one session each, "
            f"temperature {settings.temperature:g}"
        )
        before = evaluated("before", 0)
        echo(
            f"[4/5] GRPO: {settings.steps} steps of {settings.groups_per_step} tasks x "
            f"{settings.group_size} sessions (minicoder, {settings.max_turns} turns), "
            "weights pushed to the engine after each step"
        )
        config = TrainConfig.model_validate(
            {
                "model": str(settings.model),
                "output_dir": str(stack.root / "train"),
                "steps": settings.steps,
                "seed": settings.seed,
                "rollout": {
                    "server_url": stack.server_url,
                    "control_token": stack.token,
                    "tasks": settings.train_tasks,
                    "harness": harness,
                    "group_size": settings.group_size,
                    "groups_per_step": settings.groups_per_step,
                    "max_inflight_groups": settings.groups_per_step,
                    "max_staleness": 1,
                    "session_timeout_s": 300,
                    "group_timeout_s": 1800,
                    "sampling": sampling,
                },
                "weight_sync": stack.weight_sync(),
                # attention scores are kept for backward: 4,096 tokens a micro-batch
                # keep a step within a few GB on this model
                "optim": {"lr": settings.lr, "threads": 1, "micro_batch_tokens": 4096},
                "log": {"progress": False},
                "checkpoint": {"every": 0, "resume": "never"},
                **settings.extra,
            }
        )
        step_started = [time.monotonic()]

        def on_group(step: int, group: Group) -> None:
            rewards = ", ".join(f"{r:g}" for r in group.rewards)
            echo(f"      step {step}: {group.task}: rewards [{rewards}]")

        def on_step(step: int, metrics: dict[str, float]) -> None:
            seconds = time.monotonic() - step_started[0]
            step_started[0] = time.monotonic()
            nothing = metrics.get("groups/zero_advantage_fraction", 0.0)
            echo(
                f"    step {step}/{settings.steps}: mean reward {metrics['reward/mean']:.2f}, "
                f"zero-advantage groups {nothing:.0%}, grad norm "
                f"{metrics['trainer/grad_norm']:.3g}, now policy v"
                f"{int(metrics.get('push/served_version', step))} "
                f"({seconds:.0f} s)"
            )

        result = train(config, Hooks(on_step=on_step, on_group=on_group))
        echo("[5/5] after training")
        after = evaluated("after", result.policy_version)
    minutes = (time.monotonic() - started) / 60
    return DemoResult(
        before=before,
        after=after,
        heldout=len(heldout),
        steps=result.steps,
        policy_version=result.policy_version,
        minutes=minutes,
        workdir=stack.root,
    )


def _harness(spec: dict[str, Any]) -> Any:
    from polar.rollout.protocol import HarnessSpec

    return HarnessSpec.model_validate(spec)


def _policy(spec: dict[str, Any]) -> Any:
    from polar.proxy.call.behaviour import SamplingPolicy

    return SamplingPolicy.model_validate(spec)
