"""Tasks run on nodes that share no path with the rollout server (:mod:`polar.rollout.files`).

The end-to-end test is a real rollout server and a real node (HTTP between them, the node's
gateway over a scripted engine, the agent in a bubblewrap sandbox): the task's workspace and
hidden tests exist only on the "server side" until the submission is packed, and are deleted
before any node runs the session; the session still runs and is scored from what the node
fetched. Both processes are on this one machine, so "another machine" is shown by the
node's files being gone, not by a second host."""

from __future__ import annotations

import asyncio
import hashlib
import io
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from polar.rollout.files import Fetch, FileCache, FilesError, FileStore
from polar.rollout.protocol import HarnessSpec, SessionStatus, TaskStatus, TaskSubmission
from polar.tasks.model import DirectoryWorkspace, EvaluatorSpec, GitWorkspace, Task

from support.agents import agent_task, shell_harness
from support.rollout import CONTROL_TOKEN, RolloutStack

HELLO = {"turns": [{"text": "hello"}], "cycle": True}


def _task(root: Path) -> Task:
    workspace = root / "workspace"
    hidden = root / "hidden"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "app.py").write_text("print('app')\n")
    hidden.mkdir()
    (hidden / "check.sh").write_text("test -f done\n")
    return Task(
        id="shipped",
        instruction="do it",
        workspace=DirectoryWorkspace(path=workspace),
        hidden_tests=hidden,
        evaluator=EvaluatorSpec(kind="command", config={"command": "true"}),
    )


def _store_fetch(store: FileStore) -> Fetch:
    async def fetch(digest: str, into: Path) -> None:
        source = store.path(digest)
        assert source is not None
        shutil.copyfile(source, into)

    return fetch


def test_a_shipped_task_runs_from_the_node_cache_with_equal_contents(tmp_path: Path) -> None:
    task = _task(tmp_path / "server")
    store = FileStore(tmp_path / "server-files")
    shipped = store.ship(task)
    assert set(shipped.files) == {str(tmp_path / "server" / n) for n in ("workspace", "hidden")}
    assert store.ship(task).files == shipped.files  # content-addressed: same digests
    shutil.rmtree(tmp_path / "server")

    cache = FileCache(tmp_path / "node-files", _store_fetch(store))
    local = asyncio.run(cache.localize(shipped))
    assert isinstance(local.workspace, DirectoryWorkspace)
    assert local.workspace.path.parent == tmp_path / "node-files"
    assert (local.workspace.path / "src" / "app.py").read_text() == "print('app')\n"
    assert local.hidden_tests is not None
    assert (local.hidden_tests / "check.sh").read_text() == "test -f done\n"
    again = asyncio.run(cache.localize(shipped))  # already unpacked: no fetch
    assert again == local
    assert sorted(p.name for p in (tmp_path / "node-files").iterdir()) == sorted(
        shipped.files.values()
    )


def test_a_local_git_repository_is_shipped_and_a_remote_one_is_not(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README").write_text("hi\n")
    store = FileStore(tmp_path / "files")
    base = {"id": "g", "instruction": "x", "evaluator": {"kind": "command"}}
    for given in (str(repo), f"file://{repo}"):
        task = Task.model_validate(
            {**base, "workspace": {"kind": "git", "repo": given, "commit": "HEAD"}}
        )
        assert list(store.ship(task).files) == [str(repo)]
    remote = Task.model_validate(
        {**base, "workspace": {"kind": "git", "repo": "https://example.com/r.git", "commit": "a"}}
    )
    assert store.ship(remote).files == {}
    shipped = store.ship(
        Task.model_validate(
            {**base, "workspace": {"kind": "git", "repo": f"file://{repo}", "commit": "HEAD"}}
        )
    )
    cache = FileCache(tmp_path / "cache", _store_fetch(store))
    local = asyncio.run(cache.localize(shipped))
    assert isinstance(local.workspace, GitWorkspace)
    assert Path(local.workspace.repo).parent == tmp_path / "cache"


def test_a_path_the_server_cannot_read_is_refused_naming_the_field(tmp_path: Path) -> None:
    task = _task(tmp_path)
    shutil.rmtree(tmp_path / "hidden")
    with pytest.raises(FilesError, match=r"^task.hidden_tests: .* is not a directory"):
        FileStore(tmp_path / "files").ship(task)


def test_a_corrupt_or_hostile_archive_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "files")
    shipped = store.ship(_task(tmp_path / "src"))
    digest = next(iter(shipped.files.values()))

    async def wrong_bytes(_: str, into: Path) -> None:
        await asyncio.to_thread(into.write_bytes, b"not the archive")

    cache = FileCache(tmp_path / "cache", wrong_bytes)
    with pytest.raises(FilesError, match=f"the archive {digest} arrived with digest"):
        asyncio.run(cache.localize(shipped))

    # An archive whose digest is right but which climbs out of its directory.
    hostile = io.BytesIO()
    with tarfile.open(fileobj=hostile, mode="w") as tar:
        info = tarfile.TarInfo("../escaped")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    evil = FileStore(tmp_path / "evil")
    evil.root.mkdir()
    evil_digest = hashlib.sha256(hostile.getvalue()).hexdigest()
    (evil.root / f"{evil_digest}.tar").write_bytes(hostile.getvalue())
    task = shipped.model_copy(update={"files": {str(shipped.hidden_tests): evil_digest}})
    cache = FileCache(tmp_path / "cache2", _store_fetch(evil))
    with pytest.raises(FilesError, match="cannot unpack"):
        asyncio.run(cache.localize(task))
    assert not (tmp_path / "escaped").exists()
    assert [p.name for p in (tmp_path / "cache2").iterdir()] == []
    with pytest.raises(FilesError, match="not a SHA-256"):
        asyncio.run(cache.localize(task.model_copy(update={"files": {"/x": "../../etc"}})))


def test_a_node_sharing_no_path_with_the_server_runs_and_scores_the_task(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    stack = make_rollout({"sessions": [HELLO] * 2})
    server_side = tmp_path / "server-only"
    task = agent_task(server_side)
    hidden = server_side / "hidden"
    hidden.mkdir()
    (hidden / "check.sh").write_text("test -f done && echo scored\n")
    task = task.model_copy(
        update={
            "hidden_tests": hidden,
            "evaluator": EvaluatorSpec(
                kind="command",
                config={"command": "bash tests/check.sh", "tests_dir": "tests"},
                timeout_s=60,
            ),
        }
    )
    auth = {"authorization": f"Bearer {CONTROL_TOKEN}"}
    with httpx.Client(base_url=stack.url, headers=auth, timeout=30) as http:
        drain = f"/nodes/{stack.node_config.node_id}/drain"
        assert http.post(drain).status_code == 200  # nothing runs yet
        with stack.client() as client:
            submission = TaskSubmission(
                task=task, harness=HarnessSpec(**shell_harness("ok")), num_samples=2
            )
            task_id = client.submit(submission).task_id
            shutil.rmtree(server_side)  # the node never had these paths; now nobody does
            assert http.post(f"{drain}?undo=true").status_code == 200
            result = client.wait(task_id, timeout_s=180)
        stored = stack.rollout.store.task(task_id)
        assert stored is not None
        digests = sorted(stored.submission.task.files.values())
        assert http.get(f"/files/{digests[0]}").status_code == 200
        assert http.get(f"/files/{'0' * 64}").status_code == 404
        assert http.get("/files/..%2Frollout.db").status_code == 404
        assert httpx.get(f"{stack.url}/files/{digests[0]}").status_code == 401

    assert result.status is TaskStatus.COMPLETED
    assert [r.status for r in result.results] == [SessionStatus.COMPLETED] * 2
    assert [r.reward for r in result.results] == [1.0, 1.0]
    assert sorted(p.name for p in (stack.root / "node-files").iterdir()) == digests
    assert sorted(p.name for p in (stack.root / "files").iterdir()) == [f"{d}.tar" for d in digests]
