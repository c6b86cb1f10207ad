"""Exact text of token ids, decoded incrementally.

Streaming needs text as tokens arrive, and a token may end in the middle of a
UTF-8 character. For byte-level BPE tokenizers (Qwen, Llama 3, GPT-2 family)
every id maps to exact bytes, so decoding is a table lookup plus an
incremental UTF-8 decoder: O(1) per token and identical to decoding the whole
sequence at once. Other tokenizers fall back to decoding the growing prefix.
"""

from __future__ import annotations

import codecs
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence

from polar.ir.tokenids import pack, unpack
from polar.proxy.render.tokenbound import TokenBound, TooManyTokens
from polar.tokenizer import Tokenizer


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


# Stretches between added tokens at least this long are remembered by encode_prompt().
SEGMENT_CHARS = 4 << 10


def _verbatim_added_tokens(tokenizer: Tokenizer) -> list[str]:
    """The added tokens a fast tokenizer matches verbatim and never merges with
    their surroundings (not stripping whitespace, not normalised, not
    single-word), longest first. The tokenizer cuts a text at each of them
    before anything else, so the pieces between such cuts are tokenized on
    their own: encoding them one by one gives the ids of the whole."""
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        return []
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    verbatim = {
        t.content
        for t in added.values()
        if t.content and not (t.lstrip or t.rstrip or t.single_word or t.normalized)
    }
    return sorted(verbatim, key=len, reverse=True)


class TokenText:
    """Bytes and text of token ids for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer, *, segment_cache_bytes: int = 0) -> None:
        """``segment_cache_bytes``: what :meth:`encode_prompt` may keep (0: nothing;
        :class:`~polar.proxy.render.template.ChatTemplate` gives its own)."""
        self.tokenizer = tokenizer
        verbatim = _verbatim_added_tokens(tokenizer) if segment_cache_bytes > 0 else []
        self._cuts = re.compile("|".join(map(re.escape, verbatim))) if verbatim else None
        self._segments = SegmentCache(segment_cache_bytes)
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
        if verbatim and not self._cuts_hold(verbatim):
            self._cuts = None
        self.bound = TokenBound(tokenizer, self._bytes, self.encode)
        """Lower bounds on token counts (prompts that cannot fit, refused early)."""

    def _cuts_hold(self, verbatim: list[str]) -> bool:
        """Whether this tokenizer cuts at each of ``verbatim`` as assumed (one
        that splits special tokens as text, say, does not)."""
        before, after = "end of a line.\n ", " start of the next"
        return all(
            self.encode(before + token + after) == self.encode(before) + self.encode(token + after)
            for token in verbatim
        )

    def bytes_of(self, token_id: int) -> bytes:
        """A token's bytes; none for ids past the vocabulary (a model's padded
        embedding rows, which an untrained model can sample), as the tokenizer's
        own decode gives."""
        if self.byte_level:
            return self._bytes[token_id] if 0 <= token_id < len(self._bytes) else b""
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def bytes_of_ids(self, ids: Sequence[int]) -> bytes:
        """The bytes of byte-level ids, joined (:meth:`bytes_of` of each)."""
        table = self._bytes
        if ids and min(ids) >= 0 and max(ids) < len(table):
            return b"".join([table[i] for i in ids])
        return b"".join([self.bytes_of(i) for i in ids])

    def piece(self, token_id: int) -> tuple[str, bytes]:
        """One token's text (as :meth:`decode` of it alone gives) and bytes."""
        data = self.bytes_of(token_id)
        if self.byte_level:
            return data.decode("utf-8", "replace"), data
        return self.decode([token_id]), data

    def decode(self, ids: Sequence[int]) -> str:
        if self.byte_level:
            return self.bytes_of_ids(ids).decode("utf-8", "replace")
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with special tokens recognised and none added."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            # The Rust tokenizer directly: the same ids, less overhead. Its batch
            # call's fast form skips the character offsets (nothing here reads
            # them): a fifth less time for a short prompt, a sixth for megabytes.
            # It also lets go of the GIL, which encode() holds throughout
            # (seconds for megabytes: every thread, the event loop included, stops).
            return list(backend.encode_batch_fast([text], add_special_tokens=False)[0].ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_prompt(self, text: str, *, most: int | None = None) -> list[int]:
        """:meth:`encode`, remembering long stretches of text between added tokens;
        with ``most``, raises :class:`~polar.proxy.render.tokenbound.TooManyTokens`
        as soon as the ids are known to be more (:mod:`~polar.proxy.render.tokenbound`:
        a text that cannot fit is never encoded whole).

        A rendered prompt is cut where added tokens (``<|im_start|>``, say)
        begin; a stretch of at least :data:`SEGMENT_CHARS` (a long system prompt,
        a task, a big file read back) is looked up in a byte-bounded cache,
        and only the rest is tokenized. The sessions of a GRPO group start from
        one prompt, and every session of a harness resends its long system
        prompt: those are tokenized once. The ids are those of :meth:`encode`
        on the whole text (the tokenizer itself cuts there first; a property
        test compares the two).
        """
        if most is not None and (fewest := self.bound.fewest(text)) > most:
            raise TooManyTokens(fewest)
        if self._cuts is None or len(text) < SEGMENT_CHARS:
            return self.bound.encode(text, most)
        ids: list[int] = []

        def add(part: str, *, cached: bool) -> None:
            room = None if most is None else most - len(ids)
            try:
                ids.extend(self._segment(part, room) if cached else self.bound.encode(part, room))
            except TooManyTokens as exc:
                raise TooManyTokens(len(ids) + exc.at_least) from None
            if most is not None and len(ids) > most:  # a remembered segment
                raise TooManyTokens(len(ids))

        pending = 0  # text[pending:start] is not encoded yet
        start = 0
        for cut in (*(m.start() for m in self._cuts.finditer(text)), len(text)):
            if cut - start >= SEGMENT_CHARS:
                if pending < start:
                    add(text[pending:start], cached=False)
                add(text[start:cut], cached=True)
                pending = cut
            start = cut
        if pending < len(text):
            add(text[pending:], cached=False)
        return ids

    def _segment(self, text: str, room: int | None = None) -> Sequence[int]:
        packed = self._segments.get(text)
        if packed is None:
            ids = self.bound.encode(text, room)
            self._segments.put(text, pack(ids))
            return ids
        return unpack(packed)

    def stream(self) -> TextStream:
        return TextStream(self)


class SegmentCache:
    """Packed ids of texts, least recently used dropped first once the texts
    (a character counted as a byte: a lower bound) and ids exceed ``budget``.
    Shared by the render workers, so locked."""

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._used = 0
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, text: str) -> bytes | None:
        with self._lock:
            packed = self._entries.get(text)
            if packed is None:
                self.misses += 1
                return None
            self._entries.move_to_end(text)
            self.hits += 1
            return packed

    def put(self, text: str, packed: bytes) -> None:
        cost = len(text) + len(packed)
        if cost > self._budget:
            return
        with self._lock:
            if text in self._entries:
                return
            self._entries[text] = packed
            self._used += cost
            while self._used > self._budget:
                old, ids = self._entries.popitem(last=False)
                self._used -= len(old) + len(ids)

    @property
    def used_bytes(self) -> int:
        return self._used


class TextStream:
    """Feed ids as they are sampled, get the text they complete."""

    def __init__(self, text: TokenText) -> None:
        self._text = text
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._ids: list[int] = []
        self._sent = 0

    def feed(self, ids: Sequence[int]) -> str:
        if self._text.byte_level:
            return self._utf8.decode(self._text.bytes_of_ids(ids))
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
