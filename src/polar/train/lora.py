"""LoRA with peft: the policy as its base model plus trained low-rank adapters.

With ``lora:`` in the training config the base model's weights are frozen
(float32, :mod:`polar.precision`) and only the adapters train, so the
optimizer holds state for them alone. A push writes only the adapters
(:func:`polar.train.weights.save_weights`), which the embedded engine merges
in place and vLLM loads through its LoRA API (:mod:`polar.train.reload`); a
checkpoint's ``model/`` holds only them too (peft's ``adapter_config.json``
and ``adapter_model.safetensors``), resumed onto the base model named by
``model``. :func:`export_merged` writes the base with the adapters merged in,
a model any engine serves.

peft (the ``lora`` extra) is imported only here, and only when a run uses LoRA.
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from polar.atomicfile import atomic_directory
from polar.causallm import CausalLM
from polar.train.checkpoint import TOKENIZER_FILES
from polar.train.config import LoraSettings


class LoraUnavailable(Exception):
    """peft is not installed (one line)."""


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise LoraUnavailable(
            "lora: needs peft (pip install 'polar[lora]', or peft==0.21.2)"
        ) from None
    return peft


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """peft 0.21 reads ``is_gradient_checkpointing``, which transformers 5.23
    deprecates with a FutureWarning on every wrap; nothing for a user to do."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        yield


def is_adapted(model: CausalLM) -> bool:
    """Whether ``model`` is a peft model (its adapters train, its base does not)."""
    return hasattr(model, "peft_config")


def add_adapters(model: CausalLM, settings: LoraSettings) -> CausalLM:
    """``model`` with fresh adapters (``B`` is zero: the policy starts as the base)."""
    peft = _peft()
    config = peft.LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=settings.target_modules,
        task_type="CAUSAL_LM",
    )
    with _quiet():
        adapted: CausalLM = peft.get_peft_model(model, config)
    return adapted


def load_adapters(model: CausalLM, path: Path) -> CausalLM:
    """``model`` with the adapters saved in ``path`` (a checkpoint's), trainable."""
    peft = _peft()
    with _quiet():
        adapted: CausalLM = peft.PeftModel.from_pretrained(model, str(path), is_trainable=True)
    return adapted


def export_merged(model: CausalLM, out: Path, *, tokenizer_dir: Path) -> Path:
    """Write the base model with ``model``'s adapters merged in to ``out`` (float32,
    tokenizer files copied from ``tokenizer_dir``), atomically. For the end of a
    run: ``model``'s base layers hold the merged weights afterwards."""
    merged: CausalLM = cast(Any, model).merge_and_unload()  # a peft model here
    with atomic_directory(out) as tmp:
        merged.save_pretrained(str(tmp))
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                shutil.copyfile(tokenizer_dir / name, tmp / name)
    return out
