"""The dynamic tree (``tree="dynamic"``): per step and per row, the N nodes of highest path probability.

A node's path probability is the product of the heads' own softmax probabilities of the tokens on its path
(MEDUSA heads: head d's distribution at the root position; Hydra heads: head d's distribution given the
path's tokens). A calibrated checkpoint (``tree.json`` from ``medusa calibrate``) carries a ``path_score``:
each factor becomes the fitted probability that verification accepts the token given its path
(:mod:`medusa.tree.path_score`), which ranks nodes of different depths against each other better than raw
head probabilities; ``DynamicTreeOption(calibrated=False)`` / ``--tree dynamic-raw`` keep the raw product.

The tree is grown level by level as EAGLE-2 grows it: level d's candidates are the top
``branch`` children of each of the ``width`` best level-(d-1) candidates; all candidates of all levels
are pooled and the best ``N - 1`` are kept with the root. A child's log-probability is its parent's plus a
log-probability <= 0 (and a ``1e-6`` per-depth tie-break), and the kept set is closed under ancestors by
construction (:func:`medusa.decoding.draft_growth.closed_keys`: a node ranks strictly below its parent); with
``width = branch = N - 1`` (the default) it is exactly the N best nodes of the whole tree of depth D.

Everything is built on the device with static shapes (N fixed): tokens, parents, depths, the ancestor
table, the ``[B, N, N]`` float attention mask and the children table the acceptance rules read. Each row
has its own tree: a :class:`medusa.decoding.trees.RowTrees`. The option that asks for it (``"dynamic:N"``,
:class:`medusa.decoding.tree_option.DynamicTreeOption`) is resolved in :mod:`medusa.decoding.tree_option`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from medusa.decoding.draft_growth import closed_keys, pick_tree
from medusa.decoding.trees import RowTrees
from medusa.errors import MedusaError
from medusa.tree.path_score import score_log_probs

# (d, paths [B, W, d] tokens root first) -> (log-probs [B, W, c], tokens [B, W, c]) of head d's top-c
ChildrenFn = Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
TIE_BREAK = 1e-6


def medusa_children(head_logp: torch.Tensor, branch: int) -> ChildrenFn:
    """Children of MEDUSA heads: head d's top-``branch`` at the root position, the same under every parent.
    ``head_logp [K, B, V]`` log-softmax of the heads at the root position."""
    top = head_logp.topk(branch, dim=-1)  # values / indices [K, B, c]

    def children(d: int, paths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, w = paths.shape[:2]
        return (top.values[d - 1].view(b, 1, branch).expand(b, w, branch),
                top.indices[d - 1].view(b, 1, branch).expand(b, w, branch))

    return children


def hydra_children(heads: torch.nn.Module, hidden: torch.Tensor, branch: int) -> ChildrenFn:
    """Children of Hydra heads: head d on ``[hidden, e(path tokens)]`` for every path, batched.
    ``hidden [B, d_model]``: the base hidden state at the last accepted position."""
    b, d_model = hidden.shape

    def children(d: int, paths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = paths.shape[1]
        emb = heads.embed(paths).view(b, w, d * d_model)  # [B, W, d * d_model]
        h = hidden.to(emb.dtype).view(b, 1, d_model).expand(b, w, d_model)
        logits = heads.head_logits(d - 1, torch.cat([h, emb], dim=-1))  # [B, W, V] (or [B, W, N_draft])
        top = torch.log_softmax(logits.float(), dim=-1).topk(min(branch, logits.shape[-1]), dim=-1)
        return top.values, heads.to_target(top.indices)  # [B, W, c]: draft ids -> target ids

    return children


def scored(children: ChildrenFn, score: dict[str, Any] | None) -> ChildrenFn:
    """``children`` with each log-probability turned into the calibrated score increment of its depth
    (:func:`medusa.tree.path_score.score_log_probs`; the identity without a ``score``)."""
    if score is None:
        return children

    def calibrated(d: int, paths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp, tokens = children(d, paths)  # [B, W, c]
        return score_log_probs(logp.float(), d, score), tokens

    return calibrated


def _grow(root: torch.Tensor, children: ChildrenFn, depth: int, width: int, branch: int
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Candidate pool over all levels: ``(score [B, P], token [B, P], parent [B, P], level_sizes)``.

    ``parent`` holds the pool index + 1 of each candidate's parent (0: the root)."""
    b = root.shape[0]
    paths = root.view(b, 1, 1)  # [B, W, d]: frontier paths, root first
    front_score = torch.zeros(b, 1, device=root.device)  # [B, W]
    front_id = torch.zeros(b, 1, dtype=torch.long, device=root.device)  # [B, W] pool index + 1 (0 = root)
    scores, tokens, parents, sizes = [], [], [], []
    offset = 0
    for d in range(1, depth + 1):
        logp, tok = children(d, paths)  # [B, W, c]
        w, c = tok.shape[1], tok.shape[2]
        score = (front_score.unsqueeze(-1) + logp.float() - TIE_BREAK).reshape(b, w * c)  # [B, W * c]
        scores.append(score)
        tokens.append(tok.reshape(b, w * c))
        parents.append(front_id.unsqueeze(-1).expand(b, w, c).reshape(b, w * c))
        sizes.append(w * c)
        if d < depth:
            keep = min(width, w * c)
            best = score.topk(keep, dim=-1).indices  # [B, W']
            parent_paths = paths.gather(1, (best // c).view(b, keep, 1).expand(-1, -1, d))  # [B, W', d]
            best_tok = tok.reshape(b, w * c).gather(1, best).view(b, keep, 1)  # [B, W', 1]
            paths = torch.cat([parent_paths, best_tok], dim=-1)  # [B, W', d+1]
            front_score = score.gather(1, best)
            front_id = best + offset + 1
        offset += w * c
    return torch.cat(scores, 1), torch.cat(tokens, 1), torch.cat(parents, 1), sizes


def build_step_tree(root: torch.Tensor, children: ChildrenFn, num_nodes: int, depth: int, dtype: torch.dtype,
                    branch: int, width: int | None = None, path_score: dict[str, Any] | None = None
                    ) -> RowTrees:
    """Each row's tree of the ``num_nodes`` nodes (root included) of highest path probability.

    ``root [B]``; ``children`` proposes head d's top-``branch`` (log-prob, token) under each frontier path;
    ``width`` frontier paths are expanded per level (default ``num_nodes - 1``); ``path_score``: the
    calibrated score (:attr:`medusa.decoding.tree_option.DynamicTreeOption.score`), or None for the raw
    log-probabilities.
    """
    n = num_nodes
    device = root.device
    width = n - 1 if width is None else width
    score, token, parent, sizes = _grow(root, scored(children, path_score), depth, width, branch)  # [B, P]
    level = torch.cat([torch.full((s,), d, dtype=torch.long, device=device)
                       for d, s in enumerate(sizes, start=1)])  # [P] depth of each pool entry
    if score.shape[1] < n - 1:
        raise MedusaError(f"a dynamic tree of {n} nodes needs {n - 1} candidates below the root; "
                          f"{depth} head(s) with {branch} children per node give only {score.shape[1]}")
    key = closed_keys(score, parent - 1, sizes)  # [B, P]: a node ranks strictly below its parent
    return pick_tree(root, key, token, parent - 1, level, n, depth, branch, dtype)[0]


__all__ = ["TIE_BREAK", "ChildrenFn", "build_step_tree", "hydra_children", "medusa_children", "scored"]
