"""LoRA adapters as files: what peft writes (``adapter_config.json``,
``adapter_model.safetensors``), read back without peft.

The trainer pushes only adapters when it trains LoRA (:mod:`polar.train.lora`);
the embedded engine merges them into its weights
(:mod:`polar.proxy.engines.embedded.adapters`); vLLM reads the same files
through its LoRA API. :func:`read_adapter` takes plain LoRA on linear layers
and refuses, naming it, what peft can write beyond that (DoRA, trained
``modules_to_save``, per-layer rank or alpha patterns, embedding adapters,
biases). Each adapted layer's weight is ``W + scale x B @ A`` (``scale`` =
``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rsLoRA).

Imports nothing from Polar; torch and safetensors are imported when used.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")


class AdapterError(ValueError):
    """An adapter that cannot be loaded (one line)."""


@dataclass(frozen=True, slots=True)
class Adapter:
    source: str
    rank: int
    scale: float
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]
    """Per adapted module (its name in the model): ``A`` [r, in], ``B`` [out, r]."""


def is_adapter(path: Path) -> bool:
    """Whether ``path`` is a directory of LoRA adapters (rather than full weights)."""
    return path.is_dir() and (path / ADAPTER_CONFIG).is_file()


def read_adapter(path: Path) -> Adapter:
    """The adapter in ``path`` (peft's files), or :class:`AdapterError`."""
    from safetensors.torch import load_file

    try:
        config = json.loads((path / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{path}: unreadable {ADAPTER_CONFIG} ({exc})") from None
    unsupported = [
        what
        for what, present in (
            (f"peft_type {config.get('peft_type')}", config.get("peft_type", "LORA") != "LORA"),
            ("use_dora", bool(config.get("use_dora"))),
            ("modules_to_save", bool(config.get("modules_to_save"))),
            ("rank_pattern", bool(config.get("rank_pattern"))),
            ("alpha_pattern", bool(config.get("alpha_pattern"))),
            ("fan_in_fan_out", bool(config.get("fan_in_fan_out"))),
            (f"bias {config.get('bias')}", config.get("bias", "none") != "none"),
        )
        if present
    ]
    if unsupported:
        raise AdapterError(f"{path}: the embedded engine loads plain LoRA only, not {unsupported}")
    weights = path / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise AdapterError(f"{path}: no {ADAPTER_WEIGHTS}")
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(str(weights)).items():
        match = _KEY.match(key)
        if match is None:
            raise AdapterError(f"{path}: {key} is not a LoRA factor of a linear layer")
        parts.setdefault(match["module"], {})[match["part"]] = tensor
    factors = {}
    for module, pair in parts.items():
        if set(pair) != {"A", "B"}:
            raise AdapterError(f"{path}: {module} has lora_{''.join(pair)} alone")
        factors[module] = (pair["A"], pair["B"])
    return Adapter(str(path), rank, scale, factors)
