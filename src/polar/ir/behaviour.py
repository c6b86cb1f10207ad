"""Under which sampling settings a call's tokens were drawn, and whether a
trainer can reproduce that distribution.

GRPO corrects the gap between the policy that sampled a token (the *behaviour*
policy) and the one it trains with truncated importance weights
``pi_old(y) / pi_behaviour(y)``. That is only right when ``pi_behaviour`` is the
distribution the engine really drew from (after temperature, min-p, top-k and
top-p) and the trainer computes ``pi_old`` over the same distribution. An
engine that samples at temperature 0.6 with top-p 0.95 but reports the logprob
of the raw distribution makes every weight look like 1 while the gradient is
off-policy.

So every record carries a :class:`Behaviour`: the settings the engine applied
(all of them explicit: the gateway fills what a harness left unset, see
:mod:`polar.proxy.call.behaviour`) and what the engine's reported logprobs are of
(:class:`LogprobSource`). :func:`distribution_of` turns it into either the
:class:`Distribution` a trainer reproduces from its own logits (and whose
logprobs the engine reported), or the reason it cannot
(:class:`Unreproducible`): such tokens are kept out of the loss and counted,
never trained silently.

Pure values and one pure function; nothing here knows torch or HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from polar.ir.messages import Sampling

GREEDY_BELOW = 1e-5
"""A temperature below this is greedy decoding (vLLM's ``_SAMPLING_EPS``)."""

SHAPING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
"""The :class:`~polar.ir.Sampling` settings that shape the next-token distribution."""


class LogprobSource(StrEnum):
    """Which distribution an engine's reported logprob of a sampled token is of."""

    RAW = "raw"
    """The model's own: log-softmax of the logits before temperature, penalties and
    truncation (vLLM's default ``--logprobs-mode raw_logprobs``)."""
    SCALED = "scaled"
    """Log-softmax of the logits divided by the temperature, before top-k, top-p and
    min-p (SGLang's default; ``SGLANG_RETURN_ORIGINAL_LOGPROB`` makes it ``raw``)."""
    PROCESSED = "processed"
    """The distribution the token was drawn from: every transform applied and the
    rest renormalised (vLLM ``--logprobs-mode processed_logprobs``; Polar's
    embedded engine by default)."""


@dataclass(frozen=True, slots=True)
class Distribution:
    """A next-token distribution made from a model's logits, which a trainer
    reproduces exactly: the logits divided by ``temperature``; then the tokens
    whose probability is below ``min_p`` times the most likely one's, those
    outside the ``top_k`` most likely, and those outside the ``top_p`` nucleus
    are removed, in that order, as vLLM does (ties at the top-k boundary are
    kept; the top-p nucleus is the smallest set of most likely tokens whose
    mass exceeds ``top_p``); the rest is renormalised.

    ``top_k`` 0 means no limit. A temperature of 0 is greedy decoding: a
    session's sampling policy may ask for it (evaluation), but it is no
    distribution to correct against (:func:`distribution_of` says so).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also refuses NaN
            raise ValueError(f"temperature must be at least 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 (no limit) or more, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def truncated(self) -> bool:
        """Whether any token is cut from the support (top-p, top-k or min-p)."""
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def describe(self) -> str:
        """``temperature 0.6, top_p 0.95, top_k 20`` (neutral settings left out)."""
        parts = [f"temperature {self.temperature:g}"]
        if self.top_p < 1.0:
            parts.append(f"top_p {self.top_p:g}")
        if self.top_k > 0:
            parts.append(f"top_k {self.top_k}")
        if self.min_p > 0.0:
            parts.append(f"min_p {self.min_p:g}")
        return ", ".join(parts)


MODEL = Distribution()
"""The model's own distribution: temperature 1, nothing cut."""


class Unreproducible(StrEnum):
    """Why a trainer cannot recompute the distribution a call's tokens were drawn from."""

    GREEDY = "greedy"
    """Temperature 0: a deterministic choice, no distribution to correct against."""
    PENALTIES = "penalties"
    """A presence, frequency or repetition penalty: it depends on the tokens so far
    and is not part of the trainer's policy."""
    LOGIT_BIAS = "logit_bias"
    """A logit bias changed the distribution."""
    CONSTRAINED = "constrained"
    """Guided decoding (a JSON schema, a forced tool choice) masked tokens out."""
    LOGPROBS = "logprobs"
    """The engine reported logprobs of another distribution than the one it sampled
    from (raw logprobs under a temperature or truncation, temperature-scaled ones
    under truncation): run it with processed logprobs (``engine.logprobs``)."""
    UNKNOWN_SETTINGS = "unknown_settings"
    """A setting was left to an engine default the gateway did not know."""
    UNRECORDED = "unrecorded"
    """The record was made before records carried their sampling settings."""


@dataclass(frozen=True, slots=True)
class Behaviour:
    """How the engine drew one call's tokens.

    ``sampling`` is what the engine was sent, every setting that shapes the
    distribution explicit (``None`` only where the gateway left a setting to an
    engine default it did not know); ``logprobs`` what the engine's reported
    logprobs are of; ``constrained`` whether guided decoding masked tokens;
    ``enforced`` whether the session's sampling policy overrode what the
    harness asked.
    """

    sampling: Sampling
    logprobs: LogprobSource
    constrained: bool = False
    enforced: bool = False


def distribution_of(behaviour: Behaviour | None) -> Distribution | Unreproducible:
    """The distribution a call's tokens were drawn from and whose logprobs the
    engine reported, or why there is none a trainer can reproduce."""
    if behaviour is None:
        return Unreproducible.UNRECORDED
    if behaviour.constrained:
        return Unreproducible.CONSTRAINED
    s = behaviour.sampling
    if any(getattr(s, name) is None for name in SHAPING):
        return Unreproducible.UNKNOWN_SETTINGS
    assert s.temperature is not None and s.top_p is not None and s.top_k is not None
    assert s.min_p is not None
    if s.temperature < GREEDY_BELOW:
        return Unreproducible.GREEDY
    if s.presence_penalty != 0 or s.frequency_penalty != 0 or s.repetition_penalty != 1:
        return Unreproducible.PENALTIES
    if s.logit_bias:
        return Unreproducible.LOGIT_BIAS
    try:
        dist = Distribution(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=max(s.top_k, 0),  # -1 is "no limit" to vLLM and SGLang
            min_p=s.min_p,
        )
    except ValueError:
        return Unreproducible.UNKNOWN_SETTINGS
    match behaviour.logprobs:
        case LogprobSource.PROCESSED:
            return dist
        case LogprobSource.SCALED:
            return Unreproducible.LOGPROBS if dist.truncated else dist
        case LogprobSource.RAW:
            return Unreproducible.LOGPROBS if dist.truncated or dist.temperature != 1 else dist
