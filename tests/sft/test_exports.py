"""SFT exports: token rows whose labels are the sampled tokens and -100 on
everything else, chat rows in OpenAI's format, both written as JSONL and
Parquet that Hugging Face ``datasets`` loads as they are. Token ids are built
from named pieces with the real Qwen3 tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from polar.sft.export import (
    IGNORE,
    ExportFileError,
    ExportFormat,
    chat_row,
    read_rows,
    token_row,
    token_rows,
    write_exports,
)
from polar.sft.verdict import AttemptKey

from support.sft import CONVERSATION, FIRST, KEY, SECOND, TOOL, USER, sample


def test_labels_are_the_sampled_tokens_and_minus_100_everywhere_else(tokenizer: Any) -> None:
    row = token_row(KEY, sample(tokenizer))
    decode = tokenizer.decode
    assert row["id"] == "fix-median/2/0.0"
    assert (row["task"], row["attempt"], row["chain_class"], row["reward"]) == (
        "fix-median",
        2,
        "main",
        1.0,
    )
    assert decode(row["input_ids"]) == USER + FIRST + TOOL + SECOND
    assert row["attention_mask"] == [1] * len(row["input_ids"])
    labelled = [t for t in row["labels"] if t != IGNORE]
    assert decode(labelled) == FIRST + SECOND
    # -100 on the prompt and on the tool output between the turns, exactly.
    spans, current = [], []
    for token, label in zip(row["input_ids"], row["labels"], strict=True):
        if label == IGNORE:
            current.append(token)
        elif current:
            spans.append(decode(current))
            current = []
    assert spans == [USER, TOOL]
    assert all(
        label in (IGNORE, t) for t, label in zip(row["input_ids"], row["labels"], strict=True)
    )


def test_a_chat_row_is_openai_messages_with_reasoning_apart_and_stable_call_ids(
    tokenizer: Any,
) -> None:
    row = chat_row(KEY, sample(tokenizer), CONVERSATION)
    messages = row["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert all(list(m) == list(messages[0]) for m in messages), "every key in every message"
    assert messages[1]["reasoning_content"] == "Look."
    assert messages[1]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "ls"}'},
        }
    ]
    assert messages[2]["tool_call_id"] == "call_1"
    assert messages[3] == {
        "role": "assistant",
        "content": "Fixed.",
        "reasoning_content": "Done.",
        "tool_calls": None,
        "tool_call_id": None,
        "name": None,
    }
    assert orjson.loads(row["tools"]) == CONVERSATION["tools"]


@pytest.mark.parametrize("fmt", list(ExportFormat))
def test_exports_read_back_and_load_in_hugging_face_datasets(
    tokenizer: Any, tmp_path: Path, fmt: ExportFormat
) -> None:
    import datasets

    s = sample(tokenizer)
    rows = [(token_row(KEY, s), chat_row(KEY, s, CONVERSATION), None)]
    other = AttemptKey("fix-slugify", 0)
    rows.append((token_row(other, s), None, "ValueError: an image part"))
    counts = write_exports(tmp_path, iter(rows), [fmt])
    assert counts.rows == {f"chat.{fmt}": 1, f"tokens.{fmt}": 2}
    assert counts.chat_skipped == {"fix-slugify/0/0.0": "ValueError: an image part"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"chat.{fmt}", f"tokens.{fmt}"]

    assert read_rows(tmp_path / f"tokens.{fmt}") == [r[0] for r in rows]
    assert read_rows(tmp_path / f"chat.{fmt}") == [rows[0][1]]
    checked = token_rows(tmp_path / f"tokens.{fmt}")
    assert [r.id for r in checked] == ["fix-median/2/0.0", "fix-slugify/0/0.0"]
    assert checked[0].trained == sum(s["loss_mask"])

    builder = "json" if fmt is ExportFormat.JSONL else "parquet"
    cache = str(tmp_path / "hf-cache")
    tokens = datasets.load_dataset(
        builder, data_files=str(tmp_path / f"tokens.{fmt}"), split="train", cache_dir=cache
    )
    assert tokens.num_rows == 2
    assert tokens[0]["labels"] == rows[0][0]["labels"]
    chat = datasets.load_dataset(
        builder, data_files=str(tmp_path / f"chat.{fmt}"), split="train", cache_dir=cache
    )
    assert chat[0]["messages"] == rows[0][1]["messages"]
    assert chat[0]["tools"] == rows[0][1]["tools"]


def test_a_failed_export_leaves_no_file_behind(tokenizer: Any, tmp_path: Path) -> None:
    def rows() -> Any:
        yield token_row(KEY, sample(tokenizer)), None, "none"
        raise RuntimeError("the journal went away")

    with pytest.raises(RuntimeError):
        write_exports(tmp_path, rows(), list(ExportFormat))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json\n", "tokens.jsonl:1: not valid JSON"),
        ("[1]\n", "tokens.jsonl:1: expected a JSON object"),
        ('{"input_ids": [1]}\n', "row 1: needs input_ids, labels and attention_mask lists"),
        (
            '{"input_ids": [1, 2], "labels": [2], "attention_mask": [1, 1]}\n',
            "row 1: input_ids, labels and attention_mask differ in length",
        ),
        (
            '{"input_ids": [1, 2], "labels": [-100, 3], "attention_mask": [1, 1]}\n',
            "row 1: a label is neither -100 nor its input token",
        ),
        (
            '{"input_ids": [1, -2], "labels": [-100, -100], "attention_mask": [1, 1]}\n',
            "row 1: input_ids must be non-negative integers",
        ),
    ],
)
def test_a_bad_token_file_is_refused_naming_the_row(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "tokens.jsonl"
    path.write_text(content)
    with pytest.raises(ExportFileError, match=message.replace("[", r"\[")):
        token_rows(path)


def test_an_unknown_or_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ExportFileError, match="no such file"):
        read_rows(tmp_path / "tokens.parquet")
    (tmp_path / "tokens.csv").write_text("x")
    with pytest.raises(ExportFileError, match=r"expected a \.jsonl or \.parquet file"):
        read_rows(tmp_path / "tokens.csv")
    (tmp_path / "tokens.parquet").write_text("not parquet")
    with pytest.raises(ExportFileError, match="not a readable Parquet file"):
        read_rows(tmp_path / "tokens.parquet")
