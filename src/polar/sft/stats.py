"""Acceptance statistics, per task and overall, as JSON and as a table.

Schema of ``stats.json`` (version 1)::

    {"version": 1, "complete": bool, "accept": "<rule>",
     "filters": {"dedupe", "keep_side_calls", "max_tokens", "per_task_cap"},
     "overall": TALLY,
     "tasks": [{"task": "<id>", **TALLY}, ...]}      # in the task file's order

    TALLY = {"planned": int,      # attempts asked for
             "attempts": int,     # attempts finished (acknowledged)
             "accepted": int,
             "rate": float|null,  # accepted / attempts
             "rejected": {"tests_failed", "timeout", "error", "filtered": int},
             "filtered": {"no_traces", "too_long", "duplicate", "task_cap": int}}

``attempts == accepted + sum(rejected)`` and ``rejected.filtered ==
sum(filtered)`` always hold. ``complete`` is true once every planned attempt
finished. Nothing in it depends on timing or on the order results arrived, so
two runs of the same scripted generation write the same file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from polar.sft.verdict import REJECTIONS, FilterReason, Filters, Outcome, Verdict

STATS_VERSION = 1


@dataclass(slots=True)
class Tally:
    planned: int = 0
    outcomes: dict[Outcome, int] = field(default_factory=lambda: dict.fromkeys(Outcome, 0))
    filtered: dict[FilterReason, int] = field(
        default_factory=lambda: dict.fromkeys(FilterReason, 0)
    )

    @property
    def attempts(self) -> int:
        return sum(self.outcomes.values())

    @property
    def accepted(self) -> int:
        return self.outcomes[Outcome.ACCEPTED]

    @property
    def rate(self) -> float | None:
        return self.accepted / self.attempts if self.attempts else None

    def add(self, verdict: Verdict) -> None:
        self.outcomes[verdict.outcome] += 1
        if verdict.reason is not None:
            self.filtered[verdict.reason] += 1

    def merge(self, other: Tally) -> None:
        self.planned += other.planned
        for outcome, n in other.outcomes.items():
            self.outcomes[outcome] += n
        for reason, n in other.filtered.items():
            self.filtered[reason] += n

    def to_json(self) -> dict[str, Any]:
        return {
            "planned": self.planned,
            "attempts": self.attempts,
            "accepted": self.accepted,
            "rate": self.rate,
            "rejected": {o.value: self.outcomes[o] for o in REJECTIONS},
            "filtered": {r.value: n for r, n in self.filtered.items()},
        }


@dataclass(slots=True)
class GenerationStats:
    accept: str
    filters: Filters
    tasks: dict[str, Tally]
    """In the order of the task file."""

    @classmethod
    def of(
        cls,
        accept: str,
        filters: Filters,
        planned: Mapping[str, int],
        verdicts: Sequence[Verdict],
    ) -> GenerationStats:
        tasks = {task: Tally(planned=n) for task, n in planned.items()}
        for verdict in verdicts:
            tasks[verdict.key.task].add(verdict)
        return cls(accept, filters, tasks)

    @property
    def overall(self) -> Tally:
        total = Tally()
        for tally in self.tasks.values():
            total.merge(tally)
        return total

    @property
    def complete(self) -> bool:
        overall = self.overall
        return overall.attempts >= overall.planned

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATS_VERSION,
            "complete": self.complete,
            "accept": self.accept,
            "filters": asdict(self.filters),
            "overall": self.overall.to_json(),
            "tasks": [{"task": task, **t.to_json()} for task, t in self.tasks.items()],
        }


def stats_table(stats: GenerationStats) -> Any:
    """A rich table: one row per task, then the overall row."""
    from rich.table import Table

    table = Table(title=f"accept: {stats.accept}", title_justify="left")
    table.add_column("task", overflow="fold")  # a task id is never cut short
    for name in ("attempts", "accepted", "rate", "tests failed", "timeout", "error"):
        table.add_column(name, justify="right")
    table.add_column("filtered", justify="right")

    def row(name: str, t: Tally, *, bold: bool = False) -> None:
        reasons = ", ".join(f"{r.value} {n}" for r, n in t.filtered.items() if n)
        cells = [
            name,
            f"{t.attempts}/{t.planned}",
            str(t.accepted),
            "-" if t.rate is None else f"{t.rate:.1%}",
            str(t.outcomes[Outcome.TESTS_FAILED]),
            str(t.outcomes[Outcome.TIMEOUT]),
            str(t.outcomes[Outcome.ERROR]),
            f"{t.outcomes[Outcome.FILTERED]}" + (f" ({reasons})" if reasons else ""),
        ]
        table.add_row(*cells, style="bold" if bold else None)

    for task, tally in stats.tasks.items():
        row(task, tally)
    table.add_section()
    row("overall", stats.overall, bold=True)
    return table


def progress_line(tally: Tally) -> str:
    """One line for the live display."""
    rate = "-" if tally.rate is None else f"{tally.rate:.1%}"
    filtered = tally.outcomes[Outcome.FILTERED]
    return (
        f"accepted {tally.accepted} ({rate}) · tests failed "
        f"{tally.outcomes[Outcome.TESTS_FAILED]} · timeout {tally.outcomes[Outcome.TIMEOUT]} "
        f"· error {tally.outcomes[Outcome.ERROR]} · filtered {filtered}"
    )
