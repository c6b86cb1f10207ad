"""The collector tuning a serving process applies after start-up."""

from __future__ import annotations

import subprocess
import sys


def test_tuning_freezes_start_up_objects_and_sets_the_young_threshold() -> None:
    """Run in a child process: the tuning changes the whole process."""
    code = (
        "import gc; from polar.gctune import tune_for_serving; "
        "default = gc.get_threshold(); tune_for_serving(12345); "
        "print(gc.get_freeze_count() > 1000, gc.get_threshold() == (12345, *default[1:]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["True", "True"]
