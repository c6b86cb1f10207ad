"""Run a command as a plain local subprocess: own process group, stdin closed,
output captured (and optionally streamed), the whole group killed on timeout.

This is deliberately not a sandbox: isolation (filesystem, network) belongs to
the runtime layer, which will wrap the same argv.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO

from polar.harness.errors import InvalidRunSpec

KILL_GRACE_S = 2.0
"""After SIGTERM on timeout, how long the group gets before SIGKILL."""

READER_JOIN_S = 5.0


class Stream(StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"


OutputHandler = Callable[[Stream, str], None]
"""Called from reader threads with each line (newline kept) as it arrives."""


@dataclass(frozen=True, slots=True)
class ProcessResult:
    argv: tuple[str, ...]
    exit_code: int
    """The process's exit status; a signal ``n`` reads as ``-n`` (as in subprocess)."""
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    on_output: OutputHandler | None = None,
) -> ProcessResult:
    """Run ``argv`` in ``cwd`` with exactly ``env``; wait at most ``timeout_s``.

    The child leads a new session (so a new process group); on timeout the group
    gets SIGTERM, then SIGKILL after :data:`KILL_GRACE_S`. When the child exits,
    whatever it left running in its group is killed too, so no stray agent
    subprocess outlives the run (processes that started their own session
    escape this; the runtime's sandbox catches those).
    """
    if not cwd.is_dir():
        raise InvalidRunSpec(f"working directory {cwd} does not exist")
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise InvalidRunSpec(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
    assert proc.stdout is not None and proc.stderr is not None
    out: list[str] = []
    err: list[str] = []
    readers = [
        threading.Thread(
            target=_pump, args=(proc.stdout, Stream.STDOUT, out, on_output), daemon=True
        ),
        threading.Thread(
            target=_pump, args=(proc.stderr, Stream.STDERR, err, on_output), daemon=True
        ),
    ]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        # Leftovers of the group hold the pipes open; without them the readers end.
        _signal_group(proc.pid, signal.SIGKILL)
        for reader, pipe in zip(readers, (proc.stdout, proc.stderr), strict=True):
            reader.join(READER_JOIN_S)
            # A process that left the group may still hold the pipe; closing it under a
            # blocked reader would block too, so such a pipe is left to the reader.
            if not reader.is_alive():
                pipe.close()
    return ProcessResult(
        argv=tuple(argv),
        exit_code=proc.returncode,
        stdout="".join(out),
        stderr="".join(err),
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )


def _pump(
    pipe: IO[bytes], stream: Stream, sink: list[str], on_output: OutputHandler | None
) -> None:
    try:
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            sink.append(line)
            if on_output is not None:
                on_output(stream, line)
    except (OSError, ValueError):
        return


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
