"""GRPO's maths as small pure functions: advantages, loss normalisation, the
clipped policy-gradient loss, truncated importance sampling, KL.

The algorithm, for one training step over a batch of groups:

1. **Group.** One submitted task is one group: ``n`` sessions of the same task,
   each scored once by the task's evaluator (the outcome reward ``r_i``).
   Sessions that errored or timed out are not in the group.
2. **Advantage** (:func:`group_advantages`). ``A_i = r_i - b_i`` with the
   baseline ``b_i`` the group mean (``Baseline.MEAN``) or the mean of the
   *other* sessions (``Baseline.LEAVE_ONE_OUT``); optionally divided by the
   group's standard deviation (``scale_by_std``). A group whose rewards are all
   equal has advantage 0 everywhere, whatever the options.
3. **Traces.** A session may have several traces (segments of one
   conversation, sub-agents, calls made under different policy versions). Each
   trace gets the session's advantage, times its chain class's
   ``reward_scale``, on every token its loss mask selects.
4. **Per-token loss** (:func:`clipped_policy_loss`), token ``t`` of a trace
   with advantage ``A``: ``rho_t = pi_theta(y_t) / pi_old(y_t)`` and
   ``l_t = -min(rho_t * A, clip(rho_t, 1 - eps_low, 1 + eps_high) * A)``.
5. **Truncated importance sampling** (:func:`tis_weights`): the rollout
   engine, not ``pi_old``, sampled ``y_t``; ``l_t`` is multiplied by
   ``w_t = min(pi_old(y_t) / pi_rollout(y_t), C)`` (no gradient through
   ``w_t``), with ``pi_rollout`` the logprob the engine recorded.
6. **KL** (optional, :func:`kl_k3`): ``beta * k3(pi_theta, pi_ref)`` per token,
   ``k3 = exp(q - p) - (q - p) - 1`` with ``p``, ``q`` the policy's and the
   reference model's logprobs.
7. **Aggregation** (:func:`trace_weights`): ``TOKEN_MEAN`` (the default)
   averages over every loss token of the batch; ``SESSION_MEAN`` averages each
   session's tokens (all its traces together), then averages sessions. Either
   way a session is one unit: its advantage is computed once and a session
   split into several traces is not counted several times.

Deviations from textbook GRPO (DeepSeekMath, Shao et al. 2024), on purpose:

- **No std scaling by default** (Dr. GRPO, Liu et al. 2025): dividing by the
  group's std up-weights groups that are nearly solved or nearly failed.
  ``scale_by_std`` turns it on; the std is the sample std (n - 1), and a group
  whose std is below ``eps`` gets zeros rather than a blow-up.
- **Token-mean aggregation by default** (DAPO, Yu et al. 2025), not a mean per
  sequence then per group: long answers are not down-weighted per token.
- **Separate low and high clip ranges** (DAPO's clip-higher), 0.2 and 0.28.
- **Two policies behind the ratio.** ``pi_old`` is the trainer's own
  weights at the start of the step (recomputed, so ``rho`` is exactly 1 on
  the first minibatch); the engine that sampled may be up to ``max_staleness``
  versions older and computes in another kernel. That gap is corrected by
  truncated importance sampling (Yao et al. 2025, "Your efficient RL framework
  secretly brings you off-policy RL training") rather than folded into the
  clip.
- **Tokens without a recorded logprob** (``logprob_mask`` 0: the engine
  reported none, or a non-finite one) are trained with ``w_t = 1`` (trusted as
  on-policy) under ``MissingLogprob.TRUST`` (default), or left out of the loss
  and its normalisation under ``MissingLogprob.DROP``. They never enter the
  mismatch statistics.
- **KL off by default** (``beta = 0``); when on, it is in the loss (k3), not
  in the reward.
- **The unit is a session**, not a sequence (step 3 and 7 above).
- **Zero-advantage groups are kept** (not filtered as in DAPO's dynamic
  sampling): they count in the token-mean's normalisation and contribute no
  gradient (the step measures them forward-only, :mod:`polar.train.step`); the
  trainer reports their fraction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# re-exported: the enums are defined apart, free of torch, for the config
from polar.train.variants import Aggregation as Aggregation
from polar.train.variants import Baseline as Baseline
from polar.train.variants import MissingLogprob as MissingLogprob

# ---------------------------------------------------------------- advantages


def group_advantages(
    rewards: Sequence[float],
    *,
    baseline: Baseline = Baseline.MEAN,
    scale_by_std: bool = False,
    eps: float = 1e-6,
) -> list[float]:
    """One advantage per session of a group (see the module docstring, step 2).

    A group of one session has nothing to compare with: advantage 0.
    """
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    if any(not math.isfinite(r) for r in rewards):
        raise ValueError(f"rewards must be finite, got {list(rewards)}")
    total = math.fsum(rewards)
    mean = total / n
    spread = max(rewards) - min(rewards)
    if spread == 0:
        return [0.0] * n
    match baseline:
        case Baseline.MEAN:
            centred = [r - mean for r in rewards]
        case Baseline.LEAVE_ONE_OUT:
            centred = [r - (total - r) / (n - 1) for r in rewards]
    if not scale_by_std:
        return centred
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (n - 1))
    if std < eps:
        return [0.0] * n
    return [a / std for a in centred]


# ---------------------------------------------------------------- normalisation


@dataclass(frozen=True, slots=True)
class TraceShape:
    """What normalisation needs to know of one trace: whose it is, how many loss tokens."""

    session: str
    loss_tokens: int


def trace_weights(traces: Sequence[TraceShape], aggregation: Aggregation) -> list[float]:
    """The factor on each trace's summed token losses so that the batch loss is
    ``sum_trace w_trace * sum_token l_token`` (see the module docstring, step 7).

    Sessions with no loss token count for nothing (they have no gradient to give).
    """
    match aggregation:
        case Aggregation.TOKEN_MEAN:
            total = sum(t.loss_tokens for t in traces)
            return [1.0 / total if total else 0.0 for _ in traces]
        case Aggregation.SESSION_MEAN:
            per_session: dict[str, int] = {}
            for t in traces:
                per_session[t.session] = per_session.get(t.session, 0) + t.loss_tokens
            sessions = sum(1 for n in per_session.values() if n > 0)
            return [
                1.0 / (sessions * per_session[t.session]) if per_session[t.session] else 0.0
                for t in traces
            ]


# ---------------------------------------------------------------- per-token terms
# All tensors below are flat over the batch's loss tokens: shape [N].


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, negated (a loss), per token; and where the clip bit.

    Returns ``(loss [N], clipped [N] bool)``: ``clipped`` marks tokens whose
    gradient the clip removed (the ratio left the trust region in the direction
    the advantage pushes it).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    surrogate = torch.minimum(unclipped, clipped_ratio * advantages)
    was_clipped = (clipped_ratio * advantages < unclipped).detach()
    return -surrogate, was_clipped


def tis_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    rollout_mask: torch.Tensor,
    *,
    cap: float,
) -> torch.Tensor:
    """``min(pi_old / pi_rollout, cap)`` per token, without gradient; 1 where the
    rollout logprob is missing (``rollout_mask`` 0)."""
    with torch.no_grad():
        ratio = torch.exp(old_logprobs.detach() - rollout_logprobs)
        weights = torch.clamp(ratio, max=cap)
        return torch.where(rollout_mask.bool(), weights, torch.ones_like(weights))


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi_theta || pi_ref) per token (>= 0, unbiased)."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


# ---------------------------------------------------------------- statistics


@dataclass(frozen=True, slots=True)
class Mismatch:
    """How far the trainer's logprobs are from the engine's for the same tokens."""

    tokens: int
    mean_abs: float
    max_abs: float
    kl: float
    """k3 estimate of KL(pi_rollout || pi_trainer) over the rollout's own samples."""
    k1: float
    """mean(logprob_rollout - logprob_trainer): the plain (unbiased, noisy) estimate."""


def mismatch(
    trainer_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, rollout_mask: torch.Tensor
) -> Mismatch:
    """Compare logprobs on the tokens that have a recorded one."""
    keep = rollout_mask.bool()
    trainer = trainer_logprobs.detach()[keep].double()
    rollout = rollout_logprobs[keep].double()
    if trainer.numel() == 0:
        return Mismatch(0, 0.0, 0.0, 0.0, 0.0)
    delta = trainer - rollout  # log(pi_trainer / pi_rollout)
    return Mismatch(
        tokens=int(trainer.numel()),
        mean_abs=float(delta.abs().mean()),
        max_abs=float(delta.abs().max()),
        kl=float((torch.exp(delta) - delta - 1.0).mean()),
        k1=float((-delta).mean()),
    )


def summary(values: torch.Tensor) -> dict[str, float]:
    """Mean, min and max of a flat tensor (zeros when empty)."""
    if values.numel() == 0:
        return {"mean": 0.0, "min": 0.0, "max": 0.0}
    v = values.detach().double()
    return {"mean": float(v.mean()), "min": float(v.min()), "max": float(v.max())}
