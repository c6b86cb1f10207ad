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
from pathlib import Path
from typing import Any

from polar.assets import QWEN3_TOKENIZER_DIR


class TokenizerLoadError(ValueError):
    """No tokenizer could be loaded from the path; the message is one line."""


def load_tokenizer(path: Path | str | None = None) -> Any:
    """The tokenizer (with its chat template) in ``path``, else Polar's own Qwen3 one.

    Raises :class:`TokenizerLoadError` (one line, naming the path) when there is
    none to load there."""
    directory = Path(QWEN3_TOKENIZER_DIR if path is None else path)
    try:
        return _tokenizer_class(directory).from_pretrained(str(directory))
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
