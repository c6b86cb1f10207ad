"""``polar gateway`` and ``polar node`` pin glibc's mmap threshold at start-up
(the memory it saves is measured in ``benchmarks/reliability.py``)."""

from __future__ import annotations

import subprocess
import sys


def test_the_threshold_is_pinned_on_glibc() -> None:
    # In a child: the setting is for the whole process, and this one is pytest's.
    code = "from polar.malloctune import pin_mmap_threshold as p; print(p(), p(1 << 20))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]
