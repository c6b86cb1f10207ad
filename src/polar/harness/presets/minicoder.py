"""minicoder: Polar's own agent for small models (a write-check-revise loop).

The real CLIs need a model that calls tools well; a small instruct model (a
few hundred million parameters) does not, but it writes a fenced ```python
block when asked. This preset runs :mod:`polar.harness.agents.minicoder`: the
instruction and a short system prompt go to the gateway (OpenAI Chat
Completions), the reply's code block is written to :attr:`Config.file`, the
check (by default the task's visible examples, ``python examples.py``, as the
``pyfuncs`` tasks ship them) runs, and a failure goes back to the model as
the next user message, within :attr:`Config.max_turns` calls. Prompts stay at
a few hundred tokens, so an episode fits a CPU engine.

:meth:`Minicoder.write_config` copies the program and its settings into the
run's HOME (the session directory, visible inside the sandbox at the same
path); the program runs with :attr:`Minicoder.python`, by default the Python
running Polar, which ``local`` runtimes share read-only (``share_python``).
How a run ends (exit status, the ``minicoder: ...`` line on stderr) is in the
program's docstring: running out of turns is an ordinary end (exit 0, scored
by the evaluator); a model call that fails is exit 3.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath

from polar.harness.agents.minicoder import Config
from polar.harness.base import Invocation, RunSpec
from polar.harness.configfiles import write_json, write_text
from polar.harness.errors import InvalidHarnessOptions
from polar.ir import Dialect

PROGRAM = "minicoder.py"
SETTINGS = "minicoder.json"


@dataclass(frozen=True, slots=True)
class Minicoder(Config):
    """Options: the program's settings (:class:`~polar.harness.agents.minicoder.Config`:
    ``max_turns``, ``file``, ``check``, ``check_timeout_s``, ``max_tokens``,
    ``temperature`` (None: the engine's default; for GRPO, the trainer's
    ``grpo.temperature``), ``system``, ``call_timeout_s``, ``attempts``) and
    ``python``, the interpreter inside the sandbox (empty: the one running
    Polar; set it for container runtimes, e.g. ``python3``)."""

    python: str = ""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens", "attempts"):
            if getattr(self, name) < 1:
                raise InvalidHarnessOptions(f"minicoder: {name} must be at least 1")
        for name in ("check_timeout_s", "call_timeout_s"):
            if getattr(self, name) <= 0:
                raise InvalidHarnessOptions(f"minicoder: {name} must be positive")
        file = PurePosixPath(self.file)
        if not self.file or file.is_absolute() or ".." in file.parts:
            raise InvalidHarnessOptions(
                f"minicoder: file must be a path inside the workspace, got {self.file!r}"
            )
        try:
            shlex.split(self.check)  # empty: no check, the first code block ends the run
        except ValueError as exc:
            raise InvalidHarnessOptions(f"minicoder: check: {exc}") from None

    @property
    def name(self) -> str:
        return "minicoder"

    @property
    def dialect(self) -> Dialect:
        return Dialect.OPENAI_CHAT

    @property
    def package(self) -> None:
        return None

    def settings(self) -> dict[str, object]:
        """What the program reads from its settings file."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(Config)}

    def write_config(self, spec: RunSpec) -> tuple[Path, ...]:
        program = resources.files("polar.harness.agents").joinpath(PROGRAM).read_text("utf-8")
        return (
            write_text(spec.home / PROGRAM, program),
            write_json(spec.home / SETTINGS, self.settings()),
        )

    def invocation(self, spec: RunSpec, executable: Path | None) -> Invocation:
        return Invocation(
            argv=(
                self.python or sys.executable,
                "-I",
                str(spec.home / PROGRAM),
                "--config",
                str(spec.home / SETTINGS),
                "--",
                spec.instruction,
            ),
            env={
                "OPENAI_BASE_URL": spec.openai_base_url,
                "OPENAI_API_KEY": spec.api_key,
                "OPENAI_MODEL": spec.model,
            },
        )
