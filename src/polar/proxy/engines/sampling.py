"""The IR's sampling settings as an engine's request parameters.

Every engine route takes the same settings; only two names differ. vLLM's
chat and completions routes and SGLang's OpenAI-compatible chat route use the
OpenAI names (``max_tokens``, ``seed``); SGLang's native ``/generate`` takes
``sampling_params`` with ``max_new_tokens`` and ``sampling_seed``. A setting
left ``None`` is not sent, so the engine's own default applies (the gateway
sends every setting that shapes the distribution, :mod:`polar.proxy.call.behaviour`).
"No top-k limit" (0 in the IR) goes out as -1, which vLLM and SGLang both read
as disabled (SGLang refuses 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polar.ir import Sampling


@dataclass(frozen=True, slots=True)
class SamplingNames:
    """The wire names of the settings whose name differs between routes."""

    max_tokens: str
    seed: str


OPENAI_NAMES = SamplingNames(max_tokens="max_tokens", seed="seed")
SGLANG_NATIVE_NAMES = SamplingNames(max_tokens="max_new_tokens", seed="sampling_seed")


def sampling_params(sampling: Sampling, names: SamplingNames = OPENAI_NAMES) -> dict[str, Any]:
    """The settings ``sampling`` sets, by their wire names on the route ``names`` is for."""
    params: dict[str, Any] = {}
    for key, value in (
        (names.max_tokens, sampling.max_tokens),
        ("temperature", sampling.temperature),
        ("top_p", sampling.top_p),
        ("top_k", -1 if sampling.top_k == 0 else sampling.top_k),
        ("min_p", sampling.min_p),
        ("presence_penalty", sampling.presence_penalty),
        ("frequency_penalty", sampling.frequency_penalty),
        ("repetition_penalty", sampling.repetition_penalty),
        (names.seed, sampling.seed),
    ):
        if value is not None:
            params[key] = value
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    if sampling.logit_bias:
        # JSON object keys are strings; the engines parse the token ids back.
        params["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias.items()}
    return params
