"""``torch.compile`` of the static verification step (:mod:`medusa.decoding.static_cache`).

``verify`` (tree forward) and ``finish`` (heads, compaction, mask update; for Hydra heads and dynamic trees
:func:`medusa.decoding.static_dynamic.finish_propose`, which builds the whole next proposal) are compiled with
``dynamic=False``:
one graph per (batch size, tree size, cache-length bucket); nothing in them depends on the step (the cache
length is a device tensor), so decoding never recompiles from step to step. Greedy acceptance without
logits processors is compiled too. On CUDA ``mode="reduce-overhead"`` (CUDA graphs); inductor elsewhere.
The functions are built once per model (``model.__dict__``), the compiled graphs once per shapes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from medusa.decoding.acceptance import greedy_accept
from medusa.decoding.candidates import DecodeTree
from medusa.decoding.dynamic_tree import DynamicTree
from medusa.decoding.static_cache import (
    StepFns,
    finish,
    static_capacity,
    static_prefill,
    static_step,
    verify,
)
from medusa.decoding.static_dynamic import finish_propose, proposal_prefill, proposal_step
from medusa.modeling.hydra import needs_tokens


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


def proposal_functions(model: Any, compile: bool, greedy: bool) -> StepFns:
    """The Hydra / dynamic-tree step's functions (:mod:`medusa.decoding.static_dynamic`): ``finish`` builds
    the next proposal; ``greedy``: compiled greedy acceptance over the step's tree (no logits processors)."""
    fns = dataclasses.replace(step_functions(model, compile), finish=finish_propose)
    if not compile:
        return fns
    cache = model.__dict__.setdefault("_medusa_compiled", {})
    key = f"{model.device}/propose"
    if key not in cache:
        cache[key] = _compile(finish_propose, model.device)
    fns = dataclasses.replace(fns, finish=cache[key])
    if greedy:
        if "greedy" not in cache:
            cache["greedy"] = _compile(greedy_accept, model.device)
        fns = dataclasses.replace(fns, accept=cache["greedy"])
    return fns


def static_path(model: Any, dt: DecodeTree | DynamicTree, shape: tuple[int, int], max_new_tokens: int,
                compile: bool, greedy: bool) -> tuple[Callable, Callable, int]:
    """(prefill, step, cache capacity) of the static-cache path for a prompt of ``shape`` ``(B, P)``;
    ``greedy``: greedy acceptance without logits processors (compiled too when ``compile``)."""
    b, p = shape
    capacity = static_capacity(p, max_new_tokens, b, dt)
    if isinstance(dt, DynamicTree) or needs_tokens(model.heads):
        fns = proposal_functions(model, compile, greedy)
        return proposal_prefill, functools.partial(proposal_step, fns=fns), capacity
    fns = step_functions(model, compile)
    if compile and greedy:
        fns = with_greedy(fns, model, dt)
    return static_prefill, functools.partial(static_step, fns=fns), capacity


__all__ = ["compile_mode", "proposal_functions", "static_path", "step_functions", "with_greedy"]
