"""``torch.compile`` of the decode step's device functions (:mod:`medusa.decoding.step`).

The step is the one eager step function; compiled decoding hands it :class:`medusa.decoding.step.StepFns`
whose ``propose_verify`` (heads + candidate tree, tree mask columns, the base forward) and, on the static
cache, the compaction are wrapped by ``torch.compile`` with ``dynamic=False``: one graph per
(proposer, batch size, tree size, cache-length bucket). Nothing in them depends on the step (the cache
length is a device tensor), so decoding never recompiles from step to step. The run's scorer is wrapped
too: a greedy scorer without logits processors gets its rule compiled (:func:`compiled_scorer`). On CUDA
``mode="reduce-overhead"`` (CUDA graphs); inductor elsewhere. The wrappers are built once per model and
device and kept here, in a table this module owns (weakly keyed by the model).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import torch

from medusa.decoding.acceptance import Scorer, greedy_accept
from medusa.decoding.static_cache import Compact, compact
from medusa.decoding.step import StepFns, propose_verify, verify

# model -> {"<device>/<name>": torch.compile wrapper}: built once per model and device
_WRAPPERS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def compile_mode(device: torch.device) -> str | None:
    """``"reduce-overhead"`` (CUDA graphs) on CUDA, inductor's default elsewhere."""
    return "reduce-overhead" if device.type == "cuda" else None


def _compiled(model: Any, name: str, fn: Any) -> Any:
    """``torch.compile(fn)`` for ``model``'s device, built once per model and device."""
    key = f"{model.device}/{name}"
    table = _WRAPPERS.setdefault(model, {})
    if key not in table:
        table[key] = torch.compile(fn, dynamic=False, mode=compile_mode(model.device), fullgraph=False)
    return table[key]


def step_functions(model: Any, compile: bool) -> StepFns:
    """The step's device function for ``model``: the plain one, or compiled."""
    if not compile:
        return StepFns()
    return StepFns(_compiled(model, "propose_verify", propose_verify), compiled=True)


def compiled_scorer(model: Any, scorer: Scorer) -> Scorer:
    """The same scorer with its greedy rule compiled (a pure scorer: greedy, no logits processors); others
    unchanged (processors and sampling read host state and a generator)."""
    if not scorer.pure:
        return scorer
    return dataclasses.replace(scorer, greedy_rule=_compiled(model, "greedy", greedy_accept))


def compact_function(model: Any, compile: bool) -> Compact:
    """The static cache's compaction: :func:`medusa.decoding.static_cache.compact`, or compiled."""
    return _compiled(model, "compact", compact) if compile else compact


def verify_function(model: Any, compile: bool) -> Any:
    """The verification forward alone (:func:`medusa.decoding.step.verify`), or compiled: what
    ``benchmarks/gpu.py`` times."""
    return _compiled(model, "verify", verify) if compile else verify


__all__ = ["compact_function", "compile_mode", "compiled_scorer", "step_functions", "verify_function"]
