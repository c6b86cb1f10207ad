"""Trainer samples written to Parquet and JSONL, and read back unchanged."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from polar.ir import CaptureMode
from polar.proxy.render.template import ChatTemplate
from polar.trajectory import (
    BuildConfig,
    ChainClass,
    ExportError,
    PrefixMerge,
    Sample,
    SampleFormat,
    Trajectory,
    TurnFormat,
    read_samples,
    samples_of,
    write_samples,
)
from polar.trajectory import export as export_module
from polar.trajectory.export import FIELDS

from support.sessions import MAIN_SYSTEM, TITLE_SYSTEM, Session, Turn

BASH = {"command": "ls"}


@pytest.fixture(scope="module")
def trajectory(tokenizer: Any) -> Trajectory:
    session = Session(ChatTemplate(tokenizer), CaptureMode.TOKEN_IN_TOKEN_OUT)
    title = session.conversation("title", ChainClass.SIDE_CALL, TITLE_SYSTEM, "Fix.", tools=False)
    session.call(title, Turn(text="Fixing"))
    main = session.conversation("main", ChainClass.MAIN, MAIN_SYSTEM, "Fix the failing test.")
    session.call(main, Turn(reasoning="Look.", text="(1)", calls=(BASH,)), logprobs="nan")
    session.call(main, Turn(text="(2)", cut=3))
    session.policy_version = 1
    session.call(main, Turn(text="(3) Done."))
    config = BuildConfig(turns=TurnFormat.from_tokenizer(tokenizer))
    return PrefixMerge(config).build(session.records, group_id="task-1").with_reward(0.25)


@pytest.mark.parametrize("fmt", list(SampleFormat))
def test_samples_round_trip_exactly(trajectory: Trajectory, tmp_path: Path, fmt: Any) -> None:
    samples = samples_of(trajectory, include_untrainable=True)
    assert [s.chain_class for s in samples] == [
        ChainClass.SIDE_CALL,
        ChainClass.MAIN,
        ChainClass.MAIN,
    ]
    path = tmp_path / f"samples.{fmt.value}"
    write_samples(samples, path)
    assert read_samples(path) == samples
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_sample_carries_what_a_trainer_needs(trajectory: Trajectory) -> None:
    first, second = samples_of(trajectory)
    trace = trajectory.trainable[0]
    assert first == Sample(
        trace_id=trace.id,
        session_id=trajectory.session_id,
        group_id="task-1",
        builder="prefix_merge",
        chain=trace.chain,
        segment=0,
        chain_class=ChainClass.MAIN,
        break_reason=None,
        trainable=True,
        policy_version=0,
        prompt_ids=trace.prompt_ids,
        response_ids=trace.response_ids,
        loss_mask=trace.loss_mask,
        rollout_logprobs=trace.response_logprobs,
        logprob_mask=trace.logprob_mask,
        reward=0.25,
        reward_scale=1.0,
        finish_reason=trace.finish_reason,
        source_records=trace.records,
        turn_offsets=trace.turns,
        truncated_turns=1,
        malformed_tool_calls=0,
    )
    assert 0 in first.logprob_mask[: trace.turns[0].end]  # the NaN logprob, masked
    assert second.break_reason is not None and second.policy_version == 1


def test_the_parquet_schema_is_the_documented_one(trajectory: Trajectory, tmp_path: Path) -> None:
    path = tmp_path / "samples.parquet"
    write_samples(samples_of(trajectory), path)
    schema = pq.read_schema(path)
    assert tuple(schema.names) == FIELDS
    assert schema.field("response_ids").type == pa.list_(pa.int32())
    assert schema.field("loss_mask").type == pa.list_(pa.int8())
    assert schema.field("rollout_logprobs").type == pa.list_(pa.float64())
    assert schema.metadata[b"polar.samples.version"] == b"2"
    documented = re.findall(r"^- ``(\w+)``(?:, ``(\w+)``)?", export_module.__doc__ or "", re.M)
    assert [name for pair in documented for name in pair if name] == list(FIELDS)


def test_jsonl_rows_are_plain_json(trajectory: Trajectory, tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    write_samples(samples_of(trajectory), path)
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert list(rows[0]) == list(FIELDS)
    assert rows[0]["chain_class"] == "main" and rows[0]["turn_offsets"][0]["start"] == 0


def test_an_unwritable_path_fails_cleanly(trajectory: Trajectory, tmp_path: Path) -> None:
    samples = samples_of(trajectory)
    with pytest.raises(ExportError, match="does not exist"):
        write_samples(samples, tmp_path / "missing" / "samples.parquet")
    with pytest.raises(ExportError, match=r"use \.parquet or \.jsonl"):
        write_samples(samples, tmp_path / "samples.csv")
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(ExportError, match="is a directory"):
        write_samples(samples, tmp_path / "dir.jsonl")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_a_failed_write_is_an_export_error(trajectory: Trajectory) -> None:
    # /proc exists and is a directory, and nobody (root included) can create files in it.
    with pytest.raises(ExportError, match="cannot write"):
        write_samples(samples_of(trajectory), Path("/proc/samples.jsonl"))


def test_bad_files_are_refused_with_their_place(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(b'{"trace_id": "x"}\nnot json\n')
    with pytest.raises(ExportError, match=r"broken.jsonl:1: missing fields"):
        read_samples(broken)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 but not really")
    with pytest.raises(ExportError, match="not a readable Parquet file"):
        read_samples(garbage)
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"a": [1]}), foreign)
    with pytest.raises(ExportError, match="not a Polar sample file"):
        read_samples(foreign)
    with pytest.raises(ExportError, match="no such file"):
        read_samples(tmp_path / "absent.parquet")
