"""KV-cache operations for tree decoding on transformers' ``DynamicCache``, and attention checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from medusa.decoding.attention import window_layout
from medusa.decoding.growing_cache import GrowingLayer, growing_cache
from medusa.decoding.hf import text_config, unwrap
from medusa.errors import MedusaError

MIN_BUCKET = 64  # the smallest cache / context bucket (columns)
KV_PAD = 16  # a tree step's keys / values span a multiple of this many columns (see DynamicKV)
FIRST_PIECE = 16  # a prompt run in pieces: its first tokens in one forward that starts the cache


def cache_bucket(length: int) -> int:
    """The cache length for ``length`` needed columns: the next power of two (at least :data:`MIN_BUCKET`), so
    prompts of similar length share one compiled step."""
    return max(MIN_BUCKET, 1 << (max(length, 1) - 1).bit_length())


def padded(columns: int, pad: int = KV_PAD) -> int:
    """``columns`` rounded up to a multiple of ``pad``."""
    return -(-columns // pad) * pad


def new_cache() -> Any:
    """An empty transformers ``Cache`` whose layers all keep every position (tree verification needs them
    all), written in place (:mod:`medusa.decoding.growing_cache`: no ``torch.cat`` of the whole cache per
    forward)."""
    return growing_cache()


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


class TreeCache(Protocol):
    """The KV cache a decode step verifies a tree against (:class:`DynamicKV` or
    :class:`medusa.decoding.static_cache.StaticKV`): the step does not know which it has."""

    def reserve(self, n: int) -> None:
        """Make room for ``n`` tree entries (grow, or raise when a fixed-size cache is full). Host side."""
        ...

    def write_tree(self, float_mask: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Write the tree's mask columns (``float_mask [N, N]`` or per row ``[B, N, N]``) after the cached
        entries; returns the 4-D attention mask ``[B, 1, N, cols]`` for the forward and the HF cache object
        the forward appends the tree's keys / values to."""
        ...

    def compact(self, path: torch.Tensor, keep: torch.Tensor, result: Any) -> None:
        """Keep each row's accepted nodes (``path [B, D+1]`` node indices, the first ``keep [B]`` kept) in
        place after the cached entries and drop the rest; ``result``: the step's host copy
        (:class:`medusa.decoding.step.StepResult`)."""
        ...


@dataclass
class DynamicKV:
    """Tree decoding on a transformers cache of :class:`medusa.decoding.growing_cache.GrowingLayer`s: the
    cache grows by each step's largest keep (``past_len`` columns, equal for all rows); columns a row did not
    keep are holes, masked out. Each step attends over a multiple of :data:`KV_PAD` columns (the extra ones
    masked): attention sums its scores in 16-lane vectors plus a scalar tail, so a one-token step and a
    tree whose key lengths end in different 16-column chunks would round a row's sums differently; padded,
    a chain of drafts computes bit for bit what one-token steps do (with row-independent linears:
    :mod:`medusa.modeling.bf16_kernel`)."""

    hf: Any  # transformers Cache (GrowingLayers): [B, H, past_len, hd] per layer
    mask: torch.Tensor  # [B, 1, N, capacity] float; columns < past_len: 0 real token / dtype-min pad or hole
    past_len: int  # cache length (columns), equal for all rows
    pad: int = 1  # attend over a multiple of pad columns (KV_PAD where all layers are GrowingLayers)

    @property
    def valid(self) -> torch.Tensor:
        """``[B, past_len]`` bool: which cache columns hold a real token of the row."""
        return self.mask[:, 0, 0, :self.past_len] == 0

    def reserve(self, n: int) -> None:
        b, _, rows, capacity = self.mask.shape
        if padded(self.past_len + n, self.pad) <= capacity:
            return
        # grow the preallocated mask (rows accepting unevenly)
        neg = torch.finfo(self.mask.dtype).min
        grown = torch.full((b, 1, rows, 2 * padded(self.past_len + n)), neg, dtype=self.mask.dtype,
                           device=self.mask.device)
        grown[..., :self.past_len] = self.mask[..., :self.past_len]
        self.mask = grown

    def write_tree(self, float_mask: torch.Tensor) -> tuple[torch.Tensor, Any]:
        n = float_mask.shape[-1]  # <= the buffer's rows (a trimmed lookup chain verifies fewer nodes)
        end, cols = self.past_len + n, padded(self.past_len + n, self.pad)
        self.mask[:, 0, :n, self.past_len:end] = float_mask  # [N, N] or [B, N, N]
        self.mask[:, 0, :n, end:cols] = torch.finfo(self.mask.dtype).min  # padding (stale tree columns)
        return self.mask[:, :, :n, :cols], self.hf  # [B, 1, N, cols]

    def compact(self, path: torch.Tensor, keep: torch.Tensor, result: Any) -> None:
        b = path.shape[0]
        past_len, a = self.past_len, result.max_kept
        if not torch.equal(result.path[:, :a], torch.arange(a).expand(b, a)):  # else the kept are in place
            compact_cache(self.hf, past_len, path[:, :a])
        else:
            compact_cache(self.hf, past_len, None, a)
        valid = torch.arange(a, device=self.mask.device).view(1, a) < keep.view(b, 1)  # [B, A]
        neg = torch.finfo(self.mask.dtype).min
        cols = torch.where(valid, 0.0, neg).to(self.mask.dtype)  # [B, A]
        self.mask[:, 0, :, past_len:past_len + a] = cols.unsqueeze(1)
        self.past_len = past_len + a


def dynamic_prefill(model: Any, input_ids: torch.Tensor, mask2d: torch.Tensor, num_nodes: int, capacity: int,
                    dtype: torch.dtype) -> tuple[DynamicKV, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the left-padded prompt ``[B, P]`` into a fresh ``DynamicCache`` as HF generate does; returns the
    cache (a ``dtype`` mask buffer of at least ``capacity`` columns), the last position's logits ``[B, V]``,
    the base features at every prompt position ``[B, P, F]`` and at the last one ``[B, F]``. Where the model
    runs its prompt in pieces (``model.prefill_chunk()``: the native bfloat16 body) and the prompt is one
    unpadded row, the first :data:`FIRST_PIECE` tokens go through one forward and the rest in pieces of
    ``model.prefill_chunk()`` tokens (:func:`pieces_prefill`)."""
    b, p = input_ids.shape
    hf = new_cache()
    chunk = model.prefill_chunk() if hasattr(model, "prefill_chunk") else 0
    first = p if not chunk or b != 1 or p <= FIRST_PIECE or not bool(mask2d.all()) else FIRST_PIECE
    last_position = torch.tensor([first - 1], device=input_ids.device)
    out = model(input_ids=input_ids[:, :first], attention_mask=mask2d[:, :first],
                position_ids=prompt_position_ids(mask2d[:, :first]), past_key_values=hf, use_cache=True,
                positions=last_position, compute_heads=False)
    pad = KV_PAD if all(isinstance(layer, GrowingLayer) for layer in hf.layers) else 1
    for layer in hf.layers:
        layer.pad = pad  # every later forward is a tree step with a mask of padded(..., pad) columns
    last, features = out.logits[:, -1], out.hidden_states  # [B, V], [B, first, F]
    if first < p:
        last, features = pieces_prefill(model, input_ids, hf, first, chunk, features, dtype)
    mask = tree_mask_buffer(mask2d, num_nodes, max(capacity, padded(p + 2 * num_nodes, pad)), dtype)
    return DynamicKV(hf, mask, p, pad), last, features, features[:, -1]


def pieces_prefill(model: Any, input_ids: torch.Tensor, hf: Any, start: int, chunk: int,
                   features: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The rest of a one-row prompt ``[1, P]`` from ``start`` in pieces of at most ``chunk`` tokens, each a
    forward under a causal 4-D ``dtype`` mask over the cache ``hf`` (which holds the first ``start``), as
    the native body runs a chain of that many nodes; returns the last position's logits ``[1, V]`` and the
    features of every position ``[1, P, F]`` (``features``: the first ``start``'s)."""
    p, device = input_ids.shape[1], input_ids.device
    neg = torch.finfo(dtype).min
    parts, last = [features], None
    for s in range(start, p, chunk):
        t = min(chunk, p - s)
        cols = torch.arange(padded(s + t), device=device)  # [S]
        rows = torch.arange(s, s + t, device=device)  # [t]: each sees the columns up to its own
        mask = torch.where(cols.view(1, -1) <= rows.view(-1, 1), 0.0, neg).to(dtype)[None, None]  # [1,1,t,S]
        out = model(input_ids=input_ids[:, s:s + t], attention_mask=mask, position_ids=rows.view(1, t),
                    past_key_values=hf, use_cache=True, positions=torch.tensor([t - 1], device=device),
                    compute_heads=False)
        parts.append(out.hidden_states)  # [1, t, F]
        last = out.logits[:, -1]  # [1, V]
    return last, torch.cat(parts, dim=1)
