"""Timing helpers shared by the measurements: device sync, a timed call, and one plain decode step.

On CUDA every timing brackets the work with ``torch.cuda.synchronize`` so that queued kernels are
counted; on the CPU the sync is a no-op.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from medusa.decoding.hf import cache_kwargs

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
    out = base(input_ids=input_ids, use_cache=True, **cache_kwargs(cache))
    first = out.logits[:, -1:].argmax(-1)  # [1, 1]
    start = input_ids.shape[1]

    def decode() -> None:
        tok = first
        for pos in range(start, start + steps):
            logits = base(input_ids=tok, use_cache=True, **cache_kwargs(cache),
                          position_ids=torch.tensor([[pos]], device=input_ids.device)).logits  # [1, 1, V]
            tok = logits[:, -1:].argmax(-1)

    _, seconds = timed(decode, input_ids.device)
    return seconds / steps


@torch.no_grad()
def forward_cost_curve(base: Any, sizes: tuple[int, ...] = (1, 4, 8, 16, 32, 64), cache_len: int = 200,
                       repeats: int = 5, seed: int = 0) -> dict[int, float]:
    """Seconds of one forward of ``n`` new tokens over a ``cache_len``-token KV cache, for each ``n``
    (the fastest of ``repeats``): what a tree of ``n`` nodes costs per verification step, which
    ``--nodes auto`` trades against the tokens it gains. The cache is cropped back after each call."""
    from medusa.decoding.kv_cache import new_cache

    device = next(base.parameters()).device
    vocab = base.config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (1, cache_len), generator=g).to(device)  # [1, cache_len]
    cache = new_cache()  # the cache tree decoding verifies against (written in place)
    base(input_ids=prompt, use_cache=True, **cache_kwargs(cache))
    curve: dict[int, float] = {}
    for n in sizes:
        ids = torch.randint(0, vocab, (1, n), generator=g).to(device)  # [1, n]
        positions = torch.arange(cache_len, cache_len + n, device=device).view(1, n)
        best = float("inf")
        for _ in range(repeats + 1):  # the first call warms up this shape
            _, seconds = timed(lambda: base(input_ids=ids, use_cache=True, **cache_kwargs(cache),
                                            position_ids=positions), device)
            cache.crop(-n)  # drop the n tokens just written (transformers 5: a negative count)
            best = min(best, seconds)
        curve[n] = best
    return curve


__all__ = ["forward_cost_curve", "plain_step_time", "sync", "timed"]
