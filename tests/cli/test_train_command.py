"""``polar train`` as a user runs it: a bad config is one line naming the field
and a non-zero exit, before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from polar.configfile import ConfigError
from polar.train.config import load_train_config
from polar.train.reload import WeightSyncError
from polar.train.trainer import train

GOOD = """
model: {model}
steps: 2
rollout:
  tasks: builtin
  harness: {{name: shell, options: {{command: "true"}}}}
weight_sync:
  gateways: [{{url: "http://127.0.0.1:9", admin_token: "0123456789abcdef"}}]
  engines: [{{kind: embedded, url: "http://127.0.0.1:9"}}]
"""


def polar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polar", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )


BAD = [
    (("steps: 2", "steps: 0"), "steps"),
    (("tasks: builtin", "tasks: builtin\n  group_size: 0"), "rollout.group_size"),
    # a group of one session has nothing to compare with: it can never train
    (("tasks: builtin", "tasks: builtin\n  group_size: 1"), "rollout.group_size"),
    (('127.0.0.1:9"}]', '127.0.0.1:9"}]\n  on_push_failure: retry'), "on_push_failure"),
    (('127.0.0.1:9"}]', '127.0.0.1:9"}]\n  push_retries: -1'), "weight_sync.push_retries"),
    (("kind: embedded", "kind: tgi"), "weight_sync.engines.0.kind"),
    (("steps: 2", "steps: 2\ngrpo: {clip_low: 1.5}"), "grpo.clip_low"),
    (("steps: 2", "steps: 2\nlearning_rate: 1"), "learning_rate"),
    (('"http://127.0.0.1:9", admin', '"127.0.0.1:9", admin'), "weight_sync.gateways.0.url"),
    (("steps: 2", "steps: 2\ndevice: gpu"), "device"),
    (("steps: 2", "steps: 2\noptim: {packing: yes}"), "optim.packing"),
    (("steps: 2", "steps: 2\nlora: {r: 0}"), "lora.r"),
    (("kind: embedded", "kind: sglang"), "lora: adapters are pushed to embedded and vLLM"),
]


@pytest.mark.parametrize(("edit", "field"), BAD)
def test_a_bad_config_names_the_field(tmp_path: Path, edit: tuple[str, str], field: str) -> None:
    config = tmp_path / "train.yaml"
    text = GOOD.format(model=tmp_path).replace(*edit)
    if "sglang" in edit[1]:
        text += "lora: {r: 8}\n"
    config.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_train_config(config)
    (line,) = str(caught.value).splitlines()
    assert field in line, line


def test_polar_train_with_a_bad_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "train.yaml"
    config.write_text(GOOD.format(model=tmp_path).replace("steps: 2", "steps: 0"))
    result = polar("train", str(config))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("polar train: error: ") and "train.yaml: steps: " in line, line
    assert not (tmp_path / "runs").exists()


def test_an_unreachable_gateway_stops_the_run_at_start(tmp_path: Path) -> None:
    """Before the model loads or anything is submitted (in-process: the CLI's
    error path is the test above)."""
    config = tmp_path / "train.yaml"
    config.write_text(GOOD.format(model=tmp_path) + f"output_dir: {tmp_path / 'run'}\n")
    with pytest.raises(WeightSyncError, match=r"^gateway at http://127.0.0.1:9: GET /admin/status"):
        train(load_train_config(config))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a GPU-less machine")
def test_polar_train_on_a_gpu_that_is_not_there_says_so_before_anything_starts(
    tmp_path: Path,
) -> None:
    config = tmp_path / "train.yaml"
    config.write_text(GOOD.format(model=tmp_path) + f"output_dir: {tmp_path / 'run'}\n")
    result = polar("train", str(config), "--device", "cuda:1")
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line == (
        "polar train: error: device cuda:1: torch sees no CUDA GPU on this machine "
        "(use auto or cpu)"
    )
