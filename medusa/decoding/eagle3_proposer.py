"""The eagle3 drafter's proposer: each step's tree grown the EAGLE-2 way from the draft layer.

```
prefill(ids, mask, features, root)   catch up over the prompt: entries (f_i, x_{i+1}) in the drafter's KV
propose(root)                        the root's expansion g (last catch-up output) -> top-`branch` children;
                                     depth 2..D: the `expand` best frontier nodes by cumulative draft
                                     log-probability run through the draft layer (tree attention: the
                                     cache plus their ancestors' entries) -> their top-`branch` children;
                                     the `num_nodes - 1` best nodes of the pool form the row's tree
observe(kept, keep, next_root, f)    drop the drafted entries, catch up over the kept path's base features
```
Every row drafts its own tree (a per-row tree, verified in the one forward like a dynamic tree). The drafts
are deterministic given the context (top-k), so "sample" acceptance's recursive rejection over point-mass
siblings keeps the base model's distribution; ``draft_probs`` stays None.
"""

from __future__ import annotations

import torch

from medusa.decoding.lookup import MAX_NGRAM, LookupContext, hybrid_tree, lookup_chain, new_context, observe
from medusa.decoding.trees import Proposal, RowTrees, tree_structure
from medusa.errors import MedusaError
from medusa.tree.draft_tree import DraftTreeShape


def _float_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``allowed [B, Q, S]`` bool -> ``[B, 1, Q, S]`` float (0 / dtype-min)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min).unsqueeze(1)


class Eagle3Proposer:
    """Drafts each row's tree with eagle3 ``heads`` on ``shape`` (masks in ``dtype``); holds the drafter's KV
    cache (catch-up entries only between steps), each row's valid entries ``valid [B, S]`` and root position
    ``pos [B]``. With ``shape.lookup_tokens = L``, a context-lookup chain of L tokens is merged into each
    row's tree where it follows a drafted path (:func:`medusa.decoding.lookup.hybrid_tree`); ``room`` is how
    far the lookup context can grow and ``trim`` cuts each step's chain to the rows' longest valid one."""

    def __init__(self, heads: torch.nn.Module, shape: DraftTreeShape, dtype: torch.dtype, room: int = 0,
                 trim: bool = False) -> None:
        self.heads, self.tree, self.dtype = heads, shape, dtype
        self.room, self.trim = room, trim
        self.cache = heads.new_cache()
        self.valid: torch.Tensor | None = None  # [B, S] bool
        self.pos: torch.Tensor | None = None  # [B] the root's position
        self.g_root: torch.Tensor | None = None  # [B, d] the draft layer's output at the last entry
        self.context: LookupContext | None = None  # the lookup chain's context (lookup_tokens > 0)

    @property
    def num_nodes(self) -> int:
        return self.tree.num_nodes + self.tree.lookup_tokens

    @property
    def depth(self) -> int:
        return self.tree.depth + self.tree.lookup_tokens

    # ------------------------------------------------------------------ the drafter's context
    def _catch_up(self, features: torch.Tensor, next_tokens: torch.Tensor, new_valid: torch.Tensor,
                  positions: torch.Tensor) -> None:
        """Append entries ``(features [B, M, F], next_tokens [B, M])`` at ``positions [B, M]`` (the
        ``new_valid [B, M]`` ones real) and keep the output at each row's last real entry."""
        heads = self.heads
        b, m = next_tokens.shape
        s = self.cache.length
        old = (self.valid if self.valid is not None
               else torch.zeros(b, 0, dtype=torch.bool, device=next_tokens.device))
        causal = torch.ones(m, m, dtype=torch.bool, device=next_tokens.device).tril()
        allowed = torch.cat([old.view(b, 1, s).expand(b, m, s),
                             causal.view(1, m, m) & new_valid.view(b, 1, m)], dim=-1)  # [B, M, S + M]
        dtype = heads.fc.weight.dtype
        g = heads.layer(heads.embed(next_tokens), heads.fuse(features), positions,
                        _float_mask(allowed, dtype), self.cache)  # [B, M, d]
        self.valid = torch.cat([old, new_valid], dim=1)
        last = (torch.arange(m, device=g.device).view(1, m) * new_valid).max(dim=1).values  # [B]
        self.g_root = g[torch.arange(b, device=g.device), last]  # [B, d]

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, features: torch.Tensor,
                root: torch.Tensor) -> None:
        """The prompt ``input_ids / attention_mask [B, T]`` (left padding), the base features at each prompt
        position ``[B, T, F]`` and the root ``[B]``: entries (f_i, x_{i+1}) for every real position."""
        self.cache, self.valid = self.heads.new_cache(), None
        if self.tree.lookup_tokens:
            self.context = new_context(input_ids, attention_mask, root, self.room)
        next_tokens = torch.cat([input_ids[:, 1:], root.view(-1, 1)], dim=1)  # [B, T]
        mask = attention_mask.bool()
        positions = attention_mask.long().cumsum(1)  # [B, T] the next token's position
        self._catch_up(features, next_tokens, mask, positions)
        self.pos = attention_mask.long().sum(1)  # [B]

    @torch.no_grad()
    def observe(self, kept: torch.Tensor, keep: torch.Tensor, next_root: torch.Tensor,
                features: torch.Tensor) -> None:
        """The step kept ``kept [B, D+1]`` (the first ``keep [B]``; root first), chose ``next_root [B]`` and
        the base's features at those nodes are ``features [B, D+1, F]``: catch up over them."""
        if self.context is not None:
            observe(self.context, kept, keep, next_root)
        m = int(keep.max())
        b = kept.shape[0]
        next_tokens = torch.cat([kept[:, 1:m], kept.new_zeros(b, 1)], dim=1)  # [B, m]
        next_tokens.scatter_(1, (keep - 1).view(b, 1), next_root.view(b, 1))
        offsets = torch.arange(m, device=kept.device).view(1, m)
        self._catch_up(features[:, :m], next_tokens, offsets < keep.view(b, 1),
                       self.pos.view(b, 1) + offsets + 1)
        self.pos = self.pos + keep

    # ------------------------------------------------------------------ one step's tree
    def _children(self, g: torch.Tensor, base_score: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """``g [B, E, d]`` -> the top-``branch`` children of each: scores, target ids ``[B, E * branch]``."""
        logp = torch.log_softmax(self.heads.logits(g).float(), dim=-1)  # [B, E, N]
        top = logp.topk(self.tree.branch, dim=-1)
        scores = base_score.unsqueeze(-1) + top.values  # [B, E, c]
        return scores.flatten(1), self.heads.to_target(top.indices).flatten(1)

    @torch.no_grad()
    def propose(self, root: torch.Tensor, hidden: torch.Tensor | None = None) -> Proposal:
        """This step's tree under ``root [B]`` (``hidden`` unused: the drafter keeps its own context)."""
        if self.g_root is None:
            raise MedusaError("Eagle3Proposer.propose before prefill: the drafter has no context")
        tokens, trees = self._draft(root)
        if self.context is None:
            return Proposal(tokens, trees)
        chain, valid = lookup_chain(self.context, trees.depth + self.tree.lookup_tokens, MAX_NGRAM)
        merged = hybrid_tree(tokens, trees, chain, valid, self.tree.lookup_tokens, self.trim)
        return Proposal(tokens, trees) if merged is None else Proposal(merged.tokens, merged)

    def _draft(self, root: torch.Tensor) -> tuple[torch.Tensor, RowTrees]:
        """The drafted tree's tokens ``[B, N]`` and per-row structure (the pool grown level by level)."""
        tree, heads = self.tree, self.heads
        b, c = root.shape[0], tree.branch
        device = root.device
        s0 = self.cache.length
        score, token = self._children(self.g_root.unsqueeze(1), torch.zeros(b, 1, device=device))
        pool_score, pool_token = [score], [token]  # each [B, c_l]
        pool_parent = [torch.full((b, c), -1, dtype=torch.long, device=device)]  # pool index, -1 = root
        level_g = self.g_root.unsqueeze(1).expand(b, c, -1)  # [B, c, d] hidden input of each new node
        level_start, anc = 0, torch.zeros(b, 0, 0, dtype=torch.bool, device=device)  # [B, E, E]
        entry_of_parent = torch.full((b, c), -1, dtype=torch.long, device=device)  # parent's entry
        for depth in range(2, tree.depth + 1):
            e = min(tree.expand, pool_score[-1].shape[1])
            sel = pool_score[-1].topk(e, dim=-1).indices  # [B, e] within the last level
            sel_entry_parent = entry_of_parent.gather(1, sel)  # [B, e]
            n_old = anc.shape[1]
            rows = torch.zeros(b, e, n_old + e, dtype=torch.bool, device=device)
            has_parent = sel_entry_parent >= 0
            if n_old:
                parent_rows = anc.gather(1, sel_entry_parent.clamp(min=0).unsqueeze(-1).expand(b, e, n_old))
                rows[..., :n_old] = parent_rows & has_parent.unsqueeze(-1)
            rows[..., n_old:] = torch.eye(e, dtype=torch.bool, device=device)
            anc = torch.cat([torch.cat([anc, anc.new_zeros(b, n_old, e)], dim=2), rows], dim=1)
            allowed = torch.cat([self.valid.view(b, 1, s0).expand(b, e, s0), rows], dim=-1)
            g = heads.layer(heads.embed(pool_token[-1].gather(1, sel)),
                            level_g.gather(1, sel.unsqueeze(-1).expand(-1, -1, level_g.shape[-1])),
                            (self.pos + depth - 1).view(b, 1).expand(b, e),
                            _float_mask(allowed, heads.fc.weight.dtype), self.cache)  # [B, e, d]
            score, token = self._children(g, pool_score[-1].gather(1, sel))
            offset = level_start + pool_score[-1].shape[1]
            pool_parent.append((level_start + sel).repeat_interleave(c, dim=1))  # [B, e * c]
            entry_of_parent = (n_old + torch.arange(e, device=device)).repeat_interleave(c).expand(b, -1)
            level_g = g.repeat_interleave(c, dim=1)  # [B, e * c, d]
            level_start = offset
            pool_score.append(score)
            pool_token.append(token)
        self.cache.truncate(s0)
        return self._tree(root, pool_score, pool_token, pool_parent)

    def _tree(self, root: torch.Tensor, pool_score: list[torch.Tensor], pool_token: list[torch.Tensor],
              pool_parent: list[torch.Tensor]) -> tuple[torch.Tensor, RowTrees]:
        """The ``num_nodes - 1`` best pool nodes (a parent always outranks its child: scores are cumulative
        log-probabilities, ties broken toward the shallower node) in level order under the root."""
        tree = self.tree
        b, n = root.shape[0], tree.num_nodes
        device = root.device
        levels = torch.cat([torch.full((s.shape[1],), d, dtype=torch.long, device=device)
                            for d, s in enumerate(pool_score, start=1)])  # [P]
        score = torch.cat(pool_score, dim=1) - 1e-6 * levels  # [B, P]
        token, parent = torch.cat(pool_token, dim=1), torch.cat(pool_parent, dim=1)  # [B, P]
        picked = score.topk(n - 1, dim=-1).indices.sort(dim=-1).values  # [B, N-1] level order
        where = torch.zeros(b, score.shape[1] + 1, dtype=torch.long, device=device)  # pool + 1 -> node
        where.scatter_(1, picked + 1, torch.arange(1, n, device=device).expand(b, n - 1))
        tokens = torch.cat([root.view(b, 1), token.gather(1, picked)], dim=1)  # [B, N]
        parents = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=device),
                             where.gather(1, parent.gather(1, picked) + 1)], dim=1)  # [B, N]
        depths = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=device), levels[picked]], dim=1)
        return tokens, tree_structure(tokens, parents, depths, tree.depth, tree.branch, self.dtype)


__all__ = ["Eagle3Proposer"]
