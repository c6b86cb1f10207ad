"""The container image the ``docker`` runtime's tests run: Debian with python3, built offline.

There is no image registry to pull from (docker.io is out of reach), so the
image is built from Debian packages, which are: ``debootstrap --variant=minbase
--include=python3`` into a directory under the repository's ignored
``.cache/images/``, trimmed (documentation, locales, apt's caches), packed into
a tarball there, and imported with ``<client> import``. Each step is skipped
when its result exists: the image's tag is a hash of the recipe, so a changed
recipe builds a new image, and a fresh container store (a new CI machine with
the tarball restored, or ``podman system reset``) only re-imports.

Building needs root (debootstrap chroots and creates device nodes) and the
Debian mirror; about 40 s and 140 MB on the project's machines.
``scripts/setup --sandbox`` runs it once (``PYTHONPATH=tests python -m
support.images``); the tests call :func:`ensure_image`, which is instant
afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from support.paths import REPO

CACHE = REPO / ".cache" / "images"
NAME = "localhost/polar-test-python"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
RECIPE = {
    "suite": SUITE,
    "variant": "minbase",
    "include": "python3",
    "trim": ["usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"],
    "emptied": ["var/cache/apt", "var/lib/apt/lists"],
    "env": "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
}
TAG = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:12]
IMAGE = f"{NAME}:{TAG}"


class ImageUnavailable(Exception):
    """The image cannot be built on this host (the reason says what is missing)."""


def find_client() -> str | None:
    """A container client that answers (podman, or docker with a daemon), else None."""
    for name in ("podman", "docker"):
        path = shutil.which(name)
        if path is not None and _run([path, "version"], check=False).returncode == 0:
            return path
    return None


def ensure_image(client: str, mirror: str = MIRROR) -> str:
    """The test image's reference, importing (and first building) it when missing."""
    if _has_image(client):
        return IMAGE
    CACHE.mkdir(parents=True, exist_ok=True)
    with _locked(CACHE / ".lock"):
        if _has_image(client):
            return IMAGE
        tarball = CACHE / f"polar-test-python-{TAG}.tar"
        if not tarball.exists():
            build_rootfs(tarball, mirror)
        imported = _run(
            [client, "import", "--change", f"ENV {RECIPE['env']}", str(tarball), IMAGE],
            check=False,
        )
        if imported.returncode != 0:
            raise ImageUnavailable(f"{client} import failed: {imported.stderr.strip()}")
    return IMAGE


def build_rootfs(tarball: Path, mirror: str = MIRROR) -> None:
    """Debootstrap the recipe's system and pack it into ``tarball``."""
    debootstrap = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin")
    if debootstrap is None:
        raise ImageUnavailable("debootstrap is not installed (scripts/setup --sandbox)")
    if os.geteuid() != 0:
        raise ImageUnavailable("building the test image with debootstrap needs root")
    root = tarball.with_suffix(".rootfs")
    shutil.rmtree(root, ignore_errors=True)
    try:
        argv = [debootstrap, f"--variant={RECIPE['variant']}", f"--include={RECIPE['include']}"]
        built = _run([*argv, SUITE, str(root), mirror], check=False)
        if built.returncode != 0:
            tail = (built.stdout + built.stderr).strip()[-2000:]
            raise ImageUnavailable(f"debootstrap failed: {tail}")
        for relative in RECIPE["trim"]:
            shutil.rmtree(root / relative, ignore_errors=True)
        for relative in RECIPE["emptied"]:
            for entry in (root / relative).glob("*"):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        partial = tarball.with_suffix(".part")
        _run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."])
        partial.replace(tarball)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _has_image(client: str) -> bool:
    return _run([client, "image", "inspect", IMAGE], check=False).returncode == 0


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, check=check, stdin=subprocess.DEVNULL
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--client", help="podman or docker (default: the first that answers)")
    parser.add_argument("--mirror", default=MIRROR)
    args = parser.parse_args(argv)
    client = args.client or find_client()
    if client is None:
        print("support.images: no working podman or docker", file=sys.stderr)
        return 1
    try:
        print(ensure_image(client, args.mirror))
    except ImageUnavailable as exc:
        print(f"support.images: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
