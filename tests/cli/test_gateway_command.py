"""``polar gateway`` and ``polar records`` as a user runs them (real subprocesses)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from polar.ir import (
    CallError,
    CaptureMode,
    CompletionRecord,
    Dialect,
    ErrorKind,
    Message,
    ReasoningPart,
    RecordStatus,
    Role,
    TextPart,
    Timings,
)
from polar.proxy.engines.vllm_process import free_port
from polar.proxy.store import SessionRow, SqliteStore


def polar(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polar", *args],
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def test_gateway_help_documents_every_option() -> None:
    result = polar("gateway", "--help")
    assert result.returncode == 0
    options = re.findall(r"(--[a-z][a-z0-9-]+)", result.stdout)
    assert {
        "--config",
        "--engine-url",
        "--engine-model",
        "--admin-token",
        "--capture",
        "--store",
    } <= set(options)
    from polar.cli.gateway import gateway

    documented = {p.replace("_", "-") for p in gateway.__annotations__ if p != "return"}
    for name in documented:
        assert f"--{name}" in result.stdout.replace("…", ""), name
    # The read timeout is the wait for the reply to begin; silence after that is idle.
    text = " ".join(result.stdout.split())
    read = text.split("--engine-read-timeout-s")[1].split("--engine-idle-timeout-s")[0]
    assert "reply to begin" in read and "mid-call" not in read, read


def test_bad_config_file_gives_one_line_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "admin_token: 0123456789abcdef0123\n"
        "engine:\n  base_url: http://127.0.0.1:1\n  model: tiny\n  max_attempts: zero\n"
    )
    result = polar("gateway", "--config", str(config))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "engine.max_attempts" in lines[0] and lines[0].startswith("polar gateway: error:")


def test_every_config_error_is_named_at_once_with_the_closest_field(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "admin_token: 0123456789abcdef0123\n"
        "engine: {base_urll: 'http://x:1', model: m}\n"
        "prot: 8000\n"
    )
    result = polar("gateway", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"polar gateway: error: {config}: engine.base_url: field required; "
        "engine.base_urll: unknown field (did you mean base_url?); "
        "prot: unknown field (did you mean port?)"
    )


def test_flags_override_the_file_and_check_prints_the_result(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "admin_token: 0123456789abcdef0123\nengine: {base_url: 'http://x:1', model: m}\nport: 1\n"
    )
    result = polar("gateway", "--config", str(config), "--port", "9123", "--check")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["port"] == 9123 and "admin_token" not in shown


def test_enforce_flags_set_the_sampling_policy_and_a_bad_one_is_named(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "admin_token: 0123456789abcdef0123\nengine: {base_url: 'http://x:1', model: m}\n"
    )
    enforce = ("--enforce-temperature", "0.6", "--enforce-top-p", "0.95", "--enforce-top-k", "20")
    result = polar("gateway", "-c", str(config), *enforce, "--check")
    assert result.returncode == 0, result.stderr
    policy = json.loads(result.stdout)["sampling"]["policy"]
    assert policy == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
    # without them, the harness's settings stand
    assert (
        json.loads(polar("gateway", "-c", str(config), "--check").stdout)["sampling"]["policy"]
        is None
    )

    bad = polar("gateway", "-c", str(config), "--enforce-top-p", "2", "--check")
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "sampling.policy.top_p" in lines[0], bad.stderr


def test_engine_pool_flags_add_engines_and_a_bad_one_is_named(tmp_path: Path) -> None:
    base = ("gateway", "--admin-token", "0123456789abcdef0123", "--engine-model", "m")
    result = polar(
        *base,
        *(
            "--engine-url",
            "http://a:1",
            "--engine-pool",
            "http://b:2",
            "--engine-pool",
            "http://c:3",
        ),
        "--check",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["engine"]["pool"] == ["http://b:2", "http://c:3"]
    result = polar(*base, "--engine-url", "http://a:1", "--engine-pool", "b:2", "--check")
    assert result.returncode == 2
    assert result.stderr.startswith("polar gateway: error: engine.pool")
    assert len(result.stderr.strip().splitlines()) == 1


def test_gateway_serves_from_the_command_line(tmp_path: Path) -> None:
    port = free_port()
    command = [
        sys.executable, "-m", "polar", "gateway",
        "--port", str(port),
        "--admin-token", "0123456789abcdef0123",
        "--engine-url", "http://127.0.0.1:9",
        "--engine-model", "tiny",
        "--store", str(tmp_path / "r.db"),
    ]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            created = httpx.post(
                f"http://127.0.0.1:{port}/admin/sessions",
                headers={"authorization": "Bearer 0123456789abcdef0123"},
                json={},
            )
            assert created.status_code == 201
            assert (tmp_path / "r.db").exists()
        finally:
            proc.terminate()
            proc.wait(10)


def test_records_command_prints_a_sessions_records(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    store = SqliteStore(db)
    store.open()

    async def fill() -> None:
        await store.insert_session(
            SessionRow(id="s1", key_hash="h", created_at=0, closed_at=None, metadata={}, last_seq=0)
        )
        await store.append(
            CompletionRecord(
                session_id="s1", seq=1, attempt=1, status=RecordStatus.COMPLETED,
                dialect=Dialect.OPENAI_CHAT, capture=CaptureMode.ENGINE_RENDERED, engine="vllm",
                model="tiny", policy_version=0, stream=False, original_request={"a": 1},
                engine_request={"b": 2}, timings=Timings(arrived=1.0), prompt_ids=(1, 2, 3),
                output_ids=(4,), output_logprobs=(-0.5,),
            )
        )  # fmt: skip

    asyncio.run(fill())
    store.close()
    result = polar("records", "s1", "--store", str(db), "--format", "jsonl")
    assert result.returncode == 0, result.stderr
    (row,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert row["prompt_ids"] == [1, 2, 3] and row["output_logprobs"] == [-0.5]
    summary = polar("records", "s1", "--store", str(db), "--format", "summary")
    assert "completed" in summary.stdout
    missing = polar("records", "nope", "--store", str(db))
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"polar records: error: no session 'nope' in {db}"
    no_store = polar("records", "s1", "--store", str(tmp_path / "absent.db"))
    assert no_store.returncode == 1 and "no record store here" in no_store.stderr


def test_records_summary_shows_what_an_aborted_call_had_said(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    store = SqliteStore(db)
    store.open()
    partial = Message(
        role=Role.ASSISTANT,
        parts=(ReasoningPart(text="Look first."), TextPart(text="I will run the te")),
    )

    async def fill() -> None:
        await store.insert_session(
            SessionRow(id="s1", key_hash="h", created_at=0, closed_at=None, metadata={}, last_seq=0)
        )
        await store.append(
            CompletionRecord(
                session_id="s1", seq=1, attempt=1, status=RecordStatus.ABORTED,
                dialect=Dialect.OPENAI_CHAT, capture=CaptureMode.TOKEN_IN_TOKEN_OUT,
                engine="vllm", model="tiny", policy_version=0, stream=True,
                original_request={}, engine_request={}, timings=Timings(arrived=1.0),
                prompt_ids=(1, 2), output_ids=(3, 4), output_logprobs=(-0.1, -0.2),
                message=partial,
                error=CallError(
                    kind=ErrorKind.SESSION_ENDED,
                    message="the session's harness ended while the call was in flight",
                ),
            )
        )  # fmt: skip

    asyncio.run(fill())
    store.close()

    summary = polar("records", "s1", "--store", str(db), "--format", "summary")

    assert summary.returncode == 0, summary.stderr
    first, said = summary.stdout.splitlines()
    assert first.startswith("   1.1 aborted")
    assert "error=session_ended: the session's harness ended" in first
    assert said.strip() == 'reasoning="Look first." text="I will run the te"'
