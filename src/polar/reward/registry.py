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
import dataclasses
import importlib
import math
from collections.abc import Callable, Mapping
from typing import Any

import pydantic

from polar.reward.base import EvalContext, EvalResult, Evaluator, EvaluatorError
from polar.runtime.errors import RuntimeFailure
from polar.tasks.model import EvaluatorSpec
from polar.tasks.parse import describe

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
    factory = _factory(spec.kind)
    config = dict(spec.config)
    try:
        if dataclasses.is_dataclass(factory) and isinstance(factory, type):
            known = {f.name for f in dataclasses.fields(factory) if f.init}
            unknown = sorted(set(config) - known)
            if unknown:
                raise InvalidEvaluatorConfig(
                    f"evaluator {spec.kind}: unknown config {unknown}; it takes {sorted(known)}"
                )
            evaluator = pydantic.TypeAdapter(factory).validate_python(config)
        else:
            evaluator = factory(**config)
    except pydantic.ValidationError as exc:
        raise InvalidEvaluatorConfig(f"evaluator {spec.kind}: {describe(exc)}") from None
    except TypeError as exc:
        raise InvalidEvaluatorConfig(f"evaluator {spec.kind}: {exc}") from None
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
            f"evaluator {kind} did not finish within its budget of {ctx.timeout_s:g} s"
        ) from None
    except Exception as exc:
        raise EvaluatorError(f"evaluator {kind} crashed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(result, EvalResult):
        raise EvaluatorError(f"evaluator {kind} returned {type(result).__name__}, not EvalResult")
    if not (math.isfinite(result.reward) and 0.0 <= result.reward <= 1.0):
        raise EvaluatorError(f"evaluator {kind} returned reward {result.reward}, not in [0, 1]")
    return result


def _factory(ref: str) -> Callable[..., Any]:
    path = EVALUATORS.get(ref, ref)
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise UnknownEvaluator(
            f"unknown evaluator {ref!r}; "
            f"use one of {sorted(EVALUATORS)} or 'package.module:factory'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownEvaluator(f"evaluator {ref}: cannot import {module_name} ({exc})") from None
    factory: object = getattr(module, attr, None)
    if not callable(factory):
        raise UnknownEvaluator(f"evaluator {ref}: {module_name} has no callable {attr!r}")
    return factory
