"""The reference trainer and its evaluation treat failed sessions by the one
policy of ``polar.rollout.failure``, through ``train`` itself.

A real rollout server whose node is canned (``support.canned``) ends every
group the same way: a session scored 1.0, one the agent timed out in (its
partial trajectory kept, no score), one whose engine failed after a call (a
trace, but not the agent's doing) and one whose preparation failed (no trace).
The trainer steps the tiny model once on it, pushes the weights through a real
gateway's pause/resume to an engine that loads them (the scripted engine on
SGLang's wire), and evaluates before and after.

What must hold: the timed-out session trains with reward 0.0 (its tokens are in
the loss, its advantage is the group's only negative one), the two others are
masked (their tokens are not in the loss; they are counted, not rewarded);
evaluation counts the timeout as 0.0 and unsolved, and the others not at all;
its greedy pass runs one session a task.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.testing.scripted import ScriptedEngine, script_from_dict
from polar.train.config import TrainConfig
from polar.train.trainer import train

from support.canned import (
    GROUP_TASK,
    SCORED_IDS,
    TIMED_OUT_IDS,
    CannedRollouts,
    mixed,
    task_file,
)
from support.rollout import CONTROL_TOKEN
from support.stack import ADMIN_TOKEN


@pytest.fixture
def canned(tmp_path: Path) -> Iterator[CannedRollouts]:
    rollouts = CannedRollouts(tmp_path / "rollout", mixed)
    yield rollouts
    rollouts.close()


@pytest.fixture
def sglang(tokenizer: Any) -> Iterator[ScriptedEngine]:
    """An engine that loads pushed weights (the scripted engine on SGLang's wire)."""
    engine = ScriptedEngine(
        script_from_dict({"turns": [{"text": "hi"}]}), tokenizer, wire="sglang"
    ).start()
    yield engine
    engine.stop()


def test_a_timeout_trains_with_reward_zero_and_infrastructure_failures_are_masked(
    tmp_path: Path,
    tiny_model: Path,
    canned: CannedRollouts,
    make_stack: Any,
    sglang: ScriptedEngine,
) -> None:
    gateway = make_stack({"turns": [{"text": "x"}]})
    tasks = str(task_file(tmp_path / "tasks", [GROUP_TASK]))
    config = TrainConfig.model_validate(
        {
            "model": str(tiny_model),
            "output_dir": str(tmp_path / "run"),
            "steps": 1,
            "rollout": {
                "server_url": canned.url,
                "control_token": CONTROL_TOKEN,
                "tasks": tasks,
                "harness": {"name": "shell", "options": {"command": "true"}},
                "group_size": 4,
                "groups_per_step": 1,
                "max_inflight_groups": 1,
                "shuffle": False,
                "group_timeout_s": 120,
            },
            "weight_sync": {
                "gateways": [{"url": gateway.url, "admin_token": ADMIN_TOKEN}],
                "engines": [{"kind": "sglang", "url": sglang.url}],
                "drain_timeout_s": 30,
            },
            "grpo": {"baseline": "mean", "scale_by_std": False},
            "eval": {"tasks": tasks, "group_size": 4, "greedy": True},
            "optim": {"lr": 1e-3},
            "log": {"progress": False, "tensorboard": False},
            "checkpoint": {"every": 0},
        }
    )
    result = train(config)

    (metrics,) = result.history
    # The group's rewards are 1.0 and the timeout's 0.0; the masked sessions have none.
    assert metrics["reward/mean"] == pytest.approx(0.5)
    assert metrics["groups/zero_advantage_fraction"] == 0
    # The loss holds the scored and the timed-out tokens, not the engine failure's.
    assert metrics["trainer/loss_tokens"] == len(SCORED_IDS) + len(TIMED_OUT_IDS)
    assert metrics["trainer/grad_norm"] > 0
    assert result.counters["sessions/agent_failed_total"] == 1
    assert result.counters["sessions/masked_total"] == 2

    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evaluations = [line for line in lines if "eval/reward_mean" in line]
    assert [e["step"] for e in evaluations] == [0, 1]
    for e in evaluations:
        assert e["eval/sessions"] == 4
        assert e["eval/counted"] == 2 and e["eval/agent_failed"] == 1 and e["eval/masked"] == 2
        assert e["eval/reward_mean"] == pytest.approx(0.5)  # (1.0 + 0.0) / 2
        assert e["eval/solved_fraction"] == pytest.approx(0.5)
        # greedy: one session a task (its first sample: scored 1.0)
        assert e["eval_greedy/sessions"] == e["eval_greedy/counted"] == 1
        assert e["eval_greedy/solved_fraction"] == 1.0
