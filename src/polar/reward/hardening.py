"""Scoring in a workspace the agent controlled, without letting it pick the verdict.

The agent leaves its workspace behind, and an evaluator then runs a test
runner in it. Everything the runner reads from there could decide the result
instead of the tests: a ``pytest.py`` (or ``json.py``: ``python -m`` puts the
working directory before the standard library on ``sys.path``) shadowing the
runner or a module it imports, a ``conftest.py`` whose hooks turn failures
into passes, ``addopts`` or ``python_functions`` in ``pytest.ini`` /
``pyproject.toml`` / ``setup.cfg`` / ``tox.ini`` that load a plug-in or
collect only the passing tests, a ``sitecustomize.py``, ``.pth`` tricks, a
``PYTHONPATH``, stale bytecode, or commands written into ``.git/config`` that
the evaluator's own git calls would run. So before every evaluator scores
(:func:`harden`, called from :func:`polar.reward.scoring.scoring_runtime` and
by ``swebench`` after it applied the diff):

1. ``.git/config`` and the baseline ref are put back as the node recorded them
   at set-up (:class:`~polar.tasks.baseline.Baseline`, kept out of the
   agent's reach); git then runs without system or user config, hooks,
   fsmonitor or replace refs (:data:`~polar.tasks.baseline.PREAMBLE`);
2. every :data:`RUNNER_FILES` file anywhere in the workspace is restored to
   its baseline content, or removed when the baseline has none (the agent's
   changes to them do not count); every ``__pycache__`` is removed. Without a
   trustworthy baseline (the agent removed ``.git``), they are all removed;
3. commands run with :data:`SAFE_ENV`: no working directory on ``sys.path``
   ahead of anything (``PYTHONSAFEPATH``), no user site; and the ``pytest`` and
   ``swebench`` evaluators start pytest through :data:`PYTEST_RUNNER`, which
   imports pytest in isolated mode (``-I``: no ``PYTHONPATH``, no working
   directory, no user site) and only then *appends* the working directory (and
   any ``PYTHONPATH`` of the evaluator's config) to ``sys.path``, so the tests
   can import the project but nothing in it can stand in for pytest, its
   plug-ins or the standard library.

What remains is inherent to running tests in-process: the code under test is
the agent's, and it runs inside the test process. The hidden tests arrive
after this step, so a ``conftest.py`` they bring is loaded.
"""

from __future__ import annotations

from typing import Any

from polar.reward.base import EvaluatorError
from polar.reward.budget import Budget, TimedOut
from polar.reward.transfer import eval_path, output, tail, write_file
from polar.runtime.base import Runtime
from polar.tasks.baseline import BASELINE_REF, NO_GIT_EXIT, PREAMBLE, Baseline

RUNNER_FILES = (
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    "pytest.py",
    "sitecustomize.py",
    "usercustomize.py",
)
"""Files a test runner reads from the workspace by name."""

SAFE_ENV = {
    "PYTHONSAFEPATH": "1",
    "PYTHONNOUSERSITE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}
"""Every evaluator command's environment (a task's ``env`` may override it)."""

_BOOTSTRAP = (
    "import os, sys; import pytest; "
    "sys.path += [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]; "
    "sys.path.append(os.getcwd()); sys.exit(pytest.console_main())"
)
PYTEST_RUNNER = ("python", "-I", "-c", _BOOTSTRAP)
"""The default pytest command of the ``pytest`` and ``swebench`` evaluators."""

HARDEN_TIMEOUT_S = 120.0

_NAMES = " -o ".join(f"-name '{name}'" for name in RUNNER_FILES)
_PATTERN = "|".join(name.replace(".", "\\.") for name in RUNNER_FILES)

_HARDEN = f"""{PREAMBLE}
base="$1"; config="$2"
trusted=0
if [ -d .git ] && [ ! -L .git ]; then
  if [ -n "$config" ]; then cat -- "$config" > .git/config; fi
  if [ -n "$base" ]; then
    if g cat-file -e "$base^{{commit}}" 2>/dev/null; then
      g update-ref {BASELINE_REF} "$base" && trusted=1
    fi
  elif g rev-parse -q --verify '{BASELINE_REF}^{{commit}}' >/dev/null; then
    trusted=1
  fi
fi
find . -name .git -prune -o -name __pycache__ -type d -prune -exec rm -rf {{}} + \\
  2>/dev/null || true
list=$(find . -name .git -prune -o \\( {_NAMES} \\) -print | sed 's|^\\./||')
if [ "$trusted" = 1 ]; then
  list="$list
$(g -c core.quotePath=false ls-tree -r --name-only {BASELINE_REF} \\
    | grep -E '(^|/)({_PATTERN})$' || true)"
fi
printf '%s\\n' "$list" | sort -u | while IFS= read -r path; do
  [ -n "$path" ] || continue
  rm -rf -- "$path"
  if [ "$trusted" = 1 ] && g cat-file -e "{BASELINE_REF}:$path" 2>/dev/null; then
    g checkout -q {BASELINE_REF} -- "$path" && echo "restored $path"
  else
    echo "removed $path"
  fi
done
echo "trusted=$trusted"
"""


async def harden(
    runtime: Runtime, workspace: str, baseline: Baseline | None, budget: Budget
) -> dict[str, Any]:
    """Put the test runner's files in ``workspace`` back (see the module docstring);
    the details say what was restored or removed."""
    config = ""
    if baseline is not None:
        config = eval_path(runtime, "git-config")
        await write_file(runtime, config, baseline.git_config.encode())
    result = await runtime.exec(
        ["sh", "-c", _HARDEN, "polar-harden", baseline.commit if baseline else "", config],
        cwd=workspace,
        timeout_s=budget.clamp(HARDEN_TIMEOUT_S),
    )
    if result.timed_out:
        raise TimedOut("hardening the workspace", output(result))
    lines = result.stdout.splitlines()
    if result.exit_code == NO_GIT_EXIT:
        # No git here: nothing can be restored, so every runner file goes.
        result = await runtime.exec(
            ["sh", "-c", _REMOVE_ALL],
            cwd=workspace,
            timeout_s=budget.clamp(HARDEN_TIMEOUT_S),
        )
        lines = result.stdout.splitlines()
    if not result.ok:
        raise EvaluatorError(
            f"cannot put the test runner's files back in {workspace}: "
            f"{' '.join(tail(output(result), 400).split())}"
        )
    return {
        "hardening": "baseline" if "trusted=1" in lines else "removed",
        "restored": [line[9:] for line in lines if line.startswith("restored ")],
        "removed": [line[8:] for line in lines if line.startswith("removed ")],
    }


_REMOVE_ALL = f"""find . -name __pycache__ -type d -prune -exec rm -rf {{}} + 2>/dev/null || true
find . \\( {_NAMES} \\) -print -exec rm -rf {{}} + | sed 's|^\\./|removed |'
echo trusted=0
"""
