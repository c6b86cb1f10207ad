"""``scripts/link-identical``: the set-up's disk saver, run as the set-up runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "link-identical"
BIG = 64 * 1024


def _run(*dirs: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, dirs)], capture_output=True, text=True, check=False
    )


def test_equal_files_become_one_inode_and_others_are_left_alone(tmp_path: Path) -> None:
    a, b = tmp_path / "venv-a", tmp_path / "venv-b"
    for root in (a, b):
        (root / "torch").mkdir(parents=True)
    payload = bytes(range(256)) * (BIG // 256 + 1)
    (a / "torch" / "lib.so").write_bytes(payload)
    (b / "torch" / "lib.so").write_bytes(payload)
    (a / "other.so").write_bytes(payload[:-1] + b"x")  # same size, other bytes
    (b / "exec.so").write_bytes(payload)
    (b / "exec.so").chmod(0o755)  # same bytes, other mode
    (a / "small.py").write_bytes(b"x = 1\n")
    (b / "small.py").write_bytes(b"x = 1\n")

    result = _run(a, b)

    assert result.returncode == 0, result.stderr
    assert "1 files now shared" in result.stdout
    assert (a / "torch" / "lib.so").samefile(b / "torch" / "lib.so")
    assert (b / "torch" / "lib.so").read_bytes() == payload
    assert not (a / "other.so").samefile(b / "torch" / "lib.so")
    assert not (b / "exec.so").samefile(a / "torch" / "lib.so")
    assert not (a / "small.py").samefile(b / "small.py")
    assert not list(tmp_path.rglob("*.polar-link"))
    assert "0 files now shared" in _run(a, b).stdout  # idempotent


def test_no_directory_is_a_usage_error(tmp_path: Path) -> None:
    result = _run()
    assert result.returncode == 2
    assert result.stderr.startswith("usage: scripts/link-identical")
    assert _run(tmp_path / "absent").returncode == 0  # a virtualenv not installed is skipped
