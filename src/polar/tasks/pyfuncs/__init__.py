"""``pyfuncs``: one-function Python tasks for small models, generated from templates.

Each task asks for one short Python function (write it from a description, or
fix the wrong one in ``solution.py``), shows three examples, and is scored by
the ``pytest`` evaluator on hidden cases copied in after the agent finished.
``examples.py`` in the workspace runs the visible examples (what the
``minicoder`` harness runs between turns). The tasks are made by
:mod:`~polar.tasks.pyfuncs.templates` (arithmetic, string and list
transformations with constants, names and operations as parameters) and
:mod:`~polar.tasks.pyfuncs.family` (deterministic for a seed).

Two named sources, for ``polar submit``, ``polar train`` and
:func:`~polar.tasks.load.load_tasks`: ``pyfuncs:train`` and
``pyfuncs:heldout``. Held-out tasks come from templates never trained on
or from a parameter range of a trained template never trained on (each
template says which, :class:`~polar.tasks.pyfuncs.templates.HeldOut`); their
metadata's ``heldout_by`` names which. Loading writes the family's files once
under ``.cache/tasks`` (relative to the working directory, like the harness
cache; :mod:`~polar.tasks.pyfuncs.files`).
"""

from __future__ import annotations

from pathlib import Path

from polar.tasks.model import Task
from polar.tasks.pyfuncs.family import SEED, Case, FuncTask, Kind, Split, generate
from polar.tasks.pyfuncs.files import CHECK, as_task, directory_name, write_family

__all__ = [
    "CHECK",
    "DEFAULT_DIR",
    "SOURCES",
    "Case",
    "FuncTask",
    "Kind",
    "Split",
    "generate",
    "pyfuncs_tasks",
    "spread",
]

SOURCES = {"pyfuncs:train": Split.TRAIN, "pyfuncs:heldout": Split.HELDOUT}
"""Named sources :func:`~polar.tasks.load.load_tasks` knows, and their split."""

DEFAULT_DIR = Path(".cache/tasks")
"""Where the family's files are written (relative to the working directory)."""


def pyfuncs_tasks(split: Split, root: Path = DEFAULT_DIR, seed: int = SEED) -> list[Task]:
    """The tasks of one split, their files written under ``root`` if not yet there."""
    family = generate(seed)
    directory = write_family(family, root, f"pyfuncs-{seed}")
    return [
        as_task(task, directory / directory_name(task)) for task in family if task.split is split
    ]


def spread(tasks: list[Task], count: int) -> list[Task]:
    """``count`` of ``tasks`` taken in turn from each template (the first of each,
    then the second...), in a fixed order: a small evaluation set that covers the
    family rather than its first template."""
    by_template: dict[str, list[Task]] = {}
    for task in tasks:
        by_template.setdefault(str(task.metadata.get("template")), []).append(task)
    queues = [list(reversed(group)) for group in by_template.values()]
    chosen: list[Task] = []
    while len(chosen) < min(count, len(tasks)):
        for queue in queues:
            if queue and len(chosen) < count:
                chosen.append(queue.pop())
    return chosen
