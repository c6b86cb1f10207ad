"""Token text for ids the tokenizer does not have: a model's embedding matrix is
padded past the vocabulary (Qwen3: 151,936 rows, 151,669 tokens), and an
untrained model samples those rows. They decode to nothing, as the tokenizer's
own decode does, instead of failing the call."""

from __future__ import annotations

from typing import Any

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
    """Past 32 KB the text is encoded with ``encode_batch`` (which releases the
    GIL); the ids must be exactly those of ``encode``."""
    text = TokenText(tokenizer)
    long = "<|im_start|>user\n" + "déjà vu, 42 tokens\tand\n" * 4000 + "<|im_end|>"
    assert len(long) > 32 << 10
    assert (
        text.encode(long) == tokenizer.backend_tokenizer.encode(long, add_special_tokens=False).ids
    )
