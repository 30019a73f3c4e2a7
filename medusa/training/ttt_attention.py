"""The training-time-test unroll's draft layer with its attention split in two (CPU training).

At unroll step j a position's query attends to step 0's keys causally and to its own chain's keys of steps
1..j (:mod:`medusa.training.eagle3`). The dense way builds a ``[T, (j + 1) T]`` mask and attends over all
of it: over the four steps that is 10 ``T x T`` blocks of scores, most of them masked. Here step 0's block
is one causal fused attention (the CPU flash kernel, which skips the blocks above the diagonal and keeps
O(T) memory for the backward pass) that also returns each row's log-sum-exp ``l``; the j chain scores are
dot products, and the two parts are merged by a softmax over ``[l, s_1 .. s_j]``. The gradient of
``l`` (which the kernel does not give) is ``scale * sum_k p_k k_k`` for the query and ``scale * p_ik q_i``
for each key: the surrogate ``scale * q . o'``, ``o'`` the same causal attention with the keys as values
(and ``p`` held fixed), has exactly that gradient. In float32 outputs and gradients equal the dense path's
(tested); under bf16 autocast they differ from it within bf16's rounding. The attention costs ~3.5 blocks
instead of 10; the private aten op is the CPU flash kernel ``scaled_dot_product_attention`` itself calls.

Right-padded rows only (the collator's padding): a valid query then never sees a padded key causally, so the
causal kernel needs no mask. Padded queries get other outputs than on the dense path; no loss reads them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from medusa.modeling.eagle3 import Eagle3Heads

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")  # attention forwards :func:`project` computes as they do


def applies(heads: nn.Module, valid: torch.Tensor) -> bool:
    """Whether the split attention can replace the dense mask: a CPU batch whose rows are right-padded
    (``valid [B, T]`` a prefix of ones per row) and a draft layer of a :data:`MODEL_TYPES` base (whose
    attention :func:`project` computes as its own forward does; others, e.g. OLMo's clipped q / k / v, keep
    the dense path) without attention dropout."""
    attn = heads.layers[0].self_attn
    if getattr(getattr(attn, "config", None), "model_type", None) not in MODEL_TYPES:
        return False
    if valid.device.type != "cpu" or (attn.training and getattr(attn, "attention_dropout", 0.0)):
        return False
    lengths = valid.sum(dim=1, keepdim=True)  # [B, 1]
    prefix = torch.arange(valid.shape[1], device=valid.device).view(1, -1) < lengths  # [B, T]
    return bool(torch.equal(prefix, valid))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def project(attn: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attention module's queries ``[B, H, T, hd]`` and keys / values ``[B, H, T, hd]`` (each key / value
    head repeated for its query group) of ``x [B, T, 2d]``, rotated by ``cos, sin [B, T, hd]``, as the
    Llama-family module computes them (q / k norms where it has them: Qwen3)."""
    b, t, _ = x.shape
    hd = attn.head_dim
    q, k, v = (proj(x).view(b, t, -1, hd) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # [B, H(kv), T, hd]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    q, k = q.to(v.dtype), k.to(v.dtype)  # under autocast: the projections' bf16, as the fused kernel takes
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return q, k, v


def split_attention(q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, chain_k: list[torch.Tensor],
                    chain_v: list[torch.Tensor], scale: float) -> torch.Tensor:
    """Each query ``q [B, H, T, hd]`` over step 0's keys / values ``k0, v0 [B, H, T, hd]`` causally and
    over its own position's entries of ``chain_k / chain_v`` (each ``[B, H, T, hd]``) -> ``[B, H, T, hd]``."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # the output and each row's lse
    o1, lse = flash(q, k0, v0, 0.0, True, scale=scale)[:2]  # [B, H, T, hd], [B, H, T]
    if not chain_k:
        return o1
    keys_as_values = F.scaled_dot_product_attention(q.detach(), k0.detach(), k0, is_causal=True,
                                                    scale=scale)  # [B, H, T, hd]
    surrogate = scale * (q * keys_as_values).float().sum(-1)  # [B, H, T]: d lse, as autograd sees it
    logsumexp = lse.float() + surrogate - surrogate.detach()
    chain = [scale * (q.float() * kc.float()).sum(-1) for kc in chain_k]  # j x [B, H, T]
    w = torch.softmax(torch.stack([logsumexp, *chain], dim=-1), dim=-1)  # [B, H, T, 1 + j]
    out = w[..., :1] * o1.float()
    for c, vc in enumerate(chain_v):
        out = out + w[..., c + 1:c + 2] * vc.float()
    return out.to(o1.dtype)


def unroll_layer(heads: Eagle3Heads, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                 earlier: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor,
                                                                            torch.Tensor]:
    """Unroll step ``len(earlier)`` of the eagle3 ``heads``' draft layer, as ``heads.layer`` computes it under
    :func:`medusa.training.eagle3.unroll_mask`: ``embeds, hidden [B, T, d]`` at ``positions [B, T]``, the
    earlier steps' keys and values ``earlier`` (each ``[B, H, T, hd]``; step 0's first) -> ``(g [B, T, d],
    keys, values [B, H, T, hd])``, this step's keys and values for the steps after it."""
    attn = heads.layers[0].self_attn
    x = heads.layer_input(embeds, hidden)  # [B, T, 2d]
    cos, sin = heads.rotary(x, positions)  # [B, T, hd]
    q, k, v = project(attn, x, cos, sin)
    steps = [*earlier, (k, v)]  # step 0's block, then each position's own chain (steps 1..j)
    chain = steps[1:]
    o = split_attention(q, *steps[0], [c[0] for c in chain], [c[1] for c in chain],
                        attn.scaling)  # [B, H, T, hd]
    b, t = embeds.shape[:2]
    return heads.layer_output(hidden, attn.o_proj(o.transpose(1, 2).reshape(b, t, -1))), k, v  # [B, T, d]


__all__ = ["MODEL_TYPES", "applies", "project", "split_attention", "unroll_layer"]
