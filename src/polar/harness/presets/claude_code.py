"""Anthropic Claude Code, ``claude -p``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from polar.harness.base import Invocation, RunSpec, require_executable
from polar.harness.package import NpmPackage
from polar.harness.presets.node import NODE_VERSION
from polar.ir import Dialect


@dataclass(frozen=True, slots=True)
class ClaudeCode:
    """Claude Code 2.1.331 (runs on the pinned Node.js, see :mod:`.node`):
    speaks the Anthropic **Messages** API.

    It first sends ``HEAD /`` to the base URL, then ``POST /v1/messages?beta=true``
    with ``stream: true``. System block 0 is the text
    ``x-anthropic-billing-header: cc_version=...; cc_entrypoint=sdk-cli;`` whose
    suffix changes with the prompt, then the ~6 k-char system prompt with
    ``cache_control``; ``messages`` carries a ``role: "system"`` item (agent list)
    after the first user message, whose first block is a ``<system-reminder>``.
    Body fields include ``metadata.user_id`` (JSON string with a session id),
    ``max_tokens: 64000``, ``thinking: {type: "adaptive"}``,
    ``context_management`` and ``output_config``; headers ``anthropic-beta``
    (many betas), ``x-api-key``, ``X-Claude-Code-Session-Id``, ``x-app: cli``.
    The shell tool is ``Bash`` (``command`` required; timeout, description,
    run_in_background, dangerouslyDisableSandbox); tool results come back as
    ``tool_result`` blocks with ``cache_control``.

    Configuration is all environment: ``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``,
    ``ANTHROPIC_MODEL`` (and the haiku/sonnet/opus aliases, so any side call
    names the policy model too), ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``
    (no api.anthropic.com lookups, no telemetry or update checks).
    ``--dangerously-skip-permissions`` is refused as root unless
    ``IS_SANDBOX=1``; Polar sandboxes the harness from outside. No login or
    onboarding is needed in ``-p`` mode with an API key.
    """

    @property
    def name(self) -> str:
        return "claude_code"

    @property
    def dialect(self) -> Dialect:
        return Dialect.ANTHROPIC_MESSAGES

    @property
    def package(self) -> NpmPackage:
        return NpmPackage(
            "@anthropic-ai/claude-code",
            "2.1.331",
            bin="claude",
            install_scripts=True,
            node=NODE_VERSION,
        )

    def write_config(self, spec: RunSpec) -> tuple[Path, ...]:
        """Nothing to write: Claude Code is configured through its environment."""
        return ()

    def invocation(self, spec: RunSpec, executable: Path | None) -> Invocation:
        return Invocation(
            argv=(
                require_executable(self.name, executable),
                "-p",
                "--allowedTools",
                "Bash",
                "--dangerously-skip-permissions",
                "--",
                spec.instruction,
            ),
            env={
                "ANTHROPIC_BASE_URL": spec.anthropic_base_url,
                "ANTHROPIC_API_KEY": spec.api_key,
                "ANTHROPIC_MODEL": spec.model,
                "ANTHROPIC_DEFAULT_OPUS_MODEL": spec.model,
                "ANTHROPIC_DEFAULT_SONNET_MODEL": spec.model,
                "ANTHROPIC_DEFAULT_HAIKU_MODEL": spec.model,
                "ANTHROPIC_SMALL_FAST_MODEL": spec.model,
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "IS_SANDBOX": "1",
            },
        )
