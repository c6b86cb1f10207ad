"""What a :func:`polar.train.trainer.train` run needs before its first step,
made in the order it is checked.

Before anything is reached: the tasks load (:func:`run_tasks`) and the
checkpoint to resume from is found (:func:`resume_path`), so that a run with
nothing left to do stops without touching a gateway or an engine. Then
:func:`open_run`: the device; every gateway answers and every engine can load
weights (an engine that cannot update fails here, not mid-run); the model and
what updates it (:class:`Learner`), restored from the checkpoint; the starting
policy version; the rollout feed and the metrics log.

Everything that must be given back is entered into the caller's
:class:`~contextlib.ExitStack` the moment it exists: the gateways' and
engines' clients, a push directory in shared memory, the feed (its groups
still generating are cancelled) and the log. A failure anywhere in set-up or
in the run then closes what was opened, newest first; no path closes by hand.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from contextlib import ExitStack, closing
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from polar.adapters import is_adapter
from polar.causallm import CausalLM
from polar.device import DeviceError, resolve_device
from polar.precision import Precision, default_precision, load_master
from polar.rollout.client import RolloutClient
from polar.tasks import load_tasks
from polar.tasks.model import Task
from polar.train.batch import Row
from polar.train.checkpoint import TrainState, list_checkpoints, restore
from polar.train.config import Packing, TrainConfig
from polar.train.feed import GroupRequest, RolloutFeed, task_order
from polar.train.lora import LoraUnavailable
from polar.train.memory import MemoryTooSmall
from polar.train.policy import PolicySettings, load_policy, trainable
from polar.train.step import LossSettings, StepSettings, train_step
from polar.train.tracking import MetricsLog
from polar.train.weights import SHARED_MEMORY, WeightFormat, push_directory, save_weights
from polar.train.weightsync import WeightSync, rollout_gateways


class TrainError(Exception):
    """The run cannot start or go on; the message is one line."""


@dataclass(frozen=True, slots=True)
class Learner:
    """The policy and what updates it."""

    model: CausalLM
    reference: Any
    """The frozen model of the KL term (``grpo.kl_coef > 0``), else None."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    loss: LossSettings
    settings: StepSettings

    def step(self, rows: Sequence[Row], policy_version: int) -> dict[str, float]:
        """One optimizer step on ``rows`` (see :func:`polar.train.step.train_step`)."""
        return train_step(
            self.model,
            self.optimizer,
            rows,
            loss=self.loss,
            settings=self.settings,
            policy_version=policy_version,
            ref_model=self.reference,
            scheduler=self.scheduler,
        )

    @property
    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])


@dataclass(frozen=True, slots=True)
class Publisher:
    """How the trainer's weights reach the engines: written once per version to
    ``directory`` in ``format``, then loaded by every engine through ``sync``."""

    sync: WeightSync
    directory: Path
    """``weights.push_directory``: where every engine reads ``vN`` from."""
    format: WeightFormat

    def save(self, model: CausalLM, version: int) -> Path:
        return save_weights(model, self.directory, version, self.format)


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The held-out tasks (``eval.tasks``, maybe none) and how each runs as a group."""

    tasks: list[Task]
    request: GroupRequest
    connect: Callable[[], RolloutClient]
    """A new client of the rollout service (an evaluation opens its own)."""


@dataclass(slots=True)
class Run:
    """What a run's steps use; ``state`` and ``served`` change as it goes."""

    config: TrainConfig
    learner: Learner
    state: TrainState
    publisher: Publisher
    served: int
    """The version the gateways serve: the trainer's, unless a push was skipped."""
    feed: RolloutFeed
    log: MetricsLog
    evaluation: Evaluation


def run_tasks(config: TrainConfig) -> tuple[list[Task], list[Task]]:
    """The tasks to train on, and the held-out ones (none without ``eval.tasks``)."""
    train_tasks = _tasks(config.rollout.tasks, config.rollout.task_ids, "rollout")
    if not config.eval.tasks:
        return train_tasks, []
    return train_tasks, _tasks(config.eval.tasks, config.eval.task_ids, "eval")


def resume_path(config: TrainConfig) -> Path | None:
    """The checkpoint ``checkpoint.resume`` names, or None for a fresh run."""
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


def open_run(
    config: TrainConfig,
    tasks: tuple[list[Task], list[Task]],
    resume_from: Path | None,
    stack: ExitStack,
) -> Run:
    """Everything a run's first step needs, each resource entered into ``stack``
    as soon as it exists."""
    try:
        device = resolve_device(config.device)
    except DeviceError as exc:
        raise TrainError(str(exc)) from None
    precision = default_precision(device) if config.optim.dtype == "auto" else config.optim.dtype
    adapters = _adapters(config, resume_from)
    base = config.model if adapters or resume_from is None else resume_from / "model"
    # Weight sync: every gateway answers, every engine can load weights (or we stop here).
    sync = stack.enter_context(closing(_weight_sync(config)))
    versions = sync.check()
    weight_format = sync.weight_format(config.weight_sync.dtype)
    if not (base / "config.json").is_file():
        raise TrainError(f"model: no Hugging Face model in {base}")
    engine_urls = [e.url for e in config.weight_sync.engines]
    weights_dir = push_directory(config.weight_sync.directory, config.output_dir, engine_urls)
    if config.weight_sync.directory is None and weights_dir.parent == SHARED_MEMORY:
        # memory, not disk: give it back
        stack.callback(shutil.rmtree, weights_dir, ignore_errors=True)
    publisher = Publisher(sync, weights_dir, weight_format)
    learner = _learner(config, base, device, precision, adapters)
    state = (
        restore(resume_from, learner.optimizer, learner.scheduler) if resume_from else TrainState()
    )
    state.policy_version = _first_version(config, state, versions, resumed=resume_from is not None)
    connect = partial(RolloutClient, config.rollout.server_url, token=config.rollout.control_token)
    request = _group_request(config)
    train_tasks, eval_tasks = tasks
    feed = stack.enter_context(closing(_feed(config, train_tasks, connect, request, state.cursor)))
    log = stack.enter_context(closing(_log(config, state.step)))
    eval_request = replace(
        request,
        group_size=config.eval.group_size,
        sampling=config.eval.sampling or config.rollout.sampling,
    )
    evaluation = Evaluation(eval_tasks, eval_request, connect)
    served = max(versions)  # until a push lands
    return Run(config, learner, state, publisher, served, feed, log, evaluation)


# ---------------------------------------------------------------- set-up's parts


def _weight_sync(config: TrainConfig) -> WeightSync:
    """Clients of the gateways' admin APIs (by default the rollout server's nodes'
    gateways) and of the engines; nothing checked yet."""
    settings = config.weight_sync
    if not settings.gateways:
        found = rollout_gateways(config.rollout.server_url, config.rollout.control_token)
        settings = settings.model_copy(update={"gateways": found})
    adapter_name = config.lora.served_name if config.lora else None
    return WeightSync.from_settings(settings, adapter_name=adapter_name)


def _feed(
    config: TrainConfig,
    tasks: list[Task],
    connect: Callable[[], RolloutClient],
    request: GroupRequest,
    cursor: int,
) -> RolloutFeed:
    return RolloutFeed(
        connect,
        task_order(tasks, seed=config.seed, shuffle=config.rollout.shuffle),
        request,
        inflight=config.rollout.max_inflight_groups,
        cursor=cursor,
    )


def _log(config: TrainConfig, first_step: int) -> MetricsLog:
    return MetricsLog(
        config.output_dir,
        jsonl=config.log.jsonl,
        tensorboard=config.log.tensorboard,
        progress=config.log.progress,
        total_steps=config.steps,
        first_step=first_step,
    )


def _learner(
    config: TrainConfig,
    base: Path,
    device: torch.device,
    precision: Precision,
    adapters: Path | None,
) -> Learner:
    # float32 master weights (and so AdamW state) whatever optim.dtype: see polar.precision
    try:
        model: CausalLM = load_policy(
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
        raise TrainError(str(exc)) from None
    reference: Any = None
    if config.grpo.kl_coef > 0:
        reference = load_master(config.model).to(device)
        reference.train(False)
        reference.requires_grad_(False)
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
    return Learner(
        model, reference, optimizer, scheduler, _loss(config), _step(config, model, precision)
    )


def _loss(config: TrainConfig) -> LossSettings:
    return LossSettings(
        clip_low=config.grpo.clip_low,
        clip_high=config.grpo.clip_high,
        tis_cap=config.grpo.tis_cap,
        kl_coef=config.grpo.kl_coef,
        aggregation=config.grpo.aggregation,
    )


def _step(config: TrainConfig, model: CausalLM, precision: Precision) -> StepSettings:
    return StepSettings(
        minibatches=config.optim.minibatches,
        micro_batch_tokens=config.optim.micro_batch_tokens,
        max_grad_norm=config.optim.max_grad_norm,
        logprob_chunk=config.optim.logprob_chunk,
        pad_id=_pad_id(model),
        precision=precision,
        packed=_packed(config.optim.packing, model),
    )


def _first_version(
    config: TrainConfig, state: TrainState, versions: list[int], *, resumed: bool
) -> int:
    """The trainer's policy version before its first step: the checkpoint's, or
    what the gateways serve; with ``sync_on_start`` one no gateway has served."""
    version = state.policy_version if resumed else max(versions)
    if config.weight_sync.sync_on_start:
        # pushed weights get a number no gateway has served (a version names one set of weights)
        return max(version, max(versions) + 1)
    if set(versions) != {version}:
        raise TrainError(
            f"weight_sync: gateways are at policy versions {versions}, the trainer at "
            f"{version}; set weight_sync.sync_on_start to push the trainer's weights"
        )
    return version


def _group_request(config: TrainConfig) -> GroupRequest:
    return GroupRequest(
        harness=config.rollout.harness,
        group_size=config.rollout.group_size,
        builder=config.rollout.builder,
        session_timeout_s=config.rollout.session_timeout_s,
        max_resamples=config.rollout.max_resamples,
        wait_s=config.rollout.group_timeout_s,
        sampling=config.rollout.sampling,
    )


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


def _packed(packing: Packing, model: CausalLM) -> bool:
    match packing:
        case Packing.ON:
            return True
        case Packing.OFF:
            return False
        case Packing.AUTO:
            attention = str(getattr(model.config, "_attn_implementation", None) or "")
            return attention.startswith("flash_attention")
    raise AssertionError(packing)


def _pad_id(model: CausalLM) -> int:
    for value in (model.config.pad_token_id, model.config.eos_token_id):
        if isinstance(value, int):
            return value
        if isinstance(value, list) and value:
            return int(value[0])
    return 0
