"""GRPO's maths against values worked out by hand (in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from polar.train.grpo import (
    Aggregation,
    Baseline,
    TraceShape,
    clipped_policy_loss,
    group_advantages,
    kl_k3,
    mismatch,
    tis_weights,
    trace_weights,
)

# ---------------------------------------------------------------- advantages


def test_mean_baseline_centres_the_group() -> None:
    # mean 0.5
    assert group_advantages([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]
    # mean 1/3
    assert group_advantages([1.0, 0.0, 0.0]) == pytest.approx([2 / 3, -1 / 3, -1 / 3])


def test_leave_one_out_compares_each_session_with_the_others() -> None:
    # 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5
    assert group_advantages([1.0, 0.0, 0.0], baseline=Baseline.LEAVE_ONE_OUT) == pytest.approx(
        [1.0, -0.5, -0.5]
    )
    # sum 2: 1 - 1/3 = 2/3, 0 - 2/3 = -2/3 (= n/(n-1) times the mean-baseline value)
    assert group_advantages([1.0, 0.0, 0.0, 1.0], baseline=Baseline.LEAVE_ONE_OUT) == pytest.approx(
        [2 / 3, -2 / 3, -2 / 3, 2 / 3]
    )


def test_std_scaling_divides_by_the_sample_std() -> None:
    # sample std of [1, 0, 0, 1] = sqrt((4 * 0.25) / 3) = 0.57735; 0.5 / 0.57735 = 0.866025
    assert group_advantages([1.0, 0.0, 0.0, 1.0], scale_by_std=True) == pytest.approx(
        [0.866025, -0.866025, -0.866025, 0.866025], abs=1e-6
    )
    # rewards 0.2 and 0.6: mean 0.4, std sqrt(0.08) = 0.282843; +-0.2 / 0.282843 = +-0.707107
    assert group_advantages([0.2, 0.6], scale_by_std=True) == pytest.approx(
        [-0.707107, 0.707107], abs=1e-6
    )


@pytest.mark.parametrize("baseline", list(Baseline))
@pytest.mark.parametrize("scale_by_std", [False, True])
def test_degenerate_groups_get_zero_advantage_never_a_blow_up(
    baseline: Baseline, scale_by_std: bool
) -> None:
    for rewards in ([1.0, 1.0, 1.0], [0.0, 0.0], [0.37] * 8, [0.9]):
        assert group_advantages(rewards, baseline=baseline, scale_by_std=scale_by_std) == [
            0.0
        ] * len(rewards)
    assert group_advantages([], baseline=baseline, scale_by_std=scale_by_std) == []
    # a spread far below eps: zeros with std scaling, the raw (tiny) differences without
    tiny = group_advantages([0.0, 1e-9], baseline=baseline, scale_by_std=scale_by_std)
    assert all(abs(a) < 1e-8 for a in tiny)


def test_non_finite_rewards_are_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, math.nan])


# ---------------------------------------------------------------- normalisation


def test_token_mean_weighs_every_loss_token_the_same() -> None:
    # session s1: traces of 3 and 1 tokens; s2: one of 2 tokens -> 6 tokens, 1/6 each
    traces = [TraceShape("s1", 3), TraceShape("s1", 1), TraceShape("s2", 2)]
    assert trace_weights(traces, Aggregation.TOKEN_MEAN) == pytest.approx([1 / 6] * 3)


def test_session_mean_counts_a_session_once_however_many_traces_it_has() -> None:
    # two sessions: each gets half the weight, spread over its own tokens
    # s1 (4 tokens over 2 traces): 1 / (2 * 4) per token; s2 (2 tokens): 1 / (2 * 2)
    traces = [TraceShape("s1", 3), TraceShape("s1", 1), TraceShape("s2", 2)]
    weights = trace_weights(traces, Aggregation.SESSION_MEAN)
    assert weights == pytest.approx([1 / 8, 1 / 8, 1 / 4])
    per_session = {"s1": 3 * weights[0] + 1 * weights[1], "s2": 2 * weights[2]}
    assert per_session == pytest.approx({"s1": 0.5, "s2": 0.5})
    # the same session as one trace of 4 tokens: the same weight per token
    merged = trace_weights([TraceShape("s1", 4), TraceShape("s2", 2)], Aggregation.SESSION_MEAN)
    assert merged == pytest.approx([1 / 8, 1 / 4])


@pytest.mark.parametrize("aggregation", list(Aggregation))
def test_sessions_without_loss_tokens_are_not_counted(aggregation: Aggregation) -> None:
    weights = trace_weights([TraceShape("s1", 2), TraceShape("s2", 0)], aggregation)
    assert weights[0] == pytest.approx(0.5)
    assert trace_weights([TraceShape("s1", 0)], aggregation) == [0.0]


# ---------------------------------------------------------------- the clipped loss


def test_clipped_loss_and_where_the_clip_removes_the_gradient() -> None:
    ln = math.log
    # ratios 1, 1.5, 1.5, 0.5, 0.5 against advantages +1, +1, -1, -1, +1; eps 0.2 / 0.28
    logprobs = torch.tensor([ln(0.4), ln(0.6), ln(0.6), ln(0.2), ln(0.2)], requires_grad=True)
    old = torch.tensor([ln(0.4), ln(0.4), ln(0.4), ln(0.4), ln(0.4)])
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0])
    loss, clipped = clipped_policy_loss(logprobs, old, advantages, clip_low=0.2, clip_high=0.28)
    # -min(r A, clip(r) A):
    #   r=1,   A=+1: -1
    #   r=1.5, A=+1: -min(1.5, 1.28)   = -1.28 (clipped)
    #   r=1.5, A=-1: -min(-1.5, -1.28) = 1.5
    #   r=0.5, A=-1: -min(-0.5, -0.8)  = 0.8   (clipped)
    #   r=0.5, A=+1: -min(0.5, 0.8)    = -0.5
    assert loss.tolist() == pytest.approx([-1.0, -1.28, 1.5, 0.8, -0.5], abs=1e-6)
    assert clipped.tolist() == [False, True, False, True, False]
    loss.sum().backward()
    # d(-r A)/d logprob = -r A where not clipped; 0 where clipped
    assert logprobs.grad is not None
    assert logprobs.grad.tolist() == pytest.approx([-1.0, 0.0, 1.5, 0.0, -0.5], abs=1e-6)


def test_low_and_high_clip_ranges_are_separate() -> None:
    old = torch.zeros(2)
    logprobs = torch.log(torch.tensor([1.25, 0.75]))
    # high range 0.3 does not bite at 1.25; low range 0.2 bites at 0.75 (A < 0)
    loss, clipped = clipped_policy_loss(
        logprobs, old, torch.tensor([1.0, -1.0]), clip_low=0.2, clip_high=0.3
    )
    assert loss.tolist() == pytest.approx([-1.25, 0.8], abs=1e-6)
    assert clipped.tolist() == [False, True]


# ---------------------------------------------------------------- truncated importance sampling


def test_tis_weights_truncate_at_the_cap_and_trust_tokens_without_a_logprob() -> None:
    ln = math.log
    old = torch.tensor([ln(0.5), ln(0.2), ln(0.9), ln(0.3)])
    rollout = torch.tensor([ln(0.25), ln(0.4), ln(0.9), 0.0], dtype=torch.float64)
    present = torch.tensor([True, True, True, False])
    weights = tis_weights(old, rollout, present, cap=1.5)
    # 0.5/0.25 = 2 -> capped at 1.5; 0.2/0.4 = 0.5; equal -> 1; missing -> 1
    assert weights.tolist() == pytest.approx([1.5, 0.5, 1.0, 1.0], abs=1e-6)
    assert not weights.requires_grad


def test_tis_weights_carry_no_gradient() -> None:
    old = torch.tensor([-1.0], requires_grad=True)
    weights = tis_weights(old, torch.tensor([-2.0]), torch.tensor([True]), cap=10.0)
    assert weights.tolist() == pytest.approx([math.e], abs=1e-6)
    assert weights.grad_fn is None


# ---------------------------------------------------------------- KL and mismatch


def test_k3_kl_estimator() -> None:
    ln = math.log
    # p = 0.5, q = 0.25: d = ln(0.5); exp(d) - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    kl = kl_k3(torch.tensor([ln(0.5), ln(0.3)]), torch.tensor([ln(0.25), ln(0.3)]))
    assert kl.tolist() == pytest.approx([0.193147, 0.0], abs=1e-6)


def test_mismatch_compares_only_tokens_with_a_recorded_logprob() -> None:
    trainer = torch.tensor([-1.0, -2.0, -3.0])
    rollout = torch.tensor([-1.1, -2.0, 9.0], dtype=torch.float64)
    gap = mismatch(trainer, rollout, torch.tensor([True, True, False]))
    # deltas (trainer - rollout): 0.1, 0; k3 of 0.1: exp(0.1) - 0.1 - 1 = 0.005171
    assert gap.tokens == 2
    assert gap.mean_abs == pytest.approx(0.05)
    assert gap.max_abs == pytest.approx(0.1)
    assert gap.kl == pytest.approx(0.005171 / 2, abs=1e-6)
    assert gap.k1 == pytest.approx(-0.05)
    empty = mismatch(trainer, rollout, torch.zeros(3, dtype=torch.bool))
    assert (empty.tokens, empty.mean_abs, empty.kl) == (0, 0.0, 0.0)
