"""Seconds and bytes per weight push, before and after pushes went out in the
engines' dtype to shared memory.

    .venv/bin/python benchmarks/push.py [--models tiny,smollm2] [--repeat 5]

For each model (the tiny Qwen3 of ``polar model init``; SmolLM2-135M-Instruct
from ``.cache/models/smollm2-135m-instruct``, ``scripts/setup`` converts it) a
trainer-side float32 model pushes to one embedded engine on this machine
(``polar.train.weightsync.WeightSync`` with no gateway: the write and the
engine's ``POST /weights``), ``--repeat`` times per way, and the median is
printed:

- ``before``: what ``save_weights`` did until now, kept here as it was: every
  tensor cloned, float32, the tied output projection written out again, to
  ``<output_dir>/weights`` on disk;
- ``after``: what a push to an embedded CPU engine does now: float32 (its
  dtype), the tied matrix once, in ``/dev/shm``;
- ``after-bf16``: the same for an engine serving bfloat16 (vLLM or the
  embedded engine on a GPU): half the bytes (loaded here by the CPU engine,
  which widens them);
- ``lora-r16``: a LoRA run's push, adapters on every linear layer.

Versions are kept as a run keeps them (the newest two). One torch thread, as
the engine runs with ``--threads 1`` on two shared cores. On a machine with
memory to spare a file written to disk sits in the page cache until it is
written back, so a short run sees little of the disk: the difference
``/dev/shm`` makes shows under sustained pushes of large models.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from polar.precision import load_master
from polar.proxy.engines.embedded import ModelRunner, create_engine_app
from polar.serverthread import ServerThread
from polar.tinymodel.build import build_tiny_model
from polar.train.config import LoraSettings
from polar.train.lora import add_adapters
from polar.train.reload import EmbeddedReload
from polar.train.weights import SHARED_MEMORY, WeightFormat, prune_weights, save_weights
from polar.train.weightsync import WeightSync

SMOLLM2 = Path(".cache/models/smollm2-135m-instruct")


def save_before(model: Any, directory: Path, version: int) -> Path:
    """``polar.train.weights.save_weights`` as it was before this change."""
    from safetensors.torch import save_file

    out = directory / f"v{version}"
    tmp = directory / f".v{version}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {
        name: tensor.detach().to("cpu").clone().contiguous()
        for name, tensor in model.state_dict().items()
    }
    head = model.get_output_embeddings()
    if "lm_head.weight" not in state and head is not None:
        state["lm_head.weight"] = head.weight.detach().to("cpu").clone().contiguous()
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(str(tmp))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(tmp))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def measure(
    model: Any, sync: WeightSync, directory: Path, save: Callable[[Any, Path, int], Path], n: int
) -> dict[str, float]:
    saves, loads, sizes = [], [], []
    for version in range(1, n + 1):
        started = time.perf_counter()
        path = save(model, directory, version)
        written = time.perf_counter()
        sync.push(path, version)
        loads.append(time.perf_counter() - written)
        saves.append(written - started)
        sizes.append(sum(f.stat().st_size for f in path.iterdir()))
        prune_weights(directory, keep=2)  # as a run keeps them (weight_sync.keep)
    shutil.rmtree(directory, ignore_errors=True)
    save_s, load_s = statistics.median(saves), statistics.median(loads)
    return {
        "seconds": round(save_s + load_s, 3),
        "write_s": round(save_s, 3),
        "load_s": round(load_s, 3),
        "mb": round(statistics.median(sizes) / 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        dirs = {"tiny": build_tiny_model(root / "tiny"), "smollm2": SMOLLM2}
        for name in args.models.split(","):
            model_dir = dirs[name]
            model = load_master(model_dir)
            runner = ModelRunner(model_dir, max_batch=1, threads=1)
            server = ServerThread(create_engine_app(runner, served_name=name)).start()
            sync = WeightSync(
                [], [EmbeddedReload(server.url, api_key=None, timeout_s=600)], drain_timeout_s=60
            )
            shm = Path(tempfile.mkdtemp(prefix="polar-push-", dir=SHARED_MEMORY))
            engine_format = sync.weight_format()  # what a trainer writes for this engine
            ways: dict[str, tuple[Path, Callable[[Any, Path, int], Path]]] = {
                "before": (root / "disk", save_before),
                "after": (shm, partial(save_weights, fmt=engine_format)),
                "after-bf16": (shm, partial(save_weights, fmt=WeightFormat("bfloat16", False))),
            }
            try:
                row: dict[str, Any] = {"model": name, "parameters": model.num_parameters()}
                for way, (directory, save) in ways.items():
                    row[way] = measure(model, sync, directory, save, args.repeat)
                adapted = add_adapters(model, LoraSettings(r=16, alpha=32))
                row["lora-r16"] = measure(adapted, sync, shm, save_weights, args.repeat)
                print(json.dumps(row), flush=True)
            finally:
                shutil.rmtree(shm, ignore_errors=True)
                sync.close()
                server.stop()
                runner.close()


if __name__ == "__main__":
    main()
