"""Plug-in evaluators, loaded by tests as ``support.evaluators:<name>``.

They are what a user's own ``package.module:factory`` looks like: a dataclass
(config validated field by field) or a plain function returning an object with
``async evaluate(ctx)``.
"""

from __future__ import annotations

import asyncio
import posixpath
from dataclasses import dataclass
from typing import Any

from polar.reward import EvalContext, EvalResult
from polar.tasks import workspace_path


@dataclass(frozen=True, slots=True)
class AnswerFile:
    """Reward 1 iff the workspace's ``path`` holds ``expected`` (read in the runtime)."""

    expected: str
    path: str = "answer.txt"

    async def evaluate(self, ctx: EvalContext) -> EvalResult:
        target = posixpath.join(workspace_path(ctx.task, ctx.runtime), self.path)
        result = await ctx.runtime.exec(["cat", target], timeout_s=ctx.timeout_s)
        right = result.ok and result.stdout.strip() == self.expected
        return EvalResult(float(right), right, {"answer": result.stdout.strip()})


class _Fixed:
    def __init__(self, reward: float) -> None:
        self.reward = reward

    async def evaluate(self, ctx: EvalContext) -> EvalResult:
        return EvalResult(self.reward, self.reward == 1.0)


def fixed(reward: float) -> _Fixed:
    """A plain function factory: always ``reward`` (which may be out of range)."""
    return _Fixed(reward)


class _Crashing:
    async def evaluate(self, ctx: EvalContext) -> EvalResult:
        raise RuntimeError("the grader's database is unreachable")


def crashing() -> _Crashing:
    return _Crashing()


class _Hanging:
    async def evaluate(self, ctx: EvalContext) -> EvalResult:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def hanging() -> _Hanging:
    """Ignores its budget entirely."""
    return _Hanging()


def not_an_evaluator() -> dict[str, Any]:
    return {"evaluate": "no"}


NOT_CALLABLE = "just a string"
