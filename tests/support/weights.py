"""Watching what one optimizer step does to a model's weights, through torch's
public hooks only: which elements received a gradient, which changed, and the
dtype the model's linear layers computed in.

A gradient counts when it is at least ``floor``: give AdamW's ``eps``. Adam's
step is ``lr * g / (|g| + eps)``, so a gradient far below ``eps`` (the tiny
model's output projection has a few of 1e-12 on tokens of probability 1e-6)
moves its weight by far less than ``lr``, by Adam's design and in float32 as
much as in any other precision."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch


class GradientWatch:
    """Install on a model before a step, :meth:`close` after it."""

    def __init__(self, model: Any, *, floor: float) -> None:
        self.floor = floor
        self.before = {name: p.detach().clone() for name, p in model.named_parameters()}
        self.received: dict[str, torch.Tensor] = {}
        """Per parameter: where its gradient is at least ``floor`` in magnitude (the
        accumulated gradient, as the optimizer sees it)."""
        self.compute_dtypes: set[torch.dtype] = set()
        """The dtypes every ``nn.Linear`` produced its output in."""
        self._handles = [
            p.register_post_accumulate_grad_hook(partial(self._gradient, name))
            for name, p in model.named_parameters()
        ]
        self._handles += [
            m.register_forward_hook(self._forward)
            for m in model.modules()
            if isinstance(m, torch.nn.Linear)
        ]

    def _gradient(self, name: str, parameter: torch.Tensor) -> None:
        assert parameter.grad is not None
        self.received[name] = parameter.grad.detach().abs() >= self.floor

    def _forward(self, module: Any, inputs: Any, output: torch.Tensor) -> None:
        self.compute_dtypes.add(output.dtype)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()

    def changed_where_received(self, model: Any) -> float:
        """The fraction of the weight elements that received a gradient whose value changed."""
        received = changed = 0
        for name, p in model.named_parameters():
            where = self.received.get(name)
            if where is None:
                continue
            moved = p.detach() != self.before[name]
            received += int(where.sum())
            changed += int((moved & where).sum())
        assert received > 0, "no weight received a gradient"
        return changed / received
