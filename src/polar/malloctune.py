"""The C allocator of a serving process: big buffers go back to the system.

glibc serves allocations of ``M_MMAP_THRESHOLD`` bytes or more (128 KiB at
first) with their own ``mmap``, unmapped when freed. But freeing one raises
the threshold to its size (up to 32 MiB), so after the first big request
every later buffer of that size comes from the heap of the thread that made
it, and the heaps keep what they held: one 1 MB user message in
token-in/token-out mode (its body, text, rendered prompt, half a million
token ids) grew a gateway by about 175 MB after a few requests, all of it
free memory the allocator kept (``malloc_trim`` gave it back). Setting the
threshold explicitly turns that adjustment off.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number (malloc.h)."""
MMAP_THRESHOLD_BYTES = 256 << 10


def pin_mmap_threshold(size: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``size`` bytes for this process; False
    where the C library is not glibc (nothing to do there)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, size))
