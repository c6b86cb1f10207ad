"""Run verl's own ``AgentLoopWorker.generate_sequences`` with Polar's agent loop.

Executed by the verl virtualenv's Python (``scripts/setup --verl``), not by the
test process: ``python verl_worker.py REQUEST.json`` reads the model path, the
bridge config, the prompts and verl's lengths, builds verl's trainer config
from verl's own ``ppo_trainer.yaml`` (Hydra compose, CPU overrides), and writes
the ``DataProto`` verl would train on as JSON next to the request.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any


def main(request_path: str) -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    request = json.loads(Path(request_path).read_text())
    root = Path(request_path).parent

    import numpy as np
    import verl
    from hydra import compose, initialize_config_dir
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto

    loops = root / "agent_loops.yaml"
    loops.write_text(
        json.dumps(
            [
                {
                    "name": "polar",
                    "_target_": "polar.bridges.verl.PolarAgentLoop",
                    "polar_config": request["bridge"],
                }
            ]
        )
    )
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={request['model']}",
                f"actor_rollout_ref.rollout.prompt_length={request['prompt_length']}",
                f"actor_rollout_ref.rollout.response_length={request['response_length']}",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=polar",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
            ],
        )
    worker = AgentLoopWorker(config, llm_client=None)
    prompts: list[Any] = request["prompts"]
    raw_prompt = np.empty(len(prompts), dtype=object)
    raw_prompt[:] = prompts
    batch = DataProto.from_dict(
        tensors={},
        non_tensors={
            "raw_prompt": raw_prompt,
            "index": np.arange(len(prompts)),
        },
        meta_info={"global_steps": 1, "validate": False},
    )
    out = asyncio.run(worker.generate_sequences(batch))
    tensors = {k: v.tolist() for k, v in out.batch.items()}
    non_tensors = {
        k: [x.item() if isinstance(x, np.generic) else x for x in v]
        for k, v in out.non_tensor_batch.items()
        if k == "__num_turns__" or k.startswith("polar")
    }
    (root / "batch.json").write_text(
        json.dumps({"tensors": tensors, "non_tensors": non_tensors}, default=int)
    )


if __name__ == "__main__":
    main(sys.argv[1])
