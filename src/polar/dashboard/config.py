"""The dashboard's configuration: where its data comes from, where it listens."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from polar.rollout.config import ControlToken


class DashboardConfig(BaseModel):
    """Read once at start (``polar dashboard`` builds it from flags)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    control_token: ControlToken = Field(repr=False)
    """The rollout server's control token: the dashboard uses it to reach the
    server, and asks it of every browser (the login form) and API caller."""
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
