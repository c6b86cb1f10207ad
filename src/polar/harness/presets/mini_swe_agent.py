"""mini-swe-agent, ``mini --yolo``.

What its source (2.4.6) says, read from the installed package:

* ``mini`` (``minisweagent.run.mini``) builds its configuration by recursively
  merging ``-c`` specs: config files (a bare name such as ``mini.yaml`` is
  looked up among the built-in configs) and ``key=value`` pairs. Passing any
  ``-c`` drops the default, so the preset passes ``-c mini.yaml`` first and its
  own file second.
* ``mini.yaml`` uses the ``litellm`` model class (``LitellmModel``): the model
  must answer with **tool calls** to a single tool ``bash`` whose arguments are
  ``{"command": ...}`` (``actions_toolcall.BASH_TOOL``); an answer without a
  tool call is a format error that is sent back as a user message. (The
  ``*_textbased`` configs instead parse a fenced ``mswea_bash_command`` block
  from plain text.) Tool results go back as ``role: "tool"`` messages holding
  ``{"returncode": ..., "output": ...}`` rendered by a Jinja template.
* The run ends when a command's output starts with the line
  ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (the model is told to run
  ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``); with ``--exit-immediately``
  it does not ask for confirmation. Other exits: step/cost limits, three format
  errors in a row.
* ``litellm.completion`` is called **without streaming** against
  ``model_kwargs.api_base`` (an ``openai/<name>`` model goes through the
  OpenAI SDK to ``POST {api_base}/chat/completions``); the key comes from
  ``OPENAI_API_KEY``. Failed calls are retried up to 10 times with exponential
  backoff (4-60 s).
* litellm 1.110.2 imports its MCP handler (and so the ``mcp`` package, an
  optional extra) on every ``completion`` call that has tools; without it each
  call fails with ``No module named 'mcp'`` and is retried until the run times
  out. The preset therefore installs ``litellm[mcp]``.
* Offline switches: ``MSWEA_CONFIGURED=true`` skips the interactive
  first-run setup (it would prompt for a model and key);
  ``MSWEA_SILENT_STARTUP=1`` drops the banner; ``cost_tracking:
  ignore_errors`` keeps an unknown model from failing every call (litellm
  cannot price it); ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (and
  ``LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS=True``) stop litellm from fetching its
  cost map (and beta-header list) from GitHub at import. The global config dir
  (``MSWEA_GLOBAL_CONFIG_DIR``, with its ``.env`` file) lives in the run's HOME.
* Commands run with ``subprocess`` in a fresh ``bash`` per action, in the
  working directory, with a per-command timeout (``environment.timeout``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from polar.harness.base import Invocation, RunSpec, require_executable
from polar.harness.configfiles import write_json
from polar.harness.package import PythonPackage
from polar.ir import Dialect


@dataclass(frozen=True, slots=True)
class MiniSweAgent:
    """mini-swe-agent 2.4.6 (litellm 1.110.2): speaks OpenAI **Chat Completions**,
    without streaming.

    Each request: ``model`` (the name after ``openai/``), ``messages`` (system
    "You are a helpful assistant that can interact with a computer.", the
    instruction inside a long instance template), ``tools`` with the single
    ``bash`` tool (``command`` required). No side calls. See the module
    docstring for what the source says about ending a run and going offline.
    """

    step_limit: int = 0
    """Most model calls in a run (0: no limit; Polar's timeout still applies)."""
    command_timeout_s: int = 60
    """Limit on each shell command the agent runs."""

    @property
    def name(self) -> str:
        return "mini_swe_agent"

    @property
    def dialect(self) -> Dialect:
        return Dialect.OPENAI_CHAT

    @property
    def package(self) -> PythonPackage:
        return PythonPackage(
            "mini-swe-agent", "2.4.6", bin="mini", requirements=("litellm[mcp]==1.110.2",)
        )

    def config_dir(self, spec: RunSpec) -> Path:
        return spec.home / ".config" / "mini-swe-agent"

    def config_file(self, spec: RunSpec) -> Path:
        return self.config_dir(spec) / "polar.yaml"

    def write_config(self, spec: RunSpec) -> tuple[Path, ...]:
        # JSON is YAML; mini only wants the .yaml suffix.
        config = {
            "agent": {"step_limit": self.step_limit, "cost_limit": 0},
            "environment": {"environment_class": "local", "timeout": self.command_timeout_s},
            "model": {
                "model_class": "litellm",
                "model_name": f"openai/{spec.model}",
                "cost_tracking": "ignore_errors",
                "model_kwargs": {"api_base": spec.openai_base_url, "drop_params": True},
            },
        }
        return (write_json(self.config_file(spec), config),)

    def invocation(self, spec: RunSpec, executable: Path | None) -> Invocation:
        return Invocation(
            argv=(
                require_executable(self.name, executable),
                "--yolo",
                "--exit-immediately",
                "-c",
                "mini.yaml",
                "-c",
                str(self.config_file(spec)),
                f"--task={spec.instruction}",
            ),
            env={
                "OPENAI_API_KEY": spec.api_key,
                "MSWEA_CONFIGURED": "true",
                "MSWEA_SILENT_STARTUP": "1",
                "MSWEA_GLOBAL_CONFIG_DIR": str(self.config_dir(spec)),
                "MSWEA_COST_TRACKING": "ignore_errors",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
            },
        )
