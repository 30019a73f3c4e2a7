"""KV-cache operations for tree decoding on transformers' ``DynamicCache``, and attention checks."""

from __future__ import annotations

from typing import Any

import torch

from medusa.errors import MedusaError
from medusa.modeling.attention import window_layout
from medusa.modeling.base import text_config, unwrap


def new_cache() -> Any:
    """An empty ``DynamicCache`` whose layers all keep every position (tree verification needs them all)."""
    from transformers import DynamicCache

    return DynamicCache()


def prompt_position_ids(mask2d: torch.Tensor) -> torch.Tensor:
    """``[B, P]`` position ids of a left-padded prompt (``mask2d [B, P]``), as HF generate builds them."""
    position_ids = mask2d.cumsum(-1) - 1
    return position_ids.masked_fill_(mask2d == 0, 1)


def tree_mask_buffer(mask2d: torch.Tensor, num_nodes: int, capacity: int, dtype: torch.dtype) -> torch.Tensor:
    """The decode loop's float mask ``[B, 1, N, capacity]``: the prompt's columns 0 (real token) or dtype-min
    (left padding), every later column dtype-min until a step writes it."""
    b, p = mask2d.shape
    neg = torch.finfo(dtype).min
    mask = torch.full((b, 1, num_nodes, capacity), neg, dtype=dtype, device=mask2d.device)
    mask[:, 0, :, :p] = torch.where(mask2d.bool(), 0.0, neg).to(dtype).unsqueeze(1)
    return mask


def check_supported(model: torch.nn.Module, total_length: int) -> None:
    """Raise :class:`MedusaError` when the model's attention cannot verify a tree with a 4-D float mask."""
    inner = unwrap(model)
    cfg = text_config(model)
    impl = getattr(cfg, "_attn_implementation", None) or getattr(inner.config, "_attn_implementation", None)
    if impl is not None and ("flash" in str(impl) or "paged" in str(impl)):
        raise MedusaError(f"{type(inner).__name__}: attn_implementation={impl!r} cannot take a 4-D "
                          "tree attention mask; load the base model with attn_implementation='sdpa' or "
                          "'eager'")
    if getattr(inner.config, "is_encoder_decoder", False):
        raise MedusaError(f"{type(inner).__name__}: encoder-decoder models are not supported by "
                          f"MEDUSA decoding")
    window_layout(model)  # attention a causal tree mask cannot express is an error


def compact_cache(cache: Any, past_len: int, keep_index: torch.Tensor | None,
                  keep: int | None = None) -> None:
    """Keep only the accepted tree entries: for every layer, entries ``past_len + keep_index[b, j]`` move in
    place to ``past_len + j`` and the cache is cut to ``past_len + A`` (``keep_index [B, A]``).
    ``keep_index=None`` with ``keep=A``: the kept entries are already the first A; only cut."""
    if keep_index is None:
        for layer in cache.layers:
            layer.keys = layer.keys[:, :, :past_len + keep]
            layer.values = layer.values[:, :, :past_len + keep]
            if hasattr(layer, "cumulative_length"):
                layer.cumulative_length = past_len + keep
        return
    b, a = keep_index.shape
    src = keep_index + past_len  # [B, A]
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)  # [B, H, T, hd]
            if b == 1:
                picked = t.index_select(2, src[0])  # [1, H, A, hd]
            else:
                idx = src.view(b, 1, a, 1).expand(-1, t.shape[1], -1, t.shape[3])
                picked = torch.gather(t, 2, idx)  # [B, H, A, hd]
            t[:, :, past_len:past_len + a].copy_(picked)
            setattr(layer, name, t[:, :, :past_len + a])
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = past_len + a
