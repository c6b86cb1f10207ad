"""Token text for ids the tokenizer does not have: a model's embedding matrix is
padded past the vocabulary (Qwen3: 151,936 rows, 151,669 tokens), and an
untrained model samples those rows. They decode to nothing, as the tokenizer's
own decode does, instead of failing the call."""

from __future__ import annotations

import random
from typing import Any

import pytest

from polar.proxy.render.tokens import TextStream, TokenText


def test_ids_past_the_vocabulary_decode_to_nothing(tokenizer: Any) -> None:
    text = TokenText(tokenizer)
    hello = text.encode("hello")
    past = len(tokenizer) + 10
    assert text.bytes_of(past) == b""
    assert text.decode([*hello, past, *hello]) == "hellohello"
    assert tokenizer.decode([*hello, past, *hello]) == "hellohello"
    stream = TextStream(text)
    assert stream.feed([*hello, past]) + stream.feed(hello) + stream.flush() == "hellohello"


def test_long_texts_encode_to_the_same_ids_without_holding_the_gil(tokenizer: Any) -> None:
    """Past 32 KB the text is encoded with ``encode_batch_fast`` (which releases
    the GIL and skips character offsets); the ids must be exactly those of ``encode``."""
    text = TokenText(tokenizer)
    long = "<|im_start|>user\n" + "déjà vu, 42 tokens\tand\n" * 4000 + "<|im_end|>"
    assert len(long) > 32 << 10
    assert (
        text.encode(long) == tokenizer.backend_tokenizer.encode(long, add_special_tokens=False).ids
    )
    for seed in range(10):  # added tokens, their fragments, combining marks, emoji
        rng = random.Random(seed)
        mixed = "".join(_prompt(rng) for _ in range(4))
        while len(mixed) <= 32 << 10:
            mixed += _prompt(rng)
        want = tokenizer.backend_tokenizer.encode(mixed, add_special_tokens=False).ids
        assert text.encode(mixed) == want, f"seed {seed}"


_PIECES = [
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "\n", "\n\n", " ", "  ", "\t", "user\n", "assistant\n", "déjà vu ", "日本語のテキスト",
    "e\u0301", "\u0301", "'s", "42", "x=1;", "<|im_", "start|>", "<", "|>", "🙂",
]  # fmt: skip


def _prompt(rng: random.Random) -> str:
    """Added tokens, their fragments, joiners and long stretches (some repeated)."""
    parts = []
    for _ in range(rng.randrange(4, 30)):
        if rng.random() < 0.25:
            words = rng.choice(["file line ", "def f(x):\n    return x\n", "ünïcödé ", " \n"])
            parts.append(words * rng.randrange(60, 500))
        else:
            parts.append(rng.choice(_PIECES))
    return "".join(parts)


@pytest.mark.parametrize("seed", range(25))
def test_a_prompt_encoded_in_remembered_stretches_has_the_ids_of_the_whole(
    tokenizer: Any, seed: int
) -> None:
    rng = random.Random(seed)
    text = TokenText(tokenizer, segment_cache_bytes=rng.choice([1 << 20, 64 << 20]))
    prompts = [_prompt(rng) for _ in range(4)]
    for prompt in [*prompts, *prompts, rng.choice(prompts) + rng.choice(prompts)]:
        assert text.encode_prompt(prompt) == text.encode(prompt), f"seed {seed}"


def test_long_stretches_are_tokenized_once_within_their_budget(tokenizer: Any) -> None:
    text = TokenText(tokenizer, segment_cache_bytes=1 << 20)
    system = "<|im_start|>system\n" + "You are a coding agent. " * 1000 + "<|im_end|>\n"
    for task in ("fix the bug", "add a test", "fix the bug"):
        prompt = system + f"<|im_start|>user\n{task}<|im_end|>\n<|im_start|>assistant\n"
        assert text.encode_prompt(prompt) == text.encode(prompt)
    cache = text._segments
    assert (cache.misses, cache.hits) == (1, 2)  # the system prompt, once
    assert 0 < cache.used_bytes <= 1 << 20
    off = TokenText(tokenizer, segment_cache_bytes=0)
    assert off.encode_prompt(system) == text.encode(system) and off._segments.used_bytes == 0


def test_ids_join_to_the_bytes_of_each(tokenizer: Any) -> None:
    text = TokenText(tokenizer)
    ids = [*text.encode("déjà vu 🙂 <|im_end|>"), len(tokenizer) + 5]
    assert text.bytes_of_ids(ids) == b"".join(text.bytes_of(i) for i in ids)
    assert text.bytes_of_ids(ids[:-1]) == "déjà vu 🙂 <|im_end|>".encode()
    assert text.bytes_of_ids([]) == b""
