"""Trainer samples: one row per trace, written to Parquet or JSONL, and read back.

This is the one module of :mod:`polar.trajectory` that does I/O. Files are
written to a temporary name in the target directory and renamed into place,
so a failed export leaves nothing behind and never a half-written file.

Schema (version 2; the Parquet file's metadata holds ``polar.samples.version``,
JSONL rows carry the same fields as JSON values; version 1 files, without the
last two fields, are read as ``unreproducible: unrecorded``):

- ``trace_id`` string: ``<session>/<chain>.<segment>``
- ``session_id`` string: the gateway session
- ``group_id`` string, nullable: the GRPO group (samples of the same task)
- ``builder`` string: ``per_request``, ``prefix_merge``, or a plug-in's name
- ``chain``, ``segment`` int32: chain index, trace index within that chain
- ``chain_class`` string: ``main``, ``sub_agent``, ``side_call``, ``compaction_restart``
- ``break_reason`` string, nullable: why the chain continues in this trace
  (``rewritten``, ``retry``, ``dropped_turn``, ``edited``, ``policy_changed``)
- ``trainable`` bool: whether the class policy trains it
- ``policy_version`` int64: the weights that sampled every token of it
- ``prompt_ids`` list<int32>: context, never trained
- ``response_ids`` list<int32>: sampled and interstitial tokens
- ``loss_mask`` list<int8>: 1 sampled by the policy, 0 interstitial
- ``rollout_logprobs`` list<float64>: the engine's logprob of each response
  token (0.0 where ``logprob_mask`` is 0)
- ``logprob_mask`` list<int8>: 1 where ``rollout_logprobs`` is real
- ``reward`` float64, nullable: outcome x ``reward_scale`` (null: not scored)
- ``reward_scale`` float64: the class policy's factor
- ``finish_reason`` string, nullable: of the trace's last call
- ``source_records`` list<string>: record keys ``<session>/<seq>.<attempt>``
- ``turn_offsets`` list<struct<record string, start, sampled_start, end int32>>:
  per record, its interstitial ``[start, sampled_start)`` and sampled tokens
  ``[sampled_start, end)`` in ``response_ids``
- ``truncated_turns`` int32: calls cut short (length limit, or aborted by the engine)
- ``malformed_tool_calls`` int32: tool calls the model wrote that did not parse
- ``sampling`` struct<temperature, top_p float64, top_k int32, min_p float64>,
  nullable: the distribution every sampled token was drawn from, whose logprobs
  ``rollout_logprobs`` are (:class:`polar.ir.Distribution`); null when
  ``unreproducible`` says why a trainer cannot recompute it
- ``unreproducible`` string, nullable: ``greedy``, ``penalties``, ``logit_bias``,
  ``constrained``, ``logprobs``, ``unknown_settings``, ``unrecorded``
  (:class:`polar.ir.Unreproducible`); a trainer leaves these tokens out

``response_ids``, ``loss_mask``, ``rollout_logprobs`` and ``logprob_mask``
always have the same length.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, NotRequired

import orjson
from typing_extensions import TypedDict

from polar.atomicfile import atomic_path
from polar.ir import Distribution, FinishReason, Unreproducible
from polar.ir.codec import distribution_from_json
from polar.trajectory.errors import ExportError
from polar.trajectory.trace import BreakReason, ChainClass, Trajectory, TurnSpan

SCHEMA_VERSION = 2
_READABLE_VERSIONS = (b"1", b"2")
_VERSION_KEY = b"polar.samples.version"


class SampleFormat(StrEnum):
    PARQUET = "parquet"
    JSONL = "jsonl"

    @classmethod
    def of(cls, path: Path) -> SampleFormat:
        suffix = path.suffix.lstrip(".").lower()
        try:
            return cls(suffix)
        except ValueError:
            raise ExportError(f"{path}: cannot tell the format (use .parquet or .jsonl)") from None


@dataclass(frozen=True, slots=True)
class Sample:
    """One row of the export (see the module docstring)."""

    trace_id: str
    session_id: str
    group_id: str | None
    builder: str
    chain: int
    segment: int
    chain_class: ChainClass
    break_reason: BreakReason | None
    trainable: bool
    policy_version: int
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    rollout_logprobs: tuple[float, ...]
    logprob_mask: tuple[int, ...]
    reward: float | None
    reward_scale: float
    finish_reason: FinishReason | None
    source_records: tuple[str, ...]
    turn_offsets: tuple[TurnSpan, ...]
    truncated_turns: int
    malformed_tool_calls: int
    sampling: Distribution | Unreproducible = Unreproducible.UNRECORDED


FIELDS = (*Sample.__dataclass_fields__, "unreproducible")
"""A row's fields, in order: a sample's, its ``sampling`` split into ``sampling``
(a distribution) and ``unreproducible`` (why there is none)."""
_V1_FIELDS = FIELDS[:-2]


class TurnOffsetRow(TypedDict):
    record: str
    start: int
    sampled_start: int
    end: int


class SamplingRow(TypedDict):
    temperature: float
    top_p: float
    top_k: int
    min_p: float


class SampleRow(TypedDict):
    """A sample as plain JSON values: the JSONL row, and what a session's result
    carries (``typing_extensions``' ``TypedDict``: pydantic validates it)."""

    trace_id: str
    session_id: str
    group_id: str | None
    builder: str
    chain: int
    segment: int
    chain_class: str
    break_reason: str | None
    trainable: bool
    policy_version: int
    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    loss_mask: Sequence[int]
    rollout_logprobs: Sequence[float]
    logprob_mask: Sequence[int]
    reward: float | None
    reward_scale: float
    finish_reason: str | None
    source_records: Sequence[str]
    turn_offsets: Sequence[TurnOffsetRow]
    truncated_turns: int
    malformed_tool_calls: int
    # Not in version 1 rows (results stored before): read as ``unrecorded``.
    sampling: NotRequired[SamplingRow | None]
    unreproducible: NotRequired[str | None]


def samples_of(trajectory: Trajectory, *, include_untrainable: bool = False) -> list[Sample]:
    """The trajectory's traces as rows (by default only those its class policies train)."""
    return [
        Sample(
            trace_id=t.id,
            session_id=t.session_id,
            group_id=trajectory.group_id,
            builder=trajectory.builder,
            chain=t.chain,
            segment=t.segment,
            chain_class=t.chain_class,
            break_reason=t.break_reason,
            trainable=t.trainable,
            policy_version=t.policy_version,
            prompt_ids=t.prompt_ids,
            response_ids=t.response_ids,
            loss_mask=t.loss_mask,
            rollout_logprobs=t.response_logprobs,
            logprob_mask=t.logprob_mask,
            reward=t.reward,
            reward_scale=t.reward_scale,
            finish_reason=t.finish_reason,
            source_records=t.records,
            turn_offsets=t.turns,
            truncated_turns=t.truncated_turns,
            malformed_tool_calls=t.malformed_tool_calls,
            sampling=t.sampling,
        )
        for t in trajectory.traces
        if t.trainable or include_untrainable
    ]


# ---------------------------------------------------------------- rows as plain values


def row_of(sample: Sample) -> SampleRow:
    """A sample as plain JSON values (the JSONL row)."""
    return SampleRow(
        trace_id=sample.trace_id,
        session_id=sample.session_id,
        group_id=sample.group_id,
        builder=sample.builder,
        chain=sample.chain,
        segment=sample.segment,
        chain_class=sample.chain_class,
        break_reason=sample.break_reason,
        trainable=sample.trainable,
        policy_version=sample.policy_version,
        prompt_ids=sample.prompt_ids,
        response_ids=sample.response_ids,
        loss_mask=sample.loss_mask,
        rollout_logprobs=sample.rollout_logprobs,
        logprob_mask=sample.logprob_mask,
        reward=sample.reward,
        reward_scale=sample.reward_scale,
        finish_reason=sample.finish_reason,
        source_records=sample.source_records,
        turn_offsets=[
            TurnOffsetRow(record=s.record, start=s.start, sampled_start=s.sampled_start, end=s.end)
            for s in sample.turn_offsets
        ],
        truncated_turns=sample.truncated_turns,
        malformed_tool_calls=sample.malformed_tool_calls,
        sampling=_sampling_row(sample.sampling),
        unreproducible=(
            sample.sampling.value if isinstance(sample.sampling, Unreproducible) else None
        ),
    )


def sample_from_row(row: Any, where: str = "row") -> Sample:
    """A sample from its JSON row, checked (:class:`ExportError` naming ``where``)."""
    if not isinstance(row, dict):
        raise ExportError(f"{where}: expected an object")
    missing = [name for name in _V1_FIELDS if name not in row]
    if missing:
        raise ExportError(f"{where}: missing fields {missing}")
    try:
        sample = Sample(
            trace_id=_str(row["trace_id"]),
            session_id=_str(row["session_id"]),
            group_id=None if row["group_id"] is None else _str(row["group_id"]),
            builder=_str(row["builder"]),
            chain=_int(row["chain"]),
            segment=_int(row["segment"]),
            chain_class=ChainClass(row["chain_class"]),
            break_reason=None if row["break_reason"] is None else BreakReason(row["break_reason"]),
            trainable=_bool(row["trainable"]),
            policy_version=_int(row["policy_version"]),
            prompt_ids=_ints(row["prompt_ids"]),
            response_ids=_ints(row["response_ids"]),
            loss_mask=_ints(row["loss_mask"]),
            rollout_logprobs=tuple(float(v) for v in row["rollout_logprobs"]),
            logprob_mask=_ints(row["logprob_mask"]),
            reward=None if row["reward"] is None else float(row["reward"]),
            reward_scale=float(row["reward_scale"]),
            finish_reason=None
            if row["finish_reason"] is None
            else FinishReason(row["finish_reason"]),
            source_records=tuple(_str(r) for r in row["source_records"]),
            turn_offsets=tuple(
                TurnSpan(
                    _str(s["record"]), _int(s["start"]), _int(s["sampled_start"]), _int(s["end"])
                )
                for s in row["turn_offsets"]
            ),
            truncated_turns=_int(row["truncated_turns"]),
            malformed_tool_calls=_int(row["malformed_tool_calls"]),
            sampling=_sampling(row),
        )
    except (TypeError, ValueError, KeyError) as exc:
        raise ExportError(f"{where}: {exc}") from None
    n = len(sample.response_ids)
    if not (len(sample.loss_mask) == len(sample.rollout_logprobs) == len(sample.logprob_mask) == n):
        raise ExportError(f"{where}: response columns differ in length")
    return sample


def _sampling_row(sampling: Distribution | Unreproducible) -> SamplingRow | None:
    if isinstance(sampling, Unreproducible):
        return None
    return SamplingRow(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
    )


def _sampling(row: dict[str, Any]) -> Distribution | Unreproducible:
    """A row's distribution, or why there is none (version 1 rows: ``unrecorded``)."""
    reason = row.get("unreproducible")
    if reason is not None:
        return Unreproducible(reason)
    if row.get("sampling") is None:
        return Unreproducible.UNRECORDED
    return distribution_from_json(row["sampling"])


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _ints(values: Any) -> tuple[int, ...]:
    if not isinstance(values, list | tuple):
        raise TypeError("expected a list of integers")
    return tuple(_int(v) for v in values)


# ---------------------------------------------------------------- writing


def write_samples(
    samples: Sequence[Sample], path: str | os.PathLike[str], fmt: SampleFormat | None = None
) -> None:
    """Write ``samples`` to ``path`` atomically (the format from the suffix by default)."""
    path = Path(path)
    fmt = fmt or SampleFormat.of(path)
    if not path.parent.is_dir():
        raise ExportError(f"{path}: directory {path.parent} does not exist")
    if path.is_dir():
        raise ExportError(f"{path}: is a directory")
    try:
        with atomic_path(path) as temporary:
            match fmt:
                case SampleFormat.JSONL:
                    _write_jsonl(samples, temporary)
                case SampleFormat.PARQUET:
                    _write_parquet(samples, temporary)
    except OSError as exc:
        raise ExportError(f"{path}: cannot write ({exc.strerror or exc})") from None


def _write_jsonl(samples: Iterable[Sample], path: Path) -> None:
    with path.open("wb") as out:
        for sample in samples:
            row = row_of(sample)
            if not all(map(math.isfinite, sample.rollout_logprobs)):
                raise ExportError(f"{sample.trace_id}: non-finite logprob cannot go to JSON")
            out.write(orjson.dumps(row) + b"\n")


def _arrow_schema() -> Any:
    import pyarrow as pa  # imported on use: it is only needed to read and write Parquet

    span = pa.struct(
        [
            ("record", pa.string()),
            ("start", pa.int32()),
            ("sampled_start", pa.int32()),
            ("end", pa.int32()),
        ]
    )
    return pa.schema(
        [
            ("trace_id", pa.string()),
            ("session_id", pa.string()),
            ("group_id", pa.string()),
            ("builder", pa.string()),
            ("chain", pa.int32()),
            ("segment", pa.int32()),
            ("chain_class", pa.string()),
            ("break_reason", pa.string()),
            ("trainable", pa.bool_()),
            ("policy_version", pa.int64()),
            ("prompt_ids", pa.list_(pa.int32())),
            ("response_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("rollout_logprobs", pa.list_(pa.float64())),
            ("logprob_mask", pa.list_(pa.int8())),
            ("reward", pa.float64()),
            ("reward_scale", pa.float64()),
            ("finish_reason", pa.string()),
            ("source_records", pa.list_(pa.string())),
            ("turn_offsets", pa.list_(span)),
            ("truncated_turns", pa.int32()),
            ("malformed_tool_calls", pa.int32()),
            (
                "sampling",
                pa.struct(
                    [
                        ("temperature", pa.float64()),
                        ("top_p", pa.float64()),
                        ("top_k", pa.int32()),
                        ("min_p", pa.float64()),
                    ]
                ),
            ),
            ("unreproducible", pa.string()),
        ],
        metadata={_VERSION_KEY: str(SCHEMA_VERSION).encode()},
    )


def _write_parquet(samples: Sequence[Sample], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _arrow_schema()
    rows: list[dict[str, Any]] = [dict(row_of(s)) for s in samples]
    columns = {name: [row[name] for row in rows] for name in FIELDS}
    try:
        table = pa.Table.from_pydict(columns, schema=schema)
    except pa.ArrowException as exc:
        raise ExportError(f"samples do not fit the schema ({exc})") from None
    pq.write_table(table, path)


# ---------------------------------------------------------------- reading


def read_samples(path: str | os.PathLike[str], fmt: SampleFormat | None = None) -> list[Sample]:
    """Samples from a file :func:`write_samples` wrote; bad files raise :class:`ExportError`."""
    path = Path(path)
    fmt = fmt or SampleFormat.of(path)
    if not path.is_file():
        raise ExportError(f"{path}: no such file")
    match fmt:
        case SampleFormat.JSONL:
            return _read_jsonl(path)
        case SampleFormat.PARQUET:
            return _read_parquet(path)


def _read_jsonl(path: Path) -> list[Sample]:
    out = []
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ExportError(f"{path}: cannot read ({exc.strerror})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise ExportError(f"{path}:{number}: not valid JSON") from None
        out.append(sample_from_row(row, f"{path}:{number}"))
    return out


def _read_parquet(path: Path) -> list[Sample]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ExportError(f"{path}: not a readable Parquet file ({exc})") from None
    version = (table.schema.metadata or {}).get(_VERSION_KEY)
    if version not in _READABLE_VERSIONS:
        raise ExportError(
            f"{path}: not a Polar sample file of schema version 1 or {SCHEMA_VERSION}"
        )
    missing = [name for name in _V1_FIELDS if name not in table.column_names]
    if missing:
        raise ExportError(f"{path}: missing columns {missing}")
    return [sample_from_row(row, f"{path}: row {i}") for i, row in enumerate(table.to_pylist())]
