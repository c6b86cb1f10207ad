"""A rehearsal runs the real CLI through a token-in/token-out gateway with the
scripted engine playing a model that knows the CLI's shell tool, and keeps the
exact ids of each call (pi: the quickest of the pinned CLIs to start)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polar.assets import QWEN3_TOKENIZER_DIR
from polar.harness import install, load_harness
from polar.harness.exchange import SHELL_EXCHANGES
from polar.tinymodel.rehearsal import (
    COMMAND,
    REASONING,
    Rehearsal,
    RehearsedCall,
    rehearsable,
    rehearse,
    run_place,
)

CACHE = Path(__file__).resolve().parents[2] / ".cache/harness"


@pytest.mark.slow
def test_a_rehearsal_keeps_the_clis_real_prompts_and_the_outputs_it_accepted(
    tokenizer: Any,
) -> None:
    package = load_harness("pi").package
    assert package is not None
    install(package, CACHE)

    rehearsal = rehearse("pi", QWEN3_TOKENIZER_DIR, cache_dir=CACHE)

    first, second = rehearsal.calls
    decode = tokenizer.decode
    prompt = decode(list(first.prompt_ids))
    assert '"name": "bash"' in prompt and "Write the word polar" in prompt
    assert len(first.prompt_ids) > 1000  # pi's own system prompt and tools
    reasoning, _, call = decode(list(first.output_ids)).partition("</think>\n\n")
    assert reasoning.strip() == REASONING
    assert json.loads(
        call.removeprefix("<tool_call>\n").removesuffix("\n</tool_call><|im_end|>")
    ) == (SHELL_EXCHANGES["pi"].call(COMMAND))
    # the second prompt extends the first with its sampled ids, then the tool result
    sampled = first.prompt_ids + first.output_ids
    assert second.prompt_ids[: len(sampled)] == sampled
    assert "<tool_response>" in decode(list(second.prompt_ids[len(sampled) :]))
    assert decode(list(second.output_ids)).endswith("Wrote proof.txt.<|im_end|>")
    assert rehearsable(CACHE, ["pi"]) == {"pi": "0.73.1"}
    # pi leaves sampling to the model's defaults
    assert (first.temperature, first.top_p) == (second.temperature, second.top_p) == (None, None)


@pytest.mark.slow
def test_a_cli_run_again_where_it_was_rehearsed_sends_the_rehearsed_prompt(
    tmp_path: Path, tokenizer: Any
) -> None:
    """What the CLI tests rely on (``support.cli_runs``): pi's system prompt holds
    its workspace path and the date, and run again in the place of its rehearsal,
    emptied by ``run_place``, it writes the same first prompt token for token."""
    package = load_harness("pi").package
    assert package is not None
    install(package, CACHE)

    first = rehearse("pi", QWEN3_TOKENIZER_DIR, cache_dir=CACHE, place=tmp_path)
    workdir, home = run_place("pi", tmp_path)
    assert workdir.is_dir() and home.is_dir()
    assert not any(workdir.iterdir()) and not any(home.iterdir())
    assert str(workdir) in tokenizer.decode(list(first.calls[0].prompt_ids))
    again = rehearse("pi", QWEN3_TOKENIZER_DIR, cache_dir=CACHE, place=tmp_path)
    assert again.calls[0].prompt_ids == first.calls[0].prompt_ids
    elsewhere = rehearse("pi", QWEN3_TOKENIZER_DIR, cache_dir=CACHE, place=tmp_path / "other")
    assert elsewhere.calls[0].prompt_ids != first.calls[0].prompt_ids


@pytest.mark.slow
def test_a_rehearsal_keeps_the_sampling_the_cli_asks_for(tokenizer: Any) -> None:
    """The Gemini CLI asks for temperature 1 and top-p 0.95 on every call: the
    warm-up must teach its exchange for that sampling, not the model's defaults."""
    package = load_harness("gemini_cli").package
    assert package is not None
    install(package, CACHE)

    rehearsal = rehearse("gemini_cli", QWEN3_TOKENIZER_DIR, cache_dir=CACHE)

    first, second = rehearsal.calls
    assert '"name": "run_shell_command"' in tokenizer.decode(list(first.prompt_ids))
    assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids
    assert [(c.temperature, c.top_p) for c in rehearsal.calls] == [(1.0, 0.95)] * 2


def test_a_rehearsal_knows_when_its_workspace_path_is_in_the_trained_tail(
    tokenizer: Any,
) -> None:
    """The warm-up trains through a prompt's last ``tail`` tokens; a CLI that
    writes the workspace path there is rehearsed at more paths (teach_agents)."""
    head = tokenizer.encode("You are a coding agent. " * 40)
    where = tokenizer.encode("<cwd>/tmp/polar-rehearse-codex-_786rppv/run/work</cwd>\n")
    ask = tokenizer.encode("Write the word polar into proof.txt using the shell.")
    late = RehearsedCall(tuple(head + where + ask), (1, 2))
    early = RehearsedCall(tuple(where + head + ask), (1, 2))

    def rehearsal(*calls: RehearsedCall) -> Rehearsal:
        return Rehearsal("codex", calls, scratch="polar-rehearse-codex-_786rppv")

    tail = len(where) + len(ask)
    assert rehearsal(early, late).names_workspace_within(tail, tokenizer.decode)
    assert not rehearsal(early).names_workspace_within(tail, tokenizer.decode)
    # part of the path cut off at the tail's start still counts if the leaf is whole
    assert rehearsal(late).names_workspace_within(tail - 3, tokenizer.decode)
    assert not rehearsal(late).names_workspace_within(len(ask), tokenizer.decode)
