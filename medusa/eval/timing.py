"""Timing helpers shared by the measurements: device sync, a timed call, and one plain decode step.

On CUDA every timing brackets the work with ``torch.cuda.synchronize`` so that queued kernels are
counted; on the CPU the sync is a no-op.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA only)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """``fn()`` and the seconds it took, the device synchronised before and after."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


@torch.no_grad()
def plain_step_time(base: Any, input_ids: torch.Tensor, steps: int = 32) -> float:
    """Mean seconds of one single-token forward with a growing DynamicCache (greedy continuation).

    ``input_ids``: ``[1, P]``, the prompt; its prefill is not timed."""
    from transformers import DynamicCache

    cache = DynamicCache()
    out = base(input_ids=input_ids, past_key_values=cache, use_cache=True)
    first = out.logits[:, -1:].argmax(-1)  # [1, 1]
    start = input_ids.shape[1]

    def decode() -> None:
        tok = first
        for pos in range(start, start + steps):
            logits = base(input_ids=tok, past_key_values=cache, use_cache=True,
                          position_ids=torch.tensor([[pos]], device=input_ids.device)).logits  # [1, 1, V]
            tok = logits[:, -1:].argmax(-1)

    _, seconds = timed(decode, input_ids.device)
    return seconds / steps


__all__ = ["plain_step_time", "sync", "timed"]
