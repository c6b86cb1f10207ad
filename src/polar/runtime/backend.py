"""What the built-in backends share: commands under Polar's supervisor, files
through the state directory, limits watched, one way to stop.

A backend (:class:`~polar.runtime.local.LocalRuntime`,
:class:`~polar.runtime.containers.ContainerRuntime`) starts its sandbox and
says how to launch a supervisor in it (:meth:`SupervisedRuntime._launch`), where
the gateway is relayed inside (:attr:`SupervisedRuntime._relay_port`) and
how to close it (:meth:`SupervisedRuntime._close`); running commands
(:mod:`polar.runtime.commands`), copying files in and out
(:mod:`polar.runtime.statedir`), cancelling and stopping are the same for all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

from polar.runtime import statedir
from polar.runtime.base import (
    ExecResult,
    GatewayAddress,
    LimitHit,
    NetworkPolicy,
    OutputHandler,
    RuntimeSpec,
)
from polar.runtime.commands import Commands, Supervisor
from polar.runtime.errors import RuntimeNotStarted, UnsupportedSpec
from polar.runtime.limits import LimitWatch
from polar.runtime.relay import GatewayRelay
from polar.runtime.statedir import StateDir, copy_path


class SupervisedRuntime:
    """The shared half of a :class:`~polar.runtime.base.Runtime`.

    ``options`` are the ``spec.options`` the backend takes (others are refused);
    ``python`` is the interpreter that runs Polar's helper inside unless
    ``options.python`` names another. Subclasses set ``_state`` (the state
    directory; ``None`` only for the unsandboxed local runtime, whose files are
    copied on the host), ``_relay``, ``_watch`` and ``_started`` as they start.
    """

    options: frozenset[str] = frozenset()

    def __init__(
        self,
        spec: RuntimeSpec,
        session_dir: Path,
        gateway: GatewayAddress | None,
        *,
        python: str,
    ) -> None:
        unknown = sorted(set(spec.options) - self.options)
        if unknown:
            raise UnsupportedSpec(
                f"{spec.backend} runtime: unknown options {unknown}; known: {sorted(self.options)}"
            )
        self._spec = spec
        self._session_dir = session_dir.resolve()
        self._gateway = gateway
        self._python = spec.options.get("python", python)
        self._state: StateDir | None = None
        self._relay: GatewayRelay | None = None
        self._watch: LimitWatch | None = None
        self._started = False
        self._stopped = False
        self._commands = Commands(self._launch)

    @property
    def spec(self) -> RuntimeSpec:
        return self._spec

    @property
    def session_dir(self) -> Path:
        return self._session_dir

    @property
    def workdir(self) -> str:
        return self._spec.workdir or str(self._session_dir / "workspace")

    @property
    def gateway_url(self) -> str | None:
        if self._gateway is None or self._spec.network is NetworkPolicy.NONE:
            return None
        if self._spec.network is NetworkPolicy.GATEWAY_ONLY:
            port = self._relay_port
            return None if port is None else f"http://127.0.0.1:{port}"
        return f"http://{self._gateway.host}:{self._gateway.port}"

    @property
    def _relay_port(self) -> int | None:
        """The port inside on which the gateway is relayed (``gateway_only``), once
        the sandbox is up."""
        raise NotImplementedError

    @property
    def limit_hit(self) -> LimitHit | None:
        return self._watch.poll() if self._watch is not None else None

    def _check(self) -> None:
        if not self._started or self._stopped:
            raise RuntimeNotStarted("the runtime is not running")

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        on_output: OutputHandler | None = None,
    ) -> ExecResult:
        self._check()
        return await self._commands.run(
            argv,
            cwd=cwd or self.workdir,
            env={**self._spec.env, **(env or {})},
            timeout_s=timeout_s,
            on_output=on_output,
        )

    async def put(self, source: Path, target: str) -> None:
        self._check()
        if self._state is None:
            await asyncio.to_thread(copy_path, source, Path(target))
        else:
            await statedir.put(self._state, self._run_helper, self._python, source, target)

    async def get(self, source: str, target: Path) -> None:
        self._check()
        if self._state is None:
            await asyncio.to_thread(copy_path, Path(source), target)
        else:
            await statedir.get(self._state, self._run_helper, self._python, source, target)

    async def cancel(self) -> None:
        await self._commands.cancel_all()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self._commands.cancel_all()
        await self._teardown()

    async def _teardown(self) -> None:
        """Free what a start made, in reverse; safe after a start that failed half way."""
        if self._watch is not None:
            self._watch.poll()  # a last look: the report stays readable after stop
            await self._watch.stop()
        await self._close()
        if self._relay is not None:
            await self._relay.stop()
        if self._state is not None:
            self._state.remove()

    async def _run_helper(self, argv: Sequence[str]) -> ExecResult:
        return await self._commands.run(argv, cwd="/", env={}, timeout_s=None, on_output=None)

    async def _launch(self, number: int) -> Supervisor:
        """Start the supervisor of command ``number`` in the sandbox."""
        raise NotImplementedError

    async def _close(self) -> None:
        """Close the sandbox itself (the watch, relay and state are the base's)."""
        raise NotImplementedError
