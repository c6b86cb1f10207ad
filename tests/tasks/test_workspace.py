"""Preparing a session's workspace: materialize, run_setup and the baseline, in real runtimes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from polar.runtime import Mount, RuntimeSpec, create_runtime
from polar.tasks import (
    DirectoryWorkspace,
    EvaluatorSpec,
    GitWorkspace,
    ImageWorkspace,
    SetupError,
    Task,
    WorkspaceError,
    materialize,
    run_setup,
    runtime_spec_for,
    workspace_path,
)
from polar.tasks.baseline import BASELINE_REF

from support.workspaces import (
    Sessions,
    agent,
    commit_tree,
    git,
    host_spec,
    sandbox_spec,
    with_sessions,
    write_tree,
)

COMMAND = EvaluatorSpec(kind="command", config={"command": "true"})


def directory_task(path: Path, *setup: str) -> Task:
    return Task(
        id="dir-task",
        instruction="Do it.",
        workspace=DirectoryWorkspace(path=path),
        setup=setup,
        evaluator=COMMAND,
    )


def git_task(repo: str, commit: str) -> Task:
    return Task(
        id="git-task",
        instruction="Do it.",
        workspace=GitWorkspace(repo=repo, commit=commit),
        evaluator=COMMAND,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_tree(
        tmp_path / "project",
        {
            "app.py": "VALUE = 1\n",
            "pkg/__init__.py": "",
            "pkg/__pycache__/mod.cpython-311.pyc": "stale bytecode",
            ".pytest_cache/README.md": "cache",
        },
    )


def test_a_directory_is_copied_without_caches_and_committed_as_the_initial_state(
    tmp_path: Path, project: Path
) -> None:
    target = asyncio.run(materialize(directory_task(project), tmp_path / "session"))

    assert target == tmp_path / "session" / "workspace"
    copied = [p.relative_to(target).as_posix() for p in target.rglob("*")]
    assert sorted(p for p in copied if not p.startswith(".git")) == [
        "app.py",
        "pkg",
        "pkg/__init__.py",
    ]
    assert git(target, "log", "--format=%s") == "Initial state"
    assert git(target, "status", "--porcelain") == ""
    assert not (project / ".git").exists()


def test_a_directory_that_is_a_repository_keeps_its_history(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commit_tree(repo, {"a.txt": "1\n"}, "first")
    head = commit_tree(repo, {"a.txt": "2\n"}, "second")

    target = asyncio.run(materialize(directory_task(repo), tmp_path / "session"))

    assert target is not None
    assert git(target, "rev-parse", "HEAD") == head
    assert git(target, "log", "--format=%s") == "second\nfirst"


def test_materialize_refuses_a_workspace_that_is_not_empty(tmp_path: Path, project: Path) -> None:
    write_tree(tmp_path / "session" / "workspace", {"left-over.txt": "x"})

    with pytest.raises(WorkspaceError, match=r"already exists and is not empty"):
        asyncio.run(materialize(directory_task(project), tmp_path / "session"))


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository with two commits: (path, first commit, second commit)."""
    repo = tmp_path / "upstream"
    first = commit_tree(repo, {"calc.py": "def add(a, b):\n    return a - b\n"}, "buggy")
    second = commit_tree(repo, {"calc.py": "def add(a, b):\n    return a + b\n"}, "fixed")
    return repo, first, second


@pytest.mark.parametrize("form", ["path", "file_url", "abbreviated"])
def test_a_git_workspace_is_checked_out_at_its_commit_without_later_history(
    tmp_path: Path, history: tuple[Path, str, str], form: str
) -> None:
    repo, first, second = history
    url = f"file://{repo}" if form == "file_url" else str(repo)
    commit = first[:10] if form == "abbreviated" else first

    target = asyncio.run(materialize(git_task(url, commit), tmp_path / "session"))

    assert target is not None
    assert git(target, "rev-parse", "HEAD") == first
    assert (target / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"
    assert git(target, "status", "--porcelain") == ""
    # The fix that came later is not reachable: the agent cannot look it up.
    assert git(target, "cat-file", "-t", second, check=False) == ""
    assert git(target, "remote") == ""
    assert git(target, "for-each-ref") == f"{first} commit\trefs/heads/main"


def test_an_unknown_commit_is_a_workspace_error(
    tmp_path: Path, history: tuple[Path, str, str]
) -> None:
    repo, _, _ = history

    with pytest.raises(WorkspaceError, match=r"no commit 'deadbeef'"):
        asyncio.run(materialize(git_task(str(repo), "deadbeef"), tmp_path / "session"))


def test_a_missing_repository_is_a_workspace_error(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match=r"git fetch .* failed"):
        asyncio.run(materialize(git_task(str(tmp_path / "nowhere"), "a" * 40), tmp_path / "s"))


def test_set_up_runs_in_the_workspace_in_order_and_the_baseline_includes_its_output(
    tmp_path: Path, project: Path
) -> None:
    task = directory_task(project, "echo one > built.txt", "cat built.txt > copied.txt")

    async def scenario(sessions: Sessions) -> None:
        runtime = await sessions.start(task)
        workspace = Path(workspace_path(task, runtime))
        assert (workspace / "copied.txt").read_text() == "one\n"

        # The baseline is a commit holding the set-up's files, while HEAD, the
        # index and the files are what set-up left: the agent sees no new commit.
        assert git(workspace, "log", "--format=%s", "HEAD") == "Initial state"
        assert git(workspace, "status", "--porcelain") == "?? built.txt\n?? copied.txt"
        assert git(workspace, "show", f"{BASELINE_REF}:copied.txt") == "one"
        assert git(workspace, "rev-parse", f"{BASELINE_REF}^") == git(
            workspace, "rev-parse", "HEAD"
        )

    with_sessions(tmp_path / "sessions", scenario)


def test_the_baseline_leaves_out_ignored_files_and_caches(tmp_path: Path) -> None:
    project = write_tree(tmp_path / "project", {".gitignore": "build/\n", "a.py": ""})
    task = directory_task(
        project, "mkdir -p build __pycache__ && touch build/out __pycache__/a.pyc"
    )

    async def scenario(sessions: Sessions) -> None:
        runtime = await sessions.start(task)
        workspace = Path(workspace_path(task, runtime))
        files = git(workspace, "ls-tree", "-r", "--name-only", BASELINE_REF).split()
        assert files == [".gitignore", "a.py"]

    with_sessions(tmp_path / "sessions", scenario)


def test_a_failed_set_up_command_names_itself_and_shows_its_output(
    tmp_path: Path, project: Path
) -> None:
    task = directory_task(project, "true", "echo 'no such tool: make' >&2; exit 3", "touch never")

    async def scenario(sessions: Sessions) -> None:
        with pytest.raises(SetupError) as caught:
            await sessions.start(task)
        message = str(caught.value)
        assert message.splitlines()[0] == (
            "task dir-task: set-up command 2 of 3 failed (exit 3): "
            "\"echo 'no such tool: make' >&2; exit 3\""
        )
        assert "no such tool: make" in message
        assert not (tmp_path / "sessions" / "session-0" / "workspace" / "never").exists()

    with_sessions(tmp_path / "sessions", scenario)


def test_a_set_up_command_that_runs_too_long_is_killed_and_reported(
    tmp_path: Path, project: Path
) -> None:
    task = directory_task(project, "sleep 60")

    async def scenario(sessions: Sessions) -> None:
        await materialize(task, tmp_path / "session")
        runtime = create_runtime(sessions.spec, tmp_path / "session")
        sessions.runtimes.append(runtime)
        await runtime.start()
        with pytest.raises(SetupError, match=r"set-up command 1 of 1 failed \(timed out\)"):
            await run_setup(task, runtime, timeout_s=0.5)

    with_sessions(tmp_path / "sessions", scenario)


def test_set_up_works_without_a_sandbox_too(tmp_path: Path, project: Path) -> None:
    task = directory_task(project, 'python -c \'open("made.txt", "w").write("ok")\'')

    async def scenario(sessions: Sessions) -> None:
        runtime = await sessions.start(task)
        workspace = Path(workspace_path(task, runtime))
        assert (workspace / "made.txt").read_text() == "ok"
        assert git(workspace, "show", f"{BASELINE_REF}:made.txt") == "ok"

    with_sessions(tmp_path / "sessions", scenario, host_spec())


def test_an_image_workspace_is_not_materialized_and_set_up_runs_at_its_path(
    tmp_path: Path,
) -> None:
    # No container engine here: a directory mounted into the sandbox stands in
    # for the image's files, at the path the image would have them.
    image_files = write_tree(tmp_path / "image-app", {"main.py": "print('hi')\n"})
    task = Task(
        id="image-task",
        instruction="Do it.",
        workspace=ImageWorkspace(image="example/app:1", path=str(image_files)),
        setup=("echo ready > ready.txt",),
        evaluator=COMMAND,
        runtime=RuntimeSpec(workdir=str(image_files)),
    )
    spec = sandbox_spec()
    spec = spec.model_copy(
        update={"mounts": (*spec.mounts, Mount(path=image_files, read_only=False))}
    )

    async def scenario(sessions: Sessions) -> None:
        assert await materialize(task, tmp_path / "s") is None
        assert not (tmp_path / "s").exists()

        runtime = await sessions.start(task)
        assert runtime.workdir == str(image_files)
        assert workspace_path(task, runtime) == str(image_files)
        assert (image_files / "ready.txt").read_text() == "ready\n"
        # Not a repository in the image: the baseline makes it one, without a HEAD.
        assert git(image_files, "ls-tree", "-r", "--name-only", BASELINE_REF).split() == [
            "main.py",
            "ready.txt",
        ]
        assert git(image_files, "rev-parse", "-q", "--verify", "HEAD", check=False) == ""

    with_sessions(tmp_path / "sessions", scenario, spec)


def test_without_git_in_the_runtime_set_up_still_runs_but_records_no_baseline(
    tmp_path: Path, project: Path
) -> None:
    # A PATH with a shell and coreutils but no git, as in a minimal image.
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("bash", "sh", "echo", "cat"):
        (tools / name).symlink_to(
            f"/bin/{name}" if Path(f"/bin/{name}").exists() else f"/usr/bin/{name}"
        )
    task = directory_task(project, "echo done > done.txt")
    spec = host_spec(env={"PATH": str(tools)})

    async def scenario(sessions: Sessions) -> None:
        runtime = await sessions.start(task)
        workspace = Path(workspace_path(task, runtime))
        assert (workspace / "done.txt").read_text() == "done\n"
        assert git(workspace, "rev-parse", "-q", "--verify", BASELINE_REF, check=False) == ""

    with_sessions(tmp_path / "sessions", scenario, spec)


def test_an_agent_commit_does_not_move_the_baseline(tmp_path: Path, project: Path) -> None:
    task = directory_task(project)

    async def scenario(sessions: Sessions) -> None:
        runtime = await sessions.start(task)
        workspace = Path(workspace_path(task, runtime))
        baseline = git(workspace, "rev-parse", BASELINE_REF)
        await agent(
            runtime,
            task,
            "echo 'VALUE = 2' > app.py && git add -A && "
            "git -c user.name=a -c user.email=a@b commit -qm agent",
        )
        assert git(workspace, "rev-parse", BASELINE_REF) == baseline
        assert git(workspace, "diff", "--name-only", BASELINE_REF, "HEAD") == "app.py"

    with_sessions(tmp_path / "sessions", scenario)


def test_runtime_spec_for_takes_only_what_the_task_sets() -> None:
    default = RuntimeSpec(
        backend="local",
        env={"PATH": "/usr/bin", "LANG": "C"},
        binds=("/logs",),
        mounts=(Mount(path=Path("/opt/tools")), Mount(path=Path("/data"))),
        cpus=4,
        options={"python": "/usr/bin/python3"},
    )
    own = RuntimeSpec(
        env={"LANG": "C.UTF-8"},
        binds=("/tests", "/logs"),
        mounts=(Mount(path=Path("/data"), read_only=False),),
        memory_mb=2048,
    )
    task = directory_task(Path("/unused")).model_copy(update={"runtime": own})

    merged = runtime_spec_for(task, default)

    assert merged.env == {"PATH": "/usr/bin", "LANG": "C.UTF-8"}
    assert merged.binds == ("/logs", "/tests")
    assert merged.mounts == (
        Mount(path=Path("/opt/tools")),
        Mount(path=Path("/data"), read_only=False),
    )
    assert (merged.cpus, merged.memory_mb) == (4, 2048)
    assert merged.options == {"python": "/usr/bin/python3"}
    assert runtime_spec_for(directory_task(Path("/unused")), default) is default
