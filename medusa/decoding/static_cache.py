"""The static-shape KV cache: transformers' ``StaticCache`` (preallocated ``[B, H, L, hd]`` per layer), a
preallocated mask, in-place compaction of the accepted path by an index copy inside each row, so every
verification step has the same shapes (``torch.compile`` friendly: the cache length ``past`` is a device
tensor, never a Python int inside the device functions). :class:`StaticKV` satisfies
:class:`medusa.decoding.kv_cache.TreeCache`; the step itself is :func:`medusa.decoding.step.step`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from medusa.decoding.hf import text_config, unwrap
from medusa.decoding.kv_cache import cache_bucket, prompt_position_ids, tree_mask_buffer
from medusa.errors import MedusaError


def static_capacity(prompt_len: int, max_new_tokens: int, batch: int, num_nodes: int, depth: int) -> int:
    """Cache columns a run can need: the prompt, the tree (``num_nodes``, ``depth`` deep), and the kept
    entries of every step. One row advances by its own gain (<= max_new + D); rows of a batch advance by the
    step's largest gain (holes)."""
    kept = max_new_tokens + depth + 1 if batch == 1 else (depth + 1) * max_new_tokens
    return cache_bucket(prompt_len + kept + num_nodes)


def new_static_cache(model: Any, max_len: int) -> Any:
    """A ``StaticCache`` of ``max_len`` columns whose layers are all full-attention ``StaticLayer``s."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    cache = StaticCache(config=unwrap(model.base_model).config, max_cache_len=max_len)
    if any(type(layer) is not StaticLayer for layer in cache.layers):
        raise MedusaError(f"{text_config(model.base_model).model_type}: the static cache path needs "
                          "full-attention layers only (sliding-window layers found); use the default cache")
    return cache


Compact = Callable[..., torch.Tensor]  # compact(hf, mask, past, path, keep, arange_n): eager or compiled


@dataclass
class StaticKV:
    """Tree decoding on a ``StaticCache`` (fixed shapes). ``compact_fn`` is :func:`compact` itself or its
    ``torch.compile``d wrapper (:mod:`medusa.decoding.compiled`)."""

    hf: Any  # StaticCache: [B, H, L, hd] per layer; columns < past hold the rows' tokens and holes
    mask: torch.Tensor  # [B, 1, N, L] float: 0 real token / dtype-min pad, hole or unused column
    past: torch.Tensor  # [] long: used cache columns, equal for all rows (advance: the step's largest keep)
    arange_n: torch.Tensor  # [N] long, preallocated
    compact_fn: Compact
    past_host: int = 0  # ``past`` on the host (advanced from the step's host copy: no extra sync)

    @property
    def valid(self) -> torch.Tensor:
        """``[B, past]`` bool: which cache columns hold a real token of the row."""
        return self.mask[:, 0, 0, :self.past_host] == 0

    def reserve(self, n: int) -> None:
        if self.past_host + n > self.mask.shape[-1]:
            raise MedusaError(f"static cache full ({self.mask.shape[-1]} columns); raise its capacity")

    def write_tree(self, float_mask: torch.Tensor) -> tuple[torch.Tensor, Any]:
        b, _, n, _ = self.mask.shape
        cols = self.arange_n + self.past  # [N] cache columns of the tree
        tree_cols = float_mask.expand(b, n, n).unsqueeze(1)  # [B, 1, N, N]: one tree ([N, N]) or one per row
        self.mask.index_copy_(3, cols, tree_cols)  # mask: [B, 1, N, L]
        for layer in self.hf.layers:
            layer.cumulative_length.copy_(cols[0])  # StaticLayer writes the new entries at cumulative_length
        return self.mask, self.hf

    def compact(self, path: torch.Tensor, keep: torch.Tensor, result: Any) -> None:
        self.compact_fn(self.hf, self.mask, self.past, path, keep, self.arange_n)
        self.past_host += result.max_kept

    def dry_compact(self, path: torch.Tensor, keep: torch.Tensor) -> None:
        """Run ``compact_fn`` once (compiling it) on clones of the mask and ``past``, the KV restored after:
        the decode is unchanged."""
        saved = [(layer.keys.clone(), layer.values.clone()) for layer in self.hf.layers]
        self.compact_fn(self.hf, self.mask.clone(), self.past.clone(), path, keep, self.arange_n)
        for layer, (k, v) in zip(self.hf.layers, saved):
            layer.keys.copy_(k)
            layer.values.copy_(v)


def static_prefill(model: Any, input_ids: torch.Tensor, mask2d: torch.Tensor, num_nodes: int, capacity: int,
                   dtype: torch.dtype, compact_fn: Compact
                   ) -> tuple[StaticKV, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the left-padded prompt ``[B, P]`` into a fresh ``StaticCache`` of ``capacity`` columns (eager: the
    prompt length varies); returns the cache, the last position's logits ``[B, V]``, the base features at
    every prompt position ``[B, P, F]`` and at the last one ``[B, F]`` (contiguous, as every later step's:
    compiled functions specialise on strides)."""
    b, p = input_ids.shape
    device = input_ids.device
    hf = new_static_cache(model, capacity)
    neg = torch.finfo(dtype).min
    causal = torch.ones(p, capacity, dtype=torch.bool, device=device).tril()  # [P, L]: key j <= query i
    real = torch.nn.functional.pad(mask2d.bool(), (0, capacity - p))  # [B, L]: the prompt's real tokens
    keep = causal.view(1, 1, p, capacity) & real.view(b, 1, 1, capacity)
    prompt_mask = torch.where(keep, 0.0, neg).to(dtype)  # [B, 1, P, L]
    out = model(input_ids=input_ids, attention_mask=prompt_mask, position_ids=prompt_position_ids(mask2d),
                past_key_values=hf, use_cache=True, positions=torch.tensor([p - 1], device=device),
                compute_heads=False)
    mask = tree_mask_buffer(mask2d, num_nodes, capacity, dtype)  # [B, 1, N, L]
    past = torch.tensor(p, dtype=torch.long, device=device)
    for t in (mask, past):  # mutated inside the compiled step: fixed addresses (CUDA graphs need them)
        torch._dynamo.mark_static_address(t)
    kv = StaticKV(hf, mask, past, torch.arange(num_nodes, device=device), compact_fn, p)
    last = out.hidden_states[:, -1].clone(memory_format=torch.contiguous_format)  # [B, F]
    return kv, out.logits[:, -1], out.hidden_states, last


def compact(cache: Any, mask: torch.Tensor, past: torch.Tensor, path: torch.Tensor, keep: torch.Tensor,
            arange_n: torch.Tensor) -> torch.Tensor:
    """The kept entries moved to columns ``past .. past+D`` of each row (fixed D+1 wide; entries past the
    row's keep are masked), their mask columns set, ``past`` advanced by the largest keep. Returns keep
    ``[B]`` (kept nodes per row, root included)."""
    b, width = path.shape
    n = arange_n.shape[0]
    cols = arange_n + past  # [N] cache columns of the tree
    neg = torch.finfo(mask.dtype).min
    src = path + cols[0]  # [B, D+1] cache columns of the kept nodes
    dst = cols[:width]  # [D+1]
    for layer in cache.layers:
        for t in (layer.keys, layer.values):  # [B, H, L, hd]
            idx = src.view(b, 1, width, 1).expand(-1, t.shape[1], -1, t.shape[3])
            t.index_copy_(2, dst, torch.gather(t, 2, idx))
    valid = arange_n.view(1, n) < keep.view(b, 1)  # [B, N]: the first keep columns are real tokens
    cols_mask = torch.where(valid, 0.0, neg).to(mask.dtype)  # [B, N]
    mask.index_copy_(3, cols, cols_mask.view(b, 1, 1, n).expand(b, 1, n, n))
    past.add_(keep.max())
    return keep


__all__ = ["StaticKV", "compact", "new_static_cache", "static_capacity", "static_prefill"]
