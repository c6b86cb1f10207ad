"""Offline SFT data: generate it through the rollout service, judge it, export
it, and fine-tune on it.

- :mod:`~polar.sft.generate`: K attempts per task, resumable (``polar generate``),
  with a durable journal (:mod:`~polar.sft.journal`);
- :mod:`~polar.sft.accept` and :mod:`~polar.sft.verdict`: the acceptance rule,
  the filters, and one outcome per attempt; :mod:`~polar.sft.stats`: the
  acceptance statistics;
- :mod:`~polar.sft.export`: chat and token exports, JSONL and Parquet;
- :mod:`~polar.sft.train`: supervised fine-tuning on a token export
  (``polar sft``), the pure pieces in :mod:`~polar.sft.batching`.

Python API: ``Generation(GenerateConfig(...), tasks, reattach=...).run(client)``
and ``finetune(FinetuneConfig(data=..., model=..., out=...))``.
"""

from polar.sft.accept import Acceptance, AcceptError
from polar.sft.export import ExportFormat, ExportKind, read_rows, token_rows
from polar.sft.generate import GenerateConfig, Generation, GenerationReport
from polar.sft.stats import GenerationStats
from polar.sft.train import FinetuneConfig, FinetuneError, FinetuneReport, finetune
from polar.sft.verdict import FilterReason, Filters, Outcome

__all__ = [
    "AcceptError",
    "Acceptance",
    "ExportFormat",
    "ExportKind",
    "FilterReason",
    "Filters",
    "FinetuneConfig",
    "FinetuneError",
    "FinetuneReport",
    "GenerateConfig",
    "Generation",
    "GenerationReport",
    "GenerationStats",
    "Outcome",
    "finetune",
    "read_rows",
    "token_rows",
]
