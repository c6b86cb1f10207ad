"""A node's configuration: what it refuses."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from polar.rollout.config import NodeConfig


def test_a_node_refuses_several_gateway_workers() -> None:
    """A node drives its gateway in-process (sessions, settling, records), so
    ``--workers N`` is for standalone gateways; the node says so in one line."""
    base = {
        "node_id": "n",
        "server_url": "http://127.0.0.1:1",
        "control_token": "0123456789abcdef0123",
        "gateway": {
            "admin_token": "0123456789abcdef0123",
            "engine": {"base_url": "http://127.0.0.1:2", "model": "m"},
        },
    }
    assert NodeConfig.model_validate(base).gateway.workers == 1
    base["gateway"]["workers"] = 2  # type: ignore[index]
    with pytest.raises(ValidationError, match="a node serves its gateway from one process"):
        NodeConfig.model_validate(base)
