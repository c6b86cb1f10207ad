"""The front door for task sources: files, Harbor directories, the built-in suite.

``load_tasks`` takes a ``.jsonl`` / ``.json`` / ``.yaml`` / ``.yml`` /
``.parquet`` file of task rows (SWE-bench instance rows, recognised by
``instance_id`` and ``FAIL_TO_PASS``, may be mixed in), a Harbor task
directory or a directory of them, or a named source: ``"builtin"``, or the
generated ``"pyfuncs:train"`` / ``"pyfuncs:heldout"`` (:mod:`polar.tasks.pyfuncs`).
Either every task loads or a :class:`TaskLoadError` names the first bad one;
nothing is half-loaded.
"""

from __future__ import annotations

from pathlib import Path

from polar.tasks.builtin import SUITE_NAME, builtin_tasks
from polar.tasks.errors import TaskLoadError
from polar.tasks.harbor import is_harbor_task, load_harbor, load_harbor_tasks
from polar.tasks.model import Task
from polar.tasks.parse import check_unique, parse_task
from polar.tasks.pyfuncs import SOURCES as PYFUNCS_SOURCES
from polar.tasks.pyfuncs import pyfuncs_tasks
from polar.tasks.sources import read_rows
from polar.tasks.swebench import is_swebench_row, load_swebench, swebench_task

__all__ = ["load_harbor", "load_swebench", "load_tasks"]


def load_tasks(source: str | Path) -> list[Task]:
    if source == SUITE_NAME:
        return builtin_tasks()
    if isinstance(source, str) and source in PYFUNCS_SOURCES:
        return pyfuncs_tasks(PYFUNCS_SOURCES[source])
    path = Path(source)
    if not path.exists() and str(source).startswith("pyfuncs"):
        raise TaskLoadError(
            f"{source}: no such task source (use {' or '.join(map(repr, PYFUNCS_SOURCES))})"
        )
    if not path.exists():
        raise TaskLoadError(f"{path}: no such file or directory")
    if path.is_dir():
        tasks = [load_harbor(path)] if is_harbor_task(path) else load_harbor_tasks(path)
        check_unique((task.metadata["task_dir"], task) for task in tasks)
        return tasks
    base_dir = path.resolve().parent
    located = []
    for row in read_rows(path):
        if is_swebench_row(row.data):
            task = swebench_task(row.data, where=row.where, base_dir=base_dir)
        else:
            task = parse_task(row.data, base_dir=base_dir, where=row.where)
        located.append((row.where, task))
    check_unique(located)
    return [task for _, task in located]
