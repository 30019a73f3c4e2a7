"""Hydra candidates on a static tree: the tree grows depth by depth, each head reading its path's tokens.

A node's path of ranks means what it means for MEDUSA heads (``(0, 1)``: the best token of head 1, then
the second best of head 2), except that head d ranks its tokens *given the tokens on the path before it*:
head d runs once per step on all depth-(d-1) nodes that have children, batched, with input
``[h, e(root), e(x_1), ..., e(x_{d-1})]`` (``h`` the base hidden state at the last accepted position).
D small calls per step, all on the device: nothing is read back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from medusa.tree import MedusaTree


@dataclass
class HydraLevel:
    """How depth d (1-based) of a static tree is grown from depth d-1."""

    expand: torch.Tensor  # [E] node index of each depth-(d-1) node that has children
    paths: torch.Tensor  # [E, d] node indices of each expanded node's path, root first (its own last)
    topk: int  # children ranks needed at depth d: 1 + the largest rank used
    children: torch.Tensor  # [M] node index of each depth-d node
    source: torch.Tensor  # [M] index of each depth-d node's token in the flattened [E * topk] top-k table


def hydra_levels(tree: MedusaTree, device: torch.device) -> list[HydraLevel]:
    """The tree's growth plan, one :class:`HydraLevel` per depth, built once per (tree, device)."""
    cache: dict = tree.__dict__.setdefault("_hydra_cache", {})
    key = str(device)
    if key in cache:
        return cache[key]
    index = {p: i for i, p in enumerate(tree.paths)}
    levels = []
    for d in range(1, tree.depth + 1):
        kids = [p for p in tree.paths if len(p) == d]
        parents = sorted({p[:-1] for p in kids}, key=lambda p: index[p])
        slot = {p: j for j, p in enumerate(parents)}
        topk = 1 + max(p[-1] for p in kids)
        levels.append(HydraLevel(
            expand=torch.tensor([index[p] for p in parents], dtype=torch.long, device=device),
            paths=torch.tensor([[index[p[:j]] for j in range(d)] for p in parents], dtype=torch.long,
                               device=device).view(len(parents), d),
            topk=topk,
            children=torch.tensor([index[p] for p in kids], dtype=torch.long, device=device),
            source=torch.tensor([slot[p[:-1]] * topk + p[-1] for p in kids], dtype=torch.long, device=device),
        ))
    cache[key] = levels
    return levels


def hydra_propose(heads: torch.nn.Module, root: torch.Tensor, hidden: torch.Tensor, tree: MedusaTree,
                  num_nodes: int) -> torch.Tensor:
    """Tree tokens ``[B, N]`` grown by Hydra heads from ``root [B]`` and ``hidden [B, d]``.

    Node 0 is the root; a depth-d node with rank r under parent p holds head d's rank-r token on the input
    ``[hidden, e(tokens on p's path)]``.
    """
    b, d_model = hidden.shape
    tokens = root.new_zeros(b, num_nodes)  # [B, N]
    tokens[:, 0] = root
    emb = heads.embed(root).new_zeros(b, num_nodes, d_model)  # [B, N, d] node embeddings, filled per depth
    emb[:, 0] = heads.embed(root)
    h = hidden.to(emb.dtype)
    for d, level in enumerate(hydra_levels(tree, hidden.device), start=1):
        e = level.expand.shape[0]
        path_emb = emb[:, level.paths.view(-1)].view(b, e, d * d_model)  # [B, E, d * d_model]
        wide = torch.cat([h.view(b, 1, d_model).expand(b, e, d_model), path_emb], dim=-1)  # [B, E, (d+1) d]
        top = heads.head_logits(d - 1, wide).topk(level.topk, dim=-1).indices  # [B, E, topk]
        kids = top.view(b, e * level.topk).index_select(1, level.source)  # [B, M]
        tokens[:, level.children] = kids
        emb[:, level.children] = heads.embed(kids)
    return tokens
