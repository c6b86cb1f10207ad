"""The reference trainer's typed configuration (``polar train CONFIG.yaml``), read once.

A bad value is one line naming the field (``grpo.clip_low: Input should be
greater than or equal to 0``); unknown fields are refused. Relative paths are
taken as written (relative to the working directory), like every Polar config.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from polar.configfile import load_config
from polar.device import check_device
from polar.precision import Precision
from polar.proxy.call.behaviour import SamplingPolicy
from polar.rollout.protocol import HarnessSpec
from polar.train.variants import Aggregation, Baseline, MissingLogprob


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _http(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    return value.rstrip("/")


HttpUrl = Annotated[str, AfterValidator(_http)]


class RolloutSettings(_Section):
    server_url: HttpUrl = "http://127.0.0.1:8200"
    """The rollout server the trainer submits groups to."""
    control_token: str | None = Field(default=None, min_length=16)
    tasks: str
    """Where training tasks come from: a task file, a Harbor directory, or ``builtin``."""
    task_ids: list[str] | None = None
    """Only these task ids (default: every task of ``tasks``)."""
    harness: HarnessSpec
    group_size: int = Field(default=4, ge=2, le=1024)
    """Sessions per task: one GRPO group (at least 2: a session alone has no
    group to be compared with, so its advantage is always 0)."""
    groups_per_step: int = Field(default=2, ge=1)
    max_inflight_groups: int = Field(default=4, ge=1)
    """Groups generating at once (submitted, not yet consumed): the asynchrony."""
    max_staleness: int = Field(default=1, ge=0)
    """A group whose oldest token was sampled more than this many policy versions
    before the step that would train on it is dropped (and counted)."""
    builder: Literal["prefix_merge", "per_request"] = "prefix_merge"
    session_timeout_s: float = Field(default=1800.0, gt=0)
    max_resamples: int = Field(default=0, ge=0)
    group_timeout_s: float = Field(default=7200.0, gt=0)
    """Longest wait for one group's result before the run stops with an error."""
    shuffle: bool = True
    """Visit the tasks in a seeded random order, reshuffled every pass."""
    sampling: SamplingPolicy | None = SamplingPolicy()
    """The run's sampling policy, enforced by the node gateways on every call of every
    training session whatever the harness asks (default: temperature 1, no top-p,
    top-k or min-p: the model's own distribution). ``null``: each harness's own
    settings; every record still says which, and tokens whose distribution the
    trainer cannot reproduce are left out and counted (``tokens/unreproducible_*``)."""

    @model_validator(mode="after")
    def _check(self) -> RolloutSettings:
        if self.max_inflight_groups < self.groups_per_step:
            raise ValueError(
                f"max_inflight_groups ({self.max_inflight_groups}) must be at least "
                f"groups_per_step ({self.groups_per_step})"
            )
        return self


class Packing(StrEnum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


class EngineKind(StrEnum):
    EMBEDDED = "embedded"
    VLLM = "vllm"
    SGLANG = "sglang"


class EngineTarget(_Section):
    kind: EngineKind
    url: HttpUrl
    api_key: str | None = None


class PushFailure(StrEnum):
    """What a run does with a weight push whose drain timed out on every try."""

    SKIP = "skip"
    """Keep training (logged, counted in ``push/skipped_total``): the gateways keep
    serving the version they had, and the next push carries the newer weights."""
    STOP = "stop"
    """End the run with the error."""


class GatewayTarget(_Section):
    url: HttpUrl
    admin_token: str = Field(min_length=16)


class WeightSyncSettings(_Section):
    gateways: list[GatewayTarget] = Field(default_factory=list)
    """Every gateway whose calls the engines serve: all are paused around a push.
    Left out: the gateways of the rollout server's nodes, as it lists them under
    ``rollout.control_token`` (``GET /gateways``: their URLs and admin tokens), at start."""
    engines: list[EngineTarget] = Field(min_length=1)
    drain_timeout_s: float = Field(default=300.0, gt=0)
    """How long a push waits for in-flight calls to finish on the old weights."""
    push_retries: int = Field(default=2, ge=0)
    """Tries after a drain that timed out (nothing was loaded; the gateways resumed
    on the old version and are paused again)."""
    retry_backoff_s: float = Field(default=5.0, ge=0)
    """The wait before the first retry, doubled before each next one."""
    on_push_failure: PushFailure = PushFailure.SKIP
    """After the last retry: ``skip`` the push and keep training, or ``stop``. A
    failed load is never skipped: it stops the run (engines may disagree)."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """Longest wait for one engine to load new weights."""
    sync_on_start: bool = True
    """Push the trainer's weights before the first rollout, so the engines serve
    exactly them (and a broken weight path fails at start, not mid-run)."""
    keep: int = Field(default=2, ge=1)
    """Weight directories kept (the newest ones)."""
    directory: Path | None = None
    """Where pushed weights are written, once per push for every engine, which
    must read it at the same path. Default: shared memory (``/dev/shm``) when
    every engine's URL is on this machine, else ``<output_dir>/weights``
    (:func:`polar.train.weights.push_directory`)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """What full weights are written in: ``auto`` is the dtype every engine says it
    serves (bfloat16 halves a push), float32 when they differ or do not say."""


class GrpoSettings(_Section):
    baseline: Baseline = Baseline.MEAN
    scale_by_std: bool = False
    aggregation: Aggregation = Aggregation.TOKEN_MEAN
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    clip_high: float = Field(default=0.28, ge=0)
    tis_cap: float = Field(default=2.0, ge=1)
    missing_logprob: MissingLogprob = MissingLogprob.TRUST
    kl_coef: float = Field(default=0.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "temperature" in data:
            raise ValueError(
                "temperature: removed; the trainer computes every token's logprob under the "
                "settings it was sampled with (set the run's policy in rollout.sampling)"
            )
        return data


class OptimSettings(_Section):
    lr: float = Field(default=1e-5, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    warmup_steps: int = Field(default=0, ge=0)
    minibatches: int = Field(default=1, ge=1)
    """Optimizer steps per training step (the step's sessions split evenly)."""
    micro_batch_tokens: int = Field(default=16384, ge=64)
    """Tokens (padding included) per forward/backward pass."""
    packing: Packing = Packing.AUTO
    """``on``: traces end to end in a microbatch's rows, no padding
    (``transformers`` attends within each from its position ids); ``off``: one
    row per trace, right-padded; ``auto``: packed where the attention skips the
    other traces' positions (``flash_attention_*``), padded elsewhere (SDPA and
    eager compute the masked positions: packing saves nothing there)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer in backward instead of keeping its
    activations (far less memory, about a third more compute)."""
    check_memory: bool = True
    """Stop at start when the estimate (:mod:`polar.train.memory`) is over what
    the device has; ``false`` where the estimate is wrong."""
    logprob_chunk: int = Field(default=512, ge=1)
    """Loss tokens whose vocabulary projection is computed at once."""
    dtype: Literal["auto"] | Precision = "auto"
    """The forward pass's precision: ``bfloat16`` computes under autocast to
    bfloat16, ``auto`` is bfloat16 on a GPU that has it and float32 on the CPU;
    weights and AdamW state stay float32 either way (:mod:`polar.precision`)."""
    threads: int | None = Field(default=None, ge=1)


class LoraSettings(_Section):
    """Train LoRA adapters (peft) instead of every weight: only the adapters train,
    pushes and checkpoints carry only them (:mod:`polar.train.lora`)."""

    r: int = Field(default=16, ge=1)
    alpha: float = Field(default=32.0, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    """Module names (or suffixes) to adapt; ``all-linear``: every linear layer but
    the output projection."""
    served_name: str = Field(default="polar-lora", min_length=1)
    """The name vLLM serves the adapters under: the gateway's ``engine.model``
    must be it. (The embedded engine merges them into the model it serves.)"""
    export_merged: bool = False
    """At the end, write the base model with the adapters merged in to
    ``<output_dir>/merged`` (a Hugging Face model directory, float32)."""


class LogSettings(_Section):
    jsonl: bool = True
    """``<output_dir>/metrics.jsonl``, one line per step."""
    tensorboard: bool = True
    """``<output_dir>/tensorboard``."""
    progress: bool = True
    """A progress bar on the console."""


class CheckpointSettings(_Section):
    every: int = Field(default=10, ge=0)
    """Save every this many steps (0: only at the end)."""
    keep: int = Field(default=2, ge=1)
    resume: Literal["auto", "never"] | Path = "auto"
    """``auto``: continue from the newest checkpoint in ``<output_dir>/checkpoints``
    if there is one; ``never``: start over; a path: that checkpoint."""


class EvalSettings(_Section):
    tasks: str | None = None
    """Held-out tasks (a task file, a directory, or ``builtin``); none: no evaluation."""
    task_ids: list[str] | None = None
    every: int = Field(default=0, ge=0)
    """Evaluate every this many steps (0: only before the first and after the last)."""
    group_size: int = Field(default=1, ge=1)
    sampling: SamplingPolicy | None = None
    """Default: the rollout's policy (``rollout.sampling``)."""
    greedy: bool = False
    """Also evaluate with greedy decoding (metrics ``eval_greedy/*``), one session
    a task whatever ``group_size`` is."""


class TrainConfig(_Section):
    model: Path
    """The initial policy: a Hugging Face model directory (``polar model init`` builds one)."""
    output_dir: Path = Path("runs/train")
    steps: int = Field(ge=1)
    seed: int = 0
    device: Annotated[str, AfterValidator(check_device)] = "auto"
    """Where the policy trains: ``auto`` (the first GPU, else the CPU), ``cpu``,
    ``cuda`` or ``cuda:N`` (:mod:`polar.device`)."""
    rollout: RolloutSettings
    weight_sync: WeightSyncSettings
    grpo: GrpoSettings = GrpoSettings()
    optim: OptimSettings = OptimSettings()
    lora: LoraSettings | None = None
    """Train LoRA adapters instead of every weight (none: full fine-tuning)."""
    log: LogSettings = LogSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    eval: EvalSettings = EvalSettings()

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if not self.weight_sync.gateways and self.rollout.control_token is None:
            raise ValueError(
                "weight_sync.gateways: list them, or give rollout.control_token so the "
                "rollout server tells the trainer its nodes' gateways"
            )
        if self.lora is not None and any(
            e.kind is EngineKind.SGLANG for e in self.weight_sync.engines
        ):
            raise ValueError(
                "lora: adapters are pushed to embedded and vLLM engines; an SGLang engine "
                "needs full weights (leave lora out)"
            )
        return self


def load_train_config(path: Path | None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read and validate once; :class:`~polar.proxy.config.ConfigError` with one line."""
    return load_config(TrainConfig, path, overrides or {})
