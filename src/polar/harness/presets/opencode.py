"""opencode, ``opencode run``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from polar.harness.base import Invocation, RunSpec, require_executable
from polar.harness.configfiles import write_json
from polar.harness.package import NpmPackage
from polar.harness.presets.node import NODE_VERSION
from polar.ir import Dialect

KEY_VARIABLE = "POLAR_API_KEY"
PROVIDER = "polar"

OFFLINE_SWITCHES = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
}
"""Without these opencode looks up models.opencode.ai and the npm registry."""


@dataclass(frozen=True, slots=True)
class OpenCode:
    """opencode 1.18.33 (a native binary from an npm optional dependency):
    speaks OpenAI **Chat Completions** through the bundled
    ``@ai-sdk/openai-compatible`` provider.

    Every run starts with a **title-generation side call** (no tools, system
    "You are a title generator...", the instruction as the last user message),
    then the agent calls. All stream (``stream_options.include_usage``),
    ``max_tokens: 32000``, ``tool_choice: "auto"``; the agent system prompt is
    ~9.6 k chars. The instruction arrives wrapped in literal double quotes
    (opencode re-quotes message arguments that contain spaces). The shell tool
    is ``bash`` (``command`` required; timeout in ms, workdir, description); tool
    calls run without a permission prompt in ``run`` mode, and come back with
    arguments re-serialized and ``content: ""``. Headers ``x-session-id`` and
    ``x-session-affinity`` name opencode's session.

    ``~/.config/opencode/opencode.json`` defines the gateway as a provider whose
    key is read from :data:`KEY_VARIABLE`, and uses it as both the main and the
    small (title) model; the ``OPENCODE_DISABLE_*`` switches stop the lookups
    of models.opencode.ai and update checks. One more lookup is not covered by
    any switch: at start opencode installs ``@opencode-ai/plugin`` into every
    config directory in the background (registry.npmjs.org) unless the
    directory has a ``node_modules`` folder and a ``package-lock.json`` whose
    root already lists that package (its ``Npm.install`` check); the preset
    writes those two (and the matching ``package.json``), so nothing is
    fetched. Only typed config-dir plugins would need the real package.

    ``title_call=False`` passes ``--title`` (the first line of the instruction),
    which makes opencode skip the title-generation call.
    """

    title_call: bool = True

    @property
    def name(self) -> str:
        return "opencode"

    @property
    def dialect(self) -> Dialect:
        return Dialect.OPENAI_CHAT

    @property
    def package(self) -> NpmPackage:
        return NpmPackage(
            "opencode-ai", "1.18.33", bin="opencode", install_scripts=True, node=NODE_VERSION
        )

    def write_config(self, spec: RunSpec) -> tuple[Path, ...]:
        config = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Polar gateway",
                    "options": {
                        "baseURL": spec.openai_base_url,
                        "apiKey": f"{{env:{KEY_VARIABLE}}}",
                    },
                    "models": {spec.model: {"name": spec.model}},
                }
            },
            "model": f"{PROVIDER}/{spec.model}",
            "small_model": f"{PROVIDER}/{spec.model}",
            "autoupdate": False,
            "share": "disabled",
        }
        config_dir = spec.home / ".config" / "opencode"
        plugin = {"@opencode-ai/plugin": self.package.version}
        (config_dir / "node_modules").mkdir(parents=True, exist_ok=True)
        return (
            write_json(config_dir / "opencode.json", config),
            write_json(config_dir / "package.json", {"dependencies": plugin}),
            write_json(
                config_dir / "package-lock.json",
                {"lockfileVersion": 3, "packages": {"": {"dependencies": plugin}}},
            ),
        )

    def invocation(self, spec: RunSpec, executable: Path | None) -> Invocation:
        title = () if self.title_call else (f"--title={_title(spec.instruction)}",)
        return Invocation(
            argv=(require_executable(self.name, executable), "run", *title, "--", spec.instruction),
            env={**OFFLINE_SWITCHES, KEY_VARIABLE: spec.api_key},
        )


def _title(instruction: str) -> str:
    lines = instruction.strip().splitlines()
    return (lines[0] if lines else "task")[:50]
