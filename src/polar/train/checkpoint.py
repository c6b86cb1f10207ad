"""Checkpoints: everything a run needs to continue where it stopped.

``<output_dir>/checkpoints/step-000010/``: ``model/`` (a Hugging Face model
directory, tokenizer files included, usable on its own; with LoRA only the
adapters, peft's files, for the run's base model), ``optimizer.pt``
(optimizer and scheduler state), ``state.json`` (step, policy version, task
cursor, counters, the torch RNG states: the CPU's, and each GPU's when the run
had them). A checkpoint is written under a temporary name and renamed into
place (:func:`polar.atomicfile.atomic_directory`), so one that exists is complete.

Devices: tensors are saved where they are and restored with ``map_location``
onto the device of the optimizer's parameters (:func:`restore`), so a
checkpoint written on a GPU resumes on a CPU and the reverse; GPU random
states are restored only where there are GPUs to take them.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from polar.atomicfile import atomic_directory
from polar.causallm import CausalLM

_NAME = re.compile(r"^step-(\d{6,})$")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)


@dataclass(slots=True)
class TrainState:
    step: int = 0
    policy_version: int = 0
    cursor: int = 0
    """Groups submitted so far (the task order's position)."""
    counters: dict[str, float] = field(default_factory=dict)
    """Running totals (stale groups dropped, groups consumed, ...)."""


class CheckpointError(Exception):
    pass


def checkpoint_dir(output_dir: Path) -> Path:
    return output_dir / "checkpoints"


def save_checkpoint(
    output_dir: Path,
    state: TrainState,
    model: CausalLM,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    *,
    tokenizer_dir: Path,
    keep: int,
) -> Path:
    root = checkpoint_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    out = root / f"step-{state.step:06d}"
    with atomic_directory(out) as tmp:
        model.save_pretrained(str(tmp / "model"))
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                shutil.copyfile(tokenizer_dir / name, tmp / "model" / name)
        torch.save(
            {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
            tmp / "optimizer.pt",
        )
        info = asdict(state) | {"rng": torch.get_rng_state().tolist()}
        if torch.cuda.is_available():
            info["cuda_rng"] = [r.tolist() for r in torch.cuda.get_rng_state_all()]
        (tmp / "state.json").write_text(json.dumps(info) + "\n")
    for old in list_checkpoints(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return out


def list_checkpoints(output_dir: Path) -> list[Path]:
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def read_state(path: Path) -> TrainState:
    """A checkpoint's state (``CheckpointError`` naming what is wrong)."""
    try:
        data = json.loads((path / "state.json").read_text())
        return TrainState(
            step=int(data["step"]),
            policy_version=int(data["policy_version"]),
            cursor=int(data["cursor"]),
            counters={str(k): float(v) for k, v in data["counters"].items()},
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path}: not a readable checkpoint ({exc})") from None


def restore(path: Path, optimizer: torch.optim.Optimizer, scheduler: Any) -> TrainState:
    """Load optimizer, scheduler and RNG state from ``path`` onto the device of the
    optimizer's parameters (the model is loaded from ``path / "model"`` by the
    caller and placed first); returns the run's state."""
    state = read_state(path)
    try:
        saved = torch.load(
            path / "optimizer.pt", map_location=_device_of(optimizer), weights_only=True
        )
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        info = json.loads((path / "state.json").read_text())
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot restore the optimizer ({exc})") from None
    torch.set_rng_state(torch.tensor(info["rng"], dtype=torch.uint8))
    gpu_states = info.get("cuda_rng") or []
    if gpu_states and torch.cuda.is_available():
        for index, rng in enumerate(gpu_states[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(torch.tensor(rng, dtype=torch.uint8), index)
    return state


def _device_of(optimizer: torch.optim.Optimizer) -> torch.device:
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            return torch.device(parameter.device)
    return torch.device("cpu")
