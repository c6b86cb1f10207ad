"""Will the policy, its optimizer and a step's activations fit the device? An
estimate from the parameter count and the settings, checked before the model
is moved there, so a run that cannot fit stops at start with the setting to
change rather than with an out-of-memory error at the first step.

What a step holds at its peak, in bytes (``P`` parameters, ``A`` of them
trained, ``t`` tokens per microbatch, ``L`` layers, ``h`` hidden size, ``i``
the MLP's):

- weights ``4P`` (float32 master weights, :mod:`polar.precision`), gradients
  ``4A`` and AdamW's two moments ``8A``; a KL reference model ``4P`` more;
- under bfloat16 autocast, the bfloat16 copies of the trained weights it
  caches for the forward pass, ``2A``;
- activations kept for backward, per token and layer about ``16h + 6i``
  values (``2`` bytes each under autocast, plus the float32 residual stream,
  ``4`` in float32): ``t L (...)``. With decoder gradient checkpointing only
  each layer's float32 input is kept, ``4h`` per token and layer (the layer
  recomputed in backward is there while most gradients are not yet: it does
  not add to the peak);
- the vocabulary projection of one chunk of loss tokens (float32 logits, the
  distribution's copies and their gradient): ``4 x chunk x vocab x 4``.

Against the H100 figures in ``shared/gpu/README.md`` (the Qwen3-4B shape,
float32 master weights, bfloat16 autocast, checkpointing): 74.3 GiB estimated
for 74.1 measured at 16,384 tokens per microbatch, 71.5 for 71.2 at 8,192.
``optim.check_memory: false`` skips the check where the estimate is wrong.
Pure: no torch here, the caller counts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from polar.causallm import CausalLM

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class ModelShape:
    parameters: int
    trainable: int
    hidden: int
    intermediate: int
    layers: int
    vocab: int

    @classmethod
    def of(cls, model: CausalLM) -> ModelShape:
        """The shape of a Hugging Face causal LM (a peft model too) as it will train."""
        config = model.config
        hidden = int(config.hidden_size)
        return cls(
            parameters=sum(p.numel() for p in model.parameters()),
            trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
            hidden=hidden,
            intermediate=int(getattr(config, "intermediate_size", None) or 4 * hidden),
            layers=int(config.num_hidden_layers),
            vocab=int(config.vocab_size),
        )


@dataclass(frozen=True, slots=True)
class MemorySettings:
    micro_batch_tokens: int
    logprob_chunk: int
    gradient_checkpointing: bool
    bfloat16: bool
    """The forward pass runs under bfloat16 autocast."""
    reference: bool
    """A KL reference model is kept beside the policy."""


@dataclass(frozen=True, slots=True)
class Estimate:
    weights: int
    gradients: int
    optimizer: int
    reference: int
    autocast_copies: int
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.reference
            + self.autocast_copies
            + self.activations
            + self.logits
        )


def estimate(shape: ModelShape, settings: MemorySettings) -> Estimate:
    """Peak bytes of one training step (see the module docstring)."""
    t, h, i = settings.micro_batch_tokens, shape.hidden, shape.intermediate
    value = 2 if settings.bfloat16 else 4
    layer = (16 * h + 6 * i) * value + (16 * h if settings.bfloat16 else 0)  # per token
    if settings.gradient_checkpointing:
        activations = t * shape.layers * 4 * h
    else:
        activations = t * shape.layers * layer
    return Estimate(
        weights=4 * shape.parameters,
        gradients=4 * shape.trainable,
        optimizer=8 * shape.trainable,
        reference=4 * shape.parameters if settings.reference else 0,
        autocast_copies=2 * shape.trainable if settings.bfloat16 else 0,
        activations=activations,
        logits=4 * min(settings.logprob_chunk, t) * shape.vocab * 4,
    )


class MemoryTooSmall(Exception):
    """The estimate is over what the device has; the message (one line) names the
    setting to change."""


def check_fits(
    shape: ModelShape,
    settings: MemorySettings,
    *,
    capacity: int,
    device: str,
    lora: bool,
) -> Estimate:
    """The estimate, or :class:`MemoryTooSmall` when it is over ``capacity`` bytes."""
    need = estimate(shape, settings)
    if need.total <= capacity:
        return need
    parts = (
        f"weights {need.weights / GIB:.1f}, gradients {need.gradients / GIB:.1f}, "
        f"AdamW {need.optimizer / GIB:.1f}"
        + (f", reference model {need.reference / GIB:.1f}" if need.reference else "")
        + (f", bfloat16 copies {need.autocast_copies / GIB:.1f}" if need.autocast_copies else "")
        + f", activations {need.activations / GIB:.1f} for {settings.micro_batch_tokens} tokens"
    )
    raise MemoryTooSmall(
        f"training needs about {need.total / GIB:.1f} GiB on {device} ({parts}; GiB), more "
        f"than its {capacity / GIB:.1f} GiB: {_advice(shape, settings, capacity, lora)} "
        "(or optim.check_memory: false if this estimate is wrong)"
    )


def _advice(shape: ModelShape, settings: MemorySettings, capacity: int, lora: bool) -> str:
    """The first change, in this order, whose estimate fits: checkpointing, fewer
    tokens per microbatch (halved down to 1,024), LoRA adapters."""

    def gib(s: MemorySettings, sh: ModelShape = shape) -> str:
        return f"about {estimate(sh, s).total / GIB:.1f} GiB"

    tried = settings
    if not settings.gradient_checkpointing:
        tried = replace(settings, gradient_checkpointing=True)
        if estimate(shape, tried).total <= capacity:
            return f"set optim.gradient_checkpointing: true ({gib(tried)})"
    tokens = tried.micro_batch_tokens
    while tokens > 1024:
        tokens //= 2
        smaller = replace(tried, micro_batch_tokens=tokens)
        if estimate(shape, smaller).total <= capacity:
            steps = (
                "set optim.gradient_checkpointing: true and "
                if not settings.gradient_checkpointing
                else ""
            )
            return f"{steps}lower optim.micro_batch_tokens to {tokens} ({gib(smaller)})"
    if not lora:
        adapters = replace(shape, trainable=shape.parameters // 100)
        if estimate(adapters, tried).total <= capacity:
            return f"train LoRA adapters instead (lora: {{r: 16}}; {gib(tried, adapters)})"
    if settings.reference:
        return "set grpo.kl_coef: 0 (no reference model) or use a device with more memory"
    return "use a device with more memory or a smaller model"
