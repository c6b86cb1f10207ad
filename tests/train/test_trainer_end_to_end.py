"""GRPO steps through the whole stack on this CPU.

Real parts only: the embedded engine serving the default tiny model, a gateway
node in token-in/token-out mode (sessions in bubblewrap sandboxes, the
``shell`` harness running a small agent program that talks to the gateway
over HTTP), the rollout server, the trainer with weight pushes through the
gateway's pause/drain. The tasks' reward is a random number the agent writes
(``support.training.TALKER``): the test is about the loop, not about learning.

The sequence is steered with the trainer's hooks so that every claim is
deterministic (groups of 2 sessions, one group per step, two generating):

- The gateway starts at v0; the trainer's weights are pushed at start as v1.
- G1 (``quick``) and G2 (``slow-a``: talks until told to stop) start at v1;
  G1 trains step 1 while G3 (``slow-b``) starts generating.
- Before push v2 a call is in flight (G2 keeps talking): the push drains it.
  After it G2 is told to stop: it makes one more call, at v2, and ends.
- Step 2 gets G2 first: its oldest tokens are v1, one version behind with
  ``max_staleness: 0``: dropped and counted. G4 (``quick-2``, all v2) trains step 2.
- Push v3 drains G3's call in flight; G3 is then stopped and ends at v3.

A second run is steered through a skipped push (see its docstring).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from polar.cli import app
from polar.ir import RecordStatus
from polar.proxy.store import SqliteStore
from polar.rollout.protocol import TaskStatus
from polar.train.config import TrainConfig
from polar.train.trainer import Hooks, train
from polar.train.weightsync import PushReport

from support.logprobs import sequence_logprobs
from support.rollout import CONTROL_TOKEN, RolloutStack
from support.training import (
    TALKER_HARNESS,
    EmbeddedEngine,
    GatedEngine,
    greedy_next,
    talker_task,
)
from support.waiting import wait_until

FIXED_TEXT = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.slow
def test_two_asynchronous_grpo_steps_end_to_end(
    tmp_path: Path, tokenizer: Any, tiny_model: Path, embedded_engine: EmbeddedEngine
) -> None:
    tasks = [
        talker_task(tmp_path, "quick", "quick"),
        talker_task(tmp_path, "slow-a", "slow"),
        talker_task(tmp_path, "slow-b", "slow"),
        talker_task(tmp_path, "quick-2", "quick"),
    ]
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
    admin = httpx.Client(
        base_url=gateway_url, headers={"authorization": f"Bearer {CONTROL_TOKEN}"}, timeout=30
    )
    client = stack.client()
    fixed = list(tokenizer.encode(FIXED_TEXT, add_special_tokens=False))
    _, logprob_before = greedy_next(embedded_engine.url, fixed)

    def sessions_of(task: str) -> list[str]:
        (view,) = [v for v in client.tasks() if v.task == task]
        return [s.session_id for s in view.sessions]

    def stop_and_wait(task: str) -> None:
        for session in sessions_of(task):
            (stack.root / "sessions" / session / "workspace" / "stop").touch()
        wait_until(
            lambda: all(v.status is TaskStatus.COMPLETED for v in client.tasks() if v.task == task),
            timeout_s=120,
            what=f"{task} to finish",
        )

    push_started: list[float] = []
    reports: list[PushReport] = []

    def before_push(version: int) -> None:
        wait_until(
            lambda: admin.get("/admin/status").json()["inflight"] >= 1,
            timeout_s=120,
            what="a call in flight before the push",
        )
        push_started.append(time.time())

    def after_push(report: PushReport) -> None:
        reports.append(report)
        stop_and_wait("slow-a" if len(reports) == 1 else "slow-b")

    config = TrainConfig.model_validate(
        {
            "model": str(tiny_model),
            "output_dir": str(tmp_path / "run"),
            "steps": 2,
            "rollout": {
                "server_url": stack.url,
                "control_token": CONTROL_TOKEN,
                "tasks": str(task_file),
                "harness": TALKER_HARNESS,
                "group_size": 2,
                "groups_per_step": 1,
                "max_inflight_groups": 2,
                "max_staleness": 0,
                "shuffle": False,
                "session_timeout_s": 300,
                "group_timeout_s": 600,
            },
            "weight_sync": {
                "gateways": [{"url": gateway_url, "admin_token": CONTROL_TOKEN}],
                "engines": [{"kind": "embedded", "url": embedded_engine.url}],
                "drain_timeout_s": 120,
            },
            "optim": {"lr": 1e-3},
            "log": {"progress": False},
            "checkpoint": {"every": 0},
        }
    )
    try:
        result = train(config, Hooks(before_push=before_push, after_push=after_push))
        views = sorted(client.tasks(), key=lambda v: v.created_at)
        (slow_a_result,) = [client.wait(v.task_id, 5) for v in views if v.task == "slow-a"]
    finally:
        admin.close()
        client.close()
        stack.close()

    # Two steps, two pushes after the one at start: the policy version went 1 -> 3.
    assert (result.steps, result.policy_version) == (2, 3)
    assert [r.version for r in reports] == [2, 3]

    # No call was aborted by a push: each push drained a call in flight, and every
    # call of the groups that ran to the end completed.
    assert all(r.drained_calls >= 1 for r in reports), reports
    store = SqliteStore(stack.root / "records.db")
    # G1..G4 in submission order; G5 (quick again, submitted last) was cancelled at the end
    groups = views[:4]
    assert [v.task for v in groups] == ["quick", "slow-a", "slow-b", "quick-2"]
    records: dict[str, list[Any]] = {}
    for view in groups:
        records.setdefault(view.task, []).extend(
            r for s in view.sessions for r in store.records(s.session_id)
        )
    everything = [r for rs in records.values() for r in rs]
    assert everything and all(r.status is RecordStatus.COMPLETED for r in everything)
    # calls in flight when a push began finished later, on the old weights
    for version, began in enumerate(push_started, start=1):
        assert any(
            r.policy_version == version and r.timings.finished and r.timings.finished > began
            for r in everything
        ), f"no call of version {version} finished after push v{version + 1} began"

    # The new version is stamped on later records.
    slow_a = {r.policy_version for r in records["slow-a"]}
    slow_b = {r.policy_version for r in records["slow-b"]}
    assert slow_a == {1, 2}
    assert {2, 3} <= slow_b and max(slow_b) == 3
    assert {r.policy_version for r in records["quick"]} == {1}  # G1
    assert {r.policy_version for r in records["quick-2"]} == {2}  # G4

    # The stale group was dropped and counted; G1 and G4 trained.
    assert result.counters["groups/stale_dropped_total"] == 1
    assert len(result.history) == 2
    for metrics in result.history:
        assert metrics["groups/trained"] == 1
        assert metrics["staleness/max"] == 0
        assert metrics["trainer/loss_tokens"] > 0
        assert metrics["groups/zero_advantage_fraction"] == 0 and metrics["reward/std"] > 0
        assert metrics["trainer/grad_norm"] > 0
        assert metrics["push/drained_calls"] >= 1
        # trained on its own samples: the trainer recomputes the engine's logprobs
        assert metrics["mismatch_onpolicy/tokens"] == metrics["mismatch/tokens"] > 0
        assert metrics["mismatch_onpolicy/mean_abs"] < 1e-3
        assert metrics["mismatch_onpolicy/kl"] < 1e-5
        assert 0 <= metrics["clip_fraction"] <= 1

    # The dropped sessions ran across push v2: prefix_merge split each per policy version.
    dropped = [{sample["policy_version"] for sample in r.samples} for r in slow_a_result.results]
    assert dropped == [{1, 2}, {1, 2}], dropped

    # The engine now answers with the trained weights: the fixed prompt's logprob
    # changed and equals the trainer's for the final weights.
    final = AutoModelForCausalLM.from_pretrained(str(result.checkpoint / "model"))
    token_after, logprob_after = greedy_next(embedded_engine.url, fixed)
    assert logprob_after != pytest.approx(logprob_before, abs=1e-6)
    (trainer_logprob,) = sequence_logprobs(final, [*fixed, token_after], len(fixed))
    assert logprob_after == pytest.approx(trainer_logprob, abs=1e-4)

    # Metrics went to JSONL and TensorBoard.
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert lines[-1]["policy_version"] == 3
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    for name in (
        "reward/mean",
        "reward/std",
        "groups/zero_advantage_fraction",
        "clip_fraction",
        "ratio/mean",
        "tis/mean",
        "mismatch/kl",
        "trainer/tokens_per_s",
        "staleness/mean",
        "groups/stale_dropped_total",
    ):
        assert name in scalars, name


@pytest.mark.slow
def test_a_run_survives_a_skipped_push_and_says_what_it_cannot_do(
    tmp_path: Path,
    tokenizer: Any,
    tiny_model: Path,
    embedded_engine: EmbeddedEngine,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two steps (one group of 2 per step, one generating), steered with the hooks:

    - The gateway starts at v0; the trainer's weights are pushed at start as v1,
      a number no gateway served. G1 (``same``) samples at v1.
    - G1's sessions both score 1: step 1 has nothing to learn from and says so.
    - Push v2: a call of the test's own session is held in front of the engine,
      so the drain times out on both tries; the push is skipped and the run goes
      on, the gateway still at v1. The held call then completes.
    - Before step 2 takes a group, v2 is pushed again and lands; G2 (``random``)
      trains. Push v3 lands: the engine serves the final weights.
    - Run again, the finished run says there is nothing left to do.
    """
    tasks = [
        talker_task(tmp_path, "same", "quick", reward=1.0),
        talker_task(tmp_path, "random", "quick"),
    ]
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    gate = GatedEngine(embedded_engine.url)
    stack = RolloutStack(
        tmp_path / "stack",
        tokenizer,
        None,
        engine={"kind": "embedded", "base_url": gate.url, "model": "tiny"},
        node={"model": "tiny"},
    )
    gateway_url = stack.node_thread.gateway_url
    admin = httpx.Client(
        base_url=gateway_url, headers={"authorization": f"Bearer {CONTROL_TOKEN}"}, timeout=30
    )
    client = stack.client()
    side = admin.post("/admin/sessions", json={"metadata": {}}).json()
    held_tokens = 7  # the talker asks for 10: only the test's own call is held
    held_replies: list[httpx.Response] = []

    def held_call() -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        held_replies.append(
            httpx.post(
                f"{gateway_url}/v1/chat/completions",
                json={**body, "max_tokens": held_tokens},
                headers={"authorization": f"Bearer {side['api_key']}"},
                timeout=120,
            )
        )

    caller = threading.Thread(target=held_call)
    pushes: list[int] = []
    reports: list[PushReport] = []
    served_after_skip: list[int] = []

    def before_push(version: int) -> None:
        pushes.append(version)
        if len(pushes) == 1:  # push v2: a call in flight that does not drain
            gate.close_gate(
                lambda body: isinstance(body, dict) and body.get("max_tokens") == held_tokens
            )
            caller.start()
            wait_until(lambda: gate.held == 1, timeout_s=60, what="the call held at the gate")

    def on_step(step: int, metrics: dict[str, float]) -> None:
        if step == 1:
            served_after_skip.append(admin.get("/admin/status").json()["policy_version"])
            gate.open_gate()
            caller.join(60)

    config = TrainConfig.model_validate(
        {
            "model": str(tiny_model),
            "output_dir": str(tmp_path / "run"),
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
                "drain_timeout_s": 3,  # the held call never drains; the talker's do
                "push_retries": 1,
                "retry_backoff_s": 0.1,
            },
            "optim": {"lr": 1e-3},
            "log": {"progress": False, "tensorboard": False},
            "checkpoint": {"every": 0},
        }
    )
    try:
        result = train(
            config,
            Hooks(before_push=before_push, after_push=reports.append, on_step=on_step),
        )
        views = sorted(client.tasks(), key=lambda v: v.created_at)
        store = SqliteStore(stack.root / "records.db")
        versions = [
            {r.policy_version for s in view.sessions for r in store.records(s.session_id)}
            for view in views[:2]
        ]
        side_versions = [r.policy_version for r in store.records(side["session_id"])]
        fixed = list(tokenizer.encode(FIXED_TEXT, add_special_tokens=False))
        token, logprob = greedy_next(embedded_engine.url, fixed)
    finally:
        gate.open_gate()
        admin.close()
        client.close()
        stack.close()
        gate.close()
    console = capsys.readouterr().out

    # v1 at start; v2 skipped, then pushed before step 2 took a group; v3 after step 2.
    assert (result.steps, result.policy_version) == (2, 3)
    assert pushes == [2, 2, 3] and [r.version for r in reports] == [2, 3]
    assert result.counters["push/skipped_total"] == 1
    assert "weight push v2: gateway at" in console and "retrying in 0.1s" in console
    assert "weight push v2 skipped: " in console and "(2 tries)" in console
    first, second = result.history
    assert (first["push/skipped"], first["push/served_version"]) == (1, 1)
    assert (second["push/skipped"], second["push/served_version"]) == (0, 3)
    # Truthful versions: the gateway kept v1 through the skip; the held call ran on it
    # to the end; no record names v0 (the gateway's number before the start push).
    assert served_after_skip == [1]
    assert held_replies[0].status_code == 200 and side_versions == [1]
    assert [view.task for view in views[:2]] == ["same", "random"]
    assert versions[0] == {1} and versions[1] and versions[1] <= {1, 2}

    # Step 1 had nothing to learn from, and said so; step 2 learned from G2.
    assert first["groups/nothing_to_learn"] == 1 and first["trainer/grad_norm"] == 0
    assert result.counters["steps/nothing_to_learn_total"] == 1
    assert "step 1: nothing to learn from: every group's sessions have equal rewards" in console
    assert second["groups/nothing_to_learn"] == 0 and second["trainer/grad_norm"] > 0

    # The push that landed carried the current weights: the engine serves the final model.
    assert result.checkpoint is not None
    final = AutoModelForCausalLM.from_pretrained(str(result.checkpoint / "model"))
    (trainer_logprob,) = sequence_logprobs(final, [*fixed, token], len(fixed))
    assert logprob == pytest.approx(trainer_logprob, abs=1e-4)

    # Run again (the stack is gone: nothing is reached), from Python and from the CLI.
    again = train(config)
    assert again.note is not None and again.note.startswith("nothing left to do: checkpoint")
    assert (again.steps, again.policy_version, again.checkpoint) == (2, 3, result.checkpoint)
    config_file = tmp_path / "train.yaml"
    config_file.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    cli = CliRunner().invoke(app, ["train", str(config_file)])
    assert cli.exit_code == 0, cli.output
    assert cli.output.strip() == again.note
