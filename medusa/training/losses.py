"""Every training loss, as pure functions of tensors: MEDUSA heads (MEDUSA-1 and MEDUSA-2's ``L_heads``),
the backbone's own next-token loss, the self-distillation KL and their MEDUSA-2 combination.

Head k (k = 1..K) reads h_t and predicts token t + k + 1, so its target at position t is
``labels[t + k + 1]`` (labels are NOT shifted: ``labels[t]`` is the id of token t, or -100).
The MEDUSA-1 loss is ``sum_k decay^k * mean_t CE(head_k(h_t), labels[t + k + 1])`` over the positions
whose target is labelled. With a teacher weight w (``heads.teacher_loss``, Hydra++'s teacher loss), each
term is ``(1 - w) * CE + w * KL(p_base(. | x_<=t+k) || p_head_k)``: the base model's distribution at
position t + k, which predicts the same token t + k + 1, from the frozen backbone's own hidden state.
Hydra heads take a *wide* input (``HydraHeads.teacher_inputs``: h_t and the next K tokens' embeddings)
in place of ``hidden``; everything here slices positions only, so the same functions serve both.

:func:`medusa_head_loss` never builds the K x T x V logits: for each head it gathers the labelled
positions, then runs the head on ``chunk_size`` of them at a time under activation checkpointing,
so the forward keeps one chunk's logits alive and the backward recomputes one chunk at a time.
:func:`naive_head_loss` is the reference it is tested against.

Draft vocabulary (``label_map [V]``: target id -> draft id, -1 outside; ``MedusaHeads.target_to_draft()``):
the heads' logits are over the N draft ids, labels are mapped to them, and a label outside the draft
vocabulary is a miss: it has no CE term (no gradient target for that head at that position) but is
counted in ``count`` (so top-1 / top-5 count it as wrong) and in ``missed``. With a teacher, the teacher's
``logits_fn`` then returns the base logits of the N draft tokens only (the base distribution restricted to the
draft vocabulary and renormalised, as EAGLE-3 trains its draft-vocabulary head), and the KL is taken at the
positions that have a CE term.

MEDUSA-2: ``L = L_LM + lambda_0(step) * L_heads`` (:func:`medusa2_loss`), ``L_LM`` being
:func:`causal_lm_loss` or, with self-distillation, :func:`self_distill_kl` to the teacher's logits.
The base logits at position t predict ``labels[:, t + 1]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from medusa.data.tokenize import IGNORE_INDEX
from medusa.errors import ConfigError

HeadFn = Callable[[int, torch.Tensor], torch.Tensor]  # (k 0-based, hidden [N, d]) -> logits [N, V]
TeacherFn = Callable[[torch.Tensor], torch.Tensor]  # base hidden [N, d] -> base logits [N, V]


@dataclass
class Teacher:
    """The base model as the heads' teacher: its hidden states ``[B, T, d]``, its LM head, the KL weight."""

    hidden: torch.Tensor
    logits_fn: TeacherFn
    weight: float


@dataclass
class HeadLossOutput:
    loss: torch.Tensor  # scalar: sum_k weight_k * mean CE_k (differentiable)
    ce_sum: torch.Tensor  # [K] summed CE per head (detached, fp32)
    correct1: torch.Tensor  # [K] top-1 hits per head
    correct5: torch.Tensor  # [K] top-5 hits per head
    count: torch.Tensor  # [K] labelled targets per head (including those outside a draft vocabulary)
    missed: torch.Tensor  # [K] labelled targets outside the draft vocabulary (0 with the full vocabulary)

    def stats(self) -> torch.Tensor:
        """``[STATS_ROWS, K]``: CE sum, top-1 hits, top-5 hits, count, missed (the loop sums these)."""
        return torch.stack([self.ce_sum, self.correct1, self.correct5, self.count, self.missed])


STATS_ROWS = 5  # rows of HeadLossOutput.stats()


def summarise_stats(stats: torch.Tensor, prefix: str = "") -> dict[str, float]:
    """Summed stats ``[STATS_ROWS, K]`` -> per-head ``loss`` (mean CE over targets with a CE term),
    ``top1`` / ``top5`` (over all labelled targets) and, when any target fell outside a draft vocabulary,
    ``draft_miss`` (the share of targets outside it)."""
    out: dict[str, float] = {}
    n = stats[3].clamp(min=1)
    with_ce = (stats[3] - stats[4]).clamp(min=1)
    drafted = bool(stats[4].sum() > 0)
    for k in range(stats.shape[1]):
        out[f"{prefix}head{k + 1}_loss"] = float(stats[0, k] / with_ce[k])
        out[f"{prefix}head{k + 1}_top1"] = float(stats[1, k] / n[k])
        out[f"{prefix}head{k + 1}_top5"] = float(stats[2, k] / n[k])
        if drafted:
            out[f"{prefix}head{k + 1}_draft_miss"] = float(stats[4, k] / n[k])
    return out


def head_weights(num_heads: int, decay: float) -> list[float]:
    """lambda_k = decay^k for heads k = 1..K."""
    return [decay ** (k + 1) for k in range(num_heads)]


def head_targets(hidden: torch.Tensor, labels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states and targets of head ``k`` (0-based) at its labelled positions.

    hidden ``[B, T, d]``, labels ``[B, T]`` -> ``(h [N_k, d], y [N_k])`` with ``y = labels[:, t + k + 2]``
    (target ids; see :func:`draft_targets` for a draft vocabulary).
    """
    shift = k + 2
    T = labels.shape[1]
    if T <= shift:
        return hidden.new_zeros((0, hidden.shape[-1])), labels.new_zeros((0,))
    y = labels[:, shift:]  # [B, T - shift]
    keep = y != IGNORE_INDEX  # [B, T - shift]
    h = hidden[:, : T - shift][keep]  # [N_k, d]
    return h, y[keep]


def draft_targets(h: torch.Tensor, y: torch.Tensor, label_map: torch.Tensor | None,
                  t_h: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor | None]:
    """Keep the targets inside the draft vocabulary, as draft ids: ``(h [M, d], y_draft [M], missed,
    t_h [M, d])`` with ``missed = N - M`` and the teacher's states ``t_h [N, d]`` (or None) kept alike
    (everything kept, unchanged, when ``label_map`` is None)."""
    if label_map is None:
        return h, y, 0, t_h
    mapped = label_map.to(y.device)[y]  # [N] draft ids, -1 outside
    inside = mapped >= 0
    return (h[inside], mapped[inside], int(y.shape[0] - int(inside.sum())),
            None if t_h is None else t_h[inside])


def teacher_kl(head_logits: torch.Tensor, base_logits: torch.Tensor) -> torch.Tensor:
    """``sum_n KL(softmax(base_logits[n]) || softmax(head_logits[n]))`` for ``[N, V]`` logits; the base's
    are a fixed target (no gradient). Scalar."""
    log_pt = F.log_softmax(base_logits.detach().float(), dim=-1)
    log_ps = F.log_softmax(head_logits.float(), dim=-1)
    return (log_pt.exp() * (log_pt - log_ps)).sum()


def teacher_states(hidden: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """The base hidden states that predict head ``k``'s targets: position t + k + 1 for each labelled target
    of :func:`head_targets` (same order). hidden ``[B, T, d]`` -> ``[N_k, d]``."""
    shift = k + 2
    T = labels.shape[1]
    if T <= shift:
        return hidden.new_zeros((0, hidden.shape[-1]))
    keep = labels[:, shift:] != IGNORE_INDEX  # [B, T - shift]
    return hidden[:, shift - 1: T - 1][keep]


def _chunk_stats(fn: HeadFn, k: int, h: torch.Tensor, y: torch.Tensor, t_h: torch.Tensor | None = None,
                 teacher: Teacher | None = None) -> tuple[torch.Tensor, ...]:
    logits = fn(k, h).float()  # [C, V]
    ce = F.cross_entropy(logits, y, reduction="sum")
    loss = ce
    if teacher is not None:
        with torch.no_grad():
            base = teacher.logits_fn(t_h)  # [C, V]
        loss = (1 - teacher.weight) * ce + teacher.weight * teacher_kl(logits, base)
    with torch.no_grad():
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # [C, 5]
        hits = top == y.unsqueeze(-1)  # [C, 5]
        c1 = hits[:, 0].sum().float()
        c5 = hits.any(dim=-1).sum().float()
    return loss, ce, c1, c5


def medusa_head_loss(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    head_fn: HeadFn,
    num_heads: int,
    decay: float = 0.8,
    chunk_size: int = 1024,
    label_map: torch.Tensor | None = None,
    teacher: Teacher | None = None,
) -> HeadLossOutput:
    """Chunked MEDUSA head loss. hidden ``[B, T, d]`` (post final norm; Hydra: the wide input), labels
    ``[B, T]`` (unshifted). ``teacher``: mix in the KL to the base distribution (module docstring).

    ``head_fn(k, h [N, d]) -> [N, V]`` is head k's logits (e.g. ``MedusaHeads.head_logits``). Peak memory
    is one ``[chunk_size, V]`` block of logits (plus its gradient), whatever K and T are. A head with no
    labelled target still runs on an empty chunk so that its parameters stay in the graph (DDP).
    ``label_map [V]`` (target id -> draft id, -1 outside): heads over a draft vocabulary (``head_fn``
    returns ``[N, N_draft]``); each head's CE is the mean over its targets inside the draft vocabulary.
    With both, ``teacher.logits_fn`` returns the base logits of the draft tokens (``[N, N_draft]``).
    """
    weights = head_weights(num_heads, decay)
    total = hidden.new_zeros((), dtype=torch.float32)
    stats = torch.zeros(STATS_ROWS, num_heads, dtype=torch.float32)  # ce_sum, top1, top5, count, missed
    for k in range(num_heads):
        h, y = head_targets(hidden, labels, k)  # [N_k, d], [N_k]
        t_h = None if teacher is None else teacher_states(teacher.hidden, labels, k)  # [N_k, d]
        h, y, missed, t_h = draft_targets(h, y, label_map, t_h)  # [M_k, d], [M_k], [M_k, d]
        n = y.shape[0]
        ce_k = hidden.new_zeros((), dtype=torch.float32)
        loss_k = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, max(n, 1), chunk_size):
            h_c, y_c = h[start:start + chunk_size], y[start:start + chunk_size]  # [C, d], [C]
            t_c = None if t_h is None else t_h[start:start + chunk_size]  # [C, d]
            if torch.is_grad_enabled():
                loss, ce, c1, c5 = checkpoint(_chunk_stats, head_fn, k, h_c, y_c, t_c, teacher,
                                              use_reentrant=False)
            else:
                loss, ce, c1, c5 = _chunk_stats(head_fn, k, h_c, y_c, t_c, teacher)
            ce_k = ce_k + ce.detach()
            loss_k = loss_k + loss
            stats[1, k] += c1.item()
            stats[2, k] += c5.item()
        stats[0, k] = ce_k.float().cpu()
        stats[3, k] = n + missed
        stats[4, k] = missed
        total = total + weights[k] * loss_k / max(n, 1)
    return HeadLossOutput(total, *stats)


def naive_head_loss(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    head_fn: HeadFn,
    num_heads: int,
    decay: float = 0.8,
    label_map: torch.Tensor | None = None,
    teacher: Teacher | None = None,
) -> HeadLossOutput:
    """Reference implementation: all ``[K, B, T, V]`` logits at once, shifted CE (and KL) per head (labels
    outside a draft vocabulary ``label_map`` become ignored for the CE, the KL and misses for the counts)."""
    weights = head_weights(num_heads, decay)
    B, T, d = hidden.shape
    labelled = labels != IGNORE_INDEX  # [B, T]
    if label_map is not None:
        drafted = torch.where(labelled, label_map[labels.clamp(min=0)], IGNORE_INDEX)  # [B, T], -1 outside
        outside = labelled & (drafted < 0)
        labels = drafted.masked_fill(outside, IGNORE_INDEX)
    else:
        outside = torch.zeros_like(labelled)
    logits = torch.stack([head_fn(k, hidden.reshape(B * T, d)).reshape(B, T, -1).float()
                          for k in range(num_heads)])  # [K, B, T, V]
    total = hidden.new_zeros((), dtype=torch.float32)
    stats = torch.zeros(STATS_ROWS, num_heads, dtype=torch.float32)
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
        loss = ce
        if teacher is not None:
            base = teacher.logits_fn(teacher.hidden[:, shift - 1: T - 1]).detach().float()  # [B, T-shift, V]
            log_pt = F.log_softmax(base, -1)  # [B, T-shift, V]
            kl = (log_pt.exp() * (log_pt - F.log_softmax(lg, -1))).sum(-1)  # [B, T-shift]
            loss = (1 - teacher.weight) * ce + teacher.weight * (kl * mask).sum()
        with torch.no_grad():
            top = lg.topk(min(5, lg.shape[-1]), dim=-1).indices  # [B, T - shift, 5]
            hits = (top == y.unsqueeze(-1)) & mask.unsqueeze(-1)
            stats[1, k] = hits[..., 0].sum().float()
            stats[2, k] = hits.any(dim=-1).sum().float()
        stats[0, k] = ce.detach().float().cpu()
        missed = int(outside[:, shift:].sum())
        stats[3, k] = n + missed
        stats[4, k] = missed
        total = total + weights[k] * loss / max(n, 1)
    return HeadLossOutput(total, *stats)


def _next_token_mask(labels: torch.Tensor) -> torch.Tensor:
    """``labels [B, T]`` -> bool ``[B, T - 1]``: position t predicts an assistant token (labels[t+1])."""
    return labels[:, 1:] != IGNORE_INDEX


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy on assistant tokens.

    logits ``[B, T, V]`` (position t predicts t+1), labels ``[B, T]`` (unshifted, -100 = ignored) -> scalar.
    Zero (with a graph) when no position is labelled.
    """
    shifted = logits[:, :-1].float()  # [B, T-1, V]
    target = labels[:, 1:]  # [B, T-1]
    if not bool((target != IGNORE_INDEX).any()):
        return shifted.sum() * 0.0
    return F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), target.reshape(-1),
                           ignore_index=IGNORE_INDEX)


def self_distill_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``KL(p_teacher || p_student)`` averaged over the positions that predict an assistant token.

    student_logits, teacher_logits ``[B, T, V]``; labels ``[B, T]`` (unshifted). With temperature tau,
    ``p = softmax(logits / tau)`` for both and the KL is multiplied by ``tau**2`` (so its gradient scale
    does not depend on tau). Exactly 0 when the two logits are equal. Scalar.
    """
    if temperature <= 0:
        raise ConfigError(f"medusa2.distill_temperature: must be > 0, got {temperature}")
    mask = _next_token_mask(labels)  # [B, T-1]
    s = student_logits[:, :-1][mask].float() / temperature  # [N, V]
    t = teacher_logits[:, :-1][mask].detach().float() / temperature  # [N, V]
    if s.shape[0] == 0:
        return student_logits.sum() * 0.0
    log_ps, log_pt = F.log_softmax(s, dim=-1), F.log_softmax(t, dim=-1)
    kl = (log_pt.exp() * (log_pt - log_ps)).sum(-1)  # [N]
    return kl.mean() * temperature**2


def medusa2_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    heads_loss: torch.Tensor,
    lambda0: float,
    teacher_logits: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``L = L_LM + lambda0 * L_heads``.

    logits ``[B, T, V]``: the backbone's own (student) logits; labels ``[B, T]`` unshifted; heads_loss: the
    MEDUSA-1 heads loss (``sum_k decay^k CE_k``, computed in chunks by ``medusa.training.losses``);
    lambda0: ``lambda_0(step)`` from :mod:`medusa.training.schedules`. ``L_LM`` is the next-token CE on
    assistant tokens, or, given ``teacher_logits [B, T, V]``, ``self_distill_kl(logits, teacher_logits)``.
    Returns the scalar loss and float metrics (``lm_loss``, ``heads_loss``, ``lambda0``).
    """
    if teacher_logits is None:
        lm = causal_lm_loss(logits, labels)
    else:
        lm = self_distill_kl(logits, teacher_logits, labels, temperature)
    loss = lm + lambda0 * heads_loss
    metrics = {"lm_loss": float(lm.detach()), "heads_loss": float(heads_loss.detach()),
               "lambda0": float(lambda0)}
    if teacher_logits is not None:
        metrics["distill_kl"] = metrics["lm_loss"]
    return loss, metrics
