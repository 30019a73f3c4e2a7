"""Custom 4-D attention masks and sliding-window layers: what the base model's body is given.

Tree verification passes the body one float mask ``[B, 1, T, S]`` (0 where a query may attend, dtype-min
elsewhere). transformers uses a 4-D mask as it is, for every layer (``masking_utils`` returns a 4-D mask
unchanged, sliding or not), so a sliding-window layer would see keys further back than its window. Here the
window is applied to the mask itself, as the 1-token forward would apply it:

- a query may see a key only if at most ``window`` of its visible keys lie at or after that key's column.
  The keys a tree node (or a prompt token) sees are exactly the positions ``0 .. its own`` in column order
  (prompt, accepted tokens, its tree ancestors; padding and holes are masked), so this is transformers'
  rule ``kv_position > q_position - window`` — by position, not by cache column, which holes and the tree
  layout shift;
- models whose layers mix full and sliding attention (``config.layer_types``: Gemma-2/3, Qwen2/3,
  Cohere2, GPT-OSS) take a dict ``{"full_attention": mask, "sliding_attention": windowed}``, which their
  bodies accept in place of the mask they would build; models whose every layer slides (Mistral, Phi-3,
  Mixtral, Starcoder2 with ``sliding_window`` set) take the windowed mask alone.

The decode loop never asks which kind of model it runs: :meth:`MedusaModel.forward` calls :func:`body_mask`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from medusa.decoding.hf import text_config, unwrap
from medusa.errors import MedusaError

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class WindowLayout:
    window: int | None  # the sliding window (keys a query sees, itself included); None: no sliding layer
    mixed: bool  # some layers full, some sliding: the body takes a per-layer-type dict


def window_layout(model: torch.nn.Module) -> WindowLayout:
    """How the base model's layers attend: its sliding window and whether full layers sit beside them.

    Raises :class:`MedusaError` for attention a causal 4-D tree mask cannot express (layer types other
    than full / sliding, e.g. chunked attention; bidirectional attention)."""
    cfg = text_config(model)
    if getattr(cfg, "use_bidirectional_attention", False):
        raise MedusaError(f"{cfg.model_type}: bidirectional attention cannot verify a causal token tree")
    layer_types = list(getattr(cfg, "layer_types", None) or [])
    unknown = sorted(set(layer_types) - {FULL, SLIDING})
    if unknown:
        raise MedusaError(f"{cfg.model_type}: layer types {unknown} are not supported by MEDUSA decoding "
                          f"(full_attention and sliding_attention are)")
    window = getattr(cfg, "sliding_window", None)
    if window is None or getattr(cfg, "use_sliding_window", True) is False:
        return WindowLayout(None, False)
    if layer_types and SLIDING not in layer_types:
        return WindowLayout(None, False)
    return WindowLayout(int(window), bool(layer_types) and FULL in layer_types)


def window_mask(mask: torch.Tensor, window: int) -> torch.Tensor:
    """``mask [B, 1, T, S]`` (float, additive: dtype-min = masked; or bool, True = allowed) with every key
    beyond a query's ``window`` most recent visible keys masked too; the same object when no query can see
    more than ``window`` keys."""
    if mask.shape[-1] <= window:
        return mask
    if mask.dtype == torch.bool:
        allowed = mask
    else:
        allowed = mask > torch.finfo(mask.dtype).min / 2  # [B, 1, T, S]
    counts = allowed.to(torch.int32)
    # visible keys at or after each column, per query: total - (inclusive cumsum) + self
    at_or_after = counts.sum(-1, keepdim=True) - counts.cumsum(-1) + counts  # [B, 1, T, S]
    beyond = allowed & (at_or_after > window)
    if mask.dtype == torch.bool:
        return mask & ~beyond
    return mask.masked_fill(beyond, torch.finfo(mask.dtype).min)


def body_mask(model: torch.nn.Module, mask: Any) -> Any:
    """What the body of ``model`` should receive for ``mask``: a 2-D padding mask (or None, or a dict the
    caller built) unchanged — the body builds its own sliding masks from it; a 4-D mask windowed per
    :func:`window_layout` (a per-layer-type dict where full and sliding layers mix)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return mask
    layout = window_layout(unwrap(model))
    if layout.window is None:
        return mask
    windowed = window_mask(mask, layout.window)
    if windowed is mask:
        return mask  # no query reaches past the window: one mask serves every layer
    return {FULL: mask, SLIDING: windowed} if layout.mixed else windowed


__all__ = ["FULL", "SLIDING", "WindowLayout", "body_mask", "window_layout", "window_mask"]
