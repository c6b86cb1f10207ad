"""The one device setting (``polar.device``): spellings, what each names on this
machine, and the memory a model may use there."""

from __future__ import annotations

import pytest
import torch

from polar.device import DeviceError, check_device, device_memory, resolve_device

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


@pytest.mark.parametrize("value", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_the_device_spellings_are_accepted(value: str) -> None:
    assert check_device(value) == value


@pytest.mark.parametrize("value", ["gpu", "CUDA", "cuda:", "cuda:x", "cpu:0", "mps", ""])
def test_other_spellings_are_refused_naming_the_ones_that_work(value: str) -> None:
    with pytest.raises(ValueError, match="use auto, cpu, cuda or cuda:N"):
        check_device(value)


@NO_GPU
def test_auto_is_the_cpu_on_a_machine_without_a_gpu() -> None:
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@NO_GPU
@pytest.mark.parametrize("value", ["cuda", "cuda:1"])
def test_a_gpu_that_is_not_there_is_an_error_not_the_cpu(value: str) -> None:
    with pytest.raises(DeviceError, match=f"device {value}: torch sees no CUDA GPU"):
        resolve_device(value)


def test_the_cpus_memory_is_the_machines() -> None:
    assert device_memory(torch.device("cpu")) > 1 << 30
