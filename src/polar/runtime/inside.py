"""Polar's helper program inside a sandbox: its init, the supervisor of each
command, and file copies.

It runs with whatever ``python3`` the sandbox has (3.8 or newer), started as
``python3 -I -S inside.py MODE ...``, so it uses the standard library only and
no syntax newer than 3.8. The host copies this file into the runtime's state
directory, which every sandbox sees read-only at ``/run/polar`` (a command in
the sandbox cannot rewrite the supervisor of later commands).

Modes:

``init``
    pid 1 of the sandbox. Reaps orphans. With ``--forward SOCKET`` it listens
    on ``127.0.0.1:<free port>`` and relays each TCP connection to the Unix
    socket SOCKET (the host side of the gateway relay), with backpressure and
    half-closes. With ``--control-fd N`` (the local bubblewrap sandbox) it
    spawns a supervisor for each ``spawn`` request that arrives on that
    SOCK_SEQPACKET socket with three file descriptors (stdin, stdout, stderr),
    reports its exit, and exits when the host closes the socket; as pid 1 its
    exit ends every process of the sandbox. It announces its port on the
    control socket or in the ``--ready`` file.
``exec ID``
    The supervisor of one command. Reads one JSON line ``{"argv", "cwd",
    "env"}`` from stdin, makes itself a child subreaper, and runs the command
    in a new session with stdin closed and this process's stdout/stderr. Every
    descendant of the command stays below the supervisor, even one that
    double-forks and calls ``setsid``, because orphans are re-parented to the
    nearest subreaper. When the command exits, or stdin reaches end-of-file
    (the host's way to cancel), or SIGTERM arrives, the supervisor SIGKILLs
    every process left in its tree, reaps them, and exits with the command's
    status (128 + signal for a signalled command, 127 when it cannot start).
    With ``--inherit-env`` the command's environment starts from the
    supervisor's own (a container image's variables); otherwise it is exactly
    the requested one.
``kill ID``
    Sends SIGTERM to the supervisor of command ID (the fallback of container
    backends whose exec client could not deliver end-of-file).
``copy SOURCE TARGET``
    Copies a file or directory tree (symbolic links kept as links, parents
    created) as the sandbox sees the two paths, so links planted by a command
    resolve inside the sandbox and never on the host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

CHUNK = 65536
PR_SET_CHILD_SUBREAPER = 36
KILL_TREE_LIMIT_S = 10.0
"""How long a supervisor keeps killing a tree that will not die (D-state processes)."""
EXIT_NO_REQUEST = 125
EXIT_CANNOT_START = 127
EXIT_KILLED = 137


# -- byte relays (also used by the host side of the gateway relay) -------------


async def bridge(
    a_reader: asyncio.StreamReader,
    a_writer: asyncio.StreamWriter,
    b_reader: asyncio.StreamReader,
    b_writer: asyncio.StreamWriter,
) -> None:
    """Copy bytes both ways until both directions ended; pass half-closes on.

    A failed direction (a reset peer) aborts both connections, so the other
    direction never waits on a peer that is gone.
    """
    pumps = [
        asyncio.ensure_future(_pump(a_reader, b_writer)),
        asyncio.ensure_future(_pump(b_reader, a_writer)),
    ]
    try:
        pending = set(pumps)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if not all(task.result() for task in done):
                for writer in (a_writer, b_writer):
                    writer.transport.abort()
    finally:
        for task in pumps:
            task.cancel()
        for writer in (a_writer, b_writer):
            writer.close()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Copy one direction; True when it ended with a clean end-of-file."""
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof() and not writer.transport.is_closing():
            writer.write_eof()
    except (ConnectionError, OSError):
        return False
    return True


async def _forward(
    socket_path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        up_reader, up_writer = await asyncio.open_unix_connection(socket_path)
    except OSError:
        writer.close()
        return
    await bridge(reader, writer, up_reader, up_writer)


# -- init ------------------------------------------------------------------------


class _Reaper:
    """Reaps every child of pid 1 and tells whoever waits on a pid its status."""

    def __init__(self) -> None:
        self.waiters: dict[int, Callable[[int], None]] = {}
        self.early: dict[int, int] = {}

    def watch(self, pid: int, callback: Callable[[int], None]) -> None:
        if pid in self.early:
            callback(self.early.pop(pid))
        else:
            self.waiters[pid] = callback

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            callback = self.waiters.pop(pid, None)
            if callback is not None:
                callback(exit_code(status))


class _Broker:
    """The local sandbox's control channel: spawn supervisors, report exits."""

    def __init__(
        self,
        fd: int,
        reaper: _Reaper,
        loop: asyncio.AbstractEventLoop,
        done: asyncio.Future[None],
    ) -> None:
        self.sock = socket.socket(fileno=fd)
        self.sock.setblocking(False)
        self.reaper = reaper
        self.loop = loop
        self.done = done
        self.outbox: deque[bytes] = deque()
        self.supervisors: dict[int, int] = {}
        loop.add_reader(self.sock.fileno(), self._readable)

    def send(self, message: dict[str, Any]) -> None:
        self.outbox.append(json.dumps(message).encode())
        self._flush()

    def _flush(self) -> None:
        while self.outbox:
            try:
                self.sock.send(self.outbox[0])
            except BlockingIOError:
                self.loop.add_writer(self.sock.fileno(), self._flush)
                return
            except OSError:
                self.outbox.clear()
                break
            self.outbox.popleft()
        self.loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(CHUNK, socket.CMSG_SPACE(3 * 4))
            except BlockingIOError:
                return
            except OSError:
                data, ancillary = b"", []
            if not data:
                self.loop.remove_reader(self.sock.fileno())
                if not self.done.done():
                    self.done.set_result(None)
                return
            fds: list[int] = []
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(payload) - len(payload) % 4
                    fds.extend(memoryview(payload)[:usable].cast("i"))
            self._handle(json.loads(data), fds)

    def _handle(self, message: dict[str, Any], fds: list[int]) -> None:
        exec_id = int(message["id"])
        if message["op"] == "spawn":
            self._spawn(exec_id, fds)
        elif message["op"] == "term":
            pid = self.supervisors.get(exec_id)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        for fd in fds:
            os.close(fd)

    def _spawn(self, exec_id: int, fds: list[int]) -> None:
        argv = [sys.executable, "-I", "-S", os.path.abspath(__file__), "exec", str(exec_id)]
        try:
            if len(fds) != 3:
                raise OSError(f"spawn needs three file descriptors, got {len(fds)}")
            actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)]
            pid = os.posix_spawn(sys.executable, argv, {}, file_actions=actions)
        except OSError as exc:
            self.send({"op": "exited", "id": exec_id, "code": EXIT_CANNOT_START, "error": str(exc)})
            return
        self.supervisors[exec_id] = pid
        self.reaper.watch(pid, lambda code: self._exited(exec_id, code))

    def _exited(self, exec_id: int, code: int) -> None:
        self.supervisors.pop(exec_id, None)
        self.send({"op": "exited", "id": exec_id, "code": code})


def _write_ready(path: str, port: int) -> None:
    with open(path + ".part", "w") as handle:
        json.dump({"port": port}, handle)
    os.replace(path + ".part", path)


async def _init(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def finish() -> None:
        if not done.done():
            done.set_result(None)

    reaper = _Reaper()
    loop.add_signal_handler(signal.SIGCHLD, reaper.reap)
    if os.getpid() == 1:
        # As pid 1 the kernel drops the signals without a handler that come from
        # inside the sandbox, so a command's ``kill 1`` cannot end the sandbox;
        # Python's own SIGINT handler must not make an exception of SIGINT.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    else:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(signum, finish)
    port = 0
    if args.forward:
        server = await asyncio.start_server(
            lambda r, w: _forward(args.forward, r, w), "127.0.0.1", 0
        )
        port = server.sockets[0].getsockname()[1]
    if args.control_fd is not None:
        _Broker(args.control_fd, reaper, loop, done).send({"op": "ready", "port": port})
    if args.ready:
        _write_ready(args.ready, port)
    reaper.reap()
    await done


# -- exec (the supervisor) -------------------------------------------------------------


class _Stop(Exception):
    """Raised in the supervisor's main thread to end the command early."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop()


def exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def process_children() -> dict[int, list[int]]:
    """Every process's children (pid -> child pids), from the parent ids in /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        parent = int(stat[stat.rfind(b")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(name))
    return children


def descendants(root: int) -> list[int]:
    """Every process below ``root``, found through the parent ids in /proc."""
    children = process_children()
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def kill_tree() -> None:
    """SIGKILL and reap every descendant of this process (a subreaper), until none is left."""
    deadline = time.monotonic() + KILL_TREE_LIMIT_S
    while True:
        for pid in descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        if time.monotonic() > deadline:
            return
        time.sleep(0.005)


def _watch_stdin() -> None:
    """End-of-file on stdin means the host wants the command gone."""
    with contextlib.suppress(OSError):
        while os.read(0, CHUNK):
            pass
    os.kill(os.getpid(), signal.SIGTERM)


def _started_environ() -> dict[str, str]:
    """The environment this process was started with.

    ``os.environ`` is not: when the locale is C, Python adds ``LC_CTYPE`` at start-up
    (PEP 538), which the command must not inherit. The kernel's copy is the original.
    """
    try:
        with open("/proc/self/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return dict(os.environ)
    env = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            env[os.fsdecode(name)] = os.fsdecode(value)
    return env


def supervise(inherit_env: bool) -> int:
    try:
        request = json.loads(sys.stdin.buffer.readline())
        argv = [str(part) for part in request["argv"]]
        env = _started_environ() if inherit_env else {}
        env.update({str(k): str(v) for k, v in request["env"].items()})
        cwd = str(request["cwd"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return EXIT_NO_REQUEST
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.stderr.write("polar supervisor: cannot become a child subreaper\n")
        return EXIT_CANNOT_START
    killed = False
    code = EXIT_KILLED
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, _raise_stop)
        threading.Thread(target=_watch_stdin, daemon=True).start()
        try:
            child = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, start_new_session=True
            )
        except OSError as exc:
            sys.stderr.write(f"cannot start {argv[0] if argv else repr('')}: {exc}\n")
            return EXIT_CANNOT_START
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == child.pid:
                code = exit_code(status)
                child.returncode = code
                break
    except _Stop:
        killed = True
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        kill_tree()
    return EXIT_KILLED if killed else code


def kill_supervisor(exec_id: str) -> int:
    """SIGTERM the supervisor of command ``exec_id``; 0 when one was found."""
    found = 1
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                argv = handle.read().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        script = [i for i, part in enumerate(argv) if part.endswith(b"inside.py")]
        if (
            script
            and argv[script[0] + 1 : script[0] + 2] == [b"exec"]
            and argv[-1] == exec_id.encode()
        ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(name), signal.SIGTERM)
            found = 0
    return found


# -- copy --------------------------------------------------------------------------


def copy(source: str, target: str) -> int:
    try:
        parent = os.path.dirname(target)
        if parent:
            os.makedirs(parent, exist_ok=True)
        if os.path.isdir(source) and not os.path.islink(source):
            shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target, follow_symlinks=False)
    except (OSError, shutil.Error) as exc:
        sys.stderr.write(f"cannot copy {source} to {target}: {exc}\n")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inside.py")
    modes = parser.add_subparsers(dest="mode", required=True)
    init = modes.add_parser("init")
    init.add_argument("--forward")
    init.add_argument("--control-fd", type=int)
    init.add_argument("--ready")
    run = modes.add_parser("exec")
    run.add_argument("--inherit-env", action="store_true")
    run.add_argument("id")
    kill = modes.add_parser("kill")
    kill.add_argument("id")
    files = modes.add_parser("copy")
    files.add_argument("source")
    files.add_argument("target")
    args = parser.parse_args(argv)
    if args.mode == "init":
        asyncio.run(_init(args))
        return 0
    if args.mode == "exec":
        code = supervise(args.inherit_env)
        # Skip interpreter shutdown: the stdin watcher thread may be blocked in a read.
        sys.stderr.flush()
        os._exit(code)
    if args.mode == "kill":
        return kill_supervisor(args.id)
    return copy(args.source, args.target)


if __name__ == "__main__":
    sys.exit(main())
