"""The ``local`` runtime: the session directory on this machine.

``sandbox: true`` (the default) runs every command in one bubblewrap sandbox
per runtime (see :mod:`polar.runtime.bubblewrap` for why and how): only the
system directories, the session directory, the spec's mounts and binds are
visible; the network is the policy's (with ``gateway_only`` the gateway's
model API is relayed in, :mod:`polar.runtime.relay`); ``cpus``, ``memory_mb``,
``pids`` and ``cpu_time_s`` are enforced through a cgroup
(:mod:`polar.runtime.cgroups`) or refused, ``tmp_mb`` by the size of the
sandbox's ``/tmp``; :mod:`polar.runtime.limits` watches them all (and a
size-limited session directory) and reports the first one hit.

``sandbox: false`` runs plain host processes (no filesystem or network
isolation, no limits: for trusted commands and machines without bubblewrap);
it accepts only ``network: host``.

In both modes each command runs under a supervisor that kills the command's
whole process tree, even processes that left its process group, when it
exits, times out or is cancelled (:mod:`polar.runtime.commands`). A command's
background processes therefore do not outlive it.

Options: ``python`` (the interpreter that runs Polar's helper inside the
sandbox; it must lie under a mounted directory; default ``/usr/bin/python3``),
``bwrap`` (default ``bwrap`` on the PATH), ``cgroup_root`` (where the
sandbox's cgroup is created; default: see :mod:`polar.runtime.cgroups`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from polar.runtime import cgroups, inside, layout
from polar.runtime.backend import SupervisedRuntime
from polar.runtime.base import (
    GatewayAddress,
    LimitHit,
    LimitKind,
    NetworkPolicy,
    RuntimeSpec,
)
from polar.runtime.bubblewrap import BwrapSandbox, bwrap_argv, cgroup_wrapper
from polar.runtime.commands import Pipes, Supervisor
from polar.runtime.errors import RuntimeStartError, UnsupportedSpec
from polar.runtime.limits import LimitWatch, SizedPath, checks, session_disk
from polar.runtime.relay import GatewayRelay
from polar.runtime.statedir import StateDir

OPTIONS = frozenset({"python", "bwrap", "cgroup_root"})
DEFAULT_PYTHON = "/usr/bin/python3"


class LocalRuntime(SupervisedRuntime):
    options = OPTIONS

    def __init__(
        self, spec: RuntimeSpec, session_dir: Path, gateway: GatewayAddress | None
    ) -> None:
        super().__init__(spec, session_dir, gateway, python=DEFAULT_PYTHON)
        self._limits = cgroups.Limits(spec.cpus, spec.memory_mb, spec.pids, spec.cpu_time_s)
        root = spec.options.get("cgroup_root")
        self._cgroup_root = None if root is None else Path(root)
        if not spec.sandbox:
            if spec.network is not NetworkPolicy.HOST:
                raise UnsupportedSpec(
                    f"local runtime without a sandbox cannot restrict the network "
                    f"(network: {spec.network.value}); use network: host or sandbox: true"
                )
            if spec.binds:
                raise UnsupportedSpec("local runtime without a sandbox cannot bind paths")
            if self._limits.any or spec.tmp_mb is not None:
                raise UnsupportedSpec("local runtime without a sandbox cannot enforce limits")
        elif self._limits.any:
            cgroups.check(self._cgroup_root, self._limits)
        self._backings = layout.bind_backings(self._session_dir, spec.binds)
        self._cgroup: cgroups.Cgroup | None = None
        self._sandbox: BwrapSandbox | None = None

    @property
    def _relay_port(self) -> int | None:
        return None if self._sandbox is None else self._sandbox.port

    async def start(self) -> None:
        if self._started:
            return
        layout.prepare(self._session_dir, self._backings)
        if self._spec.sandbox:
            await self._start_sandbox()
            self._watch = LimitWatch(self._limit_check(), self._commands.cancel_all)
            self._watch.start()
        self._started = True

    def _limit_check(self) -> Callable[[], LimitHit | None]:
        paths: list[SizedPath] = []
        init = self._sandbox.init_pid if self._sandbox is not None else None
        if self._spec.tmp_mb is not None and init is not None:
            tmp = Path(f"/proc/{init}/root/tmp")
            paths.append(SizedPath(LimitKind.TMP, tmp, self._spec.tmp_mb, "/tmp"))
        paths += session_disk(self._session_dir)
        return checks(self._cgroup, self._limits, paths)

    def _bwrap(self) -> str:
        bwrap = shutil.which(self._spec.options.get("bwrap", "bwrap"))
        if bwrap is None:
            raise RuntimeStartError(
                "bubblewrap (bwrap) is not installed; run scripts/setup --sandbox "
                "or use sandbox: false"
            )
        if not Path(self._python).is_file():
            raise RuntimeStartError(
                f"the sandbox needs a python3 at {self._python} for Polar's helper "
                "(set options.python)"
            )
        return bwrap

    async def _start_sandbox(self) -> None:
        bwrap = self._bwrap()
        self._state = StateDir.create(self._session_dir, self._spec.owner)
        try:
            forward = self._spec.network is NetworkPolicy.GATEWAY_ONLY and self._gateway is not None
            if forward and self._gateway is not None:
                self._relay = GatewayRelay(self._state.socket, self._gateway)
                await self._relay.start()
            if self._limits.any:
                self._cgroup = cgroups.create(self._cgroup_root, self._limits, self._spec.owner)
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            argv = bwrap_argv(
                bwrap=bwrap,
                python=self._python,
                session_dir=self._session_dir,
                mounts=self._spec.mounts,
                binds=self._backings,
                state=self._state,
                network=self._spec.network,
                control_fd=child.fileno(),
                forward=forward,
                unprivileged=os.geteuid() != 0,
                tmp_mb=self._spec.tmp_mb,
                hidden=self._spec.hidden,
            )
            if self._cgroup is not None:
                argv = cgroup_wrapper(self._cgroup, argv)
            try:
                self._sandbox = await BwrapSandbox.start(
                    argv, child.fileno(), parent, self._state.path / "init.log"
                )
            finally:
                child.close()
        except BaseException:
            await self._teardown()
            raise

    async def _close(self) -> None:
        if self._sandbox is not None:
            await self._sandbox.close()
        if self._cgroup is not None:
            await asyncio.to_thread(self._cgroup.remove)

    async def _launch(self, number: int) -> Supervisor:
        if self._sandbox is not None:
            return await self._sandbox.launch(number)
        pipes = Pipes()
        stdin, stdout, stderr = pipes.child
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",
                inside.__file__,
                "exec",
                str(number),
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                env={},
                start_new_session=True,
            )
        except BaseException:
            pipes.discard()
            raise

        async def force() -> None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()

        return await pipes.supervisor(asyncio.ensure_future(process.wait()), force)
