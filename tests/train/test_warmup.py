"""The frozen-prefix pieces of the warm-up are exact when the prefix is fresh:
what they compute equals one teacher-forced pass over the whole sequence.

A small random Qwen3 (vocabulary 512) keeps this fast; the seed is fixed and
printed on failure.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from polar.tinymodel.warmup import (
    WarmupSpec,
    frozen_prefixes,
    is_warmed,
    long_example,
    output_logprobs,
    warm_up,
)

SEED = 1234


@pytest.fixture(scope="module")
def model() -> Qwen3ForCausalLM:
    torch.manual_seed(SEED)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config).eval()


def whole_pass_logprobs(
    model: Qwen3ForCausalLM, prompt: list[int], output: list[int], temperature: float = 1.0
) -> torch.Tensor:
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()  # [T, V]
    predicting = logits[len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(predicting, -1).gather(1, torch.tensor(output)[:, None])[:, 0]


def test_long_example_splits_the_prompt_before_its_tail() -> None:
    example = long_example(list(range(100)), [7, 8, 9], tail=16)
    assert example.prefix == list(range(84))
    assert example.tail == [*range(84, 100), 7, 8, 9]
    assert example.outputs == 3
    short = long_example([1, 2, 3], [4], tail=16)  # the prefix keeps at least one token
    assert short.prefix == [1] and short.tail == [2, 3, 4]


def test_frozen_prefix_logprobs_equal_a_whole_pass(model: Qwen3ForCausalLM) -> None:
    rng = random.Random(SEED)
    first = [rng.randrange(512) for _ in range(300)]
    out1 = [rng.randrange(512) for _ in range(12)]
    # a second call extends the first (its prompt and output, then a tool result)
    second = first + out1 + [rng.randrange(512) for _ in range(40)]
    out2 = [rng.randrange(512) for _ in range(5)]
    other = [rng.randrange(512) for _ in range(200)]
    out3 = [rng.randrange(512) for _ in range(8)]
    calls = [(first, out1), (second, out2), (other, out3)]
    examples = [long_example(p, o, tail=24) for p, o in calls]

    with torch.no_grad():
        kvs = frozen_prefixes(model, [e.prefix for e in examples])
        shared = frozen_prefixes(model, [examples[0].prefix])[0]
        got, hotter = output_logprobs(model, examples, kvs, temperature=2.0)

    for layer, (keys, values) in enumerate(kvs[0]):  # sliced from the second prefix's
        assert torch.allclose(keys, shared[layer][0], atol=1e-5), f"seed {SEED}"
        assert torch.allclose(values, shared[layer][1], atol=1e-5), f"seed {SEED}"
    for (prompt, output), logprobs in zip(calls, got, strict=True):
        expected = whole_pass_logprobs(model, prompt, output)
        assert torch.allclose(logprobs, expected, atol=1e-4), (f"seed {SEED}", logprobs, expected)
    for (prompt, output), at_two in zip(calls, hotter, strict=True):
        expected = whole_pass_logprobs(model, prompt, output, temperature=2.0)
        assert torch.allclose(at_two, expected, atol=1e-4), (f"seed {SEED}", at_two, expected)

    # A call its CLI samples at its own temperature is tempered at that one.
    own = [long_example(p, o, tail=24, temperature=0.5 if i == 1 else None) for i, (p, o) in
           enumerate(calls)]  # fmt: skip
    with torch.no_grad():
        _, mixed = output_logprobs(model, own, kvs, temperature=2.0)
    for i, ((prompt, output), got_t) in enumerate(zip(calls, mixed, strict=True)):
        expected = whole_pass_logprobs(model, prompt, output, temperature=0.5 if i == 1 else 2.0)
        assert torch.allclose(got_t, expected, atol=1e-4), (f"seed {SEED}", i, got_t, expected)


def test_warm_up_learns_a_rehearsed_call_and_ships_its_sampling(tmp_path: Path) -> None:
    """The whole warm-up on the default tiny model: one long rehearsed call (a
    500-token prompt) is learnt until the taught model's default sampling can
    only reproduce it; the model ships that sampling; a rerun keeps it."""
    from transformers import GenerationConfig

    from polar.tinymodel.build import build_tiny_model

    base = build_tiny_model(tmp_path / "tiny")
    rng = random.Random(SEED)
    prompt = [rng.randrange(1000, 100000) for _ in range(500)]
    output = [785, 1034, 374, 5326, 13, 151645]  # a few words, then <|im_end|>
    spec = WarmupSpec(max_steps=200, tail=32, refresh=5)
    origin = {"pi": "0.73.1"}

    report = warm_up(
        base, tmp_path / "taught", spec, rehearsed=[(prompt, output)], rehearsed_from=origin
    )

    assert report["rehearsed_calls"] == 1 and report["steps"] < spec.max_steps, report
    assert report["rehearsed_worst_token_prob_at_temperature"] >= spec.top_p, report
    sampling = GenerationConfig.from_pretrained(str(tmp_path / "taught"))
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.6, 0.95, 20)
    assert is_warmed(tmp_path / "taught", spec, base, origin)
    assert not is_warmed(tmp_path / "taught", spec, base, {"pi": "0.74.0"})
    assert warm_up(
        base, tmp_path / "taught", spec, rehearsed=[(prompt, output)], rehearsed_from=origin
    ) == {"kept": str(tmp_path / "taught")}


def test_warm_up_without_rehearsals_trains_on_the_dialogues(tmp_path: Path) -> None:
    """The demo's warm-up: synthetic dialogues only, and no sampling defaults shipped."""
    from transformers import GenerationConfig

    from polar.tinymodel.build import build_tiny_model

    base = build_tiny_model(tmp_path / "tiny")
    spec = WarmupSpec(steps=3)

    report = warm_up(base, tmp_path / "taught", spec)

    assert report["steps"] == 3 and "rehearsed_calls" not in report, report
    assert report["last_loss"] < report["first_loss"], report
    assert (
        GenerationConfig.from_pretrained(str(tmp_path / "taught")).to_diff_dict().get("temperature")
        is None
    )
    assert is_warmed(tmp_path / "taught", spec, base)
