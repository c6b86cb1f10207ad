"""The bridge config file: where the rollout server is, which tasks a prompt
may name, which harness runs them, and how a session becomes a trainer sample.

Every bridge reads the same YAML (trainer-specific sections are optional
fields of their own subclasses). It is read once, when the trainer builds the
bridge; a bad file is one line naming the field (:class:`ConfigError`).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from polar.configfile import ConfigError, load_config
from polar.proxy.call.behaviour import SamplingPolicy
from polar.rollout.protocol import HarnessSpec

C = TypeVar("C", bound="BridgeConfig")


class TraceChoice(StrEnum):
    """What a trainer that takes one sequence per rollout gets from a session
    whose trajectory has several trainable traces (a sub-agent, a compaction
    restart, a break in the chain)."""

    MAIN = "main"
    """The main chain's trace with the most sampled tokens (any chain's, when no
    main chain was trained); the others are counted as undelivered."""
    STRICT = "strict"
    """Refuse: a session with more than one trainable trace is an error."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BridgeConfig(_Section):
    rollout_url: str = "http://127.0.0.1:8200"
    """The rollout server (``polar serve``)."""
    control_token: str | None = Field(default=None, min_length=16)
    control_token_file: Path | None = None
    """A file holding the control token (instead of writing it in this file)."""
    tasks: str = Field(min_length=1)
    """Where prompts find their tasks: ``builtin`` or a task file / directory
    (what ``polar submit`` reads). A prompt names a task by its id or by its
    exact instruction."""
    harness: HarnessSpec
    builder: str = "prefix_merge"
    session_timeout_s: float = Field(default=1800.0, gt=0)
    wait_timeout_s: float = Field(default=7200.0, gt=0)
    """How long the trainer waits for a submitted group before cancelling it."""
    max_resamples: int = Field(default=0, ge=0, le=1024)
    request_timeout_s: float = Field(default=30.0, gt=0)
    trace: TraceChoice = TraceChoice.MAIN
    sampling: SamplingPolicy | None = SamplingPolicy()
    """Enforced on every call of the bridge's sessions (default: temperature 1, the
    whole vocabulary). Set its temperature to the trainer's own; tokens drawn from
    a distribution the trainer cannot recompute are not trained (top-p, top-k,
    min-p, penalties...), and counted."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Added to every submission (shown in ``polar status``)."""

    @model_validator(mode="after")
    def _one_token(self) -> BridgeConfig:
        if self.control_token is not None and self.control_token_file is not None:
            raise ValueError("give control_token or control_token_file, not both")
        return self

    def token(self) -> str | None:
        if self.control_token_file is None:
            return self.control_token
        try:
            token = self.control_token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"control_token_file: cannot read {self.control_token_file} ({exc.strerror})"
            ) from None
        if not token:
            raise ConfigError(f"control_token_file: {self.control_token_file} is empty")
        return token


def read_config(kind: type[C], source: str | Path | dict[str, Any] | C) -> C:
    """A bridge config from a YAML path, a mapping or an instance (validated once)."""
    if isinstance(source, kind):
        return source
    if isinstance(source, dict):
        return load_config(kind, None, source)
    if isinstance(source, str | Path):
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"{path}: no such file")
        return load_config(kind, path, {})
    raise ConfigError(f"expected a config file path or mapping, got {type(source).__name__}")
