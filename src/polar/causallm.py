"""Loading a Hugging Face causal language model: the one place Polar does it.

The trainers load the policy (float32 master weights,
:func:`polar.precision.load_master`), the embedded engine loads the model it
serves (float32 on a CPU, bfloat16 on a GPU), the warm-up trains the tiny
model, and the SmolLM2 conversion reads a GGUF file and verifies what it
wrote; each names the dtype it needs. ``transformers`` is imported on first
use (many commands never load a model). Errors are ``transformers``' own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


class CausalLM(Protocol):
    """What Polar uses of a Hugging Face causal language model (a torch module,
    or peft's wrapper of one), typed: ``transformers`` ships no types mypy reads.
    Calling it runs the forward pass (its output has ``.logits``, or the decoder's
    ``.last_hidden_state``)."""

    @property
    def config(self) -> Any: ...

    @property
    def generation_config(self) -> Any: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]: ...

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any: ...

    def to(self, *args: Any, **kwargs: Any) -> Any: ...

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...

    def save_pretrained(self, save_directory: Any, **kwargs: Any) -> Any: ...

    def get_input_embeddings(self) -> Any: ...

    def get_output_embeddings(self) -> Any: ...

    def get_decoder(self) -> Any: ...

    def gradient_checkpointing_enable(self, **kwargs: Any) -> Any: ...


def load_causal_lm(
    path: Path | str, *, dtype: torch.dtype, gguf_file: str | None = None
) -> CausalLM:
    """The causal LM in the model directory ``path``, its weights in ``dtype``
    (``gguf_file``: read that GGUF file in ``path`` instead, dequantized)."""
    from transformers import AutoModelForCausalLM

    options: dict[str, Any] = {"dtype": dtype}
    if gguf_file is not None:
        options["gguf_file"] = gguf_file
    model: CausalLM = AutoModelForCausalLM.from_pretrained(str(path), **options)
    return model
