"""Freed heap memory handed back to the OS after each optimizer step (glibc's ``malloc_trim``).

Batches of varying lengths (``group_by_length``, a hidden-state cache read per batch) allocate tensors of
many sizes; glibc keeps the freed chunks of its heap for reuse, and with sizes that rarely repeat the heap
only grows. Measured on the EAGLE-3 drafter trained from the SmolLM2 hidden-state cache (2 processes, batch
8, up to 768 tokens, 2026-11-28): each process's anonymous memory grew ~25 MB per step, to 11.5 GB at step
520, and the OOM killer ended the run (docs/results/data-plan.md, round 5)."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable


def heap_trimmer() -> Callable[[], int] | None:
    """A function that returns the heap's free memory to the OS (glibc ``malloc_trim(0)``; 1 if some was
    returned), or None where the C library has none (not Linux, or musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


_TRIM = heap_trimmer()


def trim_heap() -> int:
    """Return the heap's free memory to the OS where the C library can (1 if some was returned, else 0)."""
    return 0 if _TRIM is None else _TRIM()


__all__ = ["heap_trimmer", "trim_heap"]
