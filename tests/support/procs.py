"""Finding a test's processes on the host, wherever a sandbox put them.

Processes in a sandbox or container have other pids inside, but every one of
them is also a host process, and as root the tests can read its environment.
A test marks a command with a unique environment variable; every descendant
inherits it (also one that ``setsid``s or double-forks), so "no process of
the command survives" is "no host process has the mark".
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

MARK = "POLAR_TEST_TREE"


def new_mark() -> dict[str, str]:
    """An environment that marks a command's process tree."""
    return {MARK: uuid.uuid4().hex}


def marked(env: dict[str, str]) -> list[int]:
    """Host pids of the live (not zombie) processes carrying ``env``'s mark."""
    needle = f"{MARK}={env[MARK]}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state != b"Z":
            found.append(int(entry.name))
    return found


def with_argument(text: str) -> list[int]:
    """Host pids of the processes with ``text`` among their command-line arguments."""
    needle = text.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in argv:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rsplit(b")", 1)[1].split()[0] != b"Z"
