"""Proposers: what a decode step verifies. Each one turns the next root token and the base features at the
last kept position into a :class:`Proposal` (the tree's tokens and the tree they sit in).

- :class:`StaticProposer` with :func:`medusa_tokens`: MEDUSA heads on a static tree, the heads' top-k at the
  last kept position placed by rank (:func:`place_topk`).
- :class:`StaticProposer` with ``hydra_propose``: Hydra heads on a static tree, grown depth by depth
  (:mod:`medusa.decoding.hydra_candidates`).
- :class:`DynamicProposer`: any heads, each row's N most probable paths (:mod:`medusa.decoding.dynamic_tree`).
- :class:`medusa.decoding.drafter.DrafterProposer`: a sequential drafter (EAGLE-3) grows each row's tree.
- :class:`medusa.decoding.lookup.LookupProposer`: wraps any of them (or the plain proposer: the chain alone)
  and adds a context lookup chain, one per-row tree built once.

The head type and the tree kind are asked once, in :func:`choose_proposer`; the step
(:mod:`medusa.decoding.step`) only calls the :class:`Proposer` hooks: ``prefill`` once after the prompt,
then ``propose`` and ``observe`` every step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from medusa.decoding.draft_sampling import DraftSampling
from medusa.decoding.drafter import Drafter, DrafterProposer
from medusa.decoding.dynamic_tree import ChildrenFn, build_step_tree, hydra_children, medusa_children
from medusa.decoding.hydra_candidates import hydra_levels, hydra_propose
from medusa.decoding.lookup import LookupProposer
from medusa.decoding.plain import PlainProposer
from medusa.decoding.tree_option import DynamicTreeOption, TreeChoice
from medusa.decoding.trees import Proposal, StaticTree, root_only_tree, static_tree


class Proposer(Protocol):
    """What the decode step asks of a drafter: its tree's fixed sizes and three hooks."""

    @property
    def num_nodes(self) -> int:
        """N: the most nodes (root included) a proposal verifies (fixed for the run)."""
        ...

    @property
    def depth(self) -> int:
        """D: the deepest node of a proposal (fixed for the run)."""
        ...

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, features: torch.Tensor,
                root: torch.Tensor) -> None:
        """Called once after the prompt's forward: the prompt ``input_ids [B, T]`` and ``attention_mask
        [B, T]`` (left padding), the base features at every prompt position ``features [B, T, F]`` and the
        first root ``root [B]``."""
        ...

    def propose(self, root: torch.Tensor, hidden: torch.Tensor) -> Proposal:
        """``root [B]`` (the next token, already chosen) and ``hidden [B, F]`` (the base features at the
        last kept position) -> the proposal for this step."""
        ...

    def observe(self, kept: torch.Tensor, keep: torch.Tensor, next_root: torch.Tensor,
                features: torch.Tensor) -> None:
        """What the step kept: ``kept [B, D+1]`` the path's tokens (root first, the first ``keep [B]``
        kept), ``next_root [B]`` and ``features [B, D+1, F]``, the base features at the path's nodes (from
        the verify forward); drafters that read the context record it (device ops, no host read)."""
        ...


def stacked_heads(heads: Any, hidden: torch.Tensor) -> torch.Tensor:
    """MEDUSA heads ``[B, T, d] -> [K, B, T, V]`` target logits; traced per head when compiling (the batched
    path's weight cache checks data pointers, a graph break; inductor fuses the per-head ops itself)."""
    if torch.compiler.is_compiling():
        draft = torch.stack([heads.head_logits(k, hidden) for k in range(heads.num_heads)], dim=0)
        return heads.to_target_logits(draft)  # -inf outside a draft vocabulary (identity when full)
    return heads(hidden)


def place_topk(root: torch.Tensor, head_topk: torch.Tensor, tree: StaticTree) -> torch.Tensor:
    """Tree tokens: node 0 is ``root [B]``; node with path (r1..rd) is head d's rank-rd token.

    ``head_topk [K, B, kmax]`` holds each head's top-k token ids at the root position. Returns ``[B, N]``.
    """
    k, b, kmax = head_topk.shape
    flat = head_topk.permute(1, 0, 2).reshape(b, k * kmax)  # [B, K * kmax]
    return torch.cat([root.view(b, 1), flat.index_select(1, tree.topk_index)], dim=1)  # [B, N]


def medusa_tokens(heads: Any, root: torch.Tensor, hidden: torch.Tensor, tree: StaticTree) -> torch.Tensor:
    """MEDUSA heads on a static tree: node (r1..rd) holds head d's rank-rd token at the last kept position
    (``hidden [B, d]``), node 0 ``root [B]``. Returns ``[B, N]``."""
    if torch.compiler.is_compiling():
        logits = stacked_heads(heads, hidden.unsqueeze(1))[:, :, 0]  # [K, B, V]
        topk = logits.topk(tree.kmax, dim=-1).indices
    else:
        topk = heads.topk(hidden, tree.kmax)  # [K, B, kmax] target ids
    return place_topk(root, topk, tree)


# (heads, root [B], hidden [B, d], tree) -> tokens [B, N]
GrowFn = Callable[[Any, torch.Tensor, torch.Tensor, StaticTree], torch.Tensor]


class _ReadsHiddenOnly:
    """The hooks of proposers whose heads read the hidden state only: nothing to record."""

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, features: torch.Tensor,
                root: torch.Tensor) -> None:
        """The heads read the last position's hidden state only (the step hands it to ``propose``)."""

    def observe(self, kept: torch.Tensor, keep: torch.Tensor, next_root: torch.Tensor,
                features: torch.Tensor) -> None:
        """The heads read the hidden state only."""


@dataclass
class StaticProposer(_ReadsHiddenOnly):
    """Heads on a static tree: ``grow`` fills its N nodes (:func:`medusa_tokens` for MEDUSA heads,
    :func:`medusa.decoding.hydra_candidates.hydra_propose` for Hydra heads, which grow it depth by depth)."""

    heads: Any
    tree: StaticTree
    grow: GrowFn

    @property
    def num_nodes(self) -> int:
        return self.tree.num_nodes

    @property
    def depth(self) -> int:
        return self.tree.depth

    def propose(self, root: torch.Tensor, hidden: torch.Tensor) -> Proposal:
        return Proposal(self.grow(self.heads, root, hidden, self.tree), self.tree)


@dataclass
class DynamicProposer(_ReadsHiddenOnly):
    """Any heads on a dynamic tree: each row's ``num_nodes`` best paths, scored by ``children``."""

    heads: Any
    option: DynamicTreeOption  # depth resolved
    dtype: torch.dtype  # the float mask's
    children: Callable[[Any, torch.Tensor, int, int], ChildrenFn]  # (heads, hidden [B, d], branch, depth)
    branch: int

    @property
    def num_nodes(self) -> int:
        return self.option.num_nodes

    @property
    def depth(self) -> int:
        return int(self.option.depth)

    def propose(self, root: torch.Tensor, hidden: torch.Tensor) -> Proposal:
        children = self.children(self.heads, hidden, self.branch, self.depth)
        trees = build_step_tree(root, children, self.num_nodes, self.depth, self.dtype, self.branch,
                                path_score=self.option.score)
        return Proposal(trees.tokens, trees)


def _medusa_children(heads: Any, hidden: torch.Tensor, branch: int, depth: int) -> ChildrenFn:
    logits = stacked_heads(heads, hidden.unsqueeze(1))[:depth, :, 0]  # [D, B, V]
    return medusa_children(torch.log_softmax(logits.float(), dim=-1), branch)


def _hydra_children(heads: Any, hidden: torch.Tensor, branch: int, depth: int) -> ChildrenFn:
    return hydra_children(heads, hidden, branch)


def choose_proposer(heads: Any, choice: TreeChoice, device: torch.device, dtype: torch.dtype,
                    room: int = 0, trim_lookup: bool = False,
                    sampling: DraftSampling | None = None) -> Proposer:
    """The proposer for ``heads`` on the run's tree ``choice`` (masks in ``dtype`` on ``device``): the one
    place that asks which kind of drafter (a sequential :class:`~medusa.decoding.drafter.Drafter` or
    parallel heads), which head family (``heads.head_type``) and which tree kind decoding has. A lookup
    chain (``choice.lookup_tokens``) wraps whichever it is (:class:`LookupProposer`: ``room`` its context's
    room, ``trim_lookup`` its trimming); ``sampling``: "sample" acceptance's temperature and generator (a
    sequential drafter then samples its drafts)."""
    inner = _drafts(heads, choice, device, dtype, sampling)
    if choice.lookup_tokens and not choice.plain:
        return LookupProposer(inner, choice.lookup_tokens, room, trim=trim_lookup)
    return inner


def _drafts(heads: Any, choice: TreeChoice, device: torch.device, dtype: torch.dtype,
            sampling: DraftSampling | None) -> Proposer:
    """The proposer of the drafts themselves (no lookup chain)."""
    if choice.plain or choice.lookup_only:  # no drafts ("plain"), or the lookup chain alone ("lookup")
        return PlainProposer(root_only_tree(device, dtype))
    if isinstance(heads, Drafter):  # a sequential drafter grows its own per-row tree each step
        return DrafterProposer(heads, choice.draft, dtype, sampling)
    head_type = getattr(heads, "head_type", "linear")
    if choice.dynamic is not None:
        option = choice.dynamic
        branch = min(option.branch or option.num_nodes - 1, heads.vocab_size)
        children = _hydra_children if head_type == "hydra" else _medusa_children
        return DynamicProposer(heads, option, dtype, children, branch)
    return _static_proposer(heads, head_type, static_tree(choice.static, device, dtype))


def _static_proposer(heads: Any, head_type: str, tree: StaticTree) -> StaticProposer:
    if head_type == "hydra":
        # the growth plan (host lists) is built once, outside any compiled function
        return StaticProposer(heads, tree, functools.partial(hydra_propose, levels=hydra_levels(tree)))
    return StaticProposer(heads, tree, medusa_tokens)


__all__ = ["DynamicProposer", "GrowFn", "LookupProposer", "Proposal", "Proposer", "StaticProposer",
           "choose_proposer", "medusa_tokens", "place_topk", "stacked_heads"]
