"""Loading a Hugging Face tokenizer: the one place Polar does it.

The gateway renders with one, the builders read turn boundaries from one, the
trainers and the demo decode with one. By default it is the Qwen3 tokenizer
Polar ships (:data:`polar.assets.QWEN3_TOKENIZER_DIR`), so nothing needs the
network. ``transformers`` is imported on first use: it takes a good part of a
second, and many commands never need it. When the directory's
``tokenizer_config.json`` names a tokenizer class ``transformers`` exports, that
class loads it directly: ``AutoTokenizer`` would import torch first (about two
seconds of a short command such as ``polar build``) to learn the same class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from polar.assets import QWEN3_TOKENIZER_DIR


class Tokenizer(Protocol):
    """What Polar uses of a Hugging Face tokenizer, typed (``transformers`` ships
    none that mypy reads). :func:`load_tokenizer` returns one; a test's stand-in
    needs only the members its code path calls."""

    model_max_length: int

    @property
    def eos_token(self) -> str | None: ...

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def pad_token_id(self) -> int | None: ...

    @property
    def special_tokens_map(self) -> Mapping[str, Any]: ...

    @property
    def added_tokens_decoder(self) -> Mapping[int, Any]:
        """Added token id -> its ``AddedToken`` (``.content``, ``.special``)."""

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...

    def convert_tokens_to_ids(self, tokens: str) -> int: ...

    def get_vocab(self) -> dict[str, int]: ...

    def apply_chat_template(self, conversation: Any, **options: Any) -> Any:
        """Token ids (``tokenize=True``) or text (``tokenize=False``)."""

    def get_chat_template(
        self, chat_template: str | None = None, tools: list[dict[str, Any]] | None = None
    ) -> str: ...

    def save_pretrained(self, save_directory: str | Path) -> Any: ...


class TokenizerLoadError(ValueError):
    """No tokenizer could be loaded from the path; the message is one line."""


def load_tokenizer(path: Path | str | None = None) -> Tokenizer:
    """The tokenizer (with its chat template) in ``path``, else Polar's own Qwen3 one.

    Raises :class:`TokenizerLoadError` (one line, naming the path) when there is
    none to load there."""
    directory = Path(QWEN3_TOKENIZER_DIR if path is None else path)
    try:
        tokenizer: Tokenizer = _tokenizer_class(directory).from_pretrained(str(directory))
        return tokenizer
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(
            f"cannot load a tokenizer from {directory} ({_first_line(exc)})"
        ) from None


def _tokenizer_class(directory: Path) -> Any:
    """The class ``tokenizer_config.json`` names, else ``AutoTokenizer`` (which finds it)."""
    import transformers

    try:
        named = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        named = None
    name = named.get("tokenizer_class") if isinstance(named, dict) else None
    if isinstance(name, str) and name.isidentifier():
        found = getattr(transformers, name, None)
        if found is not None and hasattr(found, "from_pretrained"):
            return found
    return transformers.AutoTokenizer


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
