"""What SFT generation asks of the rollout service, through the real server and
node: a task id of the client's choosing, every trace (side calls included) on
request, and each sample's conversation as OpenAI chat messages. The agent is a
stand-in (``support.agents``, ``converse``: a title side call, then a tool round
trip replayed the way Qwen Code replays it) run by the ``shell`` harness in a
real sandbox; the model is the scripted engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from polar.rollout.client import RolloutError
from polar.rollout.protocol import HarnessSpec, SessionStatus, TaskSubmission

from support.agents import BASH_TOOL, CONVERSE_SCRIPT, agent_task, shell_harness
from support.rollout import RolloutStack


def submission(tmp_path: Path, **fields: object) -> TaskSubmission:
    return TaskSubmission(
        task=agent_task(tmp_path),
        harness=HarnessSpec(**shell_harness("converse")),
        **fields,  # type: ignore[arg-type]
    )


def test_a_session_returns_every_trace_with_the_conversation_the_model_had(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    stack = make_rollout({"sessions": [CONVERSE_SCRIPT]})
    with stack.client() as client:
        view = client.submit(
            submission(tmp_path, task_id="gen.t1.a0", all_traces=True, conversations=True)
        )
        (result,) = client.wait(view.task_id, timeout_s=120).results
    stack.engine.assert_clean()

    assert view.task_id == "gen.t1.a0"
    assert result.session_id == "gen.t1.a0-s0"
    assert result.status is SessionStatus.COMPLETED, result.error
    classes = [(s["chain_class"], s["trainable"]) for s in result.samples]
    assert sorted(classes) == [("main", True), ("side_call", False)]
    assert [c["trace_id"] for c in result.conversations] == [s["trace_id"] for s in result.samples]
    by_class = {
        s["chain_class"]: c for s, c in zip(result.samples, result.conversations, strict=True)
    }

    main = by_class["main"]
    assert main["problem"] is None
    assert main["tools"] == [BASH_TOOL]
    call_id = main["messages"][2]["tool_calls"][0]["id"]
    assert main["messages"] == [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix the bug."},
        {
            # The model's own turn, not the harness's replay of it: reasoning
            # kept, arguments and whitespace exactly as the model wrote them.
            "role": "assistant",
            "content": "\n\n",
            "reasoning_content": "Look first.\n",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                }
            ],
        },
        {"role": "tool", "content": "fixed", "tool_call_id": call_id},
        {"role": "assistant", "content": "\n\nDone.", "reasoning_content": "It is fixed.\n"},
    ]
    side = by_class["side_call"]
    assert side["tools"] == []
    assert [m["role"] for m in side["messages"]] == ["user", "assistant"]
    assert side["messages"][1]["content"] == "\n\nBug fix"


def test_by_default_a_session_returns_trainable_samples_only_and_a_taken_id_is_refused(
    make_rollout: Callable[..., RolloutStack], tmp_path: Path
) -> None:
    stack = make_rollout({"sessions": [CONVERSE_SCRIPT, CONVERSE_SCRIPT]})
    with stack.client() as client:
        # One session at a time, as a loaded CI machine runs them best.
        view = client.submit(submission(tmp_path))
        assert view.task_id.startswith("t-")
        (result,) = client.wait(view.task_id, timeout_s=120).results
        client.submit(submission(tmp_path, task_id="gen.t1.a0"))
        with pytest.raises(RolloutError, match=r"task gen\.t1\.a0 already exists") as refused:
            client.submit(submission(tmp_path, task_id="gen.t1.a0"))
        assert refused.value.status == 409
        assert sorted(t.task_id for t in client.tasks()) == sorted([view.task_id, "gen.t1.a0"])
        (again,) = client.wait("gen.t1.a0", timeout_s=120).results

    for r in (result, again):
        assert r.status is SessionStatus.COMPLETED, (r.error, r.agent)
        assert [s["chain_class"] for s in r.samples] == ["main"], (r.records, r.accounting)
        assert r.conversations == []
    assert again.session_id == "gen.t1.a0-s0"
    stack.engine.assert_clean()
