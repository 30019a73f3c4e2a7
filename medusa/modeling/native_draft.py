"""The EAGLE-3 draft layer's pass in bfloat16 through the native bf16 kernel and its C ops
(:mod:`native_body`'s attention and MLP blocks): a drafting level of at most 32 nodes without the HF layer's
module code.

Per pass: two RMSNorms (the token's embedding, the hidden input) side by side -> one fused q/k/v product over
the ``2d`` join -> rotary embedding -> the drafter's cache -> attention -> o_proj -> residual + RMSNorm ->
gate/up -> SiLU * up -> down -> residual; what :meth:`medusa.modeling.eagle3.Eagle3Heads.layer` computes,
rounded where it rounds. Used there for inference-only bfloat16 passes of at most ``native_body.MAX_ROWS``
rows on a CPU whose kernel is available (a longer prompt's context pass and training run the layer's own
code).

:func:`step` and :func:`top` go further for a decoding drafter (:class:`NativeDrafter`): a whole drafting
level -- the tokens' embedding rows, the rotary rows, the layer, the final RMSNorm, the draft LM head and each
row's top-k log-softmax -- or a context pass (the fused features' product, the layer at each row's last
entry) in one ``kernels/bf16_draft_step.c`` call, the same ops on the same values (the same bits as the
stepwise path: ``tests/modeling/test_native_draft.py``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from medusa.modeling import bf16_kernel, native_body, rotary_table
from medusa.native import fixed_weights, pick


@dataclass(frozen=True)
class NativeDraftLayer:
    """The draft layer's packed weights and norms (``[d]``), and the tensors (and versions) packed from."""

    qkv: bf16_kernel.PackedBf16  # [(Hq + 2 Hkv) hd, 2d]
    o: bf16_kernel.PackedBf16  # [d, Hq hd]
    gate_up: bf16_kernel.PackedBf16  # [2 I, d]
    down: bf16_kernel.PackedBf16  # [d, I]
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
    return (bf16_kernel.available() and all(bf16_kernel.fits(lin.weight) for lin in linears)
            and not any(w % bf16_kernel.K_MULTIPLE for w in widths) and attn.head_dim <= 256
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
        hd=attn.head_dim, inter=m.down_proj.in_features, lib=bf16_kernel.library(), plan=plan,
        sources=sources,
        versions=native_body.versions_of(sources))


def native_layer_for(drafter: nn.Module, layer: nn.Module, embeds: torch.Tensor, mask: torch.Tensor
                     ) -> NativeDraftLayer | None:
    """``drafter``'s draft ``layer`` packed for :func:`forward` when this pass can run natively (inference,
    bfloat16, at most :data:`native_body.MAX_ROWS` rows, a 4-D bfloat16 mask), else None."""
    if (torch.is_grad_enabled() or embeds.dtype != torch.bfloat16 or embeds.numel() // embeds.shape[-1]
            > native_body.MAX_ROWS or mask.dim() != 4 or mask.dtype != torch.bfloat16 or mask.stride(-1) != 1
            or native_body.disabled()):
        return None
    return _layer_of(drafter, layer)


def _layer_of(drafter: nn.Module, layer: nn.Module) -> NativeDraftLayer | None:
    """``drafter``'s draft ``layer`` packed (once; again when its weights changed), None where unsupported."""
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
    h, normed = native_body.add_norm(lib, hidden, bf16_kernel.rows_matmul(attn, native.o), native.post_norm,
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
            or not bf16_kernel.available() or native_body.disabled()):
        return norm(g)
    return native_body.rms_norm(bf16_kernel.library(), g.contiguous(), weight.detach(),
                                float(norm.variance_epsilon))




@dataclass(frozen=True)
class NativeDrafter:
    """What a one-call drafting pass reads besides the draft layer: the kernel-packed copies the drafter's own
    ``fc`` (``[d, F]``) and draft LM head (``[N, d]``) ``PackedLinear``s hold (the stepwise path's very
    products; no second copy), the final norm's weight ``[d]``, the base's input embedding weight ``[V, d]``
    and rotary module, the matrices as plan rows (int64 ``[5]``), and ``key``: what it was built from."""

    layer: NativeDraftLayer
    fc: bf16_kernel.PackedBf16
    head: bf16_kernel.PackedBf16
    final_norm: torch.Tensor
    eps: float
    embedding: torch.Tensor
    rotary: nn.Module
    fc_plan: torch.Tensor
    head_plan: torch.Tensor
    key: tuple


# drafter -> its packed parts, rebuilt when what they were built from changed (a refusal is not kept)
_DRAFTERS: weakref.WeakKeyDictionary[nn.Module, NativeDrafter] = weakref.WeakKeyDictionary()


def _native_of(linear: nn.Module) -> bf16_kernel.PackedBf16 | None:
    """The kernel-packed weight a ``PackedLinear`` computes through (bf16, kernel on, freshly packed, no
    bias), else None: only then does the stepwise path run the kernel the one-call pass runs."""
    native = getattr(linear, "native", None)
    if (native is None or getattr(linear, "stock", True) or not getattr(linear, "kernel", False)
            or linear.bias is not None or linear._key() != linear.packed_key):
        return None
    return native


def _key(drafter: nn.Module) -> tuple:
    """The identities and versions of everything a :class:`NativeDrafter` is built from: the draft layer's
    tensors, the two packed products, the final norm, the embedding and the rotary module."""
    layer, emb, norm = drafter.layers[0], drafter._embedding.module, drafter.norm
    tensors = [p for p in layer.parameters()] + [getattr(emb, "weight", None), getattr(norm, "weight", None)]
    packed = (_native_of(drafter.fc), _native_of(drafter.lm_head))
    return (tuple((t.data_ptr(), t._version) if isinstance(t, torch.Tensor) else None for t in tensors),
            tuple(None if m is None else m.data_ptr for m in packed), id(drafter._rotary.module), id(emb),
            id(norm), id(layer))


def _drafter_parts(drafter: nn.Module, key: tuple) -> NativeDrafter | None:
    layer = _layer_of(drafter, drafter.layers[0])
    emb, rotary, norm = drafter._embedding.module, drafter._rotary.module, drafter.norm
    fc, head = _native_of(drafter.fc), _native_of(drafter.lm_head)
    weights = (emb.weight, getattr(norm, "weight", None))
    if (layer is None or fc is None or head is None or type(emb) is not nn.Embedding or rotary is None
            or not rotary_table.tabled(rotary) or not hasattr(norm, "variance_epsilon")
            or float(norm.variance_epsilon) != layer.eps  # the C pass takes one epsilon for both norms
            or not all(isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16 and w.device.type == "cpu"
                       for w in weights)
            or drafter.hidden_size % 16 or not emb.weight.is_contiguous()):
        return None
    return NativeDrafter(
        layer=layer, fc=fc, head=head, final_norm=norm.weight.detach(), eps=float(norm.variance_epsilon),
        embedding=emb.weight.detach(), rotary=rotary,
        fc_plan=torch.tensor(native_body.plan_row(fc), dtype=torch.int64),
        head_plan=torch.tensor(native_body.plan_row(head), dtype=torch.int64), key=key)


def drafter_for(drafter: nn.Module, k: int) -> NativeDrafter | None:
    """``drafter`` (an :class:`~medusa.modeling.eagle3.Eagle3Heads`) ready for :func:`step` / :func:`top`
    (inference in bfloat16 on a CPU whose kernel is available, ``fc`` and the LM head computing through the
    native kernel -- packed by ``pack_linears``, as the stepwise path then runs them --, a plain embedding, a
    static rotary kind, ``k`` children at most :data:`medusa.native.pick.MAX_K` and the draft vocabulary),
    else None. Rebuilt whenever a module or weight it reads was replaced or changed (checked once per
    :func:`fixed_weights.during` scope: one ``generate`` call)."""
    if (torch.is_grad_enabled() or drafter.dtype != torch.bfloat16 or native_body.disabled()
            or not bf16_kernel.available() or k > min(pick.MAX_K, drafter.lm_head.out_features)):
        return None
    return fixed_weights.checked("native drafter", drafter, lambda: _drafter_now(drafter))


def _drafter_now(drafter: nn.Module) -> NativeDrafter | None:
    """``drafter`` packed, again when a module or weight it reads changed since (None where it cannot run)."""
    key = _key(drafter)
    packed = _DRAFTERS.get(drafter)
    if packed is None or packed.key != key:
        packed = _drafter_parts(drafter, key)
        if packed is None:
            _DRAFTERS.pop(drafter, None)
            return None
        _DRAFTERS[drafter] = packed
    return packed


def context_pieces(shape: tuple[int, int], last: torch.Tensor) -> list[tuple[int, int]] | None:
    """A context pass over ``shape`` = ``[B, M]`` entries too long for one native pass, as ``(start, end)``
    pieces of at most :data:`native_body.MAX_ROWS` rows (a long prompt's entries: every piece but the first
    in one C call), or None where one pass takes it all or a row's output entry ``last [B]`` would fall
    before the last piece. Each entry sees what it sees in one pass (the columns held before, the entries
    up to its own): the pieces compute its bits (row independence)."""
    b, m = shape
    size = native_body.MAX_ROWS // max(b, 1)
    if size < 1 or m <= size or bool((last < (m - 1) // size * size).any()):
        return None
    return [(start, min(start + size, m)) for start in range(0, m, size)]


def top(native: NativeDrafter, g: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``g [..., d]`` -> each row's ``k`` largest draft log-probabilities ``[..., k]`` (float32, descending)
    and their draft ids ``[..., k]``: the final norm, the LM head and the top-k log-softmax in one call."""
    g = g.contiguous()
    rows, d = g.numel() // g.shape[-1], g.shape[-1]
    values = torch.empty(*g.shape[:-1], k, dtype=torch.float32)
    indices = torch.empty(*g.shape[:-1], k, dtype=torch.long)
    work = torch.empty(rows * (d + native.head.n), dtype=torch.bfloat16)
    native.layer.lib.medusa_draft_top(g.data_ptr(), rows, d, native.final_norm.data_ptr(), native.eps,
                                      native.head_plan.data_ptr(), k, values.data_ptr(), indices.data_ptr(),
                                      work.data_ptr())
    return values, indices


def step(native: NativeDrafter, tokens: torch.Tensor, positions: torch.Tensor, inputs: torch.Tensor,
         mask: torch.Tensor, cache: Any, at: torch.Tensor | None, fuse: bool, k: int
         ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
    """One draft-layer pass in one call: the entries of ``tokens [B, T]`` (target ids) at ``positions [B, T]``
    with the hidden input ``inputs [B, T, d]`` or, ``fuse``, the base features ``inputs [B, T, F]`` through
    ``fc``, under ``mask [B, 1, T, S + T]``, appended to ``cache`` -> ``(g, values, ids)``: ``g [B, T, d]``
    (or ``[B, d]`` at each row's entry ``at [B]``) and, for ``k > 0``, each output row's top-``k`` draft
    log-probabilities and ids ``[..., k]`` (else None). None (nothing done) where the pass cannot run in
    one call (more than :data:`native_body.MAX_ROWS` entries, a cache without in-place room, another mask)."""
    b, t = tokens.shape
    layer = native.layer
    if (b * t > native_body.MAX_ROWS or b * t == 0 or mask.dim() != 4 or mask.dtype != torch.bfloat16
            or mask.stride(-1) != 1 or not hasattr(cache, "append_slots")):
        return None
    table = rotary_table.table_for(native.rotary, torch.bfloat16, int(positions.max()))
    slots = cache.append_slots(t)
    if slots is None:
        return None
    keys, values_cache, start, held = slots
    d, hd, hq, hkv, inter = native.final_norm.shape[0], layer.hd, layer.hq, layer.hkv, layer.inter
    rows = b * t
    out_rows = b if at is not None else rows
    inputs = inputs.to(torch.bfloat16).contiguous()
    ids = tokens.to(torch.int64).contiguous()
    where = positions.to(torch.int64).contiguous()
    work = torch.empty(rows * (2 * d + 2 * hd) + rows * (7 * d + (hq + 2 * hkv) * hd + hq * hd + 3 * inter)
                       + out_rows * (d + native.head.n), dtype=torch.bfloat16)
    out = torch.empty((b, d) if at is not None else (b, t, d), dtype=torch.bfloat16)
    last = None if at is None else at.to(torch.int64).contiguous()
    top_values = torch.empty(*out.shape[:-1], k, dtype=torch.float32) if k else None
    top_ids = torch.empty(*out.shape[:-1], k, dtype=torch.long) if k else None
    scratch = native_body.attention_scratch(mask, hd)
    layer.lib.medusa_draft_step(
        layer.plan.data_ptr(), native.fc_plan.data_ptr() if fuse else None, native.head_plan.data_ptr(),
        native.final_norm.data_ptr(), b, t, d, hq, hkv, hd, inter, layer.eps, native.embedding.data_ptr(),
        ids.data_ptr(), table.rows.data_ptr(), where.data_ptr(), inputs.data_ptr(), mask.data_ptr(),
        mask.stride(0), mask.stride(2), min(held, mask.shape[-1]), keys.data_ptr(), values_cache.data_ptr(),
        keys.stride(0), keys.stride(1), keys.stride(2), start, hd ** -0.5,
        None if last is None else last.data_ptr(), work.data_ptr(), scratch.data_ptr(), out.data_ptr(), k,
        None if top_values is None else top_values.data_ptr(),
        None if top_ids is None else top_ids.data_ptr())
    return out, top_values, top_ids


__all__ = ["NativeDraftLayer", "NativeDrafter", "context_pieces", "drafter_for", "final_norm", "forward",
           "native_layer_for", "step", "top"]
