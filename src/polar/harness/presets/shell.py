"""Any command: the escape hatch for agents without a preset."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from polar.harness.base import Invocation, RunSpec
from polar.harness.errors import InvalidHarnessOptions
from polar.ir import Dialect

PLACEHOLDER = "{instruction}"


@dataclass(frozen=True, slots=True)
class Shell:
    """Runs :attr:`command` with ``{instruction}`` replaced by the instruction.

    The command line is split like a POSIX shell would (``shlex``) *before* the
    substitution, and the instruction replaces the placeholder inside single
    arguments, so it is never parsed by a shell: quotes or ``$(...)`` in an
    instruction stay text. To run a shell pipeline, make the shell the command
    (``bash -c '...' _ {instruction}`` and use ``"$1"`` inside).

    The process gets both providers' conventional variables:
    ``OPENAI_BASE_URL`` (gateway + ``/v1``), ``OPENAI_API_KEY``,
    ``OPENAI_MODEL``, ``ANTHROPIC_BASE_URL`` (gateway root),
    ``ANTHROPIC_API_KEY``, ``ANTHROPIC_MODEL``. What it sends depends on the
    command; :attr:`dialect` only records what the caller expects.
    """

    command: str = ""
    dialect: Dialect = Dialect.OPENAI_CHAT

    def __post_init__(self) -> None:
        try:
            words = shlex.split(self.command)
        except ValueError as exc:
            raise InvalidHarnessOptions(f"shell: command: {exc}") from None
        if not words:
            raise InvalidHarnessOptions("shell: needs a command (option command=...)")

    @property
    def name(self) -> str:
        return "shell"

    @property
    def package(self) -> None:
        return None

    def write_config(self, spec: RunSpec) -> tuple[Path, ...]:
        return ()

    def invocation(self, spec: RunSpec, executable: Path | None) -> Invocation:
        argv = tuple(
            word.replace(PLACEHOLDER, spec.instruction) for word in shlex.split(self.command)
        )
        return Invocation(
            argv=argv,
            env={
                "OPENAI_BASE_URL": spec.openai_base_url,
                "OPENAI_API_KEY": spec.api_key,
                "OPENAI_MODEL": spec.model,
                "ANTHROPIC_BASE_URL": spec.anthropic_base_url,
                "ANTHROPIC_API_KEY": spec.api_key,
                "ANTHROPIC_MODEL": spec.model,
            },
        )
