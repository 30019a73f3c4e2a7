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
Every row drafts its own tree (a per-row tree, verified in the one forward like a dynamic tree). Greedy and
typical decoding draft each node's top-``branch`` children (deterministic: "sample" acceptance could treat
them as point masses). With :class:`DraftSampling` ("sample" acceptance) the children are *sampled* from the
drafter's distribution q (its softmax at the run's temperature) without replacement (Gumbel top-k: child r
is drawn from q with children 0..r-1 removed, ``q_r``), and ``Proposal.draft_probs [B, N, V]`` carries each
node's ``q_r``, so recursive rejection accepts child x with probability ``min(1, p(x) / q_r(x))``
(:func:`medusa.decoding.acceptance.sample_accept`). That stays lossless only if whether a node is in the
tree does not depend on the node's own token: in sampling mode the pool is ranked by the *parent's*
cumulative score (then depth, then sibling order), so a node's place is fixed before it is drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from medusa.decoding.draft_pool import closed_keys, pick_tree
from medusa.decoding.lookup import MAX_NGRAM, LookupContext, hybrid_tree, lookup_chain, new_context, observe
from medusa.decoding.trees import Proposal, RowTrees
from medusa.errors import MedusaError
from medusa.tree.draft_tree import DraftTreeShape


@dataclass
class DraftSampling:
    """Sampled drafting ("sample" acceptance): children drawn from ``softmax(draft logits / temperature)``
    with ``generator``."""

    temperature: float = 1.0
    generator: torch.Generator | None = None


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
                 trim: bool = False, sampling: DraftSampling | None = None) -> None:
        self.heads, self.tree, self.dtype = heads, shape, dtype
        self.room, self.trim, self.sampling = room, trim, sampling
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
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``g [B, E, d]`` -> ``branch`` children of each: scores and target ids ``[B, E * branch]``, and
        with sampling each child's ``q_r`` over the draft vocabulary ``[B, E * branch, N]`` (else None)."""
        logits = self.heads.logits(g).float()  # [B, E, N]
        c = self.tree.branch
        if self.sampling is None:
            top = torch.log_softmax(logits, dim=-1).topk(c, dim=-1)
            scores = base_score.unsqueeze(-1) + top.values  # [B, E, c]
            return scores.flatten(1), self.heads.to_target(top.indices).flatten(1), None
        logq = torch.log_softmax(logits / self.sampling.temperature, dim=-1)  # [B, E, N]
        u = torch.rand(logq.shape, generator=self.sampling.generator, device=logq.device)
        gumbel = -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))
        picked = (logq + gumbel).topk(c, dim=-1).indices  # [B, E, c] a sample without replacement, in order
        seen = torch.zeros(logq.shape, dtype=torch.bool, device=logq.device)  # the children drawn before
        q_r = []
        for r in range(c):  # q without them, renormalised in log space (q itself may underflow to one-hot)
            q_r.append(torch.softmax(logq.masked_fill(seen, float("-inf")), dim=-1))  # [B, E, N]
            seen.scatter_(-1, picked[..., r:r + 1], True)
        q_rank = torch.stack(q_r, dim=2)  # [B, E, c, N]
        scores = base_score.unsqueeze(-1) + logq.gather(-1, picked)  # [B, E, c]
        return (scores.flatten(1), self.heads.to_target(picked).flatten(1),
                q_rank.flatten(1, 2))  # [B, E * c, N]

    @torch.no_grad()
    def propose(self, root: torch.Tensor, hidden: torch.Tensor | None = None) -> Proposal:
        """This step's tree under ``root [B]`` (``hidden`` unused: the drafter keeps its own context)."""
        if self.g_root is None:
            raise MedusaError("Eagle3Proposer.propose before prefill: the drafter has no context")
        tokens, trees, q = self._draft(root)
        if self.context is None:
            return Proposal(tokens, trees, q)
        chain, valid = lookup_chain(self.context, trees.depth + self.tree.lookup_tokens, MAX_NGRAM)
        merged = hybrid_tree(tokens, trees, chain, valid, self.tree.lookup_tokens, self.trim)
        if merged is None:
            return Proposal(tokens, trees, q)
        if q is not None:  # the chain's nodes are point masses on their tokens
            chain_q = torch.zeros(q.shape[0], merged.num_nodes - q.shape[1], q.shape[2], device=q.device)
            q = torch.cat([q, chain_q.scatter_(2, merged.tokens[:, q.shape[1]:, None], 1.0)], dim=1)
        return Proposal(merged.tokens, merged, q)

    def _draft(self, root: torch.Tensor) -> tuple[torch.Tensor, RowTrees, torch.Tensor | None]:
        """The drafted tree's tokens ``[B, N]``, per-row structure (the pool grown level by level) and, with
        sampling, each node's ``q_r`` over the target vocabulary ``[B, N, V]`` (the root's row zero)."""
        tree, heads = self.tree, self.heads
        b, c = root.shape[0], tree.branch
        device = root.device
        s0 = self.cache.length
        score, token, q = self._children(self.g_root.unsqueeze(1), torch.zeros(b, 1, device=device))
        pool_score, pool_token, pool_q = [score], [token], [q]  # each [B, c_l] ([B, c_l, N])
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
            score, token, q = self._children(g, pool_score[-1].gather(1, sel))
            offset = level_start + pool_score[-1].shape[1]
            pool_parent.append((level_start + sel).repeat_interleave(c, dim=1))  # [B, e * c]
            entry_of_parent = (n_old + torch.arange(e, device=device)).repeat_interleave(c).expand(b, -1)
            level_g = g.repeat_interleave(c, dim=1)  # [B, e * c, d]
            level_start = offset
            pool_score.append(score)
            pool_token.append(token)
            pool_q.append(q)
        self.cache.truncate(s0)
        tokens, trees, picked = self._tree(root, pool_score, pool_token, pool_parent)
        if self.sampling is None:
            return tokens, trees, None
        return tokens, trees, self._node_q(torch.cat(pool_q, dim=1), picked)

    def _node_q(self, pool_q: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
        """The picked nodes' ``q_r`` (``pool_q [B, P, N]`` over the draft vocabulary, ``picked [B, N-1]``) on
        the target vocabulary, a zero row for the root: ``[B, N, V]``."""
        b, m = picked.shape
        q = pool_q.gather(1, picked.unsqueeze(-1).expand(b, m, pool_q.shape[2]))  # [B, N-1, N_draft]
        full = torch.zeros(b, m + 1, self.heads.vocab_size, device=q.device)  # [B, N, V]
        token_map = self.heads.token_map
        if token_map is None:
            full[:, 1:] = q
        else:
            full[:, 1:].scatter_(2, token_map.view(1, 1, -1).expand(b, m, -1), q)
        return full

    def _tree(self, root: torch.Tensor, pool_score: list[torch.Tensor], pool_token: list[torch.Tensor],
              pool_parent: list[torch.Tensor]) -> tuple[torch.Tensor, RowTrees, torch.Tensor]:
        """The ``num_nodes - 1`` best pool nodes in level order under the root (and their pool indices
        ``[B, N-1]``). Ranked by the node's cumulative log-probability (top-k drafting) or, with sampling, by
        its parent's (a node's place must not depend on its own sampled token); ties go to the shallower
        node, then the earlier sibling, and every key is clamped strictly below its parent's
        (:func:`medusa.decoding.draft_pool.closed_keys`), so a node is kept only with its parent."""
        tree = self.tree
        device = root.device
        sizes = [s.shape[1] for s in pool_score]
        levels = torch.cat([torch.full((size,), d, dtype=torch.long, device=device)
                            for d, size in enumerate(sizes, start=1)])  # [P]
        token, parent = torch.cat(pool_token, dim=1), torch.cat(pool_parent, dim=1)  # [B, P]
        own = torch.cat(pool_score, dim=1).double()  # [B, P]
        if self.sampling is None:
            raw = own - 1e-6 * levels  # [B, P]
        else:
            parent_score = torch.where(parent >= 0, own.gather(1, parent.clamp(min=0)), 0.0)  # [B, P]
            rank = torch.cat([torch.arange(size, device=device) % tree.branch for size in sizes])
            raw = parent_score - 1e-6 * levels - 1e-9 * rank  # [B, P]
        trees, picked = pick_tree(root, closed_keys(raw, parent, sizes), token, parent, levels,
                                  tree.num_nodes, tree.depth, tree.branch, self.dtype)
        return trees.tokens, trees, picked


__all__ = ["DraftSampling", "Eagle3Proposer"]
