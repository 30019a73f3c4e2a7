"""The dynamic tree's path score, calibrated on held-out data.

A dynamic tree keeps, per step, the N nodes of highest path score (:mod:`medusa.decoding.dynamic_tree`).
With the heads' raw log-probabilities the score is the log of a product of head probabilities: an
independence assumption, and head probabilities that are not acceptance probabilities. What the tree
should rank by is the chance that greedy verification accepts the node: the product, along the path, of
``P(the depth-d token is right | the tokens before it on the path are right)``.

:func:`fit_path_score` fits that conditional probability per depth as ``sigmoid(w_d * log p + b_d)`` of
the head's own log-probability ``log p`` of the token (logistic regression, two numbers per depth), on the
calibration positions where every shallower head had the true token in its top-k (so the path to the
node exists and is the true prefix). A node's score is then ``sum_d log sigmoid(w_d * log p_d + b_d)``:
still strictly decreasing along a path (so the top-N set stays prefix-closed) and, with ``w_d > 0``,
monotone in ``p`` within a depth (so the heads' top-k are still the candidates).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any

import torch

MIN_POSITIONS = 32  # fewer calibration positions at a depth: keep the raw score there (w = 1, b = 0)


def depth_samples(logp: Sequence[torch.Tensor], ranks: Sequence[torch.Tensor], depth: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Training pairs for depth ``depth`` (0-based): every top-k token's log-probability ``x [M]`` and
    whether it is the true token ``y [M]`` (0/1), at positions where heads ``0..depth-1`` all hit.

    ``logp[e]: [T, D, k]`` the heads' top-k log-probabilities (descending); ``ranks[e]: [T, D]`` the rank of
    the true token among them (-1: not there, -2: no target)."""
    xs, ys = [], []
    for lp, rk in zip(logp, ranks):
        rk = rk.long()
        ok = (rk[:, :depth] >= 0).all(-1) & (rk[:, depth] != -2)  # [T]
        k = lp.shape[-1]
        xs.append(lp[ok, depth].float().reshape(-1))  # [T' * k]
        hit = rk[ok, depth].view(-1, 1) == torch.arange(k).view(1, k)  # [T', k]
        ys.append(hit.float().reshape(-1))
    x, y = torch.cat(xs), torch.cat(ys)
    keep = torch.isfinite(x)  # a draft vocabulary smaller than k pads with -inf
    return x[keep], y[keep]


def fit_logistic(x: torch.Tensor, y: torch.Tensor, steps: int = 100) -> tuple[float, float]:
    """``(w, b)`` minimising the logistic loss of ``sigmoid(w * x + b)`` against ``y`` (``x, y: [M]``)."""
    w = torch.ones((), dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    x64, y64 = x.double(), y.double()
    opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(w * x64 + b, y64)
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return float(w.detach()), float(b.detach())


def fit_path_score(logp: Sequence[torch.Tensor], ranks: Sequence[torch.Tensor]) -> dict[str, Any]:
    """Per depth ``d``: ``weight[d]``, ``bias[d]`` of ``P(right | path right) = sigmoid(w log p + b)`` and the
    number of positions it was fitted on. A depth with fewer than :data:`MIN_POSITIONS` positions, or whose
    fit is not increasing in ``p`` (``w <= 0``), is listed in ``raw`` and scored by ``log p`` itself (its
    weight / bias entries are placeholders)."""
    depth = ranks[0].shape[1] if ranks else 0
    weight, bias, positions, raw = [], [], [], []
    for d in range(depth):
        x, y = depth_samples(logp, ranks, d)
        k = logp[0].shape[-1]
        positions.append(int(x.numel() // max(k, 1)))
        w, b = fit_logistic(x, y) if positions[-1] >= MIN_POSITIONS and 0 < y.sum() < y.numel() else (0., 0.)
        if not (math.isfinite(w) and math.isfinite(b)) or w <= 0:
            raw.append(d)
            w, b = 1.0, 0.0
        weight.append(w)
        bias.append(b)
    return {"weight": weight, "bias": bias, "positions": positions, "raw": raw}


def check_path_score(score: Any, source: str) -> str | None:
    """What is wrong with a ``path_score`` record read from a file (None: it is one of
    :func:`fit_path_score`'s): lists ``weight`` / ``bias`` of finite numbers of one length, ``raw`` depths
    within it, ``positions`` counts."""
    if not isinstance(score, dict):
        return f"{source}: path_score must be an object, got {type(score).__name__}"
    weight, bias = score.get("weight"), score.get("bias")
    for name, values in (("weight", weight), ("bias", bias)):
        if not isinstance(values, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            return f"{source}: path_score.{name} must be a list of finite numbers, got {values!r:.80}"
    if len(weight) != len(bias):
        return f"{source}: path_score has {len(weight)} weights but {len(bias)} biases"
    raw = score.get("raw", [])
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool)
                                            and 0 <= d < len(weight) for d in raw):
        return f"{source}: path_score.raw must list depths in [0, {len(weight)}), got {raw!r:.80}"
    positions = score.get("positions", [])
    if not isinstance(positions, list) or not all(isinstance(n, int) and n >= 0 for n in positions):
        return f"{source}: path_score.positions must list counts, got {positions!r:.80}"
    return None


def score_log_probs(logp: torch.Tensor, depth: int, score: dict[str, Any] | None) -> torch.Tensor:
    """A node's score increment at ``depth`` (1-based) from the head's log-probability ``logp [...]``:
    ``log sigmoid(w log p + b)``, or ``logp`` itself without a calibration (or at a ``raw`` depth)."""
    d = depth - 1
    if score is None or d >= len(score["weight"]) or d in score.get("raw", ()):
        return logp
    return torch.nn.functional.logsigmoid(score["weight"][d] * logp + score["bias"][d])


def _top_paths(scores: list[list[float]], num_nodes: int) -> set[tuple[int, ...]]:
    """The ``num_nodes - 1`` rank paths of highest summed score (``scores[d][r] <= 0``: depth d's rank-r
    increment), found best-first; prefix-closed because every increment is <= 0 (ties: shallower first)."""
    depth, k = len(scores), len(scores[0])
    heap = [(-scores[0][r], 1, (r,)) for r in range(k)]
    heapq.heapify(heap)
    kept: set[tuple[int, ...]] = set()
    while heap and len(kept) < num_nodes - 1:
        neg, d, path = heapq.heappop(heap)
        kept.add(path)
        if d < depth:
            for r in range(k):
                heapq.heappush(heap, (neg - scores[d][r], d + 1, path + (r,)))
    return kept


def replay_dynamic(logp: Sequence[torch.Tensor], ranks: Sequence[torch.Tensor], starts: Sequence[int],
                   num_nodes: int, score: dict[str, Any] | None) -> float:
    """Expected tokens/step of a dynamic tree of ``num_nodes`` nodes under ``score`` (None: raw
    log-probabilities), replaying greedy decoding on calibration examples the way
    :func:`medusa.calibrate.calibrate.simulated_tokens_per_step` replays a static tree: at each step the tree
    is the best paths over the heads' top-k *at that position*, and the step accepts the longest path the
    true tokens follow, plus the bonus token. Exact for MEDUSA heads; for Hydra heads it scores every parent's
    children with the true prefix's distribution (an approximation: off-path parents would see others)."""
    tokens = steps = 0
    for lp, rk, start in zip(logp, ranks, starts):
        r = rk.tolist()
        inc = torch.stack([score_log_probs(lp[:, d].float(), d + 1, score)
                           for d in range(lp.shape[1])], dim=1).tolist()  # [T, D, k]
        s, end = start - 1, len(r) - 1
        while s + 2 <= end:
            tree = _top_paths(inc[s], num_nodes)
            path: tuple[int, ...] = ()
            for d in range(len(r[s])):
                if r[s][d] < 0 or path + (r[s][d],) not in tree:
                    break
                path = path + (r[s][d],)
            gained = min(1 + len(path), end - s - 1)
            tokens += gained
            steps += 1
            s += gained
    return tokens / max(steps, 1)


__all__ = ["depth_samples", "fit_logistic", "fit_path_score", "replay_dynamic", "score_log_probs"]
