"""``polar generate`` end to end: the real CLI in its own process starts the
rollout service in-process (rollout server, gateway node, bubblewrap sandboxes,
the built-in tasks' real pytest evaluators) and runs K attempts per task.

Only the model and the agent are stand-ins (no GPU here, and the agent CLIs
take too long to start for CI): the scripted engine answers each attempt from
its own script (``support.sft.attempt_scripts``: the task's correct patch or
its wrong one), and a minimal tool-calling agent (``support.sft.TOOL_AGENT``,
a title side call, then a chat loop with a ``bash`` tool) drives it.

One uninterrupted run is shared by the tests of this module; the kill test
runs the same generation again, SIGKILLs it mid-run, reruns it, and compares.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from polar.proxy.store.sqlite import SqliteStore
from polar.sft.export import IGNORE, read_rows
from polar.testing.scripted import ScriptedEngine, script_from_dict

from support.paths import REPO
from support.sft import attempt_scripts, tool_agent_command

PLAN = {"fix-median": [True, True], "fix-slugify": [False, True]}
"""Which attempts the scripted model solves: per task, attempt by attempt.
fix-median's second attempt repeats the first one's tokens (a duplicate)."""
ATTEMPTS = 2


def expected_outcomes() -> dict[tuple[str, int], tuple[str, str | None]]:
    """What each attempt must come to, from the script alone: the first right
    attempt of a task is accepted, a later right one repeats its tokens exactly
    (a duplicate), a wrong one fails the tests."""
    out = {}
    for task, right in PLAN.items():
        seen = False
        for k, ok in enumerate(right):
            if not ok:
                out[task, k] = ("tests_failed", None)
            elif seen:
                out[task, k] = ("filtered", "duplicate")
            else:
                out[task, k] = ("accepted", None)
                seen = True
    return out


def generate_argv(engine_url: str, out: Path) -> list[str]:
    config = out.parent / f"{out.name}-service.yaml"
    # The node's id is leased machine-wide: one per output (a resumed run reuses it).
    node_id = f"generate-{hashlib.sha256(str(out).encode()).hexdigest()[:12]}"
    config.write_text(
        yaml.safe_dump({"node": {"node_id": node_id, "gateway": {"capture": "token_in_token_out"}}})
    )
    tasks = [arg for task in PLAN for arg in ("--task", task)]
    return [
        *(sys.executable, "-m", "polar"),
        *("generate", "builtin", *tasks, "--harness", "shell"),
        *("--option", "command=" + tool_agent_command(), "--attempts", str(ATTEMPTS)),
        *("--engine-url", engine_url, "--engine-kind", "vllm", "--engine-model", "scripted"),
        *("--config", str(config), "--out", str(out), "--timeout", "180"),
    ]


class Scripted:
    """A scripted engine serving every attempt of the plan (one per run: a killed
    run leaves its in-flight sessions half-way through their scripts)."""

    def __init__(self, tokenizer: Any) -> None:
        self.engine = ScriptedEngine(script_from_dict(attempt_scripts(PLAN)), tokenizer)

    def __enter__(self) -> ScriptedEngine:
        return self.engine.start()

    def __exit__(self, *exc: object) -> None:
        self.engine.stop()


def run_generate(tokenizer: Any, out: Path) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run the CLI to the end; its output and the engine (stopped), to look at."""
    with Scripted(tokenizer) as engine:
        done = subprocess.run(
            generate_argv(engine.url, out), capture_output=True, text=True, timeout=600, cwd=REPO
        )
    return done, engine


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Path:
    out = tmp_path_factory.mktemp("generate") / "out"
    done, engine = run_generate(tokenizer, out)
    assert done.returncode == 0, done.stdout + done.stderr
    engine.assert_clean()
    assert "overall" in done.stdout and "tokens.parquet: 2 rows" in done.stdout, done.stdout
    return out


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_the_statistics_are_exactly_what_the_script_deserves(generated: Path) -> None:
    expected = expected_outcomes()
    attempts = jsonl(generated / "attempts.jsonl")
    assert {(a["task"], a["attempt"]): (a["outcome"], a["reason"]) for a in attempts} == expected
    assert [(a["task"], a["attempt"]) for a in attempts] == list(expected)

    stats = orjson.loads((generated / "stats.json").read_bytes())
    assert stats["complete"] is True
    assert stats["accept"] == "reward >= 1"

    def tally(outcomes: list[tuple[str, str | None]]) -> dict[str, Any]:
        count = {o: sum(1 for x, _ in outcomes if x == o) for o in ("accepted",)}
        rejected = {
            o: sum(1 for x, _ in outcomes if x == o)
            for o in ("tests_failed", "timeout", "error", "filtered")
        }
        filtered = {
            r: sum(1 for _, x in outcomes if x == r)
            for r in ("no_traces", "too_long", "duplicate", "task_cap")
        }
        return {
            "planned": len(outcomes),
            "attempts": len(outcomes),
            "accepted": count["accepted"],
            "rate": count["accepted"] / len(outcomes),
            "rejected": rejected,
            "filtered": filtered,
        }

    assert stats["tasks"] == [
        {"task": task, **tally([v for (t, _), v in expected.items() if t == task])} for task in PLAN
    ]
    assert stats["overall"] == tally(list(expected.values()))
    assert stats["overall"]["accepted"] == 2
    assert stats["overall"]["rejected"] == {
        "tests_failed": 1,
        "timeout": 0,
        "error": 0,
        "filtered": 1,
    }


def test_labels_are_minus_100_exactly_where_the_model_did_not_sample(generated: Path) -> None:
    """Checked against the gateway's own records of the session (the tokens the
    engine returned, and where each call's prompt ended), not against the builder."""
    sessions = {
        (a["task"], a["attempt"]): a["session_id"] for a in jsonl(generated / "attempts.jsonl")
    }
    rows = read_rows(generated / "tokens.jsonl")
    assert [(r["task"], r["attempt"], r["chain_class"]) for r in rows] == [
        ("fix-median", 0, "main"),
        ("fix-slugify", 1, "main"),
    ]
    store = SqliteStore(generated / "service" / "records.db")
    store.open()
    try:
        for row in rows:
            records = store.records(sessions[row["task"], row["attempt"]])
            # The title call is a side call (no tools): not exported.
            main = [r for r in records if r.original_request.get("tools")]
            assert len(records) == 3 and len(main) == 2
            ids, labels = row["input_ids"], row["labels"]
            assert row["attention_mask"] == [1] * len(ids)
            sampled = [False] * len(ids)
            for record in main:
                start, end = len(record.prompt_ids), len(record.prompt_ids) + len(record.output_ids)
                assert tuple(ids[:start]) == record.prompt_ids
                assert tuple(ids[start:end]) == record.output_ids
                sampled[start:end] = [True] * (end - start)
            assert len(ids) == len(main[-1].prompt_ids) + len(main[-1].output_ids)
            assert labels == [t if s else IGNORE for t, s in zip(ids, sampled, strict=True)]
    finally:
        store.close()


# TRL 1.16 still sets names transformers 5.23 deprecates (gradient_checkpointing).
@pytest.mark.filterwarnings("ignore:`.*` is deprecated and will be removed in v6:FutureWarning")
def test_the_exports_load_in_datasets_and_train_a_step_in_trl(
    generated: Path, tiny_model: Path, tmp_path: Path
) -> None:
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    cache = str(tmp_path / "hf-cache")
    loaded = {}
    for kind in ("tokens", "chat"):
        for builder, suffix in (("json", "jsonl"), ("parquet", "parquet")):
            path = generated / f"{kind}.{suffix}"
            dataset = datasets.load_dataset(
                builder, data_files=str(path), split="train", cache_dir=cache
            )
            assert dataset.to_list() == read_rows(path), path
            loaded[kind, suffix] = dataset
    assert loaded["tokens", "jsonl"].to_list() == loaded["tokens", "parquet"].to_list()
    assert loaded["chat", "jsonl"].to_list() == loaded["chat", "parquet"].to_list()
    chat = loaded["chat", "parquet"][0]
    assert [m["role"] for m in chat["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert chat["messages"][2]["reasoning_content"] == "Apply the fix.\n"
    assert orjson.loads(chat["tools"])[0]["function"]["name"] == "bash"

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))

    def trainer(kind: str, model: Any) -> Any:
        return SFTTrainer(
            model=model,
            processing_class=tokenizer,
            train_dataset=loaded[kind, "parquet"],
            args=SFTConfig(
                output_dir=str(tmp_path / f"trl-{kind}"),
                max_steps=1,
                per_device_train_batch_size=1,  # one row: 152k-wide logits are slow on CPU
                learning_rate=1e-3,
                report_to=[],
                save_strategy="no",
                use_cpu=True,
                dataset_num_proc=None,
                max_length=None,
            ),
        )

    # The chat export as TRL prepares it: messages through the model's chat
    # template, with the tools and the reasoning where the template puts them.
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    rendered = tokenizer.decode(trainer("chat", model).train_dataset[0]["input_ids"])
    assert rendered.startswith("<|im_start|>system\nYou fix code with the bash tool.")
    assert '<tools>\n{"type": "function", "function": {"name": "bash"' in rendered
    assert "<think>\nApply the fix.\n</think>" in rendered
    assert '<tool_call>\n{"name": "bash", "arguments": {"command": "git apply' in rendered

    # One real step on the token export; TRL trains on our labels as they are.
    before = model.model.norm.weight.detach().clone()
    tokens = trainer("tokens", model)
    batch = tokens.data_collator([tokens.train_dataset[0]])
    assert batch["labels"][0].tolist() == loaded["tokens", "parquet"][0]["labels"]
    result = tokens.train()
    assert result.global_step == 1
    assert result.training_loss > 0
    assert not model.model.norm.weight.detach().equal(before), "the step changed the weights"


def done_attempts(journal: Path) -> int:
    try:
        with sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5) as db:
            return int(
                db.execute("SELECT COUNT(*) FROM attempts WHERE state = 'done'").fetchone()[0]
            )
    except sqlite3.Error:
        return 0


def test_a_run_killed_mid_way_and_rerun_ends_as_an_uninterrupted_one(
    generated: Path, tokenizer: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    total = sum(len(v) for v in PLAN.values())
    with Scripted(tokenizer) as engine:
        process = subprocess.Popen(
            generate_argv(engine.url, out),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=REPO,
        )
        try:
            deadline = time.monotonic() + 300
            while done_attempts(out / "journal.sqlite") < 1:
                assert process.poll() is None, "the generator ended before it was killed"
                assert time.monotonic() < deadline, "no attempt finished in 300 s"
                time.sleep(0.2)
        finally:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
        first = engine.assignments
    acknowledged = done_attempts(out / "journal.sqlite")
    assert 1 <= acknowledged < total, f"killed after {acknowledged} of {total} attempts"

    with sqlite3.connect(out / "journal.sqlite") as db:
        finished = {
            f"sft.{task}.a{k}-s0"
            for task, k in db.execute("SELECT task, attempt FROM attempts WHERE state = 'done'")
        }
    assert finished <= set(first)

    done, engine = run_generate(tokenizer, out)
    assert done.returncode == 0, done.stdout + done.stderr
    engine.assert_clean(finished=False)
    # What was acknowledged is not run again; everything else is.
    every = {f"sft.{task}.a{k}-s0" for task, right in PLAN.items() for k in range(len(right))}
    assert set(engine.assignments) == every - finished
    with sqlite3.connect(out / "journal.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 2

    for name in ("stats.json", "attempts.jsonl", "tokens.jsonl", "chat.jsonl"):
        assert (out / name).read_bytes() == (generated / name).read_bytes(), name
    for name in ("tokens.parquet", "chat.parquet"):
        assert read_rows(out / name) == read_rows(generated / name), name


def test_polar_sft_fine_tunes_on_the_token_export(
    generated: Path, tiny_model: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from polar.cli import app

    out = tmp_path / "sft"
    args = [str(generated), "--model", str(tiny_model), "--out", str(out)]
    args += ["--max-steps", "2", "--batch-size", "1", "--lr", "1e-3", "--device", "cpu"]
    result = CliRunner().invoke(app, ["sft", *args])
    assert result.exit_code == 0, result.output
    assert "trained 2 steps on 2 rows" in result.stdout

    labelled = sorted(
        sum(1 for x in r["labels"] if x != IGNORE) for r in read_rows(generated / "tokens.parquet")
    )
    log = jsonl(out / "loss.jsonl")
    assert [e["step"] for e in log] == [0, 1]
    assert sorted(e["tokens"] for e in log) == labelled  # one row per step: each trained on once
    assert all(e["loss"] > 0 and e["learning_rate"] == 1e-3 for e in log)
    report = orjson.loads((out / "polar-sft.json").read_bytes())["report"]
    assert (report["steps"], report["rows"], report["tokens"]) == (2, 2, sum(labelled))

    start = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    tuned = AutoModelForCausalLM.from_pretrained(str(out))
    changed = [
        name
        for (name, a), (_, b) in zip(
            start.named_parameters(), tuned.named_parameters(), strict=True
        )
        if not torch.equal(a, b)
    ]
    assert changed, "training changed no weight"
    assert (out / "tokenizer.json").is_file()
