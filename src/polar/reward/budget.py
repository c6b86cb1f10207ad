"""The evaluation's time budget and the timeout signal evaluators score as 0."""

from __future__ import annotations

import time
from dataclasses import dataclass


class TimedOut(Exception):
    """A step ran out of the evaluation budget: the session scores 0, it is not an error."""

    def __init__(self, stage: str, log: str = "") -> None:
        super().__init__(f"{stage} timed out")
        self.stage = stage
        self.log = log


@dataclass(frozen=True, slots=True)
class Budget:
    """The evaluation's deadline; every step's timeout is clamped to what is left."""

    deadline: float

    @classmethod
    def of(cls, seconds: float) -> Budget:
        return cls(time.monotonic() + seconds)

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def clamp(self, limit: float | None) -> float:
        left = self.left()
        return left if limit is None else min(limit, left)
