"""The learning benchmark's task family (``benchmarks/learning_toy.py``): the
train/held-out split, the task rows, the scorer the evaluator runs, and the
scripted expert. The benchmark itself is not run here (it takes minutes)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from polar.tasks.model import Task

from support.paths import load_benchmark

learning = load_benchmark("learning_toy")


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_the_split_holds_out_pairs_whose_name_and_digit_are_both_trained(
    tmp_path: Path, seed: int
) -> None:
    train, held = learning.make_tasks(tmp_path, names=12, heldout=10, seed=seed)
    assert (len(train), len(held)) == (110, 10), f"seed {seed}"
    pairs = [(r["metadata"]["name"], r["metadata"]["answer"]) for r in train]
    held_pairs = [(r["metadata"]["name"], r["metadata"]["answer"]) for r in held]
    assert not set(pairs) & set(held_pairs), f"seed {seed}"
    assert {d for _, d in pairs} == {str(d) for d in range(10)}
    for name, digit in held_pairs:
        assert any(n == name for n, _ in pairs) and any(d == digit for _, d in pairs)
    # names and digits are spread over the held-out pairs: no two share either
    assert len({n for n, _ in held_pairs}) == len({d for _, d in held_pairs}) == 10
    for row in train + held:
        task = Task.model_validate(row)
        assert f" is {row['metadata']['answer']}." in task.instruction
    # the same seed gives the same split
    again, _ = learning.make_tasks(tmp_path / "again", names=12, heldout=10, seed=seed)
    assert [r["id"] for r in again] == [r["id"] for r in train]


@pytest.mark.parametrize(
    ("answer", "reward"),
    [
        ("7", "1"),
        ("7\n", "1"),
        (" 7 ", "1"),
        ("7 is the number.", "0.25"),
        ("7.", "0.25"),
        ("The number is 7", "0.25"),
        ("8", "0"),
        ("8 is the number.", "0"),
        ("77", "0"),
        ("7 or 7", "0"),
        ("7 and 8", "0"),
        ("", "0"),
        ("seven", "0"),
    ],
)
def test_the_scorer_gives_1_for_the_number_only_and_a_quarter_for_it_among_words(
    tmp_path: Path, answer: str, reward: str
) -> None:
    (row,) = [
        r
        for r in learning.make_tasks(tmp_path, names=1, heldout=0, seed=0)[0]
        if r["metadata"]["answer"] == "7"
    ]
    (tmp_path / "answer.txt").write_text(answer)
    command = row["evaluator"]["config"]["command"]
    subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True, timeout=30)
    assert (tmp_path / "reward.txt").read_text() == reward


def test_the_scripted_expert_answers_right_and_bare_at_the_given_rates(tmp_path: Path) -> None:
    train, _ = learning.make_tasks(tmp_path, names=12, heldout=10, seed=0)
    script = learning.expert_script(train, 2, 0.8, 0.3, 0)
    sessions = script["sessions"]
    assert len(sessions) == 2 * len(train)
    right = bare = 0
    for i, session in enumerate(sessions):
        task = train[i // 2]
        assert re.fullmatch(session["session"], f"sft.{task['id']}.a{i % 2}-s0")
        said = session["turns"][0]["text"]
        digit, rest = said[0], said[1:]
        assert digit.isdigit() and rest in ("", " is the number.")
        right += digit == task["metadata"]["answer"]
        bare += rest == ""
    assert 0.7 < right / len(sessions) < 0.9
    assert 0.2 < bare / len(sessions) < 0.4
    # the same seed gives the same script
    assert learning.expert_script(train, 2, 0.8, 0.3, 0) == script
