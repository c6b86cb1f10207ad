"""TRL's ``GRPOTrainer`` (1.16, installed) takes two real optimizer steps on
Polar's rollouts: the tiny model served by the embedded CPU engine, a rollout
server, a gateway node, and a real agent process per session in a bubblewrap
sandbox (``support.bridges``). The bridge is wired exactly as a user wires it:
``rollout_func=rollout_func(config)``, ``reward_funcs=[polar_reward]``.

What TRL computed its loss from is read in ``compute_loss`` (TRL's public
Trainer hook) and compared with the gateway's record store, rebuilt per
session without Polar's trajectory builder: prompt ids, completion ids,
``env_mask`` and the rollout logprobs token for token; the rewards TRL logged
and the advantages it used against Polar's scores. Weights are pushed to the
engine before each generation batch, so the second step's sessions are
sampled by the weights the first step produced, and the trainer's own
logprobs for those tokens match the engine's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import trl

from polar.bridges.rollouts import BridgeError, SessionSample
from polar.bridges.trl import (
    PolarRolloutFunc,
    identical_runs,
    polar_reward,
    rollout_func,
    trl_fields,
)
from polar.configfile import ConfigError
from polar.rollout.failure import FailureReason, SessionUse
from polar.rollout.protocol import SessionResult, SessionStatus

from support.bridges import BridgeStack, Expected, expected_from_records
from support.canned import GROUP_TASK, SCORED_IDS, TIMED_OUT_IDS
from support.rollout import CONTROL_TOKEN

pytestmark = [
    pytest.mark.slow,
    # TRL 1.16 still uses names transformers 5.23 deprecates (gradient_checkpointing).
    pytest.mark.filterwarnings("ignore:`.*` is deprecated and will be removed in v6:FutureWarning"),
]


class RecordingTrainer(trl.GRPOTrainer):
    """Keeps the batch each loss was computed from, and the sessions behind it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[dict[str, Any]] = []

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, **kw: Any
    ) -> Any:
        batch = {k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        sessions: list[SessionSample] = list(self.rollout_func.last)
        self.batches.append(
            {"tensors": batch, "sessions": sessions, "logps": logps_of(model, batch)}
        )
        return super().compute_loss(model, inputs, return_outputs, **kw)


def logps_of(model: Any, batch: dict[str, torch.Tensor]) -> list[list[float]]:
    """The model's logprob of each completion token, one unpadded sequence at a time."""
    out = []
    with torch.no_grad():
        for i in range(batch["prompt_ids"].size(0)):
            prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()]
            completion = batch["completion_ids"][i][batch["completion_mask"][i].bool()]
            ids = torch.cat([prompt, completion]).unsqueeze(0)
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            logps = torch.log_softmax(logits, dim=-1).gather(1, completion.unsqueeze(1))[:, 0]
            out.append(logps.tolist())
    return out


def rows(batch: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """TRL's padded batch back to one unpadded row per completion."""
    out = []
    for i in range(batch["prompt_ids"].size(0)):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        keep = batch["completion_mask"][i].bool()
        out.append(
            {
                "prompt_ids": prompt,
                "completion_ids": batch["completion_ids"][i][keep].tolist(),
                "env_mask": batch["tool_mask"][i][keep].tolist(),
                "logprobs": batch["sampling_per_token_logps"][i][keep].tolist(),
                "advantage": float(batch["advantages"][i]),
            }
        )
    return out


def key(ids: list[int], completion: list[int]) -> tuple[int, ...]:
    return (*ids, -1, *completion)


def test_two_grpo_steps_train_on_exactly_what_polar_recorded(
    stack: BridgeStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    node_gateway = stack.rollout.node_thread.gateway_url
    func = rollout_func(
        stack.config(
            weight_sync={
                "engine_url": stack.engine_url,
                "gateways": [{"url": node_gateway, "admin_token": CONTROL_TOKEN}],
                "directory": str(tmp_path / "weights"),
            }
        )
    )
    assert isinstance(func, PolarRolloutFunc)
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=2,
        learning_rate=1e-2,
        beta=0.0,
        use_cpu=True,
        bf16=False,  # TRL's default is bf16 autocast; the embedded engine computes in float32
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = RecordingTrainer(
        model=AutoModelForCausalLM.from_pretrained(str(stack.model_dir), dtype=torch.float32),
        reward_funcs=[polar_reward],
        args=args,
        train_dataset=Dataset.from_dict(
            {"prompt": ["rename-a", "rename-b", "fix-typo", "add-test"]}
        ),
        processing_class=AutoTokenizer.from_pretrained(str(stack.model_dir)),
        rollout_func=func,
    )
    trainer.train()
    func.close()

    assert trainer.state.global_step == 2
    assert len(trainer.batches) == 2
    logged = [h for h in trainer.state.log_history if "rewards/polar_reward/mean" in h]
    assert len(logged) == 2
    for step, (batch, log) in enumerate(zip(trainer.batches, logged, strict=True)):
        sessions: list[SessionSample] = batch["sessions"]
        assert len(sessions) == 4 and len({s.group_id for s in sessions}) == 2
        assert all(s.usable and s.traces == 1 for s in sessions), [s.session for s in sessions]

        # Rewards: what TRL logged and the advantages it trained with are Polar's scores.
        rewards = [s.reward for s in sessions]
        assert all(isinstance(r, float) for r in rewards)
        assert log["rewards/polar_reward/mean"] == pytest.approx(sum(rewards) / 4)
        advantage: dict[str, float] = {}
        for g in {s.group_id for s in sessions}:
            group = [s for s in sessions if s.group_id == g]
            scores = torch.tensor([s.reward for s in group])
            mean, std = scores.mean(), scores.std()
            for s in group:
                advantage[s.session.session_id] = float((s.reward - mean) / (std + 1e-4))

        # Tokens, masks, logprobs: TRL's batch equals the records, session for session.
        expected: dict[tuple[int, ...], tuple[str, Expected]] = {}
        for s in sessions:
            e = expected_from_records(stack.records(s.session.session_id))
            assert e.policy_versions == [step] * len(e.policy_versions)
            expected[key(e.prompt_ids, e.completion_ids)] = (s.session.session_id, e)
        got = rows(batch["tensors"])
        for r, logps in zip(got, batch["logps"], strict=True):
            r["trainer_logps"] = logps
        assert sorted(key(r["prompt_ids"], r["completion_ids"]) for r in got) == sorted(expected)
        for r in got:
            session_id, e = expected[key(r["prompt_ids"], r["completion_ids"])]
            assert r["env_mask"] == e.mask
            assert 0 in e.mask, "a multi-turn trace has environment tokens between the turns"
            for trl_value, polar_value, m in zip(r["logprobs"], e.logprobs, e.mask, strict=True):
                if m:
                    assert trl_value == torch.tensor(polar_value, dtype=torch.float32).item()
                else:
                    assert math.isnan(trl_value)
            assert r["advantage"] == pytest.approx(advantage[session_id], abs=1e-5)
            # The engine sampled with the weights the trainer had when it computed this loss.
            deltas = [
                abs(a - b)
                for a, b, m in zip(r["trainer_logps"], e.logprobs, e.mask, strict=True)
                if m and b is not None
            ]
            assert max(deltas) < 1e-3, f"step {step}: trainer vs engine logprob {max(deltas)}"

    weights = httpx.get(f"{stack.engine_url}/weights").json()
    assert weights["weights_version"] == 2  # pushed before step 1 and before step 2


def test_a_timeout_trains_with_reward_zero_and_infrastructure_failures_are_masked(
    canned_config: dict[str, Any],
    tiny_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One GRPO step of TRL on a group of four (``support.canned.mixed``): scored 1.0,
    timed out after its calls, the engine failed after a call, preparation failed."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    func = rollout_func(canned_config)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_steps=1,
        learning_rate=1e-3,
        beta=0.0,
        use_cpu=True,
        bf16=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = RecordingTrainer(
        model=AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32),
        reward_funcs=[polar_reward],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [GROUP_TASK]}),
        processing_class=tokenizer,
        rollout_func=func,
    )
    trainer.train()
    func.close()

    (batch,) = trainer.batches
    sessions: list[SessionSample] = batch["sessions"]
    assert [s.use for s in sessions] == [
        SessionUse.SCORED,
        SessionUse.FAILED,
        SessionUse.MASKED,
        SessionUse.MASKED,
    ]
    assert [s.failure for s in sessions] == [None, "timeout", "engine", "preparation"]
    assert [s.reward for s in sessions] == [1.0, 0.0, None, None]
    # TRL's reward: the mean over the scorable completions only (1.0 and the timeout's 0.0).
    (log,) = [h for h in trainer.state.log_history if "rewards/polar_reward/mean" in h]
    assert log["rewards/polar_reward/mean"] == pytest.approx(0.5)
    by_completion: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for r in rows(batch["tensors"]):
        by_completion.setdefault(tuple(r["completion_ids"]), []).append(r)
    eos = tokenizer.eos_token_id
    (scored_row,) = by_completion[SCORED_IDS]
    (timed_out_row,) = by_completion[TIMED_OUT_IDS]
    masked_rows = by_completion[(eos,)]
    assert len(masked_rows) == 2 and set(by_completion) == {SCORED_IDS, TIMED_OUT_IDS, (eos,)}
    # The timed-out trace is trained (its sampled tokens under the mask), against the group.
    assert timed_out_row["env_mask"] == [1] * len(TIMED_OUT_IDS)
    assert timed_out_row["advantage"] < 0 < scored_row["advantage"]
    assert timed_out_row["advantage"] == pytest.approx(-scored_row["advantage"])
    # The masked ones carry no token to train and no advantage.
    for r in masked_rows:
        assert r["env_mask"] == [0] and r["advantage"] == 0


def test_equal_consecutive_prompts_are_one_group() -> None:
    assert identical_runs(["a", "a", "b", "b", "a"]) == [(0, 2), (2, 2), (4, 1)]
    chat = [{"role": "user", "content": "a"}]
    assert identical_runs([chat, list(chat)]) == [(0, 2)]


def test_a_session_without_tokens_is_unscorable_for_trl() -> None:
    failed = SessionSample(
        SessionResult(
            session_id="s",
            task_id="t",
            sample_index=0,
            status=SessionStatus.ERROR,
            error="x",
            failure=FailureReason.PREPARATION,
        ),
        "g",
        None,
        0,
        0,
    )
    fields = trl_fields([failed], end_token=7)
    assert fields["prompt_ids"] == [[7]] and fields["completion_ids"] == [[7]]
    assert fields["env_mask"] == [[0]] and fields["logprobs"] == [[None]]
    assert fields["polar_reward"] == [None] and fields["polar_usable"] == [False]
    assert polar_reward(["p"], ["c"], polar_reward=[None]) == [None]


def test_polar_reward_refuses_a_trainer_wired_without_the_rollout_func() -> None:
    with pytest.raises(BridgeError, match="needs the rollout_func"):
        polar_reward(["p"], ["c"])
    with pytest.raises(BridgeError, match="1 scores for 2 completions"):
        polar_reward(["p", "p"], ["c", "d"], polar_reward=[1.0])
    with pytest.raises(ConfigError, match="no such file"):
        rollout_func("/nonexistent/trl-bridge.yaml")
