"""Pushing a trainer's weights to the engine Polar's gateways sample from.

For trainers that do not sync an inference server themselves (TRL without
vLLM, the usual CPU set-up): before the next rollouts, the bridge writes the
model with ``save_pretrained`` (safetensors), pauses every gateway (in-flight
calls finish on the old weights; new ones wait), asks the embedded engine to
load the directory (``POST /weights``), and resumes the gateways with the new
``policy_version``, which every later record carries. The gateways are
resumed even when the load fails, on the old version, and the failure is
raised. Only the newest pushed directory is kept.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field

from polar.bridges.rollouts import BridgeError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GatewayAdmin(_Section):
    url: str
    """A node's gateway (its admin routes)."""
    admin_token: str = Field(min_length=16)


class WeightSyncConfig(_Section):
    engine_url: str
    """The embedded engine (``polar engine serve``) the gateways sample from."""
    gateways: list[GatewayAdmin] = Field(min_length=1)
    directory: Path = Path("runs/bridge/weights")
    """Where pushed weights are written (the engine reads them from there)."""
    drain_timeout_s: float = Field(default=120.0, gt=0)


class SavesPretrained(Protocol):
    def save_pretrained(self, save_directory: str, **kwargs: Any) -> Any: ...


class WeightPusher:
    def __init__(self, config: WeightSyncConfig) -> None:
        self.config = config
        self.pushed: int | None = None

    def push(self, model: SavesPretrained, version: int) -> None:
        c = self.config
        target = c.directory / f"policy-{version}"
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(target), safe_serialization=True)
        timeout = httpx.Timeout(c.drain_timeout_s + 30, connect=10)
        with httpx.Client(timeout=timeout) as http:
            paused: list[GatewayAdmin] = []
            resume_as: int | None = None
            try:
                for gateway in c.gateways:
                    paused.append(gateway)  # a pause that timed out still closed the gate
                    _admin(http, gateway, "pause", {"timeout_s": c.drain_timeout_s})
                reply = http.post(f"{c.engine_url.rstrip('/')}/weights", json={"path": str(target)})
                if reply.status_code != 200:
                    raise BridgeError(
                        f"engine {c.engine_url} refused the weights: {_message(reply)}"
                    )
                resume_as = version
            except httpx.HTTPError as exc:
                raise BridgeError(f"weight push failed: {exc}") from None
            finally:
                for gateway in paused:
                    if resume_as is None:  # already failing: resume what we can, keep that error
                        with contextlib.suppress(BridgeError):
                            _admin(http, gateway, "resume", {})
                    else:
                        _admin(http, gateway, "resume", {"policy_version": resume_as})
        self._drop_older(target)
        self.pushed = version

    def _drop_older(self, keep: Path) -> None:
        for old in self.config.directory.glob("policy-*"):
            if old != keep:
                shutil.rmtree(old, ignore_errors=True)


def _admin(http: httpx.Client, gateway: GatewayAdmin, action: str, body: dict[str, Any]) -> None:
    try:
        reply = http.post(
            f"{gateway.url.rstrip('/')}/admin/{action}",
            json=body,
            headers={"authorization": f"Bearer {gateway.admin_token}"},
        )
    except httpx.HTTPError as exc:
        raise BridgeError(f"gateway {gateway.url}: {action} failed: {exc}") from None
    if reply.status_code != 200:
        raise BridgeError(f"gateway {gateway.url}: {action} failed: {_message(reply)}")


def _message(reply: httpx.Response) -> str:
    try:
        return str(reply.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {reply.status_code}"
