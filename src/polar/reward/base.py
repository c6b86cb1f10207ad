"""The evaluator contract: score one finished session, in its runtime.

An evaluator is looked up by name (``command``, ``pytest``, ``swebench``,
``harbor``) or as ``package.module:factory``; the factory is called with the
task's :attr:`~polar.tasks.model.EvaluatorSpec.config` as keyword arguments and
returns an object with ``async evaluate(ctx) -> EvalResult``.

Hidden tests reach the workspace only inside :meth:`Evaluator.evaluate`, after
the agent finished, and the built-in evaluators first put back the files a
test runner reads from the workspace (:mod:`polar.reward.hardening`). An
evaluator that cannot score (a crash, a broken config) raises
:class:`EvaluatorError`; the node then ends the session ERROR with the
reason. A session that was scored and failed is not an error: it is a result
with reward 0.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from polar.runtime.base import Runtime
from polar.tasks.baseline import Baseline
from polar.tasks.model import Task


class EvaluatorError(Exception):
    """The evaluator could not produce a score (not: the agent failed the tests)."""


@dataclass(frozen=True, slots=True)
class EvalResult:
    reward: float
    """The outcome reward in [0, 1]."""
    resolved: bool
    """Whether the task counts as solved (e.g. every required test passes)."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """What was measured: per-test outcomes, exit codes, counts (JSON-able)."""
    log: str = ""
    """The tail of the test output, for people."""


@dataclass(frozen=True, slots=True)
class EvalContext:
    task: Task
    runtime: Runtime
    """The live runtime the agent worked in (its workspace as the agent left it)."""
    fresh_runtime: Callable[[], Awaitable[Runtime]]
    """A started runtime holding a fresh copy of the task's initial workspace
    (pre-warmed by the node where it can); the evaluator does not stop it."""
    timeout_s: float
    """What is left of the session's evaluation budget."""
    baseline: Baseline | None = None
    """The live workspace's baseline as the node recorded it at set-up (None: trust
    the workspace's own baseline ref, as in a fresh runtime the agent never saw)."""


@runtime_checkable
class Evaluator(Protocol):
    async def evaluate(self, ctx: EvalContext) -> EvalResult: ...
