"""Proposers: what a decode step verifies. Each one turns the next root token and the base hidden state at
the last kept position into a :class:`Proposal` (the tree's tokens and the tree they sit in).

- :class:`StaticProposer` with :func:`medusa_tokens`: MEDUSA heads on a static tree, the heads' top-k at the
  last kept position placed by rank (:func:`medusa.decoding.candidates.propose`).
- :class:`StaticProposer` with ``hydra_propose``: Hydra heads on a static tree, grown depth by depth
  (:mod:`medusa.decoding.hydra_candidates`).
- :class:`DynamicProposer`: any heads, each row's N most probable paths (:mod:`medusa.decoding.dynamic_tree`).
- :class:`HybridProposer`: a static proposer's tree (or the root alone) plus a context lookup chain, one
  per-row tree (:mod:`medusa.decoding.lookup`).

The head type and the tree kind are asked once, in :func:`choose_proposer`; the step
(:mod:`medusa.decoding.step`) only calls ``proposer.propose``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from medusa.decoding.candidates import DecodeTree, decode_tree, propose
from medusa.decoding.dynamic_tree import (
    ChildrenFn,
    DynamicTree,
    StepTree,
    build_step_tree,
    hydra_children,
    medusa_children,
)
from medusa.decoding.hydra_candidates import hydra_levels, hydra_propose
from medusa.decoding.lookup import HybridTree, LookupContext, hybrid_tree, lookup_chain, observe
from medusa.errors import MedusaError
from medusa.modeling.hydra import HydraHeads


@dataclass
class Proposal:
    """One step's candidates: ``tokens [B, N]`` (node 0 = the root) and the tree they sit in — the static
    tree shared by every row (:class:`DecodeTree`: mask ``[N, N]``, depths / parents ``[N]``) or one tree per
    row (:class:`StepTree`: the same fields with a leading ``B``). ``draft_probs``: the proposal
    distribution where sampling needs it; None for every proposer here (their drafts are deterministic,
    point masses, so "sample" acceptance reads the target logits only)."""

    tokens: torch.Tensor  # [B, N] long
    tree: DecodeTree | StepTree
    draft_probs: torch.Tensor | None = None  # [B, N, V] or None


class Proposer(Protocol):
    """What the decode step asks of a drafter: its tree's fixed sizes and one proposal per step."""

    @property
    def shape(self) -> DecodeTree | DynamicTree:
        """The tree's fixed sizes: ``num_nodes`` (N), ``depth`` (D), ``dtype`` (the mask's)."""
        ...

    def propose(self, root: torch.Tensor, hidden: torch.Tensor) -> Proposal:
        """``root [B]`` (the next token, already chosen) and ``hidden [B, d]`` (the base hidden state at the
        last kept position) -> the proposal for this step."""
        ...

    def observe(self, kept: torch.Tensor, keep: torch.Tensor, next_root: torch.Tensor) -> None:
        """What the step kept: ``kept [B, D+1]`` the path's tokens (root first, the first ``keep [B]``
        kept) and ``next_root [B]``; drafters that read the context record it (device ops, no host read)."""
        ...


def stacked_heads(heads: Any, hidden: torch.Tensor) -> torch.Tensor:
    """MEDUSA heads ``[B, T, d] -> [K, B, T, V]`` target logits; traced per head when compiling (the batched
    path's weight cache checks data pointers, a graph break; inductor fuses the per-head ops itself)."""
    if torch.compiler.is_compiling():
        draft = torch.stack([heads.head_logits(k, hidden) for k in range(heads.num_heads)], dim=0)
        return heads.to_target_logits(draft)  # -inf outside a draft vocabulary (identity when full)
    return heads(hidden)


def medusa_tokens(heads: Any, root: torch.Tensor, hidden: torch.Tensor, dt: DecodeTree) -> torch.Tensor:
    """MEDUSA heads on a static tree: node (r1..rd) holds head d's rank-rd token at the last kept position
    (``hidden [B, d]``), node 0 ``root [B]``. Returns ``[B, N]``."""
    if torch.compiler.is_compiling():
        logits = stacked_heads(heads, hidden.unsqueeze(1))[:, :, 0]  # [K, B, V]
        topk = logits.topk(dt.kmax, dim=-1).indices
    else:
        topk = heads.topk(hidden, dt.kmax)  # [K, B, kmax] target ids
    return propose(root, topk, dt)


# (heads, root [B], hidden [B, d], tree) -> tokens [B, N]
GrowFn = Callable[[Any, torch.Tensor, torch.Tensor, DecodeTree], torch.Tensor]


@dataclass
class StaticProposer:
    """Heads on a static tree: ``grow`` fills its N nodes (:func:`medusa_tokens` for MEDUSA heads,
    :func:`medusa.decoding.hydra_candidates.hydra_propose` for Hydra heads, which grow it depth by depth)."""

    heads: Any
    tree: DecodeTree
    grow: GrowFn

    @property
    def shape(self) -> DecodeTree:
        return self.tree

    def propose(self, root: torch.Tensor, hidden: torch.Tensor) -> Proposal:
        return Proposal(self.grow(self.heads, root, hidden, self.tree), self.tree)

    def observe(self, kept: torch.Tensor, keep: torch.Tensor, next_root: torch.Tensor) -> None:
        """The heads read the hidden state only."""


@dataclass
class DynamicProposer:
    """Any heads on a dynamic tree: each row's ``num_nodes`` best paths, scored by ``children``."""

    heads: Any
    tree: DynamicTree
    children: Any  # (heads, hidden [B, d], branch, depth) -> ChildrenFn
    branch: int

    @property
    def shape(self) -> DynamicTree:
        return self.tree

    def propose(self, root: torch.Tensor, hidden: torch.Tensor) -> Proposal:
        dt = self.tree
        children = self.children(self.heads, hidden, self.branch, dt.depth)
        step = build_step_tree(root, children, dt.num_nodes, dt.depth, dt.dtype, self.branch,
                               path_score=dt.score)
        return Proposal(step.tokens, step)

    def observe(self, kept: torch.Tensor, keep: torch.Tensor, next_root: torch.Tensor) -> None:
        """The heads read the hidden state only."""


@dataclass
class HybridProposer:
    """The heads' static tree (``heads``: a :class:`StaticProposer`; None for lookup alone) plus a lookup
    chain from ``context``, merged into one per-row tree (:func:`medusa.decoding.lookup.hybrid_tree`)."""

    heads: StaticProposer | None
    tree: HybridTree
    context: LookupContext

    @property
    def shape(self) -> HybridTree:
        return self.tree

    def propose(self, root: torch.Tensor, hidden: torch.Tensor) -> Proposal:
        ht, length = self.tree.heads, self.tree.lookup_tokens
        head_tokens = root.view(-1, 1) if self.heads is None else self.heads.propose(root, hidden).tokens
        chain, valid = lookup_chain(self.context, ht.depth + length, self.tree.max_ngram)  # [B, D+L]
        tree = hybrid_tree(head_tokens, ht, chain, valid, length, self.tree.trim)
        if tree is None:  # trimmed: no row has a chain to verify this step
            return Proposal(head_tokens, ht)
        return Proposal(tree.tokens, tree)

    def observe(self, kept: torch.Tensor, keep: torch.Tensor, next_root: torch.Tensor) -> None:
        observe(self.context, kept, keep, next_root)


def _medusa_children(heads: Any, hidden: torch.Tensor, branch: int, depth: int) -> ChildrenFn:
    logits = stacked_heads(heads, hidden.unsqueeze(1))[:depth, :, 0]  # [D, B, V]
    return medusa_children(torch.log_softmax(logits.float(), dim=-1), branch)


def _hydra_children(heads: Any, hidden: torch.Tensor, branch: int, depth: int) -> ChildrenFn:
    return hydra_children(heads, hidden, branch)


def choose_proposer(heads: Any, tree: DecodeTree | DynamicTree | HybridTree,
                    context: LookupContext | None = None) -> Proposer:
    """The proposer for ``heads`` on ``tree`` (static buffers from :func:`decoding_tree`): the one place that
    asks which head family and which tree kind decoding has. A :class:`HybridTree` needs the run's lookup
    ``context``."""
    if isinstance(tree, HybridTree):
        if context is None:
            raise MedusaError("a tree with a lookup chain needs the run's LookupContext")
        inner = None if tree.lookup_only else choose_proposer(heads, tree.heads)
        return HybridProposer(inner, tree, context)
    hydra = isinstance(heads, HydraHeads)
    if isinstance(tree, DynamicTree):
        branch = min(tree.branch or tree.num_nodes - 1, heads.vocab_size)
        return DynamicProposer(heads, tree, _hydra_children if hydra else _medusa_children, branch)
    if hydra:
        hydra_levels(tree)  # the growth plan (host lists) is built once, outside any compiled function
        return StaticProposer(heads, tree, hydra_propose)
    return StaticProposer(heads, tree, medusa_tokens)


def decoding_tree(tree: Any, device: torch.device, dtype: torch.dtype) -> DecodeTree | DynamicTree:
    """A static tree's buffers on ``device`` (mask in ``dtype``), or the dynamic tree with that mask dtype."""
    if isinstance(tree, DynamicTree):
        return dataclasses.replace(tree, dtype=dtype)
    return decode_tree(tree, device, dtype)


__all__ = ["DynamicProposer", "GrowFn", "HybridProposer", "Proposal", "Proposer", "StaticProposer",
           "choose_proposer", "decoding_tree", "medusa_tokens", "stacked_heads"]
