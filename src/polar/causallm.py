"""Loading a Hugging Face causal language model: the one place Polar does it.

The trainers load the policy (float32 master weights,
:func:`polar.precision.load_master`), the embedded engine loads the model it
serves (float32 on a CPU, bfloat16 on a GPU), the warm-up trains the tiny
model, and the SmolLM2 conversion reads a GGUF file and verifies what it
wrote; each names the dtype it needs. ``transformers`` is imported on first
use (many commands never load a model). Errors are ``transformers``' own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def load_causal_lm(path: Path | str, *, dtype: torch.dtype, gguf_file: str | None = None) -> Any:
    """The causal LM in the model directory ``path``, its weights in ``dtype``
    (``gguf_file``: read that GGUF file in ``path`` instead, dequantized)."""
    from transformers import AutoModelForCausalLM

    options: dict[str, Any] = {"dtype": dtype}
    if gguf_file is not None:
        options["gguf_file"] = gguf_file
    return AutoModelForCausalLM.from_pretrained(str(path), **options)
