"""What every built-in evaluator shares: hidden tests, reward values, and
choosing the runtime to score in."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.reward.base import EvalContext, EvalResult, EvaluatorError
from polar.reward.budget import Budget, TimedOut
from polar.reward.hardening import harden
from polar.reward.patches import apply_diff, take_diff
from polar.reward.transfer import tail
from polar.runtime.base import Runtime
from polar.tasks.model import Task
from polar.tasks.workspace import workspace_path


def timed_out_result(exc: TimedOut, details: dict[str, Any]) -> EvalResult:
    return EvalResult(
        reward=0.0,
        resolved=False,
        details={**details, "timed_out": True, "timed_out_stage": exc.stage, "reason": str(exc)},
        log=tail(exc.log),
    )


def clamp_reward(value: float, source: str) -> float:
    if not math.isfinite(value):
        raise EvaluatorError(f"{source}: reward {value} is not a finite number")
    return min(1.0, max(0.0, value))


async def copy_hidden_tests(task: Task, runtime: Runtime, target: str) -> Path | None:
    """Copy the task's hidden tests into ``target`` inside ``runtime`` (now, after
    the agent finished); the host directory, or None when the task has none."""
    hidden = task.hidden_tests
    if hidden is None:
        return None
    if not hidden.is_dir():
        raise EvaluatorError(f"task {task.id}: hidden tests directory {hidden} does not exist")
    await runtime.put(hidden, target)
    return hidden


@dataclass(frozen=True, slots=True)
class Scoring:
    """Where to score: a runtime and its workspace path."""

    runtime: Runtime
    workspace: str


async def scoring_runtime(
    ctx: EvalContext, budget: Budget, details: dict[str, Any]
) -> Scoring | EvalResult:
    """The live runtime, or (``fresh_runtime: true``) a fresh copy of the task's
    workspace with the agent's diff applied; either way with the test runner's
    files put back (:func:`~polar.reward.hardening.harden`). A diff that does
    not apply is a result (reward 0); ``details`` gets what was done."""
    task = ctx.task
    if not task.evaluator.fresh_runtime:
        details["runtime"] = "live"
        workspace = workspace_path(task, ctx.runtime)
        details |= await harden(ctx.runtime, workspace, ctx.baseline, budget)
        return Scoring(ctx.runtime, workspace)
    diff = await take_diff(ctx.runtime, workspace_path(task, ctx.runtime), budget, ctx.baseline)
    details |= {"runtime": "fresh", **diff.details()}
    fresh = await ctx.fresh_runtime()
    workspace = workspace_path(task, fresh)
    if not diff.empty:
        applied = await apply_diff(fresh, workspace, diff.patch, budget)
        details["apply"] = applied.method.value if applied.method else None
        if applied.method is None:
            details["reason"] = "the agent's diff does not apply to a fresh workspace"
            return EvalResult(0.0, False, details, log=tail(applied.log))
    details |= await harden(fresh, workspace, None, budget)
    return Scoring(fresh, workspace)
