"""Full-weight pushes: written once in the engines' dtype, to shared memory when
every engine is on this machine, the tied output projection only for engines
that need it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from polar.precision import load_master
from polar.proxy.engines.embedded import ModelRunner
from polar.train.weights import WeightFormat, push_directory, save_weights, weight_format

from support.logprobs import sequence_logprobs

PROBE = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]


@pytest.mark.parametrize(
    ("dtypes", "expected"),
    [
        (["bfloat16", "bfloat16"], "bfloat16"),
        (["float32"], "float32"),
        (["bfloat16", "float32"], "float32"),
        (["bfloat16", None], "float32"),
        ([None], "float32"),
        (["float16"], "float16"),
    ],
)
def test_weights_go_out_in_the_dtype_every_engine_serves(
    dtypes: list[str | None], expected: str
) -> None:
    assert weight_format(dtypes, explicit_head=False).dtype == expected


def test_pushes_go_to_shared_memory_when_every_engine_is_on_this_machine(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    out = tmp_path / "run"
    local = ["http://127.0.0.1:8011", "http://localhost:8012", "http://[::1]:8013"]
    first = push_directory(None, out, local, shared_memory=shm)
    assert first.parent == shm and first.name.startswith("polar-weights-")
    # one directory per run (its output directory), the same on every start
    assert push_directory(None, out, local, shared_memory=shm) == first
    assert push_directory(None, tmp_path / "other", local, shared_memory=shm) != first
    remote = [*local, "http://10.0.0.7:8011"]
    assert push_directory(None, out, remote, shared_memory=shm) == out / "weights"
    assert push_directory(None, out, local, shared_memory=tmp_path / "none") == out / "weights"
    assert push_directory(tmp_path / "mine", out, local, shared_memory=shm) == tmp_path / "mine"


def test_a_bfloat16_push_is_half_the_bytes_and_an_engine_loads_it(
    tiny_model: Path, tmp_path: Path
) -> None:
    model = load_master(tiny_model)
    full = save_weights(model, tmp_path, 1, WeightFormat("float32", explicit_head=True))
    tied = save_weights(model, tmp_path, 2, WeightFormat("float32", explicit_head=False))
    half = save_weights(model, tmp_path, 3, WeightFormat("bfloat16", explicit_head=False))
    sizes = [(p / "model.safetensors").stat().st_size for p in (full, tied, half)]
    embedding = model.get_input_embeddings().weight.numel() * 4
    assert sizes[0] - sizes[1] == pytest.approx(embedding, rel=1e-3)  # lm_head written once
    assert sizes[2] == pytest.approx(sizes[1] / 2, rel=1e-3)
    with safe_open(str(half / "model.safetensors"), "pt") as tensors:
        names = list(tensors.keys())
        assert "lm_head.weight" not in names
        assert {tensors.get_tensor(k).dtype for k in names} == {torch.bfloat16}
    with safe_open(str(full / "model.safetensors"), "pt") as tensors:
        assert torch.equal(tensors.get_tensor("lm_head.weight"), model.lm_head.weight)
    assert json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"
    assert model.config.dtype == torch.float32  # the trainer's config is left as it was

    runner = ModelRunner(tiny_model, max_batch=1)
    try:
        runner.load_weights(half)
        served = sequence_logprobs(runner.model, PROBE, 5)
        rounded = load_master(tiny_model)
        rounded.load_state_dict(
            {k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()}
        )
        assert served == pytest.approx(sequence_logprobs(rounded, PROBE, 5), abs=1e-6)
    finally:
        runner.close()
