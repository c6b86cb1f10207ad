"""One GRPO training step over prepared rows: old logprobs, loss, backward,
optimizer step(s), and the step's statistics.

The rows of a step are split into ``minibatches`` (whole sessions each); each
minibatch is one optimizer step, accumulated over microbatches. ``pi_old`` is
the model at the start of the step: with one minibatch it is the current
forward pass detached (no extra pass); with more it is computed first, without
gradients, for every microbatch.

Every logprob (``pi_theta``, ``pi_old``, the reference model's) is of the
distribution each token was sampled from (:mod:`polar.train.logprobs`), the
one the engine's recorded logprob is of. A sampled token outside the support
of the trainer's own distribution gets no weight and is counted
(``trainer/outside_support_tokens``).

Precision (:mod:`polar.precision`): the model's weights and the optimizer's
state are float32; ``StepSettings.precision`` decides the forward passes'
compute (``bfloat16``: under autocast), and backward and the optimizer step run
outside it.

Device: the step runs where the model's parameters are; every tensor of every
microbatch is moved there (:meth:`polar.train.batch.MicroBatch.to`) before the
first forward pass.

Rows that cannot move the weights (advantage 0 and no KL term: every token's
loss and its gradient are exactly 0) get no backward pass: they are measured
forward-only at the start of the step (mismatch, importance weights, support;
ratio 1), which is what their statistics are of, and the gradient is the one
the full pass gives. A minibatch with no other row keeps them (its optimizer
step then still runs on zero gradients, as before). A forward pass without
gradients costs about a third of a forward and backward one; where half the
groups of a small model score alike, as on this CPU, that is about a third of
the trainer's time (``trainer/forward_only_tokens`` counts them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from polar.causallm import CausalLM
from polar.precision import Precision, autocast, device_of
from polar.train.batch import MicroBatch, Row, microbatches, reweighted, split_by_session
from polar.train.grpo import (
    Aggregation,
    clipped_policy_loss,
    kl_k3,
    mismatch,
    tis_weights,
)
from polar.train.logprobs import TokenLogprobs, token_logprobs


@dataclass(frozen=True, slots=True)
class LossSettings:
    clip_low: float = 0.2
    clip_high: float = 0.28
    tis_cap: float = 2.0
    kl_coef: float = 0.0
    aggregation: Aggregation = Aggregation.TOKEN_MEAN


@dataclass(frozen=True, slots=True)
class StepSettings:
    minibatches: int = 1
    micro_batch_tokens: int = 16384
    max_grad_norm: float = 1.0
    logprob_chunk: int = 512
    pad_id: int = 0
    precision: Precision = Precision.FLOAT32
    """Forward passes under :func:`polar.precision.autocast`; the model's weights
    (and so the optimizer's state) are float32 whatever this is."""
    packed: bool = False
    """Traces end to end in each microbatch row, no padding
    (:func:`polar.train.batch.microbatches`)."""


class _Totals:
    """Sums, minima and maxima over loss tokens, kept on the model's device and
    read once at the end of the step (:meth:`read`): reading a GPU value makes
    the host wait for the GPU, and once per statistic per microbatch adds up."""

    def __init__(self) -> None:
        self._stats: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.sums: dict[str, float] = {}
        self.mins: dict[str, float] = {}
        self.maxs: dict[str, float] = {}
        self.logprobs_old: list[torch.Tensor] = []
        self.logprobs_rollout: list[torch.Tensor] = []
        self.rollout_masks: list[torch.Tensor] = []
        self.versions: list[torch.Tensor] = []
        self._outside: list[torch.Tensor] = []
        self.outside = 0
        self.tokens = 0
        self.loss_tokens = 0

    def took(self, mb: MicroBatch, old_logprobs: torch.Tensor) -> None:
        """Count a microbatch that went through the step (``mb`` with its
        outside-support tokens already unweighted)."""
        self.tokens += mb.tokens
        self.loss_tokens += int(mb.targets.numel())
        self.logprobs_old.append(old_logprobs.detach())
        self.logprobs_rollout.append(mb.rollout_logprobs)
        self.rollout_masks.append(mb.rollout_mask)
        self.versions.append(mb.versions)

    def add(self, name: str, values: torch.Tensor, where: torch.Tensor | None = None) -> None:
        """Count ``values`` (only those ``where`` is true, when given)."""
        if values.numel() == 0:
            return
        v = values.detach().double()
        keep = torch.ones_like(v, dtype=torch.bool) if where is None else where
        stats = (
            torch.where(keep, v, 0.0).sum(),
            torch.where(keep, v, math.inf).min(),
            torch.where(keep, v, -math.inf).max(),
        )
        if name in self._stats:
            total, low, high = self._stats[name]
            stats = (total + stats[0], torch.minimum(low, stats[1]), torch.maximum(high, stats[2]))
        self._stats[name] = stats

    def count_outside(self, outside: torch.Tensor) -> None:
        self._outside.append(outside.sum())

    def read(self) -> None:
        """Every statistic to the host at once; a minimum or maximum over nothing
        is left out."""
        names = list(self._stats)
        flat = [t for name in names for t in self._stats[name]]
        values = (
            torch.stack([*flat, torch.stack(self._outside).sum()]).tolist()
            if flat or self._outside
            else []
        )
        for i, name in enumerate(names):
            total, low, high = values[3 * i : 3 * i + 3]
            self.sums[name] = total
            if math.isfinite(low):
                self.mins[name] = low
                self.maxs[name] = high
        self.outside = int(values[-1]) if self._outside else 0


def train_step(
    model: CausalLM,
    optimizer: torch.optim.Optimizer,
    rows: Sequence[Row],
    *,
    loss: LossSettings,
    settings: StepSettings,
    policy_version: int,
    ref_model: CausalLM | None = None,
    scheduler: Any | None = None,
) -> dict[str, float]:
    """Train on ``rows`` (already weighted for one optimizer step); returns metrics.

    ``policy_version`` is the version of the weights at the start of the step:
    tokens the rollout sampled with exactly these weights are reported apart
    (``mismatch_onpolicy/*``: the trainer/engine numerical gap alone).
    """
    start = time.perf_counter()
    model.train()
    parts = split_by_session(rows, settings.minibatches)
    if len(parts) > 1:
        parts = [reweighted(part, loss.aggregation) for part in parts]
    device = device_of(model)
    parts, idle = _set_aside_idle(parts, learns_at_zero=ref_model is not None and loss.kl_coef > 0)

    def batched(rows: Sequence[Row]) -> list[MicroBatch]:  # on the model's device
        return [
            mb.to(device)
            for mb in microbatches(
                rows,
                max_tokens=settings.micro_batch_tokens,
                pad_id=settings.pad_id,
                packed=settings.packed,
            )
        ]

    packed = [batched(part) for part in parts]
    totals = _Totals()
    with torch.no_grad(), autocast(settings.precision, device):
        for mb in batched(idle) if idle else []:
            _forward(model, mb, None, settings, loss, totals, ref_model)
    forward_only = totals.tokens
    old: list[list[torch.Tensor | None]] = [[None] * len(mbs) for mbs in packed]
    if len(packed) > 1:
        with torch.no_grad(), autocast(settings.precision, device):
            for i, mbs in enumerate(packed):
                for j, mb in enumerate(mbs):
                    old[i][j] = _logprobs(model, mb, settings).values
    grad_norms = []
    for i, mbs in enumerate(packed):
        optimizer.zero_grad(set_to_none=True)
        for j, mb in enumerate(mbs):
            with autocast(settings.precision, device):  # the forward pass and the loss
                objective = _forward(model, mb, old[i][j], settings, loss, totals, ref_model)
            torch.autograd.backward(objective)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        grad_norms.append(float(norm))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    model.train(False)
    totals.read()
    elapsed = time.perf_counter() - start
    out = _metrics(totals, grad_norms, elapsed, len(rows), policy_version)
    out["trainer/forward_only_tokens"] = float(forward_only)
    return out


def _forward(
    model: CausalLM,
    mb: MicroBatch,
    old: torch.Tensor | None,
    settings: StepSettings,
    loss: LossSettings,
    totals: _Totals,
    ref_model: CausalLM | None,
) -> torch.Tensor:
    """One microbatch's forward pass and objective, counted in ``totals``;
    ``old`` is ``pi_old``'s logprobs when computed apart (else this pass's,
    detached)."""
    logprobs, outside = _logprobs(model, mb, settings)  # [N], [N]
    # Sampled, but outside the support the trainer's logits give: no weight.
    mb = replace(
        mb,
        weights=torch.where(outside, 0.0, mb.weights),
        rollout_mask=mb.rollout_mask & ~outside,
    )
    totals.count_outside(outside)
    old_lp = logprobs.detach() if old is None else old
    objective = _objective(model, mb, logprobs, old_lp, loss, totals, ref_model)
    totals.took(mb, old_lp)
    return objective


def _set_aside_idle(
    parts: list[list[Row]], *, learns_at_zero: bool
) -> tuple[list[list[Row]], list[Row]]:
    """Each minibatch without its rows of advantage 0, and those rows (see the
    module docstring); none when a KL term gives them a gradient, and a
    minibatch that has no other row keeps its own."""
    if learns_at_zero:
        return parts, []
    kept: list[list[Row]] = []
    idle: list[Row] = []
    for part in parts:
        moving = [row for row in part if row.advantage != 0.0]
        if moving:
            kept.append(moving)
            idle.extend(row for row in part if row.advantage == 0.0)
        else:
            kept.append(part)
    return kept, idle


def _logprobs(model: CausalLM, mb: MicroBatch, settings: StepSettings) -> TokenLogprobs:
    return token_logprobs(model, mb, chunk=settings.logprob_chunk)


def _objective(
    model: CausalLM,
    mb: MicroBatch,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    loss: LossSettings,
    totals: _Totals,
    ref_model: CausalLM | None,
) -> torch.Tensor:
    """``sum_t weight_t * (tis_t * pg_t + beta * kl_t)`` over the microbatch's loss tokens."""
    pg, clipped = clipped_policy_loss(
        logprobs,
        old_logprobs,
        mb.advantages,
        clip_low=loss.clip_low,
        clip_high=loss.clip_high,
    )
    tis = tis_weights(old_logprobs, mb.rollout_logprobs, mb.rollout_mask, cap=loss.tis_cap)
    per_token = tis.to(pg.dtype) * pg
    if ref_model is not None and loss.kl_coef > 0:
        with torch.no_grad():
            ref = token_logprobs(ref_model, mb).values
        kl = kl_k3(logprobs, ref)
        per_token = per_token + loss.kl_coef * kl
        totals.add("kl", kl)
    weights = mb.weights.to(per_token.dtype)
    totals.add("pg_loss", weights * tis.to(pg.dtype) * pg)
    totals.add("objective", weights * per_token)
    totals.add("clipped", clipped.double())
    totals.add("ratio", torch.exp(logprobs.detach() - old_logprobs))
    present = mb.rollout_mask
    totals.add("tis", tis, where=present)
    raw = torch.exp(old_logprobs.detach().double() - mb.rollout_logprobs)
    totals.add("tis_truncated", (raw > loss.tis_cap).double(), where=present)
    return (weights * per_token).sum()


def _metrics(
    totals: _Totals,
    grad_norms: list[float],
    elapsed: float,
    sequences: int,
    policy_version: int,
) -> dict[str, float]:
    tokens, loss_tokens = totals.tokens, totals.loss_tokens
    out: dict[str, float] = {
        "trainer/sequences": float(sequences),
        "trainer/tokens": float(tokens),
        "trainer/loss_tokens": float(loss_tokens),
        "trainer/seconds": elapsed,
        "trainer/tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
        "trainer/grad_norm": max(grad_norms) if grad_norms else 0.0,
        "trainer/outside_support_tokens": float(totals.outside),
        "loss/pg": totals.sums.get("pg_loss", 0.0),
        "loss/objective": totals.sums.get("objective", 0.0),
    }
    if "kl" in totals.sums:
        out["loss/kl"] = totals.sums["kl"] / max(1, loss_tokens)
    out["clip_fraction"] = totals.sums.get("clipped", 0.0) / max(1, loss_tokens)
    out["ratio/mean"] = totals.sums.get("ratio", 0.0) / max(1, loss_tokens)
    out["ratio/min"] = totals.mins.get("ratio", 0.0)
    out["ratio/max"] = totals.maxs.get("ratio", 0.0)
    present = int(sum(int(m.sum()) for m in totals.rollout_masks))
    out["tis/mean"] = totals.sums.get("tis", 0.0) / max(1, present)
    out["tis/min"] = totals.mins.get("tis", 0.0)
    out["tis/max"] = totals.maxs.get("tis", 0.0)
    out["tis/truncated_fraction"] = totals.sums.get("tis_truncated", 0.0) / max(1, present)
    if totals.logprobs_old:
        trainer = torch.cat(totals.logprobs_old)
        rollout = torch.cat(totals.logprobs_rollout)
        masks = torch.cat(totals.rollout_masks)
        versions = torch.cat(totals.versions)
        for name, mask in (
            ("mismatch", masks),
            ("mismatch_onpolicy", masks & (versions == policy_version)),
        ):
            gap = mismatch(trainer, rollout, mask)
            out[f"{name}/tokens"] = float(gap.tokens)
            out[f"{name}/mean_abs"] = gap.mean_abs
            out[f"{name}/max_abs"] = gap.max_abs
            out[f"{name}/kl"] = gap.kl
    return out
