"""Numeric precision of training, the one way every Polar trainer does it
(``polar train``'s GRPO step and ``polar sft``).

The contract:

- **Master weights and optimizer state are float32, always.** A trained model
  is loaded in :data:`MASTER_DTYPE` (:func:`load_master`), whatever the
  precision, so AdamW's moments are float32 and every checkpoint holds float32
  weights. Weights kept in bfloat16 lose small updates: bfloat16 has 8
  significant bits, so a weight moves only when its update is at least half a
  step of its own spacing (about 1/256 of its magnitude); at lr 1e-5 most
  updates round away (about 15% of the tiny model's weights changed in a
  step).
- **Compute follows the precision.** Under :func:`autocast` with
  :attr:`Precision.BFLOAT16`, the forward pass runs under ``torch.autocast``
  to bfloat16 on the model's device (CPU or CUDA): matrix products and
  attention in bfloat16 (each float32 weight cast once per use), the ops
  autocast keeps in float32 (reductions, norms, softmax) in float32, and
  gradients land on the float32 parameters in float32. With
  :attr:`Precision.FLOAT32` it changes nothing.
- **Only the forward pass is wrapped**, loss included (the callers cast logits
  to float32 before any log-softmax): backward passes and optimizer steps run
  outside it, as PyTorch recommends; a chunk recomputed in backward
  (``torch.utils.checkpoint``) is recomputed under the autocast state of its
  forward.

No loss scaling: bfloat16 has float32's exponent range, so gradients do not
underflow the way float16's do.

Imports nothing from Polar but the leaf :mod:`polar.causallm`; torch and
transformers are imported when used, so configs can name :class:`Precision`
without loading torch.
"""

from __future__ import annotations

import contextlib
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, assert_never

from polar.causallm import CausalLM, load_causal_lm

if TYPE_CHECKING:
    import torch


class Precision(StrEnum):
    FLOAT32 = "float32"
    """Everything in float32."""
    BFLOAT16 = "bfloat16"
    """Mixed: float32 master weights and optimizer state, forward in bfloat16."""


def master_dtype() -> torch.dtype:
    """The dtype of trained weights and optimizer state: float32."""
    import torch

    return torch.float32


def load_master(path: Path) -> CausalLM:
    """A Hugging Face causal LM from ``path`` with float32 weights (a bfloat16
    checkpoint is widened), ready to train at any :class:`Precision`."""
    return load_causal_lm(path, dtype=master_dtype())


def autocast(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The context a forward pass on ``device`` runs in (see the module docstring)."""
    import torch

    match precision:
        case Precision.FLOAT32:
            return contextlib.nullcontext()
        case Precision.BFLOAT16:
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        case unreachable:
            assert_never(unreachable)


def device_of(model: CausalLM) -> torch.device:
    """Where ``model``'s parameters are (what :func:`autocast` needs)."""
    parameter: torch.Tensor = next(iter(model.parameters()))
    return parameter.device


def default_precision(device: torch.device) -> Precision:
    """bfloat16 compute on a GPU that has it, float32 otherwise (a CPU's
    bfloat16 matrix products are rarely faster and always less exact)."""
    import torch

    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return Precision.BFLOAT16
    return Precision.FLOAT32
