"""OpenAI Codex CLI, ``codex exec``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from polar.harness.base import Invocation, RunSpec, require_executable
from polar.harness.configfiles import toml_document, write_text
from polar.harness.package import NpmPackage
from polar.harness.presets.node import NODE_VERSION
from polar.ir import Dialect

KEY_VARIABLE = "POLAR_API_KEY"
PROVIDER = "polar"


@dataclass(frozen=True, slots=True)
class Codex:
    """Codex CLI 0.169.0: speaks the OpenAI **Responses** API only.

    ``wire_api = "chat"`` is rejected by this version, so the gateway must
    serve ``POST /v1/responses``. Every request streams (``stream: true``,
    ``store: false``) and replays the whole history in ``input``; the 17 k-char
    system prompt is the first input item with role ``developer`` (no
    ``instructions`` field, no ``max_output_tokens``). Tools are Responses-style
    functions (the shell tool is ``exec_command`` with required ``cmd``) plus a
    ``namespace`` entry; ``web_search`` is switched off here. Headers include
    ``session-id``/``thread-id``, ``originator: codex_exec`` and
    ``x-codex-turn-metadata``. With a custom provider codex makes no
    ``GET /models`` call (it warns that model metadata is missing).

    Config (``$CODEX_HOME/config.toml``): a custom provider with
    ``wire_api = "responses"`` whose key comes from :data:`KEY_VARIABLE`;
    ``[analytics] enabled = false`` and ``[features] plugins = false`` stop the
    OTLP metrics and the curated-plugins sync (chatgpt.com, github.com);
    update checks and web search are off. Runs use
    ``-s danger-full-access``: codex's own bubblewrap sandbox breaks when
    CODEX_HOME is under /tmp and a system bwrap exists, and Polar sandboxes
    the whole harness from outside anyway. stdin is closed (otherwise codex
    also reads the prompt from it).
    """

    @property
    def name(self) -> str:
        return "codex"

    @property
    def dialect(self) -> Dialect:
        return Dialect.OPENAI_RESPONSES

    @property
    def package(self) -> NpmPackage:
        return NpmPackage("@openai/codex", "0.169.0", bin="codex", node=NODE_VERSION)

    def codex_home(self, spec: RunSpec) -> Path:
        return spec.home / ".codex"

    def write_config(self, spec: RunSpec) -> tuple[Path, ...]:
        text = toml_document(
            {
                "model": spec.model,
                "model_provider": PROVIDER,
                "check_for_update_on_startup": False,
                "web_search": "disabled",
            },
            {
                f"model_providers.{PROVIDER}": {
                    "name": "Polar gateway",
                    "base_url": spec.openai_base_url,
                    "env_key": KEY_VARIABLE,
                    "wire_api": "responses",
                },
                "analytics": {"enabled": False},
                "features": {"plugins": False},
            },
        )
        return (write_text(self.codex_home(spec) / "config.toml", text),)

    def invocation(self, spec: RunSpec, executable: Path | None) -> Invocation:
        return Invocation(
            argv=(
                require_executable(self.name, executable),
                "exec",
                "--skip-git-repo-check",
                "-s",
                "danger-full-access",
                "--",
                spec.instruction,
            ),
            env={"CODEX_HOME": str(self.codex_home(spec)), KEY_VARIABLE: spec.api_key},
        )
