"""Typed configuration of the rollout server and of a gateway node (read once).

A node embeds a gateway (``gateway:``, the same section ``polar gateway``
reads) and serves it on the gateway's port: harnesses (relayed out of their
sandboxes) reach the model routes there. The node's own API (``/node/...``,
for the rollout server) listens apart, on ``control_host:control_port``, and
wants the control token, which is never optional: the CLI generates one when
none is given (see :mod:`polar.cli.rollout`).

What sessions may do is the node operator's to say: ``limits`` bound every
sandbox (on by default), and ``policy`` says which runtime settings and
plug-ins a submitted task may ask for (by default none that loosen the
sandbox). A task may ask for tighter limits, never looser ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from polar.proxy.config import GatewayConfig
from polar.rollout.protocol import ID_PATTERN, NodeCapacity
from polar.runtime.base import RuntimeSpec


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _token(value: str) -> str:
    if not 16 <= len(value) <= 512 or not all("!" <= char <= "~" for char in value):
        raise ValueError("a control token is 16 to 512 visible ASCII characters")
    return value


ControlToken = Annotated[str, AfterValidator(_token)]
"""Control tokens travel in HTTP headers: visible ASCII only."""


class SandboxLimits(_Section):
    """What every session's sandbox may use (None: unlimited). A session that hits
    one ends ERROR saying which (:mod:`polar.runtime.limits`)."""

    pids: int | None = Field(default=1024, gt=0)
    """Processes and threads."""
    memory_mb: int | None = Field(default=4096, gt=0)
    cpus: float | None = Field(default=None, gt=0)
    """CPU bandwidth (CPUs' worth of time per second)."""
    cpu_time_s: float | None = Field(default=7200.0, gt=0)
    """CPU seconds of the whole sandbox's life (set-up, agent, evaluation)."""
    tmp_mb: int | None = Field(default=1024, gt=0)
    """Size of ``/tmp`` (RAM-backed; counted in ``memory_mb`` too)."""
    workspace_mb: int | None = Field(default=8192, ge=16)
    """Size of the session directory's filesystem (workspace, home, binds)."""


class RuntimePolicy(_Section):
    """Which runtime settings and plug-ins a submitted task may use on this node."""

    allow_unsandboxed: bool = False
    """Tasks may ask for ``runtime.sandbox: false`` (plain host processes)."""
    allow_host_network: bool = False
    """Tasks may ask for ``runtime.network: host``."""
    allow_task_mounts: bool = False
    """Tasks may make host paths visible in their sandbox (``runtime.mounts``)."""
    task_options: tuple[str, ...] = ()
    """Backend options (``runtime.options`` keys) tasks may set."""
    backends: tuple[str, ...] = ()
    """Backends tasks may choose besides the node's own (``docker``, ...)."""
    plugins: tuple[str, ...] = ()
    """``package.module:factory`` names submissions may use (harnesses, evaluators,
    builders, runtimes): loading one runs its code on this host."""


class NodeConfig(_Section):
    node_id: str = Field(default="node-1", pattern=ID_PATTERN)
    public_url: str | None = None
    """How the rollout server reaches this node's API (default: where it listens)."""
    public_gateway_url: str | None = None
    """How trainers reach this node's gateway to push weights (default: where it listens)."""
    server_url: str | None = None
    """Rollout server to join (register, heartbeat, report results); None: standalone."""
    control_token: ControlToken = Field(repr=False)
    """Bearer token of the rollout server's API and of this node's API."""
    control_host: str = "127.0.0.1"
    control_port: int = Field(default=8301, ge=0, le=65535)
    """Where the node's API listens (never on the gateway's port, which sandboxes reach)."""
    gateway: GatewayConfig
    runtime: RuntimeSpec = RuntimeSpec()
    limits: SandboxLimits = SandboxLimits()
    policy: RuntimePolicy = RuntimePolicy()
    capacity: NodeCapacity = NodeCapacity()
    sessions_dir: Path = Path("runs/node/sessions")
    files_dir: Path = Path("runs/node/files")
    """Where tasks' files fetched from the rollout server are unpacked, once per content
    (:mod:`polar.rollout.files`); never inside a sandbox."""
    keep_sessions: Literal["never", "failed", "always"] = "failed"
    harness_cache: Path = Path(".cache/harness")
    """Where the harness CLIs are installed; visible (read-only) inside every runtime."""
    share_python: bool = True
    """Make this node's Python environment visible (read-only) inside ``local``
    runtimes and first on their ``PATH``, so evaluators find ``python -m pytest``."""
    model: str = "policy"
    """The model name harnesses are configured to ask for."""
    prepare_timeout_s: float = Field(default=900.0, gt=0)
    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    result_retry_s: float = Field(default=2.0, gt=0)
    """First wait before re-sending an undelivered result (doubling, capped at a minute)."""

    @model_validator(mode="after")
    def _check(self) -> NodeConfig:
        limited = sorted(LIMIT_FIELDS & self.runtime.model_fields_set)
        if limited:
            raise ValueError(f"set {', '.join(limited)} under limits:, not runtime:")
        if self.runtime.owner is not None:
            raise ValueError("runtime.owner is the node's id; do not set it")
        if self.control_port and self.control_port == self.gateway.port:
            raise ValueError("control_port must differ from gateway.port (sandboxes reach it)")
        if self.gateway.workers != 1:
            raise ValueError(
                "gateway.workers: a node serves its gateway from one process "
                "(several workers are for a standalone 'polar gateway')"
            )
        return self

    @property
    def url(self) -> str:
        return self.public_url or f"http://{self.control_host}:{self.control_port}"


LIMIT_FIELDS = frozenset({"pids", "memory_mb", "cpus", "cpu_time_s", "tmp_mb"})
"""The RuntimeSpec fields that are limits (``workspace_mb`` is the node's own)."""


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8200, ge=0, le=65535)
    db: Path = Path("runs/rollout/rollout.db")
    control_token: ControlToken = Field(repr=False)
    """Bearer token every caller must send (clients and nodes)."""
    node_timeout_s: float = Field(default=30.0, gt=0)
    """A node silent this long is unhealthy; its sessions are lost after twice that."""
    dispatch_interval_s: float = Field(default=0.2, gt=0)
    callback_attempts: int = Field(default=4, ge=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
