"""Looking harnesses up by preset name or by ``package.module:factory``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from polar.harness import (
    PRESETS,
    Harness,
    InvalidHarnessOptions,
    Invocation,
    RunSpec,
    UnknownHarness,
    load_harness,
)
from polar.harness.presets.codex import Codex
from polar.harness.presets.shell import Shell
from polar.ir import Dialect


class EchoAgent:
    """A plug-in harness that is not a dataclass."""

    def __init__(self, greeting: str = "hello") -> None:
        self.greeting = greeting

    @property
    def name(self) -> str:
        return "echo_agent"

    @property
    def dialect(self) -> Dialect:
        return Dialect.OPENAI_CHAT

    @property
    def package(self) -> None:
        return None

    def write_config(self, spec: RunSpec) -> tuple[Path, ...]:
        return ()

    def invocation(self, spec: RunSpec, executable: Path | None) -> Invocation:
        return Invocation(argv=("echo", self.greeting, spec.instruction))


@dataclass(frozen=True)
class NotAHarness:
    size: int = 1


def make_echo_agent(greeting: str = "hi") -> EchoAgent:
    return EchoAgent(greeting)


def test_presets_are_found_by_name() -> None:
    assert load_harness("codex") == Codex()
    assert set(PRESETS) == {
        "codex", "claude_code", "qwen_code", "pi", "opencode", "mini_swe_agent", "gemini_cli",
        "shell", "minicoder",
    }  # fmt: skip


def test_a_dotted_path_names_a_preset_class_too() -> None:
    harness = load_harness("polar.harness.presets.shell:Shell", {"command": "agent"})
    assert harness == Shell(command="agent")


def test_a_plugin_factory_gets_the_options_as_keywords() -> None:
    harness = load_harness(f"{__name__}:make_echo_agent", {"greeting": "salut"})
    assert isinstance(harness, EchoAgent) and isinstance(harness, Harness)
    assert harness.greeting == "salut"


def test_an_unknown_name_lists_the_presets() -> None:
    with pytest.raises(
        UnknownHarness, match=r"unknown harness 'aider'; use one of \['claude_code'"
    ):
        load_harness("aider")


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("no_such_module_xyz:factory", "cannot import no_such_module_xyz"),
        (f"{__name__}:missing", "has no callable 'missing'"),
        (f"{__name__}:NotAHarness", "returned NotAHarness, not a harness"),
        (":factory", "unknown harness"),
    ],
)
def test_a_bad_dotted_path_is_an_unknown_harness(ref: str, message: str) -> None:
    with pytest.raises(UnknownHarness, match=message):
        load_harness(ref)


def test_options_a_preset_does_not_take_are_refused() -> None:
    with pytest.raises(InvalidHarnessOptions, match=r"harness pi: unknown options \['model'\]"):
        load_harness("pi", {"model": "x"})


def test_option_values_are_validated_against_the_field_types() -> None:
    with pytest.raises(InvalidHarnessOptions, match="harness pi: max_tokens: Input should be"):
        load_harness("pi", {"max_tokens": "many"})


def test_a_plugin_factory_with_wrong_keywords_is_refused() -> None:
    with pytest.raises(InvalidHarnessOptions, match="unexpected keyword argument 'colour'"):
        load_harness(f"{__name__}:make_echo_agent", {"colour": "red"})
