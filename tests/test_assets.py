"""The bundled tokenizer is the real Qwen3 tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polar.assets import QWEN3_TOKENIZER_DIR

from support.paths import SHARED


def test_bundled_tokenizer_is_byte_identical_to_the_shared_copy() -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (QWEN3_TOKENIZER_DIR / name).read_bytes() == (
            SHARED / "models" / "qwen3-tokenizer" / name
        ).read_bytes()


def test_bundled_tokenizer_reproduces_llama_cpp_test_vectors(tokenizer: Any) -> None:
    base = SHARED / "models" / "qwen3-tokenizer"
    inputs = (base / "vectors.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    expected = (base / "vectors.out").read_text(encoding="utf-8").splitlines()
    assert len(inputs) >= 46
    for text, ids in zip(inputs, expected, strict=False):
        want = [int(x) for x in ids.split()]
        assert tokenizer.encode(text, add_special_tokens=False) == want, text


def test_special_tokens_have_their_real_ids(tokenizer: Any) -> None:
    ids = {
        t: tokenizer.convert_tokens_to_ids(t)
        for t in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>")
    }
    assert ids == {
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<think>": 151667,
        "</think>": 151668,
        "<tool_call>": 151657,
    }
    assert Path(QWEN3_TOKENIZER_DIR).is_dir()
