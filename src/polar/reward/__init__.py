"""Evaluators: score a finished session in its runtime (see :mod:`polar.reward.base`).

Built-ins: ``command`` (exit status or a reward file), ``pytest`` (hidden
tests, per-test outcomes, pass/fail or fraction), ``swebench`` (the agent's
diff on a fresh checkout, FAIL_TO_PASS and PASS_TO_PASS), ``harbor``
(``tests/test.sh`` writing ``reward.txt`` / ``reward.json``). Any other
evaluator is a ``package.module:factory``.
"""

from polar.reward.base import EvalContext, EvalResult, Evaluator, EvaluatorError
from polar.reward.registry import (
    EVALUATORS,
    EvaluatorTimeout,
    InvalidEvaluatorConfig,
    UnknownEvaluator,
    evaluate,
    load_evaluator,
)

__all__ = [
    "EVALUATORS",
    "EvalContext",
    "EvalResult",
    "Evaluator",
    "EvaluatorError",
    "EvaluatorTimeout",
    "InvalidEvaluatorConfig",
    "UnknownEvaluator",
    "evaluate",
    "load_evaluator",
]
