"""``pytest``: copy the hidden tests in, run pytest, score per-test outcomes.

Config:

- ``tests_dir`` (default ``.``): where the task's ``hidden_tests`` directory is
  copied, relative to the workspace, only now that the agent finished;
- ``select``: pytest arguments choosing the tests (paths or node ids); by
  default every ``test_*.py`` / ``*_test.py`` file of the hidden tests, or
  whatever pytest finds when the task has none;
- ``required``: node ids that must be reported and pass; when given, only they
  are scored, and one that is missing counts as failed;
- ``reward``: ``pass_fail`` (1 iff every scored test passed) or ``fraction``
  (passed / scored);
- ``pytest`` (default: :data:`~polar.reward.hardening.PYTEST_RUNNER`, the real
  pytest started so that nothing in the workspace can stand in for it),
  ``args``, ``env``, ``timeout_s`` (clamped to the evaluation budget).

The scored tests are ``required`` or, without it, every test pytest reported
except skipped ones. Nothing scored (no tests collected) is reward 0. A run
that times out scores 0 with ``timed_out``.

The workspace is the agent's: before the hidden tests are copied in, the test
runner's own files (``conftest.py``, ``pytest.ini``, ``pyproject.toml``, ...)
are put back as the baseline had them and pytest is started so that nothing in
the workspace can shadow it (:mod:`polar.reward.hardening`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from polar.reward.base import EvalContext, EvalResult, EvaluatorError
from polar.reward.budget import Budget, TimedOut
from polar.reward.hardening import PYTEST_RUNNER, SAFE_ENV
from polar.reward.pytest_report import Outcome, PytestRun, run_pytest
from polar.reward.scoring import Scoring, copy_hidden_tests, scoring_runtime, timed_out_result
from polar.reward.transfer import tail


class RewardMode(StrEnum):
    PASS_FAIL = "pass_fail"
    FRACTION = "fraction"


@dataclass(frozen=True, slots=True)
class OutcomeScore:
    reward: float
    resolved: bool
    scored: tuple[str, ...]
    passed: tuple[str, ...]
    missing: tuple[str, ...]


def score_outcomes(
    outcomes: Mapping[str, Outcome], required: Sequence[str], mode: RewardMode
) -> OutcomeScore:
    """Score per-test outcomes (see the module docstring for the rules)."""
    if required:
        scored = tuple(dict.fromkeys(required))
    else:
        scored = tuple(test for test, outcome in outcomes.items() if outcome is not Outcome.SKIPPED)
    passed = tuple(test for test in scored if outcomes.get(test) is Outcome.PASSED)
    missing = tuple(test for test in scored if test not in outcomes)
    resolved = bool(scored) and len(passed) == len(scored)
    match mode:
        case RewardMode.PASS_FAIL:
            reward = float(resolved)
        case RewardMode.FRACTION:
            reward = len(passed) / len(scored) if scored else 0.0
    return OutcomeScore(reward, resolved, scored, passed, missing)


@dataclass(frozen=True, slots=True)
class PytestEvaluator:
    tests_dir: str = "."
    select: tuple[str, ...] | None = None
    required: tuple[str, ...] = ()
    reward: RewardMode = RewardMode.PASS_FAIL
    pytest: Annotated[tuple[str, ...], Field(min_length=1)] = PYTEST_RUNNER
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: Annotated[float | None, Field(gt=0)] = None

    async def evaluate(self, ctx: EvalContext) -> EvalResult:
        budget = Budget.of(ctx.timeout_s)
        details: dict[str, Any] = {"reward_mode": self.reward.value}
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
        target = posixpath.join(scoring.workspace, self.tests_dir)
        hidden = await copy_hidden_tests(ctx.task, scoring.runtime, target)
        select = self.select
        if select is None:
            select = _test_files(hidden, self.tests_dir) if hidden is not None else ()
            if hidden is not None and not select:
                raise EvaluatorError(f"task {ctx.task.id}: no test files in {hidden}")
        run = await run_pytest(
            scoring.runtime,
            cwd=scoring.workspace,
            command=self.pytest,
            args=[*self.args, *select],
            env={**SAFE_ENV, **self.env},
            timeout_s=budget.clamp(self.timeout_s),
        )
        details |= report_details(run)
        if run.timed_out:
            raise TimedOut("pytest", run.output)
        score = score_outcomes(run.outcomes, self.required, self.reward)
        details |= {
            "scored": len(score.scored),
            "passed": len(score.passed),
            "missing": list(score.missing),
        }
        if not score.scored:
            details["reason"] = f"no tests ran (pytest exit {run.exit_code})"
        return EvalResult(score.reward, score.resolved, details, tail(run.output))


def report_details(run: PytestRun) -> dict[str, Any]:
    return {
        "exit_code": run.exit_code,
        "timed_out": run.timed_out,
        "report": run.source.value,
        "tests": {test: outcome.value for test, outcome in run.outcomes.items()},
    }


def _test_files(hidden: Path, tests_dir: str) -> tuple[str, ...]:
    """Workspace-relative paths of the hidden test files, sorted."""
    files = sorted(
        path.relative_to(hidden).as_posix()
        for pattern in ("test_*.py", "*_test.py")
        for path in hidden.rglob(pattern)
        if "__pycache__" not in path.parts
    )
    return tuple(posixpath.normpath(posixpath.join(tests_dir, name)) for name in files)
