"""The trainer's logprobs of given tokens under a causal LM.

The vocabulary projection dominates a small model's cost and memory (Qwen3's
151,936 x hidden), so it is applied only at the positions that predict a loss
token, in chunks; with gradients on, each chunk is recomputed in the backward
pass (activation checkpointing) rather than keeping ``[N, vocab]`` logits alive.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from polar.train.batch import MicroBatch


def _chunk_logprobs(
    head: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    logits: torch.Tensor = head(hidden).float()  # [n, V]
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)  # [n]


def token_logprobs(
    model: Any,
    batch: MicroBatch,
    *,
    temperature: float = 1.0,
    chunk: int = 512,
) -> torch.Tensor:
    """``log pi(targets)`` [N] for the batch's loss tokens (differentiable when
    gradients are enabled)."""
    hidden = model.get_decoder()(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask
    ).last_hidden_state  # [B, T, H]
    picked = hidden[batch.rows, batch.cols]  # [N, H]
    head = model.get_output_embeddings()
    parts = []
    for start in range(0, picked.shape[0], chunk):
        h = picked[start : start + chunk]
        y = batch.targets[start : start + chunk]
        if torch.is_grad_enabled():
            part = checkpoint(_chunk_logprobs, head, h, y, temperature, use_reentrant=False)
        else:
            part = _chunk_logprobs(head, h, y, temperature)
        parts.append(part)
    if not parts:
        return torch.zeros(0, dtype=torch.float32)
    return torch.cat(parts)


def sequence_logprobs(
    model: Any, ids: Sequence[int], start: int, *, temperature: float = 1.0
) -> list[float]:
    """Logprobs of ``ids[start:]`` given what precedes each, for one sequence
    (comparisons with an engine's recorded logprobs)."""
    if start < 1:
        raise ValueError("start must be at least 1: the first token has no context")
    input_ids = torch.tensor([list(ids)], dtype=torch.long)
    n = len(ids) - start
    batch = MicroBatch(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        rows=torch.zeros(n, dtype=torch.long),
        cols=torch.arange(start - 1, len(ids) - 1, dtype=torch.long),
        targets=torch.tensor(list(ids[start:]), dtype=torch.long),
        rollout_logprobs=torch.zeros(n, dtype=torch.float64),
        rollout_mask=torch.zeros(n, dtype=torch.bool),
        advantages=torch.zeros(n),
        weights=torch.zeros(n, dtype=torch.float64),
        versions=torch.zeros(n, dtype=torch.long),
        tokens=len(ids),
    )
    with torch.no_grad():
        return [float(v) for v in token_logprobs(model, batch, temperature=temperature)]
