"""One GRPO step on a GPU through ``polar.train``, beside plain PyTorch on the same
batches; the embedded engine's decoding beside Hugging Face ``generate``.

    python benchmarks/train_gpu.py                       # Qwen3-0.6B shape, cuda
    python benchmarks/train_gpu.py --shape qwen3-4b --gradient-checkpointing --no-engine
    python benchmarks/train_gpu.py --device cpu --shape tiny   # runs anywhere, small

A model of the named shape with random weights (no download) trains on
synthetic traces: ``--groups`` x ``--group-size`` sessions of ``--prompt``
prompt and ``--response`` response tokens, every response token trained
(the Qwen3-0.6B default: 64 traces of 1,024 + 512 tokens, 98,304 tokens a
step, as in ``shared/gpu/README.md``). Measured, one JSON line each:

- ``polar``: the policy made ready by ``polar.train.policy.prepare`` (float32
  master weights, gradient checkpointing and LoRA when asked, the memory
  estimate checked) and one step of ``polar.train.step.train_step`` (forward
  under bfloat16 autocast on a GPU, micro-batches of ``--micro-batch-tokens``,
  logprobs only at the loss positions, fused AdamW): tokens/s, step seconds,
  peak GPU memory, model FLOP utilisation (6 x parameters x tokens / seconds,
  against the GPU's dense bfloat16 peak when known, as ``shared/gpu/README.md``
  counts it: recomputation not counted, and with LoRA an overstatement, since
  frozen weights get no gradient) and the memory estimate;
- ``plain``: plain PyTorch on the very same micro-batches and model, full
  logits, the same objective (ratio x advantage, token weights), the same
  precision and optimizer;
- ``engine`` and ``generate`` (``--no-engine`` to skip): the embedded engine
  (``polar.proxy.engines.embedded.runner.ModelRunner`` on the device: bfloat16,
  batched decode with a KV cache) against ``generate`` of the same model on
  the same random prompts, ``--engine-batch`` of ``--engine-prompt`` tokens,
  ``--engine-new`` new tokens each, sampled at temperature 1.

Each training measurement is the median of ``--steps`` steps after one
warm-up step. Needs torch and transformers, numpy, safetensors, pydantic,
pyyaml, orjson, starlette (peft with ``--lora``): ``benchmarks/gpu_check.sh``
says how to bring them to a machine without network.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SHAPES: dict[str, dict[str, int]] = {
    "qwen3-0.6b": {
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
    "qwen3-4b": {
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
    },
}
VOCAB = 151_936
DENSE_BF16 = {"H100": 989e12, "H200": 989e12, "H800": 989e12, "A100": 312e12, "L40S": 362e12}
"""Dense bfloat16 peak FLOP/s by GPU name (without sparsity)."""


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--response", type=int, default=512)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument(
        "--logprob-chunk",
        type=int,
        default=512,
        help="loss tokens projected onto the vocabulary at once (optim.logprob_chunk)",
    )
    parser.add_argument("--steps", type=int, default=2, help="measured steps (after a warm-up)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--lora", type=int, default=0, help="LoRA rank (0: full fine-tune)")
    parser.add_argument("--no-baseline", action="store_true", help="skip plain PyTorch")
    parser.add_argument("--no-engine", action="store_true", help="skip the engine and generate")
    parser.add_argument("--engine-batch", type=int, default=64)
    parser.add_argument("--engine-prompt", type=int, default=1024)
    parser.add_argument("--engine-new", type=int, default=256)
    return parser.parse_args(argv)


# ---------------------------------------------------------------- set-up


def build_model(shape: str, device: torch.device) -> Any:
    """Random weights of ``shape``, float32 (the trainer's master weights), built
    on ``device`` (a 4B model is initialised faster there than on the CPU)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=VOCAB,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        **SHAPES[shape],
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen3ForCausalLM(config)


def synthetic_rows(args: argparse.Namespace) -> list[Any]:
    """Groups of sessions rewarded 0 and 1 in turn (advantages of both signs),
    random token ids and rollout logprobs, token-mean weights."""
    from polar.train.batch import Row

    rng = random.Random(0)
    total = args.groups * args.group_size * args.response
    rows = []
    for g in range(args.groups):
        rewards = [float(s % 2) for s in range(args.group_size)]
        mean = sum(rewards) / len(rewards)
        for s in range(args.group_size):
            rows.append(
                Row(
                    session=f"g{g}s{s}",
                    ids=tuple(
                        rng.randrange(1000, 150000) for _ in range(args.prompt + args.response)
                    ),
                    start=args.prompt,
                    loss_mask=(1,) * args.response,
                    # about a random model's own (log 1/V): importance weights near 1
                    rollout_logprobs=tuple(
                        -math.log(VOCAB) + rng.gauss(0.0, 0.1) for _ in range(args.response)
                    ),
                    logprob_mask=(1,) * args.response,
                    advantage=rewards[s] - mean,
                    weight=1.0 / total,
                    policy_version=0,
                )
            )
    return rows


class Clock:
    """Wall time and peak memory of a measured call, synchronised on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self, work: Callable[[], Any]) -> tuple[float, float | None]:
        gpu = self.device.type == "cuda"
        if gpu:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        started = time.perf_counter()
        work()
        if gpu:
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated(self.device) / 2**30 if gpu else None
        return seconds, peak


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in DENSE_BF16.items() if k in name), None)


def report(
    test: str,
    times: list[tuple[float, float | None]],
    tokens: int,
    params: int,
    flops: float | None,
    **extra: Any,
) -> None:
    seconds = statistics.median(t for t, _ in times)
    peaks = [p for _, p in times if p is not None]
    say(
        test=test,
        seconds=round(seconds, 3),
        tokens_per_s=round(tokens / seconds),
        peak_gib=round(max(peaks), 1) if peaks else None,
        mfu=round(6 * params * tokens / seconds / flops, 3) if flops else None,
        steps=len(times),
        **extra,
    )


# ---------------------------------------------------------------- training


def train(args: argparse.Namespace, device: torch.device) -> Any:
    from polar.precision import default_precision
    from polar.train.batch import microbatches
    from polar.train.config import LoraSettings
    from polar.train.memory import MemorySettings, ModelShape, estimate
    from polar.train.policy import PolicySettings, prepare, trainable
    from polar.train.step import LossSettings, StepSettings, train_step

    precision = default_precision(device)
    lora = LoraSettings(r=args.lora, alpha=2 * args.lora) if args.lora else None
    settings = PolicySettings(
        device=device,
        precision=precision,
        micro_batch_tokens=args.micro_batch_tokens,
        logprob_chunk=args.logprob_chunk,
        gradient_checkpointing=args.gradient_checkpointing,
        lora=lora,
    )
    built = time.perf_counter()
    model = prepare(build_model(args.shape, device), settings)
    shape = ModelShape.of(model)
    need = estimate(
        shape,
        MemorySettings(
            micro_batch_tokens=args.micro_batch_tokens,
            logprob_chunk=settings.logprob_chunk,
            gradient_checkpointing=args.gradient_checkpointing,
            bfloat16=precision.value == "bfloat16",
            reference=False,
        ),
    )
    rows = synthetic_rows(args)
    tokens = sum(len(r.ids) for r in rows)
    say(
        shape=args.shape,
        parameters=shape.parameters,
        trainable=shape.trainable,
        precision=f"float32 master weights, {precision.value} compute",
        gradient_checkpointing=args.gradient_checkpointing,
        lora=args.lora or None,
        traces=len(rows),
        tokens_per_step=tokens,
        micro_batch_tokens=args.micro_batch_tokens,
        logprob_chunk=args.logprob_chunk,
        estimate_gib=round(need.total / 2**30, 1),
        build_s=round(time.perf_counter() - built, 1),
    )
    flops = peak_flops(device)
    clock = Clock(device)
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(trainable(model), lr=1e-6, fused=fused or None)
    step = StepSettings(
        micro_batch_tokens=args.micro_batch_tokens,
        logprob_chunk=args.logprob_chunk,
        pad_id=0,
        precision=precision,
    )
    times = []
    result: dict[str, float] = {}

    def polar_step() -> None:
        result.update(
            train_step(model, optimizer, rows, loss=LossSettings(), settings=step, policy_version=0)
        )

    for i in range(args.steps + 1):
        measured = clock(polar_step)
        if i:
            times.append(measured)
    report(
        "polar",
        times,
        tokens,
        shape.parameters,
        flops,
        grad_norm=float(f"{result['trainer/grad_norm']:.4g}"),
    )

    if not args.no_baseline:
        mbs = [
            mb.to(device) for mb in microbatches(rows, max_tokens=args.micro_batch_tokens, pad_id=0)
        ]
        try:
            times = [
                clock(lambda: plain_step(model, optimizer, mbs, precision))
                for _ in range(args.steps + 1)
            ][1:]
            report("plain", times, tokens, shape.parameters, flops)
        except torch.OutOfMemoryError as exc:
            say(test="plain", ok=False, error=f"out of memory: {str(exc).splitlines()[0][:200]}")
        del mbs
    optimizer.zero_grad(set_to_none=True)
    optimizer.state.clear()
    return model


def plain_step(model: Any, optimizer: Any, mbs: list[Any], precision: Any) -> None:
    """The same objective written plainly: full logits, log-softmax at the loss
    positions, ratio x advantage x token weight; same autocast, same optimizer."""
    from polar.precision import autocast

    model.train()
    optimizer.zero_grad(set_to_none=True)
    for mb in mbs:
        with autocast(precision, mb.input_ids.device):
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
            picked = logits[mb.rows, mb.cols].float()  # [N, V]
            logprobs = picked.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(
                picked, dim=-1
            )
            ratio = torch.exp(logprobs - logprobs.detach())
            objective = -(mb.weights.float() * ratio * mb.advantages).sum()
        objective.backward()
        del logits, picked
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    model.train(False)


# ---------------------------------------------------------------- decoding


def save_for_engine(model: Any) -> Path:
    """The trained model's base weights in bfloat16, as a model directory."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    scratch = Path(tempfile.mkdtemp(prefix="polar-train-gpu-"))
    state = {
        k.replace(".base_layer", ""): v.detach().to(torch.bfloat16)
        for k, v in base.state_dict().items()
        if ".lora_" not in k
    }
    base.save_pretrained(str(scratch), state_dict=state)
    return scratch


def decode(args: argparse.Namespace, device: torch.device, scratch: Path) -> None:
    """The embedded engine and ``generate`` on the same weights and prompts."""
    from polar.proxy.engines.embedded.runner import Job, ModelRunner, SamplingParams, Step

    rng = random.Random(1)
    prompts = [
        [rng.randrange(1000, 150000) for _ in range(args.engine_prompt)]
        for _ in range(args.engine_batch)
    ]
    runner = ModelRunner(
        scratch,
        max_batch=args.engine_batch,
        device=device,
        max_memory_bytes=1 << 40,  # the benchmark sizes its own batch
    )
    try:

        def run(batch: list[list[int]], new: int) -> int:
            done = threading.Semaphore(0)
            produced = [0]
            lock = threading.Lock()

            def emit(step: Step) -> None:
                if step.token_id is not None:
                    with lock:
                        produced[0] += 1
                if step.finish is not None:
                    done.release()

            params = SamplingParams(max_tokens=new, temperature=1.0)
            runner.submit_many([Job(prompt=p, params=params, emit=emit) for p in batch])
            for _ in batch:
                done.acquire()
            return produced[0]

        run(prompts[:2], 4)  # warm-up
        clock = Clock(device)
        made = [0]
        seconds, _ = clock(lambda: made.__setitem__(0, run(prompts, args.engine_new)))
        say(
            test="engine",
            batch=args.engine_batch,
            prompt=args.engine_prompt,
            new_tokens=made[0],
            seconds=round(seconds, 2),
            new_tokens_per_s=round(made[0] / seconds),
            dtype=str(runner.dtype).removeprefix("torch."),
        )
        hf = runner.model
        ids = torch.tensor(prompts, device=device)
        with torch.inference_mode():
            hf.generate(
                ids[:2],
                attention_mask=torch.ones_like(ids[:2]),
                max_new_tokens=4,
                do_sample=True,
                pad_token_id=0,
            )

            def generate() -> None:
                out = hf.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=args.engine_new,
                    min_new_tokens=args.engine_new,
                    do_sample=True,
                    temperature=1.0,
                    top_p=1.0,
                    top_k=0,
                    pad_token_id=0,
                )
                made[0] = (out.shape[1] - ids.shape[1]) * ids.shape[0]

            seconds, _ = clock(generate)
        say(
            test="generate",
            batch=args.engine_batch,
            prompt=args.engine_prompt,
            new_tokens=made[0],
            seconds=round(seconds, 2),
            new_tokens_per_s=round(made[0] / seconds),
        )
    finally:
        runner.close()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import transformers

    from polar.device import resolve_device

    device = resolve_device(args.device)
    say(
        device=str(device),
        gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        torch=torch.__version__,
        transformers=transformers.__version__,
        python=sys.version.split()[0],
    )
    started = time.perf_counter()
    failed = False
    model = None
    try:
        model = train(args, device)
    except Exception:
        failed = True
        say(test="train", ok=False, error=traceback.format_exc()[-1500:])
    if not args.no_engine and model is not None:
        try:
            scratch = save_for_engine(model)
            del model  # the training memory back before the engine loads
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            decode(args, device, scratch)
        except Exception:
            failed = True
            say(test="engine", ok=False, error=traceback.format_exc()[-1500:])
    say(done=True, ok=not failed, seconds=round(time.perf_counter() - started, 1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
