"""Which recorded behaviours a trainer can reproduce (``polar.ir.distribution_of``),
and the JSON forms of behaviours and distributions."""

from __future__ import annotations

import pytest

from polar.ir import Behaviour, Distribution, LogprobSource, Sampling, Unreproducible
from polar.ir.behaviour import MODEL, distribution_of
from polar.ir.codec import (
    behaviour_from_json,
    behaviour_to_json,
    distribution_from_json,
    distribution_to_json,
)

EXPLICIT = Sampling(
    temperature=0.6,
    top_p=0.95,
    top_k=20,
    min_p=0.0,
    presence_penalty=0.0,
    frequency_penalty=0.0,
    repetition_penalty=1.0,
)
QWEN3 = Distribution(temperature=0.6, top_p=0.95, top_k=20)


def behaviour(source: LogprobSource = LogprobSource.PROCESSED, **changes: object) -> Behaviour:
    fields = {name: getattr(EXPLICIT, name) for name in EXPLICIT.__dataclass_fields__}
    return Behaviour(sampling=Sampling(**(fields | changes)), logprobs=source)  # type: ignore[arg-type]


def test_processed_logprobs_make_every_explicit_distribution_reproducible() -> None:
    assert distribution_of(behaviour()) == QWEN3
    assert distribution_of(behaviour(top_k=-1)) == Distribution(0.6, 0.95, 0)


@pytest.mark.parametrize(
    ("source", "changes", "expected"),
    [
        # raw logprobs are of the model's own distribution: right only at temperature 1, uncut
        (LogprobSource.RAW, {}, Unreproducible.LOGPROBS),
        (LogprobSource.RAW, {"top_p": 1.0, "top_k": 0}, Unreproducible.LOGPROBS),
        (LogprobSource.RAW, {"temperature": 1.0, "top_p": 1.0, "top_k": 0}, MODEL),
        # temperature-scaled logprobs (SGLang): right whenever nothing is cut
        (LogprobSource.SCALED, {}, Unreproducible.LOGPROBS),
        (LogprobSource.SCALED, {"top_p": 1.0, "top_k": 0}, Distribution(temperature=0.6)),
        (LogprobSource.SCALED, {"top_p": 1.0, "top_k": 0, "min_p": 0.1}, Unreproducible.LOGPROBS),
        # what no trainer reproduces, whatever the logprobs
        (LogprobSource.PROCESSED, {"temperature": 0.0}, Unreproducible.GREEDY),
        (LogprobSource.PROCESSED, {"presence_penalty": 0.5}, Unreproducible.PENALTIES),
        (LogprobSource.PROCESSED, {"repetition_penalty": 1.05}, Unreproducible.PENALTIES),
        (LogprobSource.PROCESSED, {"logit_bias": {7: -100.0}}, Unreproducible.LOGIT_BIAS),
        (LogprobSource.PROCESSED, {"top_p": None}, Unreproducible.UNKNOWN_SETTINGS),
        (LogprobSource.PROCESSED, {"repetition_penalty": None}, Unreproducible.UNKNOWN_SETTINGS),
    ],
)
def test_what_cannot_be_reproduced_says_why(
    source: LogprobSource, changes: dict[str, object], expected: object
) -> None:
    assert distribution_of(behaviour(source, **changes)) == expected


def test_constrained_and_unrecorded_calls_are_unreproducible() -> None:
    constrained = Behaviour(EXPLICIT, LogprobSource.PROCESSED, constrained=True)
    assert distribution_of(constrained) is Unreproducible.CONSTRAINED
    assert distribution_of(None) is Unreproducible.UNRECORDED


def test_a_distribution_refuses_settings_outside_their_range() -> None:
    for bad in ({"temperature": -1.0}, {"top_p": 0.0}, {"top_k": -1}, {"min_p": 2.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Distribution(**bad)  # type: ignore[arg-type]
    assert QWEN3.truncated and not MODEL.truncated and Distribution(temperature=0).greedy
    assert QWEN3.describe() == "temperature 0.6, top_p 0.95, top_k 20"


def test_behaviours_and_distributions_round_trip_through_json() -> None:
    b = Behaviour(
        Sampling(max_tokens=5, temperature=0.6, top_k=20, seed=3, stop=("x",), logit_bias={1: 2.0}),
        LogprobSource.SCALED,
        constrained=True,
        enforced=True,
    )
    assert behaviour_from_json(behaviour_to_json(b)) == b
    assert distribution_from_json(distribution_to_json(QWEN3)) == QWEN3
    with pytest.raises(ValueError, match="unknown setting 'seed'"):
        distribution_from_json({"temperature": 1.0, "seed": 3})
    with pytest.raises(ValueError, match="top_p must be in"):
        distribution_from_json({"top_p": 1.5})
