"""Checkpoints: a saved run resumes with the same step, version, task cursor,
counters, optimizer and scheduler state, and model weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from polar.train.checkpoint import (
    CheckpointError,
    TrainState,
    list_checkpoints,
    restore,
    save_checkpoint,
)


def _optimizer(
    model: torch.nn.Module,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: min(1.0, (n + 1) / 4))


def test_a_checkpoint_restores_the_run(tmp_path: Path, tiny_model: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    optimizer, scheduler = _optimizer(model)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    scheduler.step()
    state = TrainState(
        step=3, policy_version=3, cursor=7, counters={"groups/stale_dropped_total": 1}
    )
    for step in (1, 2, 3):
        state.step = step
        path = save_checkpoint(
            tmp_path, state, model, optimizer, scheduler, tokenizer_dir=tiny_model, keep=2
        )
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000002", "step-000003"]
    assert (path / "model" / "tokenizer.json").is_file()

    resumed = AutoModelForCausalLM.from_pretrained(str(path / "model"))
    optimizer2, scheduler2 = _optimizer(resumed)
    back = restore(path, optimizer2, scheduler2)
    assert back == state
    assert scheduler2.get_last_lr() == scheduler.get_last_lr()
    saved, loaded = optimizer.state_dict()["state"], optimizer2.state_dict()["state"]
    assert saved.keys() == loaded.keys()
    for key in saved:
        assert torch.equal(saved[key]["exp_avg"], loaded[key]["exp_avg"])
    for (name, a), (_, b) in zip(
        model.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_a_broken_checkpoint_is_named(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{not json")
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = _optimizer(model)
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        restore(tmp_path, optimizer, scheduler)


class _OnGpu:
    """While active, ``torch.save`` tags every storage it writes ``cuda:0``, as a
    run on a GPU writes them (torch's public ``register_package``: a tagger tried
    before the CPU's; its deserializer defers to torch's own)."""

    active = False

    @classmethod
    def tag(cls, storage: object) -> str | None:
        return "cuda:0" if cls.active else None


torch.serialization.register_package(1, _OnGpu.tag, lambda storage, location: None)


def _stepped() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer, scheduler = _optimizer(model)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def _save(
    root: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: object,
    tiny_model: Path,
) -> Path:
    class _Saves(torch.nn.Module):  # save_pretrained's part of a Hugging Face model
        def save_pretrained(self, path: str) -> None:
            Path(path).mkdir()

    return save_checkpoint(
        root, TrainState(step=1), _Saves(), optimizer, scheduler, tokenizer_dir=tiny_model, keep=1
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a GPU-less machine")
def test_a_checkpoint_written_on_a_gpu_resumes_on_the_cpu(tmp_path: Path, tiny_model: Path) -> None:
    model, optimizer, scheduler = _stepped()
    _OnGpu.active = True
    try:
        path = _save(tmp_path, model, optimizer, scheduler, tiny_model)
    finally:
        _OnGpu.active = False
    info = json.loads((path / "state.json").read_text())
    (path / "state.json").write_text(json.dumps(info | {"cuda_rng": [[0] * 16]}))
    # as written on a GPU: torch cannot load it here without being told where
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(path / "optimizer.pt", weights_only=True)

    _, optimizer2, scheduler2 = _stepped()
    restore(path, optimizer2, scheduler2)
    saved, loaded = optimizer.state_dict()["state"], optimizer2.state_dict()["state"]
    for key in saved:
        for name in ("exp_avg", "exp_avg_sq"):
            assert loaded[key][name].device.type == "cpu"
            assert torch.equal(saved[key][name], loaded[key][name])


def test_a_checkpoint_resumes_on_the_device_of_the_parameters(
    tmp_path: Path, tiny_model: Path
) -> None:
    """A CPU checkpoint resumed by a run whose parameters are elsewhere (``meta``,
    the device this CPU has besides its own) puts the optimizer state there."""
    model, optimizer, scheduler = _stepped()
    path = _save(tmp_path, model, optimizer, scheduler, tiny_model)
    elsewhere = torch.nn.Linear(4, 3, device="meta")
    optimizer2, scheduler2 = _optimizer(elsewhere)
    restore(path, optimizer2, scheduler2)
    state = optimizer2.state_dict()["state"]
    assert state and {
        t.device.type for s in state.values() for k, t in s.items() if k != "step"
    } == {"meta"}
