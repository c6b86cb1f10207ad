"""LoRA (``lora:`` in the training config, peft): only the adapters train, a push
writes only them, the embedded engine merges them in place, checkpoints hold
them, and the merged export serves what the trainer computed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from test_step import on_policy_rows
from test_trainer_end_to_end import FIXED_TEXT

from polar.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, AdapterError, read_adapter
from polar.ir import RecordStatus
from polar.precision import Precision, load_master
from polar.proxy.engines.embedded import ModelRunner
from polar.proxy.store import SqliteStore
from polar.train.checkpoint import TrainState, save_checkpoint
from polar.train.config import LoraSettings, TrainConfig
from polar.train.lora import export_merged
from polar.train.policy import PolicySettings, load_policy, prepare, trainable
from polar.train.step import LossSettings, StepSettings, train_step
from polar.train.trainer import Hooks, train
from polar.train.weights import SHARED_MEMORY, push_directory, save_weights, weights_path
from polar.train.weightsync import PushReport

from support.logprobs import sequence_logprobs
from support.rollout import CONTROL_TOKEN, RolloutStack
from support.training import TALKER_HARNESS, EmbeddedEngine, greedy_next, talker_task

LORA = LoraSettings(r=8, alpha=16)
CPU = PolicySettings(
    device=torch.device("cpu"), precision=Precision.FLOAT32, micro_batch_tokens=4096, lora=LORA
)
PROBE = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198, 40, 1079]


def adapted(tiny_model: Path) -> Any:
    return prepare(load_master(tiny_model), CPU)


def step(model: Any, rows: Any, lr: float = 1e-2) -> dict[str, float]:
    optimizer = torch.optim.AdamW(trainable(model), lr=lr)
    return train_step(
        model,
        optimizer,
        rows,
        loss=LossSettings(),
        settings=StepSettings(pad_id=0),
        policy_version=0,
    )


def engine_logprobs(runner: ModelRunner, ids: list[int], start: int) -> list[float]:
    return sequence_logprobs(runner.model, ids, start)


def test_only_the_adapters_train(tiny_model: Path, tokenizer: Any) -> None:
    model = adapted(tiny_model)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    before = sequence_logprobs(model, PROBE, 5)
    metrics = step(model, on_policy_rows(model, tokenizer))
    assert metrics["trainer/grad_norm"] > 0
    for name, parameter in model.named_parameters():
        if name in frozen:
            assert torch.equal(parameter, frozen[name]), name
    assert sequence_logprobs(model, PROBE, 5) != pytest.approx(before, abs=1e-6)


def test_a_push_writes_only_the_adapters_and_the_engine_merges_them_in_place(
    tiny_model: Path, tokenizer: Any, tmp_path: Path
) -> None:
    model = adapted(tiny_model)
    rows = on_policy_rows(model, tokenizer)
    runner = ModelRunner(tiny_model, max_batch=1)
    try:
        base = engine_logprobs(runner, PROBE, 5)
        pushed = []
        for version in (1, 2):
            step(model, rows)
            path = save_weights(model, tmp_path / "weights", version)
            assert sorted(p.name for p in path.iterdir()) == [
                "README.md",
                ADAPTER_CONFIG,
                ADAPTER_WEIGHTS,
            ]
            full = sum(p.numel() for p in model.parameters()) * 4
            assert (path / ADAPTER_WEIGHTS).stat().st_size < full / 20
            runner.load_weights(path, policy_version=version)
            served = engine_logprobs(runner, PROBE, 5)
            # merged into the engine's weights, the adapters give the trainer's logprobs
            assert served == pytest.approx(sequence_logprobs(model, PROBE, 5), abs=1e-5)
            pushed.append(served)
        assert runner.policy_version == 2 and runner.adapters.current is not None
        assert pushed[0] != pytest.approx(base, abs=1e-4)
        assert pushed[1] != pytest.approx(pushed[0], abs=1e-5)
        # version 2 was merged into the base weights, not into version 1's
        fresh = ModelRunner(tiny_model, max_batch=1)
        try:
            fresh.load_weights(tmp_path / "weights" / "v2")
            assert engine_logprobs(fresh, PROBE, 5) == pytest.approx(pushed[1], abs=1e-6)
        finally:
            fresh.close()
        # full weights replace the base and drop the merged adapters
        runner.load_weights(tiny_model / "model.safetensors")
        assert runner.adapters.current is None
        assert engine_logprobs(runner, PROBE, 5) == pytest.approx(base, abs=1e-6)
    finally:
        runner.close()


def test_a_checkpoint_holds_the_adapters_and_resumes_from_them(
    tiny_model: Path, tokenizer: Any, tmp_path: Path
) -> None:
    model = adapted(tiny_model)
    step(model, on_policy_rows(model, tokenizer))
    optimizer = torch.optim.AdamW(trainable(model))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: 1.0)
    path = save_checkpoint(
        tmp_path, TrainState(step=1), model, optimizer, scheduler, tokenizer_dir=tiny_model, keep=1
    )
    saved = path / "model"
    assert (saved / ADAPTER_CONFIG).is_file() and not (saved / "model.safetensors").exists()
    resumed = load_policy(tiny_model, CPU, adapters=saved)
    assert {n for n, p in resumed.named_parameters() if p.requires_grad} == {
        n for n, p in model.named_parameters() if p.requires_grad
    }
    assert sequence_logprobs(resumed, PROBE, 5) == pytest.approx(
        sequence_logprobs(model, PROBE, 5), abs=1e-6
    )


def test_the_merged_export_is_a_plain_model_with_the_trainers_logprobs(
    tiny_model: Path, tokenizer: Any, tmp_path: Path
) -> None:
    model = adapted(tiny_model)
    step(model, on_policy_rows(model, tokenizer))
    expected = sequence_logprobs(model, PROBE, 5)
    out = export_merged(model, tmp_path / "merged", tokenizer_dir=tiny_model)
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    merged = load_master(out)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    assert sequence_logprobs(merged, PROBE, 5) == pytest.approx(expected, abs=1e-5)


def test_an_adapter_beyond_plain_lora_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / ADAPTER_CONFIG).write_text(
        '{"peft_type": "LORA", "r": 8, "lora_alpha": 16, "use_dora": true}'
    )
    with pytest.raises(AdapterError, match=r"plain LoRA only, not \['use_dora'\]"):
        read_adapter(tmp_path)


@pytest.mark.slow
def test_two_lora_grpo_steps_push_only_adapters_to_the_embedded_engine(
    tmp_path: Path, tokenizer: Any, tiny_model: Path, embedded_engine: EmbeddedEngine
) -> None:
    """The whole stack of ``test_trainer_end_to_end`` (embedded engine, token-mode
    gateway node, rollout server, talker sessions in sandboxes) with ``lora:``:
    the push at start (v1: fresh adapters, the base model's logprobs) and one
    after each step (v2, v3) carry only adapters, written to shared memory; the
    engine merges each in place and names its version; every record names the
    version of the adapters that sampled it."""
    tasks = [talker_task(tmp_path, f"quick-{i}", "quick") for i in (1, 2)]
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    stack = RolloutStack(
        tmp_path / "stack",
        tokenizer,
        None,
        engine={"kind": "embedded", "base_url": embedded_engine.url, "model": "tiny"},
        node={"model": "tiny"},
    )
    gateway_url = stack.node_thread.gateway_url
    client = stack.client()
    fixed = list(tokenizer.encode(FIXED_TEXT, add_special_tokens=False))
    out = tmp_path / "run"
    pushed_to = push_directory(None, out, [embedded_engine.url])
    seen: list[dict[str, Any]] = []

    def after_push(report: PushReport) -> None:
        path = weights_path(pushed_to, report.version)
        engine = httpx.get(f"{embedded_engine.url}/weights").json()
        seen.append(
            {
                "version": report.version,
                "files": sorted(p.name for p in path.iterdir()),
                "engine": engine,
                "logprob": greedy_next(embedded_engine.url, fixed)[1],
            }
        )

    _, base_logprob = greedy_next(embedded_engine.url, fixed)
    config = TrainConfig.model_validate(
        {
            "model": str(tiny_model),
            "output_dir": str(out),
            "steps": 2,
            "rollout": {
                "server_url": stack.url,
                "control_token": CONTROL_TOKEN,
                "tasks": str(task_file),
                "harness": TALKER_HARNESS,
                "group_size": 2,
                "groups_per_step": 1,
                "max_inflight_groups": 1,
                "max_staleness": 1,
                "shuffle": False,
                "session_timeout_s": 300,
                "group_timeout_s": 600,
            },
            "weight_sync": {
                "gateways": [{"url": gateway_url, "admin_token": CONTROL_TOKEN}],
                "engines": [{"kind": "embedded", "url": embedded_engine.url}],
                "drain_timeout_s": 120,
            },
            "optim": {"lr": 1e-2},
            "lora": {"r": 8, "alpha": 16, "export_merged": True},
            "log": {"progress": False, "tensorboard": False},
            "checkpoint": {"every": 0},
        }
    )
    try:
        result = train(config, Hooks(after_push=after_push))
        store = SqliteStore(stack.root / "records.db")
        records = [
            r for view in client.tasks() for s in view.sessions for r in store.records(s.session_id)
        ]
        token, final_logprob = greedy_next(embedded_engine.url, fixed)
    finally:
        client.close()
        stack.close()

    # v1 at start, v2 and v3 after the two steps: each push carried only adapters
    assert (result.steps, result.policy_version) == (2, 3)
    assert [s["version"] for s in seen] == [2, 3]  # after_push: the steps' pushes
    for push in seen:
        assert push["files"] == ["README.md", ADAPTER_CONFIG, ADAPTER_WEIGHTS]
        assert push["engine"]["policy_version"] == push["version"]
        assert push["engine"]["adapter"]["source"] == str(weights_path(pushed_to, push["version"]))
        assert push["engine"]["adapter"]["rank"] == 8
    assert pushed_to.parent == SHARED_MEMORY and not pushed_to.exists()  # given back at the end
    # the engine's logprobs moved with each adapter version
    assert seen[0]["logprob"] != pytest.approx(base_logprob, abs=1e-6)
    assert seen[1]["logprob"] != pytest.approx(seen[0]["logprob"], abs=1e-6)
    for metrics in result.history:
        assert metrics["trainer/grad_norm"] > 0
        assert metrics["mismatch_onpolicy/mean_abs"] < 1e-3

    # every record names the adapter version that sampled it (v1 fresh, v2 after step 1)
    assert records and {r.policy_version for r in records} <= {1, 2}
    assert all(r.status is RecordStatus.COMPLETED for r in records)

    # the checkpoint holds adapters; base + them, and the merged export, give the engine's logprob
    assert result.checkpoint is not None
    assert (result.checkpoint / "model" / ADAPTER_CONFIG).is_file()
    trained = load_policy(tiny_model, CPU, adapters=result.checkpoint / "model")
    (trainer_logprob,) = sequence_logprobs(trained, [*fixed, token], len(fixed))
    assert final_logprob == pytest.approx(trainer_logprob, abs=1e-4)
    assert result.merged is not None
    (merged_logprob,) = sequence_logprobs(load_master(result.merged), [*fixed, token], len(fixed))
    assert merged_logprob == pytest.approx(trainer_logprob, abs=1e-5)
