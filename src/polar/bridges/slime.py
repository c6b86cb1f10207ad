"""slime: Polar's groups as slime's custom rollout function.

Follows slime 0.3.1 (THUDM/slime at 624b824): ``slime/utils/types.py``
(``Sample``), ``slime/rollout/base_types.py`` (``RolloutFnTrainOutput``) and
``slime/ray/rollout.py`` (how the output is flattened and checked). Wiring,
in slime's arguments::

    --rollout-function-path polar.bridges.slime.generate_rollout
    --custom-config-path polar-slime.yaml      # holds `polar_config: polar-bridge.yaml`

(``polar_config`` may also be the bridge config itself, as a mapping.)

slime's data source hands over ``rollout_batch_size`` groups of
``n_samples_per_prompt`` copies of a prompt sample; each group becomes one
Polar task whose prompt names it (:mod:`polar.bridges.rollouts`), and each
session fills the copy at its sample index, in place, as slime's own rollout
does: ``tokens`` (prompt then response ids, as the gateway recorded them),
``response_length``, ``loss_mask`` (1 sampled, 0 tool/environment, and 0 on
a sampled token the engine gave no logprob for: slime's importance
correction would read 0.0 as probability 1; counted in ``metadata
["polar_missing_logprobs"]`` and the rollout's ``polar/missing_logprobs``),
``rollout_log_probs`` (the engine's, 0.0 where the token is not trained),
``reward``, ``status``, ``weight_versions``, ``session_id``, and Polar's ids in
``metadata``. No slime import is needed: the bridge fills slime's own objects.

slime trains several sequences per rollout: when a session has more than one
trainable trace (a sub-agent, a compaction restart), it delivers every trace,
each a copy of the sample sharing its ``rollout_id``, and the output takes
slime's compact shape (``list[list[list[Sample]]]``, group x session x trace).
Failed sessions follow :mod:`polar.rollout.failure`. The agent's failure (a
timeout, its harness's exit, a sandbox limit) is delivered with its partial
traces, reward 0.0 and status ``TRUNCATED``, and trained. A session the
infrastructure failed (status ``FAILED``) or that was cancelled (``ABORTED``)
is masked: ``remove_sample`` set, so slime zeroes its loss mask; its reward is
a placeholder 0.0, which slime's group normalisation still counts: set
``max_resamples`` in the bridge config to have the rollout server replace such
sessions. A session that left no tokens is delivered with no tokens and
``remove_sample`` set (its reward still the policy's: 0.0 for the agent's
failure, counted in the group).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, assert_never

from polar.bridges.config import BridgeConfig, read_config
from polar.bridges.rollouts import (
    BridgeError,
    GroupRequest,
    PolarRollouts,
    current_sessions,
    logprob_loss_mask,
    missing_logprobs,
    trace_reward,
    traces_of,
)
from polar.configfile import ConfigError
from polar.rollout.failure import Fault, SessionUse, session_use
from polar.rollout.protocol import SessionResult
from polar.trajectory import Sample as PolarSample

MASKED_REWARD = 0.0
"""The reward of a masked sample (``remove_sample``: slime wants a float)."""


def slime_samples(
    templates: Sequence[Any], sessions: Sequence[SessionResult], group_id: str
) -> list[list[Any]]:
    """Each session's samples (one per trainable trace), filled from slime's templates."""
    if len(templates) != len(sessions):
        raise BridgeError(f"{len(sessions)} sessions for {len(templates)} slime samples")
    out = []
    for template, session in zip(templates, sessions, strict=True):
        traces = traces_of(session)
        if not traces:
            out.append([_without_tokens(template, session, group_id)])
            continue
        filled = []
        for i, trace in enumerate(traces):
            sample = template if len(traces) == 1 else copy.deepcopy(template)
            _fill(sample, session, trace, group_id, i, len(traces))
            filled.append(sample)
        out.append(filled)
    return out


def slime_shape(per_group: list[list[list[Any]]]) -> list[Any]:
    """slime's default shape (group x sample) when every session gave one sample, else
    its compact shape (group x session x trace), whose siblings share a ``rollout_id``."""
    if any(len(traces) > 1 for group in per_group for traces in group):
        return per_group
    return [[traces[0] for traces in group] for group in per_group]


def _status(sample: Any, session: SessionResult, trace: PolarSample | None) -> Any:
    """slime's status: COMPLETED (TRUNCATED when a turn hit its output limit) when
    scored, TRUNCATED for the agent's failure, FAILED when the infrastructure failed
    it, ABORTED when cancelled."""
    if not session.status.terminal:
        raise BridgeError(f"session {session.session_id} has not ended ({session.status})")
    status = type(sample).Status
    match session_use(session):
        case SessionUse.SCORED:
            truncated = trace is not None and trace.truncated_turns > 0
            return status.TRUNCATED if truncated else status.COMPLETED
        case SessionUse.FAILED:
            return status.TRUNCATED
        case SessionUse.MASKED:
            cancelled = session.failure is not None and session.failure.fault is Fault.NONE
            return status.ABORTED if cancelled else status.FAILED
        case unreachable:
            assert_never(unreachable)


def _reward(session: SessionResult, trace: PolarSample | None) -> float:
    reward = trace_reward(session, trace)
    return MASKED_REWARD if reward is None else reward


def _metadata(sample: Any, session: SessionResult, group_id: str) -> dict[str, Any]:
    return {
        **(sample.metadata or {}),
        "polar_session": session.session_id,
        "polar_task": session.task_id,
        "polar_group": group_id,
        "polar_status": session.status.value,
        "polar_use": session_use(session).value,
        "polar_failure": session.failure.value if session.failure is not None else None,
    }


def _fill(
    sample: Any, session: SessionResult, trace: PolarSample, group_id: str, i: int, n: int
) -> None:
    sample.tokens = [*trace.prompt_ids, *trace.response_ids]
    sample.response_length = len(trace.response_ids)
    sample.loss_mask = logprob_loss_mask(trace)
    sample.rollout_log_probs = [
        v if m else 0.0 for v, m in zip(trace.rollout_logprobs, sample.loss_mask, strict=True)
    ]
    sample.reward = _reward(session, trace)
    sample.status = _status(sample, session, trace)
    sample.weight_versions = [str(trace.policy_version)]
    sample.session_id = session.session_id
    sample.remove_sample = session_use(session) is SessionUse.MASKED
    sample.metadata = {
        **_metadata(sample, session, group_id),
        "polar_trace": trace.trace_id,
        "polar_traces": n,
        "polar_missing_logprobs": missing_logprobs(trace),
    }
    if n > 1:
        sample.rollout_id = sample.index  # siblings of one rollout: counted once by slime
        sample.metadata["polar_trace_index"] = i


def _without_tokens(sample: Any, session: SessionResult, group_id: str) -> Any:
    sample.tokens = []
    sample.response_length = 0
    sample.loss_mask = []
    sample.rollout_log_probs = []
    sample.reward = _reward(session, None)
    sample.status = _status(sample, session, None)
    sample.session_id = session.session_id
    sample.remove_sample = True
    sample.metadata = {**_metadata(sample, session, group_id), "polar_error": session.error}
    return sample


class SlimeRollout:
    """Runs slime's prompt groups as Polar tasks (one instance per rollout manager)."""

    def __init__(self, config: BridgeConfig, *, rollouts: PolarRollouts | None = None) -> None:
        self.config = config
        self.rollouts = rollouts or PolarRollouts(config)

    def __call__(
        self, groups: Sequence[Sequence[Any]], rollout_id: int
    ) -> tuple[list[Any], dict[str, Any]]:
        """The samples in slime's shape, and metrics for slime's log."""
        if not groups or any(not g for g in groups):
            raise BridgeError("slime's data source gave an empty group")
        requests = [
            GroupRequest(
                task=self.rollouts.task_for(group[0].prompt),
                num_samples=len(group),
                metadata={"trainer": "slime", "rollout_id": rollout_id},
            )
            for group in groups
        ]
        results = self.rollouts.run(requests)
        per_group = [
            slime_samples(group, current_sessions(result), result.group_id)
            for group, result in zip(groups, results, strict=True)
        ]
        samples = slime_shape(per_group)
        sessions = [s for r in results for s in current_sessions(r)]
        metrics = {
            "polar/sessions": len(sessions),
            "polar/scored": sum(session_use(s) is SessionUse.SCORED for s in sessions),
            "polar/agent_failed": sum(session_use(s) is SessionUse.FAILED for s in sessions),
            "polar/masked": sum(session_use(s) is SessionUse.MASKED for s in sessions),
            "polar/traces": sum(len(t) for g in per_group for t in g),
            "polar/missing_logprobs": sum(
                missing_logprobs(trace) for s in sessions for trace in traces_of(s)
            ),
        }
        return samples, metrics


def _rollout_for(args: Any) -> SlimeRollout:
    """The bridge, built on the first rollout and kept on slime's args namespace."""
    rollout = getattr(args, "polar_rollout", None)
    if isinstance(rollout, SlimeRollout):
        return rollout
    source = getattr(args, "polar_config", None)
    if source is None:
        raise ConfigError(
            "slime args have no polar_config: add `polar_config: <bridge config path>` "
            "to the file given as --custom-config-path"
        )
    rollout = SlimeRollout(read_config(BridgeConfig, _as_source(source)))
    args.polar_rollout = rollout
    return rollout


def _as_source(value: Any) -> str | Path | dict[str, Any]:
    if isinstance(value, str | Path | dict):
        return value
    raise ConfigError(f"polar_config: expected a path or a mapping, got {type(value).__name__}")


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's ``--rollout-function-path`` entry point (training and evaluation alike)."""
    if evaluation:
        raise BridgeError(
            "polar.bridges.slime does not run slime's evaluation; use `polar eval` on the tasks"
        )
    samples, metrics = _rollout_for(args)(
        data_source.get_samples(args.rollout_batch_size), rollout_id
    )
    try:
        base_types = importlib.import_module("slime.rollout.base_types")
    except ImportError:  # without slime (tests): its call_rollout_fn wraps a bare list
        return samples
    return base_types.RolloutFnTrainOutput(samples=samples, metrics=metrics)
