"""Running commands under a supervisor, the same way on every backend.

Each :meth:`Runtime.exec` starts one supervisor (``inside.py exec``, see
:mod:`polar.runtime.inside`) in the sandbox: the backend decides how (a spawn
request to the bubblewrap init, ``docker exec -i``, ``apptainer exec``, or a
plain subprocess). The host then sends the request (argv, cwd, environment) as
one JSON line on the supervisor's stdin, so that neither secrets nor the
environment ever appear on a command line, reads the output line by line, and
waits for the exit status.

Killing is closing that stdin: the supervisor kills the command's whole tree
(it is the tree's subreaper) and exits. If it does not exit within
:data:`KILL_GRACE_S`, the backend's ``force`` is the last resort.

The supervisor's stdin, stdout and stderr are plain pipes (:class:`Pipes`), never
a subprocess transport's: asyncio (3.11) reports a subprocess's exit only once
its pipes have closed, and a process that escaped the kill would hold them open.
Here the exit is the supervisor's alone, and output still arriving after it is
given :data:`OUTPUT_DRAIN_S`, then dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from polar.runtime.base import ExecResult, OutputHandler

KILL_GRACE_S = 5.0
"""How long a supervisor gets to kill its tree and exit after its stdin closed."""
CHUNK = 65536
OUTPUT_DRAIN_S = 5.0
"""After the supervisor exited, how long to wait for the last output."""


@dataclass(eq=False)
class Supervisor:
    """One started supervisor as the host sees it."""

    stdin: asyncio.StreamWriter
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    exited: asyncio.Future[int]
    """Resolves to the supervisor's exit status (the command's)."""
    force: Callable[[], Awaitable[None]]
    """Ends the supervisor when closing its stdin did not."""
    transports: tuple[asyncio.BaseTransport, ...] = ()
    """The pipes' transports, closed by :meth:`close`."""

    def close(self) -> None:
        self.stdin.close()
        for transport in self.transports:
            transport.close()


class Pipes:
    """A supervisor's three pipes: :attr:`child` ends for it, the others for the host."""

    def __init__(self) -> None:
        self._stdin_r, self._stdin_w = os.pipe()
        self._out_r, self._out_w = os.pipe()
        self._err_r, self._err_w = os.pipe()
        self._child_open = True

    @property
    def child(self) -> tuple[int, int, int]:
        """The supervisor's stdin, stdout and stderr."""
        return self._stdin_r, self._out_w, self._err_w

    def close_child(self) -> None:
        """Close the child's ends here (once the child has them, or on failure)."""
        if self._child_open:
            self._child_open = False
            for fd in self.child:
                os.close(fd)

    def discard(self) -> None:
        """Close every end (the supervisor could not be started)."""
        self.close_child()
        for fd in (self._stdin_w, self._out_r, self._err_r):
            os.close(fd)

    async def supervisor(
        self, exited: asyncio.Future[int], force: Callable[[], Awaitable[None]]
    ) -> Supervisor:
        """The host's side of a started supervisor (the child's ends are closed here)."""
        self.close_child()
        loop = asyncio.get_running_loop()
        stdout, stderr = asyncio.StreamReader(), asyncio.StreamReader()
        out, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stdout), os.fdopen(self._out_r, "rb", 0)
        )
        err, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stderr), os.fdopen(self._err_r, "rb", 0)
        )
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()),
            os.fdopen(self._stdin_w, "wb", 0),
        )
        stdin = asyncio.StreamWriter(transport, protocol, None, loop)
        return Supervisor(stdin, stdout, stderr, exited, force, (out, err))


Launcher = Callable[[int], Awaitable[Supervisor]]
"""Starts the supervisor for command number ``n`` of this runtime."""


@dataclass(eq=False)
class _Running:
    supervisor: Supervisor
    timed_out: bool = False
    cancelled: bool = False
    ending: asyncio.Future[None] | None = field(default=None)


class Commands:
    """The commands of one runtime: run each under a supervisor; kill them all."""

    def __init__(self, launch: Launcher) -> None:
        self._launch = launch
        self._numbers = itertools.count(1)
        self._running: set[_Running] = set()

    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        timeout_s: float | None,
        on_output: OutputHandler | None,
    ) -> ExecResult:
        started = time.monotonic()
        supervisor = await self._launch(next(self._numbers))
        running = _Running(supervisor)
        self._running.add(running)
        readers = [
            asyncio.ensure_future(_read(supervisor.stdout, "stdout", on_output)),
            asyncio.ensure_future(_read(supervisor.stderr, "stderr", on_output)),
        ]
        request = {"argv": list(argv), "cwd": cwd, "env": dict(env)}
        try:
            try:
                supervisor.stdin.write(json.dumps(request).encode() + b"\n")
                with contextlib.suppress(ConnectionError):
                    await supervisor.stdin.drain()
                code = await asyncio.wait_for(asyncio.shield(supervisor.exited), timeout_s)
            except TimeoutError:
                running.timed_out = True
                code = await self._end(running)
            except asyncio.CancelledError:
                running.cancelled = True
                await asyncio.shield(self._end(running))
                raise
            finally:
                self._running.discard(running)
            await asyncio.wait(readers, timeout=OUTPUT_DRAIN_S)
            stdout, stderr = ("".join(r.result()) if r.done() else "" for r in readers)
        finally:
            for reader in readers:
                reader.cancel()
            supervisor.close()
        killed = running.timed_out or running.cancelled
        return ExecResult(
            exit_code=-1 if killed else code,
            stdout=stdout,
            stderr=stderr,
            duration_s=time.monotonic() - started,
            timed_out=running.timed_out,
            cancelled=running.cancelled and not running.timed_out,
        )

    async def cancel_all(self) -> None:
        """Kill every running command's tree; their :meth:`run` returns cancelled."""
        running = list(self._running)
        for entry in running:
            entry.cancelled = True
        await asyncio.gather(*(self._end(entry) for entry in running))

    async def _end(self, running: _Running) -> int:
        if running.ending is None:
            running.ending = asyncio.ensure_future(_terminate(running.supervisor))
        await asyncio.shield(running.ending)
        exited = running.supervisor.exited
        return exited.result() if exited.done() and not exited.cancelled() else -1


async def _terminate(supervisor: Supervisor) -> None:
    supervisor.stdin.close()
    for attempt in range(2):
        try:
            await asyncio.wait_for(asyncio.shield(supervisor.exited), KILL_GRACE_S)
        except TimeoutError:
            if attempt == 0:
                await supervisor.force()
        else:
            return


async def _read(
    stream: asyncio.StreamReader, name: str, on_output: OutputHandler | None
) -> list[str]:
    """Collect a stream's lines (newline kept), handing each on as it completes."""
    lines: list[str] = []

    def emit(raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace")
        lines.append(text)
        if on_output is not None:
            on_output(name, text)  # type: ignore[arg-type]

    pending = b""
    while chunk := await stream.read(CHUNK):
        *complete, pending = (pending + chunk).split(b"\n")
        for raw in complete:
            emit(raw + b"\n")
    if pending:
        emit(pending)
    return lines
