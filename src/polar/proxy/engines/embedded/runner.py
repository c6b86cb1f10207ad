"""A batched generator for Hugging Face causal LMs (``transformers`` + torch), on
the CPU in float32 or on a CUDA GPU in bfloat16.

One worker thread owns the model. Requests that wait while a batch runs form
the next batch (up to ``max_batch``, and as many as fit the memory budget):
prompts are left-padded, prefilled together with one KV cache, then decoded
step by step; each finished or cancelled sequence stops reporting while the
rest continue. Torch releases the GIL in its kernels, so the server's event
loop keeps serving meanwhile.

Memory stays bounded on long prompts (an agent CLI's first prompt is 8k-19k
tokens): the prefill runs in chunks of ``prefill_chunk`` positions, and only
the last position's logits are computed (``logits_to_keep=1``), never the
whole prompt's (a 19k-token prompt would take 11 GB of logits alone).
:meth:`ModelRunner.memory_needed` estimates what a request takes (KV cache,
one chunk's attention scores and mask); the server refuses a request above
``max_memory_bytes`` with a clear error instead of letting the kernel kill
the process.

A request that leaves temperature, top-p, top-k or min-p unset gets the
model's own default from its ``generation_config.json`` (a Qwen3 checkpoint
ships temperature 0.6, top-p 0.95, top-k 20), else the neutral one, as vLLM
does with its default ``--generation-config auto``.

Logprobs are those of the distribution each token was drawn from
(``logprobs_mode="processed"``, the default: temperature, min-p, top-k and
top-p applied as :mod:`polar.distribution` defines them, the same definition
the trainer recomputes), as vLLM reports them with ``--logprobs-mode
processed_logprobs``; ``"raw"`` reports the model's own distribution, vLLM's
default.

:meth:`ModelRunner.load_weights` swaps in new weights between batches, for a
trainer that updates the policy in place: full weights (a ``.safetensors``
file or a model directory, in any dtype: they are cast to the engine's), or
LoRA adapters merged in place (:mod:`polar.proxy.engines.embedded.adapters`).

On a GPU (``device`` ``cuda``) the model runs in bfloat16 and a decode step
samples every row of the batch at once (:func:`sample_rows`: one transfer to
the host per step, not one per row); a seeded request is still drawn from its
own generator, on the host, so its tokens do not depend on the batch. The CPU
path is unchanged: float32, one row at a time (:func:`sample`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from polar.adapters import is_adapter, read_adapter
from polar.causallm import CausalLM, load_causal_lm
from polar.distribution import Settings, processed_logits
from polar.ir import Distribution
from polar.ir.behaviour import GREEDY_BELOW
from polar.proxy.engines.defaults import generation_defaults
from polar.proxy.engines.embedded.adapters import MergedAdapters


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no limit
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    logit_bias: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Step:
    """One sampled token, or the end of a sequence (``finish`` set)."""

    token_id: int | None
    logprob: float | None
    finish: Literal["stop", "length", "abort"] | None = None
    error: str | None = None


@dataclass(slots=True)
class Job:
    prompt: list[int]
    params: SamplingParams
    emit: Callable[[Step], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    produced: int = 0
    done: bool = False
    generator: torch.Generator | None = None


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    *,
    mode: Literal["raw", "processed"] = "processed",
) -> tuple[int, float]:
    """Pick a token from one row of logits; return it and its logprob (of the
    distribution sampled from, or with ``mode="raw"`` of the model's own)."""
    logits = logits.float()
    if params.logit_bias:
        logits = logits.clone()
        for token, bias in params.logit_bias:
            logits[token] += bias
    if params.temperature < GREEDY_BELOW:
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, dim=-1)[token])
    settings = Settings.of(
        [Distribution(params.temperature, params.top_p, params.top_k, params.min_p)]
    )
    processed = torch.log_softmax(processed_logits(logits.unsqueeze(0), settings)[0], dim=-1)
    token = int(torch.multinomial(processed.exp(), 1, generator=generator))
    if mode == "processed":
        return token, float(processed[token])
    return token, float(torch.log_softmax(logits, dim=-1)[token])


def sample_rows(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    *,
    mode: Literal["raw", "processed"] = "processed",
) -> list[tuple[int, float]]:
    """:func:`sample` for every row of ``logits`` [B, V] at once, on their device:
    the same distribution per row, one host transfer for the batch. A row with a
    generator (a seeded request) draws from it on the host."""
    logits = logits.float()
    if any(p.logit_bias for p in params):
        logits = logits.clone()  # the caller's logits stay as they were
    for row, p in enumerate(params):
        for token, bias in p.logit_bias:
            logits[row, token] += bias
    greedy = torch.tensor([p.temperature < GREEDY_BELOW for p in params], device=logits.device)
    settings = Settings.of(
        [
            Distribution(
                1.0 if p.temperature < GREEDY_BELOW else p.temperature, p.top_p, p.top_k, p.min_p
            )
            for p in params
        ],
        device=logits.device,
    )
    raw = torch.log_softmax(logits, dim=-1)  # [B, V]
    processed = torch.log_softmax(processed_logits(logits, settings), dim=-1)  # [B, V]
    drawn = torch.multinomial(processed.exp(), 1).squeeze(1)  # [B]
    for row, generator in enumerate(generators):
        if generator is not None and not params[row].temperature < GREEDY_BELOW:
            drawn[row] = torch.multinomial(processed[row].exp().cpu(), 1, generator=generator)[0]
    tokens = torch.where(greedy, logits.argmax(dim=-1), drawn)  # [B]
    chosen = raw if mode == "raw" else torch.where(greedy.unsqueeze(1), raw, processed)
    values = chosen.gather(1, tokens.unsqueeze(1)).squeeze(1)  # [B]
    return list(zip(tokens.tolist(), values.tolist(), strict=True))


def default_sampling(generation_config: Any) -> SamplingParams:
    """The sampling defaults a model's generation config sets, as vLLM reads them
    (:func:`polar.proxy.engines.defaults.generation_defaults`)."""
    defaults = generation_defaults(generation_config)
    assert defaults.temperature is not None and defaults.top_p is not None
    return SamplingParams(
        temperature=defaults.temperature,
        top_p=defaults.top_p,
        top_k=defaults.top_k or 0,
        min_p=defaults.min_p or 0.0,
    )


class ModelRunner:
    def __init__(
        self,
        model_dir: Path,
        *,
        max_batch: int = 8,
        threads: int | None = None,
        logprobs_mode: Literal["raw", "processed"] = "processed",
        prefill_chunk: int = 1024,
        max_memory_bytes: int = 4 << 30,
        device: torch.device | str = "cpu",
        batch_sampling: bool | None = None,
    ) -> None:
        """``device``: where the model runs (resolved, see :mod:`polar.device`);
        float32 on the CPU, bfloat16 on a GPU. ``batch_sampling``: sample a decode
        step's rows at once (:func:`sample_rows`) rather than one by one
        (:func:`sample`); default: on a GPU only."""
        if prefill_chunk < 1:
            raise ValueError("prefill_chunk must be at least 1")
        if threads:
            torch.set_num_threads(threads)
        self.model_dir = model_dir
        self.device = torch.device(device)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.batch_sampling = (
            self.device.type != "cpu" if batch_sampling is None else batch_sampling
        )
        model: CausalLM = load_causal_lm(model_dir, dtype=self.dtype)
        self.model = model.to(self.device)
        self.model.train(False)  # inference mode: no dropout
        config = self.model.config
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = config.eos_token_id
        self.eos_ids = frozenset(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.default_sampling = default_sampling(self.model.generation_config)
        self.vocab_size = int(config.vocab_size)
        self.max_model_len = int(getattr(config, "max_position_embeddings", 32768))
        self.pad_id = int(config.pad_token_id if config.pad_token_id is not None else 0)
        self.max_batch = max_batch
        self.logprobs_mode = logprobs_mode
        self.prefill_chunk = prefill_chunk
        self.max_memory_bytes = max_memory_bytes
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        # keys and values in the model's dtype, every layer: bytes per cached position
        size = self.dtype.itemsize
        self._kv_bytes = 2 * int(config.num_hidden_layers) * kv_heads * head_dim * size
        self._heads = heads
        self.weights_version = 0
        self.weights_source = str(model_dir)
        self.policy_version: int | None = None
        """The trainer's version of the weights loaded last, when it said."""
        self.adapters = MergedAdapters()
        self._waiting: deque[Job] = deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._weights_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="polar-engine", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- API

    def memory_needed(self, prompt_tokens: int, max_tokens: int, rows: int = 1) -> int:
        """Bytes a batch of ``rows`` sequences this long takes at its peak, about:
        the KV cache for prompt + output, and during prefill one chunk's
        attention scores (every head) and mask against the whole prompt."""
        length = prompt_tokens + max_tokens
        chunk = min(self.prefill_chunk, prompt_tokens)
        scores = chunk * prompt_tokens * (self._heads + 1) * 4
        logits = 3 * self.vocab_size * 4  # the kept row, its softmax, the sampling copy
        return rows * (length * self._kv_bytes + scores + logits)

    def fits(self, prompt_tokens: int, max_tokens: int) -> bool:
        return self.memory_needed(prompt_tokens, max_tokens) <= self.max_memory_bytes

    def submit(self, job: Job) -> None:
        self.submit_many([job])

    def submit_many(self, jobs: list[Job]) -> None:
        """Queue jobs at once, so they start in the same batch when it has room."""
        for job in jobs:
            if job.params.seed is not None:
                job.generator = torch.Generator().manual_seed(job.params.seed)
        with self._cv:
            self._waiting.extend(jobs)
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout=30)

    def load_weights(
        self, source: Path | dict[str, torch.Tensor], *, policy_version: int | None = None
    ) -> int:
        """Replace the weights (a model directory, a ``.safetensors`` file, or a
        state dict), or merge LoRA adapters (a directory of peft's files); takes
        effect from the next batch. Returns the new weights version."""
        if isinstance(source, Path) and is_adapter(source):
            adapter = read_adapter(source)
            with self._weights_lock:
                self.adapters.apply(self.model, adapter)
                self.weights_version += 1
                self.weights_source = str(source)
                self.policy_version = policy_version
            return self.weights_version
        if isinstance(source, dict):
            state = source
            label = "state dict"
        else:
            from safetensors.torch import load_file

            files = [source] if source.is_file() else sorted(source.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no .safetensors weights in {source}")
            state = {}
            for file in files:
                state.update(load_file(str(file)))
            label = str(source)
        with self._weights_lock:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
            if unexpected or set(missing) - tied:
                raise ValueError(
                    f"weights do not fit the model: missing {sorted(set(missing) - tied)[:5]}, "
                    f"unexpected {sorted(unexpected)[:5]}"
                )
            self.adapters.forget()
            self.weights_version += 1
            self.weights_source = label
            self.policy_version = policy_version
        return self.weights_version

    # ---------------------------------------------------------------- worker

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    for job in self._waiting:
                        job.emit(Step(None, None, finish="abort", error="engine shutting down"))
                    return
                batch = self._next_batch()
            try:
                with self._weights_lock, torch.inference_mode():
                    self._run(batch)
            except Exception as exc:  # report to every caller; keep serving
                for job in batch:
                    if not job.done:
                        job.done = True
                        job.emit(
                            Step(None, None, finish="abort", error=f"{type(exc).__name__}: {exc}")
                        )

    def _next_batch(self) -> list[Job]:
        """The longest run of waiting jobs that fits ``max_batch`` and the memory
        budget (padded to the longest prompt); always at least one."""
        batch = [self._waiting.popleft()]
        width, longest = len(batch[0].prompt), batch[0].params.max_tokens
        while self._waiting and len(batch) < self.max_batch:
            head = self._waiting[0]
            wider, longer = max(width, len(head.prompt)), max(longest, head.params.max_tokens)
            if self.memory_needed(wider, longer, len(batch) + 1) > self.max_memory_bytes:
                break
            batch.append(self._waiting.popleft())
            width, longest = wider, longer
        return batch

    def _run(self, batch: list[Job]) -> None:
        width = max(len(job.prompt) for job in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, job in enumerate(batch):
            ids[row, width - len(job.prompt) :] = torch.tensor(job.prompt, dtype=torch.long)
            mask[row, width - len(job.prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = None
        for start in range(0, width, self.prefill_chunk):
            end = min(start + self.prefill_chunk, width)
            out = self.model(
                input_ids=ids[:, start:end],
                attention_mask=mask[:, :end],
                position_ids=positions[:, start:end],
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = out.past_key_values
        logits = out.logits[:, -1, :]
        last = positions[:, -1]
        while True:
            next_ids = torch.full((len(batch), 1), self.pad_id, dtype=torch.long)
            drawn = self._draw(batch, logits)
            for row, job in enumerate(batch):
                if job.done:
                    continue
                if job.cancelled.is_set():
                    job.done = True
                    job.emit(Step(None, None, finish="abort"))
                    continue
                token, logprob = (
                    drawn[row]
                    if drawn is not None
                    else sample(logits[row], job.params, job.generator, mode=self.logprobs_mode)
                )
                job.produced += 1
                next_ids[row, 0] = token
                finish: Literal["stop", "length"] | None = None
                if token in job.params.stop_token_ids or token in self.eos_ids:
                    finish = "stop"
                elif job.produced >= job.params.max_tokens:
                    finish = "length"
                job.done = finish is not None
                job.emit(Step(token, logprob, finish=finish))
            if all(job.done for job in batch):
                return
            mask = torch.cat([mask, mask.new_ones((len(batch), 1))], dim=1)
            last = last + 1
            out = self.model(
                input_ids=next_ids.to(self.device),
                attention_mask=mask,
                position_ids=last.unsqueeze(1),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = out.past_key_values
            logits = out.logits[:, -1, :]

    def _draw(self, batch: list[Job], logits: torch.Tensor) -> list[tuple[int, float]] | None:
        """Every row's token at once (:func:`sample_rows`), or None where rows are
        sampled one by one (the CPU's default)."""
        if not self.batch_sampling:
            return None
        return sample_rows(
            logits,
            [job.params for job in batch],
            [job.generator for job in batch],
            mode=self.logprobs_mode,
        )


def describe(runner: ModelRunner) -> dict[str, Any]:
    adapter = runner.adapters.current
    return {
        "model_dir": str(runner.model_dir),
        "device": str(runner.device),
        "dtype": str(runner.dtype).removeprefix("torch."),
        "weights_version": runner.weights_version,
        "weights_source": runner.weights_source,
        "policy_version": runner.policy_version,
        "adapter": None
        if adapter is None
        else {"source": adapter.source, "rank": adapter.rank, "modules": len(adapter.factors)},
        "max_batch": runner.max_batch,
        "max_model_len": runner.max_model_len,
        "prefill_chunk": runner.prefill_chunk,
        "default_sampling": {
            "temperature": runner.default_sampling.temperature,
            "top_p": runner.default_sampling.top_p,
            "top_k": runner.default_sampling.top_k,
            "min_p": runner.default_sampling.min_p,
        },
        "max_memory_bytes": runner.max_memory_bytes,
        "logprobs_mode": runner.logprobs_mode,
    }
