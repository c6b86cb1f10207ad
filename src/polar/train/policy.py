"""The policy as a trainer holds it, made ready in one order: float32 master
weights (:mod:`polar.precision`), decoder gradient checkpointing when asked,
LoRA adapters when asked (:mod:`polar.train.lora`), then the memory estimate
checked against the device (:mod:`polar.train.memory`) while the model is
still on the CPU, then the move to the device. ``polar train`` and
``benchmarks/train_gpu.py`` both go through :func:`prepare`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from polar.causallm import CausalLM
from polar.device import device_memory
from polar.precision import Precision, load_master
from polar.train.config import LoraSettings
from polar.train.lora import add_adapters, is_adapted, load_adapters
from polar.train.memory import MemorySettings, ModelShape, check_fits


@dataclass(frozen=True, slots=True)
class PolicySettings:
    device: torch.device
    precision: Precision
    micro_batch_tokens: int
    logprob_chunk: int = 512
    gradient_checkpointing: bool = False
    lora: LoraSettings | None = None
    reference: bool = False
    """A KL reference model will sit beside it (counted in the estimate)."""
    check_memory: bool = True


def prepare(model: CausalLM, settings: PolicySettings) -> CausalLM:
    """``model`` (float32, on the CPU) made ready to train on ``settings.device``;
    :class:`polar.train.memory.MemoryTooSmall` before anything moves if it cannot fit."""
    if settings.gradient_checkpointing:
        # transformers 5.23 renamed it (the old name warns); older 5.x have only the old one
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is None:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        else:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if settings.lora is not None and not is_adapted(model):
        model = add_adapters(model, settings.lora)
    if settings.check_memory:
        check_fits(
            ModelShape.of(model),
            MemorySettings(
                micro_batch_tokens=settings.micro_batch_tokens,
                logprob_chunk=settings.logprob_chunk,
                gradient_checkpointing=settings.gradient_checkpointing,
                bfloat16=settings.precision is Precision.BFLOAT16,
                reference=settings.reference,
            ),
            capacity=device_memory(settings.device),
            device=str(settings.device),
            lora=settings.lora is not None,
        )
    model.train(False)
    moved: CausalLM = model.to(settings.device)  # the same module, moved
    return moved


def load_policy(base: Path, settings: PolicySettings, *, adapters: Path | None = None) -> CausalLM:
    """The policy from the model directory ``base`` (with the adapters saved in
    ``adapters``, a LoRA checkpoint's), ready to train (:func:`prepare`)."""
    model = load_master(base)
    if adapters is not None:
        model = load_adapters(model, adapters)
    return prepare(model, settings)


def trainable(model: CausalLM) -> list[torch.nn.Parameter]:
    """The parameters the optimizer steps: all of them, or a peft model's adapters."""
    return [p for p in model.parameters() if p.requires_grad]
