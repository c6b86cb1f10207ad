"""The local sandbox: one long-lived bubblewrap process per runtime.

**Why an init and a broker.** Commands of one session must share one sandbox
(the agent starts a server, the evaluator's tests talk to it), so the runtime
starts bubblewrap once: new PID, IPC, UTS, network (and, unprivileged, user)
namespaces, all capabilities dropped, ``--die-with-parent``,
``--new-session``, and as its pid 1 Polar's helper (``inside.py init``).
Every command is then spawned *by that init*, on request over a
SOCK_SEQPACKET socket pair the runtime created and bubblewrap inherited: the
request carries the command's stdin, stdout and stderr pipes as file
descriptors, so output flows straight from the command to the host. Entering
the namespaces from the host instead (``nsenter``) would need privileges on
the host and would not inherit bubblewrap's capability drop; a spawned child
of the init inherits all of it. No socket file is reachable from inside the
sandbox, so a command cannot ask the init for anything.

**Killing.** Each command runs under its own supervisor, a subreaper that
kills the command's whole tree (see :mod:`polar.runtime.inside`). Stopping
closes the control socket: the init exits, and as pid 1 of the PID namespace
its exit kills every process left in the sandbox; the bubblewrap process is
SIGKILLed after a grace period if it is still there. A command cannot kill the
init (pid 1 ignores signals from inside its namespace it has no handler for),
and when the Polar process dies the sandbox dies with it.

**Filesystem.** Read-only: the system directories (``/usr`` and the ``/bin``,
``/lib*``, ``/sbin`` links or directories), the ``/etc`` entries programs need
to run (users, hosts, name service switch, TLS certificates, alternatives,
loader cache; no ``resolv.conf``: there is no DNS to ask), the spec's read-only
mounts, the state directory. Read-write: the session directory and the binds
(each backed by ``<session_dir>/binds/<path>``), rw mounts. Fresh: ``/dev``
(bubblewrap's minimal set), ``/proc`` of the new PID namespace (bubblewrap
keeps ``/proc/sys`` and ``/proc/sysrq-trigger`` read-only), a tmpfs ``/tmp`` of
``tmp_mb`` (``/var/tmp`` leads there); the root itself is read-only. Hidden
paths (hidden tests, the package holding the built-in tasks) are covered by an
empty read-only directory where a system directory or mount would show them.
Nothing else of the host exists inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from polar.runtime.base import Mount, NetworkPolicy
from polar.runtime.cgroups import Cgroup
from polar.runtime.commands import Pipes, Supervisor
from polar.runtime.errors import RuntimeFailure, RuntimeStartError
from polar.runtime.limits import children
from polar.runtime.statedir import RW_INSIDE, SCRIPT_INSIDE, SOCKET_INSIDE, STATE_INSIDE, StateDir

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_ENTRIES = (
    "passwd",
    "group",
    "hosts",
    "host.conf",
    "gai.conf",
    "nsswitch.conf",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "mime.types",
    "os-release",
    "bash.bashrc",
    "profile",
    "inputrc",
)
READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0
CHUNK = 65536


def bwrap_argv(
    *,
    bwrap: str,
    python: str,
    session_dir: Path,
    mounts: Sequence[Mount],
    binds: Sequence[tuple[Path, str]],
    state: StateDir,
    network: NetworkPolicy,
    control_fd: int,
    forward: bool,
    unprivileged: bool,
    tmp_mb: int | None = None,
    hidden: Sequence[Path] = (),
    host_root: Path = Path("/"),
) -> list[str]:
    """The bubblewrap command line that starts a sandbox's init.

    ``binds`` are (host backing directory, path inside) pairs; ``hidden`` are
    host paths covered by an empty read-only directory (or ``/dev/null`` for a
    file) wherever a system directory or mount would show them; ``host_root``
    is where the host's system directories are looked up (tests).
    """
    argv = [
        bwrap,
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "polar",
        "--cap-drop",
        "ALL",
        "--clearenv",
        "--setenv",
        "PATH",
        SANDBOX_PATH,
    ]
    if unprivileged:
        argv.append("--unshare-user")
    if network is not NetworkPolicy.HOST:
        argv.append("--unshare-net")
    for name in SYSTEM_DIRS:
        host = host_root / name.lstrip("/")
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), name]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), name]
    for entry in ETC_ENTRIES:
        argv += ["--ro-bind-try", str(host_root / "etc" / entry), f"/etc/{entry}"]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    if tmp_mb is not None:
        argv += ["--size", str(tmp_mb * 2**20)]
    argv += ["--perms", "1777", "--tmpfs", "/tmp", "--symlink", "../tmp", "/var/tmp"]
    # Later mounts go on top of earlier ones: the session directory and mounts
    # may live under /tmp, so they come after the tmpfs.
    argv += ["--bind", str(session_dir), str(session_dir)]
    for mount in mounts:
        kind = "--ro-bind" if mount.read_only else "--bind"
        argv += [kind, str(mount.path), str(mount.path)]
    for backing, path in binds:
        argv += ["--bind", str(backing), path]
    argv += ["--ro-bind", str(state.path), STATE_INSIDE, "--bind", str(state.rw), RW_INSIDE]
    visible = [Path(name) for name in SYSTEM_DIRS] + [mount.path for mount in mounts]
    for hidden_path in hidden:
        if not any(hidden_path == root or hidden_path.is_relative_to(root) for root in visible):
            continue  # not visible anyway
        if hidden_path.is_dir():
            argv += [
                "--perms",
                "0555",
                "--tmpfs",
                str(hidden_path),
                "--remount-ro",
                str(hidden_path),
            ]
        elif hidden_path.exists():
            argv += ["--ro-bind", "/dev/null", str(hidden_path)]
    argv += ["--remount-ro", "/", "--chdir", "/", python, "-I", "-S", SCRIPT_INSIDE, "init"]
    argv += ["--control-fd", str(control_fd)]
    if forward:
        argv += ["--forward", SOCKET_INSIDE]
    return argv


def cgroup_wrapper(cgroup: Cgroup, argv: list[str]) -> list[str]:
    """``argv`` started by a shell that first moves itself into ``cgroup``.

    Joining before bubblewrap runs means that no process of the sandbox is ever
    outside the cgroup (writing bubblewrap's pid after it started would race
    with its first fork).
    """
    script = 'for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; done; '
    script += 'while [ "$1" != -- ]; do shift; done; shift; exec "$@"'
    return ["/bin/sh", "-c", script, "sh", *map(str, cgroup.procs_files), "--", *argv]


class BwrapSandbox:
    """A running bubblewrap init and the host end of its control socket."""

    def __init__(self, process: asyncio.subprocess.Process, control: socket.socket) -> None:
        self._process = process
        self._control = control
        self._loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[int] = self._loop.create_future()
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._closed = False
        self._pending = b""
        self._loop.add_reader(control.fileno(), self._readable)

    @classmethod
    async def start(
        cls, argv_for_fd: Sequence[str], control_fd: int, control: socket.socket, log: Path
    ) -> BwrapSandbox:
        """Start ``argv_for_fd`` (which names ``control_fd``) and wait for the init."""
        with log.open("wb") as log_file:
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv_for_fd,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    pass_fds=(control_fd,),
                    env={"PATH": SANDBOX_PATH},
                )
            except OSError as exc:
                control.close()
                raise RuntimeStartError(
                    f"cannot start {argv_for_fd[0]}: {exc.strerror or exc} "
                    "(install bubblewrap: scripts/setup --sandbox)"
                ) from None
            except BaseException:
                control.close()
                raise
        control.setblocking(False)
        sandbox = cls(process, control)
        exited = asyncio.ensure_future(process.wait())
        try:
            done, _ = await asyncio.wait(
                [sandbox._ready, exited],
                timeout=READY_TIMEOUT_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
        except BaseException:  # cancelled while the sandbox starts: end it, leak nothing
            exited.cancel()
            await asyncio.shield(sandbox.close())
            raise
        if sandbox._ready not in done:
            await sandbox.close()
            reason = _tail(log) or "no output"
            raise RuntimeStartError(f"the bubblewrap sandbox did not start: {reason}")
        return sandbox

    @property
    def port(self) -> int:
        return self._ready.result()

    @property
    def init_pid(self) -> int | None:
        """The host pid of the sandbox's init (bubblewrap's one child), if found."""
        found = children(self._process.pid)
        return found[0] if len(found) == 1 else None

    async def launch(self, number: int) -> Supervisor:
        """Have the init spawn the supervisor of command ``number``."""
        if self._closed:
            raise RuntimeFailure("the sandbox is gone")
        exited: asyncio.Future[int] = self._loop.create_future()
        self._exits[number] = exited
        pipes = Pipes()
        try:
            await self._send({"op": "spawn", "id": number}, pipes.child)
        except BaseException:
            pipes.discard()
            self._exits.pop(number, None)
            raise

        async def force() -> None:
            with contextlib.suppress(RuntimeFailure):
                await self._send({"op": "term", "id": number}, ())

        return await pipes.supervisor(exited, force)

    async def close(self) -> None:
        """End the sandbox: closing the control socket makes the init exit."""
        self._shut()
        try:
            await asyncio.wait_for(self._process.wait(), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
            await self._process.wait()

    async def _send(self, message: dict[str, object], fds: Sequence[int]) -> None:
        data = json.dumps(message).encode()
        while True:
            if self._closed:
                raise RuntimeFailure("the sandbox is gone")
            try:
                socket.send_fds(self._control, [data], list(fds))
                return
            except BlockingIOError:
                writable = self._loop.create_future()
                self._loop.add_writer(self._control.fileno(), writable.set_result, None)
                try:
                    await writable
                finally:
                    self._loop.remove_writer(self._control.fileno())
            except OSError as exc:
                self._shut()
                raise RuntimeFailure(f"the sandbox is gone: {exc}") from None

    def _readable(self) -> None:
        while True:
            try:
                data = self._control.recv(CHUNK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._shut()
                return
            message = json.loads(data)
            if message["op"] == "ready" and not self._ready.done():
                self._ready.set_result(int(message["port"]))
            elif message["op"] == "exited":
                exited = self._exits.pop(int(message["id"]), None)
                if exited is not None and not exited.done():
                    exited.set_result(int(message["code"]))

    def _shut(self) -> None:
        """Forget the control socket; every command still waited on counts as killed."""
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._control.fileno())
        self._control.close()
        for exited in self._exits.values():
            if not exited.done():
                exited.set_result(-1)
        self._exits.clear()


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace").strip()[-2000:]
    except OSError:
        return ""
