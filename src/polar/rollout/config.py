"""Typed configuration of the rollout server and of a gateway node (read once).

A node embeds a gateway (``gateway:``, the same section ``polar gateway``
reads) and serves both on one port: harnesses reach the gateway routes, the
rollout server reaches ``/node/...``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from polar.proxy.config import ConfigError, GatewayConfig, describe_error, merge
from polar.rollout.protocol import ID_PATTERN, NodeCapacity
from polar.runtime.base import RuntimeSpec

M = TypeVar("M", bound=BaseModel)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeConfig(_Section):
    node_id: str = Field(default="node-1", pattern=ID_PATTERN)
    public_url: str | None = None
    """How the rollout server reaches this node (default: where its gateway listens)."""
    server_url: str | None = None
    """Rollout server to join (register, heartbeat, report results); None: standalone."""
    control_token: str | None = Field(default=None, min_length=16)
    """Bearer token for the rollout server's API and this node's ``/node`` routes."""
    gateway: GatewayConfig
    runtime: RuntimeSpec = RuntimeSpec()
    capacity: NodeCapacity = NodeCapacity()
    sessions_dir: Path = Path("runs/node/sessions")
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

    @property
    def url(self) -> str:
        return self.public_url or f"http://{self.gateway.host}:{self.gateway.port}"


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8200, ge=0, le=65535)
    db: Path = Path("runs/rollout/rollout.db")
    control_token: str | None = Field(default=None, min_length=16)
    """Bearer token every caller must send (clients and nodes); None: open."""
    node_timeout_s: float = Field(default=30.0, gt=0)
    """A node silent this long is unhealthy; its sessions are lost after twice that."""
    dispatch_interval_s: float = Field(default=0.2, gt=0)
    callback_attempts: int = Field(default=4, ge=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML file's top-level mapping ({} for an empty file); one-line errors."""
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError:
        raise ConfigError(f"{path}: not valid YAML") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return loaded or {}


def load_config(model: type[M], path: Path | None, overrides: dict[str, Any]) -> M:
    """Read a YAML file (if any), apply ``overrides`` (nested dicts), validate once."""
    data = merge(read_yaml(path) if path is not None else {}, overrides)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        prefix = f"{path}: " if path is not None else ""
        raise ConfigError(prefix + describe_error(exc)) from None
