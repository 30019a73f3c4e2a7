"""Training the EAGLE-3 drafter (``heads.head_type: eagle3``): the training-time-test unroll and its loss.

Labels are not shifted (``labels[t]`` is token t's id or -100, as in :mod:`medusa.training.losses`). Unroll
step j (0-based) feeds, at position i, the embedding of the sequence's own token ``x_{i+1+j}`` and a hidden
input — the fused base features at step 0, the draft layer's own output of step j - 1 after — and predicts
``x_{i+2+j}``: the drafter is trained on its own predictions of the hidden state, as it drafts at depth j + 1.
Step j's queries attend to step 0's entries causally (the context the base saw) and to their own chain's
entries of steps 1..j (the diagonal), which is what a tree node sees when it is drafted: the cache of real
context plus its ancestors.

The loss is ``sum_j decay^(j+1) * mean CE(logits_j, y_j)`` over the labelled targets inside the draft
vocabulary (a label outside it is a miss: counted, no CE term). With a teacher (``heads.teacher_loss`` w > 0)
each step's term is ``(1 - w) * mean CE + w * mean KL(p_base || p_draft)`` over the same targets, p_base the
base's own next-token distribution at the target (its LM head on its last hidden state at ``i + 1 + j``)
restricted to the draft vocabulary and renormalised (EAGLE-3's soft labels); with the MEDUSA statistics
per step (``[STATS_ROWS, K]``: CE sum, top-1, top-5, count, missed) so the loop's metrics read
``head{j+1}_top1`` as the drafter's accuracy at unrolled step j + 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from medusa.data.tokenize import IGNORE_INDEX
from medusa.modeling.eagle3 import DraftKV
from medusa.training import ttt_attention
from medusa.training.losses import HeadLossOutput, Teacher, TeacherFn, head_weights, teacher_kl


def unroll_mask(valid: torch.Tensor, step: int, dtype: torch.dtype) -> torch.Tensor:
    """Step ``step``'s float attention mask ``[B, 1, T, (step + 1) * T]``: block 0 causal over the valid
    keys (``valid [B, T]`` bool), blocks 1..step the diagonal (each position's own chain)."""
    b, t = valid.shape
    idx = torch.arange(t, device=valid.device)
    causal = (idx.view(t, 1) >= idx.view(1, t)).view(1, t, t) & valid.view(b, 1, t)  # [B, T, T]
    blocks = [causal] + [torch.eye(t, dtype=torch.bool, device=valid.device).expand(b, t, t)] * step
    allowed = torch.cat(blocks, dim=-1).unsqueeze(1)  # [B, 1, T, (step + 1) T]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=valid.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)


def shifted_tokens(input_ids: torch.Tensor, shift: int) -> torch.Tensor:
    """``input_ids [B, T]`` moved left by ``shift``, right-padded with 0 (pads are never targets)."""
    b, t = input_ids.shape
    if shift >= t:
        return input_ids.new_zeros(b, t)
    return torch.cat([input_ids[:, shift:], input_ids.new_zeros(b, shift)], dim=1)


def step_targets(labels: torch.Tensor, step: int, label_map: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Where step ``step`` has a target and what it is: ``(rows [M], cols [M], y [M] draft ids, missed)``
    over the labelled positions whose target ``labels[i + 2 + step]`` lies inside the draft vocabulary."""
    shift = step + 2
    b, t = labels.shape
    y = torch.full_like(labels, IGNORE_INDEX)  # [B, T]
    if t > shift:
        y[:, : t - shift] = labels[:, shift:]
    rows, cols = (y != IGNORE_INDEX).nonzero(as_tuple=True)
    target = y[rows, cols]
    missed = 0
    if label_map is not None:
        mapped = label_map.to(target.device)[target]
        inside = mapped >= 0
        missed = int((~inside).sum())
        rows, cols, target = rows[inside], cols[inside], mapped[inside]
    return rows, cols, target, missed


def ttt_loss(heads: nn.Module, features: torch.Tensor, input_ids: torch.Tensor, labels: torch.Tensor,
             attention_mask: torch.Tensor | None, decay: float, steps: int | None = None,
             teacher: Teacher | None = None, split: bool | None = None) -> HeadLossOutput:
    """The unrolled loss of eagle3 ``heads`` on one batch.

    features ``[B, T, F]`` (the base's fused-layer features), input_ids / labels / attention_mask ``[B, T]``;
    ``steps`` defaults to ``heads.num_heads``; ``teacher``: the base's last hidden state ``[B, T, d]``, its
    logits over the draft vocabulary and the KL weight (module docstring); ``split``: the draft layer's
    attention as :mod:`medusa.training.ttt_attention` splits it (None: where that applies: right-padded CPU
    batches), else over the dense :func:`unroll_mask` (both give the same loss and gradients). Returns the
    loss and per-step statistics (``[K]`` each).
    """
    steps = steps or heads.num_heads
    b, t = input_ids.shape
    valid = (attention_mask.bool() if attention_mask is not None
             else torch.ones(b, t, dtype=torch.bool, device=input_ids.device))
    positions = torch.arange(1, t + 1, device=input_ids.device).expand(b, t)  # [B, T] x_{i+1}'s position
    hidden = heads.fuse(features)  # [B, T, d]
    cache = DraftKV()
    label_map = heads.target_to_draft()
    weights = head_weights(steps, decay)
    zeros = torch.zeros(steps, dtype=torch.float32)
    ce_sum, c1, c5, count, missed = (zeros.clone() for _ in range(5))
    loss = hidden.new_zeros(())
    split = ttt_attention.applies(heads, valid) if split is None else split  # causal block + chain dots
    earlier: list[tuple[torch.Tensor, torch.Tensor]] = []  # split: each step's keys / values [B, H, T, hd]
    for j in range(steps):
        embeds = heads.embed(shifted_tokens(input_ids, 1 + j))  # [B, T, d]
        if split:
            hidden, k, v = ttt_attention.unroll_layer(heads, embeds, hidden, positions + j,
                                                      earlier)  # [B, T, d], k / v [B, H, T, hd]
            earlier.append((k, v))
        else:
            mask = unroll_mask(valid, j, hidden.dtype)  # [B, 1, T, (j + 1) T]
            hidden = heads.layer(embeds, hidden, positions + j, mask, cache)  # [B, T, d]
        rows, cols, y, miss = step_targets(labels, j, label_map)
        logits = heads.logits(hidden[rows, cols])  # [M, N]
        if y.numel():
            ce = F.cross_entropy(logits.float(), y, reduction="sum")
            term = ce
            if teacher is not None:
                with torch.no_grad():
                    base = teacher.logits_fn(teacher.hidden[rows, cols + 1 + j])  # [M, N]
                term = (1 - teacher.weight) * ce + teacher.weight * teacher_kl(logits, base)
            loss = loss + weights[j] * term / y.numel()
            with torch.no_grad():
                top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # [M, 5]
                c1[j] = float((top[:, 0] == y).sum())
                c5[j] = float((top == y.view(-1, 1)).any(dim=-1).sum())
                ce_sum[j] = float(ce.detach())
        else:  # no target: a zero on the graph, so backward() (and DDP's all-reduce) reaches every parameter
            loss = loss + logits.float().sum() * 0.0  # [0, N] logits: fc, the layer, norm and lm_head
        count[j] = float(y.numel() + miss)
        missed[j] = float(miss)
    return HeadLossOutput(loss, ce_sum, c1, c5, count, missed)


class Eagle3Loss(nn.Module):
    """The trained module of an eagle3 run: the drafter, whose forward is :func:`ttt_loss`.

    Returns ``(loss, stats [STATS_ROWS, K])`` like MEDUSA-1's ``HeadsLoss``. With ``teacher_loss`` w > 0,
    ``teacher_logits`` (the base LM head's draft rows, kept outside the module tree) turn the base's last
    hidden state, passed as ``teacher_hidden [B, T, d]``, into the KL targets."""

    def __init__(self, heads: nn.Module, decay: float, teacher_loss: float = 0.0,
                 teacher_logits: TeacherFn | None = None) -> None:
        super().__init__()
        if teacher_loss > 0 and teacher_logits is None:
            raise ValueError("Eagle3Loss: teacher_loss > 0 needs teacher_logits")
        self.heads = heads
        self.decay, self.teacher_loss = decay, teacher_loss
        self._teacher_logits = teacher_logits

    def forward(self, features: torch.Tensor, labels: torch.Tensor, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None,
                teacher_hidden: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        teacher = None
        if self.teacher_loss > 0:
            if teacher_hidden is None:
                raise ValueError("Eagle3Loss: teacher_loss > 0 needs the base's last hidden state")
            teacher = Teacher(teacher_hidden, self._teacher_logits, self.teacher_loss)
        out = ttt_loss(self.heads, features, input_ids, labels, attention_mask, self.decay, teacher=teacher)
        return out.loss, out.stats()


__all__ = ["Eagle3Loss", "shifted_tokens", "step_targets", "ttt_loss", "unroll_mask"]
