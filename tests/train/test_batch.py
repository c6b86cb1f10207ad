"""From task results to rows and microbatches: advantages per session, applied to
every trace of it, normalised with the session counted once; staleness;
tensors that index exactly the trained tokens."""

from __future__ import annotations

import pytest
import torch

from polar.distribution import Settings
from polar.ir import Distribution
from polar.rollout.failure import FailureReason
from polar.rollout.protocol import SessionStatus, TaskResult
from polar.train.batch import (
    MicroBatch,
    Row,
    advantages_of,
    group_from_result,
    microbatches,
    reweighted,
    rows_of,
    split_by_session,
)
from polar.train.grpo import Aggregation, Baseline, MissingLogprob

from support.training import sample, session_result, task_result


def _group() -> TaskResult:
    # s1 (reward 1) ran across a weight push: two traces, versions 3 and 4;
    # s2 (reward 0): one trace; s3 errored (not in the group)
    s1 = [
        sample("s1", [1, 2], [3, 4, 5], version=3, segment=0),
        sample("s1", [1, 2, 3, 4, 5, 6], [7], version=4, segment=1),
    ]
    s2 = [sample("s2", [1, 2], [8, 9, 10, 11], version=4)]
    return task_result(
        [
            session_result("s1", 1.0, s1, index=0),
            session_result("s2", 0.0, s2, index=1),
            session_result("s3", None, [], status=SessionStatus.ERROR, index=2),
        ],
        version=3,
    )


def test_a_group_holds_its_usable_sessions_and_knows_its_oldest_token() -> None:
    group = group_from_result(_group())
    assert [s.session_id for s in group.sessions] == ["s1", "s2"]
    assert group.masked == 1
    assert group.rewards == [1.0, 0.0]
    assert group.oldest_version == 3
    assert group.staleness(3) == 0
    assert group.staleness(5) == 2


def test_the_agents_failures_train_as_zero_and_the_rest_are_masked() -> None:
    """``polar.rollout.failure``: a timeout keeps its partial trace and trains with
    reward 0.0; an engine failure's trace is not trained; a replaced session is not
    part of the group (its resample is)."""
    result = task_result(
        [
            session_result("ok", 1.0, [sample("ok", [1], [2, 3])], index=0),
            session_result(
                "slow", None, [sample("slow", [1], [4])], status=SessionStatus.TIMEOUT, index=1
            ),
            session_result(
                "broken",
                None,
                [sample("broken", [1], [5, 6, 7])],
                status=SessionStatus.ERROR,
                failure=FailureReason.ENGINE,
                index=2,
            ),
            session_result(
                "lost",
                None,
                [],
                status=SessionStatus.ERROR,
                failure=FailureReason.NODE_LOST,
                index=3,
            ),
            session_result("again", 0.5, [sample("again", [1], [8])], index=4),
        ]
    )
    result = result.model_copy(update={"replaced": ["lost"]})
    group = group_from_result(result)
    assert [(s.session_id, s.reward) for s in group.sessions] == [
        ("ok", 1.0),
        ("slow", 0.0),
        ("again", 0.5),
    ]
    assert (group.agent_failed, group.masked) == (1, 1)
    advantages = advantages_of([group], baseline=Baseline.MEAN, scale_by_std=False)
    rows = rows_of(
        [group],
        advantages,
        aggregation=Aggregation.TOKEN_MEAN,
        missing_logprob=MissingLogprob.TRUST,
    )
    assert [(r.session, r.loss_tokens) for r in rows] == [("ok", 2), ("slow", 1), ("again", 1)]
    assert advantages.by_session["slow"] == pytest.approx(-0.5)


def test_a_group_without_samples_is_as_old_as_its_submission() -> None:
    result = task_result([session_result("s1", 1.0, [])], version=7)
    assert group_from_result(result).staleness(9) == 2


def test_a_session_with_an_unreadable_sample_is_left_out_and_counted() -> None:
    good = session_result("s1", 1.0, [sample("s1", [1], [2])])
    bad = session_result("s2", 0.0, [sample("s2", [1], [2])])
    bad.samples[0]["loss_mask"] = [1, 1]  # longer than the response
    group = group_from_result(task_result([good, bad]))
    assert [s.session_id for s in group.sessions] == ["s1"]
    assert group.invalid_samples == 1


def test_every_trace_of_a_session_gets_its_advantage_and_the_session_counts_once() -> None:
    group = group_from_result(_group())
    advantages = advantages_of([group], baseline=Baseline.MEAN, scale_by_std=False)
    assert advantages.by_session == {"s1": 0.5, "s2": -0.5}
    rows = rows_of(
        [group],
        advantages,
        aggregation=Aggregation.SESSION_MEAN,
        missing_logprob=MissingLogprob.TRUST,
    )
    assert [(r.session, r.advantage, r.policy_version) for r in rows] == [
        ("s1", 0.5, 3),
        ("s1", 0.5, 4),
        ("s2", -0.5, 4),
    ]
    # session mean over 2 sessions: s1 has 3 + 1 loss tokens, s2 has 4
    assert [r.weight for r in rows] == pytest.approx([1 / 8, 1 / 8, 1 / 8])
    assert sum(r.weight * r.loss_tokens for r in rows if r.session == "s1") == pytest.approx(0.5)
    token_rows = rows_of(
        [group],
        advantages,
        aggregation=Aggregation.TOKEN_MEAN,
        missing_logprob=MissingLogprob.TRUST,
    )
    assert [r.weight for r in token_rows] == pytest.approx([1 / 8] * 3)


def test_class_reward_scale_multiplies_the_trace_advantage() -> None:
    result = task_result(
        [
            session_result(
                "a", 1.0, [sample("a", [1], [2]), sample("a", [5], [6], reward_scale=0.5)]
            ),
            session_result("b", 0.0, [sample("b", [1], [3])]),
        ]
    )
    group = group_from_result(result)
    advantages = advantages_of([group], baseline=Baseline.MEAN, scale_by_std=False)
    rows = rows_of(
        [group],
        advantages,
        aggregation=Aggregation.TOKEN_MEAN,
        missing_logprob=MissingLogprob.TRUST,
    )
    assert [r.advantage for r in rows] == [0.5, 0.25, -0.5]


def test_zero_advantage_groups_are_counted() -> None:
    same = task_result(
        [session_result(s, 1.0, [sample(s, [1], [2])], index=i) for i, s in enumerate("ab")]
    )
    mixed = group_from_result(_group())
    advantages = advantages_of(
        [group_from_result(same), mixed], baseline=Baseline.MEAN, scale_by_std=False
    )
    assert (advantages.zero_advantage_groups, advantages.groups) == (1, 2)


def test_tokens_without_a_logprob_are_trusted_or_dropped() -> None:
    s = sample("a", [1], [2, 3, 4], logprob_mask=[1, 0, 1])
    result = task_result(
        [session_result("a", 1.0, [s]), session_result("b", 0.0, [sample("b", [1], [2])])]
    )
    group = group_from_result(result)
    advantages = advantages_of([group], baseline=Baseline.MEAN, scale_by_std=False)
    trusted = rows_of(
        [group],
        advantages,
        aggregation=Aggregation.TOKEN_MEAN,
        missing_logprob=MissingLogprob.TRUST,
    )
    dropped = rows_of(
        [group], advantages, aggregation=Aggregation.TOKEN_MEAN, missing_logprob=MissingLogprob.DROP
    )
    assert trusted[0].loss_mask == (1, 1, 1)
    assert dropped[0].loss_mask == (1, 0, 1)
    # normalisation follows: 4 loss tokens when trusted, 3 when dropped
    assert trusted[0].weight == pytest.approx(1 / 4)
    assert dropped[0].weight == pytest.approx(1 / 3)


def test_minibatches_keep_sessions_whole_and_renormalise() -> None:
    group = group_from_result(_group())
    advantages = advantages_of([group], baseline=Baseline.MEAN, scale_by_std=False)
    rows = rows_of(
        [group],
        advantages,
        aggregation=Aggregation.TOKEN_MEAN,
        missing_logprob=MissingLogprob.TRUST,
    )
    parts = split_by_session(rows, 2)
    assert [[r.session for r in part] for part in parts] == [["s1", "s1"], ["s2"]]
    again = [reweighted(part, Aggregation.TOKEN_MEAN) for part in parts]
    assert [r.weight for r in again[0]] == pytest.approx([1 / 4, 1 / 4])
    assert [r.weight for r in again[1]] == pytest.approx([1 / 4])
    assert split_by_session(rows, 8) == [[rows[0], rows[1]], [rows[2]]]


def test_microbatches_index_the_logits_that_predict_each_trained_token() -> None:
    s = sample("a", [10, 11], [12, 13, 14], mask=[1, 0, 1], logprobs=[-0.5, 0.0, -0.25])
    result = task_result(
        [session_result("a", 1.0, [s]), session_result("b", 0.0, [sample("b", [20], [21])])]
    )
    group = group_from_result(result)
    advantages = advantages_of([group], baseline=Baseline.MEAN, scale_by_std=False)
    rows = rows_of(
        [group],
        advantages,
        aggregation=Aggregation.TOKEN_MEAN,
        missing_logprob=MissingLogprob.TRUST,
    )
    (mb,) = microbatches(rows, max_tokens=100, pad_id=0)
    assert mb.input_ids.tolist() == [[10, 11, 12, 13, 14], [20, 21, 0, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # token 12 (position 2) is predicted at position 1; token 14 (position 4) at 3
    assert list(zip(mb.rows.tolist(), mb.cols.tolist(), mb.targets.tolist(), strict=True)) == [
        (0, 1, 12),
        (0, 3, 14),
        (1, 0, 21),
    ]
    assert mb.rollout_logprobs.tolist() == [-0.5, -0.25, -1.0]
    assert mb.advantages.tolist() == [0.5, 0.5, -0.5]
    assert mb.tokens == 7
    # a budget of 5 tokens: one row each
    assert len(microbatches(rows, max_tokens=5, pad_id=0)) == 2
    assert torch.equal(
        microbatches(rows, max_tokens=5, pad_id=0)[1].input_ids, torch.tensor([[20, 21]])
    )


def _rows(*lengths: int) -> list[Row]:
    """Rows of one trained response token after ``n - 1`` prompt tokens each."""
    return [
        Row(
            session=f"s{i}",
            ids=tuple(range(100 * i, 100 * i + n)),
            start=n - 1,
            loss_mask=(1,),
            rollout_logprobs=(-0.5,),
            logprob_mask=(1,),
            advantage=1.0,
            weight=0.25,
            policy_version=3,
            sampling=Distribution(0.7, 0.9, 20, 0.0),
        )
        for i, n in enumerate(lengths)
    ]


def test_a_microbatch_moves_every_tensor_to_the_device_sampling_settings_included() -> None:
    """On the ``meta`` device, which this CPU has: each tensor field, found by
    walking the dataclass, so a field added later is checked too."""
    for packed in (False, True):
        (mb,) = microbatches(_rows(3, 2), max_tokens=100, pad_id=0, packed=packed)
        moved = mb.to(torch.device("meta"))
        tensors = {
            name: getattr(moved, name)
            for name in MicroBatch.__dataclass_fields__
            if isinstance(getattr(moved, name), torch.Tensor)
        }
        tensors |= {
            f"sampling.{name}": getattr(moved.sampling, name)
            for name in Settings.__dataclass_fields__
        }
        assert len(tensors) == (11 if packed else 12) + 4 - 1  # no attention mask when packed
        assert {name: t.device.type for name, t in tensors.items()} == dict.fromkeys(
            tensors, "meta"
        )
        assert moved.tokens == mb.tokens == 5


def test_packed_microbatches_put_traces_end_to_end_without_padding() -> None:
    rows = _rows(3, 2, 4)
    mbs = microbatches(rows, max_tokens=7, pad_id=0, packed=True)
    # first fit, longest first: [4, 3] fills 7; [2] opens a second pass
    assert [mb.input_ids.tolist() for mb in mbs] == [
        [[200, 201, 202, 203, 0, 1, 2]],
        [[100, 101]],
    ]
    first = mbs[0]
    assert first.attention_mask is None
    assert first.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    # each trace's last token is trained, predicted from the position before it
    assert first.cols.tolist() == [2, 5] and first.targets.tolist() == [203, 2]
    assert first.tokens == 7
    # the same rows padded: [4] alone, then [3, 2] padded to 3 (one position wasted)
    padded = microbatches(rows, max_tokens=7, pad_id=0)
    assert [mb.input_ids.numel() for mb in padded] == [4, 6]
    assert [mb.tokens for mb in padded] == [4, 5]
