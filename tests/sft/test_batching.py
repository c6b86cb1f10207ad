"""The pure pieces of fine-tuning: the step plan, padding, the loss over exactly
the labelled tokens (checked against the model's own full logits; chunked, the
same value and gradient), warm-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from polar.sft.batching import Batch, collate, learning_rate, loss_sum, micro_batches, step_plan
from polar.sft.export import IGNORE, TokenRow


def row(ids: list[int], trained: list[int]) -> TokenRow:
    labels = tuple(t if i in trained else IGNORE for i, t in enumerate(ids))
    return TokenRow("r", tuple(ids), labels, (1,) * len(ids))


def test_every_epoch_visits_every_row_once_in_a_seeded_order() -> None:
    plan = step_plan(10, batch_size=4, epochs=2, seed=7)
    assert [len(b) for b in plan] == [4, 4, 2, 4, 4, 2]
    first, second = plan[:3], plan[3:]
    assert sorted(i for b in first for i in b) == list(range(10))
    assert sorted(i for b in second for i in b) == list(range(10))
    assert first != second, "each epoch has its own order"
    assert step_plan(10, batch_size=4, epochs=2, seed=7) == plan
    assert step_plan(10, batch_size=4, epochs=2, seed=8) != plan
    assert step_plan(5, batch_size=2, epochs=1, seed=7, shuffle=False) == [[0, 1], [2, 3], [4]]
    assert micro_batches([5, 6, 7], 2) == [[5, 6], [7]]


def test_rows_are_right_padded_and_padding_is_never_a_label() -> None:
    batch = collate([row([5, 6, 7], [2]), row([8], [])], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch.labels.tolist() == [[IGNORE, IGNORE, 7], [IGNORE, IGNORE, IGNORE]]
    assert batch.labelled == 1


def reference_loss(model: Any, batch: Batch) -> float:
    """Cross-entropy from the model's full logits, shifted, -100 ignored, summed."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return float(
        torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
            batch.labels[:, 1:].reshape(-1),
            ignore_index=IGNORE,
            reduction="sum",
        )
    )


def test_the_loss_is_cross_entropy_on_exactly_the_labelled_tokens(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    rows = [row([10, 11, 12, 13, 14, 15], [3, 4]), row([20, 21, 22], [1, 2])]
    with torch.no_grad():
        together = collate(rows, pad_id=0)
        got = float(loss_sum(model, together))
        assert got == pytest.approx(reference_loss(model, together), rel=1e-5)
        alone = sum(float(loss_sum(model, collate([r], pad_id=0))) for r in rows)
        assert got == pytest.approx(alone, rel=1e-5), "padding changes nothing"
        unlabelled = collate([row([10, 11, 12], [])], pad_id=0)
        assert float(loss_sum(model, unlabelled)) == 0.0


def test_the_chunked_loss_has_the_value_and_gradient_of_the_whole(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    batch = collate(
        [row([10, 11, 12, 13, 14, 15, 16], [2, 3, 4, 5, 6]), row([20, 21, 22], [1, 2])], pad_id=0
    )  # 6 labelled positions

    def value_and_gradient(chunk: int) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = loss_sum(model, batch, chunk=chunk)
        loss.backward()
        return float(loss.detach()), [
            p.grad.clone() for p in model.parameters() if p.grad is not None
        ]

    whole, whole_grads = value_and_gradient(chunk=512)
    for chunk in (1, 4):  # every position alone; a chunk of 4 and one of 2
        value, grads = value_and_gradient(chunk)
        assert value == pytest.approx(whole, rel=1e-6)
        assert len(grads) == len(whole_grads)
        for got, expected in zip(grads, whole_grads, strict=True):
            # a hidden state's gradient sums over the 151,936-token vocabulary: another
            # kernel (one row at a time) moves it by about 1e-5 of its size
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_the_learning_rate_warms_up_linearly_then_stays() -> None:
    rates = [learning_rate(s, base=1.0, warmup_steps=4) for s in range(6)]
    assert rates == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert learning_rate(0, base=0.1, warmup_steps=0) == 0.1
