"""Sampled drafts ("sample" acceptance): a drafter's children drawn from its distribution, and what each
node was drawn from.

Children are *sampled* from the drafter's distribution q (its softmax at the run's temperature) without
replacement (Gumbel top-k: child r is drawn from q with children 0..r-1 removed, ``q_r``), and
``Proposal.draft_probs [B, N, V]`` carries each node's ``q_r``, so recursive rejection accepts child x with
probability ``min(1, p(x) / q_r(x))`` (:func:`medusa.decoding.acceptance.sample_accept`). That stays
lossless only if whether a node is in the tree does not depend on the node's own token: the grower then
ranks the pool by the *parent's* cumulative score (:func:`medusa.decoding.draft_growth.grow`,
``by_parent``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from medusa.decoding.draft_growth import ChildrenOf


@dataclass
class DraftSampling:
    """Sampled drafting ("sample" acceptance): children drawn from ``softmax(draft logits / temperature)``
    with ``generator``."""

    temperature: float = 1.0
    generator: torch.Generator | None = None


def sampled_children(branch: int, sampling: DraftSampling) -> ChildrenOf:
    """Each node's ``branch`` children sampled without replacement, with each child's ``q_r``."""

    def children(logits: torch.Tensor, base_score: torch.Tensor):
        logq = torch.log_softmax(logits.float() / sampling.temperature, dim=-1)  # [B, E, N]
        u = torch.rand(logq.shape, generator=sampling.generator, device=logq.device)
        gumbel = -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))
        picked = (logq + gumbel).topk(branch, dim=-1).indices  # [B, E, c] a sample without replacement
        seen = torch.zeros(logq.shape, dtype=torch.bool, device=logq.device)  # the children drawn before
        q_r = []
        for r in range(branch):  # q without them, renormalised in log space (q may underflow to one-hot)
            q_r.append(torch.softmax(logq.masked_fill(seen, float("-inf")), dim=-1))  # [B, E, N]
            seen.scatter_(-1, picked[..., r:r + 1], True)
        q_rank = torch.stack(q_r, dim=2)  # [B, E, c, N]
        scores = base_score.unsqueeze(-1) + logq.gather(-1, picked)  # [B, E, c]
        return scores.flatten(1), picked.flatten(1), q_rank.flatten(1, 2)  # [B, E * c] (q: [B, E * c, N])

    return children


def node_q(pool_q: torch.Tensor, picked: torch.Tensor, token_map: torch.Tensor | None,
           vocab_size: int) -> torch.Tensor:
    """The picked nodes' ``q_r`` (``pool_q [B, P, N]`` over the draft vocabulary, ``picked [B, N-1]``) on
    the target vocabulary (``token_map [N]`` draft id -> target id; None: the same), a zero row for the
    root: ``[B, N, V]``."""
    b, m = picked.shape
    q = pool_q.gather(1, picked.unsqueeze(-1).expand(b, m, pool_q.shape[2]))  # [B, N-1, N_draft]
    full = torch.zeros(b, m + 1, vocab_size, device=q.device)  # [B, N, V]
    if token_map is None:
        full[:, 1:] = q
    else:
        full[:, 1:].scatter_(2, token_map.view(1, 1, -1).expand(b, m, -1), q)
    return full


__all__ = ["DraftSampling", "node_q", "sampled_children"]
