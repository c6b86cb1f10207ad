"""Where a model runs: the one ``device`` setting of ``polar train``, ``polar sft``
and ``polar engine serve`` (``auto``, ``cpu``, ``cuda`` or ``cuda:N``).

- :func:`check_device` validates the spelling without importing torch (configs
  and flags call it);
- :func:`resolve_device` turns a setting into a ``torch.device`` on this
  machine: ``auto`` is the first GPU when torch sees one, else the CPU; a
  GPU that is not there is a :class:`DeviceError` (one line), never a silent
  fall back to the CPU;
- :func:`device_memory` is how many bytes a model may use there (a GPU's total
  memory, or the machine's physical memory for the CPU), for the trainer's
  memory estimate (:mod:`polar.train.memory`).

A checkpoint records no device: tensors are saved as they are and loaded with
``map_location`` onto the device of the run that resumes them
(:mod:`polar.train.checkpoint`), so a run written on a GPU resumes on a CPU
and the reverse.

Imports nothing from Polar; torch is imported when used.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

AUTO = "auto"
_SPELLING = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class DeviceError(Exception):
    """The device setting names a device this machine does not have (one line)."""


def check_device(value: str) -> str:
    """``value`` if it is ``auto``, ``cpu``, ``cuda`` or ``cuda:N``; else ValueError."""
    if not _SPELLING.match(value):
        raise ValueError(f"{value!r} is not a device: use auto, cpu, cuda or cuda:N")
    return value


def resolve_device(value: str) -> torch.device:
    """The ``torch.device`` the setting names on this machine (see the module docstring)."""
    import torch

    check_device(value)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if value == AUTO:
        return torch.device("cuda:0" if gpus else "cpu")
    if value == "cpu":
        return torch.device("cpu")
    index = int(value.partition(":")[2] or 0)
    if not gpus:
        raise DeviceError(
            f"device {value}: torch sees no CUDA GPU on this machine (use auto or cpu)"
        )
    if index >= gpus:
        raise DeviceError(
            f"device {value}: this machine has {gpus} CUDA GPU(s), cuda:0..{gpus - 1}"
        )
    return torch.device("cuda", index)


def device_memory(device: torch.device) -> int:
    """Bytes a model may use on ``device``: a GPU's total memory, or the machine's
    physical memory for the CPU."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
