"""How each agent CLI's model runs one shell command, and what ends a run.

Facts about the pinned CLIs, in one place for whatever must speak to them as
their model does: the warm-up that teaches the tiny model each CLI's tool
protocol (:mod:`polar.tinymodel.rehearsal`) and the end-to-end tests.
"""

from __future__ import annotations

from dataclasses import dataclass

MINI_SWE_AGENT_DONE = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@dataclass(frozen=True, slots=True)
class ShellExchange:
    """One CLI's shell tool and how its headless run ends."""

    tool: str
    """The name of the shell tool the CLI offers its model."""
    argument: str = "command"
    """The tool's argument that holds the command line."""
    done_command: str | None = None
    """A run ends only after the model runs this command (mini-swe-agent's marker);
    None: the run ends when the model answers without a tool call."""
    title_prompt: str | None = None
    """Text in the system prompt of a side call the CLI makes before its first
    agent call (opencode's session title), or None."""

    def call(self, command: str) -> dict[str, object]:
        """The tool call that runs ``command``, as a chat tool call object."""
        return {"name": self.tool, "arguments": {self.argument: command}}


SHELL_EXCHANGES: dict[str, ShellExchange] = {
    "codex": ShellExchange("exec_command", argument="cmd"),
    "claude_code": ShellExchange("Bash"),
    "qwen_code": ShellExchange("run_shell_command"),
    "pi": ShellExchange("bash"),
    "opencode": ShellExchange("bash", title_prompt="You are a title generator"),
    "mini_swe_agent": ShellExchange("bash", done_command=MINI_SWE_AGENT_DONE),
    "gemini_cli": ShellExchange("run_shell_command"),
}
"""Every pinned CLI that talks to a model, by preset name."""
