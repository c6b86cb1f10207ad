"""One sequence's logprobs under the trainer's own computation, for comparing a
trained model with an engine's recorded logprobs or with itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from polar.distribution import Settings
from polar.ir import Distribution
from polar.ir.behaviour import MODEL
from polar.precision import device_of
from polar.train.batch import MicroBatch
from polar.train.logprobs import token_logprobs


def sequence_logprobs(
    model: Any, ids: Sequence[int], start: int, *, sampling: Distribution = MODEL
) -> list[float]:
    """Logprobs of ``ids[start:]`` given what precedes each, for one sequence, under
    ``sampling`` (comparisons with an engine's recorded logprobs)."""
    if start < 1:
        raise ValueError("start must be at least 1: the first token has no context")
    input_ids = torch.tensor([list(ids)], dtype=torch.long)
    n = len(ids) - start
    batch = MicroBatch(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        position_ids=torch.arange(len(ids)).unsqueeze(0),
        rows=torch.zeros(n, dtype=torch.long),
        cols=torch.arange(start - 1, len(ids) - 1, dtype=torch.long),
        targets=torch.tensor(list(ids[start:]), dtype=torch.long),
        rollout_logprobs=torch.zeros(n, dtype=torch.float64),
        rollout_mask=torch.zeros(n, dtype=torch.bool),
        advantages=torch.zeros(n),
        weights=torch.zeros(n, dtype=torch.float64),
        versions=torch.zeros(n, dtype=torch.long),
        sampling=Settings.of([sampling] * n),
        truncates=sampling.truncated,
        tempered=sampling.temperature != 1.0,
        tokens=len(ids),
    )
    with torch.no_grad():
        return [float(v) for v in token_logprobs(model, batch.to(device_of(model))).values]
