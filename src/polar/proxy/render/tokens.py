"""Exact text of token ids, decoded incrementally.

Streaming needs text as tokens arrive, and a token may end in the middle of a
UTF-8 character. For byte-level BPE tokenizers (Qwen, Llama 3, GPT-2 family)
every id maps to exact bytes, so decoding is a table lookup plus an
incremental UTF-8 decoder: O(1) per token and identical to decoding the whole
sequence at once. Other tokenizers fall back to decoding the growing prefix.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes-to-unicode map used by byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}


# Texts longer than this are encoded without holding the GIL.
_GIL_FREE_CHARS = 32 << 10


class TokenText:
    """Bytes and text of token ids for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = backend.decoder.__class__.__name__ if backend is not None else ""
        self.byte_level = decoder == "ByteLevel"
        self._bytes: list[bytes] = []
        if self.byte_level:
            table = _byte_decoder()
            added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
            vocab = tokenizer.get_vocab()
            self._bytes = [b""] * (max(vocab.values()) + 1)
            for token, index in vocab.items():
                if index in added:
                    self._bytes[index] = added[index].encode("utf-8")
                else:
                    self._bytes[index] = bytes(table[c] for c in token)

    def bytes_of(self, token_id: int) -> bytes:
        """A token's bytes; none for ids past the vocabulary (a model's padded
        embedding rows, which an untrained model can sample), as the tokenizer's
        own decode gives."""
        if self.byte_level:
            return self._bytes[token_id] if 0 <= token_id < len(self._bytes) else b""
        return str(self.tokenizer.decode([token_id], skip_special_tokens=False)).encode("utf-8")

    def decode(self, ids: Sequence[int]) -> str:
        if self.byte_level:
            return b"".join(self.bytes_of(i) for i in ids).decode("utf-8", "replace")
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with special tokens recognised and none added."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:  # the Rust tokenizer directly: same ids, less overhead
            if len(text) > _GIL_FREE_CHARS:
                # encode() holds the GIL throughout (seconds for megabytes: every
                # thread, the event loop included, stops); encode_batch() lets go.
                return list(backend.encode_batch([text], add_special_tokens=False)[0].ids)
            return list(backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def stream(self) -> TextStream:
        return TextStream(self)


class TextStream:
    """Feed ids as they are sampled, get the text they complete."""

    def __init__(self, text: TokenText) -> None:
        self._text = text
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._ids: list[int] = []
        self._sent = 0

    def feed(self, ids: Sequence[int]) -> str:
        if self._text.byte_level:
            return self._utf8.decode(b"".join(self._text.bytes_of(i) for i in ids))
        self._ids.extend(ids)
        whole = self._text.decode(self._ids)
        if whole.endswith("\ufffd"):
            return ""
        piece, self._sent = whole[self._sent :], len(whole)
        return piece

    def flush(self) -> str:
        if self._text.byte_level:
            return self._utf8.decode(b"", final=True)
        whole = self._text.decode(self._ids)
        piece, self._sent = whole[self._sent :], len(whole)
        return piece
