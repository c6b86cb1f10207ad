"""``polar demo``, the README's first command (after ``scripts/setup``), as a user
runs it, made short: the real model (SmolLM2, converted into the project's cache by
set-up), the embedded CPU engine, a rollout server and a gateway node with
sandboxed minicoder sessions scored by the pytest evaluator, one GRPO step with
its weight push, and held-out pass before and after. The full-length demo (four
steps, sixteen held-out tasks) is measured by hand; its figures are in the README."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_demo_trains_the_real_model_through_the_whole_stack(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    short = ["--steps", "1", "--heldout", "2", "--group-size", "2", "--groups-per-step", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "polar", "demo", "--workdir", str(workdir), *short],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    out = done.stdout
    assert done.returncode == 0, (out[-3000:], done.stderr[-3000:])
    for stage in ("[1/5] model", "[2/5] engine", "[3/5] before", "[4/5] GRPO", "[5/5] after"):
        assert stage in out, out
    # Each finished group's rewards, then the step's line with the pushed version.
    assert re.search(r"step 1: pyfuncs/\S+: rewards \[[0-9.]+, [0-9.]+\]", out), out
    assert re.search(r"step 1/1: mean reward [0-9.]+, .*now policy v2", out), out
    assert re.search(r"Held-out pass@1: \d+% before, \d+% after 1 GRPO steps", out), out
    assert "polar dashboard --store" in out and "polar build SESSION" in out, out
    # The records the gateway stored: the held-out sessions and the group's.
    with sqlite3.connect(workdir / "records.db") as db:
        (sessions,) = db.execute("SELECT count(DISTINCT session_id) FROM records").fetchone()
    assert sessions >= 2 + 2 + 2, out
    assert (workdir / "train" / "metrics.jsonl").is_file()
