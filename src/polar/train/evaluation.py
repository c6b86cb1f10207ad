"""Held-out evaluation during training: run each held-out task as a group on
the rollout service under the current weights (nothing is trained on it) and
report mean reward and the fraction solved.

Failed sessions follow the same policy as training (:mod:`polar.rollout.failure`):
the agent's failures (timeout, its harness's exit, a sandbox limit) count as
reward 0.0 and unsolved; sessions the infrastructure failed, or cancelled ones,
are not counted; replaced sessions are not counted either (their resample is)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from polar.rollout.client import RolloutClient
from polar.rollout.failure import SessionUse, outcome_reward, session_use
from polar.rollout.protocol import SessionResult, TaskResult, TaskSubmission
from polar.tasks.model import Task
from polar.train.feed import GroupRequest


def evaluate(
    client: RolloutClient,
    tasks: Sequence[Task],
    request: GroupRequest,
    *,
    policy_version: int,
    prefix: str = "eval",
    on_result: Callable[[TaskResult], None] | None = None,
) -> dict[str, float]:
    """``<prefix>/reward_mean`` and ``<prefix>/solved_fraction`` over every counted
    session of every task (scored, or failed by the agent: 0.0, unsolved);
    ``<prefix>/counted``, ``<prefix>/agent_failed``, ``<prefix>/masked`` (not
    counted) and ``<prefix>/sessions``; ``prefix`` is ``eval`` (``eval_greedy``...).
    ``on_result`` sees each task's result as it is read (progress)."""
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
    results: list[TaskResult] = []
    for view in views:
        results.append(client.wait(view.task_id, request.wait_s))
        if on_result is not None:
            on_result(results[-1])
    sessions = [r for t in results for r in t.current]
    counted = [(r, reward) for r in sessions if (reward := outcome_reward(r)) is not None]
    rewards = [reward for _, reward in counted]
    hits = [solved(r) for r, _ in counted]
    return {
        f"{prefix}/reward_mean": math.fsum(rewards) / len(rewards) if rewards else 0.0,
        f"{prefix}/solved_fraction": sum(hits) / len(hits) if hits else 0.0,
        f"{prefix}/counted": float(len(counted)),
        f"{prefix}/agent_failed": float(sum(session_use(r) is SessionUse.FAILED for r in sessions)),
        f"{prefix}/masked": float(len(sessions) - len(counted)),
        f"{prefix}/sessions": float(len(sessions)),
    }


def solved(result: SessionResult) -> bool:
    """Solved: scored and resolved (an agent's failure never is)."""
    return session_use(result) is SessionUse.SCORED and bool(result.resolved)
