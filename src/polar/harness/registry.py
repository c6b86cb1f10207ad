"""Harness presets by name, or any ``package.module:factory`` plug-in.

A factory is called with the options as keyword arguments and must return a
:class:`~polar.harness.base.Harness`. When the factory is a dataclass (every
built-in preset is one), the options are validated against its fields first,
so string options from a command line become the fields' types
(``max_tokens=8000`` -> ``8000``, ``api=openai-responses`` -> ``PiApi``).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import pydantic

from polar.harness.base import Harness
from polar.harness.errors import InvalidHarnessOptions, UnknownHarness

PRESETS: Mapping[str, str] = {
    "codex": "polar.harness.presets.codex:Codex",
    "claude_code": "polar.harness.presets.claude_code:ClaudeCode",
    "qwen_code": "polar.harness.presets.qwen_code:QwenCode",
    "pi": "polar.harness.presets.pi:Pi",
    "opencode": "polar.harness.presets.opencode:OpenCode",
    "mini_swe_agent": "polar.harness.presets.mini_swe_agent:MiniSweAgent",
    "shell": "polar.harness.presets.shell:Shell",
}
"""Built-in presets: name -> dotted path of the factory."""

INSTALLABLE: tuple[str, ...] = tuple(name for name in PRESETS if name != "shell")
"""Presets with a package to install (what ``polar harness install all`` installs)."""


def load_harness(ref: str, options: Mapping[str, Any] | None = None) -> Harness:
    """The harness named ``ref`` (a preset name or ``package.module:factory``)."""
    factory = _factory(ref)
    options = dict(options or {})
    try:
        if dataclasses.is_dataclass(factory) and isinstance(factory, type):
            known = {field.name for field in dataclasses.fields(factory) if field.init}
            unknown = sorted(set(options) - known)
            if unknown:
                raise InvalidHarnessOptions(
                    f"harness {ref}: unknown options {unknown}; it takes {sorted(known) or 'none'}"
                )
            harness = pydantic.TypeAdapter(factory).validate_python(options)
        else:
            harness = factory(**options)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "options"
        raise InvalidHarnessOptions(f"harness {ref}: {where}: {first['msg']}") from None
    except TypeError as exc:
        raise InvalidHarnessOptions(f"harness {ref}: {exc}") from None
    if not isinstance(harness, Harness):
        raise UnknownHarness(f"{ref} returned {type(harness).__name__}, not a harness")
    return harness


def _factory(ref: str) -> Callable[..., Any]:
    path = PRESETS.get(ref, ref)
    module_name, _, attr = path.partition(":")
    if not attr or not module_name:
        raise UnknownHarness(
            f"unknown harness {ref!r}; use one of {sorted(PRESETS)} or 'package.module:factory'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownHarness(f"{ref}: cannot import {module_name} ({exc})") from None
    factory: object = getattr(module, attr, None)
    if not callable(factory):
        raise UnknownHarness(f"{ref}: {module_name} has no callable {attr!r}")
    return factory
