"""Which worker of a gateway group serves a session: the one place that decides.

A session belongs to one worker for its whole life (the worker holds its
transcript, so token-mode splicing stays exact, and assigns its sequence
numbers). The owner is a function of the session id alone, so the parent, every
worker and a restarted group agree without asking each other.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass


def owner_of(session_id: str, workers: int) -> int:
    """The index of the worker that serves ``session_id`` in a group of ``workers``."""
    return zlib.crc32(session_id.encode("utf-8", "surrogatepass")) % workers


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """One worker's place in its group."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"worker {self.index} is not in a group of {self.count}")

    def owns(self, session_id: str) -> bool:
        return owner_of(session_id, self.count) == self.index
