"""The ``docker`` runtime: one long-lived container per session, through a
Docker-compatible client (``docker``, or ``podman``'s identical CLI).

``create`` + ``start`` one container whose init is Polar's helper (see
:mod:`polar.runtime.containers`): the session directory, the spec's mounts
and the binds' backing directories are bind-mounted at their paths
(identity), the state directory read-only at ``/run/polar``. Network:
``--network none`` for ``gateway_only`` (the gateway arrives over the
relay socket) and ``none``; ``--network host`` for ``host``. Limits map to
``--cpus``, ``--memory``/``--memory-swap`` (no swap beyond the limit) and
``--pids-limit``; ``cpu_time_s`` is watched through the container's cgroup
(:mod:`polar.runtime.limits`); ``tmp_mb`` sizes tmpfs ``/tmp`` and
``/var/tmp``; ``writable_root: false`` mounts the image read-only
(``--read-only``), so that only the session directory, binds, rw mounts and
the temporary directories can be written; hidden paths under a mount are
covered by an empty read-only tmpfs; ``owner`` becomes the label
``polar.owner``. ``--ulimit`` values come from ``options.ulimits``
(default ``nofile=1024:1024,nproc=1024:1024``: a rootful engine whose
caller lacks CAP_SYS_RESOURCE, like podman as root in an unprivileged
container, cannot raise the container's limits to its defaults; an empty
string passes none). Stop is ``kill`` then ``rm -f``.

Options: ``binary`` (default: ``docker`` or ``podman``, the first whose
``version`` answers, so a ``docker`` client without a daemon is passed over),
``runtime`` (an OCI runtime such as ``runc``), ``python`` (the image's
interpreter for the helper, default ``python3``), ``ulimits``.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from polar.runtime import cgroups
from polar.runtime.base import GatewayAddress, LimitHit, LimitKind, NetworkPolicy, RuntimeSpec
from polar.runtime.cgroups import Limits
from polar.runtime.containers import CliResult, ContainerRuntime, run_cli
from polar.runtime.errors import RuntimeStartError
from polar.runtime.limits import SizedPath, checks, session_disk
from polar.runtime.statedir import RW_INSIDE, STATE_INSIDE, StateDir

CLIENTS = ("docker", "podman")
OWNER_LABEL = "polar.owner"
"""The label naming a container's owner (``RuntimeSpec.owner``), for reaping."""
DEFAULT_ULIMITS = "nofile=1024:1024,nproc=1024:1024"
STOP_TIMEOUT_S = 30.0


async def find_client(preferred: str | None) -> str:
    """The client binary: the one asked for, else the first on the PATH that works."""
    if preferred is not None:
        found = shutil.which(preferred)
        if found is None:
            raise RuntimeStartError(f"docker runtime: {preferred} is not installed")
        return found
    candidates = [path for path in map(shutil.which, CLIENTS) if path is not None]
    if not candidates:
        raise RuntimeStartError(
            "docker runtime: neither docker nor podman is installed "
            "(scripts/setup --sandbox installs podman)"
        )
    for candidate in candidates:
        if (await run_cli([candidate, "version"], 30)).returncode == 0:
            return candidate
    return candidates[0]


class DockerRuntime(ContainerRuntime):
    options = frozenset({"binary", "runtime", "python", "ulimits"})

    def __init__(
        self, spec: RuntimeSpec, session_dir: Path, gateway: GatewayAddress | None
    ) -> None:
        super().__init__(spec, session_dir, gateway)
        self.name = f"polar-{uuid.uuid4().hex[:16]}"
        self._binary: str | None = None
        self._created = False

    def create_argv(self, binary: str, state: StateDir) -> list[str]:
        """The ``create`` command line (pure: no side effects)."""
        spec = self._spec
        assert spec.image is not None
        argv = [binary, "create", "--name", self.name, "--label", "polar.runtime=docker"]
        if spec.owner is not None:
            argv += ["--label", f"{OWNER_LABEL}={spec.owner}"]
        if "runtime" in spec.options:
            argv += ["--runtime", spec.options["runtime"]]
        network = "host" if spec.network is NetworkPolicy.HOST else "none"
        argv += ["--network", network]
        if spec.cpus is not None:
            argv += ["--cpus", f"{spec.cpus:g}"]
        if spec.memory_mb is not None:
            argv += ["--memory", f"{spec.memory_mb}m", "--memory-swap", f"{spec.memory_mb}m"]
        if spec.pids is not None:
            argv += ["--pids-limit", str(spec.pids)]
        for ulimit in filter(None, spec.options.get("ulimits", DEFAULT_ULIMITS).split(",")):
            argv += ["--ulimit", ulimit.strip()]
        if not spec.writable_root:
            argv += ["--read-only", "--read-only-tmpfs=false"]
        if spec.tmp_mb is not None or not spec.writable_root:
            size = f",size={spec.tmp_mb}m" if spec.tmp_mb is not None else ""
            for path in ("/tmp", "/var/tmp"):
                argv += ["--tmpfs", f"{path}:rw,nosuid,nodev,mode=1777{size}"]
        session = str(self._session_dir)
        argv += ["-v", f"{session}:{session}:rw"]
        for mount in spec.mounts:
            mode = "ro" if mount.read_only else "rw"
            argv += ["-v", f"{mount.path}:{mount.path}:{mode}"]
        for backing, path in self._backings:
            argv += ["-v", f"{backing}:{path}:rw"]
        argv += ["-v", f"{state.path}:{STATE_INSIDE}:ro", "-v", f"{state.rw}:{RW_INSIDE}:rw"]
        mounted = [mount.path for mount in spec.mounts]
        for hidden in spec.hidden:
            if any(hidden == root or hidden.is_relative_to(root) for root in mounted):
                argv += ["--tmpfs", f"{hidden}:ro,size=4k,mode=0555,notmpcopyup"]
        argv += ["--entrypoint", self._python, "--workdir", "/", spec.image, *self.init_argv()]
        return argv

    async def _create(self, state: StateDir) -> None:
        self._binary = await find_client(self._spec.options.get("binary"))
        # podman's conmon (before containers/conmon#514) creates an empty ``oom``
        # file in its working directory when the container hits its memory
        # limit: run the client in the state directory, not the node's.
        created = await run_cli(self.create_argv(self._binary, state), cwd=state.path)
        if created.returncode != 0:
            raise RuntimeStartError(f"docker runtime: create failed: {created.message}")
        self._created = True
        started = await run_cli([self._binary, "start", self.name], cwd=state.path)
        if started.returncode != 0:
            raise RuntimeStartError(self._start_failure(started))

    def _start_failure(self, result: CliResult) -> str:
        message = result.message
        if self._python in message and ("not found" in message or "no such file" in message):
            return (
                f"docker runtime: image {self._spec.image} has no {self._python}, which "
                f"Polar's in-container helper needs (set options.python): {message}"
            )
        return f"docker runtime: start failed: {message}"

    async def _init_problem(self) -> str | None:
        assert self._binary is not None
        state = await run_cli(
            [self._binary, "inspect", "--format", "{{.State.Running}}", self.name], 30
        )
        if state.returncode == 0 and state.stdout.strip() == "true":
            return None
        logs = await run_cli([self._binary, "logs", self.name], 30)
        return self._start_failure(CliResult(1, logs.stdout, logs.stderr or state.message))

    async def _limit_check(self) -> Callable[[], LimitHit | None] | None:
        assert self._binary is not None
        inspected = await run_cli(
            [self._binary, "inspect", "--format", "{{.State.Pid}}", self.name], 30
        )
        try:
            pid = int(inspected.stdout.strip())
        except ValueError:
            return None
        spec = self._spec
        limits = Limits(spec.cpus, spec.memory_mb, spec.pids, spec.cpu_time_s)
        paths = session_disk(self._session_dir)
        if spec.tmp_mb is not None:
            for inside in ("/tmp", "/var/tmp"):
                tmp = Path(f"/proc/{pid}/root{inside}")
                paths.append(SizedPath(LimitKind.TMP, tmp, spec.tmp_mb, inside))
        return checks(cgroups.of_process(pid), limits, paths)

    def exec_argv(self, *, interactive: bool) -> list[str]:
        assert self._binary is not None
        return [self._binary, "exec", *(["-i"] if interactive else []), self.name]

    async def _destroy(self) -> None:
        if not self._created or self._binary is None:
            return
        self._created = False
        await run_cli([self._binary, "kill", self.name], STOP_TIMEOUT_S)
        await run_cli([self._binary, "rm", "-f", self.name], STOP_TIMEOUT_S)
