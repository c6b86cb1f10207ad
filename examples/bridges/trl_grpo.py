"""TRL's GRPOTrainer on Polar's rollouts: the dataset's prompts name Polar tasks.

TRL_EXPERIMENTAL_SILENCE=1 python examples/bridges/trl_grpo.py MODEL_DIR
"""

import sys

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from polar.bridges.trl import polar_reward, rollout_func

trainer = GRPOTrainer(
    model=sys.argv[1],
    args=GRPOConfig(
        output_dir="runs/trl",
        per_device_train_batch_size=4,
        num_generations=4,
        max_steps=10,
        beta=0.0,
        use_cpu=True,
        bf16=False,
    ),
    train_dataset=Dataset.from_dict({"prompt": ["fix-median", "add-top-words"]}),
    rollout_func=rollout_func("examples/bridges/trl-bridge.yaml"),
    reward_funcs=[polar_reward],
)
trainer.train()
