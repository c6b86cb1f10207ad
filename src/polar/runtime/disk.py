"""A size-limited directory: a session's whole writable space on one small filesystem.

Everything a sandboxed session may write on the host's disk lives in its
session directory (workspace, the harness's home, binds' backings, the state
it shares with the sandbox). To bound it, the directory is made the mount
point of its own ext4 filesystem, in a sparse image file of ``size_mb``
(``mkfs.ext4`` without reserved blocks, loop-mounted with ``nosuid,nodev``):
a write past the limit fails with ``ENOSPC`` inside the sandbox and nowhere
else, the image takes only the space actually used, and unmounting plus
deleting the image frees everything at once. A project quota would need the
host's filesystem mounted with ``prjquota``; a tmpfs would put workspaces in
RAM; a loop mount needs only root (``mount``, ``losetup``), which the node
checks when it starts (:func:`check`).

The image files live beside the session directories (``<parent>/.disks``);
a node that starts again unmounts and deletes what a killed one left
(:func:`leftovers`, used by :mod:`polar.runtime.reap`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from polar.runtime.errors import RuntimeStartError, UnsupportedSpec

IMAGES_DIR = ".disks"
MIN_MB = 16
TOOLS = ("mkfs.ext4", "mount", "umount")


def _tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def check(size_mb: int | None) -> None:
    """Raise UnsupportedSpec unless a size-limited directory can be made here."""
    if size_mb is None:
        return
    if size_mb < MIN_MB:
        raise UnsupportedSpec(f"a session directory limit must be at least {MIN_MB} MB")
    missing = [name for name in TOOLS if _tool(name) is None]
    if missing:
        raise UnsupportedSpec(
            f"size-limited session directories need {', '.join(missing)} (e2fsprogs, mount)"
        )
    if os.geteuid() != 0:
        raise UnsupportedSpec(
            "size-limited session directories need root (a loop-mounted filesystem); "
            "run the node as root or set limits.workspace_mb: null"
        )


@dataclass(frozen=True, slots=True)
class SizedDir:
    path: Path
    image: Path
    size_mb: int

    @classmethod
    async def create(cls, path: Path, size_mb: int) -> SizedDir:
        """Make ``path`` (a new, empty directory) a ``size_mb`` filesystem's root."""
        image = path.parent / IMAGES_DIR / f"{path.name}.img"
        sized = cls(path, image, size_mb)
        try:
            await asyncio.to_thread(_sparse_image, path, image, size_mb)
            lazy = "lazy_itable_init=1,lazy_journal_init=1"
            mkfs = _tool("mkfs.ext4") or "mkfs.ext4"
            await _run(mkfs, "-q", "-F", "-m", "0", "-E", lazy, str(image))
            await _run(_tool("mount") or "mount", "-o", "loop,nosuid,nodev", str(image), str(path))
            await asyncio.to_thread((path / "lost+found").rmdir)
        except BaseException:
            await sized.remove(keep=False)
            raise
        return sized

    async def remove(self, *, keep: bool) -> None:
        """Unmount and delete the image; with ``keep``, first copy the contents out
        to a plain directory at the same path (kept sessions stay readable)."""
        kept: Path | None = None
        if keep and await asyncio.to_thread(os.path.ismount, self.path):
            kept = self.path.with_name(self.path.name + ".kept")
            await asyncio.to_thread(_copy_out, self.path, kept)
        await unmount(self.path)
        self.image.unlink(missing_ok=True)
        if kept is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(_replace, kept, self.path)


def _sparse_image(path: Path, image: Path, size_mb: int) -> None:
    image.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.mkdir(parents=True, exist_ok=True)
    with image.open("wb") as handle:
        handle.truncate(size_mb * 2**20)


def _replace(kept: Path, path: Path) -> None:
    path.rmdir()
    kept.rename(path)


def _copy_out(source: Path, target: Path) -> None:
    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)


async def unmount(path: Path) -> None:
    """Unmount ``path`` if it is a mount point (lazily when busy; the loop device
    is released with the last reference)."""
    if not await asyncio.to_thread(os.path.ismount, path):
        return
    umount = _tool("umount") or "umount"
    try:
        await _run(umount, str(path))
    except RuntimeStartError:
        await _run(umount, "-l", str(path))


def leftovers(sessions_dir: Path) -> list[Path]:
    """Session directories still mounted on an image of ``sessions_dir`` (a killed
    node's), and the images themselves."""
    images = sessions_dir / IMAGES_DIR
    found: list[Path] = []
    with contextlib.suppress(OSError):
        found += [p for p in sessions_dir.iterdir() if os.path.ismount(p)]
    with contextlib.suppress(OSError):
        found += list(images.glob("*.img"))
    return found


async def _run(*argv: str) -> None:
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as exc:
        raise RuntimeStartError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    try:
        out, _ = await process.communicate()
    except BaseException:
        # Cancelled (the session or the node stops): no tool left running unawaited.
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    if process.returncode != 0:
        text = out.decode(errors="replace").strip()[-500:]
        raise RuntimeStartError(f"{' '.join(argv[:2])} failed: {text}")
