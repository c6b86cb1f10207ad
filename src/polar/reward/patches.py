"""The agent's changes as a patch: taken in one runtime, applied in another.

:func:`take_diff` diffs the workspace against the baseline commit recorded by
:func:`polar.tasks.workspace.run_setup` (tracked, untracked and committed
changes alike; ``.gitignore``'d files and Python caches left out) through a
throw-away index, so the agent's repository is not touched. The patch is
binary-safe (``--binary``), uses ``a/``/``b/`` prefixes and no rename
detection, whatever the repository's config says.

:func:`apply_diff` tries ``git apply`` (atomic) and falls back to ``patch -p1
--fuzz=5`` (checked with ``--dry-run`` first, so a failed fallback changes
nothing either).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from polar.reward.base import EvaluatorError
from polar.reward.budget import Budget, TimedOut
from polar.reward.transfer import eval_path, output, read_file, tail, write_file
from polar.runtime.base import Runtime
from polar.tasks.baseline import (
    BASELINE_REF,
    NO_BASELINE_EXIT,
    NO_GIT_EXIT,
    PREAMBLE,
    STAGE_ALL,
    Baseline,
)

DIFF_TIMEOUT_S = 120.0
APPLY_TIMEOUT_S = 60.0
PATCH_FUZZ = 5

_TAKE_DIFF = f"""{PREAMBLE}
if [ -n "$3" ] && [ -d .git ] && [ ! -L .git ]; then cat -- "$3" > .git/config; fi
if [ -n "$2" ]; then g update-ref {BASELINE_REF} "$2"; fi
g rev-parse -q --verify '{BASELINE_REF}^{{commit}}' >/dev/null || {{
  echo "the workspace has no baseline commit ({BASELINE_REF}); run_setup records it" >&2
  exit {NO_BASELINE_EXIT}
}}
out="$1"
mkdir -p "$(dirname "$out")"
export GIT_INDEX_FILE="$(g rev-parse --absolute-git-dir)/polar-diff-index"
rm -f "$GIT_INDEX_FILE"
g read-tree {BASELINE_REF}
{STAGE_ALL}
g diff --cached --binary --no-color --no-ext-diff --no-textconv --no-renames \\
  --src-prefix=a/ --dst-prefix=b/ {BASELINE_REF} >"$out"
g diff --cached --name-only --no-renames {BASELINE_REF}
rm -f "$GIT_INDEX_FILE"
"""

_GIT_APPLY = f"""{PREAMBLE}
g apply --verbose --whitespace=nowarn "$1"
"""

_PATCH_APPLY = f"""set -eu
patch --batch --fuzz={PATCH_FUZZ} -p1 --dry-run -i "$1"
patch --batch --fuzz={PATCH_FUZZ} -p1 --no-backup-if-mismatch -i "$1"
"""

_RESTORE = f"""{PREAMBLE}
for path in "$@"; do
  if g cat-file -e "{BASELINE_REF}:$path" 2>/dev/null; then
    g checkout -q {BASELINE_REF} -- "$path"
  else
    rm -rf -- "$path"
  fi
done
"""


class ApplyMethod(StrEnum):
    GIT_APPLY = "git_apply"
    PATCH = "patch"


@dataclass(frozen=True, slots=True)
class AgentDiff:
    patch: bytes
    files: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not self.patch.strip()

    def details(self) -> dict[str, Any]:
        return {"diff_bytes": len(self.patch), "diff_files": list(self.files)}


@dataclass(frozen=True, slots=True)
class Applied:
    method: ApplyMethod | None
    """How the patch went in; None when it did not apply (nothing was changed)."""
    log: str


async def take_diff(
    runtime: Runtime, workspace: str, budget: Budget, baseline: Baseline | None = None
) -> AgentDiff:
    """The agent's changes in ``workspace`` against the baseline, as a patch.

    With ``baseline`` (the node's record), the repository's config and baseline
    ref are put back first, so the agent can neither move the baseline nor have
    git run a command of its own (see :mod:`polar.reward.hardening`)."""
    target = eval_path(runtime, "agent.patch")
    config = ""
    if baseline is not None:
        config = eval_path(runtime, "git-config")
        await write_file(runtime, config, baseline.git_config.encode())
    commit = baseline.commit if baseline is not None else ""
    result = await runtime.exec(
        ["sh", "-c", _TAKE_DIFF, "polar-diff", target, commit, config],
        cwd=workspace,
        timeout_s=budget.clamp(DIFF_TIMEOUT_S),
    )
    if result.timed_out:
        raise TimedOut("diff", output(result))
    if result.exit_code in (NO_GIT_EXIT, NO_BASELINE_EXIT) or not result.ok:
        raise EvaluatorError(
            f"cannot take the agent's diff in {workspace}: {_line(output(result))}"
        )
    patch = await read_file(runtime, target)
    if patch is None:
        raise EvaluatorError(f"the agent's diff was not written to {target}")
    return AgentDiff(patch, tuple(result.stdout.splitlines()))


async def apply_diff(
    runtime: Runtime, workspace: str, patch: bytes, budget: Budget, *, name: str = "agent.patch"
) -> Applied:
    """Apply ``patch`` in ``workspace``: ``git apply``, else ``patch -p1``.

    The patch is written to ``<session_dir>/eval/<name>`` in ``runtime`` first.
    """
    target = eval_path(runtime, name)
    await write_file(runtime, target, patch)
    logs = []
    for method, script in ((ApplyMethod.GIT_APPLY, _GIT_APPLY), (ApplyMethod.PATCH, _PATCH_APPLY)):
        result = await runtime.exec(
            ["sh", "-c", script, f"polar-{method}", target],
            cwd=workspace,
            timeout_s=budget.clamp(APPLY_TIMEOUT_S),
        )
        logs.append(f"$ {method}\n{output(result)}")
        if result.timed_out:
            raise TimedOut(f"apply ({method})", "\n".join(logs))
        if result.ok:
            return Applied(method, "\n".join(logs))
    return Applied(None, "\n".join(logs))


async def restore_paths(runtime: Runtime, workspace: str, paths: list[str], budget: Budget) -> None:
    """Put ``paths`` back to their baseline state (removed if the baseline lacks them)."""
    if not paths:
        return
    result = await runtime.exec(
        ["sh", "-c", _RESTORE, "polar-restore", *paths],
        cwd=workspace,
        timeout_s=budget.clamp(APPLY_TIMEOUT_S),
    )
    if result.timed_out:
        raise TimedOut("restore test files", output(result))
    if not result.ok:
        raise EvaluatorError(f"cannot restore {paths} in {workspace}: {_line(output(result))}")


_PATCH_PATH = re.compile(r"^(?:---|\+\+\+) (?:a|b)/(\S+)")


def patch_paths(patch: str) -> list[str]:
    """The files a unified diff (with ``a/``/``b/`` prefixes) touches, in order."""
    paths: dict[str, None] = {}
    for line in patch.splitlines():
        match = _PATCH_PATH.match(line)
        if match:
            paths[match[1]] = None
    return list(paths)


def _line(text: str) -> str:
    return " ".join(tail(text, 600).split())
