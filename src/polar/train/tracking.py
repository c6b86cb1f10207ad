"""Where a run's metrics go: a JSONL file (one line per step), TensorBoard
scalars (``torch.utils.tensorboard``), and a progress bar on the console.

The JSONL file is appended to, so a resumed run continues it; every line has
``step``, ``policy_version`` and ``time`` next to the step's metrics.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

# The progress bar shows these, when the step has them.
SHOWN = (
    ("reward/mean", "reward {:.3f}"),
    ("groups/zero_advantage_fraction", "zero-adv {:.0%}"),
    ("clip_fraction", "clip {:.3f}"),
    ("mismatch/kl", "kl {:.1e}"),
    ("groups/stale_dropped_total", "stale {:.0f}"),
)


class MetricsLog:
    def __init__(
        self,
        out: Path,
        *,
        jsonl: bool,
        tensorboard: bool,
        progress: bool,
        total_steps: int,
        first_step: int = 0,
    ) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = out / "metrics.jsonl" if jsonl else None
        self.tensorboard_dir = out / "tensorboard" if tensorboard else None
        self._writer: Any = None
        if self.tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.tensorboard_dir))
        self._progress: Any = None
        self._bar: Any = None
        if progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[shown]}"),
                transient=False,
            )
            self._progress.start()
            self._bar = self._progress.add_task(
                "train", total=total_steps, completed=first_step, shown=""
            )

    def write(self, step: int, policy_version: int, metrics: dict[str, float]) -> None:
        if self.jsonl_path is not None:
            line = {"step": step, "policy_version": policy_version, "time": time.time()}
            with self.jsonl_path.open("ab") as f:
                f.write(orjson.dumps(line | metrics) + b"\n")
        if self._writer is not None:
            for name, value in metrics.items():
                self._writer.add_scalar(name, value, step)
            self._writer.flush()
        if self._progress is not None:
            shown = "  ".join(fmt.format(metrics[k]) for k, fmt in SHOWN if k in metrics)
            self._progress.update(self._bar, completed=step, shown=shown)

    def note(self, message: str) -> None:
        """A line on the console (above the bar)."""
        if self._progress is not None:
            self._progress.console.print(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
