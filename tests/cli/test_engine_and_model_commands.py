"""``polar model init``, ``polar model smollm2``, ``polar engine serve`` and ``polar engine
scripted`` as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from polar.proxy.engines.vllm_process import free_port


def polar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polar", *args], capture_output=True, text=True, timeout=300
    )


def test_model_init_builds_once_then_keeps(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    first = polar("model", "init", "--out", str(out))
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"built {out}"
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    again = polar("model", "init", "--out", str(out))
    assert again.stdout.strip() == f"kept {out}"


def test_model_smollm2_keeps_a_converted_model(smollm2_dir: Path) -> None:
    result = polar("model", "smollm2", "--out", str(smollm2_dir))

    assert (result.returncode, result.stdout.strip()) == (0, f"kept {smollm2_dir}")


def test_engine_serve_without_a_model_is_a_one_line_error(tmp_path: Path) -> None:
    result = polar("engine", "serve", "--model", str(tmp_path / "nothing"))
    assert result.returncode == 2
    assert result.stderr.strip().startswith("polar engine serve: error: no model in")
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("gpu", "--device: 'gpu' is not a device: use auto, cpu, cuda or cuda:N"),
        ("cuda:0", "device cuda:0: torch sees no CUDA GPU on this machine (use auto or cpu)"),
    ],
)
def test_engine_serve_on_a_device_that_is_not_there_is_a_one_line_error(
    tmp_path: Path, device: str, message: str
) -> None:
    if torch.cuda.is_available() and device != "gpu":
        pytest.skip("this machine has a GPU")
    out = tmp_path / "tiny"
    assert polar("model", "init", "--out", str(out)).returncode == 0
    # a free port: the port is tried before the device (before torch loads)
    port = str(free_port())
    result = polar("engine", "serve", "--model", str(out), "--device", device, "--port", port)
    assert result.returncode == 2
    assert result.stderr.strip() == f"polar engine serve: error: {message}"


def test_engine_serve_serves_completions(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    assert polar("model", "init", "--out", str(out)).returncode == 0
    port = free_port()
    command = [
        sys.executable, "-m", "polar", "engine", "serve",
        "--model", str(out), "--port", str(port), "--served-name", "tiny", "--device", "cpu",
    ]  # fmt: skip
    with subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stderr is not None
            # It says what it loads, then where it listens, once it does.
            # (transformers' own progress bar of the weights comes between)
            said: list[str] = []
            while len(said) < 3:
                line = proc.stderr.readline()
                assert line, said
                said += [line] if line.startswith("polar ") else []
            loading, loaded, ready = said
            assert loading == f"polar engine serve: loading {out} on cpu ...\n", loading
            assert loaded.startswith("polar engine serve: loaded in "), loaded
            assert ready == (
                f"polar engine serve: ready: model 'tiny' at http://127.0.0.1:{port}/v1 "
                "(Ctrl-C stops it)\n"
            ), ready
            assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
            reply = httpx.post(
                f"http://127.0.0.1:{port}/v1/completions",
                json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 3, "logprobs": 0},
                timeout=60,
            ).json()
            assert len(reply["choices"][0]["token_ids"]) == 3
        finally:
            proc.terminate()
            proc.wait(10)


def test_token_mode_with_a_bad_tokenizer_is_a_one_line_error(tmp_path: Path) -> None:
    result = polar(
        "gateway",
        "--admin-token", "0123456789abcdef0123",
        "--capture", "token_in_token_out",
        "--engine-kind", "embedded",
        "--engine-url", "http://127.0.0.1:9",
        "--engine-model", "tiny",
        "--store", str(tmp_path / "r.db"),
        "--render-tokenizer", str(tmp_path / "no-tokenizer"),
    )  # fmt: skip
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("polar gateway: error: render.tokenizer: cannot load a tokenizer")


def test_model_warm_up_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    unknown = polar("model", "warm-up", "--harness", "nope", "--out", str(tmp_path / "o"))
    not_installed = polar(
        "model",
        "warm-up",
        "--harness",
        "pi",
        "--cache",
        str(tmp_path / "empty"),
        "--out",
        str(tmp_path / "o"),
    )
    no_model = polar(
        "model",
        "warm-up",
        "--base",
        str(tmp_path / "nothing"),
        "--cache",
        str(tmp_path / "empty"),
        "--out",
        str(tmp_path / "o"),
    )
    for result, says in (
        (unknown, "unknown harness 'nope'; known: codex, claude_code"),
        (not_installed, "pi is not installed in"),
        (no_model, "is not a model directory"),
    ):
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("polar model warm-up: error: "), result.stderr
        assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_engine_scripted_says_where_it_listens(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("turns:\n  - text: hello\n")
    port = free_port()
    command = [
        sys.executable, "-m", "polar", "engine", "scripted",
        "--script", str(script), "--port", str(port),
    ]  # fmt: skip
    with subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()
            while line and not line.startswith("polar "):
                line = proc.stderr.readline()
            assert line == (
                f"polar engine scripted: ready: model 'scripted' at http://127.0.0.1:{port}/v1\n"
            )
            assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200
        finally:
            proc.terminate()
            proc.wait(10)
