"""The ``harbor`` evaluator on task directories made here: ``tests/test.sh``
writing ``/logs/verifier/reward.txt`` or ``reward.json``, in a real sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.reward import EvalResult, EvaluatorError, evaluate
from polar.tasks import Task, load_harbor

from support.workspaces import Sessions, agent, exists, shell, with_sessions, write_tree

REWARD_TXT = """\
#!/bin/bash
mkdir -p /logs/verifier
echo "checking answer.txt"
if [ "$(cat answer.txt 2>/dev/null)" = 42 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""

REWARD_JSON = """\
#!/bin/bash
mkdir -p /logs/verifier
correct=0
[ "$(cat answer.txt 2>/dev/null)" = 42 ] && correct=1
style=$( [ -f NOTES.md ] && echo 1 || echo 0.5 )
printf '{"correct": %s, "style": %s}' "$correct" "$style" > /logs/verifier/reward.json
"""


def harbor_task(tmp_path: Path, test_sh: str, toml: str | None = None) -> Task:
    files = {
        "instruction.md": "Write the answer, 42, into answer.txt.\n",
        "environment/README.md": "The answer goes into answer.txt.\n",
        "tests/test.sh": test_sh,
    }
    if toml is not None:
        files["task.toml"] = toml
    return load_harbor(write_tree(tmp_path / "answer-task", files))


def run(tmp_path: Path, task: Task, script: str | None = None) -> EvalResult:
    async def scenario(sessions: Sessions) -> EvalResult:
        runtime = await sessions.start(task)
        if script is not None:
            await agent(runtime, task, script)
        return await evaluate(sessions.context(task, runtime))

    return with_sessions(tmp_path / "sessions", scenario)


@pytest.mark.parametrize(("answer", "reward"), [(None, 0.0), ("41", 0.0), ("42", 1.0)])
def test_reward_txt_is_the_reward(tmp_path: Path, answer: str | None, reward: float) -> None:
    task = harbor_task(tmp_path, REWARD_TXT)

    result = run(tmp_path, task, None if answer is None else f"echo {answer} > answer.txt")

    assert (result.reward, result.resolved) == (reward, reward == 1.0)
    assert result.details == {
        "runtime": "live",
        "hardening": "baseline",
        "restored": [],
        "removed": [],
        "verifier_exit_code": 0,
        "verifier_timed_out": False,
        "reward_source": "reward.txt",
    }
    assert "checking answer.txt" in result.log


@pytest.mark.parametrize(
    ("script", "reward"),
    [("echo 42 > answer.txt", 0.75), ("echo 42 > answer.txt; touch NOTES.md", 1.0), (None, 0.25)],
)
def test_reward_json_is_the_mean_of_its_values(
    tmp_path: Path, script: str | None, reward: float
) -> None:
    result = run(tmp_path, harbor_task(tmp_path, REWARD_JSON), script)

    assert result.reward == pytest.approx(reward)
    assert result.resolved is (reward == 1.0)
    assert result.details["reward_source"] == "reward.json"


def test_the_verifier_and_its_logs_appear_only_for_scoring(tmp_path: Path) -> None:
    task = harbor_task(tmp_path, REWARD_TXT)

    async def scenario(sessions: Sessions) -> EvalResult:
        runtime = await sessions.start(task)
        # The agent sees empty /tests and /logs, and cannot pre-empt the verifier:
        # what it leaves there is cleared before the real test.sh runs.
        assert await shell(runtime, "ls -A /tests /logs") == "/logs:\n\n/tests:\n"
        await agent(
            runtime,
            task,
            "printf '#!/bin/bash\\nexit 0\\n' > /tests/test.sh && "
            "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt",
        )
        result = await evaluate(sessions.context(task, runtime))
        assert await exists(runtime, "/tests/test.sh")
        assert await shell(runtime, "cat /logs/verifier/reward.txt") == "0\n"
        return result

    result = with_sessions(tmp_path / "sessions", scenario)

    assert (result.reward, result.resolved) == (0.0, False)


def test_a_verifier_that_writes_no_reward_scores_zero(tmp_path: Path) -> None:
    result = run(tmp_path, harbor_task(tmp_path, "#!/bin/bash\necho tests failed\nexit 1\n"))

    assert (result.reward, result.resolved) == (0.0, False)
    assert result.details["reason"] == "the verifier wrote no reward file"
    assert result.details["verifier_exit_code"] == 1


def test_a_verifier_that_runs_past_its_timeout_scores_zero(tmp_path: Path) -> None:
    task = harbor_task(tmp_path, "#!/bin/bash\nsleep 60\n", toml="[verifier]\ntimeout_sec = 1\n")

    result = run(tmp_path, task)

    assert (result.reward, result.resolved) == (0.0, False)
    assert result.details["timed_out"] is True
    assert result.details["timed_out_stage"] == "verifier"
    assert result.details["reason"] == "verifier timed out"


@pytest.mark.parametrize(
    ("test_sh", "message"),
    [
        (
            "echo done > /logs/verifier/reward.txt",
            "reward.txt does not hold a number: b'done\\n'",
        ),
        (
            'echo \'{"correct": "yes"}\' > /logs/verifier/reward.json',
            'reward.json must map names to numbers: b\'{"correct": "yes"}\\n\'',
        ),
    ],
)
def test_a_reward_file_without_a_number_is_an_error(
    tmp_path: Path, test_sh: str, message: str
) -> None:
    with pytest.raises(EvaluatorError) as caught:
        run(tmp_path, harbor_task(tmp_path, f"#!/bin/bash\n{test_sh}\n"))

    assert str(caught.value) == message


def test_a_runtime_without_the_binds_is_an_error(tmp_path: Path) -> None:
    task = harbor_task(tmp_path, REWARD_TXT).model_copy(update={"runtime": None})

    with pytest.raises(EvaluatorError) as caught:
        run(tmp_path, task)

    assert str(caught.value) == (
        "the runtime does not bind ['/tests', '/logs']; "
        "a harbor task needs runtime.binds: [/tests, /logs]"
    )
