"""A task's host files, shipped from the rollout server to nodes that share no path with it.

A task names host paths: a directory workspace, a local git repository, its hidden
tests. A node on another machine has none of them. The contract:

- **At submission** the server packs each such path into a tar archive, stored once under
  its SHA-256 in its :class:`FileStore` (``<db dir>/files``), and writes the mapping
  path -> digest into the task (``Task.files``). A path it cannot read is refused then,
  with the field named, not when a node first needs it.
- **On a node** :class:`FileCache` fetches each archive it lacks from the server
  (``GET /files/{sha256}``, behind the control token), checks the digest, unpacks it once
  (``tarfile``'s ``data`` filter: no absolute paths, no links out, no devices) into
  ``<node files_dir>/<sha256>``, and hands the session a task whose paths point there.
  Hidden tests unpack there too, outside every session directory, and are hidden from the
  sandbox like any hidden path: the agent never sees them.

Cost: packing and hashing each submitted task's paths (a group's sessions share one
submission; equal contents are stored once), and one fetch and unpack per node per
distinct content, after which sessions copy from the node's cache as they copied from
the host path before.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from polar.tasks.model import DirectoryWorkspace, GitWorkspace, Task
from polar.tasks.parse import local_repo

DIGEST = re.compile(r"^[0-9a-f]{64}$")


class FilesError(Exception):
    """A task's files could not be packed, fetched or unpacked; the message says which."""


def local_paths(task: Task) -> dict[str, Path]:
    """The host paths ``task`` needs, by the field that names them."""
    paths: dict[str, Path] = {}
    match task.workspace:
        case DirectoryWorkspace(path=path):
            paths["task.workspace.path"] = path
        case GitWorkspace(repo=repo):
            local = _git_path(repo)
            if local is not None:
                paths["task.workspace.repo"] = local
        case _:
            pass
    if task.hidden_tests is not None:
        paths["task.hidden_tests"] = task.hidden_tests
    return paths


def _git_path(repo: str) -> Path | None:
    """A local repository's path; None for a remote one. A task holds absolute paths
    (its loader resolved them), so nothing is relative to a directory here."""
    return local_repo(repo, Path("/"))


class FileStore:
    """The server's archives, one file per digest (``<sha256>.tar``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, digest: str) -> Path | None:
        if not DIGEST.match(digest):
            return None
        path = self.root / f"{digest}.tar"
        return path if path.is_file() else None

    def pack(self, source: Path) -> str:
        """Archive the directory ``source``; its digest. Blocking: run it in a thread."""
        self.root.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=self.root, prefix=".packing-")
        os.close(handle)
        try:
            with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as archive:
                archive.add(source, arcname=".", filter=_owned_by_nobody)
            digest = _sha256(Path(tmp))
            os.replace(tmp, self.root / f"{digest}.tar")
        finally:
            Path(tmp).unlink(missing_ok=True)
        return digest

    def ship(self, task: Task) -> Task:
        """``task`` with every host path it names packed and listed in ``files``."""
        files: dict[str, str] = {}
        for field, path in local_paths(task).items():
            if not path.is_dir():
                raise FilesError(f"{field}: {path} is not a directory the rollout server can read")
            try:
                files[str(path)] = self.pack(path)
            except OSError as exc:
                raise FilesError(f"{field}: cannot pack {path}: {exc.strerror or exc}") from None
        return task.model_copy(update={"files": files})


def _owned_by_nobody(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


Fetch = Callable[[str, Path], Awaitable[None]]
"""Download the archive of a digest into a file."""


class FileCache:
    """A node's unpacked archives, one directory per digest; see the module docstring."""

    def __init__(self, root: Path, fetch: Fetch | None) -> None:
        self.root = root
        self._fetch = fetch
        self._locks: dict[str, asyncio.Lock] = {}

    async def localize(self, task: Task) -> Task:
        """``task`` with each shipped path replaced by its unpacked copy on this node."""
        if not task.files:
            return task
        where = {path: await self._unpacked(digest) for path, digest in task.files.items()}
        update: dict[str, object] = {}
        match task.workspace:
            case DirectoryWorkspace(path=path) if str(path) in where:
                update["workspace"] = task.workspace.model_copy(update={"path": where[str(path)]})
            case GitWorkspace(repo=repo) if (local := _git_path(repo)) and str(local) in where:
                update["workspace"] = task.workspace.model_copy(
                    update={"repo": str(where[str(local)])}
                )
            case _:
                pass
        if task.hidden_tests is not None and str(task.hidden_tests) in where:
            update["hidden_tests"] = where[str(task.hidden_tests)]
        return task.model_copy(update=update)

    async def _unpacked(self, digest: str) -> Path:
        if not DIGEST.match(digest):
            raise FilesError(f"task.files: {digest!r} is not a SHA-256 digest")
        target = self.root / digest
        lock = self._locks.setdefault(digest, asyncio.Lock())
        async with lock:
            if target.is_dir():
                return target
            if self._fetch is None:
                raise FilesError(
                    "the task's files are on the rollout server, and this node has no server_url"
                )
            await asyncio.to_thread(self.root.mkdir, parents=True, exist_ok=True)
            work = Path(await asyncio.to_thread(tempfile.mkdtemp, dir=self.root, prefix=".in-"))
            try:
                archive = work / "archive.tar"
                await self._fetch(digest, archive)
                got = await asyncio.to_thread(_sha256, archive)
                if got != digest:
                    raise FilesError(f"the archive {digest} arrived with digest {got}")
                await asyncio.to_thread(_unpack, archive, work / "tree")
                await asyncio.to_thread(os.replace, work / "tree", target)
            finally:
                await asyncio.to_thread(shutil.rmtree, work, True)
        return target


def unfinished(root: Path) -> list[Path]:
    """What a killed process left half-done under a store or cache ``root``."""
    if not root.is_dir():
        return []
    return [path for path in root.iterdir() if path.name.startswith((".in-", ".packing-"))]


def _unpack(archive: Path, into: Path) -> None:
    into.mkdir()
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise FilesError(f"cannot unpack {archive.name}: {exc}") from None
