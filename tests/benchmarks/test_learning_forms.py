"""How the learning benchmark describes the replies it reads (``_forms``): a
code block, the function asked for, text after the code, a reply cut at the
token limit. Replies written here by hand; the records they come from are read
by the benchmark itself, not run in the suite."""

from __future__ import annotations

from support.paths import load_benchmark

learning = load_benchmark("learning")
ASKED = "Write `clamp(x)` in `solution.py`."


def row(reply: str, *, truncated: bool = False) -> dict[str, object]:
    return {"reply": reply, "instruction": ASKED, "truncated": truncated}


def test_forms_count_each_shape_of_reply() -> None:
    rows = [
        row("```python\ndef clamp(x):\n    return x\n```"),
        row("```python\ndef clamp(x):\n    return x\n```\nThis returns x."),
        row("```python\ndef other(x):\n    return x\n```"),
        row("Sure! The function clamps x so that", truncated=True),
        row("```python\ndef clamp(x):\n    while True:", truncated=True),
    ]
    assert learning._forms(rows) == {
        "replies": 5,
        "with_code_block": 4,
        "asked_name_defined": 3,
        "text_after_code": 1,
        "cut_at_token_limit": 2,
    }


def test_rows_without_a_finish_reason_count_as_finished() -> None:
    rows = [{"reply": "```python\ndef clamp(x):\n    return x\n```", "instruction": ASKED}]
    assert learning._forms(rows)["cut_at_token_limit"] == 0
