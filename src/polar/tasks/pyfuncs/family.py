"""The ``pyfuncs`` tasks, generated from the templates: deterministic for a seed.

Each template's parameter point gives a ``write`` task and, for a fixable
template, a ``fix`` task (the same function, its wrong body in ``solution.py``
and shown in the instruction). A task's randomness (its function name, its
inputs) comes from a :class:`random.Random` seeded with the seed and the task's
id, so one task never changes because another was added.

Expected outputs come from running the reference body here, at generation; a
template whose wrong body agrees with the reference on every input, or whose
output cannot be written as a Python literal, is a bug and raises
:class:`GenerationError`. Every task has :data:`VISIBLE` visible examples
(shown in the instruction and checked by ``examples.py``) and hidden cases
(the visible ones plus up to :data:`HIDDEN` more); the visible examples
include one the wrong body fails, so a ``fix`` task's examples show its bug.
"""

from __future__ import annotations

import ast
import copy
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from random import Random
from typing import Any, assert_never

from polar.tasks.pyfuncs.templates import TEMPLATES, Args, Params, Template

SEED = 31
VISIBLE = 3
HIDDEN = 9
"""Hidden cases beyond the visible ones (fewer when a template has fewer inputs)."""
MIN_CASES = 10
"""Distinct inputs a task needs at least (visible and hidden together)."""
FILE = "solution.py"


class GenerationError(Exception):
    """A template that cannot make a valid task (a bug in the template)."""


class Split(StrEnum):
    TRAIN = "train"
    HELDOUT = "heldout"


class Kind(StrEnum):
    WRITE = "write"
    """Write the function from its description."""
    FIX = "fix"
    """Fix the wrong function given in ``solution.py``."""


@dataclass(frozen=True, slots=True)
class Case:
    args: Args
    expected: Any

    def call(self, function: str) -> str:
        """The call as Python source: ``f(1, 'a')``."""
        return f"{function}({', '.join(repr(arg) for arg in self.args)})"


@dataclass(frozen=True, slots=True)
class FuncTask:
    """One generated task, with what a test or a scripted agent needs to solve it."""

    id: str
    template: str
    params: Params
    split: Split
    kind: Kind
    function: str
    instruction: str
    reference: str
    """A correct ``solution.py``."""
    wrong: str
    """A ``solution.py`` that fails some hidden case (a ``fix`` task's starting file)."""
    visible: tuple[Case, ...]
    hidden: tuple[Case, ...]
    """Every case the hidden tests check (the visible ones first)."""
    heldout_by: str | None
    """For held-out tasks: ``template`` (a template never trained on) or the
    parameter whose range is held out."""


def generate(seed: int = SEED) -> list[FuncTask]:
    """Every task of the family, train and held-out, in template order."""
    return [task for template in TEMPLATES for task in _tasks(template, seed)]


def _tasks(template: Template, seed: int) -> Iterator[FuncTask]:
    for params in template.grid:
        kinds = (Kind.WRITE, Kind.FIX) if template.fixable else (Kind.WRITE,)
        for kind in kinds:
            yield _task(template, params, kind, seed)


def task_id(template: Template, params: Params, kind: Kind) -> str:
    """``pyfuncs/<template>/<param><value>/...`` (``/fix`` for a fix task)."""
    parts = ["pyfuncs", template.name, *(f"{key}{value}" for key, value in params.items())]
    if kind is Kind.FIX:
        parts.append("fix")
    return "/".join(parts)


def _task(template: Template, params: Params, kind: Kind, seed: int) -> FuncTask:
    identifier = task_id(template, params, kind)
    rng = Random(f"{seed}:{identifier}")
    function = rng.choice(template.names)
    reference = source(function, template.args, template.body(params))
    wrong = source(function, template.args, template.wrong(params))
    run_reference = compiled(reference, function)
    run_wrong = compiled(wrong, function)
    cases: list[Case] = []
    failing: list[Case] = []
    seen: set[str] = set()
    for args in template.inputs(rng, params):
        key = repr(args)
        if key in seen:
            continue
        seen.add(key)
        case = Case(args, run_reference(*copy.deepcopy(args)))
        _check_literal(identifier, case)
        cases.append(case)
        if not _agrees(run_wrong, case):
            failing.append(case)
    if not failing:
        raise GenerationError(f"{identifier}: the wrong body passes every input")
    if len(cases) < MIN_CASES:
        raise GenerationError(f"{identifier}: {len(cases)} distinct inputs, fewer than {MIN_CASES}")
    visible = _visible(rng, cases, failing[0])
    hidden = (*visible, *[case for case in cases if case not in visible][:HIDDEN])
    split = Split.HELDOUT if template.heldout.holds(params) else Split.TRAIN
    heldout_by = None
    if split is Split.HELDOUT:
        heldout_by = template.heldout.key or "template"
    description = template.describe(params)
    return FuncTask(
        id=identifier,
        template=template.name,
        params=dict(params),
        split=split,
        kind=kind,
        function=function,
        instruction=instruction(kind, function, template.args, description, wrong, visible),
        reference=reference,
        wrong=wrong,
        visible=visible,
        hidden=hidden,
        heldout_by=heldout_by,
    )


def _visible(rng: Random, cases: list[Case], failing: Case) -> tuple[Case, ...]:
    """:data:`VISIBLE` cases in their order, drawn at random but for one the
    wrong body fails (a ``fix`` task's examples show its bug)."""
    others = [case for case in cases if case != failing]
    drawn = [failing, *rng.sample(others, min(VISIBLE - 1, len(others)))]
    return tuple(case for case in cases if case in drawn)


def source(function: str, args: str, body: str) -> str:
    return f"def {function}({args}):\n{textwrap.indent(body, '    ')}\n"


def compiled(code: str, function: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {}
    exec(compile(code, FILE, "exec"), namespace)  # our own templates' code
    result: Callable[..., Any] = namespace[function]
    return result


def _agrees(function: Callable[..., Any], case: Case) -> bool:
    try:
        return bool(function(*copy.deepcopy(case.args)) == case.expected)
    except Exception:
        return False


def _check_literal(identifier: str, case: Case) -> None:
    for value in (*case.args, case.expected):
        if ast.literal_eval(repr(value)) != value:
            raise GenerationError(f"{identifier}: {value!r} is not a Python literal")


def instruction(
    kind: Kind,
    function: str,
    args: str,
    description: str,
    wrong: str,
    visible: tuple[Case, ...],
) -> str:
    examples = "\n".join(f"assert {case.call(function)} == {case.expected!r}" for case in visible)
    match kind:
        case Kind.WRITE:
            head = f"In `{FILE}`, write a Python function `{function}({args})` that {description}."
        case Kind.FIX:
            head = (
                f"The function `{function}({args})` in `{FILE}` has a bug. It should be a "
                f"function that {description}. Fix it. The code now:\n\n```python\n{wrong}```"
            )
        case _:
            assert_never(kind)
    return f"{head}\n\nExamples:\n{examples}\n"
