"""Reading task rows from files: JSONL, JSON, YAML and Parquet.

Each row keeps where it came from (``tasks.jsonl:3``, ``tasks.yaml:12 (item 2)``,
``tasks.parquet row 5``) so that every later error can name it. A file that
cannot be read, parsed, or holds no tasks raises :class:`TaskLoadError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from polar.tasks.errors import TaskLoadError

SUFFIXES = (".jsonl", ".json", ".yaml", ".yml", ".parquet")

JSON_COLUMNS = ("workspace", "evaluator", "runtime", "metadata")
"""Task fields a Parquet file may hold as JSON text (datasets often store
nested objects that way) instead of as structs."""


@dataclass(frozen=True, slots=True)
class Row:
    where: str
    """The file and line or row, for messages."""
    data: Mapping[str, Any]


def read_rows(path: Path) -> list[Row]:
    """Every row of a task file, in order; raises TaskLoadError for a bad file."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        rows = _parquet_rows(path)
    elif suffix == ".jsonl":
        rows = _jsonl_rows(path, _read_text(path))
    elif suffix == ".json":
        rows = _json_rows(path, _read_text(path))
    elif suffix in (".yaml", ".yml"):
        rows = _yaml_rows(path, _read_text(path))
    else:
        raise TaskLoadError(
            f"{path}: unsupported task file type {suffix or '(none)'!r} "
            f"(use {', '.join(SUFFIXES)}, a Harbor task directory, 'builtin', "
            "'pyfuncs:train' or 'pyfuncs:heldout')"
        )
    if not rows:
        raise TaskLoadError(f"{path}: no tasks in the file")
    return rows


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TaskLoadError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise TaskLoadError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _object(where: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TaskLoadError(f"{where}: a task must be an object, got {type(value).__name__}")
    return value


def _jsonl_rows(path: Path, text: str) -> list[Row]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskLoadError(
                f"{where}: not valid JSON ({exc.msg}, column {exc.colno})"
            ) from None
        rows.append(Row(where, _object(where, value)))
    return rows


def _items(path: Path, value: object) -> Sequence[object]:
    """The task list of a JSON/YAML document: a list, or ``{tasks: [...]}``."""
    if isinstance(value, Mapping):
        extra = sorted(str(key) for key in value if key != "tasks")
        if "tasks" not in value or extra:
            raise TaskLoadError(
                f"{path}: expected a list of tasks or a mapping with only 'tasks'"
                + (f" (unexpected keys {extra})" if extra else "")
            )
        value = value["tasks"]
    if value is None:
        return []
    if not isinstance(value, list):
        raise TaskLoadError(f"{path}: tasks must be a list, got {type(value).__name__}")
    return value


def _json_rows(path: Path, text: str) -> list[Row]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskLoadError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    items = _items(path, document)
    return [
        Row(where, _object(where, item))
        for index, item in enumerate(items, start=1)
        for where in [f"{path} (item {index})"]
    ]


def _yaml_rows(path: Path, text: str) -> list[Row]:
    try:
        document = yaml.safe_load(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise TaskLoadError(f"{path}{line}: not valid YAML ({problem})") from None
    items = _items(path, document)
    lines = _item_lines(node)
    rows = []
    for index, item in enumerate(items, start=1):
        line = f":{lines[index - 1]}" if index <= len(lines) else ""
        where = f"{path}{line} (item {index})"
        rows.append(Row(where, _object(where, item)))
    return rows


def _item_lines(node: yaml.Node | None) -> list[int]:
    """1-based line of each item of the document's task list (for messages)."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == "tasks":
                node = value
                break
    if not isinstance(node, yaml.SequenceNode):
        return []
    return [item.start_mark.line + 1 for item in node.value]


def _parquet_rows(path: Path) -> list[Row]:
    import pyarrow
    import pyarrow.parquet

    try:
        table = pyarrow.parquet.read_table(path)
    except (OSError, pyarrow.ArrowException) as exc:
        raise TaskLoadError(f"{path}: cannot read Parquet ({_one_line(str(exc))})") from None
    rows = []
    for index, record in enumerate(table.to_pylist(), start=1):
        # Parquet has no "absent": a column missing from a row reads as null.
        where = f"{path} row {index}"
        data = {key: value for key, value in record.items() if value is not None}
        for key in JSON_COLUMNS:
            if isinstance(data.get(key), str):
                try:
                    data[key] = json.loads(data[key])
                except json.JSONDecodeError as exc:
                    raise TaskLoadError(f"{where}: {key}: not valid JSON ({exc.msg})") from None
        rows.append(Row(where, data))
    return rows


def _one_line(text: str) -> str:
    return " ".join(text.split())
