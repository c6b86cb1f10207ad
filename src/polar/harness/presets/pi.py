"""pi (``@mariozechner/pi-coding-agent``), ``pi -p``."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from polar.harness.base import Invocation, RunSpec, require_executable
from polar.harness.configfiles import write_json
from polar.harness.errors import InvalidRunSpec
from polar.harness.package import NpmPackage
from polar.harness.presets.node import NODE_VERSION
from polar.ir import Dialect

KEY_VARIABLE = "POLAR_API_KEY"
PROVIDER = "polar"


class PiApi(StrEnum):
    """The provider APIs a pi custom provider can speak (its ``api`` field)."""

    OPENAI_COMPLETIONS = "openai-completions"
    OPENAI_RESPONSES = "openai-responses"
    ANTHROPIC_MESSAGES = "anthropic-messages"


_DIALECTS = {
    PiApi.OPENAI_COMPLETIONS: Dialect.OPENAI_CHAT,
    PiApi.OPENAI_RESPONSES: Dialect.OPENAI_RESPONSES,
    PiApi.ANTHROPIC_MESSAGES: Dialect.ANTHROPIC_MESSAGES,
}


@dataclass(frozen=True, slots=True)
class Pi:
    """pi 0.73.1: a custom provider in ``~/.pi/agent/models.json`` speaking the
    API chosen by :attr:`api` (OpenAI **Chat Completions** by default; Responses
    and Anthropic Messages work too).

    Chat: ``POST /v1/chat/completions``, streaming with
    ``stream_options.include_usage``, ``store: false``, ``max_completion_tokens``
    (the model's ``maxTokens``); a short (~2.3 k-char) system prompt, the
    instruction as a list of text parts, four tools ``read, bash, edit, write``
    each with ``strict: false``. The shell tool is ``bash`` (``command``
    required; timeout). Tool results come back as plain strings, arguments
    re-serialized compactly. Responses: ``POST /v1/responses`` with
    ``prompt_cache_key`` and ``max_output_tokens``, system prompt as a ``system``
    input item. Anthropic: ``POST /v1/messages`` (no ``?beta``).

    ``PI_OFFLINE=1`` (also skips the version check), ``PI_SKIP_VERSION_CHECK=1``
    and ``PI_TELEMETRY=0`` stop every startup network call; pi makes no DNS
    lookups in ``-p`` runs with them. The provider's ``apiKey`` names
    :data:`KEY_VARIABLE`, so the key stays in the environment. pi's parser has
    no ``--``: an instruction starting with ``-`` or ``@`` (a file include)
    cannot be passed on the command line and is refused.
    """

    api: PiApi = PiApi.OPENAI_COMPLETIONS
    max_tokens: int = 4096
    context_window: int = 32768

    @property
    def name(self) -> str:
        return "pi"

    @property
    def dialect(self) -> Dialect:
        return _DIALECTS[self.api]

    @property
    def package(self) -> NpmPackage:
        return NpmPackage("@mariozechner/pi-coding-agent", "0.73.1", bin="pi", node=NODE_VERSION)

    def agent_dir(self, spec: RunSpec) -> Path:
        return spec.home / ".pi" / "agent"

    def write_config(self, spec: RunSpec) -> tuple[Path, ...]:
        provider: dict[str, Any] = {
            "baseUrl": (
                spec.anthropic_base_url
                if self.api is PiApi.ANTHROPIC_MESSAGES
                else spec.openai_base_url
            ),
            "api": self.api.value,
            "apiKey": KEY_VARIABLE,
            "models": [
                {
                    "id": spec.model,
                    "reasoning": False,
                    "contextWindow": self.context_window,
                    "maxTokens": self.max_tokens,
                }
            ],
        }
        if self.api is PiApi.OPENAI_COMPLETIONS:
            provider["compat"] = {"supportsDeveloperRole": False, "supportsReasoningEffort": False}
        models = {"providers": {PROVIDER: provider}}
        return (write_json(self.agent_dir(spec) / "models.json", models),)

    def invocation(self, spec: RunSpec, executable: Path | None) -> Invocation:
        if spec.instruction.startswith(("-", "@")):
            raise InvalidRunSpec(
                "pi cannot take an instruction starting with '-' or '@' on its command line"
            )
        return Invocation(
            argv=(
                require_executable(self.name, executable),
                "-p",
                "--provider",
                PROVIDER,
                "--model",
                spec.model,
                spec.instruction,
            ),
            env={
                "PI_CODING_AGENT_DIR": str(self.agent_dir(spec)),
                "PI_OFFLINE": "1",
                "PI_SKIP_VERSION_CHECK": "1",
                "PI_TELEMETRY": "0",
                KEY_VARIABLE: spec.api_key,
            },
        )
