"""``harbor``: a Harbor / Terminal-Bench verifier, ``tests/test.sh`` writing a reward.

In the scoring runtime (the live one unless ``fresh_runtime``): ``/tests`` is
emptied and ``/logs/verifier`` removed (nothing the agent left there counts),
the task's hidden tests are copied to ``/tests``, and ``bash /tests/test.sh``
runs in the workspace with ``verifier_timeout_s`` (default 120, clamped to the
evaluation budget), with the test runner's files in the workspace put back and
:data:`~polar.reward.hardening.SAFE_ENV` (:mod:`polar.reward.hardening`). The
reward is ``/logs/verifier/reward.txt`` (a number,
clamped to [0, 1]), else ``reward.json`` (a number, or the mean of an object's
numeric values), else 0. Resolved iff the reward is 1. A verifier that times
out scores 0; a reward file that holds no number is an :class:`EvaluatorError`.

``/tests`` and ``/logs`` must be runtime binds (``RuntimeSpec.binds``;
:func:`polar.tasks.load_harbor` asks for them), so the copies land in the
sandbox and never on the host's root.
"""

from __future__ import annotations

import json
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

_CLEAR = """set -eu
find "$1" -mindepth 1 -delete
rm -rf "$2/verifier"
mkdir -p "$2/verifier"
"""


@dataclass(frozen=True, slots=True)
class HarborEvaluator:
    verifier_timeout_s: Annotated[float, Field(gt=0)] = 120.0
    tests_path: str = "/tests"
    logs_path: str = "/logs"
    env: Mapping[str, str] = field(default_factory=dict)

    async def evaluate(self, ctx: EvalContext) -> EvalResult:
        budget = Budget.of(ctx.timeout_s)
        details: dict[str, Any] = {}
        if ctx.task.hidden_tests is None:
            raise EvaluatorError(f"task {ctx.task.id}: a harbor task needs hidden_tests (tests/)")
        try:
            scoring = await scoring_runtime(ctx, budget, details)
            if isinstance(scoring, EvalResult):
                return scoring
            return await self._verify(ctx, scoring, budget, details)
        except TimedOut as exc:
            return timed_out_result(exc, details)

    async def _verify(
        self, ctx: EvalContext, scoring: Scoring, budget: Budget, details: dict[str, Any]
    ) -> EvalResult:
        runtime = scoring.runtime
        unbound = [p for p in (self.tests_path, self.logs_path) if p not in runtime.spec.binds]
        if unbound:
            raise EvaluatorError(
                f"the runtime does not bind {unbound}; a harbor task needs "
                f"runtime.binds: [{self.tests_path}, {self.logs_path}]"
            )
        cleared = await runtime.exec(
            ["sh", "-c", _CLEAR, "polar-harbor", self.tests_path, self.logs_path],
            timeout_s=budget.clamp(60),
        )
        if not cleared.ok:
            raise EvaluatorError(f"cannot prepare {self.tests_path}: {tail(output(cleared), 300)}")
        await copy_hidden_tests(ctx.task, runtime, self.tests_path)
        script = posixpath.join(self.tests_path, "test.sh")
        result = await runtime.exec(
            ["bash", script],
            cwd=scoring.workspace,
            env={**SAFE_ENV, **self.env},
            timeout_s=budget.clamp(self.verifier_timeout_s),
        )
        details |= {"verifier_exit_code": result.exit_code, "verifier_timed_out": result.timed_out}
        if result.timed_out:
            raise TimedOut("verifier", output(result))
        log = tail(output(result))
        verifier = posixpath.join(self.logs_path, "verifier")
        text = await read_file(runtime, posixpath.join(verifier, "reward.txt"))
        if text is not None:
            reward = clamp_reward(_number(text, "reward.txt"), "reward.txt")
            details["reward_source"] = "reward.txt"
            return EvalResult(reward, reward >= 1.0, details, log)
        data = await read_file(runtime, posixpath.join(verifier, "reward.json"))
        if data is not None:
            reward = clamp_reward(_json_reward(data), "reward.json")
            details["reward_source"] = "reward.json"
            return EvalResult(reward, reward >= 1.0, details, log)
        details |= {"reward_source": None, "reason": "the verifier wrote no reward file"}
        return EvalResult(0.0, False, details, log)


def _number(data: bytes, name: str) -> float:
    try:
        return float(data.decode().strip())
    except (UnicodeDecodeError, ValueError):
        raise EvaluatorError(f"{name} does not hold a number: {data[:80]!r}") from None


def _json_reward(data: bytes) -> float:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise EvaluatorError(f"reward.json is not JSON: {data[:80]!r}") from None
    if isinstance(value, Mapping):
        values = list(value.values())
        if not values or not all(_is_number(v) for v in values):
            raise EvaluatorError(f"reward.json must map names to numbers: {data[:80]!r}")
        return sum(float(v) for v in values) / len(values)
    if _is_number(value):
        return float(value)
    raise EvaluatorError(f"reward.json must be a number or an object of numbers: {data[:80]!r}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
