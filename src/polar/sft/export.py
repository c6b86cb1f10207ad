"""SFT exports: the accepted attempts' traces as chat rows and as token rows.

One row per exported trace, in the task file's order, then by attempt and
trace. Each is written as JSONL and/or Parquet (``chat.jsonl``,
``chat.parquet``, ``tokens.jsonl``, ``tokens.parquet``), atomically; Parquet
files hold ``polar.sft.<kind>.version`` in their metadata. Both load with
``datasets.load_dataset("json" | "parquet", data_files=...)`` and train as they
are in TRL's ``SFTTrainer``. Nothing in a row depends on timing or on the
rollout service's ids, so the same scripted generation exports the same bytes.

Common columns (schema version 1):

- ``id`` string: ``<task>/<attempt>/<chain>.<segment>``
- ``task`` string, ``attempt`` int32: the dataset task and the attempt's index
- ``chain_class`` string: ``main``, ``sub_agent``, ``compaction_restart``
  (``side_call`` only with ``keep_side_calls``)
- ``reward`` float64: the session's reward times the class's reward scale

**Chat rows** (what most SFT tools read, TRL's conversational format):

- ``messages`` list of ``{role, content, reasoning_content, tool_calls,
  tool_call_id, name}`` (every key present, ``null`` where it does not apply):
  ``role`` is ``system``, ``user``, ``assistant`` or ``tool``; ``content`` the
  text; ``reasoning_content`` the model's reasoning, kept apart from
  ``content``; ``tool_calls`` a list of ``{id, type: "function", function:
  {name, arguments}}`` with ``arguments`` the JSON text the model wrote. Tool
  call ids are renumbered ``call_1``, ``call_2``... per row (the gateway's are
  random; the model never sees them). Assistant turns the model produced are
  as it produced them, whatever the harness sent back (see
  :mod:`polar.rollout.conversation`); an assistant turn the harness wrote
  itself (Qwen Code opens with one) stays as the harness sent it. Only the
  token export tells the two apart: its labels cover sampled tokens alone.
- ``tools`` string: the JSON array of the tools offered, OpenAI style
  (``{"type": "function", "function": {"name", "description",
  "parameters"}}``). Text, not a nested column, so that tools with different
  parameter schemas fit one column; TRL's ``SFTTrainer`` parses it.

**Token rows** (from the prefix-merged traces: exactly what the model saw and
sampled, never re-tokenized):

- ``input_ids`` list<int32>: the trace's prompt, then its response tokens
- ``labels`` list<int32>: the token where the model sampled it, ``-100`` on
  every other token (prompt, tool output, template glue)
- ``attention_mask`` list<int8>: all ones
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson

from polar.atomicfile import atomic_path
from polar.sft.verdict import AttemptKey

EXPORT_VERSION = 1
IGNORE = -100
"""The label of a token the model did not sample (PyTorch's ``ignore_index``)."""
MESSAGE_KEYS = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name")
ROW_GROUP = 64


class ExportFormat(StrEnum):
    JSONL = "jsonl"
    PARQUET = "parquet"


class ExportKind(StrEnum):
    CHAT = "chat"
    TOKENS = "tokens"


class ExportFileError(Exception):
    """An export file that cannot be read as one (the message names the file and row)."""


# ---------------------------------------------------------------- rows


def token_row(key: AttemptKey, sample: Mapping[str, Any]) -> dict[str, Any]:
    """A token row from a trajectory sample row (``polar.trajectory.export``)."""
    prompt, response = list(sample["prompt_ids"]), list(sample["response_ids"])
    labels = [IGNORE] * len(prompt) + [
        token if sampled else IGNORE
        for token, sampled in zip(response, sample["loss_mask"], strict=True)
    ]
    return {
        **_common(key, sample),
        "input_ids": prompt + response,
        "labels": labels,
        "attention_mask": [1] * (len(prompt) + len(response)),
    }


def chat_row(
    key: AttemptKey, sample: Mapping[str, Any], conversation: Mapping[str, Any]
) -> dict[str, Any]:
    """A chat row from a sample and its conversation (``SessionResult.conversations``)."""
    renamed: dict[str, str] = {}

    def call_id(original: str) -> str:
        return renamed.setdefault(original, f"call_{len(renamed) + 1}")

    messages = []
    for message in conversation["messages"]:
        out = {name: message.get(name) for name in MESSAGE_KEYS}
        if out["tool_calls"]:
            out["tool_calls"] = [
                {
                    "id": call_id(str(c.get("id"))),
                    "type": "function",
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": c["function"]["arguments"],
                    },
                }
                for c in out["tool_calls"]
            ]
        else:
            out["tool_calls"] = None
        if out["tool_call_id"] is not None:
            out["tool_call_id"] = renamed.get(out["tool_call_id"], out["tool_call_id"])
        messages.append(out)
    return {
        **_common(key, sample),
        "messages": messages,
        "tools": orjson.dumps(conversation["tools"]).decode(),
    }


def _common(key: AttemptKey, sample: Mapping[str, Any]) -> dict[str, Any]:
    chain_segment = sample["trace_id"].rsplit("/", 1)[-1]
    return {
        "id": f"{key.task}/{key.attempt}/{chain_segment}",
        "task": key.task,
        "attempt": key.attempt,
        "chain_class": sample["chain_class"],
        "reward": sample["reward"],
    }


# ---------------------------------------------------------------- Parquet schemas


def arrow_schema(kind: ExportKind) -> Any:
    import pyarrow as pa  # imported on use: only Parquet needs it

    common = [
        ("id", pa.string()),
        ("task", pa.string()),
        ("attempt", pa.int32()),
        ("chain_class", pa.string()),
        ("reward", pa.float64()),
    ]
    match kind:
        case ExportKind.TOKENS:
            columns = [
                ("input_ids", pa.list_(pa.int32())),
                ("labels", pa.list_(pa.int32())),
                ("attention_mask", pa.list_(pa.int8())),
            ]
        case ExportKind.CHAT:
            function = pa.struct([("name", pa.string()), ("arguments", pa.string())])
            call = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", function)])
            message = pa.struct(
                [
                    ("role", pa.string()),
                    ("content", pa.string()),
                    ("reasoning_content", pa.string()),
                    ("tool_calls", pa.list_(call)),
                    ("tool_call_id", pa.string()),
                    ("name", pa.string()),
                ]
            )
            columns = [("messages", pa.list_(message)), ("tools", pa.string())]
    key = f"polar.sft.{kind.value}.version".encode()
    return pa.schema(common + columns, metadata={key: str(EXPORT_VERSION).encode()})


# ---------------------------------------------------------------- writing


class _Sink:
    """One export file being written under a temporary name."""

    def __init__(self, kind: ExportKind, fmt: ExportFormat, path: Path) -> None:
        self.kind, self.fmt, self.path = kind, fmt, path
        self.rows = 0
        self._pending: list[dict[str, Any]] = []
        self._file: Any = None
        self._writer: Any = None

    def open(self) -> None:
        match self.fmt:
            case ExportFormat.JSONL:
                self._file = self.path.open("wb")
            case ExportFormat.PARQUET:
                import pyarrow.parquet as pq

                self._writer = pq.ParquetWriter(self.path, arrow_schema(self.kind))

    def add(self, row: dict[str, Any]) -> None:
        self.rows += 1
        match self.fmt:
            case ExportFormat.JSONL:
                self._file.write(orjson.dumps(row) + b"\n")
            case ExportFormat.PARQUET:
                self._pending.append(row)
                if len(self._pending) >= ROW_GROUP:
                    self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self._pending:
            table = pa.Table.from_pylist(self._pending, schema=arrow_schema(self.kind))
            self._writer.write_table(table)
            self._pending = []

    def close(self) -> None:
        match self.fmt:
            case ExportFormat.JSONL:
                self._file.close()
            case ExportFormat.PARQUET:
                self._flush()
                self._writer.close()


@dataclass(frozen=True, slots=True)
class ExportCounts:
    rows: dict[str, int]
    """File name -> rows written."""
    chat_skipped: dict[str, str]
    """Row id -> why its conversation could not be exported (token row still written)."""


def export_path(out: Path, kind: ExportKind, fmt: ExportFormat) -> Path:
    return out / f"{kind.value}.{fmt.value}"


def write_exports(
    out: Path,
    rows: Iterator[tuple[dict[str, Any], dict[str, Any] | None, str | None]],
    formats: Sequence[ExportFormat],
) -> ExportCounts:
    """Write every (token row, chat row or None, why no chat row) to each format, atomically."""
    with contextlib.ExitStack() as stack:
        sinks = []
        for kind in ExportKind:
            for fmt in formats:
                temporary = stack.enter_context(atomic_path(export_path(out, kind, fmt)))
                sink = _Sink(kind, fmt, temporary)
                sink.open()
                sinks.append(sink)
        skipped: dict[str, str] = {}
        try:
            for tokens, chat, problem in rows:
                for sink in sinks:
                    if sink.kind is ExportKind.TOKENS:
                        sink.add(tokens)
                    elif chat is not None:
                        sink.add(chat)
                if chat is None:
                    skipped[tokens["id"]] = problem or "no conversation"
        finally:
            for sink in sinks:
                sink.close()
        counts = {f"{s.kind.value}.{s.fmt.value}": s.rows for s in sinks}
    return ExportCounts(counts, skipped)


# ---------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class TokenRow:
    id: str
    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    attention_mask: tuple[int, ...]

    @property
    def trained(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL or Parquet export, as plain values (format from the suffix)."""
    if not path.is_file():
        raise ExportFileError(f"{path}: no such file")
    match path.suffix.lower():
        case ".jsonl":
            rows = []
            for number, line in enumerate(path.read_bytes().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = orjson.loads(line)
                except orjson.JSONDecodeError:
                    raise ExportFileError(f"{path}:{number}: not valid JSON") from None
                if not isinstance(row, dict):
                    raise ExportFileError(f"{path}:{number}: expected a JSON object")
                rows.append(row)
            return rows
        case ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                return list(pq.read_table(path).to_pylist())
            except (OSError, pa.ArrowException) as exc:
                raise ExportFileError(f"{path}: not a readable Parquet file ({exc})") from None
        case _:
            raise ExportFileError(f"{path}: expected a .jsonl or .parquet file")


def token_rows(path: Path) -> list[TokenRow]:
    """A token export, checked row by row (:class:`ExportFileError` names the first bad one)."""
    out = []
    for index, row in enumerate(read_rows(path)):
        where = f"{path}: row {index + 1}"
        try:
            ids, labels, mask = (list(row[k]) for k in ("input_ids", "labels", "attention_mask"))
        except (KeyError, TypeError):
            raise ExportFileError(
                f"{where}: needs input_ids, labels and attention_mask lists"
            ) from None
        if not ids or not len(ids) == len(labels) == len(mask):
            raise ExportFileError(f"{where}: input_ids, labels and attention_mask differ in length")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise ExportFileError(f"{where}: input_ids must be non-negative integers")
        if any(label not in (IGNORE, token) for token, label in zip(ids, labels, strict=True)):
            raise ExportFileError(f"{where}: a label is neither -100 nor its input token")
        if any(m not in (0, 1) for m in mask):
            raise ExportFileError(f"{where}: attention_mask must be 0 or 1")
        out.append(TokenRow(str(row.get("id", index)), tuple(ids), tuple(labels), tuple(mask)))
    return out
