"""Token ids packed as little-endian ``uint32``: the one encoding of id strings
(and per-token logprobs as little-endian doubles).

A Python tuple of ids costs about 36 bytes per token (a pointer and an int
object); packed, a token costs 4, and two id strings compare with one
``memcmp``. The gateway keeps the ids of a session's recent calls packed, the
record store stores them packed, and the trajectory builders compare them
packed.

Prompts of one session mostly extend each other, so :class:`TokenRun` stores
an id string as a prefix of an earlier run plus its own tail: a session's runs
together cost about the length of its longest conversation, not the sum of
its prompts.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Reversible, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

_LITTLE = sys.byteorder == "little"

WIDTH = 4
"""Bytes per packed token."""

MAX_DEPTH = 128
"""Runs chained deeper than this are stored whole (bounds the cost of :meth:`TokenRun.packed`)."""

_T = TypeVar("_T")


def _little_endian(packed: array[Any]) -> bytes:
    if not _LITTLE:
        packed.byteswap()
    return packed.tobytes()


def _from_little_endian(typecode: str, data: bytes | memoryview) -> array[Any]:
    packed = array(typecode)
    if len(data) % packed.itemsize:
        raise ValueError(f"packed values must be a multiple of {packed.itemsize} bytes")
    packed.frombytes(data)
    if not _LITTLE:
        packed.byteswap()
    return packed


class PromptIdList(list[int]):
    """A token engine's prompt in a request body the gateway built from a
    record's ``prompt_ids``, marked so the record store can tell it is that
    prompt without comparing tens of thousands of ids. Only the gateway makes
    one; a client's JSON never yields one."""


def pack(ids: Sequence[int]) -> bytes:
    """Pack ids; raises ``OverflowError`` for one that is negative or wider than 32 bits."""
    return _little_endian(array("I", ids))


def unpack(data: bytes | memoryview) -> tuple[int, ...]:
    return tuple(_from_little_endian("I", data))


def pack_floats(values: Sequence[float]) -> bytes:
    """Per-token floats (logprobs) as little-endian doubles: exact round trip."""
    return _little_endian(array("d", values))


def unpack_floats(data: bytes | memoryview) -> tuple[float, ...]:
    return tuple(_from_little_endian("d", data))


def common_prefix(a: bytes | memoryview, b: bytes | memoryview) -> int:
    """Leading tokens two packed id strings share.

    Each probe is one ``memcmp`` (``bytes.startswith`` at an offset, against a
    memoryview slice of the other: no copy; comparing two memoryviews would go
    byte by byte, about 150 times slower): the whole shared length first, then
    galloping and bisection, so a 100k-token prompt costs microseconds, never
    a Python step per token.
    """
    if not isinstance(a, bytes | bytearray):
        a, b = (b, a) if isinstance(b, bytes | bytearray) else (bytes(a), b)
    vb = memoryview(b)
    n = min(len(a), len(vb)) // WIDTH

    def same(start: int, stop: int) -> bool:  # tokens [start, stop) are equal
        return a.startswith(vb[start * WIDTH : stop * WIDTH], start * WIDTH)

    if same(0, n):
        return n
    lo, step = 0, 64  # invariant: the first lo tokens are equal
    while lo + step < n and same(lo, lo + step):
        lo += step
        step *= 2
    hi = min(lo + step, n)  # invariant: some token in [lo, hi) differs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if same(lo, mid):
            lo = mid
        else:
            hi = mid
    return lo + 1 if same(lo, lo + 1) else lo


@dataclass(frozen=True, slots=True, eq=False)
class TokenRun:
    """An immutable packed id string: the first ``shared`` tokens of ``base``,
    then ``tail``. Build with :meth:`of` and :meth:`then`."""

    base: TokenRun | None
    shared: int
    tail: bytes
    depth: int

    @staticmethod
    def of(packed: bytes, on: TokenRun | None = None) -> TokenRun:
        """``packed`` as a run sharing its common prefix with ``on`` (when any)."""
        if on is None:
            return TokenRun(None, 0, packed, 0)
        shared = common_prefix(on.packed(), packed)
        if not shared:
            return TokenRun(None, 0, packed, 0)
        return on._head(shared)._then(packed[shared * WIDTH :])

    def then(self, packed: bytes) -> TokenRun:
        """This run followed by ``packed``."""
        return self._then(packed)

    def _head(self, n: int) -> TokenRun:
        """The first ``n`` tokens (no copy while they are shared)."""
        if n == len(self):
            return self
        if n == 0:
            return TokenRun(None, 0, b"", 0)
        return TokenRun(self, n, b"", self.depth + 1)

    def _then(self, packed: bytes) -> TokenRun:
        if self.depth >= MAX_DEPTH:
            return TokenRun(None, 0, self.packed() + packed, 0)
        if not packed:
            return self
        return TokenRun(self, len(self), packed, self.depth + 1)

    def __len__(self) -> int:
        return self.shared + len(self.tail) // WIDTH

    def packed(self) -> bytes:
        """The ids as one packed string (joins the pieces: one copy)."""
        if self.base is None:
            return self.tail
        pieces: list[bytes] = []
        need = len(self)  # tokens still wanted from the start of the current run
        run: TokenRun | None = self
        while run is not None and need:
            if need > run.shared:
                pieces.append(run.tail[: (need - run.shared) * WIDTH])
                need = run.shared
            run = run.base
        pieces.reverse()
        return b"".join(pieces)

    def ids(self) -> tuple[int, ...]:
        return unpack(self.packed())

    def last(self) -> int | None:
        """The last id (``None`` when empty)."""
        n = len(self)
        if not n:
            return None
        run = self
        while n <= run.shared:
            assert run.base is not None
            run = run.base
        at = (n - run.shared - 1) * WIDTH
        return unpack(run.tail[at : at + WIDTH])[0]

    def own_bytes(self) -> int:
        """Bytes this run adds to what its base holds."""
        return len(self.tail)


def best_shared_prefix(
    packed: bytes, candidates: Reversible[_T], run: Callable[[_T], TokenRun]
) -> tuple[_T, int] | None:
    """Of ``candidates`` (oldest first), the one whose ``run`` shares the longest
    prefix with ``packed``, the newest of those that tie, and the tokens it
    shares; ``None`` when none shares a token.

    Newest first, and a candidate that cannot share more than the best so far
    (its run, or ``packed``, is no longer) is skipped unread: usually the newest
    run is a prefix of ``packed`` (a conversation that grew) and no older,
    shorter one is unpacked; once the whole of ``packed`` is shared (a resent
    request) the search ends.
    """
    best: _T | None = None
    most = 0
    whole = len(packed) // WIDTH
    for candidate in reversed(candidates):
        full = run(candidate)
        if min(whole, len(full)) <= most:
            continue
        shared = common_prefix(packed, full.packed())
        if shared > most:
            best, most = candidate, shared
            if most == whole:
                break
    return None if best is None else (best, most)
