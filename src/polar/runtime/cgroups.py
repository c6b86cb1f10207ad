"""CPU, memory and process limits for the local sandbox, through cgroups.

A limit on the whole sandbox needs a cgroup: an rlimit is per process
(``RLIMIT_AS`` caps address space, not memory use, and breaks runtimes that
reserve large mappings) or per user (``RLIMIT_NPROC`` counts every process of
that user on the machine). So each sandbox whose spec sets ``cpus``,
``memory_mb`` or ``pids`` gets its own cgroup, created under ``cgroup_root``
(``/sys/fs/cgroup`` unless the spec's options say otherwise, e.g. a subtree
systemd delegated to the user), which the sandbox's first process joins before
it starts bubblewrap, so that everything in the sandbox is counted.

Without ``cgroup_root``, a v1 hierarchy's sandbox cgroup is created below the
Polar process's *own* cgroup in that hierarchy (``/proc/self/cgroup``), so the
sandbox stays inside whatever already limits Polar (a job's memory cgroup) and
its processes stay where the host's supervisor looks for Polar's; a unified
hierarchy's goes under ``/sys/fs/cgroup`` (its own cgroup cannot hold both
processes and children with controllers).

Both layouts work: the unified hierarchy (v2: ``cpu.max``, ``memory.max``,
``memory.swap.max``, ``pids.max``; the controllers must be enabled in the
root's ``cgroup.subtree_control``) and the per-controller v1 hierarchies
(``cpu.cfs_quota_us``, ``memory.limit_in_bytes`` and, where swap accounting is
on, ``memory.memsw.limit_in_bytes``, ``pids.max``). Where the needed
controller cannot be written, the spec is refused with :class:`UnsupportedSpec`
rather than run without its limit.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from polar.runtime.errors import RuntimeStartError, UnsupportedSpec
from polar.runtime.layout import owner_prefix

CPU_PERIOD_US = 100_000
DEFAULT_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True, slots=True)
class Limits:
    cpus: float | None = None
    memory_mb: int | None = None
    pids: int | None = None
    cpu_time_s: float | None = None

    @property
    def any(self) -> bool:
        return any(
            value is not None for value in (self.cpus, self.memory_mb, self.pids, self.cpu_time_s)
        )

    @property
    def controllers(self) -> tuple[str, ...]:
        """The v1 hierarchies the limits need (CPU time is read from ``cpuacct``)."""
        wanted = (
            ("cpu", self.cpus),
            ("cpuacct", self.cpu_time_s),
            ("memory", self.memory_mb),
            ("pids", self.pids),
        )
        return tuple(name for name, value in wanted if value is not None)

    @property
    def unified_controllers(self) -> tuple[str, ...]:
        """The v2 controllers the limits need (``cpu.stat`` is there without one)."""
        return tuple(c for c in self.controllers if c != "cpuacct")


@dataclass(frozen=True, slots=True)
class Usage:
    """What a cgroup's counters say (None: not measured there)."""

    cpu_s: float | None
    oom_kills: int | None
    pids_refused: int | None
    """``fork``/``clone`` calls refused at ``pids.max``."""


@dataclass(frozen=True, slots=True)
class Cgroup:
    """The directories of one sandbox's cgroup: one (v2) or one per controller (v1)."""

    dirs: tuple[Path, ...]
    by_controller: Mapping[str, Path] = field(default_factory=dict)
    """v1: controller -> its directory; v2: empty (every file is in ``dirs[0]``)."""

    @property
    def procs_files(self) -> tuple[Path, ...]:
        return tuple(d / "cgroup.procs" for d in self.dirs)

    def _dir(self, controller: str) -> Path | None:
        if not self.by_controller:
            return self.dirs[0] if self.dirs else None
        return self.by_controller.get(controller)

    def usage(self) -> Usage:
        """The counters the limit watch reads; unreadable ones are None."""
        cpu_s = oom = refused = None
        unified = not self.by_controller
        if (d := self._dir("cpuacct")) is not None:
            if unified:
                usec = _field(d / "cpu.stat", "usage_usec")
                cpu_s = None if usec is None else usec / 1e6
            else:
                nsec = _number(d / "cpuacct.usage")
                cpu_s = None if nsec is None else nsec / 1e9
        if (d := self._dir("memory")) is not None:
            oom = _field(d / ("memory.events" if unified else "memory.oom_control"), "oom_kill")
        if (d := self._dir("pids")) is not None:
            refused = _field(d / "pids.events", "max")
        return Usage(cpu_s, oom, refused)

    def remove(self, wait_s: float = 2.0) -> None:
        """Remove the directories once their last process is gone (best effort)."""
        deadline = time.monotonic() + wait_s
        for directory in self.dirs:
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)


def check(root: Path | None, limits: Limits) -> None:
    """Raise UnsupportedSpec unless cgroups under ``root`` can enforce ``limits``
    (``None``: the default placement, see the module's docstring)."""
    _parents(root, limits)


def create(root: Path | None, limits: Limits, owner: str | None = None) -> Cgroup:
    """A new cgroup under ``root`` with ``limits`` written (not joined yet)."""
    name = f"{owner_prefix(owner)}{uuid.uuid4().hex[:12]}"
    unified, parents = _parents(root, limits)
    dirs = tuple(parent / name for parent in parents)
    by_controller = {} if unified else dict(zip(limits.controllers, dirs, strict=True))
    try:
        for directory in dirs:
            # exist_ok: v1 controllers mounted together (cpu,cpuacct) share a directory
            directory.mkdir(exist_ok=True)
        if unified:
            _write_v2(dirs[0], limits)
        else:
            _write_v1(by_controller, limits)
    except OSError as exc:
        Cgroup(dirs).remove(wait_s=0)
        raise RuntimeStartError(f"cannot set up the sandbox's cgroup: {exc}") from None
    return Cgroup(dirs, by_controller)


def of_process(pid: int) -> Cgroup | None:
    """The cgroup ``pid`` is in (a container's init), for reading its counters."""
    try:
        table = own_cgroups(Path(f"/proc/{pid}/cgroup").read_text())
    except (OSError, ValueError):
        return None
    if (DEFAULT_ROOT / "cgroup.controllers").exists():
        return Cgroup((DEFAULT_ROOT / table.get("", "/").lstrip("/"),))
    by_controller: dict[str, Path] = {
        c: DEFAULT_ROOT / c / table[c].lstrip("/")
        for c in ("cpuacct", "memory", "pids")
        if c in table and (DEFAULT_ROOT / c).is_dir()
    }
    return Cgroup(tuple(by_controller.values()), by_controller)


def leftovers(root: Path | None, owner: str) -> list[Path]:
    """Cgroup directories a sandbox of ``owner`` left (the owner was killed), in
    every place :func:`create` puts them."""
    prefix = owner_prefix(owner)
    parents: list[Path] = []
    if root is not None:
        parents.append(root)
        parents += [root / c for c in ("cpu", "cpuacct", "memory", "pids")]
    else:
        own = _own_cgroups()
        parents.append(DEFAULT_ROOT)
        parents += [DEFAULT_ROOT / c / own.get(c, "/").lstrip("/") for c in own if c]
        parents += [DEFAULT_ROOT / c for c in ("cpu", "cpuacct", "memory", "pids")]
    found: dict[Path, None] = {}
    for parent in parents:
        with contextlib.suppress(OSError):
            found.update((p, None) for p in parent.glob(f"{prefix}*") if p.is_dir())
    return list(found)


def _number(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _field(path: Path, name: str) -> int | None:
    """``name``'s value in a flat-keyed cgroup file (``key value`` per line)."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def own_cgroups(table: str) -> dict[str, str]:
    """Controller -> this process's cgroup path, from a ``/proc/<pid>/cgroup`` table."""
    paths = {}
    for line in table.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


def _own_cgroups() -> dict[str, str]:
    try:
        return own_cgroups(Path("/proc/self/cgroup").read_text())
    except (OSError, ValueError):
        return {}


def _parents(root: Path | None, limits: Limits) -> tuple[bool, tuple[Path, ...]]:
    wanted = limits.controllers
    own = {} if root is not None else _own_cgroups()
    root = DEFAULT_ROOT if root is None else root
    if (root / "cgroup.controllers").exists():
        wanted = limits.unified_controllers
        try:
            enabled = (root / "cgroup.subtree_control").read_text().split()
        except OSError:
            enabled = []
        missing = [c for c in wanted if c not in enabled]
        if missing or not os.access(root, os.W_OK):
            raise UnsupportedSpec(
                f"local sandbox: the limits need the cgroup controllers {', '.join(wanted)} "
                f"enabled and writable under {root} (missing: {', '.join(missing) or 'write'}); "
                "set options.cgroup_root to a delegated cgroup or drop the limits"
            )
        return True, (root,)
    parents = tuple(root / c / own.get(c, "/").lstrip("/") for c in wanted)
    unusable = [str(p) for p in parents if not p.is_dir() or not os.access(p, os.W_OK)]
    if unusable:
        raise UnsupportedSpec(
            f"local sandbox: the limits need writable cgroup hierarchies at {', '.join(unusable)}; "
            "set options.cgroup_root to a delegated cgroup or drop the limits"
        )
    return False, parents


def _write_v2(directory: Path, limits: Limits) -> None:
    if limits.cpus is not None:
        (directory / "cpu.max").write_text(f"{_quota(limits.cpus)} {CPU_PERIOD_US}")
    if limits.memory_mb is not None:
        (directory / "memory.max").write_text(str(limits.memory_mb * 2**20))
        swap = directory / "memory.swap.max"
        if swap.exists():
            swap.write_text("0")
    if limits.pids is not None:
        (directory / "pids.max").write_text(str(limits.pids))


def _write_v1(dirs: dict[str, Path], limits: Limits) -> None:
    if limits.cpus is not None:
        (dirs["cpu"] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(_quota(limits.cpus)))
    if limits.memory_mb is not None:
        size = str(limits.memory_mb * 2**20)
        (dirs["memory"] / "memory.limit_in_bytes").write_text(size)
        with_swap = dirs["memory"] / "memory.memsw.limit_in_bytes"
        if with_swap.exists():
            with_swap.write_text(size)
    if limits.pids is not None:
        (dirs["pids"] / "pids.max").write_text(str(limits.pids))


def _quota(cpus: float) -> int:
    return max(1000, round(cpus * CPU_PERIOD_US))
