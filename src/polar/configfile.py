"""Reading a typed configuration: a YAML file, flag overrides on top, validated once.

Every configuration Polar reads (the gateway's, the rollout server's and
node's, the bridges') goes through here, so a problem reads the same
everywhere: one line naming the file and every field at fault, e.g.
``node.yaml: gateway.engine.base_urll: unknown field (did you mean base_url?);
port: Input should be a valid integer`` (all of them at once, so one edit fixes
the file).
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class ConfigError(Exception):
    """A configuration problem, phrased for a one-line CLI message."""


def describe_error(error: ValidationError, model: type[BaseModel] | None = None) -> str:
    """Every validation problem as ``dotted.field: message``, joined by ``; ``.

    Given the ``model`` that was validated, an unknown field names the closest
    field the model has at that place (``engine.base_urll: unknown field (did
    you mean base_url?)``).
    """
    problems: list[str] = []
    for each in error.errors():
        loc = each["loc"]
        where = ".".join(str(p) for p in loc) or "config"
        message = each["msg"]
        if each["type"] == "missing":
            message = "field required"
        elif each["type"] == "extra_forbidden":
            message = "unknown field"
            close = _closest(model, loc) if model is not None and loc else None
            if close is not None:
                message += f" (did you mean {close}?)"
        line = f"{where}: {message}"
        if line not in problems:
            problems.append(line)
    return "; ".join(problems)


def _closest(model: type[BaseModel], loc: Sequence[int | str]) -> str | None:
    """The field nearest in spelling to ``loc[-1]`` among those at ``loc[:-1]``."""
    models: list[type[BaseModel]] = [model]
    for part in loc[:-1]:
        # A list index, a dict key or a union member's tag keeps the models in hand.
        inner = [m for m in models if isinstance(part, str) and part in m.model_fields]
        if inner:
            models = [
                found for m in inner for found in _models_in(m.model_fields[str(part)].annotation)
            ]
    known = {
        name
        for m in models
        for field, info in m.model_fields.items()
        for name in (field, info.alias)
        if name
    }
    close = difflib.get_close_matches(str(loc[-1]), sorted(known), n=1, cutoff=0.6)
    return close[0] if close else None


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The pydantic models an annotation names (inside unions, lists, dicts, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` on top; nested mappings are merged key by key."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML file's top-level mapping ({} for an empty file); one-line errors."""
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{where} not valid YAML") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return loaded or {}


def load_config(model: type[M], path: Path | None, overrides: dict[str, Any]) -> M:
    """Read a YAML file (if any), apply ``overrides`` (nested dicts), validate once."""
    data = merge(read_yaml(path) if path is not None else {}, overrides)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        prefix = f"{path}: " if path is not None else ""
        raise ConfigError(prefix + describe_error(exc, model)) from None
