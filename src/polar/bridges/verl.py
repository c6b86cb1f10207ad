"""verl: a Polar session as a verl agent loop (verl 0.9.1,
``verl/experimental/agent_loop/agent_loop.py``).

Wiring: an agent-loop config file (``actor_rollout_ref.rollout.agent.
agent_loop_config_path``) registers the loop, and the dataset's ``agent_name``
column (or ``rollout.agent.default_agent_loop``) picks it::

    - name: polar
      _target_: polar.bridges.verl.PolarAgentLoop
      polar_config: polar-bridge.yaml

verl builds one agent loop per sample and awaits its ``run``; the loop finds
the task the sample's ``raw_prompt`` names (:mod:`polar.bridges.rollouts`),
runs it as one Polar session (verl groups the ``rollout.n`` samples of a
prompt by its own ``uid``), and returns verl's ``AgentLoopOutput``:

- ``prompt_ids``: the trace's first prompt, as the engine received it;
- ``response_ids``: the rest of the prefix-merged trace (each call's sampled
  ids and, between them, the next prompt's new tokens);
- ``response_mask``: 1 on sampled ids, 0 on tool/environment tokens and on a
  sampled id the engine gave no logprob for (verl has no "missing": its
  rollout correction would read 0.0 as probability 1; counted in
  ``extra_fields["polar_missing_logprobs"]``);
- ``response_logprobs``: the engine's logprob of each sampled id (0.0 elsewhere;
  verl reads them only under the mask);
- ``reward_score``: Polar's score (verl then skips its own reward loop);
- ``extra_fields``: Polar's session, group and task ids, ``polar_usable``,
  ``polar_use`` and ``polar_failure``.

verl pads every sample to ``rollout.prompt_length`` / ``rollout.response_length``.
A response longer than that is cut to fit (``extra_fields["polar_truncated"]``
says how many tokens were dropped), as verl's own tool agent loop does; a prompt
longer than ``prompt_length`` is an error (cutting it would change what the
sampled tokens were conditioned on).

Failed sessions follow :mod:`polar.rollout.failure`: the agent's failure (a
timeout, its harness's exit, a sandbox limit) returns its partial trace,
trained with reward 0.0. A session the infrastructure failed or that was
cancelled (masked), or one that left no tokens, returns one end-of-sequence
token, masked out, and ``polar_usable`` false; verl wants a float score for
every sample and normalises over the ``uid`` group, so its placeholder 0.0
still counts in that group's baseline: set ``max_resamples`` in the bridge
config so the rollout server replaces sessions the infrastructure failed.

verl is imported only here, when verl itself loads this module.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
)

from polar.bridges.config import BridgeConfig, read_config
from polar.bridges.rollouts import (
    BridgeError,
    GroupRequest,
    PolarRollouts,
    SessionSample,
    group_sessions,
    logprob_loss_mask,
)

MASKED_SCORE = 0.0
"""The score of a sample with no token trained (verl wants a float)."""


def verl_output(
    session: SessionSample, *, prompt_length: int, response_length: int, end_token: int
) -> AgentLoopOutput:
    """One session as verl's ``AgentLoopOutput`` (see the module docstring)."""
    metrics = AgentLoopMetrics(generate_sequences=session.session.timings.get("running", 0.0))
    extra: dict[str, Any] = {
        "polar_session": session.session.session_id,
        "polar_task": session.session.task_id,
        "polar_group": session.group_id,
        "polar_status": session.session.status.value,
        "polar_usable": session.usable,
        "polar_use": session.use.value,
        "polar_failure": session.failure,
        "polar_truncated": 0,
        "polar_missing_logprobs": 0,
    }
    t = session.trace
    reward = session.reward  # None: masked
    if t is None or not t.response_ids or reward is None:
        return AgentLoopOutput(
            prompt_ids=list(t.prompt_ids) if t and t.prompt_ids else [end_token],
            response_ids=[end_token],
            response_mask=[0],
            response_logprobs=[0.0],
            reward_score=MASKED_SCORE,
            num_turns=0,
            metrics=metrics,
            extra_fields=extra,
        )
    if len(t.prompt_ids) > prompt_length:
        raise BridgeError(
            f"session {session.session.session_id}: its prompt has {len(t.prompt_ids)} tokens, "
            f"more than rollout.prompt_length ({prompt_length})"
        )
    keep = min(len(t.response_ids), response_length)
    mask = logprob_loss_mask(t)[:keep]
    extra["polar_truncated"] = len(t.response_ids) - keep
    extra["polar_policy_version"] = t.policy_version
    extra["polar_missing_logprobs"] = sum(t.loss_mask[:keep]) - sum(mask)
    return AgentLoopOutput(
        prompt_ids=list(t.prompt_ids),
        response_ids=list(t.response_ids[:keep]),
        response_mask=mask,
        response_logprobs=[
            v if m else 0.0 for v, m in zip(t.rollout_logprobs[:keep], mask, strict=True)
        ],
        reward_score=reward,
        num_turns=2 * len(t.turn_offsets),  # the user turn, then per call: reply, environment
        metrics=metrics,
        extra_fields=extra,
    )


class PolarAgentLoop(AgentLoopBase):  # type: ignore[misc]
    """verl's agent loop backed by Polar's rollout service (one session per sample)."""

    def __init__(self, *args: Any, polar_config: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if polar_config is None:
            raise BridgeError(
                "the polar agent loop needs `polar_config: <bridge config path>` in its "
                "entry of the agent-loop config file"
            )
        self.bridge = read_config(BridgeConfig, _plain(polar_config))

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        if "raw_prompt" not in kwargs:
            raise BridgeError("verl gave the polar agent loop no raw_prompt")
        started = time.monotonic()
        session = await asyncio.to_thread(self._session, kwargs["raw_prompt"], kwargs)
        output = verl_output(
            session,
            prompt_length=int(self.rollout_config.prompt_length),
            response_length=int(self.rollout_config.response_length),
            end_token=int(self.tokenizer.eos_token_id),
        )
        output.metrics.generate_sequences = time.monotonic() - started
        return output

    def _session(self, prompt: Any, kwargs: dict[str, Any]) -> SessionSample:
        with PolarRollouts(self.bridge) as rollouts:
            group = GroupRequest(
                task=rollouts.task_for(_plain(prompt)),
                num_samples=1,
                metadata={"trainer": "verl", "index": _jsonable(kwargs.get("index"))},
            )
            (result,) = rollouts.run([group])
            (session,) = group_sessions(result, self.bridge.trace)
            return session


def _plain(value: Any) -> Any:
    """numpy arrays and OmegaConf containers (what verl passes) as plain Python."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:
        return value
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _jsonable(value: Any) -> Any:
    value = _plain(value)
    return value if isinstance(value, str | int | float | bool | type(None)) else repr(value)
