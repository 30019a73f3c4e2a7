"""Context lookup drafts and the hybrid tree: the heads' tree and a lookup chain verified in one forward.

**Lookup** (prompt lookup, generalised to the whole context): the context's last n tokens (n from
``max_ngram`` down to 1, the longest that occurs earlier) are found at their most recent earlier occurrence
in the row's prompt + generated tokens, and the tokens that followed it are proposed as a chain. It runs on
the device over a fixed-width token buffer (:class:`LookupContext`) with no host read: a row without a
match gets a chain whose nodes are marked invalid (they are verified, never accepted).

**The hybrid tree** (:func:`hybrid_tree`, proposed by :class:`LookupProposer`, which wraps any proposer):
the proposer's tree (N nodes, depth D: a static tree, a dynamic one, a drafter's) plus L chain nodes
hanging from the root. Where the chain's first m tokens coincide with a path of the heads' tree the chain is
merged into it: its L nodes hang from that path's node and carry the chain's tokens m .. m+L-1, so no
prefix is verified twice and the merge lengthens the chain instead of wasting nodes. Every row has its own
tree (a :class:`medusa.decoding.trees.RowTrees` of N + L nodes, depth D + L): the acceptance rules
and the logits processors take it as they take a dynamic tree's. Lookup tokens are deterministic drafts
(point masses) like the heads' top-k, so "sample" acceptance stays lossless: the chain's node is one more
sibling, tried after the heads' children with recursive rejection sampling.

Lookup alone (``tree="lookup"``) wraps the plain proposer: the heads' part is the root alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from medusa.decoding.kv_cache import cache_bucket
from medusa.decoding.trees import Proposal, RowTrees, StaticTree, TreeNodes, tree_structure
from medusa.errors import MedusaError

MAX_NGRAM = 3  # the longest context suffix looked up (then shorter ones)
TreeLike = StaticTree | RowTrees | TreeNodes  # what a chain merges into: parents, depths, depth, kmax, dtype


@dataclass
class LookupContext:
    """Each row's context on the device: its prompt (left padding as -1), then every kept token, the next
    root last. The last column is scratch (writes past a finished row's room land there)."""

    tokens: torch.Tensor  # [B, W] long, -1 where no token
    end: torch.Tensor  # [B] long: tokens in the row's context, root included (the root at end - 1)


def new_context(input_ids: torch.Tensor, mask2d: torch.Tensor, root: torch.Tensor, room: int
                ) -> LookupContext:
    """The context of a left-padded prompt ``[B, P]`` and its first root ``[B]``, with ``room`` columns for
    later tokens (bucketed like the static cache, so compiled steps share one shape per bucket)."""
    b, p = input_ids.shape
    width = cache_bucket(p + room + 2)
    tokens = torch.full((b, width), -1, dtype=torch.long, device=input_ids.device)  # [B, W]
    tokens[:, :p] = torch.where(mask2d.bool(), input_ids, -1)
    tokens[:, p] = root
    return LookupContext(tokens, torch.full((b,), p + 1, dtype=torch.long, device=input_ids.device))


def observe(context: LookupContext, kept: torch.Tensor, keep: torch.Tensor, next_root: torch.Tensor) -> None:
    """Append a step's outcome in place: ``kept [B, D+1]`` (the path's tokens, root first; the first
    ``keep [B]`` are kept) and ``next_root [B]``. The old root is rewritten with itself."""
    b, width = kept.shape
    cols = context.tokens.shape[1]
    ar = torch.arange(width + 1, device=kept.device)  # [D+2]
    values = torch.where(ar == keep.view(b, 1), next_root.view(b, 1),
                         torch.cat([kept, kept[:, :1]], dim=1))  # [B, D+2]: kept tokens, then the next root
    pos = context.end.view(b, 1) - 1 + ar  # [B, D+2]
    pos = torch.where((ar <= keep.view(b, 1)) & (pos < cols - 1), pos, cols - 1)  # the rest to scratch
    context.tokens.scatter_(1, pos, values)
    context.end.add_(keep).clamp_(max=cols - 1)


def lookup_chain(context: LookupContext, length: int, max_ngram: int = MAX_NGRAM
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``length`` tokens that followed the most recent earlier occurrence of the context's longest
    matching suffix (n = ``max_ngram`` .. 1). Returns ``(chain [B, length], valid [B, length])``; ``valid``
    is False past the known context and for rows without a match (their chain holds 0s)."""
    buf, end = context.tokens, context.end
    b, width = buf.shape
    device = buf.device
    start = torch.full((b,), -1, dtype=torch.long, device=device)  # [B] index of the chain's first token
    for n in range(1, max_ngram + 1):  # longer n overrides: the longest suffix that matches wins
        offs = end.view(b, 1) - n + torch.arange(n, device=device)  # [B, n] the suffix's columns
        suffix = buf.gather(1, offs.clamp(min=0))  # [B, n]
        usable = (end >= n) & (suffix >= 0).all(dim=1)  # [B]
        hit = (buf.unfold(1, n, 1) == suffix.view(b, 1, n)).all(dim=2)  # [B, W-n+1] window i == suffix
        follow = torch.arange(n, width + 1, device=device)  # [W-n+1] the column after window i
        hit = hit & (follow.view(1, -1) < end.view(b, 1))  # an earlier occurrence (not the suffix itself)
        latest = torch.where(hit, follow.view(1, -1), -1).amax(dim=1)  # [B]
        start = torch.where(usable & (latest >= 0), latest, start)
    pos = start.view(b, 1) + torch.arange(length, device=device)  # [B, length]
    valid = (start.view(b, 1) >= 0) & (pos < end.view(b, 1))
    chain = buf.gather(1, pos.clamp(0, width - 1))
    return torch.where(valid, chain, 0), valid


def merge_point(head_tokens: torch.Tensor, heads: TreeLike, chain: torch.Tensor, valid: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """How far the chain runs along a path of the heads' tree: ``(node [B], m [B])``, the deepest heads
    node whose path tokens equal the chain's first m tokens (the root and 0 when its first token is no
    child of the root). Siblings hold distinct tokens, so the path is unique."""
    b, n = head_tokens.shape
    parents, depths = heads.parents.expand(b, n), heads.depths.expand(b, n)  # [B, N]
    node = torch.zeros(b, dtype=torch.long, device=head_tokens.device)  # [B]
    m = torch.zeros_like(node)
    going = torch.ones(b, dtype=torch.bool, device=head_tokens.device)
    for j in range(heads.depth):
        hit = ((depths == j + 1) & (parents == node.view(b, 1)) & (head_tokens == chain[:, j:j + 1])
               & valid[:, j:j + 1])  # [B, N]: the child of ``node`` holding the chain's next token
        moved = going & hit.any(dim=1)
        node = torch.where(moved, hit.long().argmax(dim=1), node)
        m = m + moved.long()
        going = moved
    return node, m


def hybrid_tree(head_tokens: torch.Tensor, heads: TreeLike, chain: torch.Tensor, valid: torch.Tensor,
                lookup_tokens: int, trim: bool = False) -> RowTrees | None:
    """Each row's tree: the heads' ``head_tokens [B, N]`` on ``heads`` (a static tree, or a grower's
    :class:`TreeNodes` / per-row trees: their parents and depths) plus ``lookup_tokens`` (L) chain nodes
    merged where the chain (``chain [B, D+L]``, ``valid [B, D+L]``) follows a heads path; the tables are
    built once, here. Nodes N .. N+L-1 are the chain; invalid ones are in no candidate path and no node's
    child. ``trim``: L cut to the rows' longest valid chain (a host read); None when no row has one (the
    heads' tree alone)."""
    b, n = head_tokens.shape
    device = head_tokens.device
    node, m = merge_point(head_tokens, heads, chain, valid)  # [B]
    at = m.view(b, 1) + torch.arange(lookup_tokens, device=device)  # [B, L] the chain past the merge
    chain_ok = valid.gather(1, at)  # [B, L]
    if trim:
        lookup_tokens = int(chain_ok.sum(dim=1).max())  # valid entries are a prefix of each row's chain
        if lookup_tokens == 0:
            return None
        at, chain_ok = at[:, :lookup_tokens], chain_ok[:, :lookup_tokens]
    ar = torch.arange(lookup_tokens, device=device)  # [L]
    tokens = torch.cat([head_tokens, torch.where(chain_ok, chain.gather(1, at), 0)], dim=1)  # [B, N+L]
    parents = torch.cat([heads.parents.expand(b, n), node.view(b, 1), (n + ar[:-1]).expand(b, -1)], dim=1)
    depths = torch.cat([heads.depths.expand(b, n), m.view(b, 1) + 1 + ar], dim=1)  # [B, N+L]
    tree = tree_structure(tokens, parents, depths, heads.depth + lookup_tokens, heads.kmax + 1, heads.dtype)
    ok = torch.cat([torch.ones(b, n, dtype=torch.bool, device=device), chain_ok], dim=1)  # [B, N+L]
    on_path = ok.gather(1, tree.retrieve[..., 1:].reshape(b, -1)).view(tree.retrieve_valid.shape)
    tree.retrieve_valid = tree.retrieve_valid & on_path  # [B, N+L, D+L]
    kids = tree.children
    tree.children = torch.where((kids >= 0) & ok.gather(1, kids.clamp(min=0).view(b, -1)).view(kids.shape),
                                kids, -1)  # [B, N+L, kmax+1]
    return tree


class LookupProposer:
    """Any proposer (``inner``) plus ``lookup_tokens`` chain nodes from each row's context, merged into its
    tree (:func:`hybrid_tree`); the chain alone is ``inner`` = the plain proposer (the root). ``room``: how
    far each row's context can grow (the run's new tokens and one step's overshoot); ``trim``: cut each
    step's chain to the rows' longest acceptable one (a host read: the eager CPU path; fixed shapes
    elsewhere). Where ``inner`` samples its drafts (``draft_probs``), a chain node's row is a point mass on
    its token: one more deterministic sibling for recursive rejection."""

    def __init__(self, inner: Any, lookup_tokens: int, room: int, trim: bool = False,
                 max_ngram: int = MAX_NGRAM) -> None:
        self.inner, self.lookup_tokens, self.room = inner, lookup_tokens, room
        self.trim, self.max_ngram = trim, max_ngram
        self.context: LookupContext | None = None  # set by prefill

    @property
    def num_nodes(self) -> int:
        return self.inner.num_nodes + self.lookup_tokens

    @property
    def depth(self) -> int:
        return self.inner.depth + self.lookup_tokens

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, features: torch.Tensor,
                root: torch.Tensor) -> None:
        """Record each row's prompt (its real tokens) and first root as its lookup context."""
        self.context = new_context(input_ids, attention_mask, root, self.room)
        self.inner.prefill(input_ids, attention_mask, features, root)

    def propose(self, root: torch.Tensor, hidden: torch.Tensor) -> Proposal:
        if self.context is None:
            raise MedusaError("LookupProposer.propose before prefill: the lookup context is not recorded")
        proposal = self.inner.propose(root, hidden)
        heads = proposal.nodes if proposal.nodes is not None else proposal.tree
        length = heads.depth + self.lookup_tokens  # D + L
        chain, valid = lookup_chain(self.context, length, self.max_ngram)  # [B, D+L]
        trees = hybrid_tree(proposal.tokens, heads, chain, valid, self.lookup_tokens, self.trim)
        if trees is None:  # trimmed: no row has a chain to verify this step
            return proposal
        q = proposal.draft_probs
        if q is not None:  # the chain's nodes are point masses on their tokens
            chain_q = torch.zeros(q.shape[0], trees.num_nodes - q.shape[1], q.shape[2], device=q.device)
            q = torch.cat([q, chain_q.scatter_(2, trees.tokens[:, q.shape[1]:, None], 1.0)], dim=1)
        return Proposal(trees.tokens, trees, q)

    def observe(self, kept: torch.Tensor, keep: torch.Tensor, next_root: torch.Tensor,
                features: torch.Tensor) -> None:
        observe(self.context, kept, keep, next_root)
        self.inner.observe(kept, keep, next_root, features)


__all__ = ["MAX_NGRAM", "LookupContext", "LookupProposer", "TreeLike", "hybrid_tree", "lookup_chain",
           "merge_point", "new_context", "observe"]
