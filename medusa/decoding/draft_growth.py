"""Growing a step's per-row tree level by level, the EAGLE-2 way, and keeping its best ``N - 1`` nodes.

Both growers pool the candidates of every level (parents in earlier levels) and keep the ``N - 1`` of
highest rank with the root: the dynamic tree of MEDUSA / Hydra heads (:mod:`medusa.decoding.dynamic_tree`)
and a sequential drafter's tree (:func:`grow`):

```
depth 1       the root's expansion (the drafter's output at its last context entry) -> `branch` children
depth 2..D    the `expand` best nodes of the last level by cumulative draft log-probability run through
              the drafter's pass (tree attention: its context plus their ancestors' entries) -> `branch`
              children each
pick          the `num_nodes - 1` best pool nodes, closed under ancestors (:func:`pick_nodes`)
```
With the shape's ``min_prob`` (deterministic drafts only), a level expands only the nodes whose path
probability reaches it (none: the growth stops) and only such nodes are picked (at least the root).
A node is kept only with its parent: :func:`closed_keys` clamps each node's key strictly below its parent's
(``nextafter`` in float64), so ``topk``, which keeps every value above the worst one it keeps, cannot keep a
child without its parent whatever the rounding or ties of the scores (a drafter sure of a token gives a
log-probability of exactly 0.0: the child's score then equals its parent's). How a level's children are
chosen is the caller's :data:`ChildrenOf`: :func:`top_children` (greedy / typical: each node's top-``branch``)
or :func:`medusa.decoding.draft_sampling.sampled_children` ("sample" acceptance).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from medusa.decoding.trees import RowTrees, TreeNodes, tree_structure
from medusa.native import pick

FLOOR = -1e300  # keys start above -inf, so every clamp below a parent stays strict

# (draft logits [B, E, N] in the drafter's dtype, parents' scores [B, E] float32)
#   -> scores [B, E * c] float32, draft ids [B, E * c], q_r [B, E * c, N] | None
ChildrenOf = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]


@dataclass(frozen=True)
class TopChildren:
    """Each node's top-``branch`` children by draft log-probability (deterministic drafts: no ``q_r``;
    bfloat16 logits through the native library, :func:`medusa.native.pick.top_log_softmax`). A
    :data:`ChildrenOf`; :func:`grow` asks the drafter for the top-k itself instead (its ``draft_top`` /
    ``top_log_probs``: a whole level in one C call where it can) and scores them with :meth:`scored`."""

    branch: int

    def __call__(self, logits: torch.Tensor, base_score: torch.Tensor):
        values, indices = pick.top_log_softmax(logits, self.branch)  # [B, E, c] each
        return self.scored(values, indices, base_score)

    @staticmethod
    def scored(values: torch.Tensor, indices: torch.Tensor, base_score: torch.Tensor):
        """Top-k ``values, indices [B, E, c]`` under parents scored ``base_score [B, E]`` -> the children's
        scores and draft ids ``[B, E * c]`` (no ``q_r``)."""
        return (base_score.unsqueeze(-1) + values).flatten(1), indices.flatten(1), None


def top_children(branch: int) -> TopChildren:
    """:class:`TopChildren` of ``branch``."""
    return TopChildren(branch)


def float_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``allowed [B, Q, S]`` bool -> ``[B, 1, Q, S]`` float (0 / dtype-min)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min).unsqueeze(1)


def grow(drafter: Any, context: Any, root: torch.Tensor, shape: Any, children: ChildrenOf,
         by_parent: bool, dtype: torch.dtype) -> tuple[TreeNodes, torch.Tensor, list[torch.Tensor | None]]:
    """Each row's tree under ``root [B]`` on ``shape`` (num_nodes, depth, branch, expand), grown from the
    drafter's ``context`` (its cache, valid entries, root position, last output); the drafted entries are
    dropped again. Returns the kept nodes (masks in ``dtype``), their pool indices ``[B, N-1]`` and each
    level's ``q_r`` (None for deterministic children). ``by_parent``: rank nodes by their parent's score."""
    b, c = root.shape[0], shape.branch
    device = root.device
    s0 = context.cache.get_seq_length()
    top = isinstance(children, TopChildren)  # deterministic top-k: the drafter picks them (one call a level)
    if top:
        score, token, q = children.scored(*drafter.top_log_probs(context.g_root.unsqueeze(1), c),
                                          torch.zeros(b, 1, device=device))
    else:
        root_logits = drafter.logits(context.g_root.unsqueeze(1))  # [B, 1, N]
        score, token, q = children(root_logits, torch.zeros(b, 1, device=device))
    pool_score, pool_token, pool_q = [score], [token], [q]  # each [B, c_l] (q: [B, c_l, N])
    pool_parent = [torch.full((b, c), -1, dtype=torch.long, device=device)]  # pool index, -1 = root
    level_g = context.g_root.unsqueeze(1).expand(b, c, -1)  # [B, c, d] hidden input of each new node
    level_start, anc = 0, torch.zeros(b, 0, 0, dtype=torch.bool, device=device)  # [B, E, E]
    entry_of_parent = torch.full((b, c), -1, dtype=torch.long, device=device)  # the parent's draft entry
    floor = prune_floor(shape, by_parent)
    for depth in range(2, shape.depth + 1):
        e = min(shape.expand, reaching(pool_score[-1], floor))
        if e == 0:  # no node of the last level is probable enough to draft under
            break
        sel = pool_score[-1].topk(e, dim=-1).indices  # [B, e] within the last level
        anc, rows = _ancestry(anc, entry_of_parent.gather(1, sel))  # [B, E', E'], [B, e, E']
        allowed = torch.cat([context.valid.view(b, 1, s0).expand(b, e, s0), rows], dim=-1)
        parent_g = level_g.gather(1, sel.unsqueeze(-1).expand(-1, -1, level_g.shape[-1]))  # [B, e, d]
        tokens = drafter.to_target(pool_token[-1].gather(1, sel))  # [B, e]
        positions = (context.pos + depth - 1).view(b, 1).expand(b, e)
        mask, base = float_mask(allowed, drafter.dtype), pool_score[-1].gather(1, sel)
        if top:
            g, values, indices = drafter.draft_top(parent_g, tokens, positions, mask, context.cache, c)
            score, token, q = children.scored(values, indices, base)
        else:
            g = drafter.draft_pass(parent_g, tokens, positions, mask, context.cache)  # [B, e, d]
            score, token, q = children(drafter.logits(g), base)
        pool_parent.append((level_start + sel).repeat_interleave(c, dim=1))  # [B, e * c]
        entries = anc.shape[1] - e + torch.arange(e, device=device)  # [e] the new draft entries
        entry_of_parent = entries.repeat_interleave(c).expand(b, -1)
        level_g = g.repeat_interleave(c, dim=1)  # [B, e * c, d]
        level_start += pool_score[-1].shape[1]
        pool_score.append(score)
        pool_token.append(token)
        pool_q.append(q)
    context.cache.truncate(s0)
    token = drafter.to_target(torch.cat(pool_token, dim=1))  # [B, P] target ids
    nodes, picked = _pick(root, pool_score, token, pool_parent, shape, by_parent, dtype, floor)
    return nodes, picked, pool_q


def prune_floor(shape: Any, by_parent: bool) -> float | None:
    """The log path probability a node needs to be expanded and verified (``shape.min_prob``; None: no
    pruning, as for sampled drafts, whose nodes may not be chosen by their own token)."""
    p = getattr(shape, "min_prob", 0.0)
    return math.log(p) if p > 0 and not by_parent else None


def reaching(score: torch.Tensor, floor: float | None) -> int:
    """How many of ``score [B, P]``'s nodes (the most of any row) reach ``floor`` (all without one; a host
    read with one)."""
    return score.shape[1] if floor is None else int((score >= floor).sum(dim=1).max())


def _ancestry(anc: torch.Tensor, parent_entry: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft entries' ancestor table ``anc [B, E, E]`` grown by ``e`` new entries whose parents' entries
    are ``parent_entry [B, e]`` (-1: the root, no entry): the grown table and the new rows ``[B, e, E + e]``
    (each new entry sees its ancestors' entries and itself)."""
    b, e = parent_entry.shape
    n_old = anc.shape[1]
    rows = torch.zeros(b, e, n_old + e, dtype=torch.bool, device=anc.device)
    if n_old:
        parent_rows = anc.gather(1, parent_entry.clamp(min=0).unsqueeze(-1).expand(b, e, n_old))
        rows[..., :n_old] = parent_rows & (parent_entry >= 0).unsqueeze(-1)
    rows[..., n_old:] = torch.eye(e, dtype=torch.bool, device=anc.device)
    return torch.cat([torch.cat([anc, anc.new_zeros(b, n_old, e)], dim=2), rows], dim=1), rows


def _pick(root: torch.Tensor, pool_score: list[torch.Tensor], token: torch.Tensor,
          pool_parent: list[torch.Tensor], shape: Any, by_parent: bool, dtype: torch.dtype,
          floor: float | None = None) -> tuple[TreeNodes, torch.Tensor]:
    """The ``num_nodes - 1`` best pool nodes in level order under the root (and their pool indices
    ``[B, N-1]``; fewer with a ``floor``: those that reach it, the most of any row). Ranked by the node's
    cumulative log-probability or, ``by_parent`` (sampled drafts), by its parent's (a node's place must not
    depend on its own sampled token); ties go to the shallower node, then the earlier sibling."""
    device = root.device
    sizes = [s.shape[1] for s in pool_score]
    levels = torch.cat([torch.full((size,), d, dtype=torch.long, device=device)
                        for d, size in enumerate(sizes, start=1)])  # [P]
    parent = torch.cat(pool_parent, dim=1)  # [B, P]
    own = torch.cat(pool_score, dim=1).double()  # [B, P]
    if not by_parent:
        raw = own - 1e-6 * levels  # [B, P]
    else:
        parent_score = torch.where(parent >= 0, own.gather(1, parent.clamp(min=0)), 0.0)  # [B, P]
        rank = torch.cat([torch.arange(size, device=device) % shape.branch for size in sizes])
        raw = parent_score - 1e-6 * levels - 1e-9 * rank  # [B, P]
    n = 1 + min(shape.num_nodes - 1, reaching(own, floor))
    return pick_nodes(root, closed_keys(raw, parent, sizes), token, parent, levels, n, shape.depth,
                      shape.branch, dtype)


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


def pick_nodes(root: torch.Tensor, key: torch.Tensor, token: torch.Tensor, parent: torch.Tensor,
               levels: torch.Tensor, num_nodes: int, depth: int, kmax: int, dtype: torch.dtype
               ) -> tuple[TreeNodes, torch.Tensor]:
    """The ``num_nodes - 1`` pool nodes of highest ``key [B, P]`` (from :func:`closed_keys`) in level order
    under ``root [B]``: their nodes (``token [B, P]`` target ids, ``parent [B, P]`` pool index or -1,
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
    return TreeNodes(tokens, parents, depths, depth, kmax, dtype), picked


def pick_tree(root: torch.Tensor, key: torch.Tensor, token: torch.Tensor, parent: torch.Tensor,
              levels: torch.Tensor, num_nodes: int, depth: int, kmax: int, dtype: torch.dtype
              ) -> tuple[RowTrees, torch.Tensor]:
    """:func:`pick_nodes` with the tree's tables built."""
    nodes, picked = pick_nodes(root, key, token, parent, levels, num_nodes, depth, kmax, dtype)
    return tree_structure(nodes.tokens, nodes.parents, nodes.depths, depth, kmax, dtype), picked


__all__ = ["FLOOR", "ChildrenOf", "TopChildren", "closed_keys", "float_mask", "grow", "pick_nodes",
           "pick_tree", "prune_floor", "reaching", "top_children"]
