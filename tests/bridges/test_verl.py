"""verl 0.9.1 (installed by ``scripts/setup --verl`` in its own virtualenv,
``.cache/venv-verl``: verl pins transformers < 5.11) runs Polar's agent loop
for real: verl's own ``AgentLoopWorker.generate_sequences``
(``verl/experimental/agent_loop/agent_loop.py``) instantiates
``polar.bridges.verl.PolarAgentLoop`` from an agent-loop config file, awaits
its ``run`` per sample, pads and stacks the outputs into the ``DataProto``
verl's PPO/GRPO trainer consumes (``support/verl_worker.py``, run by the verl
virtualenv's Python against this test's Polar stack over HTTP).

Not exercised: verl's LLM server manager (the Polar loop does not call it;
Polar's gateway serves the agent) and its Ray actors (the worker is built
directly, as each Ray actor builds it).

The batch's prompts, responses, ``response_mask``, ``rollout_log_probs`` and
``rm_scores`` are compared, token for token, with the gateway's records.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.bridges import (
    BETWEEN,
    FIRST_CALL,
    INSTRUCTIONS,
    LOGPROBS,
    PROMPT,
    SECOND_CALL,
    BridgeStack,
    expected_from_records,
    session_missing_a_logprob,
)
from support.canned import PROMPT as CANNED_PROMPT
from support.canned import SCORED_IDS, TIMED_OUT_IDS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
VERL_PYTHON = REPO / ".cache" / "venv-verl" / "bin" / "python"
WORKER = REPO / "tests" / "support" / "verl_worker.py"
OUTPUT = REPO / "tests" / "support" / "verl_output.py"
PROMPT_LENGTH = 256
RESPONSE_LENGTH = 256


def verl_python() -> Path:
    if not VERL_PYTHON.exists():
        pytest.fail(f"{VERL_PYTHON} is missing: run scripts/setup --verl (scripts/check does)")
    return VERL_PYTHON


def run_in_verl(script: Path, request: Path) -> None:
    done = subprocess.run(
        [str(verl_python()), str(script), str(request)],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-6000:])
        pytest.fail(f"{script.name} exited {done.returncode}: {done.stderr.strip()[-300:]}")


def run_verl(model: Path, bridge: dict[str, Any], root: Path, prompts: list[Any]) -> dict[str, Any]:
    request = root / "request.json"
    request.write_text(
        json.dumps(
            {
                "model": str(model),
                "bridge": bridge,
                "prompts": prompts,
                "prompt_length": PROMPT_LENGTH,
                "response_length": RESPONSE_LENGTH,
            }
        )
    )
    run_in_verl(WORKER, request)
    result: dict[str, Any] = json.loads((root / "batch.json").read_text())
    return result


def test_verl_agent_loop_batch_equals_polar_records(stack: BridgeStack, tmp_path: Path) -> None:
    prompts = [
        [{"role": "user", "content": INSTRUCTIONS["rename-b"]}],
        [{"role": "user", "content": INSTRUCTIONS["rename-b"]}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "add-test"}],
    ]
    batch = run_verl(stack.model_dir, stack.config(), tmp_path, prompts)
    t, extra = batch["tensors"], batch["non_tensors"]

    assert len(t["prompts"]) == 3
    assert all(len(row) == PROMPT_LENGTH for row in t["prompts"])
    assert all(len(row) == RESPONSE_LENGTH for row in t["responses"])
    sessions = extra["polar_session"]
    assert len(set(sessions)) == 3 and all(extra["polar_usable"])
    rewards = stack.session_rewards(extra["polar_task"])
    for i, session_id in enumerate(sessions):
        e = expected_from_records(stack.records(session_id))
        attention = t["attention_mask"][i]
        prompt_keep = attention[:PROMPT_LENGTH]
        response_keep = attention[PROMPT_LENGTH:]
        prompt = [x for x, a in zip(t["prompts"][i], prompt_keep, strict=True) if a]
        n = sum(response_keep)
        assert prompt_keep == [0] * (PROMPT_LENGTH - len(prompt)) + [1] * len(prompt)
        assert response_keep == [1] * n + [0] * (RESPONSE_LENGTH - n)
        assert prompt == e.prompt_ids
        assert t["responses"][i][:n] == e.completion_ids
        assert t["response_mask"][i][:n] == e.mask and not any(t["response_mask"][i][n:])
        assert 0 in e.mask  # two calls: the environment's tokens between them are masked out
        assert t["input_ids"][i] == t["prompts"][i] + t["responses"][i]
        for value, polar, m in zip(t["rollout_log_probs"][i][:n], e.logprobs, e.mask, strict=True):
            if m:
                assert value == pytest.approx(polar, abs=1e-6)  # verl stores float32
        # verl puts the score on the last response token.
        scores = t["rm_scores"][i]
        assert scores[n - 1] == pytest.approx(rewards[session_id])
        assert sum(abs(s) for j, s in enumerate(scores) if j != n - 1) == 0
        assert extra["__num_turns__"][i] == 4


def test_a_timeout_trains_with_reward_zero_and_infrastructure_failures_are_masked(
    canned_config: dict[str, Any], tiny_model: Path, tmp_path: Path
) -> None:
    """One sample per task of ``support.canned.mixed``: scored 1.0, timed out after its
    calls, the engine failed after a call, preparation failed."""
    tasks = ["ok", "slow", "broken", "unprepared"]
    batch = run_verl(
        tiny_model, canned_config, tmp_path, [[{"role": "user", "content": t}] for t in tasks]
    )
    t, extra = batch["tensors"], batch["non_tensors"]
    assert extra["polar_use"] == ["scored", "failed", "masked", "masked"]
    assert extra["polar_failure"] == [None, "timeout", "engine", "preparation"]
    assert extra["polar_usable"] == [True, True, False, False]

    def response(i: int) -> tuple[list[int], list[int], list[float]]:
        n = sum(t["attention_mask"][i][PROMPT_LENGTH:])
        return t["responses"][i][:n], t["response_mask"][i][:n], t["rm_scores"][i][:n]

    ok, slow = response(0), response(1)
    assert t["prompts"][0][-len(CANNED_PROMPT) :] == list(CANNED_PROMPT)
    assert ok == (list(SCORED_IDS), [1, 1, 1], [0.0, 0.0, 1.0])
    # The agent's failure: its partial trace under the mask, scored 0.0.
    assert slow == (list(TIMED_OUT_IDS), [1, 1], [0.0, 0.0])
    # Not the agent's: one end-of-sequence token, masked out.
    for i in (2, 3):
        ids, mask, scores = response(i)
        assert len(ids) == 1 and mask == [0] and scores == [0.0]


def test_a_sampled_token_without_a_logprob_is_masked_out_for_verl(tmp_path: Path) -> None:
    """verl has no "missing" logprob (its rollout correction, and its bypass mode's
    old logprobs, read ``rollout_log_probs`` under ``response_mask``): the token
    is masked out and counted. Built by Polar's bridge in verl's interpreter,
    validated by verl's ``AgentLoopOutput``."""
    request = tmp_path / "request.json"
    request.write_text(
        json.dumps(
            {
                "session": session_missing_a_logprob().model_dump(mode="json"),
                "prompt_length": PROMPT_LENGTH,
                "response_length": RESPONSE_LENGTH,
                "end_token": 0,
            }
        )
    )
    run_in_verl(OUTPUT, request)
    output = json.loads((tmp_path / "output.json").read_text())
    assert output["prompt_ids"] == list(PROMPT)
    assert output["response_ids"] == [*FIRST_CALL, *BETWEEN, *SECOND_CALL]
    assert output["response_mask"] == [1, 0, 0, 1, 1]
    assert output["response_logprobs"] == [LOGPROBS[10], 0.0, 0.0, LOGPROBS[12], LOGPROBS[13]]
    assert output["extra_fields"]["polar_missing_logprobs"] == 1
