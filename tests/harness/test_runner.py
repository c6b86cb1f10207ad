"""run_harness end to end with the ``shell`` preset: config, environment, gateway, result."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polar.harness import InvalidRunSpec, RunSpec, load_harness, run_harness
from polar.ir import RecordStatus

CLIENT = """
import os, sys
from openai import OpenAI
client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
reply = client.chat.completions.create(
    model=os.environ["OPENAI_MODEL"], messages=[{"role": "user", "content": sys.argv[1]}]
)
open("answer.txt", "w").write(reply.choices[0].message.content)
"""


def test_a_shell_harness_reaches_the_gateway_with_the_session_key(
    make_stack: Any, make_spec: Callable[..., RunSpec], tmp_path: Path
) -> None:
    stack = make_stack(
        {"turns": [{"text": "Hello from the policy.", "expect": {"last_text_contains": "greet"}}]}
    )
    session_id, key = stack.new_session()
    client = tmp_path / "client.py"
    client.write_text(CLIENT)
    harness = load_harness("shell", {"command": f"{sys.executable} {client} {{instruction}}"})
    spec = make_spec(gateway_url=stack.url, api_key=key, instruction="Please greet me.")

    run = run_harness(harness, spec, cache_dir=tmp_path / "unused-cache")

    assert run.result.ok, run.result.stderr
    assert (spec.workdir / "answer.txt").read_text().strip() == "Hello from the policy."
    stack.engine.assert_clean()
    (record,) = stack.records(session_id)
    assert record.status is RecordStatus.COMPLETED
    assert record.original_request["model"] == "policy"
    assert not (tmp_path / "unused-cache").exists()


def test_the_harness_sees_its_home_workdir_and_no_inherited_variables(
    make_spec: Callable[..., RunSpec], tmp_path: Path
) -> None:
    harness = load_harness("shell", {"command": "bash -c 'pwd; echo $HOME; env' _ {instruction}"})
    spec = make_spec()
    run = run_harness(harness, spec, cache_dir=tmp_path / "cache")
    lines = run.result.stdout.splitlines()
    assert lines[:2] == [str(spec.workdir), str(spec.home)]
    assert spec.home.is_dir()
    names = {line.split("=", 1)[0] for line in lines[2:] if "=" in line}
    assert "OPENAI_API_KEY" in names and "PYTEST_CURRENT_TEST" not in names
    assert run.invocation.argv[0] == "bash" and run.config_files == ()


def test_a_run_past_its_timeout_is_killed(
    make_spec: Callable[..., RunSpec], tmp_path: Path
) -> None:
    harness = load_harness("shell", {"command": "sleep 60"})
    run = run_harness(harness, make_spec(timeout_s=0.5), cache_dir=tmp_path / "cache")
    assert run.result.timed_out and run.result.duration_s < 10


def test_a_missing_workdir_is_refused_before_anything_runs(
    make_spec: Callable[..., RunSpec], tmp_path: Path
) -> None:
    harness = load_harness("shell", {"command": "true"})
    spec = make_spec(workdir=tmp_path / "nowhere")
    with pytest.raises(InvalidRunSpec, match="does not exist"):
        run_harness(harness, spec, cache_dir=tmp_path / "cache")
    assert not spec.home.exists()
