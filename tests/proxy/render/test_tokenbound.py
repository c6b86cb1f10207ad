"""Token counts bounded without tokenizing whole (:mod:`polar.proxy.render.tokenbound`),
with the real Qwen3 and SmolLM2 tokenizers: the bounds are never above the
true count, pieces give the ids of the whole, and a text that cannot fit is
refused with a count between the room and the truth."""

from __future__ import annotations

import random
from typing import Any

import pytest

from polar.proxy.render.tokenbound import PIECE_CHARS, TooManyTokens
from polar.proxy.render.tokens import TokenText

_WORDS = [
    "def", "return", "x", "42", "3.14", "日本語", "ünïcödé", "e\u0301", "🙂", "'s", "--",
    "<|im_end|>", "<tool_call>", "(", ")", ";", "https://example.com/a?b=c",
    " ", "  ", "\n", "\n\n", "\t", "    ",
]  # fmt: skip


def _text(rng: random.Random, size: int) -> str:
    parts: list[str] = []
    length = 0
    while length < size:
        part = rng.choice(_WORDS) if rng.random() < 0.8 else rng.choice(_WORDS) * 300
        parts.append(part)
        length += len(part)
    return "".join(parts)


@pytest.mark.parametrize("seed", range(6))
def test_pieces_give_the_ids_of_the_whole_and_bounds_stay_below_the_count(
    tokenizer: Any, smollm2_tokenizer: Any, seed: int
) -> None:
    rng = random.Random(seed)
    for model in (tokenizer, smollm2_tokenizer):
        text = TokenText(model)
        bound = text.bound
        assert bound.pieces_hold, "the probe holds for both tokenizers"
        sample = _text(rng, rng.choice([PIECE_CHARS // 2, 3 * PIECE_CHARS]))
        whole = text.encode(sample)
        assert bound.encode(sample, len(whole)) == whole, f"seed {seed}"
        assert bound.fewest(sample) <= len(whole), f"seed {seed}"
        room = rng.randrange(1, len(whole))
        with pytest.raises(TooManyTokens) as refused:
            bound.encode(sample, room)
        assert room < refused.value.at_least <= len(whole), f"seed {seed}"


def test_the_bytes_per_token_bound_refuses_without_encoding(tokenizer: Any) -> None:
    """Qwen3's longest token stands for 128 bytes (spaces): a text of more than
    128 x room bytes cannot fit, whatever it says."""
    text = TokenText(tokenizer)
    assert text.bound.max_token_bytes == 128
    huge = "word " * (1 << 20)  # 5 MiB, about a million tokens
    assert text.bound.fewest(huge) == (5 << 20) // 128
    with pytest.raises(TooManyTokens) as refused:
        text.encode_prompt(huge, most=32767)
    assert refused.value.at_least == (5 << 20) // 128
    # Not normalised (a combining accent NFC composes): measured after normalisation.
    accents = "e\u0301" * 1000
    assert text.bound.fewest(accents) <= len(text.encode(accents))
