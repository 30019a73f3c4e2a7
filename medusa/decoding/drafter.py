"""Sequential drafters (EAGLE-3 now; block drafters later): the :class:`Drafter` protocol, the drafter's
context between steps and the proposer that grows each step's tree from it.

```
prefill(ids, mask, features, root)   the context: entries (f_i, x_{i+1}) over the prompt in the drafter's KV
propose(root)                        the tree grown from the context (medusa.decoding.draft_growth.grow),
                                     children top-k or sampled (medusa.decoding.draft_sampling)
observe(kept, keep, next_root, f)    the kept path's entries appended to the context (base features)
```
Every row drafts its own tree (a per-row tree, verified in the one forward like a dynamic tree). The
decoder speaks to the drafter through :class:`Drafter` only; parallel heads (MEDUSA, Hydra) are the other
kind (:class:`medusa.modeling.protocol.Heads`) and :func:`medusa.decoding.proposals.choose_proposer` tells
them apart by this protocol. A context-lookup chain is added by wrapping the proposer
(:class:`medusa.decoding.lookup.LookupProposer`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from medusa.decoding.draft_growth import float_mask, grow, top_children
from medusa.decoding.draft_sampling import DraftSampling, node_q, sampled_children
from medusa.decoding.hf import AttentionCache
from medusa.decoding.trees import Proposal
from medusa.errors import MedusaError


class DraftCache(AttentionCache, Protocol):
    """The drafter's own KV cache: the attention-facing cache interface the target's caches have
    (``update``, ``get_seq_length``: entries held, equal for every row, a row's invalid ones masked) plus
    dropping a step's draft entries (see docs/design.md, "Caches")."""

    def truncate(self, length: int) -> None:
        """Drop every entry past ``length`` (a step's draft entries)."""


@runtime_checkable
class Drafter(Protocol):
    """A sequential drafter: one pass per tree level over its own KV cache, reading the base's features at
    the positions the target kept. Implemented by :class:`medusa.modeling.eagle3.Eagle3Heads`."""

    num_heads: int  # the draft steps it is trained for (the deepest tree it drafts)
    vocab_size: int  # V, the target vocabulary
    token_map: torch.Tensor | None  # [N] draft id -> target id; None with the full vocabulary
    feature_layers: tuple[int, ...]  # the base hidden states it reads ([B, T, len * d] features)

    @property
    def dtype(self) -> torch.dtype:
        """Its compute dtype."""

    def new_cache(self) -> DraftCache:
        """An empty KV cache."""

    def context_pass(self, features: torch.Tensor, next_tokens: torch.Tensor, positions: torch.Tensor,
                     mask: torch.Tensor, cache: DraftCache, last: torch.Tensor) -> torch.Tensor:
        """Entries from the base's features ``[B, M, F]`` and the tokens after them ``[B, M]`` at
        ``positions [B, M]`` under ``mask [B, 1, M, S + M]`` (M entries appended) -> the output at each
        row's entry ``last [B]`` ``[B, d]`` (its last real one: the next root's expansion)."""

    def draft_pass(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                   mask: torch.Tensor, cache: DraftCache) -> torch.Tensor:
        """One tree level: parents' outputs ``[B, E, d]`` and the nodes' target ids ``[B, E]`` ->
        ``[B, E, d]`` (E entries appended)."""

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """Outputs ``[..., d]`` -> logits over the draft vocabulary ``[..., N]``."""

    def top_log_probs(self, g: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs ``[..., d]`` -> the ``k`` largest draft log-probabilities ``[..., k]`` (float32,
        descending; :func:`medusa.native.pick.top_log_softmax` of :meth:`logits`) and their draft ids
        ``[..., k]``."""

    def draft_top(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                  mask: torch.Tensor, cache: DraftCache, k: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`draft_pass` then :meth:`top_log_probs` of its outputs (a drafter may do both at once):
        ``(g [B, E, d], values [B, E, k], draft ids [B, E, k])``."""

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids (any shape) -> target ids."""


class DrafterContext:
    """What the drafter has read: its KV cache (context entries only between steps), each row's valid
    entries ``valid [B, S]``, the root's position ``pos [B]`` and the output at each row's last entry
    ``g_root [B, d]`` (the root's expansion)."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.cache = drafter.new_cache()
        self.valid: torch.Tensor | None = None  # [B, S] bool
        self.pos: torch.Tensor | None = None  # [B]
        self.g_root: torch.Tensor | None = None  # [B, d]

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, features: torch.Tensor,
                root: torch.Tensor) -> None:
        """The prompt ``[B, T]`` (left padding), the base features at each prompt position ``[B, T, F]`` and
        the root ``[B]``: entries (f_i, x_{i+1}) for every real position."""
        self.cache, self.valid = self.drafter.new_cache(), None
        next_tokens = torch.cat([input_ids[:, 1:], root.view(-1, 1)], dim=1)  # [B, T]
        positions = attention_mask.long().cumsum(1)  # [B, T] the next token's position
        self._append(features, next_tokens, attention_mask.bool(), positions)
        self.pos = attention_mask.long().sum(1)  # [B]

    def observe(self, kept: torch.Tensor, keep: torch.Tensor, next_root: torch.Tensor,
                features: torch.Tensor) -> None:
        """The step kept ``kept [B, D+1]`` (the first ``keep [B]``; root first), chose ``next_root [B]``;
        ``features [B, D+1, F]``: the base's features at those nodes, from the verify forward.

        The kept nodes' draft entries (dropped after ``propose``) are not reused: a drafted entry joins
        the node's token with its parent's *draft output* g (the base had not seen the node yet), while
        the context entry at the same position joins it with the base's own features there, which only
        the verify forward computed; EAGLE-3 trains its first step on the latter (the drafts read them),
        so these entries are new work, and the only pass over them. Of its outputs only the last real
        entry's is read (the next root's expansion): the layer's MLP runs there alone."""
        m = int(keep.max())
        b = kept.shape[0]
        next_tokens = torch.cat([kept[:, 1:m], kept.new_zeros(b, 1)], dim=1)  # [B, m]
        next_tokens.scatter_(1, (keep - 1).view(b, 1), next_root.view(b, 1))
        offsets = torch.arange(m, device=kept.device).view(1, m)
        positions = self.pos.view(b, 1) + offsets + 1  # [B, m]
        self._append(features[:, :m], next_tokens, offsets < keep.view(b, 1), positions)
        self.pos = self.pos + keep

    def _append(self, features: torch.Tensor, next_tokens: torch.Tensor, new_valid: torch.Tensor,
                positions: torch.Tensor) -> None:
        """Entries ``(features [B, M, F], next_tokens [B, M])`` at ``positions [B, M]`` (the ``new_valid
        [B, M]`` ones real); keeps the output at each row's last real entry."""
        b, m = next_tokens.shape
        s = self.cache.get_seq_length()
        old = (self.valid if self.valid is not None
               else torch.zeros(b, 0, dtype=torch.bool, device=next_tokens.device))
        causal = torch.ones(m, m, dtype=torch.bool, device=next_tokens.device).tril()
        allowed = torch.cat([old.view(b, 1, s).expand(b, m, s),
                             causal.view(1, m, m) & new_valid.view(b, 1, m)], dim=-1)  # [B, M, S + M]
        mask = float_mask(allowed, self.drafter.dtype)  # [B, 1, M, S + M]
        last = (torch.arange(m, device=new_valid.device).view(1, m) * new_valid).max(dim=1).values  # [B]
        self.g_root = self.drafter.context_pass(features, next_tokens, positions, mask, self.cache, last)
        self.valid = torch.cat([old, new_valid], dim=1)


class DrafterProposer:
    """Grows each row's tree with ``drafter`` on ``shape`` (a DraftTreeShape: num_nodes, depth, branch,
    expand; masks in ``dtype``) from its :class:`DrafterContext`; ``sampling``: "sample" acceptance's
    temperature and generator (the children are then sampled and carry their ``q_r``)."""

    def __init__(self, drafter: Drafter, shape: Any, dtype: torch.dtype,
                 sampling: DraftSampling | None = None) -> None:
        self.drafter, self.shape, self.dtype, self.sampling = drafter, shape, dtype, sampling
        self.context = DrafterContext(drafter)
        self.children = (top_children(shape.branch) if sampling is None
                         else sampled_children(shape.branch, sampling))

    @property
    def num_nodes(self) -> int:
        return self.shape.num_nodes

    @property
    def depth(self) -> int:
        return self.shape.depth

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, features: torch.Tensor,
                root: torch.Tensor) -> None:
        self.context.prefill(input_ids, attention_mask, features, root)

    @torch.no_grad()
    def propose(self, root: torch.Tensor, hidden: torch.Tensor | None = None) -> Proposal:
        """This step's tree under ``root [B]`` (``hidden`` unused: the drafter keeps its own context), its
        tables built when the step first reads ``Proposal.tree``."""
        if self.context.g_root is None:
            raise MedusaError("the drafter's propose ran before prefill: it has no context")
        nodes, picked, pool_q = grow(self.drafter, self.context, root, self.shape, self.children,
                                     self.sampling is not None, self.dtype)
        q = None
        if self.sampling is not None:
            q = node_q(torch.cat(pool_q, dim=1), picked, self.drafter.token_map, self.drafter.vocab_size)
        return Proposal(nodes.tokens, None, q, nodes=nodes)

    @torch.no_grad()
    def observe(self, kept: torch.Tensor, keep: torch.Tensor, next_root: torch.Tensor,
                features: torch.Tensor) -> None:
        self.context.observe(kept, keep, next_root, features)


__all__ = ["DraftCache", "Drafter", "DrafterContext", "DrafterProposer"]
