"""The bridge examples (``examples/bridges``) stay valid: every config file
loads as its bridge reads it, and the trainer-side files point at real names."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from polar.bridges.config import BridgeConfig, read_config
from polar.bridges.nemo_gym import NemoGymBridgeConfig
from polar.bridges.trl import TRLBridgeConfig

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "bridges"


def test_bridge_configs_load() -> None:
    shared = read_config(BridgeConfig, EXAMPLES / "polar-bridge.yaml")
    assert shared.tasks == "builtin" and shared.harness.name == "qwen_code"
    trl = read_config(TRLBridgeConfig, EXAMPLES / "trl-bridge.yaml")
    assert trl.weight_sync is not None and trl.weight_sync.gateways
    gym = read_config(NemoGymBridgeConfig, EXAMPLES / "nemo-gym-bridge.yaml")
    agent = yaml.safe_load((EXAMPLES / "nemo-gym-polar-agent.yaml").read_text())
    server = agent["polar_agent"]["responses_api_agents"]["polar"]
    assert "entrypoint" not in server  # NeMo Gym must not try to start it
    assert (server["host"], server["port"]) == (gym.host, gym.port)


def test_trainer_side_files_name_the_bridges() -> None:
    (loop,) = yaml.safe_load((EXAMPLES / "verl-agent-loops.yaml").read_text())
    assert loop["_target_"] == "polar.bridges.verl.PolarAgentLoop"
    assert (REPO / loop["polar_config"]).is_file()
    slime = yaml.safe_load((EXAMPLES / "slime-custom-config.yaml").read_text())
    read_config(BridgeConfig, REPO / slime["polar_config"])
    script = ast.parse((EXAMPLES / "trl_grpo.py").read_text())
    imported = {
        alias.name
        for node in ast.walk(script)
        if isinstance(node, ast.ImportFrom) and node.module == "polar.bridges.trl"
        for alias in node.names
    }
    assert imported == {"polar_reward", "rollout_func"}
