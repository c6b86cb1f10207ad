"""Evaluators by name or ``package.module:factory``, and the one place they are run.

A factory gets the task's ``evaluator.config`` as keyword arguments. Built-ins
(and any plug-in that is a dataclass) have their config validated against the
dataclass's fields first, so a typo or a wrong type is one clear line.

:func:`evaluate` is the choke point the node calls: it loads the evaluator,
runs it, and turns every way it can fail to score (a runtime failure, a crash
of a plug-in, running past the budget, a reward outside [0, 1]) into an
:class:`EvaluatorError`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping

from polar.plugins import build, load_factory
from polar.reward.base import EvalContext, EvalResult, Evaluator, EvaluatorError
from polar.runtime.errors import RuntimeFailure
from polar.tasks.model import EvaluatorSpec

EVALUATORS: Mapping[str, str] = {
    "command": "polar.reward.command:CommandEvaluator",
    "pytest": "polar.reward.pytest_suite:PytestEvaluator",
    "swebench": "polar.reward.swebench:SwebenchEvaluator",
    "harbor": "polar.reward.harbor:HarborEvaluator",
}
"""Built-in evaluators: name -> dotted path of the factory."""

OVERRUN_GRACE_S = 10.0
"""How far past ``ctx.timeout_s`` an evaluator may run before it is cancelled
(at most; never more than the budget itself, so a short budget stays short)."""


class UnknownEvaluator(EvaluatorError):
    """No evaluator of that name, or a dotted path that does not lead to one."""


class InvalidEvaluatorConfig(EvaluatorError):
    """A config the evaluator's factory does not accept."""


class EvaluatorTimeout(EvaluatorError):
    """The evaluator itself ran past its budget (distinct from tests timing out,
    which is a result with reward 0)."""


def load_evaluator(spec: EvaluatorSpec) -> Evaluator:
    """The evaluator ``spec.kind`` names, built from ``spec.config``."""
    factory = load_factory(spec.kind, kind="evaluator", known=EVALUATORS, error=UnknownEvaluator)
    evaluator = build(
        factory,
        spec.config,
        label=f"evaluator {spec.kind}",
        noun="config",
        error=InvalidEvaluatorConfig,
    )
    if not isinstance(evaluator, Evaluator):
        raise UnknownEvaluator(
            f"evaluator {spec.kind} returned {type(evaluator).__name__}, "
            "which has no async evaluate(ctx)"
        )
    return evaluator


async def evaluate(ctx: EvalContext, evaluator: Evaluator | None = None) -> EvalResult:
    """Score one finished session with its task's evaluator (or ``evaluator``)."""
    kind = ctx.task.evaluator.kind
    if evaluator is None:
        evaluator = load_evaluator(ctx.task.evaluator)
    try:
        async with asyncio.timeout(ctx.timeout_s + min(OVERRUN_GRACE_S, ctx.timeout_s)):
            result = await evaluator.evaluate(ctx)
    except EvaluatorError:
        raise
    except RuntimeFailure as exc:
        raise EvaluatorError(f"evaluator {kind}: runtime failure: {exc}") from exc
    except TimeoutError:
        raise EvaluatorTimeout(
            f"evaluator {kind} did not finish within its budget of {ctx.timeout_s:g} s "
            "(the task's evaluator.timeout_s)"
        ) from None
    except Exception as exc:
        raise EvaluatorError(f"evaluator {kind} crashed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(result, EvalResult):
        raise EvaluatorError(f"evaluator {kind} returned {type(result).__name__}, not EvalResult")
    if not (math.isfinite(result.reward) and 0.0 <= result.reward <= 1.0):
        raise EvaluatorError(f"evaluator {kind} returned reward {result.reward}, not in [0, 1]")
    return result
