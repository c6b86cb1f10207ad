"""The reference trainer's step (``polar.train.step.train_step``) under each
precision: float32 master weights and optimizer state, the forward pass in
bfloat16 when asked (:mod:`polar.precision`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from polar.precision import Precision, load_master
from polar.train.batch import Row, advantages_of, group_from_result, microbatches, rows_of
from polar.train.grpo import Aggregation, Baseline, MissingLogprob
from polar.train.logprobs import token_logprobs
from polar.train.policy import PolicySettings, prepare
from polar.train.step import LossSettings, StepSettings, train_step

from support.logprobs import sequence_logprobs
from support.training import sample, session_result, task_result
from support.weights import GradientWatch

PROMPT = "<|im_start|>user\nRename the function a to alpha.<|im_end|>\n<|im_start|>assistant\n"
EPS = 1e-8
"""AdamW's default ``eps``: smaller gradients are damped by Adam's design (see GradientWatch)."""
ANSWERS = ("I renamed a to alpha in main.py.<|im_end|>", "Done.<|im_end|>")


def on_policy_rows(model: Any, tokenizer: Any) -> list[Row]:
    """One group of two sessions (rewards 1 and 0) whose recorded logprobs are the
    model's own in float32, as the engine serving these weights reports them."""
    prompt = list(tokenizer.encode(PROMPT, add_special_tokens=False))
    sessions = []
    for i, answer in enumerate(ANSWERS):
        response = list(tokenizer.encode(answer, add_special_tokens=False))
        logprobs = sequence_logprobs(model, prompt + response, len(prompt))
        sessions.append(
            session_result(
                f"s{i}",
                1.0 - i,
                [sample(f"s{i}", prompt, response, logprobs=logprobs)],
                index=i,
            )
        )
    group = group_from_result(task_result(sessions))
    advantages = advantages_of([group], baseline=Baseline.MEAN, scale_by_std=False)
    return rows_of(
        [group],
        advantages,
        aggregation=Aggregation.TOKEN_MEAN,
        missing_logprob=MissingLogprob.TRUST,
    )


def one_step(
    model: Any,
    rows: list[Row],
    precision: Precision = Precision.FLOAT32,
    *,
    lr: float = 1e-5,
    loss: LossSettings | None = None,
    ref_model: Any = None,
) -> tuple[dict[str, float], torch.optim.Optimizer]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, eps=EPS, weight_decay=0.0)
    metrics = train_step(
        model,
        optimizer,
        rows,
        loss=loss or LossSettings(),
        settings=StepSettings(pad_id=int(model.config.eos_token_id), precision=precision),
        policy_version=0,
        ref_model=ref_model,
    )
    return metrics, optimizer


def test_a_bfloat16_step_at_lr_1e_5_changes_every_weight_that_received_a_gradient(
    tiny_model: Path, tokenizer: Any
) -> None:
    model = load_master(tiny_model)
    rows = on_policy_rows(model, tokenizer)
    watch = GradientWatch(model, floor=EPS)
    metrics, optimizer = one_step(model, rows, Precision.BFLOAT16)
    watch.close()

    assert metrics["trainer/grad_norm"] > 0
    assert watch.compute_dtypes == {torch.bfloat16}, "the forward pass ran in bfloat16"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    for state in optimizer.state.values():
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    # the step's own logprobs (bfloat16) against the recorded float32 ones: close, not equal
    assert 0 < metrics["mismatch/mean_abs"] < 0.1
    changed = watch.changed_where_received(model)
    assert changed == 1.0, f"{changed:.1%} of the weights that received a gradient changed"

    # Weights kept in bfloat16 (what optim.dtype bfloat16 loaded before) lose most
    # of these updates: the same step leaves many of them as they were.
    pure = load_master(tiny_model).to(torch.bfloat16)
    watch = GradientWatch(pure, floor=EPS)
    one_step(pure, rows, Precision.FLOAT32)
    watch.close()
    assert watch.changed_where_received(pure) < 0.5


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_traces_get_the_logprobs_they_get_padded(
    tiny_model: Path, tokenizer: Any, attention: str
) -> None:
    """Traces of different lengths end to end in one row attend only within
    themselves: every trained token's logprob equals the padded batch's."""
    model = load_master(tiny_model)
    model.config._attn_implementation = attention
    rows = on_policy_rows(model, tokenizer)
    rows = [*rows, replace(rows[0], session="s2", ids=rows[0].ids[3:], start=rows[0].start - 3)]
    padded = microbatches(rows, max_tokens=4096, pad_id=0)
    packed = microbatches(rows, max_tokens=4096, pad_id=0, packed=True)
    assert len(padded) == len(packed) == 1 and packed[0].input_ids.shape[0] == 1
    assert packed[0].input_ids.numel() == packed[0].tokens < padded[0].input_ids.numel()
    with torch.no_grad():
        values = {
            name: token_logprobs(model, mb).values
            for name, (mb,) in (("padded", padded), ("packed", packed))
        }
    assert values["packed"].shape == values["padded"].shape
    # the same tokens, in the same order (rows are laid out longest first in both)
    assert torch.equal(packed[0].targets, padded[0].targets)
    assert torch.allclose(values["packed"], values["padded"], atol=1e-5)


def test_a_packed_step_trains_as_a_padded_one(tiny_model: Path, tokenizer: Any) -> None:
    model = load_master(tiny_model)
    rows = on_policy_rows(model, tokenizer)
    results = []
    for packed in (False, True):
        model = load_master(tiny_model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        settings = StepSettings(pad_id=0, packed=packed)
        metrics = train_step(
            model, optimizer, rows, loss=LossSettings(), settings=settings, policy_version=0
        )
        results.append((metrics, model.get_output_embeddings().weight.detach().clone()))
    (padded, w_padded), (packed, w_packed) = results
    assert packed["trainer/tokens"] == padded["trainer/tokens"]
    assert packed["trainer/grad_norm"] == pytest.approx(padded["trainer/grad_norm"], rel=1e-4)
    assert torch.allclose(w_packed, w_padded, atol=1e-6)


def test_gradient_checkpointing_trains_as_without_it(tiny_model: Path, tokenizer: Any) -> None:
    """``optim.gradient_checkpointing`` (through ``polar.train.policy.prepare``):
    each decoder layer recomputed in backward, the same step."""
    rows = on_policy_rows(load_master(tiny_model), tokenizer)
    results = []
    for checkpointing in (False, True):
        settings = PolicySettings(
            device=torch.device("cpu"),
            precision=Precision.FLOAT32,
            micro_batch_tokens=4096,
            gradient_checkpointing=checkpointing,
        )
        model = prepare(load_master(tiny_model), settings)
        assert model.is_activation_checkpointing is checkpointing
        metrics, _ = one_step(model, rows, Precision.FLOAT32)
        results.append((metrics, next(model.model.layers[0].parameters()).detach().clone()))
    (plain, w_plain), (checkpointed, w_checkpointed) = results
    assert checkpointed["trainer/grad_norm"] == pytest.approx(plain["trainer/grad_norm"], rel=1e-5)
    assert torch.allclose(w_checkpointed, w_plain, atol=1e-7)


def test_rows_of_advantage_0_are_measured_without_a_backward_pass_and_change_nothing(
    tiny_model: Path, tokenizer: Any
) -> None:
    """A group whose sessions scored alike (advantage 0) gets a forward pass only:
    the step trains as it does without those rows, and still measures them."""
    model = load_master(tiny_model)
    rows = on_policy_rows(model, tokenizer)
    alike = [replace(row, session=f"z{i}", advantage=0.0) for i, row in enumerate(rows)]
    results = []
    for given in (rows, [*alike, *rows]):
        model = load_master(tiny_model)
        metrics, _ = one_step(model, given, lr=1e-3)
        results.append((metrics, model.get_output_embeddings().weight.detach().clone()))
    (alone, w_alone), (mixed, w_mixed) = results
    assert alone["trainer/forward_only_tokens"] == 0
    assert mixed["trainer/forward_only_tokens"] == sum(len(row.ids) for row in alike)
    assert mixed["trainer/tokens"] == alone["trainer/tokens"] * 2
    assert mixed["mismatch/tokens"] == alone["mismatch/tokens"] * 2  # measured all the same
    assert mixed["trainer/grad_norm"] == pytest.approx(alone["trainer/grad_norm"], rel=1e-4)
    assert torch.allclose(w_mixed, w_alone, atol=1e-6)


def test_rows_of_advantage_0_keep_their_backward_pass_when_they_can_move_the_weights(
    tiny_model: Path, tokenizer: Any
) -> None:
    """With a KL term they have a gradient; a step with no other row (nothing to
    learn) runs as it always did."""
    model = load_master(tiny_model)
    rows = on_policy_rows(model, tokenizer)
    alike = [replace(row, session=f"z{i}", advantage=0.0) for i, row in enumerate(rows)]
    for given, loss, ref in (
        ([*alike, *rows], LossSettings(kl_coef=0.1), load_master(tiny_model)),
        (alike, LossSettings(), None),
    ):
        metrics, _ = one_step(model, given, loss=loss, ref_model=ref)
        assert metrics["trainer/forward_only_tokens"] == 0
        assert metrics["mismatch/tokens"] > 0
