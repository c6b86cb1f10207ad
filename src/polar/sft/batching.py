"""The pure pieces of SFT: which rows make each step, padding, the loss.

Shapes: ``B`` rows in a micro-batch, ``T`` the longest row's length, ``H`` the
hidden size, ``V`` the vocabulary, ``N`` the labelled positions in a batch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


def loss_sum(model: Any, batch: Batch) -> Any:
    """Summed next-token cross-entropy over the labelled positions (a scalar tensor).

    The output projection (V x H, the largest matrix of a small model) is
    applied only at positions that predict a labelled token, not at every one.
    """
    import torch

    decoder = model.get_decoder()
    hidden = decoder(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask
    ).last_hidden_state  # [B, T, H]
    targets = batch.labels[:, 1:]  # [B, T-1]: hidden[:, t] predicts token t + 1
    keep = targets != IGNORE  # [B, T-1]
    logits = model.get_output_embeddings()(hidden[:, :-1][keep])  # [N, V]
    return torch.nn.functional.cross_entropy(logits.float(), targets[keep], reduction="sum")


def learning_rate(step: int, *, base: float, warmup_steps: int) -> float:
    """Linear warm-up over ``warmup_steps`` (step 0 first), then constant."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return base
    return base * (step + 1) / warmup_steps
