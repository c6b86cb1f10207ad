"""Training: GRPO maths, the reference trainer, weight sync, checkpoints, and
the format warm-up for the tiny model."""
