"""``polar sft``'s step and run under each precision: float32 master weights and
AdamW state, the forward pass in bfloat16 when asked (:mod:`polar.precision`),
a float32 model written out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import torch
from safetensors import safe_open

from polar.precision import Precision, default_precision, load_master
from polar.sft.batching import collate
from polar.sft.export import token_row, token_rows
from polar.sft.train import FinetuneConfig, finetune, sft_step

from support.sft import KEY, sample
from support.weights import GradientWatch

EPS = 1e-8
"""AdamW's default ``eps``: smaller gradients are damped by Adam's design (see GradientWatch)."""


def token_export(root: Path, tokenizer: Any) -> Path:
    """A token export of one two-turn trace (``polar generate``'s JSONL)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "tokens.jsonl"
    path.write_bytes(orjson.dumps(token_row(KEY, sample(tokenizer))) + b"\n")
    return path


def test_a_bfloat16_sft_step_at_lr_1e_5_changes_every_weight_that_received_a_gradient(
    tiny_model: Path, tokenizer: Any, tmp_path: Path
) -> None:
    rows = token_rows(token_export(tmp_path, tokenizer))
    model = load_master(tiny_model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, eps=EPS, weight_decay=0.0)
    watch = GradientWatch(model, floor=EPS)
    loss, norm = sft_step(
        model,
        optimizer,
        [collate(rows, pad_id=0)],
        precision=Precision.BFLOAT16,
        max_grad_norm=1.0,
        chunk=8,  # several chunks, each recomputed in backward
    )
    watch.close()

    assert loss > 0 and norm > 0
    assert watch.compute_dtypes == {torch.bfloat16}, "the forward pass ran in bfloat16"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    for state in optimizer.state.values():
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    changed = watch.changed_where_received(model)
    assert changed == 1.0, f"{changed:.1%} of the weights that received a gradient changed"


def test_polar_sft_in_bfloat16_writes_float32_weights(
    tiny_model: Path, tokenizer: Any, tmp_path: Path
) -> None:
    out = tmp_path / "sft"
    report = finetune(
        FinetuneConfig(
            data=token_export(tmp_path / "data", tokenizer),
            model=tiny_model,
            out=out,
            max_steps=1,
            device="cpu",
            dtype="bfloat16",
            logprob_chunk=16,
        )
    )
    assert (report.steps, report.device, report.precision) == (1, "cpu", "bfloat16")
    with safe_open(str(out / "model.safetensors"), framework="pt") as weights:
        dtypes = {weights.get_slice(name).get_dtype() for name in weights.keys()}  # noqa: SIM118
    assert dtypes == {"F32"}
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    # auto: float32 compute on a CPU (bfloat16 only on a GPU that has it)
    assert default_precision(torch.device("cpu")) is Precision.FLOAT32


def test_polar_sft_as_a_process_prints_no_third_party_progress_bar(
    tiny_model: Path, tokenizer: Any, tmp_path: Path
) -> None:
    data = token_export(tmp_path / "data", tokenizer)
    args = ["--model", str(tiny_model), "--out", str(tmp_path / "sft"), "--max-steps", "1"]
    result = subprocess.run(
        [sys.executable, "-m", "polar", "sft", str(data), *args, "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # transformers' "Loading weights: 100%|...| 24/24" before
    assert result.stdout.startswith("trained 1 steps on 1 rows")
