"""The sampling defaults a model ships in its ``generation_config.json``, read as
vLLM reads them (``--generation-config auto``): the values that differ from
Hugging Face's own defaults (``GenerationConfig.to_diff_dict``; with
transformers 5 every sampling default is unset, so every value the file sets).

One reading for the embedded engine (what it applies to a request that sets
nothing) and the gateway (what it sends for a setting a harness left unset).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polar.ir import Sampling

NEUTRAL = Sampling(
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    min_p=0.0,
    presence_penalty=0.0,
    frequency_penalty=0.0,
    repetition_penalty=1.0,
)
"""Every setting that shapes the distribution, at the value that leaves it alone."""


def generation_defaults(generation_config: Any) -> Sampling:
    """The settings ``generation_config`` (a ``transformers.GenerationConfig``, or
    ``None``) sets, over :data:`NEUTRAL`."""
    diff = generation_config.to_diff_dict() if generation_config is not None else {}

    def number(name: str, neutral: float | None) -> float | None:
        value = diff.get(name)
        return neutral if value is None else float(value)

    top_k = diff.get("top_k")
    return Sampling(
        temperature=number("temperature", NEUTRAL.temperature),
        top_p=number("top_p", NEUTRAL.top_p),
        top_k=NEUTRAL.top_k if not top_k or top_k < 0 else int(top_k),
        min_p=number("min_p", NEUTRAL.min_p),
        presence_penalty=NEUTRAL.presence_penalty,
        frequency_penalty=NEUTRAL.frequency_penalty,
        repetition_penalty=number("repetition_penalty", NEUTRAL.repetition_penalty),
    )


def model_defaults(model_dir: Path | None) -> Sampling:
    """:func:`generation_defaults` of the ``generation_config.json`` in ``model_dir``;
    :data:`NEUTRAL` when there is none (as vLLM does for such a model)."""
    if model_dir is None or not (Path(model_dir) / "generation_config.json").is_file():
        return NEUTRAL
    from transformers import GenerationConfig

    return generation_defaults(GenerationConfig.from_pretrained(str(model_dir)))
