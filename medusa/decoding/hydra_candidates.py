"""Hydra candidates on a static tree: the tree grows depth by depth, each head reading its path's tokens.

A node's path of ranks means what it means for MEDUSA heads (``(0, 1)``: the best token of head 1, then
the second best of head 2), except that head d ranks its tokens *given the tokens on the path before it*:
head d runs once per step on all depth-(d-1) nodes that have children, batched, with input
``[h, e(root), e(x_1), ..., e(x_{d-1})]`` (``h`` the base hidden state at the last accepted position).
D small calls per step, all on the device: nothing is read back to the host.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from medusa.decoding.trees import StaticTree


@dataclass
class HydraLevel:
    """How depth d (1-based) of a static tree is grown from depth d-1."""

    expand: torch.Tensor  # [E] node index of each depth-(d-1) node that has children
    paths: torch.Tensor  # [E, d] node indices of each expanded node's path, root first (its own last)
    topk: int  # children ranks needed at depth d: 1 + the largest rank used
    children: torch.Tensor  # [M] node index of each depth-d node
    source: torch.Tensor  # [M] index of each depth-d node's token in the flattened [E * topk] top-k table


# each static tree's growth plan, built once (static trees are themselves built once per tree and device)
_LEVELS: weakref.WeakKeyDictionary[StaticTree, list[HydraLevel]] = weakref.WeakKeyDictionary()


def hydra_levels(dt: StaticTree) -> list[HydraLevel]:
    """The tree's growth plan, one :class:`HydraLevel` per depth, built once per static tree."""
    if dt in _LEVELS:
        return _LEVELS[dt]
    device = dt.depths.device
    parent_of, children, ancestors = dt.parents.tolist(), dt.children.tolist(), dt.ancestors.tolist()
    levels = []
    for d in range(1, dt.depth + 1):
        kids = [i for i, depth in enumerate(dt.depth_list) if depth == d]
        parents = sorted({parent_of[i] for i in kids})
        rank = {i: children[parent_of[i]].index(i) for i in kids}
        topk = 1 + max(rank.values())
        levels.append(HydraLevel(
            expand=torch.tensor(parents, dtype=torch.long, device=device),
            paths=torch.tensor([ancestors[p][:d] for p in parents], dtype=torch.long, device=device),
            topk=topk,
            children=torch.tensor(kids, dtype=torch.long, device=device),
            source=torch.tensor([parents.index(parent_of[i]) * topk + rank[i] for i in kids],
                                dtype=torch.long, device=device),
        ))
    _LEVELS[dt] = levels
    return levels


def hydra_propose(heads: torch.nn.Module, root: torch.Tensor, hidden: torch.Tensor, dt: StaticTree,
                  levels: list[HydraLevel] | None = None) -> torch.Tensor:
    """Tree tokens ``[B, N]`` grown by Hydra heads from ``root [B]`` and ``hidden [B, d]``.

    Node 0 is the root; a depth-d node with rank r under parent p holds head d's rank-r token on the input
    ``[hidden, e(tokens on p's path)]``. ``levels``: the tree's growth plan (default :func:`hydra_levels`;
    the proposer passes the one it built, so compiled code never looks it up).
    """
    b, d_model = hidden.shape
    num_nodes = dt.num_nodes
    tokens = root.new_zeros(b, num_nodes)  # [B, N]
    tokens[:, 0] = root
    emb = heads.embed(root).new_zeros(b, num_nodes, d_model)  # [B, N, d] node embeddings, filled per depth
    emb[:, 0] = heads.embed(root)
    h = hidden.to(emb.dtype)
    for d, level in enumerate(levels if levels is not None else hydra_levels(dt), start=1):
        e = level.expand.shape[0]
        path_emb = emb[:, level.paths.view(-1)].view(b, e, d * d_model)  # [B, E, d * d_model]
        wide = torch.cat([h.view(b, 1, d_model).expand(b, e, d_model), path_emb], dim=-1)  # [B, E, (d+1) d]
        top = heads.head_topk(d - 1, wide, level.topk)  # [B, E, topk] target ids
        kids = top.view(b, e * level.topk).index_select(1, level.source)  # [B, M]
        tokens[:, level.children] = kids
        emb[:, level.children] = heads.embed(kids)
    return tokens
