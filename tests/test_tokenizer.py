"""Loading a tokenizer: Polar's own Qwen3 one by default, any directory on request,
and a directory without one as a one-line error naming it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from polar.assets import QWEN3_TOKENIZER_DIR
from polar.tokenizer import TokenizerLoadError, load_tokenizer


def test_the_default_is_the_bundled_qwen3_tokenizer() -> None:
    tokenizer = load_tokenizer()

    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 151645
    assert "<|im_start|>" in tokenizer.chat_template


def test_a_directory_is_loaded_as_given(tmp_path: Path) -> None:
    copy = tmp_path / "tok"
    shutil.copytree(QWEN3_TOKENIZER_DIR, copy)

    tokenizer = load_tokenizer(copy)

    assert tokenizer.name_or_path == str(copy)
    text = "def add(a, b):\n    return a + b"
    assert tokenizer.encode(text) == load_tokenizer(QWEN3_TOKENIZER_DIR).encode(text)


def test_a_directory_without_a_tokenizer_is_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()

    with pytest.raises(TokenizerLoadError) as caught:
        load_tokenizer(tmp_path / "empty")

    message = str(caught.value)
    assert message.startswith(f"cannot load a tokenizer from {tmp_path / 'empty'} (")
    assert "\n" not in message


@pytest.mark.parametrize("name", ["qwen3", "smollm2-135m-instruct", "tiny-qwen3"])
def test_the_class_the_config_names_loads_what_auto_tokenizer_loads(name: str) -> None:
    from transformers import AutoTokenizer

    directory = QWEN3_TOKENIZER_DIR if name == "qwen3" else Path(".cache/models") / name
    if not (directory / "tokenizer_config.json").is_file():
        pytest.skip(f"no {directory}")
    direct, auto = load_tokenizer(directory), AutoTokenizer.from_pretrained(str(directory))
    assert type(direct) is type(auto)
    text = "def add(a, b):\n    return a + b  # <|im_end|> ünïcode"
    assert direct.encode(text) == auto.encode(text)
    assert (direct.eos_token, direct.pad_token, len(direct)) == (
        auto.eos_token,
        auto.pad_token,
        len(auto),
    )
    conversation = [{"role": "user", "content": "hi"}]
    assert direct.apply_chat_template(conversation, tokenize=False) == auto.apply_chat_template(
        conversation, tokenize=False
    )
