"""Polar's NeMo Gym agent server against NeMo Gym's contract, from its source.

NeMo Gym needs Python >= 3.12 and does not install here (Python 3.11), so this
test follows NeMo Gym 0.5.1 (NVIDIA-NeMo/Gym at 07d6b0d) without importing it:

- ``nemo_gym/base_resources_server.py``: ``BaseRunRequest``
  (``responses_create_params``) and ``BaseVerifyResponse`` (the request, plus
  ``response`` and ``reward: float``);
- ``nemo_gym/openai_utils.py``: ``NeMoGymResponse`` is the OpenAI SDK's
  ``Response`` (validated here with the installed ``openai`` package's own
  model: openai 3.54, newer and stricter than the ``openai<=2.7.2`` NeMo Gym
  pins, e.g. it requires ``usage.input_tokens_details.cache_write_tokens``),
  and training output items add ``TokenIDLogProbMixin``
  (``prompt_token_ids: List[int]``, ``generation_token_ids: List[int]``,
  ``generation_log_probs: List[float]``), rebuilt as :class:`TokenIds`;
- ``nemo_gym/token_id_capture/builder.py``: how a trainer turns a rollout's
  calls into one sequence (each prompt's tokens past the previous prompt and
  generation are environment tokens, mask 0; generations mask 1)
  (:func:`trainer_sequence`).

Polar's side is real: the server over HTTP, the rollout server, a gateway
node, agent processes in the sandbox, the embedded engine; the sequence a
trainer rebuilds from the output items is compared with the gateway's records.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.responses import Response
from pydantic import BaseModel, ConfigDict

from polar.bridges.config import TraceChoice
from polar.bridges.nemo_gym import NemoGymBridgeConfig, create_app, main, verify_response
from polar.bridges.rollouts import session_sample
from polar.serverthread import ServerThread

from support.bridges import (
    BETWEEN,
    FIRST_CALL,
    INSTRUCTIONS,
    LOGPROBS,
    PROMPT,
    SECOND_CALL,
    BridgeStack,
    Expected,
    expected_from_records,
    session_missing_a_logprob,
)
from support.canned import SCORED_IDS, TIMED_OUT_IDS

pytestmark = pytest.mark.slow


class TokenIds(BaseModel):
    """NeMo Gym's ``TokenIDLogProbMixin`` (strict: ids are ints, logprobs floats)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]


class VerifyResponse(BaseModel):
    """NeMo Gym's ``BaseVerifyResponse``."""

    model_config = ConfigDict(extra="allow")
    responses_create_params: dict[str, Any]
    response: Response
    reward: float


def trainer_sequence(items: list[TokenIds]) -> Expected:
    """The rollout as one sequence, the way NeMo Gym's prefix_merging chains calls."""
    prompt = list(items[0].prompt_token_ids)
    seen = list(prompt)
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float | None] = []
    for item in items:
        assert item.prompt_token_ids[: len(seen)] == seen, "items do not chain"
        interstitial = item.prompt_token_ids[len(seen) :]
        completion += [*interstitial, *item.generation_token_ids]
        mask += [0] * len(interstitial) + [1] * len(item.generation_token_ids)
        logprobs += [None] * len(interstitial) + list(item.generation_log_probs)
        seen = [*item.prompt_token_ids, *item.generation_token_ids]
    return Expected(prompt, completion, mask, logprobs, [])


@pytest.fixture
def server(stack: BridgeStack) -> Any:
    app = create_app(NemoGymBridgeConfig.model_validate(stack.config()))
    thread = ServerThread(app).start()
    yield thread.url
    thread.stop()


def test_run_answers_nemo_gym_verify_responses_with_polar_ids(
    stack: BridgeStack, server: str
) -> None:
    rows = [
        {
            "responses_create_params": {
                "input": [{"role": "user", "content": INSTRUCTIONS["rename-a"]}],
                "model": "policy",
            },
            "expected_answer": "alpha",
        },
        {
            "responses_create_params": {
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "add-test"}]}]
            }
        },
        {"responses_create_params": {"input": "anything"}, "polar_task": "fix-typo"},
    ]
    with httpx.Client(timeout=300) as http, ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(lambda row: http.post(f"{server}/run", json=row), rows))
    assert [r.status_code for r in replies] == [200, 200, 200], [r.text for r in replies]
    bodies = [VerifyResponse.model_validate(r.json()) for r in replies]
    assert bodies[0].model_extra is not None
    assert bodies[0].model_extra["expected_answer"] == "alpha"  # the row is echoed
    assert bodies[0].response.model == "policy"

    tasks = [b.response.metadata["polar_task"] for b in bodies if b.response.metadata]
    rewards = stack.session_rewards(tasks)
    for body in bodies:
        assert body.response.metadata is not None
        session_id = body.response.metadata["polar_session"]
        raw = body.response.model_dump()["output"]
        assert [item["type"] for item in raw] == ["message", "message"]  # one per model call
        items = [TokenIds.model_validate(item) for item in raw]
        for item in items:
            assert len(item.generation_log_probs) == len(item.generation_token_ids) > 0
        got = trainer_sequence(items)
        e = expected_from_records(stack.records(session_id))
        assert got.prompt_ids == e.prompt_ids
        assert got.completion_ids == e.completion_ids
        assert got.mask == e.mask and 0 in e.mask
        assert got.logprobs == e.logprobs
        assert body.reward == rewards[session_id]
        assert body.model_extra is not None and body.model_extra["polar_usable"] is True


def test_a_timeout_trains_with_reward_zero_and_infrastructure_failures_are_masked(
    canned_config: dict[str, Any],
) -> None:
    """One row per task of ``support.canned.mixed``: scored 1.0, timed out after its
    calls, the engine failed after a call, preparation failed."""
    app = create_app(NemoGymBridgeConfig.model_validate(canned_config))
    tasks = ["ok", "slow", "broken", "unprepared"]
    with ServerThread(app) as thread, httpx.Client(timeout=60) as http:
        replies = [
            http.post(
                f"{thread.url}/run",
                json={"responses_create_params": {"input": "x"}, "polar_task": task},
            )
            for task in tasks
        ]
    assert [r.status_code for r in replies] == [200] * 4, [r.text for r in replies]
    ok, slow, broken, unprepared = (VerifyResponse.model_validate(r.json()) for r in replies)

    def generated(body: VerifyResponse) -> list[list[int]]:
        raw = body.response.model_dump()["output"]
        return [TokenIds.model_validate(item).generation_token_ids for item in raw]

    def extra(body: VerifyResponse) -> dict[str, Any]:
        assert body.model_extra is not None
        return body.model_extra

    assert (ok.reward, ok.response.status, generated(ok)) == (1.0, "completed", [list(SCORED_IDS)])
    # The agent's failure: its partial trace, trained with reward 0.0.
    assert (slow.reward, slow.response.status) == (0.0, "incomplete")
    assert generated(slow) == [list(TIMED_OUT_IDS)] and extra(slow)["polar_usable"] is True
    assert slow.response.metadata is not None
    assert slow.response.metadata["polar_failure"] == "timeout"
    # Not the agent's: nothing to train (no output item), the placeholder reward 0.0.
    for body, failure in ((broken, "engine"), (unprepared, "preparation")):
        assert (body.reward, body.response.status, generated(body)) == (0.0, "failed", [])
        assert extra(body)["polar_usable"] is False
        assert body.response.metadata is not None
        assert body.response.metadata["polar_failure"] == failure
        assert body.response.metadata["polar_use"] == "masked"


def test_run_refuses_bad_rows_in_one_line(server: str) -> None:
    with httpx.Client(timeout=30) as http:
        not_json = http.post(f"{server}/run", content=b"{nope")
        assert not_json.status_code == 400
        assert not_json.json()["error"]["message"] == "the body is not valid JSON"
        missing = http.post(f"{server}/run", json={"input": "rename-a"})
        assert missing.status_code == 422
        assert "responses_create_params" in missing.json()["error"]["message"]
        unknown = http.post(f"{server}/run", json={"responses_create_params": {"input": "zz"}})
        assert unknown.status_code == 422
        assert unknown.json()["error"]["message"] == "no task has the id or instruction 'zz'"
        assert http.get(f"{server}/nope").status_code == 404


def test_main_refuses_a_bad_config_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as missing:
        main([str(tmp_path / "nope.yaml")])
    assert missing.value.code == 2
    assert capsys.readouterr().err.strip().endswith("nope.yaml: no such file")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks: builtin\nharness: {name: shell}\nport: 99999\n")
    with pytest.raises(SystemExit) as invalid:
        main([str(bad)])
    assert invalid.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "port" in err and "\n" not in err


def test_a_sampled_token_without_a_logprob_reaches_nemo_rl_as_an_environment_token() -> None:
    """NeMo RL trains every generation token against its logprob and has no
    "missing": the call is cut around the token, which the next item's prompt
    carries (mask 0 when NeMo Gym chains the items)."""
    session = session_sample(session_missing_a_logprob(), "g", TraceChoice.MAIN)
    row = {"responses_create_params": {"input": "t"}}
    body = VerifyResponse.model_validate(verify_response(row, session, "policy"))
    items = [TokenIds.model_validate(i) for i in body.response.model_dump()["output"]]
    assert [i.generation_token_ids for i in items] == [[10], list(SECOND_CALL)]
    assert [i.generation_log_probs for i in items] == [[LOGPROBS[10]], [LOGPROBS[12], LOGPROBS[13]]]
    got = trainer_sequence(items)
    assert got.prompt_ids == list(PROMPT)
    assert got.completion_ids == [*FIRST_CALL, *BETWEEN, *SECOND_CALL]
    assert got.mask == [1, 0, 0, 1, 1]
    assert got.logprobs == [LOGPROBS[10], None, None, LOGPROBS[12], LOGPROBS[13]]
    assert body.model_extra is not None and body.model_extra["polar_missing_logprobs"] == 1
