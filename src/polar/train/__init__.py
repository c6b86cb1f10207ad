"""Training: the format warm-up for the tiny model (GRPO and trainer bridges come later)."""
