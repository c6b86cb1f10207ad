"""``polar.distribution``: the one definition of a sampling distribution over logits,
checked against a plain per-row reading of its docstring (seeded property test)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.distribution import Settings, processed_logits, support
from polar.ir import Distribution
from polar.ir.behaviour import MODEL


def reference_support(logits: list[float], d: Distribution) -> set[int]:
    """Steps 1-4 of the module docstring, one token at a time."""
    scaled = [x / d.temperature for x in logits]
    top = max(scaled)
    total = sum(math.exp(x - top) for x in scaled)
    probs = [math.exp(x - top) / total for x in scaled]
    kept = set(range(len(logits)))
    if d.min_p > 0:
        kept = {i for i in kept if probs[i] >= d.min_p * max(probs)}
    if 0 < d.top_k < len(logits):
        kth = sorted((scaled[i] for i in kept), reverse=True)[: d.top_k][-1]
        kept = {i for i in kept if scaled[i] >= kth}
    if d.top_p < 1:
        mass = sum(probs[i] for i in kept)
        ascending = sorted(kept, key=lambda i: scaled[i])
        cumulative = 0.0
        for i in ascending[:-1]:
            cumulative += probs[i] / mass
            if cumulative <= 1 - d.top_p:
                kept.discard(i)
    return kept


distributions = st.builds(
    Distribution,
    temperature=st.floats(0.2, 2.0),
    top_p=st.one_of(st.just(1.0), st.floats(0.05, 0.999)),
    top_k=st.one_of(st.just(0), st.integers(1, 40)),
    min_p=st.one_of(st.just(0.0), st.floats(0.0, 0.5)),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    rows=st.lists(distributions, min_size=1, max_size=6),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_support_is_the_documented_one(rows: list[Distribution], seed: int) -> None:
    logits = torch.randn((len(rows), 50), generator=torch.Generator().manual_seed(seed)) * 3
    settings_ = Settings.of(rows)
    scaled = logits / settings_.temperature.unsqueeze(1)
    keep = support(scaled, settings_)
    for row, d in enumerate(rows):
        expected = reference_support(logits[row].tolist(), d)
        got = set(torch.nonzero(keep[row]).flatten().tolist())
        assert got == expected, f"seed {seed}, {d}: {sorted(got ^ expected)}"


def test_processed_logprobs_are_renormalised_over_the_support() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    d = Distribution(temperature=0.5, top_k=3)
    processed = torch.log_softmax(processed_logits(logits, Settings.of([d])), dim=-1)[0]
    kept = torch.log_softmax(logits[0, :3] / 0.5, dim=-1)
    assert torch.allclose(processed[:3], kept)
    assert torch.isinf(processed[3:]).all()
    # The model's own distribution is the plain log-softmax.
    model = torch.log_softmax(processed_logits(logits, Settings.of([MODEL])), dim=-1)
    assert torch.allclose(model, torch.log_softmax(logits, dim=-1))


def test_a_kept_tokens_logprob_is_differentiable_through_the_logits() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]], requires_grad=True)
    d = Distribution(temperature=0.7, top_p=0.8)
    processed = torch.log_softmax(processed_logits(logits, Settings.of([d])), dim=-1)
    processed[0, 0].backward()
    assert logits.grad is not None
    assert logits.grad[0, 0] > 0 and (logits.grad[0, 3] == 0)  # token 3 is outside the nucleus
