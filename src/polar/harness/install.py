"""Install pinned harness CLIs into a project cache directory, idempotently.

Layout under the cache directory (``.cache/harness`` by default)::

    npm/<slug>/node_modules/.bin/<bin>    one npm prefix per package
    npm/<slug>/polar-bin/<bin>             launcher on the package's own Node.js (if pinned)
    node/<version>/node_modules/.bin/node  a Node.js release, shared by the packages pinning it
    npm-cache/                             npm's download cache (reused across runs)
    venvs/<name>/bin/<bin>                 one virtualenv per PyPI package
    pip-cache/                             pip's download cache
    locks/<slug>.lock                      serializes concurrent installs of one package
    times/<slug>                           seconds its last install took (the next one's estimate)

Each npm package gets its own prefix so that installing, upgrading or failing
one CLI never touches another's dependency tree, and several can be installed
at once. Install scripts are skipped (``--ignore-scripts``), then only the
package's own are run (``npm rebuild <name>``) where the package says it needs
them (:attr:`NpmPackage.install_scripts`). npm 11 still runs every script by
default, only warning that it is "not yet covered by allowScripts"; Claude Code
and opencode do need theirs (they link the native binary), the dependencies'
(pi's ``koffi``) are not needed.

A package that pins its Node.js (:attr:`NpmPackage.node`) runs through a
launcher script that puts that release first on ``PATH`` and execs the CLI,
so the CLI and every ``node`` it starts use it, wherever the CLI is run from
(a plain subprocess, a sandbox with the cache mounted): the launcher finds
the cache relative to itself. The release comes from the npm registry (the
``node-<os>-<arch>`` package), like the CLIs themselves.

An install is skipped when the pinned version is already there: the installed
``package.json`` (npm) or ``*.dist-info`` directory (pip) must show the
version, and the stamp file :data:`INSTALL_STAMP` written after the last step
must list the same pins, so a half-finished install or a changed extra pin
installs again.

**Progress.** An install that runs says so (``progress``, else the module's
log at INFO): what it installs where, with the time its last install took on
this cache as the estimate; then every :attr:`Toolchain.progress_every_s` the
time so far and the megabytes written to the prefix and download cache; then
how long it took (kept in ``times/<slug>``, the next install's estimate).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import assert_never

from polar.harness.errors import InstallError
from polar.harness.package import NodeRuntime, NpmPackage, Package, PythonPackage

_log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path(".cache/harness")
DEFAULT_PYTHON = "python3.11"

INSTALL_STAMP = ".polar-install"
"""In an npm prefix or virtualenv: the pins of its last complete install."""


@dataclass(frozen=True, slots=True)
class Toolchain:
    """The programs installs run (resolved on the caller's PATH)."""

    npm: str = "npm"
    python: str = DEFAULT_PYTHON
    """Interpreter that creates the virtualenvs of PyPI harnesses."""
    timeout_s: float = 900.0
    """Limit on each install command."""
    progress_every_s: float = 15.0
    """How often a running install command reports how far it got."""


Progress = Callable[[str], None]
"""Where an install's progress lines go (one line each)."""


@dataclass(slots=True)
class _Watch:
    """A running install, as its progress lines describe it."""

    say: Progress
    what: str
    paths: tuple[Path, ...]
    expected_s: float | None
    started: float = field(default_factory=time.monotonic)
    baseline: int = 0

    def __post_init__(self) -> None:
        self.baseline = sum(_size(path) for path in self.paths)

    def tick(self) -> None:
        elapsed = time.monotonic() - self.started
        written = max(0, sum(_size(path) for path in self.paths) - self.baseline)
        if self.expected_s is None:
            left = ""
        elif elapsed < self.expected_s:
            left = f", about {self.expected_s - elapsed:.0f} s left"
        else:
            left = f", longer than the last install ({self.expected_s:.0f} s)"
        self.say(f"installing {self.what}: {elapsed:.0f} s, {written / 1e6:.0f} MB written{left}")


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def npm_prefix(package: NpmPackage, cache_dir: Path) -> Path:
    return cache_dir / "npm" / package.slug


def node_prefix(runtime: NodeRuntime, cache_dir: Path) -> Path:
    return cache_dir / "node" / runtime.version


def node_executable(runtime: NodeRuntime, cache_dir: Path) -> Path:
    return node_prefix(runtime, cache_dir) / "node_modules" / ".bin" / "node"


def venv_dir(package: PythonPackage, cache_dir: Path) -> Path:
    return cache_dir / "venvs" / package.slug


def executable_path(package: Package, cache_dir: Path) -> Path:
    """Where the package's command is once installed (whether or not it is)."""
    match package:
        case NpmPackage():
            launcher = "polar-bin" if package.node is not None else "node_modules/.bin"
            return npm_prefix(package, cache_dir) / launcher / package.bin
        case PythonPackage():
            return venv_dir(package, cache_dir) / "bin" / package.bin
        case _:
            assert_never(package)


def install_root(package: Package, cache_dir: Path) -> Path:
    match package:
        case NpmPackage():
            return npm_prefix(package, cache_dir)
        case PythonPackage():
            return venv_dir(package, cache_dir)
        case _:
            assert_never(package)


def installed_version(package: Package, cache_dir: Path) -> str | None:
    """The version of the package completely installed in the cache, or None."""
    if not executable_path(package, cache_dir).exists():
        return None
    runtime = package.node_package if isinstance(package, NpmPackage) else None
    if runtime is not None and not node_executable(runtime, cache_dir).exists():
        return None
    stamp = install_root(package, cache_dir) / INSTALL_STAMP
    try:
        if stamp.read_text(encoding="utf-8") != _stamp(package):
            return None
    except OSError:
        return None
    match package:
        case NpmPackage():
            manifest = (
                npm_prefix(package, cache_dir) / "node_modules" / package.name / "package.json"
            )
            try:
                version = json.loads(manifest.read_text(encoding="utf-8")).get("version")
            except (OSError, ValueError):
                return None
            return version if isinstance(version, str) else None
        case PythonPackage():
            venv = venv_dir(package, cache_dir)
            if any(venv.glob(f"lib/python*/site-packages/{package.dist_info_name}")):
                return package.version
            return None
        case _:
            assert_never(package)


def is_installed(package: Package, cache_dir: Path) -> bool:
    """Whether exactly the pinned version is installed (and its command exists)."""
    return installed_version(package, cache_dir) == package.version


def install(
    package: Package,
    cache_dir: Path,
    toolchain: Toolchain | None = None,
    *,
    progress: Progress | None = None,
) -> Path:
    """Install the pinned package unless it is already there; return its command's path.

    Concurrent calls for one package (several test workers, several rollouts)
    wait for each other on a file lock instead of installing twice. An install
    that runs reports its progress to ``progress`` (see the module docstring).
    """
    toolchain = toolchain or Toolchain()
    cache_dir = cache_dir.resolve()
    if isinstance(package, NpmPackage) and package.node_package is not None:
        install_node(package.node_package, cache_dir, toolchain, progress=progress)
    with _lock(cache_dir / "locks" / f"{package.slug}.lock"):
        if not is_installed(package, cache_dir):
            root = install_root(package, cache_dir)
            stamp = root / INSTALL_STAMP
            stamp.unlink(missing_ok=True)
            downloads = cache_dir / (
                "npm-cache" if isinstance(package, NpmPackage) else "pip-cache"
            )
            watch = _watch(progress, package.spec, package.slug, cache_dir, root, downloads)
            match package:
                case NpmPackage():
                    _install_npm(package, cache_dir, toolchain, watch)
                case PythonPackage():
                    _install_python(package, cache_dir, toolchain, watch)
                case _:
                    assert_never(package)
            stamp.write_text(_stamp(package), encoding="utf-8")
            _done(watch, package.slug, cache_dir)
            found = installed_version(package, cache_dir)
            if found != package.version:
                raise InstallError(
                    f"{package.spec}: installed, but found version {found} "
                    f"at {executable_path(package, cache_dir)}"
                )
        if isinstance(package, NpmPackage):
            mark_executables(package, cache_dir)  # also mends a cache installed before
    return executable_path(package, cache_dir)


def mark_executables(package: NpmPackage, cache_dir: Path) -> tuple[Path, ...]:
    """Give the package's ``executables`` their execute bit; the files matched."""
    root = npm_prefix(package, cache_dir) / "node_modules" / package.name
    found = tuple(path for pattern in package.executables for path in sorted(root.glob(pattern)))
    for path in found:
        mode = path.stat().st_mode
        if mode & 0o111 != 0o111:
            path.chmod(mode | 0o111)
    return found


def install_node(
    runtime: NodeRuntime,
    cache_dir: Path,
    toolchain: Toolchain | None = None,
    *,
    progress: Progress | None = None,
) -> Path:
    """Install a Node.js release from the npm registry unless it is there; its ``node``."""
    toolchain = toolchain or Toolchain()
    cache_dir = cache_dir.resolve()
    node = node_executable(runtime, cache_dir)
    with _lock(cache_dir / "locks" / f"node-{runtime.version}.lock"):
        stamp = node_prefix(runtime, cache_dir) / INSTALL_STAMP
        try:
            if node.exists() and stamp.read_text(encoding="utf-8") == runtime.spec + "\n":
                return node
        except OSError:
            pass
        stamp.unlink(missing_ok=True)
        prefix = node_prefix(runtime, cache_dir)
        slug = f"node-{runtime.version}"
        watch = _watch(progress, runtime.spec, slug, cache_dir, prefix, cache_dir / "npm-cache")
        # The package has no install script: --ignore-scripts loses nothing.
        _npm_add(runtime.spec, prefix, cache_dir, toolchain, watch)
        try:
            done = subprocess.run(
                [str(node), "--version"], capture_output=True, text=True, timeout=60, check=False
            )
            found = done.stdout.strip()
        except OSError as exc:
            found = f"not runnable ({exc.strerror})"
        if found != f"v{runtime.version}":
            raise InstallError(f"{runtime.spec}: installed, but {node} --version says {found!r}")
        stamp.write_text(runtime.spec + "\n", encoding="utf-8")
        _done(watch, slug, cache_dir)
    return node


def _watch(
    progress: Progress | None, what: str, slug: str, cache_dir: Path, *paths: Path
) -> _Watch:
    """Say that ``what`` is being installed, with the estimate, and start watching it."""
    say = progress or _log.info
    try:
        expected: float | None = float((cache_dir / "times" / slug).read_text())
    except (OSError, ValueError):
        expected = None
    estimate = (
        f"the last install here took {expected:.0f} s"
        if expected is not None
        else "the first here: no earlier install to estimate from"
    )
    say(f"installing {what} into {paths[0]} ({estimate})")
    return _Watch(say, what, paths, expected)


def _done(watch: _Watch, slug: str, cache_dir: Path) -> None:
    took = time.monotonic() - watch.started
    with contextlib.suppress(OSError):
        (cache_dir / "times").mkdir(parents=True, exist_ok=True)
        (cache_dir / "times" / slug).write_text(f"{took:.1f}\n")
    watch.say(f"installed {watch.what} in {took:.0f} s")


LAUNCHER = """#!/bin/sh
# Written by polar: runs {spec} on Node.js {node} from this cache.
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
PATH="$here/../../../node/{node}/node_modules/.bin:$PATH"
export PATH
exec "$here/../node_modules/.bin/{bin}" "$@"
"""


def _npm_add(spec: str, prefix: Path, cache_dir: Path, toolchain: Toolchain, watch: _Watch) -> None:
    """``npm install`` one exact version into its own prefix, no install scripts."""
    prefix.mkdir(parents=True, exist_ok=True)
    _run(
        [
            toolchain.npm, "install",
            "--prefix", str(prefix),
            "--cache", str(cache_dir / "npm-cache"),
            "--save-exact", "--ignore-scripts",
            "--no-audit", "--no-fund", "--no-update-notifier", "--loglevel=error",
            spec,
        ],
        what=spec,
        toolchain=toolchain,
        watch=watch,
    )  # fmt: skip


def _install_npm(package: NpmPackage, cache_dir: Path, toolchain: Toolchain, watch: _Watch) -> None:
    prefix = npm_prefix(package, cache_dir)
    _npm_add(package.spec, prefix, cache_dir, toolchain, watch)
    if package.install_scripts:
        # The scripts may run the CLI itself (opencode's checks `opencode --version`),
        # which would create its config and data directories in the installing
        # user's HOME; they get a throwaway one instead.
        with tempfile.TemporaryDirectory(prefix="polar-install-home-") as home:
            _run(
                [
                    toolchain.npm, "rebuild", package.name,
                    "--prefix", str(prefix),
                    "--cache", str(cache_dir / "npm-cache"),
                    "--no-audit", "--no-fund", "--no-update-notifier", "--loglevel=error",
                ],
                what=package.spec,
                toolchain=toolchain,
                home=Path(home),
                watch=watch,
            )  # fmt: skip
    if package.node is not None:
        launcher = executable_path(package, cache_dir)
        launcher.parent.mkdir(parents=True, exist_ok=True)
        launcher.write_text(
            LAUNCHER.format(spec=package.spec, node=package.node, bin=package.bin),
            encoding="utf-8",
        )
        launcher.chmod(0o755)


def _install_python(
    package: PythonPackage, cache_dir: Path, toolchain: Toolchain, watch: _Watch
) -> None:
    venv = venv_dir(package, cache_dir)
    python = venv / "bin" / "python"
    if not python.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        _run(
            [toolchain.python, "-m", "venv", str(venv)],
            what=package.spec,
            toolchain=toolchain,
            watch=watch,
        )
    _run(
        [
            str(python), "-m", "pip", "install",
            "--quiet", "--disable-pip-version-check", "--no-input",
            "--cache-dir", str(cache_dir / "pip-cache"),
            package.spec, *package.requirements,
        ],
        what=package.spec,
        toolchain=toolchain,
        watch=watch,
    )  # fmt: skip


def _stamp(package: Package) -> str:
    match package:
        case NpmPackage():
            runtime = package.node_package
            extra: tuple[str, ...] = (runtime.spec,) if runtime is not None else ()
        case PythonPackage():
            extra = package.requirements
        case _:
            assert_never(package)
    return "\n".join((package.spec, *extra)) + "\n"


def _run(
    argv: list[str],
    *,
    what: str,
    toolchain: Toolchain,
    watch: _Watch,
    home: Path | None = None,
) -> None:
    """Run one install command, ``watch`` told how far it got every
    ``toolchain.progress_every_s``; ``home`` replaces HOME (and the XDG dirs) for it."""
    command = argv
    if home is not None:
        command = [
            "env", f"HOME={home}", f"XDG_CONFIG_HOME={home}/.config",
            f"XDG_DATA_HOME={home}/.local/share", f"XDG_STATE_HOME={home}/.local/state",
            f"XDG_CACHE_HOME={home}/.cache", *argv,
        ]  # fmt: skip
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except FileNotFoundError:
        raise InstallError(f"{what}: {argv[0]} not found") from None
    deadline = time.monotonic() + toolchain.timeout_s
    with proc:
        while True:
            left = deadline - time.monotonic()
            try:
                stdout, stderr = proc.communicate(
                    timeout=max(0.0, min(toolchain.progress_every_s, left))
                )
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    proc.kill()
                    proc.communicate()
                    raise InstallError(
                        f"{what}: {argv[0]} took longer than {toolchain.timeout_s:g} s"
                    ) from None
                watch.tick()
    if proc.returncode != 0:
        raise InstallError(
            f"{what}: `{' '.join(argv[:3])} ...` exited with {proc.returncode}: "
            f"{_last_line(stderr) or _last_line(stdout) or 'no output'}"
        )


def _last_line(text: str) -> str:
    """The last meaningful line of a tool's output (skipping warnings where possible)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "ERR" in line or "rror" in line]
    return (errors or lines or [""])[-1][:300]


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
