"""The trainer's logprobs of given tokens under a causal LM, each of the
distribution its token was sampled from.

Every loss token carries the sampling distribution the engine drew it from
(:class:`polar.ir.Distribution`: temperature, top-p, top-k, min-p), and its
logprob here is of that same distribution, made from the trainer's logits by
:mod:`polar.distribution`, the definition the embedded engine samples with and
vLLM's sampler follows. So ``pi_old / pi_rollout`` compares like with like.

A token the engine sampled may fall outside the support the trainer's own
logits give (a top-p or top-k boundary that a tiny numerical difference
moves): it is reported in ``outside`` and its logprob computed as if it were
kept (finite, so no NaN reaches the gradient); the step gives it no weight.

The vocabulary projection dominates a small model's cost and memory (Qwen3's
151,936 x hidden), so it is applied only at the positions that predict a loss
token, in chunks; with gradients on, each chunk is recomputed in the backward
pass (activation checkpointing) rather than keeping ``[N, vocab]`` logits alive.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.utils.checkpoint import checkpoint

from polar.causallm import CausalLM
from polar.distribution import Settings, support
from polar.train.batch import MicroBatch


class TokenLogprobs(NamedTuple):
    values: torch.Tensor
    """``log pi(target)`` [N], differentiable when gradients are enabled."""
    outside: torch.Tensor
    """[N] bool: the target is outside the support of the trainer's distribution."""


def _chunk_logprobs(
    head: Any,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    min_p: torch.Tensor,
    truncates: bool,
    tempered: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits: torch.Tensor = head(hidden).float()  # [n, V]
    settings = Settings(temperature, top_p, top_k, min_p)
    # Known on the host; at temperature 1 the division is one more pass over [n, V].
    scaled = logits / temperature.unsqueeze(1) if tempered else logits
    outside = torch.zeros_like(targets, dtype=torch.bool)
    if truncates:  # known on the host: asking the tensors would wait for the GPU
        keep = support(scaled, settings)
        outside = ~keep.gather(1, targets.unsqueeze(1)).squeeze(1)
        keep.scatter_(1, targets.unsqueeze(1), True)  # finite logprob; weighted 0 later
        scaled = scaled.masked_fill(~keep, -torch.inf)
    picked = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1), outside  # [n], [n]


def token_logprobs(model: CausalLM, batch: MicroBatch, *, chunk: int = 512) -> TokenLogprobs:
    """The logprobs of the batch's loss tokens, each under its own distribution."""
    hidden = model.get_decoder()(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,  # training: no KV cache (and packed traces need none)
    ).last_hidden_state  # [B, T, H]
    picked = hidden[batch.rows, batch.cols]  # [N, H]
    head = model.get_output_embeddings()
    s = batch.sampling
    values, outside = [], []
    for start in range(0, picked.shape[0], chunk):
        part = slice(start, start + chunk)
        args = (
            head,
            picked[part],
            batch.targets[part],
            s.temperature[part],
            s.top_p[part],
            s.top_k[part],
            s.min_p[part],
            batch.truncates,
            batch.tempered,
        )
        if torch.is_grad_enabled():
            value, out = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            value, out = _chunk_logprobs(*args)
        values.append(value)
        outside.append(out)
    if not values:
        empty = torch.zeros(0, dtype=torch.float32, device=picked.device)
        return TokenLogprobs(empty, torch.zeros(0, dtype=torch.bool, device=picked.device))
    return TokenLogprobs(torch.cat(values), torch.cat(outside))
