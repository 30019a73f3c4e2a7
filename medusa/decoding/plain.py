"""The proposer with no drafts: every step verifies the root alone, so the decode loop (its packed
linears, cache, acceptance and bookkeeping) runs as plain autoregressive decoding. ``tree="plain"`` chooses
it; ``medusa bench`` times it as ``own_plain``, so the gain of the drafts (drafts over our own plain decode)
stands beside the speedup over HF ``generate``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from medusa.decoding.trees import Proposal, StaticTree


@dataclass
class PlainProposer:
    """Proposes the root alone (``tree``: :func:`medusa.decoding.trees.root_only_tree`); reads no context."""

    tree: StaticTree

    @property
    def num_nodes(self) -> int:
        return 1

    @property
    def depth(self) -> int:
        return 0

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, features: torch.Tensor,
                root: torch.Tensor) -> None:
        """Nothing to record."""

    def propose(self, root: torch.Tensor, hidden: torch.Tensor) -> Proposal:
        return Proposal(root.view(-1, 1), self.tree)  # tokens [B, 1]

    def observe(self, kept: torch.Tensor, keep: torch.Tensor, next_root: torch.Tensor,
                features: torch.Tensor) -> None:
        """Nothing to record."""


__all__ = ["PlainProposer"]
