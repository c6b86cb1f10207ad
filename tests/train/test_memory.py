"""The memory estimate a run is checked against before its first step
(``polar.train.memory``), and the error that names the setting to change."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from polar.precision import Precision
from polar.train.memory import GIB, MemorySettings, MemoryTooSmall, ModelShape, check_fits, estimate
from polar.train.policy import PolicySettings, prepare

QWEN3_4B = ModelShape(
    parameters=4_022_468_096,
    trainable=4_022_468_096,
    hidden=2560,
    intermediate=9728,
    layers=36,
    vocab=151_936,
)
H100 = int(79.2 * GIB)


def settings(
    tokens: int = 16384, *, checkpointing: bool = True, reference: bool = False
) -> MemorySettings:
    return MemorySettings(
        micro_batch_tokens=tokens,
        logprob_chunk=512,
        gradient_checkpointing=checkpointing,
        bfloat16=True,
        reference=reference,
    )


def test_the_estimate_meets_the_h100_measurements_of_the_4b_shape() -> None:
    """shared/gpu/README.md: float32 master weights, bfloat16 autocast, checkpointing:
    74.1 GiB at 16,384 tokens per microbatch, 71.2 at 8,192."""
    assert estimate(QWEN3_4B, settings(16384)).total / GIB == pytest.approx(74.1, abs=1.0)
    assert estimate(QWEN3_4B, settings(8192)).total / GIB == pytest.approx(71.2, abs=1.0)
    need = estimate(QWEN3_4B, settings())
    # 16 bytes per trained parameter: weights, gradients, two AdamW moments
    assert need.weights + need.gradients + need.optimizer == 16 * QWEN3_4B.parameters


def test_without_checkpointing_the_error_says_to_turn_it_on() -> None:
    with pytest.raises(MemoryTooSmall) as error:
        check_fits(
            QWEN3_4B, settings(checkpointing=False), capacity=H100, device="cuda:0", lora=False
        )
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("training needs about ")
    assert "on cuda:0 (weights 15.0, gradients 15.0, AdamW 30.0" in message
    assert (
        "more than its 79.2 GiB: set optim.gradient_checkpointing: true (about 74.2 GiB)" in message
    )


def test_then_fewer_tokens_per_microbatch_then_lora() -> None:
    tight = int(72.5 * GIB)
    with pytest.raises(MemoryTooSmall, match=r"lower optim\.micro_batch_tokens to 8192"):
        check_fits(QWEN3_4B, settings(), capacity=tight, device="cuda:0", lora=False)
    with pytest.raises(
        MemoryTooSmall, match=r"set optim.gradient_checkpointing: true and lower optim.micro"
    ):
        check_fits(
            QWEN3_4B, settings(checkpointing=False), capacity=tight, device="cuda:0", lora=False
        )
    small = 40 * GIB
    with pytest.raises(MemoryTooSmall, match=r"train LoRA adapters instead \(lora: \{r: 16\}"):
        check_fits(QWEN3_4B, settings(), capacity=small, device="cuda:0", lora=False)
    with pytest.raises(MemoryTooSmall, match="use a device with more memory or a smaller model"):
        check_fits(QWEN3_4B, settings(), capacity=small, device="cuda:0", lora=True)
    with pytest.raises(MemoryTooSmall, match=r"reference model 15.0.*set grpo.kl_coef: 0"):
        check_fits(QWEN3_4B, settings(reference=True), capacity=small, device="cuda:0", lora=True)


def test_what_fits_passes_with_its_estimate() -> None:
    need = check_fits(QWEN3_4B, settings(), capacity=H100, device="cuda:0", lora=False)
    assert need.total < H100


def test_a_policy_too_large_for_the_device_stops_before_it_moves(tmp_path: Path) -> None:
    """A 32B-parameter shape (on ``meta``: no memory) against this machine's memory:
    the error comes from the estimate, before the model is moved to the CPU."""
    config = Qwen3Config(
        vocab_size=151_936,
        hidden_size=5120,
        intermediate_size=25600,
        num_hidden_layers=64,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
    )
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    policy = PolicySettings(
        device=torch.device("cpu"), precision=Precision.FLOAT32, micro_batch_tokens=16384
    )
    with pytest.raises(
        MemoryTooSmall, match=r"training needs about \d+\.\d GiB on cpu \(weights 12"
    ):
        prepare(model, policy)
    assert next(model.parameters()).device.type == "meta"
