"""Google's Gemini CLI, ``gemini -p ... --yolo``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from polar.harness.base import Invocation, RunSpec, require_executable
from polar.harness.configfiles import write_json
from polar.harness.package import NpmPackage
from polar.harness.presets.node import NODE_VERSION
from polar.ir import Dialect


@dataclass(frozen=True, slots=True)
class GeminiCli:
    routing: bool = False
    """Gemini CLI 0.61.0 (runs on the pinned Node.js, see :mod:`.node`):
    speaks the **Gemini API** (``generativelanguage`` v1beta).

    Every agent turn is ``POST /v1beta/models/{model}:streamGenerateContent?alt=sse``
    with the key in ``x-goog-api-key``. The body holds ``contents`` (roles
    ``user``/``model``; parts ``text``, ``functionCall``, ``functionResponse``),
    a ~30 kB ``systemInstruction``, ``tools[0].functionDeclarations`` with
    ``parametersJsonSchema`` and a ``generationConfig`` (temperature 1, topP
    0.95, topK 64, no output limit). Thought parts the model returned are not
    sent back. The shell tool is ``run_shell_command`` (``command`` required;
    description, dir_path, is_background), offered only with ``--yolo`` in a
    trusted folder. A stream that ends without a ``finishReason``, or with no
    text and no function call, is retried by the CLI.

    The model is named (``model.name``), so the CLI routes nothing. With
    ``routing=True`` the model stays the CLI's ``auto``: before each instruction
    the CLI asks a routing classifier (unary ``:generateContent`` naming a Gemini
    Flash-Lite model, a JSON schema ``{complexity_reasoning, complexity_score}``
    in ``responseJsonSchema``) and then names the Gemini model it picked; the
    gateway serves every name from its one engine and records the name asked.

    ``~/.gemini/settings.json`` selects API-key auth (without it the CLI exits
    41), and turns off usage statistics and telemetry (else it looks up a
    logging host), auto-update and its notification. The base URL and key come
    from ``GOOGLE_GEMINI_BASE_URL``/``GEMINI_API_KEY``;
    ``GEMINI_CLI_TRUST_WORKSPACE=true`` trusts the workspace (an untrusted one
    ignores ``--yolo`` and offers no shell tool).
    """

    @property
    def name(self) -> str:
        return "gemini_cli"

    @property
    def dialect(self) -> Dialect:
        return Dialect.GEMINI

    @property
    def package(self) -> NpmPackage:
        return NpmPackage("@google/gemini-cli", "0.61.0", bin="gemini", node=NODE_VERSION)

    def write_config(self, spec: RunSpec) -> tuple[Path, ...]:
        settings = {
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "security": {"auth": {"selectedType": "gemini-api-key"}},
        }
        if not self.routing:
            settings["model"] = {"name": spec.model}
        return (write_json(spec.home / ".gemini" / "settings.json", settings),)

    def invocation(self, spec: RunSpec, executable: Path | None) -> Invocation:
        return Invocation(
            argv=(
                require_executable(self.name, executable),
                "--yolo",
                f"--prompt={spec.instruction}",
            ),
            env={
                "GOOGLE_GEMINI_BASE_URL": spec.root_url,
                "GEMINI_API_KEY": spec.api_key,
                "GEMINI_CLI_TRUST_WORKSPACE": "true",
            },
        )
