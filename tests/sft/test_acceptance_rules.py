"""Acceptance rules: small expressions over reward and resolved, evaluated
without ``eval``; anything else is refused with a message naming the problem."""

from __future__ import annotations

import pytest

from polar.sft.accept import Acceptance, AcceptError


@pytest.mark.parametrize(
    ("rule", "reward", "resolved", "accepted"),
    [
        ("reward >= 1", 1.0, None, True),
        ("reward >= 1", 0.99, True, False),
        ("resolved", 0.0, True, True),
        ("resolved", 1.0, None, False),
        ("reward > 0.5 and not resolved", 0.7, False, True),
        ("reward > 0.5 and not resolved", 0.7, True, False),
        ("0.2 <= reward < 0.8", 0.5, None, True),
        ("0.2 <= reward < 0.8", 0.8, None, False),
        ("reward == 1 or resolved == true", 0.0, True, True),
        ("reward != -1", -1.0, None, False),
        ("(reward >= 1) or (reward <= -1)", -2.0, None, True),
        ("True", 0.0, None, True),
    ],
)
def test_a_rule_accepts_what_it_says(
    rule: str, reward: float, resolved: bool | None, accepted: bool
) -> None:
    assert Acceptance.parse(rule)(reward, resolved) is accepted


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("reward >=", "not an expression"),
        ("score >= 1", "unknown name 'score' (use reward or resolved)"),
        ("__import__('os').system('true')", "call is not allowed"),
        ("reward.real >= 1", "attribute is not allowed"),
        ("reward in [1]", "unsupported comparison in"),
        ("reward >= '1'", "only numbers and true/false are allowed"),
        ("reward + 1 >= 2", "binop is not allowed"),
        ("(lambda: 1)()", "call is not allowed"),
        ("", "not an expression"),
    ],
)
def test_anything_else_is_refused_naming_the_problem(rule: str, message: str) -> None:
    with pytest.raises(AcceptError) as refused:
        Acceptance.parse(rule)
    assert str(refused.value).startswith(f"--accept {rule!r}: ")
    assert message in str(refused.value)
