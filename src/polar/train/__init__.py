"""Training: GRPO maths, the reference trainer, weight sync and checkpoints
(the tiny model's warm-up lives in :mod:`polar.tinymodel`)."""
