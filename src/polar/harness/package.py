"""What a harness CLI is installed from: an npm package or a PyPI package, pinned exactly.

Pure data; :mod:`polar.harness.install` puts them into the project cache.
"""

from __future__ import annotations

import platform
import re
import sys
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class NpmPackage:
    """A CLI published on npm, installed with ``npm install --prefix``.

    ``bin`` is the command the package links into ``node_modules/.bin``.
    ``install_scripts``: the package's own install scripts must run (Claude
    Code's and opencode's postinstall put the native binary from the platform
    package in place of a stub that only prints an error); scripts of its
    dependencies never run.
    ``node``: the Node.js release the CLI runs on, installed from the npm
    registry into the cache (the ``node-<os>-<arch>`` package that carries the
    official binary) and put first on the CLI's ``PATH`` by a launcher;
    ``None`` runs it on whatever ``node`` the caller's ``PATH`` has.
    ``executables``: files inside the package (glob patterns relative to its
    directory) that it runs but publishes without their execute bit (Qwen
    Code's bundled ``rg``); the installer sets the bit.
    """

    name: str
    version: str
    bin: str
    install_scripts: bool = False
    node: str | None = None
    executables: tuple[str, ...] = ()
    kind: Literal["npm"] = "npm"

    @property
    def slug(self) -> str:
        """A directory name for this package: ``@openai/codex`` -> ``openai-codex``."""
        return self.name.removeprefix("@").replace("/", "-")

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def node_package(self) -> NodeRuntime | None:
        return NodeRuntime(self.node) if self.node is not None else None


@dataclass(frozen=True, slots=True)
class NodeRuntime:
    """A Node.js release as the npm registry ships it: the ``node-<os>-<arch>``
    package (no install script; its ``bin/node`` is the official binary)."""

    version: str

    @property
    def name(self) -> str:
        return f"node-{_NODE_OS.get(sys.platform, sys.platform)}-{_node_arch()}"

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True, slots=True)
class PythonPackage:
    """A CLI published on PyPI, installed into its own virtualenv.

    ``requirements`` are further exact pins installed along with it (the
    libraries that decide what goes on the wire, pinned so that a run is
    reproducible even though the package itself pins loosely).
    """

    name: str
    version: str
    bin: str
    requirements: tuple[str, ...] = ()
    kind: Literal["python"] = "python"

    @property
    def slug(self) -> str:
        return self.name

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def dist_info_name(self) -> str:
        """The ``*.dist-info`` directory pip writes for this exact version."""
        normalized = re.sub(r"[-_.]+", "_", self.name).lower()
        return f"{normalized}-{self.version}.dist-info"


Package = NpmPackage | PythonPackage

_NODE_OS = {"linux": "linux", "darwin": "darwin", "win32": "win"}
_NODE_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}


def _node_arch() -> str:
    machine = platform.machine().lower()
    return _NODE_ARCH.get(machine, machine)
