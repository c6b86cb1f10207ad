"""How a sampling distribution is made from logits, in torch: the one definition
the embedded engine samples from and the trainer recomputes.

A :class:`~polar.ir.Distribution` of a row of logits, exactly as vLLM's sampler
makes it (``Sampler.sample``: temperature, the min-p processor, then
``apply_top_k_top_p``), so that an engine's processed logprob and the
trainer's agree token for token:

1. the logits are divided by the temperature;
2. **min-p**: tokens whose probability is below ``min_p`` times the largest
   probability are removed;
3. **top-k**: tokens whose scaled logit is below the ``k``-th largest are
   removed (ties with it are kept);
4. **top-p**: over what is left, sorted by ascending probability, the tokens
   whose cumulative probability is at most ``1 - top_p`` are removed (the most
   likely token always stays);
5. the rest is renormalised: the logprob of a token is the log-softmax of the
   scaled logits over the kept tokens, ``-inf`` outside them.

Which tokens are kept is decided without gradient (it is a step function);
the logprob of a kept token is differentiable through the scaled logits.
Every function takes per-row settings, so rows of one batch may each have
their own distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from polar.ir import Distribution


@dataclass(frozen=True, slots=True)
class Settings:
    """Per-row settings as tensors, each ``[n]`` (``top_k`` 0: no limit)."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    min_p: torch.Tensor

    @classmethod
    def of(cls, rows: Sequence[Distribution], device: torch.device | None = None) -> Settings:
        return cls(
            temperature=torch.tensor([d.temperature for d in rows], device=device),
            top_p=torch.tensor([d.top_p for d in rows], device=device),
            top_k=torch.tensor([d.top_k for d in rows], dtype=torch.long, device=device),
            min_p=torch.tensor([d.min_p for d in rows], device=device),
        )

    def to(self, device: torch.device, *, non_blocking: bool = False) -> Settings:
        return Settings(
            *(
                t.to(device, non_blocking=non_blocking)
                for t in (self.temperature, self.top_p, self.top_k, self.min_p)
            )
        )

    def repeated(self, counts: torch.Tensor) -> Settings:
        """Row ``i`` repeated ``counts[i]`` times (per trace settings, per token)."""
        return Settings(
            *(
                t.repeat_interleave(counts)
                for t in (self.temperature, self.top_p, self.top_k, self.min_p)
            )
        )

    def pin_memory(self) -> Settings:
        return Settings(
            *(t.pin_memory() for t in (self.temperature, self.top_p, self.top_k, self.min_p))
        )

    def __getitem__(self, index: slice) -> Settings:
        return Settings(
            self.temperature[index], self.top_p[index], self.top_k[index], self.min_p[index]
        )

    @property
    def truncates(self) -> bool:
        """Whether any row removes tokens (else the support is the whole vocabulary)."""
        return bool((self.top_p < 1).any() or (self.top_k > 0).any() or (self.min_p > 0).any())


def support(scaled: torch.Tensor, settings: Settings) -> torch.Tensor:
    """Which tokens each row keeps (bool ``[n, V]``), from the temperature-scaled
    logits ``[n, V]`` (steps 2-4 of the module docstring)."""
    with torch.no_grad():
        s = scaled.detach().float()
        vocab = s.shape[-1]
        keep = torch.ones_like(s, dtype=torch.bool)
        min_p = settings.min_p.to(s.device)
        if (min_p > 0).any():
            probs = torch.softmax(s, dim=-1)
            keep &= probs >= probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
        top_k = settings.top_k.to(s.device)
        top_p = settings.top_p.to(s.device)
        limited = (top_k > 0) & (top_k < vocab)
        if not (top_p < 1).any():
            if limited.any():
                k = torch.where(limited, top_k, torch.ones_like(top_k))
                kth = s.topk(int(k.max()), dim=-1).values.gather(1, (k - 1).unsqueeze(1))
                kth = torch.where(limited.unsqueeze(1), kth, torch.full_like(kth, -torch.inf))
                keep &= s >= kth
            return keep
        masked = s.masked_fill(~keep, -torch.inf)
        ordered, index = masked.sort(dim=-1, descending=False)
        drop = torch.zeros_like(ordered, dtype=torch.bool)
        if limited.any():
            k = torch.where(limited, top_k, torch.full_like(top_k, vocab))
            kth = ordered.gather(1, (vocab - k).unsqueeze(1))
            drop |= ordered < kth
        probs = torch.softmax(ordered.masked_fill(drop, -torch.inf), dim=-1)
        tail = torch.cumsum(probs, dim=-1) <= (1 - top_p).unsqueeze(1)
        tail[:, -1] = False
        drop |= tail
        return keep & ~torch.zeros_like(drop).scatter(1, index, drop)


def processed_logits(logits: torch.Tensor, settings: Settings) -> torch.Tensor:
    """The logits ``[n, V]`` of each row's distribution: scaled by its temperature,
    ``-inf`` outside its support (log-softmax of it is the processed logprob)."""
    scaled = logits.float() / settings.temperature.to(logits.device).unsqueeze(1)
    if not settings.truncates:
        return scaled
    return scaled.masked_fill(~support(scaled, settings), -torch.inf)
