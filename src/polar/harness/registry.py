"""Harness presets by name, or any ``package.module:factory`` plug-in.

A factory is called with the options as keyword arguments and must return a
:class:`~polar.harness.base.Harness`. When the factory is a dataclass (every
built-in preset is one), the options are validated against its fields first,
so string options from a command line become the fields' types
(``max_tokens=8000`` -> ``8000``, ``api=openai-responses`` -> ``PiApi``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from polar.harness.base import Harness
from polar.harness.errors import InvalidHarnessOptions, UnknownHarness
from polar.plugins import build, load_factory

PRESETS: Mapping[str, str] = {
    "codex": "polar.harness.presets.codex:Codex",
    "claude_code": "polar.harness.presets.claude_code:ClaudeCode",
    "qwen_code": "polar.harness.presets.qwen_code:QwenCode",
    "pi": "polar.harness.presets.pi:Pi",
    "opencode": "polar.harness.presets.opencode:OpenCode",
    "mini_swe_agent": "polar.harness.presets.mini_swe_agent:MiniSweAgent",
    "gemini_cli": "polar.harness.presets.gemini_cli:GeminiCli",
    "shell": "polar.harness.presets.shell:Shell",
    "minicoder": "polar.harness.presets.minicoder:Minicoder",
}
"""Built-in presets: name -> dotted path of the factory."""

INSTALLABLE: tuple[str, ...] = tuple(name for name in PRESETS if name not in ("shell", "minicoder"))
"""Presets with a package to install (what ``polar harness install all`` installs)."""


def load_harness(ref: str, options: Mapping[str, Any] | None = None) -> Harness:
    """The harness named ``ref`` (a preset name or ``package.module:factory``)."""
    factory = load_factory(ref, kind="harness", known=PRESETS, error=UnknownHarness)
    harness = build(
        factory, options or {}, label=f"harness {ref}", noun="options", error=InvalidHarnessOptions
    )
    if not isinstance(harness, Harness):
        raise UnknownHarness(f"{ref} returned {type(harness).__name__}, not a harness")
    return harness


def check_harness(ref: str, options: Mapping[str, Any] | None = None) -> None:
    """Refuse, as :func:`load_harness` would, a harness that cannot run: an unknown
    preset, options its factory does not accept (``shell`` without ``command``).

    A ``package.module:factory`` whose package this process cannot find is let
    through: it may be installed only where the harness runs (the nodes).
    """
    module_name, sep, _ = ref.partition(":")
    if sep and ref not in PRESETS and not _findable(module_name):
        return
    load_harness(ref, options)


def _findable(module_name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):
        return False
