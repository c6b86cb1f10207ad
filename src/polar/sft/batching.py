"""The pure pieces of SFT: which rows make each step, padding, the loss.

Shapes: ``B`` rows in a micro-batch, ``T`` the longest row's length, ``H`` the
hidden size, ``V`` the vocabulary, ``N`` the labelled positions in a batch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from polar.causallm import CausalLM
from polar.sft.export import IGNORE, TokenRow


def step_plan(
    rows: int, *, batch_size: int, epochs: int, seed: int, shuffle: bool = True
) -> list[list[int]]:
    """Row indices of each optimizer step: every epoch visits every row once (in a
    seeded order), and cuts it into batches of ``batch_size`` (the last may be
    smaller). Deterministic given the arguments."""
    steps = []
    for epoch in range(epochs):
        order = list(range(rows))
        if shuffle:
            random.Random(seed * 1_000_003 + epoch).shuffle(order)
        steps += [order[i : i + batch_size] for i in range(0, rows, batch_size)]
    return steps


def micro_batches(indices: Sequence[int], size: int) -> list[list[int]]:
    return [list(indices[i : i + size]) for i in range(0, len(indices), size)]


@dataclass(frozen=True, slots=True)
class Batch:
    input_ids: Any
    """[B, T] long, right-padded with the pad id."""
    attention_mask: Any
    """[B, T] long: 1 on real tokens."""
    labels: Any
    """[B, T] long: the token where it is trained, -100 elsewhere (padding too)."""

    def to(self, device: Any) -> Batch:
        return Batch(
            self.input_ids.to(device), self.attention_mask.to(device), self.labels.to(device)
        )

    @property
    def labelled(self) -> int:
        """Positions that contribute to the loss (each label is predicted from the one before)."""
        return int((self.labels[:, 1:] != IGNORE).sum())


def collate(rows: Sequence[TokenRow], pad_id: int) -> Batch:
    import torch

    width = max(len(r.input_ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row.input_ids)
        ids[i, :n] = torch.tensor(row.input_ids)
        attention[i, :n] = torch.tensor(row.attention_mask)
        labels[i, :n] = torch.tensor(row.labels)
    return Batch(ids, attention, labels)


def loss_sum(model: CausalLM, batch: Batch, *, chunk: int = 512) -> Any:
    """Summed next-token cross-entropy over the labelled positions (a float32
    scalar tensor, differentiable when gradients are enabled).

    The output projection (V x H, the largest matrix of a small model) is
    applied only at positions that predict a labelled token, ``chunk`` of them
    at a time; with gradients on, each chunk's logits are recomputed in the
    backward pass (activation checkpointing), so at most ``[chunk, V]`` logits
    are alive at once, never ``[N, V]``. The GRPO step projects the same way
    (:func:`polar.train.logprobs.token_logprobs`).
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    decoder = model.get_decoder()
    hidden = decoder(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask
    ).last_hidden_state  # [B, T, H]
    targets = batch.labels[:, 1:]  # [B, T-1]: hidden[:, t] predicts token t + 1
    keep = targets != IGNORE  # [B, T-1]
    picked, wanted = hidden[:, :-1][keep], targets[keep]  # [N, H], [N]
    head = model.get_output_embeddings()
    parts = []
    for start in range(0, max(1, picked.shape[0]), chunk):
        h, y = picked[start : start + chunk], wanted[start : start + chunk]
        if torch.is_grad_enabled() and h.shape[0]:
            parts.append(checkpoint(_chunk_loss, head, h, y, use_reentrant=False))
        else:
            parts.append(_chunk_loss(head, h, y))
    return torch.stack(parts).sum()


def _chunk_loss(head: Any, hidden: Any, targets: Any) -> Any:
    import torch

    logits = head(hidden).float()  # [n, V]
    return torch.nn.functional.cross_entropy(logits, targets, reduction="sum")


def learning_rate(step: int, *, base: float, warmup_steps: int) -> float:
    """Linear warm-up over ``warmup_steps`` (step 0 first), then constant."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return base
    return base * (step + 1) / warmup_steps
