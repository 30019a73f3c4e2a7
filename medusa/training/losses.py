"""MEDUSA head losses as pure functions of tensors.

Head k (k = 1..K) reads h_t and predicts token t + k + 1, so its target at position t is
``labels[t + k + 1]`` (labels are NOT shifted: ``labels[t]`` is the id of token t, or -100).
The MEDUSA-1 loss is ``sum_k decay^k * mean_t CE(head_k(h_t), labels[t + k + 1])`` over the positions
whose target is labelled.

:func:`medusa_head_loss` never builds the K x T x V logits: for each head it gathers the labelled
positions, then runs the head on ``chunk_size`` of them at a time under activation checkpointing,
so the forward keeps one chunk's logits alive and the backward recomputes one chunk at a time.
:func:`naive_head_loss` is the reference it is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100
HeadFn = Callable[[int, torch.Tensor], torch.Tensor]  # (k 0-based, hidden [N, d]) -> logits [N, V]


@dataclass
class HeadLossOutput:
    loss: torch.Tensor  # scalar: sum_k weight_k * mean CE_k (differentiable)
    ce_sum: torch.Tensor  # [K] summed CE per head (detached, fp32)
    correct1: torch.Tensor  # [K] top-1 hits per head
    correct5: torch.Tensor  # [K] top-5 hits per head
    count: torch.Tensor  # [K] labelled targets per head

    def per_head(self) -> dict[str, list[float]]:
        n = self.count.clamp(min=1)
        return {"loss": (self.ce_sum / n).tolist(), "top1": (self.correct1 / n).tolist(),
                "top5": (self.correct5 / n).tolist()}


def head_weights(num_heads: int, decay: float) -> list[float]:
    """lambda_k = decay^k for heads k = 1..K."""
    return [decay ** (k + 1) for k in range(num_heads)]


def head_targets(hidden: torch.Tensor, labels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states and targets of head ``k`` (0-based) at its labelled positions.

    hidden ``[B, T, d]``, labels ``[B, T]`` -> ``(h [N_k, d], y [N_k])`` with ``y = labels[:, t + k + 2]``.
    """
    shift = k + 2
    T = labels.shape[1]
    if T <= shift:
        return hidden.new_zeros((0, hidden.shape[-1])), labels.new_zeros((0,))
    y = labels[:, shift:]  # [B, T - shift]
    keep = y != IGNORE_INDEX  # [B, T - shift]
    h = hidden[:, : T - shift][keep]  # [N_k, d]
    return h, y[keep]


def _chunk_stats(fn: HeadFn, k: int, h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    logits = fn(k, h).float()  # [C, V]
    ce = F.cross_entropy(logits, y, reduction="sum")
    with torch.no_grad():
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # [C, 5]
        hits = top == y.unsqueeze(-1)  # [C, 5]
        c1 = hits[:, 0].sum().float()
        c5 = hits.any(dim=-1).sum().float()
    return ce, c1, c5


def medusa_head_loss(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    head_fn: HeadFn,
    num_heads: int,
    decay: float = 0.8,
    chunk_size: int = 1024,
) -> HeadLossOutput:
    """Chunked MEDUSA head loss. hidden ``[B, T, d]`` (post final norm), labels ``[B, T]`` (unshifted).

    ``head_fn(k, h [N, d]) -> [N, V]`` is head k's logits (e.g. ``MedusaHeads.head_logits``). Peak memory
    is one ``[chunk_size, V]`` block of logits (plus its gradient), whatever K and T are. A head with no
    labelled target still runs on an empty chunk so that its parameters stay in the graph (DDP).
    """
    weights = head_weights(num_heads, decay)
    total = hidden.new_zeros((), dtype=torch.float32)
    stats = torch.zeros(4, num_heads, dtype=torch.float32)  # ce_sum, correct1, correct5, count
    for k in range(num_heads):
        h, y = head_targets(hidden, labels, k)  # [N_k, d], [N_k]
        n = y.shape[0]
        ce_k = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, max(n, 1), chunk_size):
            h_c, y_c = h[start:start + chunk_size], y[start:start + chunk_size]  # [C, d], [C]
            if torch.is_grad_enabled():
                ce, c1, c5 = checkpoint(_chunk_stats, head_fn, k, h_c, y_c, use_reentrant=False)
            else:
                ce, c1, c5 = _chunk_stats(head_fn, k, h_c, y_c)
            ce_k = ce_k + ce
            stats[1, k] += c1.item()
            stats[2, k] += c5.item()
        stats[0, k] = ce_k.detach().float().cpu()
        stats[3, k] = n
        total = total + weights[k] * ce_k / max(n, 1)
    return HeadLossOutput(total, stats[0], stats[1], stats[2], stats[3])


def naive_head_loss(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    head_fn: HeadFn,
    num_heads: int,
    decay: float = 0.8,
) -> HeadLossOutput:
    """Reference implementation: all ``[K, B, T, V]`` logits at once, shifted CE per head."""
    weights = head_weights(num_heads, decay)
    B, T, d = hidden.shape
    logits = torch.stack([head_fn(k, hidden.reshape(B * T, d)).reshape(B, T, -1).float()
                          for k in range(num_heads)])  # [K, B, T, V]
    total = hidden.new_zeros((), dtype=torch.float32)
    stats = torch.zeros(4, num_heads, dtype=torch.float32)
    for k in range(num_heads):
        shift = k + 2
        if T <= shift:
            total = total + 0.0 * logits[k].sum()
            continue
        lg = logits[k, :, : T - shift]  # [B, T - shift, V]
        y = labels[:, shift:]  # [B, T - shift]
        ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1), ignore_index=IGNORE_INDEX,
                             reduction="sum")
        mask = y != IGNORE_INDEX
        n = int(mask.sum())
        with torch.no_grad():
            top = lg.topk(min(5, lg.shape[-1]), dim=-1).indices  # [B, T - shift, 5]
            hits = (top == y.unsqueeze(-1)) & mask.unsqueeze(-1)
            stats[1, k] = hits[..., 0].sum().float()
            stats[2, k] = hits.any(dim=-1).sum().float()
        stats[0, k] = ce.detach().float().cpu()
        stats[3, k] = n
        total = total + weights[k] * ce / max(n, 1)
    return HeadLossOutput(total, stats[0], stats[1], stats[2], stats[3])
