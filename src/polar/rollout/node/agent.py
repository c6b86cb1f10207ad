"""Running a harness preset inside a session's runtime.

The preset writes its configuration under ``<session_dir>/home`` on the host;
because the session directory is visible inside the runtime at the same path,
the CLI finds it there. The gateway URL is the one the runtime exposes inside
(relayed to the node's gateway), the key is the session's own.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from polar.harness import DEFAULT_PATH, Harness, RunSpec, base_env, install
from polar.runtime.base import ExecResult, Runtime

OUTPUT_TAIL = 4000


@dataclass(frozen=True, slots=True)
class AgentRun:
    harness: str
    exit_code: int
    timed_out: bool
    cancelled: bool
    duration_s: float
    stdout_tail: str
    stderr_tail: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.cancelled

    def last_output(self, lines: int = 6, width: int = 800) -> str:
        """The last non-blank lines of the agent's output, stderr's then stdout's, each
        labelled, on one line (`` | `` between lines): what it said last, not the warning
        it printed first. At most ``width`` characters; empty when it printed nothing."""
        parts = []
        for name, text in (("stderr", self.stderr_tail), ("stdout", self.stdout_tail)):
            kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
            if kept:
                parts.append(f"{name}: " + " | ".join(kept))
        joined = "; ".join(parts)
        return joined if len(joined) <= width else "..." + joined[-(width - 3) :]

    def as_json(self) -> dict[str, object]:
        return {
            "harness": self.harness,
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "cancelled": self.cancelled,
            "duration_s": round(self.duration_s, 3),
            "stdout_tail": self.stdout_tail,
            "stderr_tail": self.stderr_tail,
        }


async def installed_executable(harness: Harness, cache_dir: Path) -> Path | None:
    """The harness's installed command (installed on first use; the installer
    serialises concurrent installs of a package with a file lock)."""
    if harness.package is None:
        return None
    return await asyncio.to_thread(install, harness.package, cache_dir)


async def run_agent(
    harness: Harness,
    runtime: Runtime,
    *,
    executable: Path | None,
    api_key: str,
    model: str,
    instruction: str,
    workdir: str,
    timeout_s: float,
) -> AgentRun:
    """Configure the harness for this session and run it headless, to its end or timeout."""
    gateway_url = runtime.gateway_url
    if gateway_url is None:
        raise ValueError("the runtime has no gateway address")
    home = runtime.session_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    spec = RunSpec(
        gateway_url=gateway_url,
        api_key=api_key,
        model=model,
        instruction=instruction,
        workdir=Path(workdir),
        home=home,
        timeout_s=timeout_s,
        path=DEFAULT_PATH,
    )
    harness.write_config(spec)
    invocation = harness.invocation(spec, executable)
    result: ExecResult = await runtime.exec(
        invocation.argv,
        cwd=workdir,
        env={**base_env(spec), **invocation.env},
        timeout_s=timeout_s,
    )
    logs = runtime.session_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "agent.stdout").write_text(result.stdout)
    (logs / "agent.stderr").write_text(result.stderr)
    return AgentRun(
        harness=harness.name,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        cancelled=result.cancelled,
        duration_s=result.duration_s,
        stdout_tail=result.stdout[-OUTPUT_TAIL:],
        stderr_tail=result.stderr[-OUTPUT_TAIL:],
    )
