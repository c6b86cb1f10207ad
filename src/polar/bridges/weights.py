"""Pushing a trainer's weights to the engine Polar's gateways sample from.

For trainers that do not sync an inference server themselves (TRL without
vLLM, the usual CPU set-up): before the next rollouts, the bridge writes the
model's weights (:func:`polar.train.weights.save_weights`) and pushes them
with the reference trainer's :class:`polar.train.weightsync.WeightSync`: every
gateway pauses (in-flight calls finish on the old weights; new ones wait), the
embedded engine loads the directory (``POST /weights``), and the gateways
resume with the new ``policy_version``, which every later record carries. On a
failed load the gateways resume on the old version and the failure is raised
as a :class:`BridgeError`. Only the newest pushed directory is kept.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from polar.bridges.rollouts import BridgeError
from polar.causallm import CausalLM
from polar.train.config import GatewayTarget
from polar.train.reload import EmbeddedReload, WeightSyncError
from polar.train.weights import prune_weights, save_weights
from polar.train.weightsync import GatewayAdmin, WeightSync


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BridgeGateway(_Section):
    url: str
    """A node's gateway (its admin routes)."""
    admin_token: str = Field(min_length=16)


class WeightSyncConfig(_Section):
    engine_url: str
    """The embedded engine (``polar engine serve``) the gateways sample from."""
    gateways: list[BridgeGateway] = Field(min_length=1)
    directory: Path = Path("runs/bridge/weights")
    """Where pushed weights are written (the engine reads them from there)."""
    drain_timeout_s: float = Field(default=120.0, gt=0)
    load_timeout_s: float = Field(default=600.0, gt=0)


class WeightPusher:
    def __init__(self, config: WeightSyncConfig) -> None:
        self.config = config
        self.pushed: int | None = None

    def push(self, model: CausalLM, version: int) -> None:
        c = self.config
        sync = WeightSync(
            [
                GatewayAdmin(
                    GatewayTarget.model_validate(g.model_dump()), timeout_s=c.drain_timeout_s + 30
                )
                for g in c.gateways
            ],
            [EmbeddedReload(c.engine_url, api_key=None, timeout_s=c.load_timeout_s)],
            drain_timeout_s=c.drain_timeout_s,
        )
        try:
            sync.push(save_weights(model, c.directory, version), version)
        except WeightSyncError as exc:
            raise BridgeError(f"weight push failed: {exc}") from None
        finally:
            sync.close()
        prune_weights(c.directory, keep=1)
        self.pushed = version
