"""The dynamic tree (``tree="dynamic"``): per step and per row, the N nodes of highest path probability.

A node's path probability is the product of the heads' own softmax probabilities of the tokens on its path
(MEDUSA heads: head d's distribution at the root position; Hydra heads: head d's distribution given the
path's tokens). A calibrated checkpoint (``tree.json`` from ``medusa calibrate``) carries a ``path_score``:
each factor becomes the fitted probability that verification accepts the token given its path
(:mod:`medusa.tree.path_score`), which ranks nodes of different depths against each other better than raw
head probabilities; ``DynamicTree(calibrated=False)`` / ``--tree dynamic-raw`` keep the raw product.

The tree is grown level by level as EAGLE-2 grows it: level d's candidates are the top
``branch`` children of each of the ``width`` best level-(d-1) candidates; all candidates of all levels
are pooled and the best ``N - 1`` are kept with the root. A child's log-probability is its parent's plus a
log-probability <= 0 (and a ``1e-6`` per-depth tie-break), so the kept set is prefix-closed; with
``width = branch = N - 1`` (the default) it is exactly the N best nodes of the whole tree of depth D.

Everything is built on the device with static shapes (N fixed): tokens, parents, depths, the ancestor
table, the ``[B, N, N]`` float attention mask and the children table the acceptance rules read. Each row
has its own tree, so the fields carry a leading batch dimension where :class:`DecodeTree`'s do not;
:func:`rows_at` indexes either kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from medusa.errors import MedusaError
from medusa.tree import MedusaTree
from medusa.tree.path_score import score_log_probs

# (d, paths [B, W, d] tokens root first) -> (log-probs [B, W, c], tokens [B, W, c]) of head d's top-c
ChildrenFn = Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
TIE_BREAK = 1e-6
LOOKUP_TREE = "lookup"  # tree="lookup" / --tree lookup: the lookup chain alone, no heads (decoding.lookup)


def is_lookup_tree(tree: Any) -> bool:
    """Whether ``tree`` asks for the lookup chain alone (``tree="lookup"``)."""
    return isinstance(tree, str) and tree == LOOKUP_TREE


@dataclass(frozen=True)
class DynamicTree:
    """``tree="dynamic"``: every step, each row's tree of the ``num_nodes`` nodes (root included) of highest
    path probability, ``depth`` levels deep (default: one per head). ``branch``: children proposed under
    each expanded node (default ``num_nodes - 1``, which makes the tree exactly the best N nodes).
    ``calibrated``: score paths with the checkpoint's fitted ``path_score`` when it has one (``score``, set
    by :func:`resolve_dynamic`); False: the raw product of head probabilities."""

    num_nodes: int = 32
    depth: int | None = None
    branch: int | None = None
    dtype: torch.dtype = torch.float32
    calibrated: bool = True
    # medusa.tree.path_score.fit_path_score's record, or None: raw (not part of equality / hash)
    score: dict[str, Any] | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.num_nodes < 2:
            raise MedusaError(f"a dynamic tree needs at least 2 nodes, got {self.num_nodes}")

    def __len__(self) -> int:
        return self.num_nodes


def tree_option(tree: str | None, nodes: int | None = None, lookup_tokens: int | None = None) -> Any:
    """The CLI's ``--tree`` / ``--nodes`` / ``--lookup-tokens``: None (the checkpoint's tree), ``dynamic`` (a
    :class:`DynamicTree` of ``nodes`` nodes, default 32, calibrated path score when the checkpoint has one),
    ``dynamic-raw`` (raw head probabilities), ``lookup`` (the string: the lookup chain alone, which needs
    ``lookup_tokens >= 1``) or a tree.json path. A lookup chain (``lookup_tokens >= 1``) needs a static
    tree or ``lookup``."""
    if tree in ("dynamic", "dynamic-raw"):
        if lookup_tokens:
            raise MedusaError("--lookup-tokens needs a static tree (a tree.json or the checkpoint's) or "
                              "--tree lookup, not a dynamic one")
        return DynamicTree(nodes if nodes is not None else 32, calibrated=tree == "dynamic")
    if nodes is not None:
        raise MedusaError("--nodes applies to --tree dynamic only (a tree.json fixes its own size)")
    if tree == LOOKUP_TREE:
        if lookup_tokens is None or lookup_tokens < 1:
            raise MedusaError("--tree lookup (the lookup chain alone) needs --lookup-tokens L with L >= 1")
        return LOOKUP_TREE
    if tree is None:
        return None
    return MedusaTree.from_json(tree)


def resolve_dynamic(tree: object, num_heads: int, checkpoint_tree: Any = None,
                    default_nodes: int = 32) -> DynamicTree | None:
    """``"dynamic"``, ``"dynamic:N"`` or a :class:`DynamicTree` -> a DynamicTree with its depth resolved
    (all heads) and, when ``calibrated``, the ``path_score`` of ``checkpoint_tree``'s calibration record
    (the model's calibrated ``MedusaTree``); anything else -> None (a static tree)."""
    if isinstance(tree, str):
        size = str(default_nodes) if tree == "dynamic" else ""
        if tree.startswith("dynamic:"):
            size = tree.split(":", 1)[1]
        if not size.isdigit():
            raise MedusaError(f"tree must be a MedusaTree, a DynamicTree, 'dynamic' or 'dynamic:N', "
                              f"got {tree!r}")
        tree = DynamicTree(int(size))
    if not isinstance(tree, DynamicTree):
        return None
    if tree.depth is None:
        tree = dataclasses.replace(tree, depth=num_heads)
    record = getattr(checkpoint_tree, "calibration", None) or {}
    if tree.calibrated and tree.score is None and record.get("path_score"):
        tree = dataclasses.replace(tree, score=record["path_score"])
    return tree


def tree_kind(tree: object, checkpoint_tree: Any = None) -> str:
    """How a benchmark report names ``tree``: ``static``, ``dynamic (calibrated path score)`` or ``dynamic
    (raw head probabilities)`` (``checkpoint_tree``: the model's calibrated tree, whose record holds the
    score)."""
    dynamic = resolve_dynamic(tree, 1, checkpoint_tree)
    if dynamic is None:
        return "static"
    return f"dynamic ({'calibrated path score' if dynamic.score else 'raw head probabilities'})"


@dataclass
class StepTree:
    """One step's per-row trees (the fields :class:`DecodeTree` has, with a batch dimension)."""

    per_row: ClassVar[bool] = True  # fields carry a leading batch dimension (see rows_at)

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


def rows_at(x: torch.Tensor, index: torch.Tensor, per_row: bool) -> torch.Tensor:
    """``x [B, N, ...]`` at node indices ``index``: ``[M...]`` shared by all rows (a static tree) or, with
    ``per_row``, ``[B, M...]`` (a :class:`StepTree`) -> ``[B, M..., ...]``."""
    if not per_row:
        return x[:, index]
    b = x.shape[0]
    rows = torch.arange(b, device=x.device).view(b, 1)
    return x[rows, index.reshape(b, -1)].view(*index.shape, *x.shape[2:])


def is_per_row(tree: object) -> bool:
    """True for a :class:`StepTree` (per-row trees), False for a static :class:`DecodeTree`."""
    return tree.per_row  # type: ignore[attr-defined]


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
                    ) -> StepTree:
    """Each row's tree of the ``num_nodes`` nodes (root included) of highest path probability.

    ``root [B]``; ``children`` proposes head d's top-``branch`` (log-prob, token) under each frontier path;
    ``width`` frontier paths are expanded per level (default ``num_nodes - 1``); ``path_score``: the
    calibrated score (:attr:`DynamicTree.score`), or None for the raw log-probabilities.
    """
    b, n = root.shape[0], num_nodes
    device = root.device
    width = n - 1 if width is None else width
    score, token, parent, sizes = _grow(root, scored(children, path_score), depth, width, branch)  # [B, P]
    level = torch.cat([torch.full((s,), d, dtype=torch.long, device=device)
                       for d, s in enumerate(sizes, start=1)])  # [P] depth of each pool entry
    if score.shape[1] < n - 1:
        raise MedusaError(f"a dynamic tree of {n} nodes needs {n - 1} candidates below the root; "
                          f"{depth} head(s) with {branch} children per node give only {score.shape[1]}")
    picked = score.topk(n - 1, dim=-1).indices.sort(dim=-1).values  # [B, N-1]: level order = parents first
    where = torch.zeros(b, score.shape[1] + 1, dtype=torch.long, device=device)  # [B, P+1]: pool -> node
    where.scatter_(1, picked + 1, torch.arange(1, n, device=device).expand(b, n - 1))
    tokens = torch.cat([root.view(b, 1), token.gather(1, picked)], dim=1)  # [B, N]
    parents = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=device),
                         where.gather(1, parent.gather(1, picked))], dim=1)  # [B, N]
    depths = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=device), level[picked]], dim=1)  # [B, N]
    return tree_structure(tokens, parents, depths, depth, branch, dtype)


def tree_structure(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, depth: int, kmax: int,
               dtype: torch.dtype) -> StepTree:
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
    return StepTree(n, depth, kmax, tokens, depths, parents, children.view(b, n, kmax), anc * valid,
                    valid[..., 1:], anc * valid, float_mask)


__all__ = ["LOOKUP_TREE", "DynamicTree", "StepTree", "build_step_tree", "hydra_children", "is_lookup_tree",
           "is_per_row", "medusa_children", "resolve_dynamic", "rows_at", "tree_kind", "tree_option",
           "tree_structure"]
