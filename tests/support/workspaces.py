"""Real runtimes for task and evaluator tests: materialize, start, set up, score.

``sandbox_spec`` is the bubblewrap sandbox the node uses by default, with the
virtualenv and its base interpreter mounted read-only (so ``python -m pytest``
works inside); ``host_spec`` runs plain host processes (``sandbox: false``).
Both put this virtualenv's Python first on the PATH.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from polar.reward import EvalContext
from polar.runtime import Mount, Runtime, RuntimeSpec, create_runtime
from polar.tasks import Task, materialize, run_setup, runtime_spec_for, workspace_path
from polar.tasks.baseline import Baseline

T = TypeVar("T")

PATH = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
TEST_ENV = {"PATH": PATH, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
"""The task repositories need no pytest plug-ins; not loading this virtualenv's
(hypothesis, anyio) saves a third of every pytest start."""


def host_spec(**fields: Any) -> RuntimeSpec:
    return RuntimeSpec(**{"sandbox": False, "network": "host", "env": TEST_ENV, **fields})


def sandbox_spec(**fields: Any) -> RuntimeSpec:
    mounts = tuple(dict.fromkeys((Path(sys.prefix), Path(sys.base_prefix))))
    defaults = {"network": "none", "env": TEST_ENV, "mounts": [Mount(path=p) for p in mounts]}
    return RuntimeSpec(**{**defaults, **fields})


class Sessions:
    """Starts sessions of tasks under ``root``; :meth:`close` stops them all."""

    def __init__(self, root: Path, spec: RuntimeSpec | None = None) -> None:
        self.root = root
        self.spec = spec or sandbox_spec()
        self.runtimes: list[Runtime] = []
        self.baselines: dict[int, Baseline | None] = {}
        """The baseline each runtime's set-up recorded (by ``id``), as the node keeps it."""

    async def start(self, task: Task, name: str | None = None) -> Runtime:
        """materialize -> start -> run_setup, as the node does."""
        session_dir = self.root / (name or f"session-{len(self.runtimes)}")
        await materialize(task, session_dir)
        runtime = create_runtime(runtime_spec_for(task, self.spec), session_dir)
        self.runtimes.append(runtime)
        await runtime.start()
        self.baselines[id(runtime)] = await run_setup(task, runtime)
        return runtime

    def context(
        self,
        task: Task,
        runtime: Runtime,
        timeout_s: float = 60.0,
        fresh: Callable[[], Awaitable[Runtime]] | None = None,
    ) -> EvalContext:
        """The evaluation context of a finished session; fresh copies start on demand."""

        async def start_fresh() -> Runtime:
            return await self.start(task)

        return EvalContext(
            task=task,
            runtime=runtime,
            fresh_runtime=fresh or start_fresh,
            timeout_s=timeout_s,
            baseline=self.baselines.get(id(runtime)),
        )

    async def close(self) -> None:
        for runtime in self.runtimes:
            await runtime.stop()


async def shell(runtime: Runtime, script: str, cwd: str | None = None) -> str:
    """Run ``script`` with bash in the runtime (as a scripted agent would); its stdout."""
    result = await runtime.exec(["bash", "-c", script], cwd=cwd)
    assert result.ok, result.stdout + result.stderr
    return result.stdout


async def agent(runtime: Runtime, task: Task, script: str) -> str:
    """A one-step scripted agent: ``script`` run with bash in the task's workspace."""
    return await shell(runtime, script, cwd=workspace_path(task, runtime))


async def exists(runtime: Runtime, path: str) -> bool:
    """Whether ``path`` exists as the runtime sees it."""
    result = await runtime.exec(["test", "-e", path])
    return result.exit_code == 0


def patch_command(patch: str) -> str:
    """A shell command applying ``patch`` from a here-document (a one-step agent)."""
    return f"patch -p1 --batch <<'POLAR_PATCH_EOF'\n{patch}POLAR_PATCH_EOF\n"


def with_sessions(
    root: Path, scenario: Callable[[Sessions], Awaitable[T]], spec: RuntimeSpec | None = None
) -> T:
    """Run ``scenario`` on an event loop with a :class:`Sessions`, closed afterwards."""

    async def main() -> T:
        sessions = Sessions(root, spec)
        try:
            return await scenario(sessions)
        finally:
            await sessions.close()

    return asyncio.run(main())


def write_tree(root: Path, files: Mapping[str, str]) -> Path:
    """Write ``files`` (relative path -> text) under ``root``; returns ``root``."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    root.mkdir(parents=True, exist_ok=True)
    return root


GIT = (
    "git",
    "-c",
    "user.name=Test",
    "-c",
    "user.email=test@localhost",
    "-c",
    "commit.gpgsign=false",
)


def git(repo: Path, *args: str, check: bool = True) -> str:
    """Run host git in ``repo``; its stdout, stripped (``check``: fail on a non-zero exit)."""
    done = subprocess.run(
        [*GIT, *args], cwd=repo, check=check, capture_output=True, text=True, timeout=60
    )
    return done.stdout.strip()


def commit_tree(repo: Path, files: Mapping[str, str], message: str) -> str:
    """Write ``files`` into the git repository ``repo`` (created if needed) and
    commit everything; the new commit's id."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        git(repo, "init", "-q", "-b", "main")
    write_tree(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")
