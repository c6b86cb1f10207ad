"""The slime bridge against slime's contract, taken from its public source.

slime does not install here (its PyPI name is an empty placeholder and it
needs Megatron and SGLang on a GPU), so this test follows slime 0.3.1
(THUDM/slime at 624b824) without importing it:

- ``slime/utils/types.py``: ``Sample`` (the fields below, their types and
  defaults; ``Sample.Status``), rebuilt as :class:`SlimeSample`;
- ``slime/rollout/data_source.py``: ``RolloutDataSource.get_samples`` gives
  ``rollout_batch_size`` groups of ``n_samples_per_prompt`` deep copies of a
  prompt sample, numbered by ``group_index`` and ``index`` (:class:`DataSource`);
- ``slime/ray/rollout.py``: ``_get_rollout_data`` flattens the rollout
  function's nested lists, and ``_convert_samples_to_train_data`` builds the
  training columns (``tokens``, ``response_lengths``, ``loss_masks`` checked
  against ``response_length``, ``rollout_log_probs``, rewards)
  (:func:`train_data`).

Everything on Polar's side is real: the rollout server, a gateway node, real
agent processes in the bubblewrap sandbox, the embedded engine. The training
columns slime would build are compared, token for token, with the gateway's
records (rebuilt without Polar's trajectory builder).
"""

from __future__ import annotations

import copy
import itertools
from argparse import Namespace
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pytest

from polar.bridges.rollouts import BridgeError
from polar.bridges.slime import SlimeRollout, generate_rollout, slime_samples, slime_shape
from polar.configfile import ConfigError
from polar.ir.behaviour import MODEL
from polar.rollout.failure import FailureReason
from polar.rollout.protocol import SessionResult, SessionStatus
from polar.trajectory import ChainClass, TurnSpan, row_of
from polar.trajectory import Sample as PolarSample

from support.bridges import (
    BETWEEN,
    FIRST_CALL,
    INSTRUCTIONS,
    LOGPROBS,
    PROMPT,
    SECOND_CALL,
    BridgeStack,
    expected_from_records,
    session_missing_a_logprob,
)
from support.canned import ENGINE_FAILED_IDS, GROUP_TASK, SCORED_IDS, TIMED_OUT_IDS
from support.canned import PROMPT as CANNED_PROMPT


@dataclass
class SlimeSample:
    """slime's ``Sample`` (the fields a rollout function reads or sets)."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    remove_sample: bool = False

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None


class DataSource:
    """slime's ``RolloutDataSource.get_samples`` over a fixed list of prompts."""

    def __init__(self, prompts: list[Any], n_samples_per_prompt: int) -> None:
        self.prompts = prompts
        self.n = n_samples_per_prompt
        self.offset = self.group_index = self.index = 0

    def get_samples(self, num_samples: int) -> list[list[SlimeSample]]:
        groups = []
        for prompt in self.prompts[self.offset : self.offset + num_samples]:
            group = []
            for _ in range(self.n):
                sample = copy.deepcopy(SlimeSample(prompt=prompt, label="x"))
                sample.group_index, sample.index = self.group_index, self.index
                self.index += 1
                group.append(sample)
            self.group_index += 1
            groups.append(group)
        self.offset += num_samples
        return groups


def train_data(output: Any) -> dict[str, list[Any]]:
    """What slime's rollout manager makes of a rollout function's output."""
    data = output.samples if hasattr(output, "samples") else output
    while isinstance(data[0], list):
        data = list(itertools.chain.from_iterable(data))
    assert all(isinstance(s, SlimeSample) for s in data)
    for s in data:
        assert s.loss_mask is not None and len(s.loss_mask) == s.response_length
        assert s.rollout_log_probs is not None
        assert len(s.rollout_log_probs) == s.response_length
        assert isinstance(s.reward, float)
        assert s.status in (SlimeSample.Status.COMPLETED, SlimeSample.Status.TRUNCATED)
    return {
        "tokens": [s.tokens for s in data],
        "response_lengths": [s.response_length for s in data],
        "rewards": [s.reward for s in data],
        "loss_masks": [s.loss_mask for s in data],
        "rollout_log_probs": [s.rollout_log_probs for s in data],
        "sample_indices": [s.index for s in data],
        "sessions": [s.session_id for s in data],
        "groups": [s.metadata["polar_group"] for s in data],
        "tasks": [s.metadata["polar_task"] for s in data],
    }


def test_slime_trains_on_the_ids_polar_recorded(stack: BridgeStack) -> None:
    args = Namespace(polar_config=stack.config(), rollout_batch_size=2, n_samples_per_prompt=2)
    # A prompt names its task by id, or by its instruction as chat messages.
    source = DataSource(["rename-a", [{"role": "user", "content": INSTRUCTIONS["fix-typo"]}]], 2)
    data = train_data(generate_rollout(args, 0, source))

    assert data["sample_indices"] == [0, 1, 2, 3]
    assert len(set(data["sessions"])) == 4
    assert data["groups"][0] == data["groups"][1] != data["groups"][2] == data["groups"][3]
    for i, session_id in enumerate(data["sessions"]):
        e = expected_from_records(stack.records(session_id))
        tokens, n = data["tokens"][i], data["response_lengths"][i]
        assert tokens[: len(tokens) - n] == e.prompt_ids
        assert tokens[len(tokens) - n :] == e.completion_ids
        assert data["loss_masks"][i] == e.mask
        assert 0 in e.mask  # two calls: environment tokens between them are not trained
        for value, polar, m in zip(data["rollout_log_probs"][i], e.logprobs, e.mask, strict=True):
            assert value == (polar if m else 0.0)
    rewards = stack.session_rewards(data["tasks"])
    assert data["rewards"] == [rewards[s] for s in data["sessions"]]

    # The bridge is built once and kept on slime's args for the next rollouts.
    assert isinstance(args.polar_rollout, SlimeRollout)
    args.polar_rollout.rollouts.close()


def test_a_timeout_trains_with_reward_zero_and_infrastructure_failures_are_masked(
    canned_config: dict[str, Any],
) -> None:
    """A group of four (``support.canned.mixed``): scored 1.0, timed out after its
    calls, the engine failed after a call, preparation failed."""
    args = Namespace(polar_config=canned_config, rollout_batch_size=1, n_samples_per_prompt=4)
    output = generate_rollout(args, 0, DataSource([GROUP_TASK], 4))
    _, metrics = args.polar_rollout(DataSource([GROUP_TASK], 4).get_samples(1), 1)
    args.polar_rollout.rollouts.close()
    assert (metrics["polar/scored"], metrics["polar/agent_failed"], metrics["polar/masked"]) == (
        1,
        1,
        2,
    )
    ((scored, timed_out, engine, unprepared),) = output
    status = SlimeSample.Status

    assert not scored.remove_sample and scored.status is status.COMPLETED
    assert scored.reward == 1.0 and scored.tokens == [*CANNED_PROMPT, *SCORED_IDS]
    # The agent's failure: its partial trace trained with reward 0.0.
    assert not timed_out.remove_sample and timed_out.status is status.TRUNCATED
    assert timed_out.reward == 0.0 and timed_out.tokens == [*CANNED_PROMPT, *TIMED_OUT_IDS]
    assert timed_out.loss_mask == [1] * len(TIMED_OUT_IDS)
    assert timed_out.metadata["polar_failure"] == "timeout"
    # Not the agent's: removed (slime zeroes their loss mask), status FAILED.
    assert engine.remove_sample and engine.status is status.FAILED
    assert engine.tokens == [*CANNED_PROMPT, *ENGINE_FAILED_IDS] and engine.reward == 0.0
    assert engine.metadata["polar_failure"] == "engine"
    assert engine.metadata["polar_use"] == "masked"
    assert unprepared.remove_sample and unprepared.status is status.FAILED
    assert unprepared.tokens == [] and unprepared.metadata["polar_failure"] == "preparation"
    assert output == [[scored, timed_out, engine, unprepared]]


def test_slime_bad_wiring_is_one_clear_error(stack: BridgeStack) -> None:
    with pytest.raises(ConfigError, match="polar_config"):
        generate_rollout(Namespace(rollout_batch_size=1), 0, DataSource(["rename-a"], 1))
    args = Namespace(polar_config=stack.config(), rollout_batch_size=1)
    with pytest.raises(BridgeError, match="no task has the id or instruction 'nope'"):
        generate_rollout(args, 0, DataSource(["nope"], 2))
    with pytest.raises(BridgeError, match="evaluation"):
        generate_rollout(args, 0, DataSource(["rename-a"], 2), evaluation=True)
    args.polar_rollout.rollouts.close()


def polar_sample(session_id: str, chain: int, chain_class: ChainClass) -> dict[str, Any]:
    """An export row of a two-call trace (prompt 3 tokens, then 2 + 1 + 2)."""
    return row_of(
        PolarSample(
            trace_id=f"{session_id}-{chain}",
            session_id=session_id,
            group_id="g",
            builder="prefix_merge",
            chain=chain,
            segment=0,
            chain_class=chain_class,
            break_reason=None,
            trainable=True,
            policy_version=3,
            prompt_ids=(1, 2, 3),
            response_ids=(10, 11, 50, 12, 13),
            loss_mask=(1, 1, 0, 1, 1),
            rollout_logprobs=(-0.5, -0.25, 0.0, -1.0, -2.0),
            logprob_mask=(1, 1, 0, 1, 1),
            reward=1.0,
            reward_scale=1.0,
            finish_reason=None,
            source_records=("r1", "r2"),
            turn_offsets=(TurnSpan("r1", 0, 0, 2), TurnSpan("r2", 2, 3, 5)),
            truncated_turns=0,
            malformed_tool_calls=0,
            sampling=MODEL,
        )
    )


def session(session_id: str, index: int, rows: list[dict[str, Any]], **kw: Any) -> SessionResult:
    return SessionResult(
        session_id=session_id,
        task_id="t",
        sample_index=index,
        status=kw.pop("status", SessionStatus.COMPLETED),
        reward=kw.pop("reward", 1.0),
        samples=rows,
        **kw,
    )


def test_a_session_with_several_traces_takes_slimes_compact_shape() -> None:
    source = DataSource(["rename-a"], 3)
    (templates,) = source.get_samples(1)
    sessions = [
        session("s0", 0, [polar_sample("s0", 0, ChainClass.MAIN)]),
        session(
            "s1",
            1,
            [polar_sample("s1", 0, ChainClass.MAIN), polar_sample("s1", 1, ChainClass.SUB_AGENT)],
        ),
        session(
            "s2",
            2,
            [],
            status=SessionStatus.ERROR,
            reward=None,
            error="agent crashed",
            failure=FailureReason.HARNESS,
        ),
    ]
    shaped = slime_shape([slime_samples(templates, sessions, "g")])
    (group,) = shaped
    assert [len(traces) for traces in group] == [1, 2, 1]
    first, (main, sub), (failed,) = group[0][0], group[1], group[2]
    for s in (first, main, sub):
        assert s.tokens == [1, 2, 3, 10, 11, 50, 12, 13] and s.response_length == 5
        assert s.loss_mask == [1, 1, 0, 1, 1]
        assert s.rollout_log_probs == [-0.5, -0.25, 0.0, -1.0, -2.0]
        assert s.weight_versions == ["3"] and s.status is SlimeSample.Status.COMPLETED
    assert main is not sub and main.rollout_id == sub.rollout_id == 1  # counted once by slime
    assert first.rollout_id is None  # slime falls back to the sample index
    assert failed.remove_sample and failed.reward == 0.0 and failed.tokens == []
    assert failed.status is SlimeSample.Status.FAILED
    assert failed.metadata["polar_error"] == "agent crashed"
    # Without such a session, the default shape: one sample per session.
    (templates,) = DataSource(["rename-a"], 1).get_samples(1)
    plain = slime_shape([slime_samples(templates, sessions[:1], "g")])
    assert plain == [[templates[0]]]


def test_a_sampled_token_without_a_logprob_is_not_trained_by_slime() -> None:
    """slime's importance correction reads ``rollout_log_probs`` under the loss
    mask, and a 0.0 there claims probability 1: such a token is masked out."""
    (templates,) = DataSource(["rename-a"], 1).get_samples(1)
    shaped = slime_shape([slime_samples(templates, [session_missing_a_logprob()], "g")])
    data = train_data(shaped)
    assert data["tokens"] == [[*PROMPT, *FIRST_CALL, *BETWEEN, *SECOND_CALL]]
    # 10 trained, 11 (no logprob) and 50 (the environment's) not, 12 and 13 trained
    assert data["loss_masks"] == [[1, 0, 0, 1, 1]]
    assert data["rollout_log_probs"] == [[LOGPROBS[10], 0.0, 0.0, LOGPROBS[12], LOGPROBS[13]]]
    assert shaped[0][0].metadata["polar_missing_logprobs"] == 1
