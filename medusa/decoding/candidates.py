"""Tree buffers for decoding and candidate construction (root token + heads' top-k tokens per node)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from medusa.tree import MedusaTree


@dataclass
class DecodeTree:
    """All one decoding step needs about the tree, on one device, built once per (tree, device, dtype)."""

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
    # Hydra heads' growth plan (medusa.decoding.hydra_candidates.hydra_levels), built once on first use
    hydra_levels: list[Any] | None = field(default=None, compare=False)
    per_row: ClassVar[bool] = False  # one tree shared by every row (a StepTree has one per row)

    @property
    def dtype(self) -> torch.dtype:
        """The attention mask's dtype (the decoding compute dtype)."""
        return self.float_mask.dtype


def decode_tree(tree: MedusaTree, device: torch.device, dtype: torch.dtype) -> DecodeTree:
    """The tree's decoding buffers on ``device`` (float mask in ``dtype``), built once and cached."""
    cache = tree.decode_buffers  # the tree owns its per-(device, dtype) decoding buffers
    key = (str(device), dtype)
    if key in cache:
        return cache[key]
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
    result = DecodeTree(
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
    cache[key] = result
    return result


def propose(root: torch.Tensor, head_topk: torch.Tensor, dt: DecodeTree) -> torch.Tensor:
    """Tree tokens: node 0 is ``root [B]``; node with path (r1..rd) is head d's rank-rd token.

    ``head_topk [K, B, kmax]`` holds each head's top-k token ids at the root position. Returns ``[B, N]``.
    """
    k, b, kmax = head_topk.shape
    flat = head_topk.permute(1, 0, 2).reshape(b, k * kmax)  # [B, K * kmax]
    return torch.cat([root.view(b, 1), flat.index_select(1, dt.topk_index)], dim=1)  # [B, N]
