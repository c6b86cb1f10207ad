"""The dashboard's configuration: where its data comes from, where it listens."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from polar.loopback import is_loopback_host
from polar.rollout.config import ControlToken


class DashboardConfig(BaseModel):
    """Read once at start (``polar dashboard`` builds it from flags)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    control_token: ControlToken | None = Field(default=None, repr=False)
    """The rollout server's control token: the dashboard uses it to reach the
    server, and asks it of every browser (the login form) and API caller.
    Needed with a ``server_url``; without one (record stores and logs only) and
    listening on a loopback address, None opens the dashboard to this machine
    without a login, as the files it reads already are."""
    server_url: str | None = None
    """The rollout server (None: no tasks, only the record stores' sessions)."""
    stores: tuple[Path, ...] = ()
    """Gateway record stores (SQLite) to read sessions' calls from, in order."""
    metrics: Path | None = None
    """The trainer's ``metrics.jsonl`` (or its run directory)."""
    sft: Path | None = None
    """An SFT generation's ``stats.json`` (or its output directory)."""
    builder: str = "prefix_merge"
    """How traces are built for the token view (the node's default)."""
    host: str = "127.0.0.1"
    port: int = Field(default=8400, ge=0, le=65535)
    server_timeout_s: float = Field(default=10.0, gt=0)
    trajectory_cache: int = Field(default=16, ge=1)
    """Sessions whose built trajectories are kept in memory."""

    @model_validator(mode="after")
    def _token_where_needed(self) -> DashboardConfig:
        if self.control_token is None and self.server_url is not None:
            raise ValueError("a rollout server needs its control token")
        if self.control_token is None and not is_loopback_host(self.host):
            raise ValueError(f"listening on {self.host} needs a control token")
        return self
