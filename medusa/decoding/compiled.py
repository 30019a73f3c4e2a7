"""``torch.compile`` of the static verification step (:mod:`medusa.decoding.static_cache`).

``verify`` (tree forward) and ``finish`` (heads, compaction, mask update) are compiled with ``dynamic=False``:
one graph per (batch size, tree size, cache-length bucket); nothing in them depends on the step (the cache
length is a device tensor), so decoding never recompiles from step to step. Greedy acceptance without
logits processors is compiled too. On CUDA ``mode="reduce-overhead"`` (CUDA graphs); inductor elsewhere.
The functions are built once per model (``model.__dict__``), the compiled graphs once per shapes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from medusa.decoding.acceptance import greedy_accept
from medusa.decoding.static_cache import StepFns, finish, verify


def compile_mode(device: torch.device) -> str | None:
    """``"reduce-overhead"`` (CUDA graphs) on CUDA, inductor's default elsewhere."""
    return "reduce-overhead" if device.type == "cuda" else None


def _compile(fn: Any, device: torch.device) -> Any:
    return torch.compile(fn, dynamic=False, mode=compile_mode(device), fullgraph=False)


def step_functions(model: Any, compile: bool) -> StepFns:
    """The static step's functions for ``model``: eager, or compiled (built once per model and device)."""
    if not compile:
        return StepFns()
    device = model.device
    cache = model.__dict__.setdefault("_medusa_compiled", {})
    key = str(device)
    if key not in cache:
        cache[key] = StepFns(_compile(verify, device), _compile(finish, device), compiled=True)
    return cache[key]


def with_greedy(fns: StepFns, model: Any, dt: Any) -> StepFns:
    """``fns`` whose acceptance is compiled greedy acceptance over ``dt`` (runs without logits processors)."""
    cache = model.__dict__.setdefault("_medusa_compiled", {})
    if "greedy" not in cache:
        cache["greedy"] = _compile(greedy_accept, model.device)
    greedy = cache["greedy"]
    return dataclasses.replace(fns, accept=lambda logits, tokens: greedy(logits, tokens, dt))


__all__ = ["compile_mode", "step_functions", "with_greedy"]
