"""Qwen Code, ``qwen --yolo``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from polar.harness.base import Invocation, RunSpec, require_executable
from polar.harness.configfiles import write_json
from polar.harness.package import NpmPackage
from polar.harness.presets.node import NODE_VERSION
from polar.ir import Dialect


@dataclass(frozen=True, slots=True)
class QwenCode:
    """Qwen Code 0.24.4 (runs on the pinned Node.js, see :mod:`.node`):
    speaks OpenAI **Chat Completions**.

    Requests stream (``stream_options.include_usage``), ``max_tokens: 8000``, no
    tool_choice or temperature. Messages: a ~26 k-char system prompt, a user
    "setting up the context" message (date, OS, cwd, folder tree), an assistant
    "Got it. Thanks for the context!", then the instruction as a list of text
    parts. The shell tool is ``run_shell_command`` (``command`` required;
    is_background, timeout, description, directory), offered only with
    ``--yolo``. Tool-call arguments come back re-serialized compactly and tool
    results as a list of text parts (``Command: ...\\nOutput: ...\\nExit Code: 0``).

    ``~/.qwen/settings.json`` turns off usage statistics (its RUM telemetry
    host), telemetry, auto-update checks and the managed auto-memory: by default
    a second request follows every answer, a "memory extraction subagent" with
    its own 23 k-char system prompt. ``QWEN_CODE_DISABLE_PRECONNECT=1`` stops a
    ``HEAD`` warm-up request to a provider's default host. The key, base URL and
    model come from ``OPENAI_API_KEY``/``OPENAI_BASE_URL``/``OPENAI_MODEL``.
    The instruction is positional; one starting with ``-`` is passed as
    ``--prompt=...`` (the CLI does not accept ``--``).
    """

    @property
    def name(self) -> str:
        return "qwen_code"

    @property
    def dialect(self) -> Dialect:
        return Dialect.OPENAI_CHAT

    @property
    def package(self) -> NpmPackage:
        return NpmPackage(
            "@qwen-code/qwen-code",
            "0.24.4",
            bin="qwen",
            node=NODE_VERSION,
            executables=("vendor/ripgrep/*/rg",),
        )

    def write_config(self, spec: RunSpec) -> tuple[Path, ...]:
        settings = {
            "general": {"enableAutoUpdate": False},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "memory": {
                "enableManagedAutoMemory": False,
                "enableManagedAutoDream": False,
                "enableAutoSkill": False,
            },
            "security": {"auth": {"selectedType": "openai"}},
            "model": {"name": spec.model},
        }
        return (write_json(spec.home / ".qwen" / "settings.json", settings),)

    def invocation(self, spec: RunSpec, executable: Path | None) -> Invocation:
        prompt = (
            f"--prompt={spec.instruction}" if spec.instruction.startswith("-") else spec.instruction
        )
        return Invocation(
            argv=(
                require_executable(self.name, executable),
                "--auth-type",
                "openai",
                "--yolo",
                prompt,
            ),
            env={
                "OPENAI_BASE_URL": spec.openai_base_url,
                "OPENAI_API_KEY": spec.api_key,
                "OPENAI_MODEL": spec.model,
                "QWEN_CODE_DISABLE_PRECONNECT": "1",
            },
        )
