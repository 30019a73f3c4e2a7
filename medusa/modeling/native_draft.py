"""The EAGLE-3 draft layer's pass in bfloat16 through the AMX kernel and its C ops (:mod:`native_body`'s
attention and MLP blocks): a drafting level of at most 32 nodes without the HF layer's module code.

Per pass: two RMSNorms (the token's embedding, the hidden input) side by side -> one fused q/k/v product over
the ``2d`` join -> rotary embedding -> the drafter's cache -> attention -> o_proj -> residual + RMSNorm ->
gate/up -> SiLU * up -> down -> residual; what :meth:`medusa.modeling.eagle3.Eagle3Heads.layer` computes,
rounded where it rounds. Used there for inference-only bfloat16 passes of at most 32 rows on a CPU whose
kernel is available (the prompt's context pass and training run the layer's own code).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from medusa.modeling import amx_kernel, native_body, rotary_table


@dataclass(frozen=True)
class NativeDraftLayer:
    """The draft layer's packed weights and norms (``[d]``), and the tensors (and versions) packed from."""

    qkv: amx_kernel.PackedBf16  # [(Hq + 2 Hkv) hd, 2d]
    o: amx_kernel.PackedBf16  # [d, Hq hd]
    gate_up: amx_kernel.PackedBf16  # [2 I, d]
    down: amx_kernel.PackedBf16  # [d, I]
    input_norm: torch.Tensor
    hidden_norm: torch.Tensor
    post_norm: torch.Tensor
    eps: float
    hq: int
    hkv: int
    hd: int
    inter: int
    lib: Any
    plan: torch.Tensor  # [23] int64: the matrices and norms as ``kernels/bf16_layers.c`` reads them
    sources: tuple[torch.Tensor, ...]
    versions: tuple[tuple[int, int], ...]

    def fresh(self) -> bool:
        return native_body.versions_of(self.sources) == self.versions


# drafter -> its layer packed (None: the layer cannot run natively), built at the first native pass
_PACKED: weakref.WeakKeyDictionary[nn.Module, NativeDraftLayer | None] = weakref.WeakKeyDictionary()


def _supported(layer: nn.Module) -> bool:
    attn, m = layer.self_attn, layer.mlp
    linears = native_body.linears(layer)
    widths = (attn.q_proj.in_features, m.down_proj.in_features, attn.head_dim)
    act = type(m.act_fn).__name__.lower()
    return (amx_kernel.available() and all(amx_kernel.fits(lin.weight) for lin in linears)
            and not any(w % amx_kernel.K_MULTIPLE for w in widths) and attn.head_dim <= 256
            and ("silu" in act or "swish" in act) and hasattr(layer, "hidden_norm"))


def _build(layer: nn.Module) -> NativeDraftLayer:
    attn, m = layer.self_attn, layer.mlp
    linears = native_body.linears(layer)
    sources = tuple([lin.weight for lin in linears] + [lin.bias for lin in linears if lin.bias is not None]
                    + [layer.input_layernorm.weight, layer.hidden_norm.weight,
                       layer.post_attention_layernorm.weight])
    qkv, o = native_body.stacked(attn.q_proj, attn.k_proj, attn.v_proj), native_body.stacked(attn.o_proj)
    gate_up, down = native_body.stacked(m.gate_proj, m.up_proj), native_body.stacked(m.down_proj)
    norms = (layer.input_layernorm.weight.detach(), layer.hidden_norm.weight.detach(),
             layer.post_attention_layernorm.weight.detach())
    plan = torch.tensor([v for mat in (qkv, o, gate_up, down) for v in native_body.plan_row(mat)]
                        + [w.data_ptr() for w in norms], dtype=torch.int64)
    return NativeDraftLayer(
        qkv=qkv, o=o, gate_up=gate_up, down=down, input_norm=norms[0], hidden_norm=norms[1],
        post_norm=norms[2],
        eps=float(layer.input_layernorm.variance_epsilon),
        hq=attn.q_proj.out_features // attn.head_dim, hkv=attn.k_proj.out_features // attn.head_dim,
        hd=attn.head_dim, inter=m.down_proj.in_features, lib=amx_kernel.library(), plan=plan, sources=sources,
        versions=native_body.versions_of(sources))


def native_layer_for(drafter: nn.Module, layer: nn.Module, embeds: torch.Tensor, mask: torch.Tensor
                     ) -> NativeDraftLayer | None:
    """``drafter``'s draft ``layer`` packed for :func:`forward` when this pass can run natively (inference,
    bfloat16, at most :data:`native_body.MAX_ROWS` rows, a 4-D bfloat16 mask), else None."""
    if (torch.is_grad_enabled() or embeds.dtype != torch.bfloat16 or embeds.numel() // embeds.shape[-1]
            > native_body.MAX_ROWS or mask.dim() != 4 or mask.dtype != torch.bfloat16 or mask.stride(-1) != 1
            or native_body.disabled()):
        return None
    packed = _PACKED.get(drafter, False)
    if packed is False or (packed is not None and not packed.fresh()):
        packed = _build(layer) if _supported(layer) else None
        _PACKED[drafter] = packed
    return packed


def forward(native: NativeDraftLayer, embeds: torch.Tensor, hidden: torch.Tensor, cos_sin: tuple,
            mask: torch.Tensor, cache: Any, at: torch.Tensor | None) -> torch.Tensor:
    """The draft layer over ``embeds, hidden [B, T, d]`` (``cos_sin``: the rotary ``[B, T, hd]`` pair at their
    positions) under ``mask [B, 1, T, S + T]``, appending T entries to ``cache`` -> ``g [B, T, d]``, or
    ``[B, d]`` at each row's entry ``at [B]`` (the MLP runs there alone)."""
    lib = native.lib
    embeds, hidden = embeds.contiguous(), hidden.contiguous()
    cos, sin = (rotary_table.row_major(c) for c in cos_sin)
    slots = cache.append_slots(embeds.shape[1]) if hasattr(cache, "append_slots") else None
    if slots is not None:  # decoding: the whole pass in one C call (kernels/bf16_layers.c)
        return _one_call(native, embeds, hidden, cos, sin, mask, slots, at)
    x = torch.cat([native_body.rms_norm(lib, embeds, native.input_norm, native.eps),
                   native_body.rms_norm(lib, hidden, native.hidden_norm, native.eps)], dim=-1)  # [B, T, 2d]
    attn = native_body.attend(lib, x, native.qkv, cos, sin, mask, cache, 0,
                              native_body.attention_scratch(mask, native.hd), native.hq, native.hkv,
                              native.hd)
    h, normed = native_body.add_norm(lib, hidden, amx_kernel.rows_matmul(attn, native.o), native.post_norm,
                                     native.eps)  # [B, T, d] each
    if at is not None:
        rows = torch.arange(h.shape[0], device=h.device)
        h, normed = h[rows, at], normed[rows, at].contiguous()  # [B, d]
    return h + native_body.mlp(lib, normed, native.gate_up, native.down, native.inter)


def _one_call(native: NativeDraftLayer, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor, mask: torch.Tensor, slots: tuple, at: torch.Tensor | None) -> torch.Tensor:
    """:func:`forward` as one ``medusa_draft_layer`` call: the same ops in the same order (the same bits)."""
    keys, values, start, held = slots
    b, t, d = hidden.shape
    rows, hq, hkv, hd, inter = b * t, native.hq, native.hkv, native.hd, native.inter
    work = torch.empty(rows * (7 * d + (hq + 2 * hkv) * hd + hq * hd + 3 * inter), dtype=torch.bfloat16)
    out = torch.empty((b, d) if at is not None else (b, t, d), dtype=torch.bfloat16)
    where = None if at is None else at.to(torch.int64).contiguous()
    scratch = native_body.attention_scratch(mask, hd)  # held here: the call reads its address
    native.lib.medusa_draft_layer(
        native.plan.data_ptr(), b, t, d, hq, hkv, hd, inter, native.eps, embeds.data_ptr(), hidden.data_ptr(),
        cos.data_ptr(), sin.data_ptr(), cos.stride(-2), mask.data_ptr(), mask.stride(0), mask.stride(2),
        min(held, mask.shape[-1]), keys.data_ptr(), values.data_ptr(), keys.stride(0), keys.stride(1),
        keys.stride(2), start, native.hd ** -0.5, None if where is None else where.data_ptr(),
        work.data_ptr(), scratch.data_ptr(), out.data_ptr())
    return out


def final_norm(norm: nn.Module, g: torch.Tensor) -> torch.Tensor:
    """The drafter's final RMSNorm ``norm`` over ``g [..., d]``: the C op for inference-only bfloat16 where
    the kernel runs (one call instead of the module's seven tensor ops), else the module."""
    weight = getattr(norm, "weight", None)
    if (torch.is_grad_enabled() or g.dtype != torch.bfloat16 or not isinstance(weight, torch.Tensor)
            or weight.dtype != torch.bfloat16 or g.shape[-1] % 16 or not hasattr(norm, "variance_epsilon")
            or not amx_kernel.available() or native_body.disabled()):
        return norm(g)
    return native_body.rms_norm(amx_kernel.library(), g.contiguous(), weight.detach(),
                                float(norm.variance_epsilon))


__all__ = ["NativeDraftLayer", "final_norm", "forward", "native_layer_for"]
