"""Checkpoints: a saved run resumes with the same step, version, task cursor,
counters, optimizer and scheduler state, and model weights."""

from __future__ import annotations

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
