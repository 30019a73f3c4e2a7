"""Accuracy-ranked sparse trees: the greedy builder and the documented default accuracy profile."""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence


def build_tree_choices(accuracy: Sequence[Sequence[float]], num_nodes: int, max_depth: int | None = None,
                       frequencies: Mapping[tuple[int, ...], float] | None = None) -> list[tuple[int, ...]]:
    """Greedy accuracy-ranked tree of ``num_nodes`` nodes (root included): the one tree builder.

    ``accuracy[k][r]`` is the probability that head k+1's rank-r token is right (given the path so far).
    Repeatedly adds the node, a child of a node already in the tree, with the largest value: the product of
    accuracies along its path, or, with ``frequencies`` (measured acceptance frequency of each path;
    unseen paths 0), the frequency first and the product only to break ties. Both values never grow from
    a node to its children, so the tree is prefix-closed and, for the product, maximises
    :func:`expected_tokens_per_step` among trees of its size. Returns the choices (root excluded), best first.
    """
    depth_limit = len(accuracy) if max_depth is None else min(max_depth, len(accuracy))
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    freq = frequencies or {}

    def entry(path: tuple[int, ...], prior: float) -> tuple[float, float, tuple[int, ...]]:
        return (-float(freq.get(path, 0.0)), -prior, path)  # heapq pops the smallest: the best node

    frontier: list[tuple[float, float, tuple[int, ...]]] = []
    if depth_limit >= 1:
        for r, a in enumerate(accuracy[0]):
            heapq.heappush(frontier, entry((r,), float(a)))
    chosen: list[tuple[int, ...]] = []
    while frontier and len(chosen) + 1 < num_nodes:
        _, neg_prior, path = heapq.heappop(frontier)
        chosen.append(path)
        if len(path) < depth_limit:
            for r, a in enumerate(accuracy[len(path)]):
                heapq.heappush(frontier, entry(path + (r,), -neg_prior * float(a)))
    return chosen


def expected_tokens_per_step(choices: Sequence[Sequence[int]], accuracy: Sequence[Sequence[float]]) -> float:
    """1 (the root, always accepted) + sum over nodes of the product of accuracies along its path."""
    total = 1.0
    for path in choices:
        value = 1.0
        for depth, rank in enumerate(path):
            value *= float(accuracy[depth][rank]) if rank < len(accuracy[depth]) else 0.0
        total += value
    return total


def default_accuracy_profile(num_heads: int = 5, topk: int = 10) -> list[list[float]]:
    """The accuracy profile behind the built-in default tree.

    Top-1 / top-5 accuracies per head measured on held-out text for 5 heads x 2 ResBlocks trained on a
    small Llama's self-distilled data (DESIGN.md: top-1 0.73 / 0.58 / 0.47 / 0.41 / 0.35, top-5
    0.93 / 0.83 / 0.73 / 0.65 / 0.59), close in shape to the MEDUSA paper's Vicuna-7B heads. Ranks 2..5
    share ``top5 - top1`` geometrically (ratio 0.5); ranks past 5 continue the same decay. Heads past
    the fifth repeat the fifth head's accuracy times 0.85 per extra step.
    """
    top1 = [0.73, 0.58, 0.47, 0.41, 0.35]
    top5 = [0.93, 0.83, 0.73, 0.65, 0.59]
    ratio = 0.5
    weights = [ratio ** i for i in range(4)]  # ranks 1..4 (0-based) within top-5
    profile: list[list[float]] = []
    for k in range(num_heads):
        scale = 0.85 ** max(0, k - 4)
        a1, a5 = top1[min(k, 4)] * scale, top5[min(k, 4)] * scale
        rest = [(a5 - a1) * w / sum(weights) for w in weights]
        row = [a1] + rest
        while len(row) < topk:
            row.append(row[-1] * ratio)
        profile.append(row[:topk])
    return profile


def default_tree_choices(num_heads: int, num_nodes: int = 64) -> list[tuple[int, ...]]:
    """The built-in tree for uncalibrated checkpoints: the greedy builder on the default profile."""
    return build_tree_choices(default_accuracy_profile(num_heads), num_nodes)
