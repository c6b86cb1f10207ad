"""The reference GRPO trainer: ``polar train CONFIG.yaml``, or :func:`train`
from Python (a benchmark or a bridge drives it with :class:`Hooks`).

It reads top to bottom: set-up, then per step — rollout (finished groups
from the rollout service, stale ones dropped), advantages, loss and optimizer
step, weight push, log, checkpoint, evaluation. The maths and every deviation
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
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from polar.adapters import is_adapter
from polar.device import DeviceError, resolve_device
from polar.precision import default_precision, load_master
from polar.proxy.behaviour import SamplingPolicy
from polar.rollout.client import RolloutClient
from polar.tasks import load_tasks
from polar.tasks.model import Task
from polar.train.batch import (
    Group,
    advantages_of,
    group_from_result,
    rows_of,
    unreproducible_tokens,
)
from polar.train.checkpoint import (
    TrainState,
    list_checkpoints,
    read_state,
    restore,
    save_checkpoint,
)
from polar.train.config import Packing, PushFailure, TrainConfig
from polar.train.evaluation import evaluate
from polar.train.feed import GroupRequest, RolloutFeed, task_order
from polar.train.lora import LoraUnavailable, export_merged
from polar.train.memory import MemoryTooSmall
from polar.train.policy import PolicySettings, load_policy, trainable
from polar.train.step import LossSettings, StepSettings, train_step
from polar.train.tracking import MetricsLog
from polar.train.weights import (
    SHARED_MEMORY,
    prune_weights,
    push_directory,
    save_weights,
    weights_path,
)
from polar.train.weightsync import DrainTimeout, PushReport, WeightSync, rollout_gateways


class TrainError(Exception):
    """The run cannot start or go on; the message is one line."""


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
    # ---------------------------------------------------------------- set-up
    torch.manual_seed(config.seed)
    if config.optim.threads:
        torch.set_num_threads(config.optim.threads)
    out = config.output_dir
    out.mkdir(parents=True, exist_ok=True)
    train_tasks = _tasks(config.rollout.tasks, config.rollout.task_ids, "rollout")
    eval_tasks = (
        _tasks(config.eval.tasks, config.eval.task_ids, "eval") if config.eval.tasks else []
    )
    resume_from = _resume_path(config)
    if resume_from is not None and (done := read_state(resume_from)).step >= config.steps:
        return TrainResult(
            done.step,
            done.policy_version,
            out,
            resume_from,
            counters=done.counters,
            note=(
                f"nothing left to do: checkpoint {resume_from} is at step {done.step} and "
                f"steps is {config.steps} (raise steps to train further)"
            ),
        )
    try:
        device = resolve_device(config.device)
    except DeviceError as exc:
        raise TrainError(str(exc)) from None
    precision = default_precision(device) if config.optim.dtype == "auto" else config.optim.dtype
    adapters = _adapters(config, resume_from)
    base = config.model if adapters or resume_from is None else resume_from / "model"
    # Weight sync: every gateway answers, every engine can load weights (or we stop here).
    weight_sync = config.weight_sync
    if not weight_sync.gateways:  # the rollout server's nodes' gateways
        found = rollout_gateways(config.rollout.server_url, config.rollout.control_token)
        weight_sync = weight_sync.model_copy(update={"gateways": found})
    sync = WeightSync.from_settings(
        weight_sync, adapter_name=config.lora.served_name if config.lora else None
    )
    try:
        versions = sync.check()
        weight_format = sync.weight_format(config.weight_sync.dtype)
    except Exception:
        sync.close()
        raise
    if not (base / "config.json").is_file():
        sync.close()
        raise TrainError(f"model: no Hugging Face model in {base}")
    weights_dir = push_directory(
        config.weight_sync.directory, out, [e.url for e in config.weight_sync.engines]
    )
    # float32 master weights (and so AdamW state) whatever optim.dtype: see polar.precision
    try:
        model: Any = load_policy(
            base,
            PolicySettings(
                device=device,
                precision=precision,
                micro_batch_tokens=config.optim.micro_batch_tokens,
                logprob_chunk=config.optim.logprob_chunk,
                gradient_checkpointing=config.optim.gradient_checkpointing,
                lora=config.lora,
                reference=config.grpo.kl_coef > 0,
                check_memory=config.optim.check_memory,
            ),
            adapters=adapters,
        )
    except (MemoryTooSmall, LoraUnavailable) as exc:
        sync.close()
        raise TrainError(str(exc)) from None
    reference: Any = None
    if config.grpo.kl_coef > 0:
        reference = load_master(config.model).to(device)
        reference.train(False)
        reference.requires_grad_(False)
    pad_id = _pad_id(model)
    optimizer = torch.optim.AdamW(
        trainable(model),
        lr=config.optim.lr,
        betas=config.optim.betas,
        weight_decay=config.optim.weight_decay,
        fused=device.type == "cuda" or None,
    )
    warmup = config.optim.warmup_steps * config.optim.minibatches
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda n: min(1.0, (n + 1) / (warmup + 1)) if warmup else 1.0
    )
    state = restore(resume_from, optimizer, scheduler) if resume_from else TrainState()
    counters = state.counters

    if resume_from is None:
        state.policy_version = max(versions)
    if config.weight_sync.sync_on_start:
        # pushed weights get a number no gateway has served (a version names one set of weights)
        state.policy_version = max(state.policy_version, max(versions) + 1)
    elif set(versions) != {state.policy_version}:
        sync.close()
        raise TrainError(
            f"weight_sync: gateways are at policy versions {versions}, the trainer at "
            f"{state.policy_version}; set weight_sync.sync_on_start to push the trainer's weights"
        )
    # What the gateways serve: the trainer's version, unless a push was skipped.
    served = max(versions)

    def connect() -> RolloutClient:
        return RolloutClient(config.rollout.server_url, token=config.rollout.control_token)

    request = GroupRequest(
        harness=config.rollout.harness,
        group_size=config.rollout.group_size,
        builder=config.rollout.builder,
        session_timeout_s=config.rollout.session_timeout_s,
        max_resamples=config.rollout.max_resamples,
        wait_s=config.rollout.group_timeout_s,
        sampling=config.rollout.sampling,
    )
    feed = RolloutFeed(
        connect,
        task_order(train_tasks, seed=config.seed, shuffle=config.rollout.shuffle),
        request,
        inflight=config.rollout.max_inflight_groups,
        cursor=state.cursor,
    )
    log = MetricsLog(
        out,
        jsonl=config.log.jsonl,
        tensorboard=config.log.tensorboard,
        progress=config.log.progress,
        total_steps=config.steps,
        first_step=state.step,
    )
    loss = LossSettings(
        clip_low=config.grpo.clip_low,
        clip_high=config.grpo.clip_high,
        tis_cap=config.grpo.tis_cap,
        kl_coef=config.grpo.kl_coef,
        aggregation=config.grpo.aggregation,
    )
    step_settings = StepSettings(
        minibatches=config.optim.minibatches,
        micro_batch_tokens=config.optim.micro_batch_tokens,
        max_grad_norm=config.optim.max_grad_norm,
        logprob_chunk=config.optim.logprob_chunk,
        pad_id=pad_id,
        precision=precision,
        packed=_packed(config.optim.packing, model),
    )
    eval_request = replace(
        request,
        group_size=config.eval.group_size,
        sampling=config.eval.sampling or config.rollout.sampling,
    )
    result = TrainResult(state.step, state.policy_version, out, None, counters=counters)

    def run_eval() -> dict[str, float]:
        metrics: dict[str, float] = {}
        if eval_tasks:
            with connect() as client:
                metrics |= evaluate(client, eval_tasks, eval_request, policy_version=served)
                if config.eval.greedy:
                    greedy = replace(eval_request, sampling=SamplingPolicy(temperature=0.0))
                    metrics |= evaluate(
                        client,
                        eval_tasks,
                        greedy,
                        policy_version=served,
                        prefix="eval_greedy",
                    )
        if hooks.evaluate is not None:
            metrics |= hooks.evaluate(state.step, served)
        return metrics

    try:
        if config.weight_sync.sync_on_start:
            path = save_weights(model, weights_dir, state.policy_version, weight_format)
            pushed = _push(sync, path, state.policy_version, config, log)
            served = pushed.version if pushed is not None else served
        feed.fill(served)
        if state.step == 0 and (eval_tasks or hooks.evaluate):
            log.write(0, served, run_eval())
        while state.step < config.steps:
            # ---------------------------------------------------------- rollout
            started = time.monotonic()
            groups: list[Group] = []
            staleness: list[int] = []
            while len(groups) < config.rollout.groups_per_step:
                if served != state.policy_version:
                    # the last push was skipped: try again before waiting (with
                    # max_staleness 0 no group could be fresh until one lands)
                    pushed = _step_push(
                        sync, weights_dir, state.policy_version, config, log, hooks, counters
                    )
                    served = pushed.version if pushed is not None else served
                feed.fill(served)
                group = group_from_result(feed.next())
                _count(counters, "groups/seen_total")
                _count(counters, "sessions/masked_total", group.masked)
                _count(counters, "sessions/agent_failed_total", group.agent_failed)
                _count(counters, "sessions/invalid_samples_total", group.invalid_samples)
                lag = group.staleness(state.policy_version)
                if lag > config.rollout.max_staleness:
                    _count(counters, "groups/stale_dropped_total")
                    log.note(
                        f"step {state.step + 1}: dropped group {group.group_id} ({group.task}): "
                        f"{lag} versions old > max_staleness {config.rollout.max_staleness}"
                    )
                    continue
                if not any(s.samples for s in group.sessions):
                    _count(counters, "groups/empty_total")
                    continue
                groups.append(group)
                if hooks.on_group is not None:
                    hooks.on_group(state.step + 1, group)
                staleness.append(lag)
            if state.step + 1 < config.steps:
                feed.fill(served)  # the next groups generate while this one trains
            waited = time.monotonic() - started

            # ---------------------------------------------------------- advantages
            advantages = advantages_of(
                groups, baseline=config.grpo.baseline, scale_by_std=config.grpo.scale_by_std
            )
            rows = rows_of(
                groups,
                advantages,
                aggregation=config.grpo.aggregation,
                missing_logprob=config.grpo.missing_logprob,
            )
            left_out = unreproducible_tokens(groups)
            for reason, n in left_out.items():
                _count(counters, f"tokens/unreproducible_{reason.value}_total", n)
            if left_out:
                log.note(
                    f"step {state.step + 1}: {sum(left_out.values())} sampled tokens not trained: "
                    "the distribution they were drawn from cannot be reproduced ("
                    + ", ".join(f"{r.value}: {n}" for r, n in sorted(left_out.items()))
                    + "); see rollout.sampling and engine.logprobs"
                )

            if advantages.zero_advantage_groups == len(groups):
                _count(counters, "steps/nothing_to_learn_total")
                log.note(
                    f"step {state.step + 1}: nothing to learn from: every group's sessions have "
                    f"equal rewards (zero advantage; rewards {_rewards_seen(groups)})"
                )

            # ---------------------------------------------------------- loss and step
            step_metrics = train_step(
                model,
                optimizer,
                rows,
                loss=loss,
                settings=step_settings,
                policy_version=state.policy_version,
                ref_model=reference,
                scheduler=scheduler,
            )
            state.step += 1

            # ---------------------------------------------------------- weight push
            # A version names one set of weights: the trainer's are new whether or not
            # the push lands (a skipped one is tried again before the next step's groups).
            state.policy_version += 1
            save_weights(model, weights_dir, state.policy_version, weight_format)
            push = _step_push(sync, weights_dir, state.policy_version, config, log, hooks, counters)
            served = push.version if push is not None else served
            prune_weights(weights_dir, config.weight_sync.keep)

            # ---------------------------------------------------------- log
            rewards = [r for g in groups for r in g.rewards]
            mean = math.fsum(rewards) / len(rewards)
            metrics = {
                "reward/mean": mean,
                "reward/std": math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards)),
                "groups/trained": float(len(groups)),
                "groups/zero_advantage_fraction": advantages.zero_advantage_groups / len(groups),
                "groups/nothing_to_learn": float(advantages.zero_advantage_groups == len(groups)),
                "tokens/unreproducible": float(sum(left_out.values())),
                "staleness/mean": sum(staleness) / len(staleness),
                "staleness/max": float(max(staleness)),
                "push/skipped": float(push is None),
                "push/served_version": float(served),
                **_push_metrics(push),
                "time/waiting_for_groups_s": waited,
                "lr": float(scheduler.get_last_lr()[0]),
                **step_metrics,
                **counters,
            }
            log.write(state.step, state.policy_version, metrics)
            result.history.append({"step": float(state.step), **metrics})
            if hooks.on_step is not None:
                hooks.on_step(state.step, metrics)

            # ---------------------------------------------------------- checkpoint
            state.cursor = feed.cursor
            every = config.checkpoint.every
            if (every and state.step % every == 0) or state.step == config.steps:
                result.checkpoint = save_checkpoint(
                    out,
                    state,
                    model,
                    optimizer,
                    scheduler,
                    tokenizer_dir=config.model,
                    keep=config.checkpoint.keep,
                )

            # ---------------------------------------------------------- evaluation
            every = config.eval.every
            last = state.step == config.steps
            if (eval_tasks or hooks.evaluate) and ((every and state.step % every == 0) or last):
                log.write(state.step, served, run_eval())
        if config.lora is not None and config.lora.export_merged:
            result.merged = export_merged(model, out / "merged", tokenizer_dir=config.model)
    finally:
        feed.close()
        sync.close()
        log.close()
        if config.weight_sync.directory is None and weights_dir.parent == SHARED_MEMORY:
            shutil.rmtree(weights_dir, ignore_errors=True)  # memory, not disk: give it back
    result.steps = state.step
    result.policy_version = state.policy_version
    return result


# ---------------------------------------------------------------- helpers


def _push(
    sync: WeightSync, path: Path, version: int, config: TrainConfig, log: MetricsLog
) -> PushReport | None:
    """The weights in ``path`` into every engine as ``version``; None when the push
    was skipped (its drain timed out on every try and ``on_push_failure`` is
    ``skip``): the gateways then still serve the version they had."""
    try:
        return sync.push(path, version, on_retry=log.note)
    except DrainTimeout as exc:
        if config.weight_sync.on_push_failure is PushFailure.STOP:
            raise
        log.note(
            f"weight push v{version} skipped: {exc}. The gateways keep serving the version "
            "they had; these weights are pushed again before the next step"
        )
        return None


def _step_push(
    sync: WeightSync,
    weights_dir: Path,
    version: int,
    config: TrainConfig,
    log: MetricsLog,
    hooks: Hooks,
    counters: dict[str, float],
) -> PushReport | None:
    """Push the trainer's weights, already saved as ``version``, with the hooks
    around it; counts what it did."""
    if hooks.before_push is not None:
        hooks.before_push(version)
    push = _push(sync, weights_path(weights_dir, version), version, config, log)
    if push is None:
        _count(counters, "push/skipped_total")
        return None
    _count(counters, "push/drained_calls_total", push.drained_calls)
    if hooks.after_push is not None:
        hooks.after_push(push)
    return push


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


def _tasks(source: str, ids: list[str] | None, section: str) -> list[Task]:
    from polar.tasks.errors import TaskError

    try:
        tasks = load_tasks(source)
    except TaskError as exc:
        raise TrainError(f"{section}.tasks: {exc}") from None
    if ids:
        unknown = sorted(set(ids) - {t.id for t in tasks})
        if unknown:
            raise TrainError(f"{section}.task_ids: no task {unknown[0]} in {source}")
        tasks = [t for t in tasks if t.id in set(ids)]
    if not tasks:
        raise TrainError(f"{section}.tasks: {source} holds no task")
    return tasks


def _resume_path(config: TrainConfig) -> Path | None:
    match config.checkpoint.resume:
        case "never":
            return None
        case "auto":
            found = list_checkpoints(config.output_dir)
            return found[-1] if found else None
        case Path() as path:
            if not (path / "state.json").is_file():
                raise TrainError(f"checkpoint.resume: {path} is not a checkpoint")
            return path
    raise TrainError(f"checkpoint.resume: {config.checkpoint.resume!r}")


def _adapters(config: TrainConfig, resume_from: Path | None) -> Path | None:
    """The adapters a LoRA run resumes from (None: fresh ones, or a full fine-tune);
    a checkpoint of the other kind is an error."""
    if resume_from is None:
        return None
    saved = resume_from / "model"
    if is_adapter(saved) and config.lora is None:
        raise TrainError(f"checkpoint.resume: {resume_from} holds LoRA adapters; set lora")
    if not is_adapter(saved) and config.lora is not None:
        raise TrainError(f"checkpoint.resume: {resume_from} holds full weights; leave lora out")
    return saved if config.lora is not None else None


def _packed(packing: Packing, model: Any) -> bool:
    match packing:
        case Packing.ON:
            return True
        case Packing.OFF:
            return False
        case Packing.AUTO:
            attention = str(getattr(model.config, "_attn_implementation", None) or "")
            return attention.startswith("flash_attention")
    raise AssertionError(packing)


def _pad_id(model: Any) -> int:
    for value in (model.config.pad_token_id, model.config.eos_token_id):
        if isinstance(value, int):
            return value
        if isinstance(value, list) and value:
            return int(value[0])
    return 0


def _count(counters: dict[str, float], name: str, by: float = 1.0) -> None:
    counters[name] = counters.get(name, 0.0) + by
