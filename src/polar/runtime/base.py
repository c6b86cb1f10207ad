"""The runtime contract: where a session's harness and evaluator commands run.

A runtime is one sandbox for one session. The node creates it from a
:class:`RuntimeSpec` with :func:`polar.runtime.create_runtime`, starts it, runs
commands in it, copies files in and out, and stops it. Every backend (``local``
with bubblewrap, ``docker`` — Docker or podman's Docker-compatible CLI —,
``apptainer``) implements :class:`Runtime`; a plug-in is any
``package.module:factory`` with the same signature as the built-ins.

**Identity paths.** The session directory (``session_dir`` on the host, holding
``workspace/``, ``home/``, ``logs/``) appears inside the runtime at the *same
absolute path*, read-write, and so do the read-only :attr:`RuntimeSpec.mounts`
(tool directories such as the harness cache or an interpreter prefix). A harness
preset can therefore write its config under a host path and hand the same path
to the process inside. A task whose workspace lives in the image (e.g. a
SWE-bench image's ``/testbed``) sets :attr:`RuntimeSpec.workdir` to that path.

**Network.** With :attr:`NetworkPolicy.GATEWAY_ONLY` the process inside reaches
nothing but the gateway's model API: the runtime exposes it at
:attr:`Runtime.gateway_url` (a loopback address inside the sandbox, relayed over
a Unix socket to the real gateway by a relay that lets only model calls with the
session's key through, :mod:`polar.runtime.relay`). ``NONE`` gives loopback
only; ``HOST`` shares the host's network.

**Limits.** ``cpus``, ``memory_mb``, ``pids``, ``cpu_time_s`` and ``tmp_mb`` are
enforced by the kernel (cgroups, a size-limited tmpfs) or the spec is refused
(:class:`~polar.runtime.errors.UnsupportedSpec`); the runtime also watches them
and reports the first one hit (:attr:`Runtime.limit_hit`), killing what runs.

**Processes.** :meth:`Runtime.exec` runs one command to completion (or its
timeout), with only the environment it is given plus the runtime's own
(``spec.env``) and, in a container, the image's; never the host's. Its stdin
is empty. On timeout, :meth:`Runtime.cancel`, or cancellation of the ``exec``
call itself, the command's whole process tree is killed (also processes that
left its process group or session) before ``exec`` returns.
:meth:`Runtime.stop` kills everything still running in the sandbox and frees
it; it is idempotent and never raises for a sandbox that is already gone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field


class NetworkPolicy(StrEnum):
    GATEWAY_ONLY = "gateway_only"
    """Loopback plus the relayed gateway address; nothing else."""
    NONE = "none"
    """Loopback only."""
    HOST = "host"
    """The host's network, unrestricted (no sandboxing of the network)."""


class Mount(BaseModel):
    """A host path made visible inside the runtime at the same path."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path
    read_only: bool = True


class RuntimeSpec(BaseModel):
    """How to build a session's sandbox (validated once, at the edge)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str = "local"
    """``local``, ``docker``, ``apptainer``, or ``package.module:factory``."""
    image: str | None = None
    """Container image (docker: an image name; apptainer: a ``.sif`` path)."""
    sandbox: bool = True
    """``local`` only: False runs plain subprocesses (no bubblewrap)."""
    network: NetworkPolicy = NetworkPolicy.GATEWAY_ONLY
    cpus: float | None = Field(default=None, gt=0)
    """CPU bandwidth: how many CPUs' worth of time per wall second."""
    memory_mb: int | None = Field(default=None, gt=0)
    """Memory of the whole sandbox (swap included); past it the kernel kills a process."""
    pids: int | None = Field(default=None, gt=0)
    """Processes and threads of the whole sandbox; past it ``fork`` fails."""
    cpu_time_s: float | None = Field(default=None, gt=0)
    """CPU seconds every process of the sandbox may use together."""
    tmp_mb: int | None = Field(default=None, gt=0)
    """Size of the sandbox's ``/tmp`` (and ``/var/tmp``, which leads to it)."""
    env: dict[str, str] = Field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    binds: tuple[str, ...] = ()
    """Extra absolute paths inside the runtime (e.g. ``/tests``, ``/logs``), each
    backed by an empty directory under ``<session_dir>/binds/`` created at start;
    :meth:`Runtime.put` into them works on every backend."""
    workdir: str | None = None
    """Where commands run by default; None means ``<session_dir>/workspace``."""
    options: dict[str, str] = Field(default_factory=dict)
    """Backend-specific settings (e.g. ``binary: podman``, ``runtime: runc``)."""
    writable_root: bool = True
    """Containers: False mounts the image read-only, so only the session
    directory, binds, rw mounts and ``/tmp`` can be written (the local sandbox's
    root is always read-only)."""
    hidden: tuple[Path, ...] = ()
    """Host paths that must not be visible inside even where a mount or a system
    directory contains them (hidden tests, the package holding them): each is
    covered by an empty read-only directory."""
    owner: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
    """Who creates the runtime (a node id): what the runtime leaves on the host
    (containers, cgroups, state directories) carries it, so that a restarted
    owner can find and remove what a killed one left (:mod:`polar.runtime.reap`)."""

    def asked(self) -> frozenset[str]:
        """The fields this spec sets to something other than their default: what a
        task's own runtime section asks of a node. Not ``model_fields_set``, which
        a JSON round trip of the whole model (client, server, store, node) fills
        with every field."""
        return frozenset(
            name
            for name in self.model_fields_set
            if getattr(self, name)
            != type(self).model_fields[name].get_default(call_default_factory=True)
        )


@dataclass(frozen=True, slots=True)
class ExecResult:
    exit_code: int
    """The command's exit status; -1 when it was killed (timeout or cancel)."""
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.cancelled


OutputHandler = Callable[[Literal["stdout", "stderr"], str], None]
"""Called with each line of output (newline kept) as it arrives."""


@runtime_checkable
class Runtime(Protocol):
    """One session's sandbox. All methods are coroutines except the properties."""

    @property
    def spec(self) -> RuntimeSpec: ...

    @property
    def session_dir(self) -> Path:
        """Host path of the session directory; the same path inside the runtime."""
        ...

    @property
    def workdir(self) -> str:
        """Default working directory of commands inside the runtime."""
        ...

    @property
    def gateway_url(self) -> str | None:
        """The gateway's root URL as seen from inside (None: no gateway given)."""
        ...

    async def start(self) -> None:
        """Create the sandbox (and the gateway relay). Raises RuntimeStartError."""
        ...

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        on_output: OutputHandler | None = None,
    ) -> ExecResult:
        """Run ``argv`` inside; never raises for the command's own failure."""
        ...

    async def put(self, source: Path, target: str) -> None:
        """Copy a host file or directory to ``target`` inside (parents created)."""
        ...

    async def get(self, source: str, target: Path) -> None:
        """Copy a file or directory from inside to the host path ``target``."""
        ...

    async def cancel(self) -> None:
        """Kill every command running inside now (their exec returns cancelled)."""
        ...

    @property
    def limit_hit(self) -> LimitHit | None:
        """The first limit the sandbox ran into, if any. The runtime watches its
        limits while it runs; when one is hit, every running command is killed
        (their exec returns cancelled) and this says which and why."""
        ...

    async def stop(self) -> None:
        """Kill everything and free the sandbox; idempotent."""
        ...


class LimitKind(StrEnum):
    PIDS = "pids"
    MEMORY = "memory"
    CPU_TIME = "cpu_time"
    TMP = "tmp"
    DISK = "disk"
    """The session directory's size-limited filesystem (:mod:`polar.runtime.disk`)."""


@dataclass(frozen=True, slots=True)
class LimitHit:
    kind: LimitKind
    message: str
    """One line for people, e.g. ``the sandbox hit its memory limit (512 MB): a
    process was killed``."""


@dataclass(frozen=True, slots=True)
class GatewayAddress:
    """Where the real gateway listens on the host, for the relay into the sandbox."""

    host: str
    port: int
    api_key: str | None = field(default=None, repr=False)
    """The only key the relay lets through (the session's own); None: any key
    (the gateway still checks it). Nodes always set it."""


RuntimeFactory = Callable[[RuntimeSpec, Path, GatewayAddress | None], Runtime]
"""``factory(spec, session_dir, gateway)``: a new, not yet started runtime."""
