"""The reference GRPO trainer: ``polar train CONFIG.yaml``, or :func:`train`
from Python (a benchmark or a bridge drives it with :class:`Hooks`).

It reads top to bottom: set-up (:mod:`polar.train.setup`, every resource
that must be closed entered into one exit stack), then per step — gather
groups (finished groups from the rollout service, stale ones dropped), build
rows (advantages, one row per trace), train step (loss and optimizer step),
push weights, then log, checkpoint and evaluate. The maths and every deviation
from textbook GRPO are in :mod:`polar.train.grpo`; the step in
:mod:`polar.train.step`; the push in :mod:`polar.train.weightsync`.

Asynchronous with bounded staleness: ``max_inflight_groups`` groups are
generating on the rollout service at every moment, also while the trainer
steps and while it pushes weights (the gateways hold new calls during a push
and let the ones in flight finish on the old weights). A group is consumed
when it finishes; if its oldest token was sampled more than ``max_staleness``
policy versions before the current one, it is dropped and counted.

Device and memory: the policy trains where ``device`` says (:mod:`polar.device`),
float32 master weights with the forward pass under bfloat16 autocast on a GPU
(:mod:`polar.precision`); it is made ready by :func:`polar.train.policy.prepare`
(gradient checkpointing, LoRA adapters, the memory estimate checked before it
moves to the device). With LoRA only the adapters train, are pushed and are
checkpointed; ``lora.export_merged`` writes the merged model at the end.

Policy versions are truthful: a version names one set of weights. The
trainer's version goes up with every step; the gateways serve it once its
push lands. A push whose drain times out (calls still in flight after
``drain_timeout_s``) is retried ``push_retries`` times, then skipped with a
logged reason under ``on_push_failure: skip`` (``push/skipped_total``): the
gateways keep serving the version they had, records keep naming it, its
groups count as stale against the trainer's newer weights, and the same
weights are pushed again before the next step's groups are taken.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from polar.ir import Unreproducible
from polar.proxy.call.behaviour import SamplingPolicy
from polar.train.batch import (
    Advantages,
    Group,
    Row,
    advantages_of,
    group_from_result,
    rows_of,
    unreproducible_tokens,
)
from polar.train.checkpoint import TrainState, read_state, save_checkpoint
from polar.train.config import PushFailure, TrainConfig
from polar.train.evaluation import evaluate
from polar.train.lora import export_merged
from polar.train.setup import Run, TrainError, open_run, resume_path, run_tasks
from polar.train.weights import prune_weights, weights_path
from polar.train.weightsync import DrainTimeout, PushReport

__all__ = ["Hooks", "TrainError", "TrainResult", "train"]


@dataclass(frozen=True, slots=True)
class Hooks:
    """Optional callbacks for whoever drives :func:`train`."""

    on_step: Callable[[int, dict[str, float]], None] | None = None
    """After each step's metrics are logged: ``(step, metrics)``."""
    before_push: Callable[[int], None] | None = None
    """Before the gateways pause to load ``version`` (the weights are on disk); once
    per try of a step's weights: again, with the same version, when a skipped push
    is tried before the next step (not for the push at start)."""
    after_push: Callable[[PushReport], None] | None = None
    """After a push of a step's weights landed (a skipped one has no report)."""
    evaluate: Callable[[int, int], dict[str, float]] | None = None
    """``(step, policy_version) -> metrics``, called where the built-in
    evaluation runs (merged into its metrics, logged under the same step)."""
    on_group: Callable[[int, Group], None] | None = None
    """When a finished group is taken for step ``step`` (not the stale or empty ones)."""


@dataclass(slots=True)
class TrainResult:
    steps: int
    policy_version: int
    output_dir: Path
    checkpoint: Path | None
    history: list[dict[str, float]] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)
    note: str | None = None
    """Set when the run did nothing, saying why (a resumed run already at ``steps``)."""
    merged: Path | None = None
    """The merged model ``lora.export_merged`` wrote."""


def train(config: TrainConfig, hooks: Hooks = Hooks()) -> TrainResult:
    """Train until ``config.steps`` (a resumed run from its checkpoint's step)."""
    torch.manual_seed(config.seed)
    if config.optim.threads:
        torch.set_num_threads(config.optim.threads)
    config.output_dir.mkdir(parents=True, exist_ok=True)
    tasks = run_tasks(config)
    resume_from = resume_path(config)
    if resume_from is not None and (done := read_state(resume_from)).step >= config.steps:
        return _nothing_left(config, resume_from, done)
    with ExitStack() as stack:
        run = open_run(config, tasks, resume_from, stack)
        return _loop(run, hooks)


def _loop(run: Run, hooks: Hooks) -> TrainResult:
    """The loop: per step, gather groups → build rows → train step → push
    weights → log, checkpoint, evaluate."""
    config, state = run.config, run.state
    result = TrainResult(
        state.step, state.policy_version, config.output_dir, None, counters=state.counters
    )
    if config.weight_sync.sync_on_start:
        _push_at_start(run)
    run.feed.fill(run.served)
    if state.step == 0 and _evaluates(run, hooks):
        run.log.write(0, run.served, _evaluate(run, hooks))
    while state.step < config.steps:
        rollout = _gather_groups(run, hooks)
        batch = _build_rows(run, rollout.groups)
        trained = run.learner.step(batch.rows, policy_version=state.policy_version)
        state.step += 1
        push = _push_weights(run, hooks)
        _log(run, hooks, result, _metrics(run, rollout, batch, push, trained))
        _checkpoint(run, result)
        if _evaluates(run, hooks) and _due(config.eval.every, state.step, config.steps):
            run.log.write(state.step, run.served, _evaluate(run, hooks))
    if config.lora is not None and config.lora.export_merged:
        merged = config.output_dir / "merged"
        result.merged = export_merged(run.learner.model, merged, tokenizer_dir=config.model)
    result.steps = state.step
    result.policy_version = state.policy_version
    return result


def _nothing_left(config: TrainConfig, checkpoint: Path, done: TrainState) -> TrainResult:
    """A resumed run whose checkpoint is already at ``steps``."""
    return TrainResult(
        done.step,
        done.policy_version,
        config.output_dir,
        checkpoint,
        counters=done.counters,
        note=(
            f"nothing left to do: checkpoint {checkpoint} is at step {done.step} and "
            f"steps is {config.steps} (raise steps to train further)"
        ),
    )


# ---------------------------------------------------------------- gather groups


@dataclass(frozen=True, slots=True)
class _Rollout:
    """One step's groups, as the feed handed them over."""

    groups: list[Group]
    staleness: list[int]
    """Each group's age in policy versions when it was taken."""
    waited_s: float


def _gather_groups(run: Run, hooks: Hooks) -> _Rollout:
    """``groups_per_step`` finished groups, in finishing order; stale and empty ones
    are dropped and counted. The next groups are submitted before it returns, so
    they generate while this one trains."""
    config, state = run.config, run.state
    started = time.monotonic()
    groups: list[Group] = []
    staleness: list[int] = []
    while len(groups) < config.rollout.groups_per_step:
        if run.served != state.policy_version:
            # the last push was skipped: try again before waiting (with
            # max_staleness 0 no group could be fresh until one lands)
            _step_push(run, hooks)
        run.feed.fill(run.served)
        group = group_from_result(run.feed.next())
        lag = _take(run, group)
        if lag is None:
            continue
        groups.append(group)
        if hooks.on_group is not None:
            hooks.on_group(state.step + 1, group)
        staleness.append(lag)
    if state.step + 1 < config.steps:
        run.feed.fill(run.served)  # the next groups generate while this one trains
    return _Rollout(groups, staleness, time.monotonic() - started)


def _take(run: Run, group: Group) -> int | None:
    """The group's staleness if it is trained on; None (counted) if it is too
    stale or has nothing to train on."""
    counters = run.state.counters
    _count(counters, "groups/seen_total")
    _count(counters, "sessions/masked_total", group.masked)
    _count(counters, "sessions/agent_failed_total", group.agent_failed)
    _count(counters, "sessions/invalid_samples_total", group.invalid_samples)
    lag = group.staleness(run.state.policy_version)
    if lag > run.config.rollout.max_staleness:
        _count(counters, "groups/stale_dropped_total")
        run.log.note(
            f"step {run.state.step + 1}: dropped group {group.group_id} ({group.task}): "
            f"{lag} versions old > max_staleness {run.config.rollout.max_staleness}"
        )
        return None
    if not any(s.samples for s in group.sessions):
        _count(counters, "groups/empty_total")
        return None
    return lag


# ---------------------------------------------------------------- build rows


@dataclass(frozen=True, slots=True)
class _Batch:
    """One step's rows, and what the step logs about how they were made."""

    rows: list[Row]
    advantages: Advantages
    left_out: Counter[Unreproducible]
    """Sampled tokens not trained, by why their distribution cannot be reproduced."""


def _build_rows(run: Run, groups: list[Group]) -> _Batch:
    """Advantages per session, then one row per trace (:mod:`polar.train.batch`);
    notes what cannot be trained on."""
    grpo, step, counters = run.config.grpo, run.state.step + 1, run.state.counters
    advantages = advantages_of(groups, baseline=grpo.baseline, scale_by_std=grpo.scale_by_std)
    rows = rows_of(
        groups, advantages, aggregation=grpo.aggregation, missing_logprob=grpo.missing_logprob
    )
    left_out = unreproducible_tokens(groups)
    for reason, n in left_out.items():
        _count(counters, f"tokens/unreproducible_{reason.value}_total", n)
    if left_out:
        run.log.note(
            f"step {step}: {sum(left_out.values())} sampled tokens not trained: "
            "the distribution they were drawn from cannot be reproduced ("
            + ", ".join(f"{r.value}: {n}" for r, n in sorted(left_out.items()))
            + "); see rollout.sampling and engine.logprobs"
        )
    if advantages.zero_advantage_groups == len(groups):
        _count(counters, "steps/nothing_to_learn_total")
        run.log.note(
            f"step {step}: nothing to learn from: every group's sessions have "
            f"equal rewards (zero advantage; rewards {_rewards_seen(groups)})"
        )
    return _Batch(rows, advantages, left_out)


# ---------------------------------------------------------------- push weights


def _push_at_start(run: Run) -> None:
    """``sync_on_start``: the trainer's weights into every engine before the first
    group is submitted (no hooks: this is not a step's push)."""
    version = run.state.policy_version
    _push(run, run.publisher.save(run.learner.model, version), version)


def _push_weights(run: Run, hooks: Hooks) -> PushReport | None:
    """The step's new weights, saved and pushed; None if the push was skipped."""
    # A version names one set of weights: the trainer's are new whether or not
    # the push lands (a skipped one is tried again before the next step's groups).
    run.state.policy_version += 1
    run.publisher.save(run.learner.model, run.state.policy_version)
    push = _step_push(run, hooks)
    prune_weights(run.publisher.directory, run.config.weight_sync.keep)
    return push


def _step_push(run: Run, hooks: Hooks) -> PushReport | None:
    """Push the trainer's weights, already saved as its current version, with the
    hooks around it; counts what it did."""
    version, counters = run.state.policy_version, run.state.counters
    if hooks.before_push is not None:
        hooks.before_push(version)
    push = _push(run, weights_path(run.publisher.directory, version), version)
    if push is None:
        _count(counters, "push/skipped_total")
        return None
    _count(counters, "push/drained_calls_total", push.drained_calls)
    if hooks.after_push is not None:
        hooks.after_push(push)
    return push


def _push(run: Run, path: Path, version: int) -> PushReport | None:
    """The weights in ``path`` into every engine as ``version``; None when the push
    was skipped (its drain timed out on every try and ``on_push_failure`` is
    ``skip``): the gateways then still serve the version they had."""
    try:
        push = run.publisher.sync.push(path, version, on_retry=run.log.note)
    except DrainTimeout as exc:
        if run.config.weight_sync.on_push_failure is PushFailure.STOP:
            raise
        run.log.note(
            f"weight push v{version} skipped: {exc}. The gateways keep serving the version "
            "they had; these weights are pushed again before the next step"
        )
        return None
    run.served = push.version
    return push


# ---------------------------------------------------------------- log, checkpoint, evaluate


def _metrics(
    run: Run,
    rollout: _Rollout,
    batch: _Batch,
    push: PushReport | None,
    trained: dict[str, float],
) -> dict[str, float]:
    """The step's metrics (``trained``: the step's own), the running counters last."""
    groups, staleness = rollout.groups, rollout.staleness
    zero_advantage = batch.advantages.zero_advantage_groups
    rewards = [r for g in groups for r in g.rewards]
    mean = math.fsum(rewards) / len(rewards)
    return {
        "reward/mean": mean,
        "reward/std": math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards)),
        "groups/trained": float(len(groups)),
        "groups/zero_advantage_fraction": zero_advantage / len(groups),
        "groups/nothing_to_learn": float(zero_advantage == len(groups)),
        "tokens/unreproducible": float(sum(batch.left_out.values())),
        "staleness/mean": sum(staleness) / len(staleness),
        "staleness/max": float(max(staleness)),
        "push/skipped": float(push is None),
        "push/served_version": float(run.served),
        **_push_metrics(push),
        "time/waiting_for_groups_s": rollout.waited_s,
        "lr": run.learner.lr,
        **trained,
        **run.state.counters,
    }


def _log(run: Run, hooks: Hooks, result: TrainResult, metrics: dict[str, float]) -> None:
    step = run.state.step
    run.log.write(step, run.state.policy_version, metrics)
    result.history.append({"step": float(step), **metrics})
    if hooks.on_step is not None:
        hooks.on_step(step, metrics)


def _checkpoint(run: Run, result: TrainResult) -> None:
    """Every ``checkpoint.every`` steps and after the last."""
    config, state = run.config, run.state
    state.cursor = run.feed.cursor
    if _due(config.checkpoint.every, state.step, config.steps):
        learner = run.learner
        result.checkpoint = save_checkpoint(
            config.output_dir,
            state,
            learner.model,
            learner.optimizer,
            learner.scheduler,
            tokenizer_dir=config.model,
            keep=config.checkpoint.keep,
        )


def _evaluates(run: Run, hooks: Hooks) -> bool:
    return bool(run.evaluation.tasks) or hooks.evaluate is not None


def _evaluate(run: Run, hooks: Hooks) -> dict[str, float]:
    """The held-out tasks under the served weights (and greedily with
    ``eval.greedy``), then the ``evaluate`` hook's metrics."""
    metrics: dict[str, float] = {}
    tasks, request = run.evaluation.tasks, run.evaluation.request
    if tasks:
        with run.evaluation.connect() as client:
            metrics |= evaluate(client, tasks, request, policy_version=run.served)
            if run.config.eval.greedy:  # deterministic: one session a task says it all
                greedy = replace(request, sampling=SamplingPolicy(temperature=0.0), group_size=1)
                metrics |= evaluate(
                    client, tasks, greedy, policy_version=run.served, prefix="eval_greedy"
                )
    if hooks.evaluate is not None:
        metrics |= hooks.evaluate(run.state.step, run.served)
    return metrics


# ---------------------------------------------------------------- helpers


def _due(every: int, step: int, steps: int) -> bool:
    """Every ``every`` steps (0: never), and at the last one."""
    return bool(every and step % every == 0) or step == steps


def _rewards_seen(groups: list[Group]) -> str:
    values = sorted({r for g in groups for r in g.rewards})
    shown = ", ".join(f"{v:g}" for v in values[:5])
    return shown + (", ..." if len(values) > 5 else "")


def _push_metrics(push: PushReport | None) -> dict[str, float]:
    if push is None:
        return {}
    return {
        "push/drained_calls": float(push.drained_calls),
        "push/held_calls": float(push.held_calls),
        "push/seconds": push.total_s,
        "push/tries": float(push.tries),
    }


def _count(counters: dict[str, float], name: str, by: float = 1.0) -> None:
    counters[name] = counters.get(name, 0.0) + by
