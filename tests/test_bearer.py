"""``Authorization: Bearer <token>`` taken apart the same way everywhere."""

from __future__ import annotations

import pytest

from polar.bearer import bearer_token


@pytest.mark.parametrize(
    ("value", "token"),
    [
        ("Bearer sk-1", "sk-1"),
        ("bearer sk-1", "sk-1"),
        ("BEARER  sk-1 ", "sk-1"),
        ("Bearer ", ""),
        ("Bearer", ""),
        ("Basic dXNlcjpwdw==", None),
        ("sk-1", None),
        ("", None),
        ("Bearer\tsk-1", None),
    ],
)
def test_the_token_of_a_bearer_value_and_none_for_another_scheme(
    value: str, token: str | None
) -> None:
    assert bearer_token(value) == token
    assert bearer_token(value.encode()) == (None if token is None else token.encode())


def test_bytes_keep_their_bytes_and_text_its_own_blanks() -> None:
    assert bearer_token(b"Bearer t\xc3\xa9") == b"t\xc3\xa9"
    assert bearer_token("Bearer t\xa0") == "t"  # str.strip: a no-break space is blank
    assert bearer_token(b"Bearer t\xa0") == b"t\xa0"  # bytes.strip: ASCII blanks only
