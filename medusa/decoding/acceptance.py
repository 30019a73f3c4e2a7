"""Acceptance rules: which tree path to keep and the next (bonus) token. Pure functions of tensors.

Every rule takes the verification logits ``[B, N, V]`` (the base model's logits at each tree node) and
the tree tokens ``[B, N]``, and returns ``(path [B, D+1], n_accepted [B], next_token [B])``: the node
indices of the kept root-to-leaf path, how many nodes past the root were accepted (``path[:, :n+1]``
are the kept nodes), and the token that follows the last kept node (the next step's root).

:class:`Scorer` is what a decode step calls: built once per run, it applies the logits processors (each
tree node's scores after its own prefix) and then the run's rule; compiled decoding wraps the same scorer
(its greedy rule compiled).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from medusa.decoding.processors import Generation, Warp, apply_processors, process_nodes, warp_scores
from medusa.decoding.trees import VerifyTree
from medusa.errors import MedusaError
from medusa.native.pick import first_max  # argmax's answer; bfloat16 through the C library (re-exported)

# (logits [B, N, V], tokens [B, N], tree) -> (path [B, D+1], n_accepted [B], next_token [B])
Rule = Callable[[torch.Tensor, torch.Tensor, VerifyTree], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def rows_at(x: torch.Tensor, index: torch.Tensor, per_row: bool) -> torch.Tensor:
    """``x [B, N, ...]`` at node indices ``index``: ``[M...]`` shared by all rows (a static tree) or, with
    ``per_row``, ``[B, M...]`` (a :class:`RowTrees`) -> ``[B, M..., ...]``."""
    if not per_row:
        return x[:, index]
    b = x.shape[0]
    rows = torch.arange(b, device=x.device).view(b, 1)
    return x[rows, index.reshape(b, -1)].view(*index.shape, *x.shape[2:])


def _best_path(ok: torch.Tensor, dt: VerifyTree, score: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Longest accepted prefix over root-to-leaf paths.

    ``ok [B, N]``: node i's token is accepted given its parent. ``score [B, N]`` (optional): per-node
    log-likelihood used to break ties between equally long paths. Returns (path [B, D+1], n [B], last [B]).
    """
    b = ok.shape[0]
    per_row = dt.per_row  # per-row trees: retrieve [B, L, D+1], every node a leaf
    nodes = dt.retrieve[..., 1:]  # [L, D] or [B, L, D]
    ok_path = rows_at(ok, nodes, per_row) & dt.retrieve_valid  # [B, L, D]
    run = ok_path.long().cumprod(dim=-1)  # [B, L, D]
    lengths = run.sum(dim=-1)  # [B, L]
    if score is None:
        best = lengths.argmax(dim=-1)  # [B]
    else:
        best_len = lengths.max(dim=-1, keepdim=True).values  # [B, 1]
        like = (rows_at(score, nodes, per_row) * run).sum(dim=-1)  # [B, L] log-likelihood of the prefixes
        like = like.masked_fill(lengths < best_len, float("-inf"))
        best = like.argmax(dim=-1)
    n = lengths.gather(1, best.view(b, 1)).view(b)  # [B]
    if per_row:
        path = dt.retrieve[torch.arange(b, device=ok.device), best]  # [B, D+1]
    else:
        path = dt.retrieve.index_select(0, best)  # [B, D+1]
    last = path.gather(1, n.view(b, 1)).view(b)  # [B]
    return path, n, last


def greedy_accept(logits: torch.Tensor, tokens: torch.Tensor, dt: VerifyTree
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Longest path whose every token is the base model's argmax at its parent; next = argmax at the end."""
    pred = first_max(logits)  # [B, N]
    ok = tokens == rows_at(pred, dt.parents, dt.per_row)  # [B, N]
    path, n, last = _best_path(ok, dt)
    nxt = pred.gather(1, last.view(-1, 1)).view(-1)
    return path, n, nxt


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs [B, V]`` -> ``[B, 1]`` (``torch.multinomial``); scores that are not finite
    (NaN / inf weights in the model or its heads) are one :class:`MedusaError`, not torch's error."""
    if not bool(torch.isfinite(probs).all()):
        raise MedusaError("sampling: the next-token probabilities are not finite (NaN / inf): the model's "
                          "weights or the heads' hold NaN / inf values, or its logits overflow")
    return torch.multinomial(probs, 1, generator=generator)


def _identity(scores: torch.Tensor) -> torch.Tensor:
    return scores


def typical_accept(logits: torch.Tensor, tokens: torch.Tensor, dt: VerifyTree,
                   warp: Warp | None = None,
                   temperature: float = 1.0, posterior_threshold: float = 0.09, posterior_alpha: float = 0.3,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor,
                                                                      torch.Tensor, torch.Tensor]:
    """MEDUSA's typical acceptance (lossy: the output is *not* distributed as the base model's samples).

    Node i is accepted iff ``p(x_i) > min(epsilon, delta * exp(-H(p)))`` where p is the base distribution at
    its parent (``softmax(logits / temperature)``), epsilon = ``posterior_threshold``, delta =
    ``posterior_alpha``. The longest accepted path wins, ties going to the higher likelihood; the next token
    is sampled from the warped distribution at the last accepted node (``warp=None``: no warping).
    """
    warp = warp or _identity
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, N, V]
    probs = logp.exp()
    entropy = -(probs * logp).nan_to_num().sum(dim=-1)  # [B, N]
    threshold = torch.minimum(torch.full_like(entropy, posterior_threshold),
                              posterior_alpha * torch.exp(-entropy))  # [B, N]
    per_row = dt.per_row
    parent_logp = rows_at(logp, dt.parents, per_row)  # [B, N, V]
    cand_logp = parent_logp.gather(2, tokens.unsqueeze(-1)).squeeze(-1)  # [B, N]
    ok = cand_logp.exp() > rows_at(threshold, dt.parents, per_row)
    path, n, last = _best_path(ok, dt, score=cand_logp)
    b = logits.shape[0]
    last_logits = logits[torch.arange(b, device=logits.device), last]  # [B, V]
    nxt = draw(torch.softmax(warp(last_logits), dim=-1), generator).view(b)
    return path, n, nxt


def sample_accept(logits: torch.Tensor, tokens: torch.Tensor, dt: VerifyTree,
                  warp: Warp | None = None, generator: torch.Generator | None = None,
                  draft_probs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless recursive rejection sampling over siblings.

    At the current node with target distribution p (the warped base distribution there), try its children
    in rank order. With deterministic drafts (``draft_probs`` None: the heads' top-k, lookup chains) each
    child is a point mass: accept its token x with probability ``p_res(x) / sum(p_res)``; on rejection set
    ``p_res(x) = 0`` and try the next sibling. With sampled drafts, ``draft_probs [B, N, V]`` holds the
    distribution ``q`` each child was drawn from (given the siblings drawn before it): accept x with
    probability ``min(1, p_res(x) / q(x))`` (``p_res`` normalised); on rejection ``p_res = max(p_res - q,
    0)``. When a child is accepted, move to it; when all are rejected (or the node has no children) the
    next token is sampled from ``p_res``. Each emitted token is therefore distributed exactly as ``p``: the
    output equals the base model's ``generate(do_sample=True)`` in law. ``logits`` are the (already
    processed) scores at each node; ``warp`` maps them to sampling scores.
    """
    b = logits.shape[0]
    device = logits.device
    probs = torch.softmax((warp or _identity)(logits.float()), dim=-1)  # [B, N, V]
    rows = torch.arange(b, device=device)
    cur = torch.zeros(b, dtype=torch.long, device=device)  # current node per row
    n = torch.zeros(b, dtype=torch.long, device=device)
    path = torch.zeros(b, dt.depth + 1, dtype=torch.long, device=device)
    active = torch.ones(b, dtype=torch.bool, device=device)
    residual = probs[:, 0].clone()  # [B, V]
    for d in range(dt.depth):
        p = probs[rows, cur].clone()  # [B, V] unnormalised residual at the current node
        chosen = torch.full((b,), -1, dtype=torch.long, device=device)
        for r in range(dt.kmax):
            child = dt.children[rows, cur, r] if dt.per_row else dt.children[cur, r]  # [B]
            cand = (child >= 0) & active & (chosen < 0)
            tok = tokens.gather(1, child.clamp(min=0).view(b, 1))  # [B, 1]
            p_tok = p.gather(1, tok).view(b)
            u = torch.rand(b, device=device, generator=generator)
            if draft_probs is None:  # a point mass on tok
                accept = cand & (u * p.sum(dim=-1) < p_tok)
                reject = cand & ~accept
                p.scatter_(1, tok, torch.where(reject, torch.zeros_like(p_tok), p_tok).view(b, 1))
            else:
                q = draft_probs[rows, child.clamp(min=0)]  # [B, V] what the child was drawn from
                total = p.sum(dim=-1)  # [B]
                accept = cand & (u * q.gather(1, tok).view(b) * total < p_tok)
                reject = cand & ~accept
                p = torch.where(reject.view(b, 1), (p / total.view(b, 1) - q).clamp(min=0), p)
            chosen = torch.where(accept, child, chosen)
        stop = active & (chosen < 0)
        residual = torch.where(stop.view(b, 1), p, residual)
        moved = active & (chosen >= 0)
        cur = torch.where(moved, chosen, cur)
        n = n + moved.long()
        path[:, d + 1] = torch.where(moved, chosen, path[:, d + 1])
        active = moved
    residual = torch.where(active.view(b, 1), probs[rows, cur], residual)  # reached a depth-D leaf
    nxt = draw(residual, generator).view(b)
    return path, n, nxt


@dataclass
class Progress:
    """Each row's progress on the host: written by the decode loop, read by the scorer's processors."""

    prompt_len: int  # P (padded)
    history: torch.Tensor | None  # [B, P + max_new_tokens]: padded prompt + emitted tokens (processors only)
    generated: list[list[int]]  # per row: the tokens emitted so far
    done: list[bool]  # per row: finished


@dataclass
class Scorer:
    """Logits processors + the acceptance rule of one run, built once. ``scorer(logits, tokens, tree,
    draft_probs)``: each node's logits ``[B, N, V]`` processed with its own prefix, then the rule (greedy,
    sample — with the proposal's ``draft_probs`` when its drafts were sampled — or typical) ->
    ``(path [B, D+1], n_accepted [B], next_token [B])``. ``greedy_rule``: :func:`greedy_accept`
    or its compiled wrapper (:func:`medusa.decoding.compiled.compiled_scorer`)."""

    gen: Generation
    acceptance: str  # "greedy" | "sample" | "typical"
    progress: Progress
    typical: tuple[float, float] = (0.09, 0.3)  # posterior_threshold, posterior_alpha
    generator: torch.Generator | None = None
    greedy_rule: Rule = greedy_accept
    needs_ids: bool = field(init=False)  # logits processors read each node's prefix (resolved once)

    def __post_init__(self) -> None:
        self.needs_ids = self.gen.needs_ids

    @property
    def pure(self) -> bool:
        """Greedy without logits processors: a function of the logits alone (safe to run twice)."""
        return self.acceptance == "greedy" and not self.needs_ids

    def first_token(self, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The first new token ``[B]`` from the prompt's last logits ``[B, V]`` (as HF's first step)."""
        scores = logits.float()
        if self.needs_ids:
            scores = apply_processors(self.gen, input_ids, scores,
                                      torch.arange(logits.shape[0], device=logits.device))
        if self.acceptance == "greedy":
            return scores.argmax(dim=-1)
        probs = torch.softmax(warp_scores(self.gen, scores), dim=-1)
        return draw(probs, self.generator).view(-1)

    def __call__(self, logits: torch.Tensor, tokens: torch.Tensor, tree: VerifyTree,
                 draft_probs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gen, run = self.gen, self.progress
        scores = logits
        if self.needs_ids:
            lengths = [run.prompt_len + len(g) for g in run.generated]
            active = [not d for d in run.done]
            scores = process_nodes(gen, run.history, lengths, active, tokens, logits, tree)
        if self.acceptance == "greedy":
            return self.greedy_rule(scores, tokens, tree)
        warp = functools.partial(warp_scores, gen)
        if self.acceptance == "sample":
            return sample_accept(scores.float(), tokens, tree, warp, generator=self.generator,
                                 draft_probs=draft_probs)
        threshold, alpha = self.typical
        return typical_accept(scores.float(), tokens, tree, warp, gen.temperature, threshold, alpha,
                              generator=self.generator)


__all__ = ["Progress", "Rule", "Scorer", "first_max", "greedy_accept", "rows_at", "sample_accept",
           "typical_accept"]
