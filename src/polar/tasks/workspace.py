"""Preparing a task's workspace: copy or check it out, run set-up, record the baseline.

The node's order for one session (and for each fresh evaluation copy):

1. :func:`materialize` the task into ``<session_dir>/workspace`` on the host
   (a directory workspace is copied, a git workspace fetched at its commit; an
   image workspace is already in the image);
2. create and start the runtime with :func:`runtime_spec_for` (the task's own
   runtime settings over the node's defaults);
3. :func:`run_setup`: the task's set-up commands in the workspace, then the
   baseline snapshot (:mod:`polar.tasks.baseline`);
4. the agent runs; then the evaluator scores.

Host-side git calls set the identity and hooks per command; no git config is
written anywhere (but in a throw-away scratch repository of our own).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import assert_never

from polar.runtime.base import Runtime, RuntimeSpec
from polar.tasks.baseline import NO_GIT_EXIT, Baseline, parse_baseline, record_baseline_argv
from polar.tasks.errors import SetupError, WorkspaceError
from polar.tasks.model import DirectoryWorkspace, GitWorkspace, ImageWorkspace, Task

WORKSPACE_DIR = "workspace"
COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
GIT_SETTINGS = tuple(
    part
    for setting in (
        "user.name=Polar",
        "user.email=polar@localhost",
        "commit.gpgsign=false",
        "core.hooksPath=/dev/null",
        "init.defaultBranch=main",
        "advice.detachedHead=false",
    )
    for part in ("-c", setting)
)
OUTPUT_TAIL = 2000
"""Characters of a failed command's output kept in its error."""


def workspace_path(task: Task, runtime: Runtime) -> str:
    """Where the task's workspace is inside ``runtime``."""
    if isinstance(task.workspace, ImageWorkspace):
        return task.workspace.path
    return str(runtime.session_dir / WORKSPACE_DIR)


def runtime_spec_for(task: Task, default: RuntimeSpec) -> RuntimeSpec:
    """The node's ``default`` spec with the settings the task set itself.

    Only fields the task's runtime spec sets to something other than their
    default are taken (:meth:`RuntimeSpec.asked`); ``env`` and
    ``options`` are merged (the task wins), ``binds`` and ``mounts`` added.
    """
    own = task.runtime
    if own is None:
        return default
    update = {name: getattr(own, name) for name in own.asked()}
    if "env" in update:
        update["env"] = default.env | own.env
    if "options" in update:
        update["options"] = default.options | own.options
    if "binds" in update:
        update["binds"] = tuple(dict.fromkeys((*default.binds, *own.binds)))
    if "mounts" in update:
        taken = {mount.path for mount in own.mounts}
        kept = tuple(mount for mount in default.mounts if mount.path not in taken)
        update["mounts"] = (*kept, *own.mounts)
    return default.model_copy(update=update)


async def materialize(task: Task, session_dir: Path) -> Path | None:
    """Put the task's initial workspace at ``<session_dir>/workspace``.

    The result is a git repository whose ``HEAD`` is the initial state (a
    copied directory that is not one gets ``git init`` and one commit). Returns
    the host path, or None for an image workspace (nothing to do on the host).
    """
    target = session_dir / WORKSPACE_DIR
    workspace = task.workspace
    match workspace:
        case ImageWorkspace():
            return None
        case DirectoryWorkspace():
            _check_empty(target)
            await _copy(workspace.path, target)
            if not (target / ".git").exists():
                await _git(target, "init", "-q")
                await _git(target, "add", "-A")
                await _git(
                    target, "commit", "-q", "--no-verify", "--allow-empty", "-m", "Initial state"
                )
        case GitWorkspace():
            _check_empty(target)
            target.mkdir(parents=True, exist_ok=True)
            await _git(target, "init", "-q")
            await _checkout(target, workspace.repo, workspace.commit)
        case _:
            assert_never(workspace)
    return target


async def run_setup(
    task: Task, runtime: Runtime, *, timeout_s: float | None = None
) -> Baseline | None:
    """Run the task's set-up commands (``bash -c``) in the workspace, then record
    the baseline the agent's diff is taken against, and return it.

    ``timeout_s`` bounds each command. A failed command raises
    :class:`SetupError` naming it with its output tail; a runtime without
    ``git`` gets no baseline (None; evaluators that need a diff say so later).
    """
    cwd = workspace_path(task, runtime)
    for index, command in enumerate(task.setup, start=1):
        result = await runtime.exec(["bash", "-c", command], cwd=cwd, timeout_s=timeout_s)
        if not result.ok:
            status = "timed out" if result.timed_out else f"exit {result.exit_code}"
            raise SetupError(
                f"task {task.id}: set-up command {index} of {len(task.setup)} failed "
                f"({status}): {command!r}\n{_tail(result.stdout + result.stderr)}"
            )
    result = await runtime.exec(record_baseline_argv(), cwd=cwd, timeout_s=timeout_s)
    if result.exit_code == NO_GIT_EXIT:
        return None
    if not result.ok:
        raise SetupError(
            f"task {task.id}: cannot record the workspace baseline in {cwd}\n"
            f"{_tail(result.stdout + result.stderr)}"
        )
    return parse_baseline(result.stdout)


def _check_empty(target: Path) -> None:
    if target.exists() and any(target.iterdir()):
        raise WorkspaceError(f"{target} already exists and is not empty")


async def _copy(source: Path, target: Path) -> None:
    def copy() -> None:
        shutil.copytree(source, target, symlinks=True, ignore=COPY_IGNORE, dirs_exist_ok=True)

    try:
        await asyncio.to_thread(copy)
    except (OSError, shutil.Error) as exc:
        raise WorkspaceError(f"cannot copy {source} to {target}: {exc}") from None


async def _checkout(target: Path, repo: str, commit: str) -> None:
    """Fetch only ``commit``: no history after it, no remote, no stray objects."""
    shallow = await _run_git(target, "fetch", "-q", "--depth", "1", repo, commit)
    if shallow.returncode != 0:
        # Servers that refuse a fetch by id, and abbreviated ids: fetch everything
        # into a scratch repository, find the commit there, and fetch just that
        # commit from it, so no later commit's objects reach the workspace.
        with tempfile.TemporaryDirectory(prefix=".polar-fetch-", dir=target.parent) as scratch:
            full = await _resolve_commit(Path(scratch), repo, commit)
            await _git(target, "fetch", "-q", "--depth", "1", f"file://{scratch}", full)
    await _git(target, "reset", "-q", "--hard", "FETCH_HEAD")
    (target / ".git" / "FETCH_HEAD").unlink(missing_ok=True)


async def _resolve_commit(scratch: Path, repo: str, commit: str) -> str:
    await _git(scratch, "init", "-q", "--bare")
    # Our own throw-away repository: let the workspace fetch a commit by id from it.
    await _git(scratch, "config", "uploadpack.allowAnySHA1InWant", "true")
    await _git(
        scratch,
        "fetch",
        "-q",
        repo,
        "+refs/heads/*:refs/heads/*",
        "+refs/tags/*:refs/tags/*",
    )
    found = await _run_git(scratch, "rev-parse", "-q", "--verify", f"{commit}^{{commit}}")
    if found.returncode != 0:
        raise WorkspaceError(f"{repo}: no commit {commit!r}")
    return found.stdout.strip()


@dataclass(frozen=True, slots=True)
class _GitResult:
    returncode: int
    stdout: str
    stderr: str


async def _run_git(cwd: Path, *args: str) -> _GitResult:
    try:
        process = await asyncio.create_subprocess_exec(
            "git",
            *GIT_SETTINGS,
            *args,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # no terminal: a credential prompt fails instead of hanging
        )
    except OSError as exc:
        raise WorkspaceError(f"cannot run git: {exc.strerror or exc}") from None
    stdout, stderr = await process.communicate()
    return _GitResult(
        process.returncode if process.returncode is not None else -1,
        stdout.decode(errors="replace"),
        stderr.decode(errors="replace"),
    )


async def _git(cwd: Path, *args: str) -> None:
    result = await _run_git(cwd, *args)
    if result.returncode != 0:
        raise WorkspaceError(
            f"git {' '.join(args)} failed in {cwd} (exit {result.returncode}): "
            f"{_tail(result.stderr).strip()}"
        )


def _tail(text: str) -> str:
    return text[-OUTPUT_TAIL:]
