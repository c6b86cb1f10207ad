"""The GRPO variants a training config chooses among (:mod:`polar.train.grpo`
implements them): plain enums, free of torch, so a config is read and checked
before anything heavy loads."""

from __future__ import annotations

from enum import StrEnum


class Baseline(StrEnum):
    MEAN = "mean"
    """The group's mean reward."""
    LEAVE_ONE_OUT = "leave_one_out"
    """The mean reward of the group's other sessions (RLOO)."""


class Aggregation(StrEnum):
    TOKEN_MEAN = "token_mean"
    """Every loss token of the batch weighs the same (default)."""
    SESSION_MEAN = "session_mean"
    """Mean over each session's loss tokens, then mean over sessions."""


class MissingLogprob(StrEnum):
    TRUST = "trust"
    """Train the token with importance weight 1 (default)."""
    DROP = "drop"
    """Leave the token out of the loss and of its normalisation."""
