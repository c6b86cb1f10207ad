"""Supervised fine-tuning on a token export (``polar sft DATA --model M --out O``).

Algorithm: next-token cross-entropy on exactly the tokens the model sampled
(``labels`` != -100), nothing else. One optimizer step per batch of
``batch_size`` rows, visited in a seeded order each epoch; a batch runs as
micro-batches of ``micro_batch_size`` rows whose gradients add up. The step's
loss is the sum over its labelled tokens divided by their number (a token
mean, not a mean of per-row means: a long trajectory weighs by what the model
wrote in it). AdamW, linear warm-up then a constant learning rate, gradient
norm clipped. Deterministic given the seed on a CPU.

Precision (:mod:`polar.precision`): the weights and AdamW's state are float32
whatever ``dtype`` says, and so is the model written out; ``dtype`` is the
forward pass's compute (``bfloat16``: under autocast; ``auto``: bfloat16 on a
GPU that has it, float32 otherwise). The output projection runs only at
labelled positions, ``logprob_chunk`` of them at a time, recomputed in the
backward pass (:func:`polar.sft.batching.loss_sum`).

Rows longer than ``max_length`` are left out and counted, never truncated (a
cut trajectory would teach its beginning without its end). The model and its
tokenizer are written to ``out`` atomically, with ``polar-sft.json`` (the
config and the report); ``loss.jsonl`` there logs every step: ``step``,
``epoch``, ``loss``, ``tokens`` (labelled), ``learning_rate``,
``grad_norm``, ``seconds``.

The Python API is :func:`finetune` with a :class:`FinetuneConfig`; the
learning benchmark's warm start calls it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from polar.atomicfile import atomic_directory
from polar.causallm import CausalLM
from polar.device import DeviceError, check_device, resolve_device
from polar.precision import Precision, autocast, default_precision, device_of, load_master
from polar.sft.batching import Batch, collate, learning_rate, loss_sum, micro_batches, step_plan
from polar.sft.export import ExportFileError, ExportFormat, ExportKind, export_path, token_rows

REPORT_FILE = "polar-sft.json"
LOSS_LOG = "loss.jsonl"


class FinetuneError(Exception):
    """Bad training input or settings (the message is one line)."""


# ---------------------------------------------------------------- arguments


class FinetuneConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    data: Path
    """A token export (``tokens.parquet`` / ``tokens.jsonl``) or the directory
    ``polar generate`` wrote it to."""
    model: Path
    """A Hugging Face causal LM directory (weights and tokenizer)."""
    out: Path
    epochs: int = Field(default=1, ge=1)
    max_steps: int | None = Field(default=None, ge=1)
    batch_size: int = Field(default=8, ge=1)
    micro_batch_size: int | None = Field(default=None, ge=1)
    """Rows per forward pass (default: the whole batch)."""
    learning_rate: float = Field(default=1e-5, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    warmup_steps: int = Field(default=0, ge=0)
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    max_length: int | None = Field(default=None, ge=2)
    seed: int = 0
    device: Annotated[str, AfterValidator(check_device)] = "auto"
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (:mod:`polar.device`)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The forward pass's precision (weights and optimizer state stay float32):
    ``auto`` is bfloat16 on a GPU that has it, float32 otherwise."""
    logprob_chunk: int = Field(default=512, ge=1)
    """Labelled tokens whose vocabulary projection is computed at once."""


@dataclass(frozen=True, slots=True)
class FinetuneReport:
    out: str
    steps: int
    rows: int
    rows_too_long: int
    rows_unlabelled: int
    """Rows with no labelled token (nothing to learn from): left out."""
    tokens: int
    """Labelled tokens trained on, over all steps."""
    first_loss: float | None
    last_loss: float | None
    device: str
    precision: str
    """The forward pass's (the weights are float32)."""
    seconds: float


def check_out(config: FinetuneConfig) -> None:
    """Refuse an ``out`` whose replacement would destroy something else: the data,
    the model, or a directory that is not an earlier ``polar sft`` output."""
    out = config.out.resolve()
    for name, path in (("data", config.data), ("model", config.model)):
        path = path.resolve()
        if path == out or out in path.parents:
            raise FinetuneError(f"--out {config.out}: holds the {name}; choose another --out")
    if out.exists() and not out.is_dir():
        raise FinetuneError(f"--out {config.out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / REPORT_FILE).is_file():
        raise FinetuneError(
            f"--out {config.out}: a non-empty directory that is not a polar sft output "
            "(it would be replaced); choose another --out"
        )


def data_file(path: Path) -> Path:
    """The token export ``path`` names (a directory: its tokens.parquet or tokens.jsonl)."""
    if path.is_dir():
        for fmt in (ExportFormat.PARQUET, ExportFormat.JSONL):
            candidate = export_path(path, ExportKind.TOKENS, fmt)
            if candidate.is_file():
                return candidate
        raise FinetuneError(f"{path}: no tokens.parquet or tokens.jsonl in this directory")
    return path


# ---------------------------------------------------------------- the run


def finetune(config: FinetuneConfig, *, progress: bool = False) -> FinetuneReport:
    """Train ``config.model`` on ``config.data``; write the result to ``config.out``."""
    import torch

    from polar.tokenizer import load_tokenizer

    started = time.monotonic()
    check_out(config)
    try:
        rows = token_rows(data_file(config.data))
    except ExportFileError as exc:
        raise FinetuneError(str(exc)) from None
    limit = config.max_length
    too_long = [r for r in rows if limit is not None and len(r.input_ids) > limit]
    unlabelled = [r for r in rows if not r.trained]
    skipped = {id(r) for r in too_long + unlabelled}
    kept = [r for r in rows if id(r) not in skipped]
    if not kept:
        raise FinetuneError(f"{config.data}: no row to train on (empty, or all too long)")
    if not (config.model / "config.json").is_file():
        raise FinetuneError(f"{config.model}: not a model directory (no config.json)")

    try:
        device = resolve_device(config.device)
    except DeviceError as exc:
        raise FinetuneError(str(exc)) from None
    precision = default_precision(device) if config.dtype == "auto" else Precision(config.dtype)
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(config.model)
    model: CausalLM = load_master(config.model).to(device)  # float32 master weights
    vocab = model.get_output_embeddings().weight.shape[0]
    too_big = max(max(r.input_ids) for r in kept)
    if too_big >= vocab:
        raise FinetuneError(f"{config.data}: token id {too_big} is past the model's {vocab}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    plan = step_plan(
        len(kept), batch_size=config.batch_size, epochs=config.epochs, seed=config.seed
    )
    plan = plan[: config.max_steps] if config.max_steps is not None else plan
    steps_per_epoch = -(-len(kept) // config.batch_size)
    micro = config.micro_batch_size or config.batch_size

    losses: list[float] = []
    tokens = 0
    model.train()
    with (
        atomic_directory(config.out) as tmp,
        (tmp / LOSS_LOG).open("w", encoding="utf-8") as log,
        _bar(len(plan), progress) as bar,
    ):
        for step, indices in enumerate(plan):
            # ---- the step: micro-batches whose token-summed losses share one denominator
            lr = learning_rate(step, base=config.learning_rate, warmup_steps=config.warmup_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batches = [
                collate([kept[i] for i in part], pad_id) for part in micro_batches(indices, micro)
            ]
            labelled = sum(b.labelled for b in batches)
            total, norm = sft_step(
                model,
                optimizer,
                batches,
                precision=precision,
                max_grad_norm=config.max_grad_norm,
                chunk=config.logprob_chunk,
            )
            # ---- log
            losses.append(total)
            tokens += labelled
            entry = {
                "step": step,
                "epoch": step // steps_per_epoch,
                "loss": total,
                "tokens": labelled,
                "learning_rate": lr,
                "grad_norm": norm,
                "seconds": round(time.monotonic() - started, 3),
            }
            log.write(json.dumps(entry) + "\n")
            log.flush()
            bar(step, total)

        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        report = FinetuneReport(
            out=str(config.out),
            steps=len(plan),
            rows=len(kept),
            rows_too_long=len(too_long),
            rows_unlabelled=len(unlabelled),
            tokens=tokens,
            first_loss=losses[0] if losses else None,
            last_loss=losses[-1] if losses else None,
            device=str(device),
            precision=precision.value,
            seconds=round(time.monotonic() - started, 3),
        )
        (tmp / REPORT_FILE).write_text(
            json.dumps(
                {"config": config.model_dump(mode="json"), "report": asdict(report)}, indent=2
            )
            + "\n"
        )
    return report


def sft_step(
    model: CausalLM,
    optimizer: Any,
    batches: Sequence[Batch],
    *,
    precision: Precision,
    max_grad_norm: float | None,
    chunk: int = 512,
) -> tuple[float, float]:
    """One optimizer step over the micro-batches of one batch; returns its loss
    (the token mean over every labelled token of ``batches``) and the gradient
    norm before clipping. The micro-batches' token-summed losses share one
    denominator; each forward pass runs under :func:`polar.precision.autocast`,
    its backward outside it."""
    import torch

    device = device_of(model)
    labelled = sum(b.labelled for b in batches)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for batch in batches:
        with autocast(precision, device):
            loss = loss_sum(model, batch.to(device), chunk=chunk) / labelled
        loss.backward()
        total += float(loss.detach())
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm or float("inf"))
    optimizer.step()
    return total, float(norm)


class _bar:
    """A rich progress bar over the steps (shown on a terminal only)."""

    def __init__(self, total: int, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._progress = Progress(
            TextColumn("sft"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            disable=not (enabled and sys.stderr.isatty()),
        )
        self._task = self._progress.add_task("sft", total=total, loss="-")

    def __enter__(self) -> _bar:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(None, None, None)

    def __call__(self, step: int, loss: float) -> None:
        self._progress.update(self._task, completed=step + 1, loss=f"{loss:.4f}")
