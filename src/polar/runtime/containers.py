"""What the container backends share: a long-lived container driven through a
command-line client (``docker``/``podman``, ``apptainer``).

The container's init is Polar's helper (``inside.py init``, see
:mod:`polar.runtime.inside`), run by the image's ``python3``: it reaps
orphans and, with ``network: gateway_only``, relays ``127.0.0.1:<port>``
inside to the host's gateway relay socket (:mod:`polar.runtime.relay`); it
writes its port to ``/run/polar/rw/ready.json`` when it is up. An image
without ``python3`` (or ``options.python``) is refused at start with a clear
error.

Each command is one client exec (``<client> exec -i ... inside.py exec
--inherit-env N``): the supervisor reads the request from stdin (so neither
secrets nor the environment appear on a host command line) and starts the
command with the image's environment plus the requested variables.
Cancelling closes that stdin, which the client forwards; the supervisor
then kills the command's tree. If the supervisor is still there after the
grace period, a second exec (``inside.py kill N``) signals it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from polar.runtime import layout, statedir
from polar.runtime.backend import SupervisedRuntime
from polar.runtime.base import (
    GatewayAddress,
    LimitHit,
    NetworkPolicy,
    RuntimeSpec,
)
from polar.runtime.commands import Pipes, Supervisor
from polar.runtime.errors import RuntimeStartError, UnsupportedSpec
from polar.runtime.limits import LimitWatch
from polar.runtime.relay import GatewayRelay
from polar.runtime.statedir import SCRIPT_INSIDE, StateDir

CLI_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 60.0
READY_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def message(self) -> str:
        return (self.stderr.strip() or self.stdout.strip() or f"exit {self.returncode}")[-2000:]


async def run_cli(
    argv: Sequence[str], timeout_s: float = CLI_TIMEOUT_S, cwd: Path | None = None
) -> CliResult:
    """Run a client command to completion (killed after ``timeout_s``), in ``cwd``
    when given."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        return CliResult(127, "", f"cannot run {argv[0]}: {exc.strerror or exc}")
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        out, err = await process.communicate()
        return CliResult(-1, out.decode(errors="replace"), f"timed out after {timeout_s} s")
    code = process.returncode if process.returncode is not None else -1
    return CliResult(code, out.decode(errors="replace"), err.decode(errors="replace"))


def _ready_port(state: StateDir) -> int | None:
    try:
        return int(json.loads(state.ready.read_text())["port"])
    except (OSError, ValueError, KeyError):
        return None


def check_paths(spec: RuntimeSpec, session_dir: Path) -> None:
    """Refuse host paths a bind option cannot carry (``:`` separates its fields)."""
    for path in [str(session_dir), *(str(m.path) for m in spec.mounts), *spec.binds]:
        if ":" in path or "," in path:
            raise UnsupportedSpec(
                f"{spec.backend} runtime cannot bind a path with ':' or ',': {path}"
            )


class ContainerRuntime(SupervisedRuntime):
    """A :class:`~polar.runtime.base.Runtime` over a container client.

    Subclasses build the client's command lines: :meth:`_create` starts the
    container and its init, :meth:`exec_argv` is the prefix that runs a
    program inside, :meth:`_destroy` removes the container.
    """

    def __init__(
        self, spec: RuntimeSpec, session_dir: Path, gateway: GatewayAddress | None
    ) -> None:
        super().__init__(spec, session_dir, gateway, python="python3")
        if not spec.image:
            raise UnsupportedSpec(f"{spec.backend} runtime needs an image")
        check_paths(spec, self._session_dir)
        self._backings = layout.bind_backings(self._session_dir, spec.binds)
        self._port: int | None = None

    @property
    def _relay_port(self) -> int | None:
        return self._port

    @property
    def forwards(self) -> bool:
        """Whether the init relays the gateway (``gateway_only`` with a gateway)."""
        return self._spec.network is NetworkPolicy.GATEWAY_ONLY and self._gateway is not None

    async def start(self) -> None:
        if self._started:
            return
        layout.prepare(self._session_dir, self._backings)
        self._state = StateDir.create(self._session_dir, self._spec.owner)
        self._state.rw.chmod(0o777)
        try:
            if self.forwards and self._gateway is not None:
                self._relay = GatewayRelay(self._state.socket, self._gateway)
                await self._relay.start()
            await self._create(self._state)
            port = await self._wait_ready(self._state)
            if self.forwards:
                self._port = port
            check = await self._limit_check()
            if check is not None:
                self._watch = LimitWatch(check, self._commands.cancel_all)
                self._watch.start()
        except BaseException:
            await self._teardown()
            raise
        self._started = True

    async def _limit_check(self) -> Callable[[], LimitHit | None] | None:
        """How to read the running container's limits (None: not watched)."""
        return None

    async def _wait_ready(self, state: StateDir) -> int:
        deadline = time.monotonic() + READY_TIMEOUT_S
        next_check = time.monotonic() + 0.5
        while (port := _ready_port(state)) is None:
            if time.monotonic() > next_check:
                problem = await self._init_problem()
                if problem is not None:
                    raise RuntimeStartError(problem)
                next_check = time.monotonic() + 0.5
            if time.monotonic() > deadline:
                raise RuntimeStartError(
                    f"{self._spec.backend}: the container's init did not start within "
                    f"{READY_TIMEOUT_S:.0f} s"
                )
            await asyncio.sleep(READY_POLL_S)
        return port

    async def _close(self) -> None:
        await self._destroy()

    async def _launch(self, number: int) -> Supervisor:
        helper = [self._python, "-I", "-S", SCRIPT_INSIDE]
        pipes = Pipes()
        stdin, stdout, stderr = pipes.child
        try:
            process = await asyncio.create_subprocess_exec(
                *self.exec_argv(interactive=True),
                *helper,
                "exec",
                "--inherit-env",
                str(number),
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
            )
        except BaseException:
            pipes.discard()
            raise

        async def force() -> None:
            await run_cli([*self.exec_argv(interactive=False), *helper, "kill", str(number)], 30)
            with contextlib.suppress(ProcessLookupError):
                process.kill()

        return await pipes.supervisor(asyncio.ensure_future(process.wait()), force)

    def init_argv(self) -> list[str]:
        """The helper's arguments that make it the container's init."""
        argv = ["-I", "-S", SCRIPT_INSIDE, "init", "--ready", statedir.READY_INSIDE]
        if self.forwards:
            argv += ["--forward", statedir.SOCKET_INSIDE]
        return argv

    async def _create(self, state: StateDir) -> None:
        raise NotImplementedError

    async def _init_problem(self) -> str | None:
        """Why the init will never be ready (it exited), or None while it may still be."""
        raise NotImplementedError

    def exec_argv(self, *, interactive: bool) -> list[str]:
        raise NotImplementedError

    async def _destroy(self) -> None:
        raise NotImplementedError
