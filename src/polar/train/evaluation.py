"""Held-out evaluation during training: run each held-out task as a group on
the rollout service under the current weights (nothing is trained on it) and
report mean reward and the fraction solved."""

from __future__ import annotations

import math
from collections.abc import Sequence

from polar.rollout.client import RolloutClient
from polar.rollout.protocol import TaskResult, TaskSubmission
from polar.tasks.model import Task
from polar.train.feed import GroupRequest


def evaluate(
    client: RolloutClient,
    tasks: Sequence[Task],
    request: GroupRequest,
    *,
    policy_version: int,
    prefix: str = "eval",
) -> dict[str, float]:
    """``eval/reward_mean``, ``eval/solved_fraction``, ``eval/usable`` over every
    usable session of every task (an unusable session is not a zero); ``prefix``
    names the metrics (``eval_greedy``...)."""
    views = [
        client.submit(
            TaskSubmission(
                task=task,
                harness=request.harness,
                num_samples=request.group_size,
                builder=request.builder,
                session_timeout_s=request.session_timeout_s,
                max_resamples=request.max_resamples,
                policy_version=policy_version,
                sampling=request.sampling,
                metadata={"purpose": "eval"},
            )
        )
        for task in tasks
    ]
    results: list[TaskResult] = [client.wait(v.task_id, request.wait_s) for v in views]
    rewards = [r.reward for t in results for r in t.results if r.usable and r.reward is not None]
    solved = [
        bool(r.resolved) for t in results for r in t.results if r.usable and r.reward is not None
    ]
    return {
        f"{prefix}/reward_mean": math.fsum(rewards) / len(rewards) if rewards else 0.0,
        f"{prefix}/solved_fraction": sum(solved) / len(solved) if solved else 0.0,
        f"{prefix}/usable": float(len(rewards)),
        f"{prefix}/sessions": float(sum(len(t.results) for t in results)),
    }
