"""``polar demo``, the README's first command (after ``scripts/setup``), as a user
runs it: the tiny model built and taught the tool-call format in the project's
cache, the embedded CPU engine, the gateway in token-in/token-out mode, a real
two-turn tool exchange on sampled tokens, and the records printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_demo_runs_a_tool_exchange_on_the_embedded_engine(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "polar", "demo", "--workdir", str(tmp_path / "demo")],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=1200,
        stdin=subprocess.DEVNULL,
    )
    out = done.stdout
    assert done.returncode == 0, (out[-3000:], done.stderr[-3000:])
    assert "turn 1: it called bash" in out, out
    assert "[6/6] 2 record(s) stored" in out, out
    assert "prompt extends call 1 (raw sampled ids spliced in)" in out, out
    assert "call 2's prompt = call 1's prompt + its sampled ids" in out, out
    assert out.rstrip().endswith(": True"), out[-500:]
    assert list((tmp_path / "demo").glob("records-*.db")), "records are kept in --workdir"
