"""TRL: Polar's rollouts as ``GRPOTrainer``'s ``rollout_func`` (TRL 1.16).

Wiring (the whole of it)::

    from polar.bridges.trl import polar_reward, rollout_func
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=tasks,
                          rollout_func=rollout_func("polar-trl.yaml"),
                          reward_funcs=[polar_reward])

The dataset's ``prompt`` column names Polar tasks (a task id or its
instruction, see :mod:`polar.bridges.rollouts`). TRL hands ``rollout_func``
the prompts of one generation batch, each already repeated
``num_generations`` times in a row; every run of identical consecutive
prompts becomes one Polar task with that many sessions (one GRPO group), all
groups run side by side, and the function returns one completion per prompt,
in order:

- ``prompt_ids``: the trace's first prompt, as the engine received it;
- ``completion_ids``: everything after it in the prefix-merged trace: each
  call's sampled ids and, between them, the next prompt's new tokens (tool
  output, user turns, template glue). ``prompt_ids + completion_ids`` is the
  last call's prompt plus what it sampled, so the forward pass conditions
  every sampled token on exactly what the model saw;
- ``env_mask``: the trace's loss mask (1 sampled, 0 tool/environment), which
  TRL multiplies into its completion mask;
- ``logprobs``: the engine's logprob of each sampled token; ``None`` (TRL:
  NaN, no importance correction) where Polar has none (interstitial tokens,
  or a sampled token the engine gave no finite logprob for);
- ``polar_reward`` and ``polar_*`` columns, which TRL passes to reward
  functions: :func:`polar_reward` returns Polar's score.

A session with several trainable traces delivers one (``trace: main``).
Failed sessions follow :mod:`polar.rollout.failure`: the agent's failure (a
timeout, its harness's exit, a sandbox limit) delivers its partial trace with
reward 0.0; a session the infrastructure failed or that was cancelled (masked),
or one with no trace, delivers one end-of-sequence token with ``env_mask`` 0
and a ``None`` reward, which TRL treats as unscorable (NaN, left out of the
group baseline, advantage 0): nothing of it is trained.

With ``weight_sync`` configured, the trainer's weights are pushed to the
embedded engine before each generation batch whose ``global_step`` differs
from the last push, and sessions are submitted with that step as their
``policy_version`` (:mod:`polar.bridges.weights`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polar.bridges.config import BridgeConfig, read_config
from polar.bridges.rollouts import (
    BridgeError,
    GroupRequest,
    PolarRollouts,
    SessionSample,
    group_sessions,
)
from polar.bridges.weights import WeightPusher, WeightSyncConfig
from polar.rollout.failure import SessionUse


class TRLBridgeConfig(BridgeConfig):
    weight_sync: WeightSyncConfig | None = None


def identical_runs(prompts: Sequence[Any]) -> list[tuple[int, int]]:
    """``(start, length)`` of each run of equal consecutive prompts."""
    runs: list[tuple[int, int]] = []
    for i, prompt in enumerate(prompts):
        if runs and prompts[runs[-1][0]] == prompt:
            start, length = runs[-1]
            runs[-1] = (start, length + 1)
        else:
            runs.append((i, 1))
    return runs


class PolarRolloutFunc:
    """The ``rollout_func``; :attr:`last` holds what the latest call returned, per prompt."""

    def __init__(self, config: TRLBridgeConfig, *, rollouts: PolarRollouts | None = None) -> None:
        self.config = config
        self.rollouts = rollouts or PolarRollouts(config)
        self.pusher = WeightPusher(config.weight_sync) if config.weight_sync else None
        self.last: list[SessionSample] = []

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        if not prompts:
            raise BridgeError("rollout_func got no prompts")
        step = int(trainer.state.global_step)
        version: int | None = None
        if self.pusher is not None:
            if self.pusher.pushed != step:
                self.pusher.push(trainer.accelerator.unwrap_model(trainer.model), step)
            version = step
        groups = [
            GroupRequest(
                task=self.rollouts.task_for(prompts[start]),
                num_samples=length,
                policy_version=version,
                metadata={"trainer": "trl", "global_step": step},
            )
            for start, length in identical_runs(prompts)
        ]
        results = self.rollouts.run(groups)
        sessions = [s for r in results for s in group_sessions(r, self.config.trace)]
        self.last = sessions
        return trl_fields(sessions, end_token=_end_token(trainer))

    def close(self) -> None:
        self.rollouts.close()


def trl_fields(sessions: Sequence[SessionSample], *, end_token: int) -> dict[str, list[Any]]:
    """TRL's rollout fields, one entry per session, in order."""
    out: dict[str, list[Any]] = {
        key: []
        for key in (
            "prompt_ids",
            "completion_ids",
            "logprobs",
            "env_mask",
            "polar_reward",
            "polar_session",
            "polar_status",
            "polar_group",
            "polar_usable",
            "polar_use",
            "polar_failure",
        )
    }
    for s in sessions:
        t = s.trace
        if t is None or not t.response_ids or s.use is SessionUse.MASKED:
            out["prompt_ids"].append(list(t.prompt_ids) if t and t.prompt_ids else [end_token])
            out["completion_ids"].append([end_token])
            out["logprobs"].append([None])
            out["env_mask"].append([0])
            out["polar_reward"].append(None)
        else:
            out["prompt_ids"].append(list(t.prompt_ids))
            out["completion_ids"].append(list(t.response_ids))
            out["logprobs"].append(
                [v if m else None for v, m in zip(t.rollout_logprobs, t.logprob_mask, strict=True)]
            )
            out["env_mask"].append(list(t.loss_mask))
            out["polar_reward"].append(s.reward)
        out["polar_session"].append(s.session.session_id)
        out["polar_status"].append(s.session.status.value)
        out["polar_group"].append(s.group_id)
        out["polar_usable"].append(s.usable)
        out["polar_use"].append(s.use.value)
        out["polar_failure"].append(s.failure)
    return out


def _end_token(trainer: Any) -> int:
    processing = trainer.processing_class
    tokenizer = getattr(processing, "tokenizer", processing)
    token = getattr(tokenizer, "eos_token_id", None)
    if not isinstance(token, int):
        raise BridgeError("the trainer's tokenizer has no eos_token_id (needed for placeholders)")
    return token


def rollout_func(config: str | Path | dict[str, Any] | TRLBridgeConfig) -> PolarRolloutFunc:
    """A ``rollout_func`` for ``GRPOTrainer`` from a bridge config (file, mapping or object)."""
    return PolarRolloutFunc(read_config(TRLBridgeConfig, config))


def polar_reward(
    prompts: list[Any],
    completions: list[Any],
    polar_reward: list[float | None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """Polar's score of each completion (``None``: the session was not scored)."""
    if polar_reward is None:
        raise BridgeError("polar_reward needs the rollout_func of polar.bridges.trl")
    if len(polar_reward) != len(completions):
        raise BridgeError(
            f"polar_reward has {len(polar_reward)} scores for {len(completions)} completions"
        )
    return list(polar_reward)
