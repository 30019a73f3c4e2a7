"""Calibrating an autoregressive drafter's tree (eagle3 heads): depth, branching, nodes and the lookup chain.

A drafter's tree is grown anew each step, so its size cannot be read off per-head accuracies as a MEDUSA
tree's is. Each candidate :class:`~medusa.tree.draft_tree.DraftTreeShape` is run for real instead: greedy
decoding of the held-out calibration prompts (the real step: drafting, verification, acceptance), which
gives its tokens per step on those prompts and its time per step on this device — drafting's ``depth``
draft-layer passes included. The candidate with the most tokens per second (tokens per step / step time)
wins; the record of every candidate goes into ``tree.json``'s ``calibration``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from medusa.decoding.generate import compute_dtype, medusa_generate
from medusa.errors import MedusaError
from medusa.tree.draft_tree import DraftTreeShape

# (num_nodes, depth, branch, expand): a grid for a CPU, <= 16 verified nodes; lookup chains added on top.
# The shallow ones (depth 2-3) pay where each verified node and drafting level costs compute (AVX-512
# without AMX: ~0.4 ms a node, ~0.6 ms a level for SmolLM2).
CANDIDATES = ((4, 2, 2, 2), (4, 3, 1, 1), (6, 3, 2, 2), (6, 4, 2, 2), (8, 3, 2, 2), (8, 4, 2, 2),
              (8, 5, 2, 2), (12, 5, 3, 3), (16, 5, 4, 4), (16, 6, 4, 4))
LOOKUP_CHOICES = (0, 6, 10)
# the fastest shape tried again with its tree cut where the drafter doubts (DraftTreeShape.min_prob)
MIN_PROB_CHOICES = (0.02, 0.05, 0.1)


def candidate_shapes(candidates: Sequence[tuple[int, int, int, int]] = CANDIDATES,
                     lookup: Sequence[int] = LOOKUP_CHOICES,
                     nodes: int | None = None) -> list[DraftTreeShape]:
    """The shapes tried: each (nodes, depth, branch, expand) with each lookup-chain length. ``nodes``
    (``--nodes N``): every grid (depth, branch, expand) that can draft N nodes, at N nodes (a wider one when
    none can)."""
    if nodes is not None:
        if nodes < 2:
            raise MedusaError(f"--nodes {nodes}: an eagle3 draft tree verifies the root and at least one "
                              "drafted node (--nodes >= 2)")
        grid = sorted({(nodes, d, b, e) for _, d, b, e in candidates
                       if DraftTreeShape(2, d, b, e).pool_size >= nodes - 1})
        width = 1
        while not grid:  # wider than the grid: depth 6, branch = expand, the narrowest that holds them
            width += 1
            grid = [(nodes, 6, width, width)] if width + 5 * width * width >= nodes - 1 else []
        candidates = grid
    return [DraftTreeShape(n, d, b, e, lookup_tokens=L) for n, d, b, e in candidates for L in lookup]


@torch.no_grad()
def decode_figures(model: Any, ids: torch.Tensor, shape: DraftTreeShape, max_new_tokens: int
                   ) -> tuple[int, int, float]:
    """Greedy decoding of one prompt ``[1, P]`` with ``shape``: (tokens, steps, decode seconds; prefill
    excluded)."""
    out = medusa_generate(model, ids, max_new_tokens=max_new_tokens, tree=shape, return_dict_in_generate=True)
    return (int(sum(int(a) for row in out.accept_lengths for a in row)), int(out.num_steps),
            float(out.decode_time_s))


def figures_of(tokens: int, steps: int, seconds: float) -> dict[str, float]:
    """Tokens per step, ms per step and tokens per second of a candidate's totals."""
    if not steps:
        raise MedusaError("calibration decoded no step: the prompts end at once; use other --data")
    return {"tokens_per_step": tokens / steps, "step_ms": 1e3 * seconds / steps,
            "tokens_per_s": tokens / max(seconds, 1e-9)}


@torch.no_grad()
def measure_shape(model: Any, prompts: Sequence[torch.Tensor], shape: DraftTreeShape,
                  max_new_tokens: int) -> dict[str, float]:
    """Greedy decoding of each prompt ``[1, P]`` with ``shape``: tokens per step and seconds per step
    (decode time, prefill excluded) over all prompts."""
    return measure_shapes(model, prompts, [shape], max_new_tokens)[0]


@torch.no_grad()
def measure_shapes(model: Any, prompts: Sequence[torch.Tensor], shapes: Sequence[DraftTreeShape],
                   max_new_tokens: int, progress: bool = False) -> list[dict[str, float]]:
    """:func:`measure_shape` of every shape, prompt by prompt: each prompt is decoded with every shape in
    turn (the order rotated from one prompt to the next), so a slow minute of a shared machine falls on
    all candidates alike instead of on the few timed during it. ``progress``: a bar with its ETA."""
    from tqdm.auto import tqdm

    totals = [[0, 0, 0.0] for _ in shapes]
    with tqdm(total=len(prompts) * len(shapes), desc="calibrate", unit="run", disable=not progress) as bar:
        for i, ids in enumerate(prompts):
            for j in [(i + k) % len(shapes) for k in range(len(shapes))]:
                for column, value in enumerate(decode_figures(model, ids, shapes[j], max_new_tokens)):
                    totals[j][column] += value
                bar.update(1)
    return [figures_of(*row) for row in totals]


def fastest(rows: Sequence[dict[str, float]]) -> int:
    """The index of the row of most ``tokens_per_s`` (the first of equals): what decoding speed ranks by,
    not tokens per step (a bigger tree accepts more per step but may cost more per step than it gains)."""
    return max(range(len(rows)), key=lambda i: (rows[i]["tokens_per_s"], -i))


def calibrate_draft_tree(model: Any, prompts: Sequence[torch.Tensor], max_new_tokens: int = 96,
                         shapes: Sequence[DraftTreeShape] | None = None,
                         log: Callable[[str], None] = print, progress: bool = False,
                         min_probs: Sequence[float] = MIN_PROB_CHOICES) -> DraftTreeShape:
    """The fastest of ``shapes`` (default :func:`candidate_shapes`) on ``prompts`` (token-id tensors
    ``[1, P]``), with every candidate's figures in its ``calibration`` record. Then that shape is timed
    again beside itself cut at each of ``min_probs`` (a second round, all in turn: the choice among them
    compares figures of the same minutes) and the fastest of those is kept."""
    if not prompts:
        raise MedusaError("calibrating a draft tree needs at least one prompt")
    shapes = list(shapes or candidate_shapes())
    t0 = time.perf_counter()
    measure_shape(model, prompts[:1], shapes[0], 8)  # warm-up: allocations, first-call overheads
    rows = timed_rows(model, prompts, shapes, max_new_tokens, progress, log)
    best = fastest(rows)
    chosen, figures = shapes[best], rows[best]
    if min_probs and chosen.min_prob == 0:
        trials = [chosen, *(replace(chosen, min_prob=float(p), calibration=None) for p in min_probs)]
        again = timed_rows(model, prompts, trials, max_new_tokens, progress, log)
        rows += again
        cut = fastest(again)
        chosen, figures = trials[cut], again[cut]
    record = {"method": "greedy decoding of the calibration prompts, each candidate timed "
              "(prompt by prompt, all candidates in turn), then the fastest cut at each min_prob",
              "prompts": len(prompts), "max_new_tokens": max_new_tokens,
              "torch_threads": torch.get_num_threads(), "seconds": round(time.perf_counter() - t0, 1),
              "dtype": str(compute_dtype(model)).removeprefix("torch."),  # bf16 trees are timed in bf16
              "drafter_dtype": str(getattr(model.heads, "dtype", "")).removeprefix("torch."),  # drafted in
              "expected_tokens_per_step": figures["tokens_per_step"], "candidates": rows}
    return replace(chosen, calibration=record)


def timed_rows(model: Any, prompts: Sequence[torch.Tensor], shapes: Sequence[DraftTreeShape],
               max_new_tokens: int, progress: bool, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """:func:`measure_shapes` of ``shapes``, one record row (the shape's sizes and its figures) and one log
    line each."""
    rows = []
    for shape, figures in zip(shapes, measure_shapes(model, prompts, shapes, max_new_tokens, progress),
                             strict=True):
        rows.append({**{k: v for k, v in shape.to_dict().items()
                        if k in ("num_nodes", "depth", "branch", "expand", "lookup_tokens", "min_prob")},
                     **figures})
        cut = f" min_prob {shape.min_prob:g}" if shape.min_prob else ""
        log(f"  nodes {shape.num_nodes:3d} depth {shape.depth} branch {shape.branch} expand {shape.expand} "
            f"lookup {shape.lookup_tokens:2d}{cut}: {figures['tokens_per_step']:.2f} tokens/step, "
            f"{figures['step_ms']:.1f} ms/step, {figures['tokens_per_s']:.1f} tokens/s")
    return rows


__all__ = ["CANDIDATES", "LOOKUP_CHOICES", "MIN_PROB_CHOICES", "calibrate_draft_tree", "candidate_shapes",
           "decode_figures", "fastest", "figures_of", "measure_shape", "measure_shapes", "timed_rows"]
