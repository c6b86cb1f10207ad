"""The README's "first RL run", pasted in order as a user would, on the real
model: the embedded engine serving SmolLM2, ``polar serve`` from the README's
YAML, ``polar submit`` of two held-out tasks, ``polar train`` until a step with
a non-zero gradient, and ``polar dashboard`` answering.

Three changes to the README's text, each printed on failure: its ports are
replaced by free ones (a test machine may have those taken), ``steps: 4``
becomes ``steps: 2`` (CI time; two steps, not one, because both groups of a
step can score alike at temperature 1: on CI, one step's eight sessions all
scored 0), and the dashboard, which a user leaves in the
foreground, is started in the background and asked for its training page. The
commands run in a scratch directory where ``.venv`` and ``.cache`` link to the
checkout's (the README's paths are relative to the repository root).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- first-rl-run:"
END = "<!-- /first-rl-run -->"
BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
PORTS = ("8011", "8200", "8300", "8400")


def readme_blocks() -> list[str]:
    text = (PROJECT / "README.md").read_text()
    section = text[text.index(BEGIN) : text.index(END)]
    return BLOCK.findall(section)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def run_to_the_end(script: str, cwd: Path, *, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``bash -c script`` in its own process group. Past ``timeout_s``, every Python
    process of the group prints its threads' stacks (``PYTHONFAULTHANDLER`` and
    SIGABRT) before the group is killed, so the failure says where it was stuck."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    with subprocess.Popen(
        ["bash", "-c", script],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout_s)
            return subprocess.CompletedProcess(process.args, process.returncode, out, err)
        except subprocess.TimeoutExpired:
            for pid in group_members(process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGABRT)
            time.sleep(3)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
    stamp = time.strftime("%H:%M:%S")
    return subprocess.CompletedProcess(
        process.args, -1, out, f"{err}\n[{stamp}] timed out after {timeout_s:g} s"
    )


def group_members(group: int) -> list[int]:
    """The Python processes of process group ``group``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
            if int(fields[2]) == group and b"python" in command:
                members.append(int(entry.name))
    return members


def test_the_readme_section_is_four_blocks_ending_in_the_dashboard() -> None:
    blocks = readme_blocks()
    assert len(blocks) == 4
    assert "polar engine serve" in blocks[0] and "polar serve -c" in blocks[0]
    assert "polar submit" in blocks[1] and "polar train" in blocks[2]
    assert "polar dashboard" in blocks[-1]
    assert "steps: 4" in blocks[2]


@pytest.mark.slow
def test_the_first_rl_run_reaches_a_training_step_with_a_gradient(tmp_path: Path) -> None:
    *commands, dashboard = readme_blocks()
    script = "\n".join(commands).replace("steps: 4", "steps: 2")
    ports = {port: str(free_port()) for port in PORTS}
    dashboard_port = ports["8400"]
    dashboard = dashboard.strip() + f" --port {dashboard_port}"
    for old, new in ports.items():
        script = script.replace(old, new)
        dashboard = dashboard.replace(old, new)
    probe = (
        f'until curl -sf -H "Authorization: Bearer $POLAR_CONTROL_TOKEN" '
        f"http://127.0.0.1:{dashboard_port}/training > runs/first/training.html; "
        "do sleep 1; done"
    )
    whole = "\n".join(
        [
            "set -euo pipefail",
            "trap 'kill $(jobs -p) 2> /dev/null; wait' EXIT",
            script,
            f"{dashboard} > runs/first/dashboard.log 2>&1 &",
            probe,
        ]
    )
    for name in (".venv", ".cache"):
        (tmp_path / name).symlink_to(PROJECT / name)
    done = run_to_the_end(whole, tmp_path, timeout_s=1200)
    first = tmp_path / "runs" / "first"
    logs = {
        name: (first / name).read_text()[-6000:]
        for name in ("engine.log", "serve.log", "dashboard.log")
        if (first / name).is_file()
    }
    context = (whole, done.stdout[-4000:], done.stderr[-4000:], logs)
    print(whole, done.stdout[-8000:], done.stderr[-12000:], sep="\n")  # shown on failure
    assert done.returncode == 0, context
    # polar submit printed both held-out tasks' groups, scored
    assert "pyfuncs/add/k16" in done.stdout and "pyfuncs/count-greater/k1" in done.stdout, context
    steps = [
        json.loads(line)
        for line in (first / "train" / "metrics.jsonl").read_text().splitlines()
        if '"trainer/grad_norm"' in line
    ]
    assert [row["step"] for row in steps] == [1, 2], context
    assert any(row["trainer/grad_norm"] > 0 for row in steps), (steps, context)
    assert [row["push/served_version"] for row in steps] == [2, 3], steps
    assert "reward" in (first / "training.html").read_text().lower()
