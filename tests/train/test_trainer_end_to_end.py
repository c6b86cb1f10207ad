"""Two asynchronous GRPO steps through the whole stack on this CPU.

Real parts only: the embedded engine serving the default tiny model, a gateway
node in token-in/token-out mode (sessions in bubblewrap sandboxes, the
``shell`` harness running a small agent program that talks to the gateway
over HTTP), the rollout server, the trainer with weight pushes through the
gateway's pause/drain. The tasks' reward is a random number the agent writes
(``support.training.TALKER``): the test is about the loop, not about learning.

The sequence is steered with the trainer's hooks so that every claim is
deterministic (groups of 2 sessions, one group per step, two generating):

- G1 (``quick``) and G2 (``slow-a``: talks until told to stop) start at v0;
  G1 trains step 1 while G3 (``slow-b``) starts generating.
- Before push 1 a call is in flight (G2 keeps talking): the push drains it.
  After push 1 G2 is told to stop: it makes one more call, at v1, and ends.
- Step 2 gets G2 first: its oldest tokens are v0, one version behind with
  ``max_staleness: 0``: dropped and counted. G4 (``quick-2``, all v1) trains step 2.
- Push 2 drains G3's call in flight; G3 is then stopped and ends at v2.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoModelForCausalLM

from polar.ir import RecordStatus
from polar.proxy.store import SqliteStore
from polar.rollout.protocol import TaskStatus
from polar.train.config import TrainConfig
from polar.train.logprobs import sequence_logprobs
from polar.train.trainer import Hooks, train
from polar.train.weightsync import PushReport

from support.rollout import CONTROL_TOKEN, RolloutStack
from support.training import TALKER_HARNESS, EmbeddedEngine, greedy_next, talker_task
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

    # Two steps, two pushes: the policy version went 0 -> 2.
    assert (result.steps, result.policy_version) == (2, 2)
    assert [r.version for r in reports] == [1, 2]

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
    for version, began in enumerate(push_started):
        assert any(
            r.policy_version == version and r.timings.finished and r.timings.finished > began
            for r in everything
        ), f"no call of version {version} finished after push {version + 1} began"

    # The new version is stamped on later records.
    slow_a = {r.policy_version for r in records["slow-a"]}
    slow_b = {r.policy_version for r in records["slow-b"]}
    assert slow_a == {0, 1}
    assert {1, 2} <= slow_b and max(slow_b) == 2
    assert {r.policy_version for r in records["quick"]} == {0}  # G1
    assert {r.policy_version for r in records["quick-2"]} == {1}  # G4

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

    # The dropped sessions ran across push 1: prefix_merge split each per policy version.
    dropped = [{sample["policy_version"] for sample in r.samples} for r in slow_a_result.results]
    assert dropped == [{0, 1}, {0, 1}], dropped

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
    assert lines[-1]["policy_version"] == 2
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
