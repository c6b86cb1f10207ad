"""Reading a typed configuration: a YAML file, flag overrides on top, validated once.

Every configuration Polar reads (the gateway's, the rollout server's and
node's, the bridges') goes through here, so a problem reads the same
everywhere: one line naming the file and the field, e.g.
``node.yaml: gateway.engine.base_url: field required``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class ConfigError(Exception):
    """A configuration problem, phrased for a one-line CLI message."""


def describe_error(error: ValidationError) -> str:
    """First validation problem as ``dotted.field: message``."""
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "config"
    message = first["msg"]
    if first["type"] == "missing":
        message = "field required"
    elif first["type"] == "extra_forbidden":
        message = "unknown field"
    return f"{where}: {message}"


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
        raise ConfigError(prefix + describe_error(exc)) from None
