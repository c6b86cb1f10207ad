"""``polar build`` against a real record store, as a user runs it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from polar.cli import app
from polar.ir import CompletionRecord
from polar.ir.codec import record_from_json
from polar.proxy.store import SqliteStore
from polar.proxy.store.sqlite import SessionRow
from polar.trajectory import ChainClass, read_samples

from support.paths import FIXTURES

RECORDS = FIXTURES / "sessions" / "opencode.token_in_token_out.jsonl"


def fixture_records() -> list[CompletionRecord]:
    if not RECORDS.exists():
        pytest.skip("no opencode recording")
    return [record_from_json(orjson.loads(line)) for line in RECORDS.read_bytes().splitlines()]


def make_store(path: Path, records: Sequence[CompletionRecord], **metadata: object) -> str:
    session_id = records[0].session_id
    store = SqliteStore(path)
    store.open()

    async def fill() -> None:
        await store.insert_session(
            SessionRow(session_id, f"hash-{session_id}", 0.0, None, dict(metadata), 0)
        )
        for record in records:
            await store.append(record)

    try:
        asyncio.run(fill())
    finally:
        store.close()
    return session_id


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, str, list[CompletionRecord]]:
    records = fixture_records()
    path = tmp_path / "records.db"
    return path, make_store(path, records, group_id="task-7"), records


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["build", *args])
    return result.exit_code, result.stdout, result.stderr


def test_build_writes_parquet_samples_and_reports_where_tokens_went(
    store: tuple[Path, str, list[CompletionRecord]], tmp_path: Path
) -> None:
    db, session, records = store
    out = tmp_path / "samples.parquet"
    code, stdout, stderr = run(session, "--store", str(db), "-o", str(out), "--reward", "1.5")
    assert code == 0, stderr
    samples = read_samples(out)
    (sample,) = samples  # the title call is a side call: not written by default
    assert sample.chain_class is ChainClass.MAIN and sample.trainable
    assert (sample.group_id, sample.reward, sample.policy_version) == ("task-7", 1.5, 0)
    last = records[-1]
    assert sample.prompt_ids + sample.response_ids == last.prompt_ids + last.output_ids
    title = len(records[0].output_ids)
    captured = sum(len(r.output_ids) for r in records)
    assert f"delivered {captured - title} of {captured} generated tokens" in stdout
    assert f"quarantined class_not_trained: {title}" in stdout
    assert f"wrote 1 samples to {out}" in stdout
    assert "prompts: extends 1, fresh 2" in stdout
    # Recorded before records kept their sampling settings: a trainer cannot use them.
    trained = sum(sample.loss_mask)
    assert f"not trainable, sampling distribution unreproducible (unrecorded): {trained}" in stdout


def test_build_writes_jsonl_per_request_with_every_trace(
    store: tuple[Path, str, list[CompletionRecord]], tmp_path: Path
) -> None:
    db, session, records = store
    out = tmp_path / "samples.jsonl"
    args = ["--builder", "per_request", "--all-traces", "-o", str(out)]  # jsonl from the name
    code, _, stderr = run(session, "--store", str(db), *args)
    assert code == 0, stderr
    samples = read_samples(out)
    assert [s.source_records for s in samples] == [(r.key,) for r in records]
    assert [s.trainable for s in samples] == [False, True, True]
    assert all(s.reward is None for s in samples)


def test_build_writes_under_runs_by_default(
    store: tuple[Path, str, list[CompletionRecord]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, session, _ = store
    monkeypatch.chdir(tmp_path)
    code, _, stderr = run(session, "--store", str(db))
    assert code == 0, stderr
    assert read_samples(tmp_path / "runs" / "trajectories" / f"{session}.prefix_merge.parquet")


def test_build_as_a_process(
    store: tuple[Path, str, list[CompletionRecord]], tmp_path: Path
) -> None:
    db, session, _ = store
    out = tmp_path / "samples.parquet"
    result = subprocess.run(
        [sys.executable, "-m", "polar", "build", session, "--store", str(db), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert len(read_samples(out)) == 1


def test_bad_input_is_a_one_line_error_and_writes_nothing(
    store: tuple[Path, str, list[CompletionRecord]], tmp_path: Path
) -> None:
    db, session, _ = store
    out = tmp_path / "samples.parquet"
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a sqlite file" * 100)
    rules = tmp_path / "classes.yaml"
    rules.write_text("policies: {boss: {trainable: true}}\n")
    cases = [
        (["ses_missing", "--store", str(db)], 1, "no session 'ses_missing'"),
        ([session, "--store", str(tmp_path / "none.db")], 1, "no record store here"),
        ([session, "--store", str(corrupt)], 1, "cannot read"),
        ([session, "--store", str(db), "--builder", "prefix_merging"], 2, "unknown builder"),
        ([session, "--store", str(db), "--classes", str(rules)], 2, "'boss' is not one of"),
        ([session, "--store", str(db), "--tokenizer", str(tmp_path)], 2, "tokenizer"),
        ([session, "--store", str(db), "-o", str(tmp_path / "no" / "x.parquet")], 1, "does not"),
        ([session, "--store", str(db), "-f", "jsonl", "-o", str(out)], 2, "conflicts"),
    ]

    def files() -> list[Path]:
        # SQLite's own -wal/-shm companions of the store may appear on reading.
        return sorted(p for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm")))

    before = files()
    for args, expected_code, message in cases:
        code, stdout, stderr = run(*args, *(["-o", str(out)] if "-o" not in args else []))
        assert code == expected_code, (args, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("polar build: error: "), stderr
        assert message in lines[0], lines[0]
        assert not stdout
    assert files() == before


def test_a_session_with_no_sample_to_write_writes_no_file(
    store: tuple[Path, str, list[CompletionRecord]], tmp_path: Path
) -> None:
    db, session, _ = store
    classes = tmp_path / "classes.yaml"
    classes.write_text("policies:\n  main: {trainable: false}\n")  # nothing trained
    out = tmp_path / "samples.parquet"
    args = [session, "--store", str(db), "--classes", str(classes), "-o", str(out)]
    code, stdout, stderr = run(*args)
    assert code == 0, stderr
    assert "(0 trainable); no sample to write, no file written" in stdout.splitlines()[0]
    assert not out.exists()
    code, stdout, _ = run(*args, "--all-traces")
    assert code == 0 and f"wrote 2 samples to {out}" in stdout
    assert len(read_samples(str(out))) == 2  # a str path reads as a Path does


def test_class_policies_come_from_a_yaml_file(
    store: tuple[Path, str, list[CompletionRecord]], tmp_path: Path
) -> None:
    db, session, _ = store
    classes = tmp_path / "classes.yaml"
    classes.write_text("policies:\n  side_call: {trainable: true, reward_scale: 0.5}\n")
    out = tmp_path / "samples.parquet"
    code, stdout, stderr = run(
        session, "--store", str(db), "--classes", str(classes), "--reward", "2", "-o", str(out)
    )
    assert code == 0, stderr
    title, agent = read_samples(out)
    assert (title.chain_class, title.trainable, title.reward) == (ChainClass.SIDE_CALL, True, 1.0)
    assert agent.reward == 2.0
    assert "(100.0%)" in stdout
