"""A KV-cache layer that writes new entries in place into a preallocated buffer: transformers' ``Cache``
with this layer instead of ``DynamicLayer``, for eager tree decoding.

``DynamicLayer.update`` concatenates the whole cache with the new entries at every forward (``torch.cat``,
two per layer: ~3 ms of SmolLM2's one-token step over a 200-token context, growing with the context). Here
the keys and values live in a buffer ``[B, H, capacity, hd]`` that doubles when full; ``keys`` / ``values``
are views of its first ``length`` columns, as transformers' layers expose them (``update`` returns views
padded to a multiple of ``pad`` columns, zeros where never written, for a caller whose mask covers them:
:class:`medusa.decoding.kv_cache.DynamicKV`). Anything that cuts a layer
the way transformers and :func:`medusa.decoding.kv_cache.compact_cache` do -- assigning a prefix view
``keys[:, :, :n]`` (after writing kept entries into it in place) or ``crop`` -- keeps the buffer; a tensor
that is not a prefix view of the buffer is copied into a new buffer at the next ``update``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

MIN_CAPACITY = 256  # columns of a new buffer (it doubles when full)


def _is_prefix_view(view: torch.Tensor | None, buffer: torch.Tensor | None) -> bool:
    """Whether ``view`` is ``buffer[:, :, :n]`` for some ``n``."""
    return (view is not None and buffer is not None and view.data_ptr() == buffer.data_ptr()
            and view.stride() == buffer.stride() and view.shape[:2] == buffer.shape[:2]
            and view.shape[3] == buffer.shape[3] and view.shape[2] <= buffer.shape[2])


class GrowingLayer(CacheLayerMixin):
    """One decoder layer's keys and values ``[B, H, length, hd]``: views of a ``[B, H, capacity, hd]`` buffer
    that new entries are written into (transformers' cache-layer interface)."""

    is_sliding = False
    is_croppable = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._key_buffer: torch.Tensor | None = None  # [B, H, capacity, hd], zeros where never written
        self._value_buffer: torch.Tensor | None = None
        self._views: tuple[torch.Tensor, torch.Tensor] | None = None  # the keys / values last set here
        self.pad = 1  # update returns views of a multiple of pad columns (the caller masks the extra ones)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.keys = key_states[:, :, :0]
        self.values = value_states[:, :, :0]
        self.is_initialized = True

    def _room(self, extra: int) -> None:
        """Make the buffers hold the current entries plus ``extra`` columns, views of their first columns."""
        k, v = self.keys, self.values
        length = k.shape[2]
        prefix = self._own_views() or (_is_prefix_view(k, self._key_buffer)
                                       and _is_prefix_view(v, self._value_buffer))
        if prefix and length + extra <= self._key_buffer.shape[2]:
            return
        capacity = max(MIN_CAPACITY, 2 * (length + extra + self.pad))
        kb = k.new_zeros(k.shape[0], k.shape[1], capacity, k.shape[3])  # [B, H, capacity, hd]
        vb = v.new_zeros(v.shape[0], v.shape[1], capacity, v.shape[3])  # zeros: padding columns stay finite
        kb[:, :, :length].copy_(k)
        vb[:, :, :length].copy_(v)
        self._key_buffer, self._value_buffer = kb, vb
        self._set_views(length)

    def _own_views(self) -> bool:
        """Whether ``keys`` / ``values`` are the views this layer set last (prefix views of its buffers: the
        common case, no check needed); anything assigned from outside is checked."""
        return self._views is not None and self.keys is self._views[0] and self.values is self._views[1]

    def _set_views(self, end: int) -> None:
        """``keys`` / ``values``: the buffers' first ``end`` columns (remembered: this layer's own views)."""
        self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]
        self._views = (self.keys, self.values)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key_states`` / ``value_states`` ``[B, H, n, hd]`` after the cached entries; returns all
        keys and values ``[B, H, length + n, hd]`` (views)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[2]
        self._room(n + self.pad - 1)
        start = self.keys.shape[2]
        self._key_buffer[:, :, start:start + n].copy_(key_states)
        self._value_buffer[:, :, start:start + n].copy_(value_states)
        self._set_views(start + n)
        if self.pad == 1:
            return self.keys, self.values
        cols = -(-(start + n) // self.pad) * self.pad
        return self._key_buffer[:, :, :cols], self._value_buffer[:, :, :cols]

    def append_slots(self, n: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """Room for ``n`` new entries that the caller writes straight into the buffers (a native op, instead
        of :meth:`update`); they count as held from now on. Returns the key and value buffers ``[B, H,
        capacity, hd]``, the first new column and the columns :meth:`update` would return (padded)."""
        self._room(n + self.pad - 1)
        end = self.keys.shape[2] + n
        self._set_views(end)
        return self._key_buffer, self._value_buffer, end - n, -(-end // self.pad) * self.pad

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return 0 if not self.is_initialized else self.keys.shape[2]

    def get_max_length(self) -> int:
        return -1  # grows without bound

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` entries (a negative count, as transformers' layers take it)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        keep = max(self.keys.shape[2] + tokens_to_remove, 0)
        if self._own_views():
            self._set_views(keep)
            return
        self.keys, self.values = self.keys[:, :, :keep], self.values[:, :, :keep]

    def reset(self) -> None:
        self.keys = self.values = None
        self._key_buffer = self._value_buffer = None
        self._views = None
        self.is_initialized = False


def growing_cache() -> Cache:
    """An empty transformers ``Cache`` whose layers (added as the model's layers first write) are
    :class:`GrowingLayer`s: every position kept, as tree verification needs."""
    return Cache(layer_class_to_replicate=GrowingLayer)


__all__ = ["GrowingLayer", "MIN_CAPACITY", "growing_cache"]
