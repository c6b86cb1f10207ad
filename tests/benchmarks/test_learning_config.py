"""The learning benchmark's training config (``benchmarks/learning.py``): its
flags become a valid :class:`~polar.train.config.TrainConfig`, full fine-tuning
by default and LoRA adapters with ``--lora-r``. The benchmark itself is not run
here (a seed takes 35-45 minutes on two cores)."""

from __future__ import annotations

from pathlib import Path

from polar.train.config import TrainConfig

from support.paths import load_benchmark

learning = load_benchmark("learning")
SYNC = {
    "gateways": [{"url": "http://127.0.0.1:9", "admin_token": "a" * 32}],
    "engines": [{"kind": "embedded", "url": "http://127.0.0.1:9"}],
}


def config_for(argv: list[str], tmp_path: Path) -> TrainConfig:
    args = learning.parse_args(argv)
    config = learning.train_config(
        args, 3, ["pyfuncs/add/k16"], tmp_path, "http://127.0.0.1:9", "c" * 32, SYNC
    )
    assert isinstance(config, TrainConfig)
    return config


def test_the_defaults_fine_tune_every_weight_at_the_run_s_sampling(tmp_path: Path) -> None:
    config = config_for([], tmp_path)
    assert config.lora is None
    assert config.seed == 3 and config.steps == 8
    assert config.optim.lr == 5e-5
    assert config.rollout.sampling.temperature == 1.0
    assert (config.rollout.group_size, config.rollout.groups_per_step) == (8, 4)
    assert config.rollout.harness.name == "minicoder"
    assert config.rollout.harness.options["max_turns"] == 1
    assert config.eval.task_ids == ["pyfuncs/add/k16"] and config.eval.greedy
    assert config.eval.group_size == 2
    assert config.output_dir == tmp_path / "train"


def test_lora_r_trains_adapters_of_that_rank(tmp_path: Path) -> None:
    config = config_for(
        ["--lora-r", "16", "--lora-alpha", "16", "--lr", "3e-4", "--group-size", "8"], tmp_path
    )
    assert config.lora is not None
    assert (config.lora.r, config.lora.alpha) == (16, 16.0)
    assert config.optim.lr == 3e-4
    assert config.rollout.group_size == 8
