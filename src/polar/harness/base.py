"""The contract every harness preset implements, and the description of one run.

A harness is an unmodified agent CLI. A preset knows four things about it:
which package (pinned) provides it, which provider dialect it speaks, how to
configure it inside an isolated HOME so that it reaches only Polar's gateway
with the session key, and the headless command line for one instruction.

The split between :meth:`Harness.write_config` (files under ``spec.home``) and
:meth:`Harness.invocation` (argv + environment) keeps both testable without
running anything. The session key only ever travels in the environment of the
harness process (or in a file the CLI reads it from, where a CLI has no other
way); presets never put it on the command line, where other users of the
machine could read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from polar.harness.errors import InvalidRunSpec
from polar.harness.package import Package
from polar.ir import Dialect

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One headless run of a harness against the gateway.

    ``gateway_url`` is the gateway's root (``http://host:port``); presets add
    ``/v1`` where their client expects it (OpenAI-style clients), or not
    (Anthropic clients add ``/v1/messages`` themselves).
    """

    gateway_url: str
    api_key: str = field(repr=False)
    model: str
    instruction: str
    workdir: Path
    home: Path
    """An empty directory that becomes the harness's HOME (its config, caches, sessions)."""
    timeout_s: float = 600.0
    path: str = DEFAULT_PATH
    """PATH for the harness process: where it finds ``node``, ``bash``, ``git``."""

    def __post_init__(self) -> None:
        if not self.gateway_url.startswith(("http://", "https://")):
            raise InvalidRunSpec(
                f"gateway URL must start with http:// or https://: {self.gateway_url!r}"
            )
        if not self.api_key:
            raise InvalidRunSpec("the API key is empty")
        if not self.model:
            raise InvalidRunSpec("the model name is empty")
        if self.timeout_s <= 0:
            raise InvalidRunSpec(f"timeout must be positive, got {self.timeout_s}")

    @property
    def root_url(self) -> str:
        return self.gateway_url.rstrip("/")

    @property
    def openai_base_url(self) -> str:
        """Base URL for OpenAI-style clients (they append ``/chat/completions``, ``/responses``)."""
        return f"{self.root_url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """Base URL for Anthropic clients (they append ``/v1/messages``)."""
        return self.root_url


@dataclass(frozen=True, slots=True)
class Invocation:
    """The headless command line of one run.

    ``env`` holds the harness's own variables; the runner adds them over
    :func:`base_env`, and nothing else from the caller's environment.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class Harness(Protocol):
    """An agent CLI Polar can install, configure and run headless."""

    @property
    def name(self) -> str: ...

    @property
    def dialect(self) -> Dialect:
        """The provider API the CLI speaks to the gateway."""
        ...

    @property
    def package(self) -> Package | None:
        """The pinned package that provides the CLI (None: nothing to install)."""
        ...

    def write_config(self, spec: RunSpec) -> tuple[Path, ...]:
        """Write the CLI's configuration under ``spec.home``; return the files written."""
        ...

    def invocation(self, spec: RunSpec, executable: Path | None) -> Invocation:
        """The command line (and variables) that runs ``spec.instruction`` headless.

        ``executable`` is the installed command (None when :attr:`package` is None).
        """
        ...


def base_env(spec: RunSpec) -> dict[str, str]:
    """The environment every harness process starts from: an isolated HOME, no inherited
    variables (so no provider keys or base URLs of the caller leak in)."""
    home = str(spec.home)
    return {
        "PATH": spec.path,
        "HOME": home,
        "XDG_CONFIG_HOME": f"{home}/.config",
        "XDG_DATA_HOME": f"{home}/.local/share",
        "XDG_STATE_HOME": f"{home}/.local/state",
        "XDG_CACHE_HOME": f"{home}/.cache",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
    }


def require_executable(name: str, executable: Path | None) -> str:
    """The installed command as an argv element; presets with a package need one."""
    if executable is None:
        raise InvalidRunSpec(f"harness {name} needs its installed executable")
    return str(executable)
