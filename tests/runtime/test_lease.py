"""Leases (:mod:`polar.runtime.lease`): held while their process lives, free once it
dies (``kill -9`` included), refused in one line naming the holder meanwhile."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from polar.runtime.lease import Lease, LeaseHeld

HOLD = """
import sys, time
from pathlib import Path
from polar.runtime.lease import Lease
Lease.take(sys.argv[1], "node node-7", directory=Path(sys.argv[2]))
print("held", flush=True)
time.sleep(600)
"""


def test_a_lease_is_held_while_its_process_lives_and_free_once_it_is_killed(
    tmp_path: Path,
) -> None:
    what = "node id node-7"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, what, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(LeaseHeld) as refused:
            Lease.take(what, "node node-7", directory=tmp_path)
        assert str(refused.value) == (
            f"node id node-7 is held by a live process on this machine: "
            f"node node-7 (pid {holder.pid})"
        )
        assert "\n" not in str(refused.value)
        Lease.take("node id node-8", "node node-8", directory=tmp_path).release()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    lease = Lease.take(what, "node node-7", directory=tmp_path)
    assert lease.held
    lease.release()


def test_a_second_lease_in_the_same_process_is_refused_until_the_first_is_released(
    tmp_path: Path,
) -> None:
    first = Lease.take("sessions_dir /srv/s", "node a", directory=tmp_path)
    with pytest.raises(LeaseHeld, match=f"node a \\(pid {os.getpid()}\\)"):
        Lease.take("sessions_dir /srv/s", "node b", directory=tmp_path)
    first.release()
    assert not first.held
    Lease.take("sessions_dir /srv/s", "node b", directory=tmp_path).release()
