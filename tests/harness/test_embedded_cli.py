"""Every pinned agent CLI on the default set-up: the embedded CPU engine serving
the tiny model, the gateway in token-in/token-out mode with its default
configuration, no scripted engine between the CLI and the model.

The model is the one ``polar model warm-up`` builds (fixture ``agents_model``):
the random tiny Qwen3 taught, on each CLI's own prompts recorded in a
rehearsal (its real 1k-16k-token system prompt and tools), the tool call that
CLI accepts. It is a memoriser, not an agent: it answers the rehearsal's
instruction with the rehearsed command in every CLI, run where it was rehearsed
(see :mod:`support.cli_runs`); that is enough to drive each CLI through a real
multi-turn exchange on sampled tokens.

A logging proxy between the CLI and the gateway keeps the exact bytes the CLI
received. Each run must: exit 0 with the file written by the command the model
chose; make at least two calls; have a later prompt extend an earlier one token
for token (the gateway spliced the raw sampled ids in) after a tool call; and
every reply the CLI received must add up to what the recorded sampled ids decode
to (reasoning, text, tool calls).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.harness import RunSpec
from polar.harness.exchange import SHELL_EXCHANGES
from polar.proxy.engines.embedded import ModelRunner, create_engine_app
from polar.serverthread import ServerThread

from support.cli_runs import check_delivered, decoded_turn, extending, run_cli


@pytest.fixture(scope="module")
def engine(agents_model: Path) -> Iterator[str]:
    runner = ModelRunner(agents_model, max_batch=2)
    try:
        with ServerThread(create_engine_app(runner, served_name="tiny")) as server:
            yield server.url
    finally:
        runner.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SHELL_EXCHANGES))
def test_the_cli_does_a_multi_turn_tool_exchange_on_the_embedded_engine(
    name: str,
    engine: str,
    agents_model: Path,
    tmp_path: Path,
    make_spec: Callable[..., RunSpec],
    harness_cache: Path,
    tokenizer: Any,
) -> None:
    gateway = {
        "capture": "token_in_token_out",
        "engine": {"kind": "embedded", "base_url": engine, "model": "tiny"},
        "render": {"tokenizer": str(agents_model)},
    }
    run = run_cli(name, gateway, tmp_path, make_spec, harness_cache)
    print(
        f"{name}: {len(run.records)} calls, extends {len(extending(run.records))}, "
        f"exit {run.result.exit_code}"
    )
    check_delivered(run, tokenizer)

    # A real second turn: a prompt extends an earlier call token for token.
    pairs = extending(run.records)
    assert pairs, [(r.seq, r.lineage) for r in run.records]
    for later, base in pairs:
        assert later.lineage is not None and later.lineage.spliced
        sampled = base.prompt_ids + base.output_ids
        assert later.prompt_ids[: len(sampled)] == sampled
        # The call it extends asked for a tool; the CLI ran it and came back.
        assert decoded_turn(base, tokenizer)[1], tokenizer.decode(list(base.output_ids))

    assert run.result.exit_code == 0, run.detail
    assert (run.workdir / "proof.txt").read_text() == "polar\n"
