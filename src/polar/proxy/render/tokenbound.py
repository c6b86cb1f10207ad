"""How many tokens a text takes at least, without tokenizing all of it.

A prompt that cannot fit the model's context is refused (a 400), and the
gateway should not spend seconds tokenizing megabytes to say so. Two bounds,
for one tokenizer:

* **Bytes per token** (:meth:`TokenBound.fewest`). In a byte-level BPE
  tokenizer (Qwen, Llama 3, GPT-2 family) every token stands for a fixed byte
  string, and the tokens of a text spell its bytes after the tokenizer's
  normalizer (NFC for Qwen). So a text of ``B`` bytes takes at least
  ``ceil(B / L)`` tokens, ``L`` the longest byte string of any token (128 for
  Qwen3: a run of spaces). Costs a length (and, for non-ASCII text under a
  normalizer, a normalization check); other tokenizers get no such bound.
* **Counting in pieces** (:meth:`TokenBound.encode`). A long text is cut
  where the pre-tokenizer cuts anyway (before a space between two
  non-spaces, after a newline between two non-spaces) and
  encoded piece by piece, stopping as soon as the count passes what may fit.
  The ids of the pieces are those of the whole: checked when the bound is
  first needed, cutting a probe text at each such place (as the segment cache
  of :class:`~polar.proxy.render.tokens.TokenText` checks its cuts); a
  tokenizer that fails the check is encoded whole.

So a text that cannot fit costs at most what fits (plus one piece) to refuse,
and one that fits costs what it did. :class:`TooManyTokens` says how many
tokens the text is known to take at least.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable
from typing import Literal

from polar.tokenizer import Tokenizer

_Form = Literal["NFC", "NFD", "NFKC", "NFKD"]
_FORMS = ("NFC", "NFD", "NFKC", "NFKD")

PIECE_CHARS = 64 << 10
"""Texts longer than this are encoded in pieces of about this size when bounded."""

_CUT = re.compile(r"\S(?= \S)|(?<=\S)\n(?=\S)")
"""Ends right before a space between two non-spaces, or after a newline between
two non-spaces: where GPT-2-style pre-tokenizers cut a text anyway (not within
a run of whitespace, which they split by what follows it)."""

_PROBE = (
    "def total(items: list[int]) -> int:\n    return sum(x * 2 for x in items)  # doubled\n"
    "The quick brown fox, 1234 jumps over 56.7 lazy dogs! It's what they'd've done.\n"
    "Ünïcödé wörds, 日本語のテキスト, 中文 字符, emoji 🙂🚀 and\ttabs.\n"
    "    indented line\nURL https://example.com/a?b=c&d=e; path /usr/bin/env python3\n"
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>\n'
    "   three spaces, then words ... and --- punctuation;;; (parens) [brackets] {braces}\n"
    "A paragraph.\n\nThe next one \nafter a space,\r\nCRLF and\n\tx tab.\n"
)


class TooManyTokens(Exception):
    """A text takes more tokens than may fit; ``at_least`` of them, known so far."""

    def __init__(self, at_least: int) -> None:
        super().__init__(f"at least {at_least} tokens")
        self.at_least = at_least


class TokenBound:
    """Lower bounds on a text's token count for one tokenizer (see the module docstring).

    ``token_bytes``: each token's byte string, for byte-level tokenizers (none:
    no bytes-per-token bound). ``encode``: the exact encoding of a text (the
    same ids as the whole text's, special tokens recognised)."""

    def __init__(
        self, tokenizer: Tokenizer, token_bytes: list[bytes], encode: Callable[[str], list[int]]
    ) -> None:
        self._encode = encode
        self.max_token_bytes = max(map(len, token_bytes), default=0) or None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._normalizer = getattr(backend, "normalizer", None)
        form = type(self._normalizer).__name__ if self._normalizer is not None else ""
        self._form: _Form | None = form if form in _FORMS else None  # type: ignore[assignment]
        ascii_probe = "".join(map(chr, range(32, 127))) + "\n\t"
        self._ascii_kept = self._normalizer is None or (
            self._normalizer.normalize_str(ascii_probe) == ascii_probe
        )
        self._tokenizer = tokenizer if backend is not None else None

    @functools.cached_property
    def pieces_hold(self) -> bool:
        """Whether encoding ``_PROBE`` cut at any one place :data:`_CUT` finds gives
        the ids of the whole (and no added token has such a place inside it)."""
        if self._tokenizer is None:
            return False
        added = getattr(self._tokenizer, "added_tokens_decoder", {}) or {}
        for token in added.values():
            content = token.content or ""
            if any(m.end() < len(content) for m in _CUT.finditer(content)):
                return False
        whole = self._encode(_PROBE)
        for match in _CUT.finditer(_PROBE):
            cut = match.end()
            if self._encode(_PROBE[:cut]) + self._encode(_PROBE[cut:]) != whole:
                return False
        return True

    def fewest(self, text: str) -> int:
        """Tokens ``text`` takes at least, by bytes per token (0: no bound)."""
        if self.max_token_bytes is None:
            return 0
        if text.isascii() and self._ascii_kept:
            size = len(text)
        elif self._normalizer is None or (
            self._form is not None and unicodedata.is_normalized(self._form, text)
        ):
            size = len(text.encode("utf-8", "surrogatepass"))
        else:
            size = len(self._normalizer.normalize_str(text).encode("utf-8", "surrogatepass"))
        return -(-size // self.max_token_bytes)

    def encode(self, text: str, room: int | None) -> list[int]:
        """The ids of ``text``; with ``room``, raises :class:`TooManyTokens` as soon
        as they are known to be more than ``room`` (without encoding the rest)."""
        if room is None:
            return self._encode(text)
        fewest = self.fewest(text)
        if fewest > room:
            raise TooManyTokens(fewest)
        if len(text) <= PIECE_CHARS or not self.pieces_hold:
            ids = self._encode(text)
        else:
            ids = []
            start = 0
            while start < len(text):
                found = _CUT.search(text, start + PIECE_CHARS)
                end = found.end() if found is not None else len(text)
                ids += self._encode(text[start:end])
                if len(ids) > room:
                    raise TooManyTokens(len(ids))
                start = end
        if len(ids) > room:
            raise TooManyTokens(len(ids))
        return ids
