import pytest

from envfile import parse_env


def test_a_value_may_contain_equals_signs():
    assert parse_env("URL=postgres://db?sslmode=require") == {
        "URL": "postgres://db?sslmode=require"
    }


def test_double_quotes_are_removed():
    assert parse_env('NAME="Polar RL"') == {"NAME": "Polar RL"}


def test_single_quotes_are_removed():
    assert parse_env("NAME='Polar RL'") == {"NAME": "Polar RL"}


def test_spaces_inside_quotes_are_kept():
    assert parse_env('PAD="  x  "') == {"PAD": "  x  "}


def test_unmatched_quotes_are_kept():
    assert parse_env('A="x') == {"A": '"x'}


def test_a_line_without_equals_names_its_number():
    with pytest.raises(ValueError, match="line 3"):
        parse_env("A=1\n# note\noops\n")
