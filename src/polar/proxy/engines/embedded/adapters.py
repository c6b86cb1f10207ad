"""LoRA adapters loaded into the embedded engine in place, merged into its weights.

A trainer training LoRA adapters (``polar train`` with ``lora:``) pushes only
them (:mod:`polar.adapters`). The engine merges each adapted linear layer,
``W = W_base + scale x B @ A``, in float32 and then in its own dtype, so a
forward pass costs what it cost before. The base weights of the layers an
adapter touches are kept aside the first time, and every later adapter is
merged into them, never into a merged weight (no drift over hundreds of
pushes); a layer the new adapter leaves alone gets its base weight back.
Loading full weights drops what was kept (they are the new base).
"""

from __future__ import annotations

import torch

from polar.adapters import Adapter, AdapterError
from polar.causallm import CausalLM


class MergedAdapters:
    """The base weights of the layers an adapter was merged into (see the module
    docstring); one per engine, used under its weights lock."""

    def __init__(self) -> None:
        self._base: dict[str, torch.Tensor] = {}
        self.current: Adapter | None = None

    @torch.no_grad()
    def apply(self, model: CausalLM, adapter: Adapter) -> None:
        """Merge ``adapter`` into ``model``'s weights in place."""
        params = dict(model.named_parameters())
        embedding = model.get_input_embeddings().weight
        targets = {}
        for module in adapter.factors:
            weight = params.get(f"{module}.weight")
            if weight is None:
                raise AdapterError(f"{adapter.source}: the model has no linear layer {module}")
            if weight.data_ptr() == embedding.data_ptr():
                raise AdapterError(
                    f"{adapter.source}: {module} shares its weight with the input embedding "
                    "(tied): leave it out of lora.target_modules"
                )
            a, b = adapter.factors[module]
            if tuple(b.shape[:1]) + tuple(a.shape[1:]) != tuple(weight.shape):
                raise AdapterError(
                    f"{adapter.source}: {module}: factors {tuple(b.shape)} x {tuple(a.shape)} "
                    f"do not make its weight {tuple(weight.shape)}"
                )
            targets[module] = weight
        for module in list(self._base):
            if module not in targets:
                params[f"{module}.weight"].copy_(self._base.pop(module))
        for module, weight in targets.items():
            base = self._base.setdefault(module, weight.detach().clone())
            a, b = adapter.factors[module]
            delta = b.to(weight.device, torch.float32) @ a.to(weight.device, torch.float32)
            weight.copy_((base.float() + adapter.scale * delta).to(weight.dtype))
        self.current = adapter

    def forget(self) -> None:
        """Full weights were loaded: they are the new base."""
        self._base.clear()
        self.current = None
