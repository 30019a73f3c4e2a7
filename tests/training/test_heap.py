"""medusa/training/heap.py: on Linux with glibc the trimmer is glibc's ``malloc_trim`` and
``trim_heap`` reaches it (the fix for the heap growth of varying-length batches); elsewhere it is a no-op."""

import platform
import sys

import pytest

from medusa.training import heap


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="malloc_trim is glibc's")
def test_glibc_has_a_trimmer():
    trimmer = heap.heap_trimmer()
    assert trimmer is not None and trimmer() in (0, 1)
    assert heap.trim_heap() in (0, 1)


def test_no_trimmer_off_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert heap.heap_trimmer() is None
