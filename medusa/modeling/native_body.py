"""A Llama-family decoder body in bfloat16 run layer by layer through the native bf16 kernel and its small
ops: the decode step's target forward (one token, a chain or a tree of up to 32) at the memory's speed.

Hugging Face's module code spends ~20 ms of a ~40 ms SmolLM2-135M one-token forward around its matmuls
(~1,500 small tensor ops and the module plumbing: docs/results/bf16-step.md). Here each layer is nine calls:
RMSNorm -> one fused q/k/v matmul -> rotary embedding in place -> the cache write (the transformers cache's
own ``update``) -> attention -> o_proj -> residual + RMSNorm -> one fused gate/up matmul -> SiLU * up ->
down_proj, whose residual add is fused into the next layer's norm (``kernels/bf16_decoder_ops.c``).

It computes what the model's bfloat16 forward computes, rounded where that rounds (outputs differ from
HF's in the last bits of some values: a different order of float32 sums), and it is row-independent:
attention sums only the columns a row's mask lets it see, in column order, so a tree verified in one
forward gives each node exactly what one-token forwards give it (a tree decode equals our plain decode,
side branches included). Used by :meth:`medusa.modeling.model.MedusaModel.forward` for inference-only
bfloat16 forwards of at most :data:`MAX_ROWS` rows with a 4-D tree mask over the decoder's KV cache (tree
steps, and a one-row prompt's pieces after its first 16 tokens); everything else (the prompt's first piece,
float32, training) runs the model's own code. :func:`unsupported_reason` says
why a model cannot use it. ``MEDUSA_NATIVE_BODY=0`` turns it off (to compare).
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from medusa.decoding.growing_cache import GrowingLayer
from medusa.decoding.hf import AttentionCache
from medusa.modeling import bf16_kernel, rotary_table
from medusa.native import fixed_weights

ENV = "MEDUSA_NATIVE_BODY"
MODEL_TYPES = ("llama", "qwen2")  # RMSNorm (weight * x), rotary q / k, SiLU-gated MLP, full attention
MAX_ROWS = 128  # tokens (batch x tree nodes, or a piece of a prompt) one native forward takes
PLAN_FIELDS = 22  # per layer: (data, np, k, bias, n) of q/k/v, o, gate/up, down; input and post norms


@dataclass(frozen=True)
class NativeLayer:
    """One decoder layer's packed weights (``[out, in]`` before packing) and norm weights ``[d]``."""

    qkv: bf16_kernel.PackedBf16  # [(Hq + 2 Hkv) hd, d]: q_proj, k_proj, v_proj stacked
    o: bf16_kernel.PackedBf16  # [d, Hq hd]
    gate_up: bf16_kernel.PackedBf16  # [2 I, d]: gate_proj, up_proj stacked
    down: bf16_kernel.PackedBf16  # [d, I]
    input_norm: torch.Tensor  # [d] bfloat16
    post_norm: torch.Tensor  # [d] bfloat16


@dataclass(frozen=True)
class NativeBody:
    """A model body's layers packed for :func:`forward`, and the tensors (and versions) packed from."""

    layers: tuple[NativeLayer, ...]
    embed: nn.Module  # the body's token embedding
    rotary: nn.Module  # the body's rotary module: (hidden, position_ids) -> cos, sin [B, T, hd] bfloat16
    final_norm: torch.Tensor  # [d]
    eps: float
    hq: int
    hkv: int
    hd: int
    inter: int
    lib: Any  # the kernel library (ctypes)
    plan: torch.Tensor  # [L, PLAN_FIELDS] int64: each layer's weights as the one-call body reads them
    sources: tuple[torch.Tensor, ...]  # every weight packed here, in order
    versions: tuple[tuple[int, int], ...]  # (data_ptr, _version) of each source when packed

    def fresh(self) -> bool:
        """Whether no packed weight changed since packing (trained, loaded or moved since)."""
        return versions_of(self.sources) == self.versions


def versions_of(tensors: tuple[torch.Tensor, ...]) -> tuple[tuple[int, int], ...]:
    """``(data_ptr, _version)`` of each tensor: what a packed copy records to notice a changed weight."""
    return tuple((t.data_ptr(), t._version) for t in tensors)


def disabled() -> bool:
    """Whether ``MEDUSA_NATIVE_BODY=0`` (or false / no / off) turns native passes off."""
    return os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off")


def unsupported_reason(body: nn.Module, config: Any) -> str:
    """Why ``body`` (a decoder body, ``config`` its text config) cannot run natively ("" when it can)."""
    if disabled():
        return f"{ENV}=0"
    if not bf16_kernel.available():
        return f"the native bf16 kernel is unavailable: {bf16_kernel.unavailable_reason()}"
    if getattr(config, "model_type", None) not in MODEL_TYPES:
        return f"model_type {getattr(config, 'model_type', None)!r} is not one of {MODEL_TYPES}"
    if getattr(config, "hidden_act", None) not in ("silu", "swish"):
        return f"hidden_act {getattr(config, 'hidden_act', None)!r} is not silu"
    if getattr(config, "use_sliding_window", False) or any(
            t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        return "sliding-window attention"
    layers = getattr(body, "layers", None)
    if layers is None or not hasattr(body, "rotary_emb") or not hasattr(body, "embed_tokens"):
        return f"{type(body).__name__} has no layers / rotary_emb / embed_tokens"
    hd = getattr(layers[0].self_attn, "head_dim", 0)
    widths = (config.hidden_size, config.intermediate_size, hd)
    if any(w % bf16_kernel.K_MULTIPLE for w in widths):
        return f"widths {widths} are not multiples of {bf16_kernel.K_MULTIPLE}"
    if hd > 256:
        return f"head_dim {hd} > 256"
    every = [lin for layer in layers for lin in linears(layer)]
    if any(lin.weight.dtype != torch.bfloat16 or lin.weight.device.type != "cpu" for lin in every):
        return "the weights are not bfloat16 on the CPU"
    return ""


def linears(layer: nn.Module) -> tuple[nn.Module, ...]:
    """A Llama-style decoder layer's seven linears: q, k, v, o, gate, up, down."""
    a, m = layer.self_attn, layer.mlp
    return a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj


def stacked(*linears: nn.Module) -> bf16_kernel.PackedBf16:
    """One packed weight for several linears of the same input, their outputs side by side."""
    weight = torch.cat([lin.weight.detach() for lin in linears])  # [sum out, in]
    biases = [lin.bias for lin in linears]
    bias = None if all(b is None for b in biases) else torch.cat(
        [torch.zeros(lin.out_features) if b is None else b.detach().float()
         for lin, b in zip(linears, biases)])
    return bf16_kernel.pack(weight, bias)


def build(body: nn.Module, config: Any) -> NativeBody:
    """Pack ``body``'s layers (see :func:`unsupported_reason`, which must be "")."""
    layers, sources = [], []
    for layer in body.layers:
        q, k, v, o, gate, up, down = linears(layer)
        layers.append(NativeLayer(
            qkv=stacked(q, k, v), o=stacked(o), gate_up=stacked(gate, up), down=stacked(down),
            input_norm=layer.input_layernorm.weight.detach(),
            post_norm=layer.post_attention_layernorm.weight.detach()))
        sources += [lin.weight for lin in (q, k, v, o, gate, up, down)]
        sources += [lin.bias for lin in (q, k, v, o, gate, up, down) if lin.bias is not None]
    attn = body.layers[0].self_attn
    return NativeBody(
        layers=tuple(layers), embed=body.embed_tokens, rotary=body.rotary_emb,
        final_norm=body.norm.weight.detach(), eps=float(body.norm.variance_epsilon),
        hq=config.num_attention_heads, hkv=config.num_key_value_heads, hd=attn.head_dim,
        inter=config.intermediate_size, lib=bf16_kernel.library(), plan=_plan(layers),
        sources=tuple(sources), versions=versions_of(tuple(sources)))


def _plan(layers: list[NativeLayer]) -> torch.Tensor:
    """``[L, PLAN_FIELDS]`` int64: each layer's packed matrices and norm weights as addresses and sizes
    (``kernels/bf16_layers.c``; the tensors stay alive in ``layers``)."""
    rows = [[v for m in (layer.qkv, layer.o, layer.gate_up, layer.down) for v in plan_row(m)]
            + [layer.input_norm.data_ptr(), layer.post_norm.data_ptr()] for layer in layers]
    return torch.tensor(rows, dtype=torch.int64)


def plan_row(m: bf16_kernel.PackedBf16) -> list[int]:
    """A packed matrix as the one-call passes read it: data address, padded outputs, inputs, bias address
    (0: none), outputs."""
    return [m.data_ptr, m.np, m.k, m.bias_ptr or 0, m.n]


def applies(input_ids: Any, mask: Any, cache: Any) -> bool:
    """Whether a forward with these inputs can run natively: inference, at most :data:`MAX_ROWS` tokens, a
    4-D bfloat16 mask and a KV cache that already holds entries (the attention-facing interface,
    :class:`medusa.decoding.hf.AttentionCache`: the decoder's cache after its prefill)."""
    return (isinstance(input_ids, torch.Tensor) and input_ids.numel() <= MAX_ROWS
            and not torch.is_grad_enabled()
            and isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.dtype == torch.bfloat16
            and mask.stride(-1) == 1 and isinstance(cache, AttentionCache) and cache.get_seq_length() > 0)


# model -> its body packed for native tree steps, or None where the body cannot run natively (built once)
_PACKED: weakref.WeakKeyDictionary[nn.Module, NativeBody | None] = weakref.WeakKeyDictionary()


def native_for(model: nn.Module, body: nn.Module, config: Any, input_ids: Any, mask: Any, cache: Any
               ) -> NativeBody | None:
    """``model``'s ``body`` (``config`` its text config) packed for :func:`forward` when this forward can run
    so (:func:`applies`, the body supported), else None. Packed at the first such forward, again when a
    weight changed since (checked once per :func:`fixed_weights.during` scope: one ``generate`` call)."""
    if not applies(input_ids, mask, cache):
        return None
    return fixed_weights.checked("native body", model, lambda: _packed_now(model, body, config))


def _packed_now(model: nn.Module, body: nn.Module, config: Any) -> NativeBody | None:
    """``model``'s packed body, packed again when a weight changed since (None where unsupported)."""
    packed = _PACKED.get(model, False)
    if packed is False or (packed is not None and not packed.fresh()):
        packed = None if unsupported_reason(body, config) else build(body, config)
        _PACKED[model] = packed
    return packed


def forward(native: NativeBody, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
            cache: Any, hidden_states: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """The body over ``input_ids [B, T]`` at ``position_ids [B, T]``, attending where ``mask [B, 1, T, S]``
    (additive, bfloat16; S >= the cached columns + T) allows; appends the tokens' keys / values to
    ``cache``. Returns the last hidden state ``[B, T, d]`` (after the final norm) and, with
    ``hidden_states``, the model's ``hidden_states`` tuple (embeddings, each layer's input, the last)."""
    lib, b, t = native.lib, input_ids.shape[0], input_ids.shape[1]
    h = native.embed(input_ids)  # [B, T, d]
    cos, sin = (rotary_table.row_major(c)
                for c in rotary_table.cos_sin(native.rotary, h, position_ids.expand(b, t)))  # [B, T, hd]
    x = rms_norm(lib, h, native.layers[0].input_norm, native.eps)
    scratch = attention_scratch(mask, native.hd)
    slots = _append_slots(cache, len(native.layers), t)
    if slots is not None:  # the decoder's growing cache: every layer in one C call
        return _one_call(native, h, x, cos, sin, mask, slots, scratch, hidden_states)
    collected = [h] if hidden_states else None
    for i, layer in enumerate(native.layers):
        attn = attend(lib, x, layer.qkv, cos, sin, mask, cache, i, scratch, native.hq, native.hkv,
                      native.hd)  # [B, T, Hq hd]
        h, x = add_norm(lib, h, bf16_kernel.rows_matmul(attn, layer.o), layer.post_norm, native.eps)
        last = i + 1 == len(native.layers)
        norm = native.final_norm if last else native.layers[i + 1].input_norm
        h, x = add_norm(lib, h, mlp(lib, x, layer.gate_up, layer.down, native.inter), norm, native.eps)
        if collected is not None:
            collected.append(x if last else h)
    return x, None if collected is None else tuple(collected)


def _append_slots(cache: Any, layers: int, t: int) -> tuple[torch.Tensor, torch.Tensor, int, int] | None:
    """Room for ``t`` new entries in every layer of a cache of :class:`GrowingLayer`s (:func:`_growing_layer`)
    holding the same columns: ``(kv [2L] int64 buffer addresses, a key buffer (its strides hold for all),
    start column, columns held)``; None (nothing reserved) for any other cache."""
    grown = [_growing_layer(cache, i) for i in range(layers)]
    if any(layer is None for layer in grown) or len(getattr(cache, "layers", ())) != layers:
        return None
    length, stride = grown[0].keys.shape[2], grown[0].keys.stride()
    if any(layer.keys.shape[2] != length or layer.keys.stride() != stride for layer in grown):
        return None
    slots = [layer.append_slots(t) for layer in grown]
    if any(k.stride() != slots[0][0].stride() for k, _, _, _ in slots):  # a buffer grew unlike the others
        for layer in grown:
            layer.crop(-t)
        return None
    kv = torch.tensor([p for k, v, _, _ in slots for p in (k.data_ptr(), v.data_ptr())], dtype=torch.int64)
    return kv, slots[0][0], slots[0][2], slots[0][3]


def _one_call(native: NativeBody, h: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              mask: torch.Tensor, slots: tuple, scratch: torch.Tensor, hidden_states: bool
              ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """:func:`forward`'s layers as one ``medusa_body_forward`` call (``kernels/bf16_layers.c``): the same ops
    in the same order, so the same bits, without the Python between them."""
    kv, keys, start, held = slots
    b, t, d = h.shape
    rows, hq, hkv, hd, inter = b * t, native.hq, native.hkv, native.hd, native.inter
    work = torch.empty(rows * ((hq + 2 * hkv) * hd + hq * hd + 2 * d + 3 * inter), dtype=torch.bfloat16)
    h = h.contiguous()  # the residual stream (the embedding's fresh output), updated in place
    states = None
    if hidden_states:
        states = torch.empty(len(native.layers) + 1, b, t, d, dtype=torch.bfloat16)  # [L + 1, B, T, d]
        states[0] = h
    native.lib.medusa_body_forward(
        native.plan.data_ptr(), len(native.layers), b, t, d, hq, hkv, hd, inter, native.eps, h.data_ptr(),
        x.data_ptr(), cos.data_ptr(), sin.data_ptr(), cos.stride(-2), mask.data_ptr(), mask.stride(0),
        mask.stride(2), min(held, mask.shape[-1]), kv.data_ptr(), keys.stride(0), keys.stride(1),
        keys.stride(2), start, hd ** -0.5, work.data_ptr(), scratch.data_ptr(),
        None if states is None else states.data_ptr(), native.final_norm.data_ptr())
    return x, None if states is None else tuple(states.unbind(0))


def attention_scratch(mask: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The float32 scratch :func:`attend` needs under ``mask [B, 1, T, S]``: 16 queries' scores, each row
    ``S`` rounded up to 16 plus 16 wide (``head_dim``: kept for callers; the values are read as they lie)."""
    return torch.empty(16 * mask.shape[-1] + 512, dtype=torch.float32)


def attend(lib: Any, x: torch.Tensor, qkv_weight: bf16_kernel.PackedBf16, cos: torch.Tensor,
           sin: torch.Tensor, mask: torch.Tensor, cache: Any, layer_idx: int, scratch: torch.Tensor, hq: int,
           hkv: int, hd: int) -> torch.Tensor:
    """A layer's attention before o_proj: ``x [B, T, k]`` (normed) -> q / k / v in one product, rotary
    embedding (``cos``, ``sin`` ``[B, T, hd]``) on q and k in place, k / v appended to ``cache``'s layer
    ``layer_idx`` (its ``update`` gives back every column), attention under ``mask [B, 1, T, S]`` ->
    ``[B, T, hq hd]``. ``cos`` / ``sin``: unit stride along ``hd``, rows ``stride(-2)`` apart
    (:func:`rotary_table.row_major`)."""
    b, t = x.shape[0], x.shape[1]
    qd, kd = hq * hd, hkv * hd
    qkv = bf16_kernel.rows_matmul(x, qkv_weight)  # [B, T, qd + 2 kd]
    lib.medusa_rope(qkv.data_ptr(), b * t, qkv.shape[-1], hq + hkv, hd, cos.data_ptr(), sin.data_ptr(),
                    cos.stride(-2))
    k = qkv[..., qd:qd + kd].view(b, t, hkv, hd).transpose(1, 2)  # [B, Hkv, T, hd]
    v = qkv[..., qd + kd:].view(b, t, hkv, hd).transpose(1, 2)
    keys, values = cache.update(k, v, layer_idx)  # [B, Hkv, S', hd]
    cols = min(keys.shape[2], mask.shape[-1])
    out = torch.empty(b, t, qd, dtype=torch.bfloat16)
    lib.medusa_attention(qkv.data_ptr(), qkv.shape[-1], b, t, hq, hkv, hd, keys.data_ptr(), values.data_ptr(),
                         keys.stride(0), keys.stride(1), keys.stride(2), cols, mask.data_ptr(),
                         mask.stride(0), mask.stride(2), hd ** -0.5, out.data_ptr(), qd, scratch.data_ptr())
    return out


def _growing_layer(cache: Any, layer_idx: int) -> GrowingLayer | None:
    """The cache's layer ``layer_idx`` where k / v can be written into its buffers directly: a
    :class:`GrowingLayer` already holding entries, keys and values laid out alike (else None: ``update``)."""
    layers = getattr(cache, "layers", None)
    layer = layers[layer_idx] if isinstance(layers, list) and layer_idx < len(layers) else None
    if type(layer) is not GrowingLayer or not layer.is_initialized or layer.keys is None:
        return None
    keys, values = layer.keys, layer.values
    if keys.dtype != torch.bfloat16 or keys.stride() != values.stride() or keys.stride(3) != 1:
        return None
    return layer


def mlp(lib: Any, x: torch.Tensor, gate_up: bf16_kernel.PackedBf16, down: bf16_kernel.PackedBf16,
        inter: int) -> torch.Tensor:
    """``down(SiLU(gate(x)) * up(x))`` for ``x [..., d]`` (normed) -> ``[..., d]``."""
    gu = bf16_kernel.rows_matmul(x, gate_up)  # [..., 2 I]
    act = torch.empty(*x.shape[:-1], inter, dtype=torch.bfloat16)
    lib.medusa_silu_mul(gu.data_ptr(), x.numel() // x.shape[-1], inter, 2 * inter, act.data_ptr(), inter)
    return bf16_kernel.rows_matmul(act, down)


def rms_norm(lib: Any, h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``h [..., d]`` (contiguous) with ``weight [d]``."""
    out = torch.empty_like(h)
    lib.medusa_rms_norm(h.data_ptr(), h.numel() // h.shape[-1], h.shape[-1], weight.data_ptr(), eps,
                        out.data_ptr())
    return out


def add_norm(lib: Any, h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(``h + delta``, RMSNorm of it with ``weight``), each ``[B, T, d]``."""
    total, normed = torch.empty_like(h), torch.empty_like(h)
    lib.medusa_add_rms_norm(h.data_ptr(), delta.data_ptr(), h.numel() // h.shape[-1], h.shape[-1],
                            weight.data_ptr(), eps, total.data_ptr(), normed.data_ptr())
    return total, normed


__all__ = ["ENV", "MAX_ROWS", "MODEL_TYPES", "NativeBody", "NativeLayer", "add_norm", "applies", "attend",
           "attention_scratch", "build", "disabled", "forward", "linears", "mlp", "native_for", "rms_norm",
           "stacked", "unsupported_reason", "versions_of"]
