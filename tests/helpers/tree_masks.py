"""The 4-D bfloat16 mask and positions of a tree of nodes after a cached context, as the decoder's cache gives
them (keys padded to 16 columns, the extra ones masked)."""

from __future__ import annotations

import torch

from medusa.decoding.kv_cache import padded


def tree_mask(past: int, parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``([1, 1, n, padded(past + n)] mask, [1, n] positions)`` of nodes whose parent indices are ``parents``
    (-1 for the root) after ``past`` cached tokens: each node sees the cache, its ancestors and itself."""
    n = len(parents)
    neg = torch.finfo(torch.bfloat16).min
    mask = torch.full((1, 1, n, padded(past + n)), neg, dtype=torch.bfloat16)
    mask[..., :past] = 0
    depth: list[int] = []
    for i, p in enumerate(parents):
        node = i
        while node >= 0:
            mask[0, 0, i, past + node] = 0
            node = parents[node]
        depth.append(0 if p < 0 else depth[p] + 1)
    return mask, (past + torch.tensor(depth)).view(1, n)
