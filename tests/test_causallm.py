"""A model directory loads as a causal LM in the dtype its caller names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from polar.causallm import load_causal_lm
from polar.tinymodel.build import build_tiny_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_weights_are_in_the_dtype_asked_for(tiny_model: Path, dtype: torch.dtype) -> None:
    model = load_causal_lm(tiny_model, dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert type(model).__name__ == "Qwen3ForCausalLM"


def test_a_directory_without_a_model_raises_transformers_own_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Unrecognized model"):
        load_causal_lm(tmp_path, dtype=torch.float32)
