"""``command``: run a shell command in the workspace; its exit status is the score.

Config: ``command`` (run with ``bash -c`` in the workspace), ``reward_file``
(optional; a path relative to the workspace, or absolute: the command writes a
number there, clamped to [0, 1], instead of the exit status deciding),
``tests_dir`` (where the task's hidden tests are copied first, relative to the
workspace, default ``.``), ``timeout_s`` (clamped to the evaluation budget),
``env`` (over :data:`~polar.reward.hardening.SAFE_ENV`).

Before the command runs, the test runner's files in the workspace are put back
as the baseline had them (:mod:`polar.reward.hardening`), and Python does not
put the working directory on ``sys.path`` (``PYTHONSAFEPATH``): a project whose
tests import it from there says so (``pythonpath`` in its pytest config, or
``PYTHONPATH`` in ``env``).

Without ``reward_file``: reward 1 and resolved iff the command exits 0. With
it: the number in the file (a missing file scores 0; a file that does not hold
a number is an :class:`EvaluatorError`); resolved iff the reward is 1. A stale
reward file is removed before the command runs.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field

from polar.reward.base import EvalContext, EvalResult, EvaluatorError
from polar.reward.budget import Budget, TimedOut
from polar.reward.hardening import SAFE_ENV
from polar.reward.scoring import (
    Scoring,
    clamp_reward,
    copy_hidden_tests,
    scoring_runtime,
    timed_out_result,
)
from polar.reward.transfer import output, read_file, tail


@dataclass(frozen=True, slots=True)
class CommandEvaluator:
    command: Annotated[str, Field(min_length=1)]
    reward_file: str | None = None
    tests_dir: str = "."
    timeout_s: Annotated[float | None, Field(gt=0)] = None
    env: Mapping[str, str] = field(default_factory=dict)

    async def evaluate(self, ctx: EvalContext) -> EvalResult:
        budget = Budget.of(ctx.timeout_s)
        details: dict[str, Any] = {}
        try:
            scoring = await scoring_runtime(ctx, budget, details)
            if isinstance(scoring, EvalResult):
                return scoring
            return await self._run(ctx, scoring, budget, details)
        except TimedOut as exc:
            return timed_out_result(exc, details)

    async def _run(
        self, ctx: EvalContext, scoring: Scoring, budget: Budget, details: dict[str, Any]
    ) -> EvalResult:
        runtime, workspace = scoring.runtime, scoring.workspace
        await copy_hidden_tests(ctx.task, runtime, posixpath.join(workspace, self.tests_dir))
        reward_path = (
            posixpath.join(workspace, self.reward_file) if self.reward_file is not None else None
        )
        if reward_path is not None:
            await runtime.exec(["rm", "-f", reward_path], timeout_s=budget.clamp(30))
        result = await runtime.exec(
            ["bash", "-c", self.command],
            cwd=workspace,
            env={**SAFE_ENV, **self.env},
            timeout_s=budget.clamp(self.timeout_s),
        )
        details["exit_code"] = result.exit_code
        if result.timed_out:
            raise TimedOut("command", output(result))
        log = tail(output(result))
        if reward_path is None:
            passed = result.exit_code == 0
            return EvalResult(float(passed), passed, details, log)
        data = await read_file(runtime, reward_path)
        if data is None:
            details["reason"] = f"the command wrote no reward file {self.reward_file}"
            return EvalResult(0.0, False, details, log)
        try:
            value = float(data.decode().strip())
        except (UnicodeDecodeError, ValueError):
            raise EvaluatorError(
                f"reward file {self.reward_file} does not hold a number: {data[:80]!r}"
            ) from None
        reward = clamp_reward(value, f"reward file {self.reward_file}")
        details["raw_reward"] = value
        return EvalResult(reward, reward >= 1.0, details, log)
