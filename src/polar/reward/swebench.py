"""``swebench``: the agent's diff on a fresh checkout, then FAIL_TO_PASS and PASS_TO_PASS.

1. The agent's diff is taken from the live runtime (against the baseline, so
   caches and set-up output are not part of it). An empty diff scores 0.
2. In ``ctx.fresh_runtime()`` (a fresh copy of the task's workspace) the diff
   is applied with ``git apply``, else ``patch -p1 --fuzz=5``; a diff that
   does not apply scores 0.
3. The test runner's files are put back (:mod:`polar.reward.hardening`), the
   files ``test_patch`` touches are reset to the baseline (the agent's edits
   to them do not count), then ``test_patch`` is applied; if it does not
   apply the instance is broken (:class:`EvaluatorError`).
4. The FAIL_TO_PASS and PASS_TO_PASS tests run in one pytest call (node ids);
   resolved, and reward 1, iff every one of them passed.

Config: ``fail_to_pass`` (at least one), ``pass_to_pass``, ``test_patch``,
``pytest`` (default: the hardened runner,
:data:`~polar.reward.hardening.PYTEST_RUNNER`), ``args``, ``env``,
``timeout_s`` for the test run (clamped to the evaluation budget). Test ids
must be pytest node ids; repositories with other runners (Django's
``runtests.py``) need a plug-in evaluator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field

from polar.reward.base import EvalContext, EvalResult, EvaluatorError
from polar.reward.budget import Budget, TimedOut
from polar.reward.hardening import PYTEST_RUNNER, SAFE_ENV, harden
from polar.reward.patches import apply_diff, patch_paths, restore_paths, take_diff
from polar.reward.pytest_report import Outcome, run_pytest
from polar.reward.pytest_suite import report_details
from polar.reward.scoring import timed_out_result
from polar.reward.transfer import tail
from polar.runtime.base import Runtime
from polar.tasks.workspace import workspace_path

MISSING = "missing"
"""Outcome shown for a listed test pytest did not report."""


@dataclass(frozen=True, slots=True)
class SwebenchEvaluator:
    fail_to_pass: Annotated[tuple[str, ...], Field(min_length=1)]
    pass_to_pass: tuple[str, ...] = ()
    test_patch: str = ""
    pytest: Annotated[tuple[str, ...], Field(min_length=1)] = PYTEST_RUNNER
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: Annotated[float | None, Field(gt=0)] = None

    async def evaluate(self, ctx: EvalContext) -> EvalResult:
        budget = Budget.of(ctx.timeout_s)
        details: dict[str, Any] = {}
        try:
            return await self._evaluate(ctx, budget, details)
        except TimedOut as exc:
            return timed_out_result(exc, details)

    async def _evaluate(
        self, ctx: EvalContext, budget: Budget, details: dict[str, Any]
    ) -> EvalResult:
        diff = await take_diff(
            ctx.runtime, workspace_path(ctx.task, ctx.runtime), budget, ctx.baseline
        )
        details |= diff.details()
        if diff.empty:
            details["reason"] = "the agent changed nothing (empty diff)"
            return EvalResult(0.0, False, details)

        fresh = await ctx.fresh_runtime()
        workspace = workspace_path(ctx.task, fresh)
        applied = await apply_diff(fresh, workspace, diff.patch, budget)
        details["apply"] = applied.method.value if applied.method else None
        if applied.method is None:
            details["reason"] = "the agent's diff does not apply to a fresh checkout"
            return EvalResult(0.0, False, details, tail(applied.log))

        details |= await harden(fresh, workspace, None, budget)
        await self._apply_test_patch(fresh, workspace, budget)
        tests = list(dict.fromkeys((*self.fail_to_pass, *self.pass_to_pass)))
        run = await run_pytest(
            fresh,
            cwd=workspace,
            command=self.pytest,
            args=[*self.args, *tests],
            env={**SAFE_ENV, **self.env},
            timeout_s=budget.clamp(self.timeout_s),
        )
        details |= report_details(run)
        del details["tests"]  # reported per list below
        if run.timed_out:
            raise TimedOut("tests", run.output)

        def outcomes(ids: tuple[str, ...]) -> dict[str, str]:
            return {
                test: run.outcomes[test].value if test in run.outcomes else MISSING for test in ids
            }

        fail_to_pass, pass_to_pass = outcomes(self.fail_to_pass), outcomes(self.pass_to_pass)
        resolved = all(
            outcome == Outcome.PASSED.value
            for outcome in (*fail_to_pass.values(), *pass_to_pass.values())
        )
        details |= {
            "fail_to_pass": fail_to_pass,
            "pass_to_pass": pass_to_pass,
            "fail_to_pass_passed": sum(o == Outcome.PASSED.value for o in fail_to_pass.values()),
            "pass_to_pass_passed": sum(o == Outcome.PASSED.value for o in pass_to_pass.values()),
        }
        return EvalResult(float(resolved), resolved, details, tail(run.output))

    async def _apply_test_patch(self, runtime: Runtime, workspace: str, budget: Budget) -> None:
        if not self.test_patch.strip():
            return
        await restore_paths(runtime, workspace, patch_paths(self.test_patch), budget)
        applied = await apply_diff(
            runtime, workspace, self.test_patch.encode(), budget, name="test.patch"
        )
        if applied.method is None:
            reason = " ".join(tail(applied.log, 400).split())
            raise EvaluatorError(f"the instance's test_patch does not apply: {reason}")
