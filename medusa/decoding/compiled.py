"""``torch.compile`` of the decode step's device functions (:mod:`medusa.decoding.step`).

The step is the one eager step function; compiled decoding hands it :class:`medusa.decoding.step.StepFns`
whose ``propose_verify`` (heads + candidate tree, tree mask columns, the base forward) and, on the static
cache, the compaction are wrapped by ``torch.compile`` with ``dynamic=False``: one graph per
(proposer, batch size, tree size, cache-length bucket). Nothing in them depends on the step (the cache
length is a device tensor), so decoding never recompiles from step to step. Greedy acceptance without
logits processors is compiled too. On CUDA ``mode="reduce-overhead"`` (CUDA graphs); inductor elsewhere.
The wrappers are built once per model and device and held by the model (``model.decoding_cache``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from medusa.decoding.acceptance import greedy_accept
from medusa.decoding.static_cache import Compact, compact
from medusa.decoding.step import StepFns, propose_verify, verify


def compile_mode(device: torch.device) -> str | None:
    """``"reduce-overhead"`` (CUDA graphs) on CUDA, inductor's default elsewhere."""
    return "reduce-overhead" if device.type == "cuda" else None


def _compiled(model: Any, name: str, fn: Any) -> Any:
    """``torch.compile(fn)`` for ``model``'s device, built once and kept in ``model.decoding_cache``."""
    key = f"compiled/{model.device}/{name}"
    cache = model.decoding_cache
    if key not in cache:
        cache[key] = torch.compile(fn, dynamic=False, mode=compile_mode(model.device), fullgraph=False)
    return cache[key]


def step_functions(model: Any, compile: bool, greedy: bool = False) -> StepFns:
    """The step's device functions for ``model``: the plain ones, or compiled (``greedy``: compiled greedy
    acceptance too, for runs without logits processors)."""
    if not compile:
        return StepFns()
    fns = StepFns(_compiled(model, "propose_verify", propose_verify), compiled=True)
    if greedy:
        fns = dataclasses.replace(fns, accept=_compiled(model, "greedy", greedy_accept))
    return fns


def compact_function(model: Any, compile: bool) -> Compact:
    """The static cache's compaction: :func:`medusa.decoding.static_cache.compact`, or compiled."""
    return _compiled(model, "compact", compact) if compile else compact


def verify_function(model: Any, compile: bool) -> Any:
    """The verification forward alone (:func:`medusa.decoding.step.verify`), or compiled: what
    ``medusa.pipelines.gpu`` times."""
    return _compiled(model, "verify", verify) if compile else verify


__all__ = ["compact_function", "compile_mode", "step_functions", "verify_function"]
