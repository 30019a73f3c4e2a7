"""The tree structures a decode step sees: one tree shared by every row, or one tree per row.

- :class:`StaticTree`: a calibrated / built-in :class:`medusa.tree.MedusaTree`'s buffers on one device
  (``[N]``-shaped fields, one tree for the whole batch), built once per (tree, device, dtype).
- :class:`RowTrees`: one step's trees, one per row (the same fields with a leading ``B``): the dynamic tree,
  the lookup-merged (hybrid) tree and any drafter that grows its own tree each step build it with
  :func:`tree_structure`.

The acceptance rules, the logits processors and the KV caches take either (:data:`VerifyTree`);
:func:`medusa.decoding.acceptance.rows_at` indexes both kinds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import torch

from medusa.tree import MedusaTree


@dataclass(eq=False)
class StaticTree:
    """All one decoding step needs about a static tree, on one device (built once per tree, device, dtype)."""

    per_row: ClassVar[bool] = False  # one tree shared by every row (a RowTrees has one per row)

    num_nodes: int  # N, root included
    depth: int  # D
    kmax: int  # top-k the heads must propose (max over depths)
    depths: torch.Tensor  # [N] long
    parents: torch.Tensor  # [N] long, root's parent clamped to 0
    children: torch.Tensor  # [N, kmax] long: child of node i with rank r, -1 if none
    retrieve: torch.Tensor  # [L, D+1] long, -1 padding replaced by 0
    retrieve_valid: torch.Tensor  # [L, D] bool: retrieve[:, 1:] is a real node
    topk_index: torch.Tensor  # [N-1] long: index of node i>=1 in the flattened [K * kmax] top-k table
    float_mask: torch.Tensor  # [N, N] 0 where node j is i or an ancestor of i, dtype-min elsewhere
    # [N, D+1] long: node index of node i's ancestor at each depth (i at its own), 0 past
    ancestors: torch.Tensor
    depth_list: list[int]  # node depths on the host (logits processing groups nodes by depth)

    @property
    def dtype(self) -> torch.dtype:
        """The attention mask's dtype (the decoding compute dtype)."""
        return self.float_mask.dtype


@dataclass(eq=False)
class RowTrees:
    """One step's per-row trees (the fields :class:`StaticTree` has, with a batch dimension)."""

    per_row: ClassVar[bool] = True  # fields carry a leading batch dimension (see acceptance.rows_at)

    num_nodes: int  # N, root included
    depth: int  # D
    kmax: int  # the most children a node can have
    tokens: torch.Tensor  # [B, N] long: node 0 is the root
    depths: torch.Tensor  # [B, N] long
    parents: torch.Tensor  # [B, N] long, root's parent 0
    children: torch.Tensor  # [B, N, kmax] long: child of node i with sibling rank r, -1 if none
    retrieve: torch.Tensor  # [B, N, D+1] long: path of each node (every node a candidate leaf), 0 padded
    retrieve_valid: torch.Tensor  # [B, N, D] bool: retrieve[..., 1:] is a real node
    ancestors: torch.Tensor  # [B, N, D+1] long: same as retrieve (the node itself at its own depth)
    float_mask: torch.Tensor  # [B, N, N] 0 where node j is i or an ancestor of i, dtype-min elsewhere

    @property
    def dtype(self) -> torch.dtype:
        """The attention mask's dtype (the decoding compute dtype)."""
        return self.float_mask.dtype


@dataclass(eq=False)
class TreeNodes:
    """A per-row tree before its tables: what a grower decides (the nodes, each one's parent and depth).
    :meth:`build` makes the :class:`RowTrees` the step verifies; a wrapper that adds nodes (the lookup
    chain) adds them here first, so each step's tree is built once."""

    tokens: torch.Tensor  # [B, N] long: node 0 is the root
    parents: torch.Tensor  # [B, N] long (parents first), root's parent 0
    depths: torch.Tensor  # [B, N] long
    depth: int  # D
    kmax: int  # the most children a node can have
    dtype: torch.dtype  # the float mask's

    def build(self) -> RowTrees:
        return tree_structure(self.tokens, self.parents, self.depths, self.depth, self.kmax, self.dtype)


VerifyTree = StaticTree | RowTrees  # what a step verifies and the acceptance rules read


def static_tree(tree: MedusaTree, device: torch.device, dtype: torch.dtype) -> StaticTree:
    """``tree``'s decoding buffers on ``device`` (float mask in ``dtype``), built once per (paths, device,
    dtype) and kept here (a small cache this module owns)."""
    return _static_tree(tuple(tuple(p) for p in tree.paths), str(device), dtype)


@functools.lru_cache(maxsize=64)
def _static_tree(paths: tuple[tuple[int, ...], ...], device: str, dtype: torch.dtype) -> StaticTree:
    tree = MedusaTree.from_choices([list(p) for p in paths[1:]])
    buf = tree.buffers(device)
    n, depth = len(tree), tree.depth
    kmax = max(tree.topk_per_depth, default=1)
    children = torch.full((n, kmax), -1, dtype=torch.long)  # [N, kmax]
    for i, path in enumerate(tree.paths[1:], start=1):
        children[tree.parents[i], path[-1]] = i
    retrieve = buf["retrieve_indices"]  # [L, D+1]
    ranks = buf["ranks"][1:]  # [N-1]
    depths = buf["depths"]
    ancestors = torch.zeros(n, depth + 1, dtype=torch.long)  # [N, D+1]
    index = {path: i for i, path in enumerate(tree.paths)}
    for i, path in enumerate(tree.paths):
        for d in range(1, len(path) + 1):
            ancestors[i, d] = index[tuple(path[:d])]
    float_mask = torch.zeros(n, n, dtype=dtype, device=device)  # [N, N]
    float_mask.masked_fill_(~buf["attention_mask"], torch.finfo(dtype).min)
    return StaticTree(
        num_nodes=n, depth=depth, kmax=kmax, depths=depths,
        parents=buf["parents"].clamp(min=0),
        children=children.to(device),
        retrieve=retrieve.clamp(min=0),
        retrieve_valid=retrieve[:, 1:] >= 0,
        topk_index=(depths[1:] - 1) * kmax + ranks,
        float_mask=float_mask,
        ancestors=ancestors.to(device),
        depth_list=[len(path) for path in tree.paths],
    )


def root_only_tree(device: torch.device, dtype: torch.dtype) -> StaticTree:
    """The root alone (the heads' part of a lookup-only tree)."""
    zero = torch.zeros(1, dtype=torch.long, device=device)
    return StaticTree(num_nodes=1, depth=0, kmax=1, depths=zero, parents=zero,
                      children=torch.full((1, 1), -1, dtype=torch.long, device=device),
                      retrieve=zero.view(1, 1),
                      retrieve_valid=torch.zeros(1, 0, dtype=torch.bool, device=device),
                      topk_index=zero[:0], float_mask=torch.zeros(1, 1, dtype=dtype, device=device),
                      ancestors=zero.view(1, 1), depth_list=[0])


def tree_structure(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, depth: int, kmax: int,
                   dtype: torch.dtype) -> RowTrees:
    """Ancestors, mask and children tables from ``parents [B, N]`` / ``depths [B, N]`` (parents first)."""
    b, n = tokens.shape
    device = tokens.device
    anc = torch.zeros(b, n, depth + 1, dtype=torch.long, device=device)  # [B, N, D+1]
    cur = torch.arange(n, device=device).expand(b, n).clone()  # [B, N]
    for _ in range(depth + 1):  # walk up: record each ancestor at its own depth
        anc.scatter_(2, depths.gather(1, cur).unsqueeze(-1), cur.unsqueeze(-1))
        cur = parents.gather(1, cur)
    valid = torch.arange(depth + 1, device=device).view(1, 1, -1) <= depths.unsqueeze(-1)  # [B, N, D+1]
    allowed = torch.zeros(b, n, n, device=device).scatter_add_(2, anc, valid.float()) > 0  # [B, N, N]
    float_mask = torch.zeros(b, n, n, dtype=dtype, device=device)
    float_mask.masked_fill_(~allowed, torch.finfo(dtype).min)  # [B, N, N]
    onehot = torch.zeros(b, n - 1, n, dtype=torch.long, device=device)  # [B, N-1, N]: child -> parent
    onehot.scatter_(2, parents[:, 1:].unsqueeze(-1), 1)  # (F.one_hot would check its input on the host)
    rank = (onehot.cumsum(1) * onehot).sum(-1) - 1  # [B, N-1] sibling rank
    children = torch.full((b, n * kmax), -1, dtype=torch.long, device=device)  # [B, N * kmax]
    children.scatter_(1, parents[:, 1:] * kmax + rank,
                      torch.arange(1, n, device=device).expand(b, n - 1))
    return RowTrees(n, depth, kmax, tokens, depths, parents, children.view(b, n, kmax), anc * valid,
                    valid[..., 1:], anc * valid, float_mask)


class Proposal:
    """One step's draft: ``tokens [B, N]`` (node 0 the root) in ``tree`` (a static tree shared by every row,
    or :class:`RowTrees`: the same fields with a leading ``B``), or in ``nodes`` (a :class:`TreeNodes`
    whose tables are built on the first read of ``tree``, so a wrapper adding nodes builds the tree once).
    ``draft_probs``: the distribution each node was drawn from, where drafts are sampled (the eagle3
    drafter under "sample" acceptance); None for deterministic drafts (top-k, lookup: point masses, so
    "sample" acceptance reads the target logits only)."""

    def __init__(self, tokens: torch.Tensor, tree: StaticTree | RowTrees | None = None,
                 draft_probs: torch.Tensor | None = None, nodes: TreeNodes | None = None) -> None:
        if tree is None and nodes is None:
            raise ValueError("a Proposal needs its tree or its nodes")
        self.tokens = tokens  # [B, N] long
        self.draft_probs = draft_probs  # [B, N, V] or None
        self.nodes = nodes
        self._tree = tree

    @property
    def tree(self) -> StaticTree | RowTrees:
        if self._tree is None:
            self._tree = self.nodes.build()
        return self._tree



__all__ = ["Proposal", "RowTrees", "StaticTree", "TreeNodes", "VerifyTree", "root_only_tree", "static_tree",
           "tree_structure"]
