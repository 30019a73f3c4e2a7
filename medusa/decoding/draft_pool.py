"""A pool of drafted candidates -> the step's per-row tree: the best ``N - 1`` nodes, closed under ancestors.

Both tree growers (the dynamic tree of MEDUSA / Hydra heads, the eagle3 drafter's EAGLE-2 growth) pool the
candidates of every level, parents in earlier levels, and keep the ``N - 1`` of highest rank with the root.
A node is kept only with its parent: :func:`closed_keys` clamps each node's key strictly below its parent's
(``nextafter`` in float64), so ``topk``, which keeps every value above the worst one it keeps, cannot keep a
child without its parent whatever the rounding or ties of the scores (a drafter sure of a token gives a
log-probability of exactly 0.0: the child's score then equals its parent's).
"""

from __future__ import annotations

import torch

from medusa.decoding.trees import RowTrees, tree_structure

FLOOR = -1e300  # keys start above -inf, so every clamp below a parent stays strict


def closed_keys(raw: torch.Tensor, parent: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Ranking keys ``[B, P]`` float64: ``raw [B, P]``, each clamped strictly below its parent's key.

    ``parent [B, P]``: the pool index of each node's parent (-1: the root); ``sizes``: the nodes of each
    level in pool order (a level's parents lie in the levels before it)."""
    key = raw.double().clamp(min=FLOOR)
    start = sizes[0] if sizes else 0
    for size in sizes[1:]:
        par = parent[:, start:start + size]  # [B, s]
        ceiling = torch.nextafter(key.gather(1, par.clamp(min=0)), torch.full_like(key[:, :1], float("-inf")))
        level = key[:, start:start + size]
        key[:, start:start + size] = torch.where(par >= 0, torch.minimum(level, ceiling), level)
        start += size
    return key


def pick_tree(root: torch.Tensor, key: torch.Tensor, token: torch.Tensor, parent: torch.Tensor,
              levels: torch.Tensor, num_nodes: int, depth: int, kmax: int, dtype: torch.dtype
              ) -> tuple[RowTrees, torch.Tensor]:
    """The ``num_nodes - 1`` pool nodes of highest ``key [B, P]`` (from :func:`closed_keys`) in level order
    under ``root [B]``: their tree (``token [B, P]`` target ids, ``parent [B, P]`` pool index or -1,
    ``levels [P]`` depth of each pool entry) and their pool indices ``[B, N-1]``."""
    b, n = root.shape[0], num_nodes
    device = root.device
    picked = key.topk(n - 1, dim=-1).indices.sort(dim=-1).values  # [B, N-1] level order: parents first
    where = torch.zeros(b, key.shape[1] + 1, dtype=torch.long, device=device)  # pool index + 1 -> node
    where.scatter_(1, picked + 1, torch.arange(1, n, device=device).expand(b, n - 1))
    tokens = torch.cat([root.view(b, 1), token.gather(1, picked)], dim=1)  # [B, N]
    parents = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=device),
                         where.gather(1, parent.gather(1, picked) + 1)], dim=1)  # [B, N]
    depths = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=device), levels[picked]], dim=1)  # [B, N]
    return tree_structure(tokens, parents, depths, depth, kmax, dtype), picked


__all__ = ["closed_keys", "pick_tree"]
