"""The ``apptainer`` runtime: one Apptainer instance per session.

**Untested against a real Apptainer**: Apptainer is not packaged for Debian
12 and cannot be installed from the registries the project's machines reach,
so the tests check the command lines this module builds, not their effect.
The instance shares everything else with the ``docker`` backend
(:mod:`polar.runtime.containers`): the same helper as init, supervisor and
copier, the same gateway relay socket.

``apptainer instance start --containall`` (own PID and IPC namespaces, a clean
environment, no automatic binds of the caller's home, ``/tmp`` or working
directory), with a writable layer (``--overlay <options.overlay>`` or else
``--writable-tmpfs``), the session directory, mounts and binds bound at their
paths, the state directory read-only at ``/run/polar``. Network: ``--net
--network none`` for ``gateway_only`` and ``none``; the host's for ``host``.
Limits: ``--cpus``, ``--memory``, ``--pids-limit`` (cgroups: root, or a
cgroups v2 delegation); ``cpu_time_s``, ``tmp_mb`` and ``hidden`` are refused
(nothing here could enforce or check them). The init runs through a long-lived ``apptainer exec
instance://...`` (an instance cannot be given a command of its own), every
command through ``apptainer exec --cleanenv instance://...``, so nothing of
the caller's environment reaches it. Stop is ``apptainer instance stop
--force``.

Options: ``binary`` (default ``apptainer``, e.g. ``singularity``), ``python``
(the image's interpreter, default ``python3``), ``overlay`` (an overlay
directory or image for the instance's writable layer).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from pathlib import Path

from polar.runtime.base import GatewayAddress, NetworkPolicy, RuntimeSpec
from polar.runtime.containers import ContainerRuntime, run_cli
from polar.runtime.errors import RuntimeStartError, UnsupportedSpec
from polar.runtime.statedir import RW_INSIDE, STATE_INSIDE, StateDir

STOP_TIMEOUT_S = 30.0


class ApptainerRuntime(ContainerRuntime):
    options = frozenset({"binary", "python", "overlay"})

    def __init__(
        self, spec: RuntimeSpec, session_dir: Path, gateway: GatewayAddress | None
    ) -> None:
        super().__init__(spec, session_dir, gateway)
        unsupported = [name for name in ("cpu_time_s", "tmp_mb", "hidden") if getattr(spec, name)]
        if unsupported:
            raise UnsupportedSpec(
                f"apptainer runtime cannot enforce {', '.join(unsupported)}; "
                "set them to null for this backend"
            )
        self.name = f"polar-{uuid.uuid4().hex[:16]}"
        self.binary = spec.options.get("binary", "apptainer")
        self._instance = False
        self._init: asyncio.subprocess.Process | None = None

    def start_argv(self, state: StateDir) -> list[str]:
        """``apptainer instance start ...`` (pure: no side effects)."""
        spec = self._spec
        assert spec.image is not None
        argv = [self.binary, "instance", "start", "--containall"]
        if "overlay" in spec.options:
            argv += ["--overlay", spec.options["overlay"]]
        else:
            argv.append("--writable-tmpfs")
        if spec.network is not NetworkPolicy.HOST:
            argv += ["--net", "--network", "none"]
        if spec.cpus is not None:
            argv += ["--cpus", f"{spec.cpus:g}"]
        if spec.memory_mb is not None:
            argv += ["--memory", f"{spec.memory_mb}M"]
        if spec.pids is not None:
            argv += ["--pids-limit", str(spec.pids)]
        session = str(self._session_dir)
        binds = [f"{session}:{session}:rw"]
        binds += [f"{m.path}:{m.path}:{'ro' if m.read_only else 'rw'}" for m in spec.mounts]
        binds += [f"{backing}:{path}:rw" for backing, path in self._backings]
        binds += [f"{state.path}:{STATE_INSIDE}:ro", f"{state.rw}:{RW_INSIDE}:rw"]
        for bind in binds:
            argv += ["--bind", bind]
        return [*argv, spec.image, self.name]

    def init_exec_argv(self) -> list[str]:
        """The long-lived exec that runs the helper as the instance's init."""
        return [*self.exec_argv(interactive=False), self._python, *self.init_argv()]

    async def _create(self, state: StateDir) -> None:
        if shutil.which(self.binary) is None:
            raise RuntimeStartError(f"apptainer runtime: {self.binary} is not installed")
        started = await run_cli(self.start_argv(state))
        if started.returncode != 0:
            raise RuntimeStartError(f"apptainer runtime: instance start failed: {started.message}")
        self._instance = True
        self._init = await asyncio.create_subprocess_exec(
            *self.init_exec_argv(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=(state.path / "init.log").open("wb"),
        )

    async def _init_problem(self) -> str | None:
        if self._init is None or self._init.returncode is None:
            return None
        log = ""
        if self._state is not None:
            log = (self._state.path / "init.log").read_text(errors="replace").strip()
        return (
            f"apptainer runtime: the helper exited ({self._init.returncode}); does "
            f"{self._spec.image} have {self._python} (options.python)? {log[-2000:]}"
        )

    def exec_argv(self, *, interactive: bool) -> list[str]:
        return [self.binary, "exec", "--cleanenv", "--pwd", "/", f"instance://{self.name}"]

    async def _destroy(self) -> None:
        if self._instance:
            self._instance = False
            await run_cli([self.binary, "instance", "stop", "--force", self.name], STOP_TIMEOUT_S)
        if self._init is not None:
            with contextlib.suppress(ProcessLookupError):
                self._init.kill()
            await self._init.wait()
            self._init = None
