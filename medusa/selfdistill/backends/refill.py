"""Batched generation that refills finished rows: no batch waits on its longest reply.

``generate_refill`` keeps ``batch_size`` slots busy. Each slot holds one reply in progress; a slot whose reply
ends (EOS or ``max_new_tokens``) is handed the next prompt, prefilled on its own and written into the shared
KV buffers beside the rows still running. The KV cache is preallocated (:class:`SlotCache`): a step writes one
column for every slot, so nothing is concatenated per step (``DynamicCache``'s ``torch.cat`` was 75% of a
batch-64 bf16 step on CPU). Each row keeps its own positions and a 4-D float mask hides the columns that
are not its own, so every reply equals the one a lone ``generate`` call would give (greedy; tested).

Supported: decoder-only models whose attention takes a 4-D mask and calls ``cache.update(k, v, layer)``
(Llama, Mistral without a window, Qwen2/3, Gemma, Phi-3, GPT-NeoX...), and a generation config with no
logits processors beyond temperature / top-k / top-p (:func:`refill_supported` says which, from decoding's
one list of settings, :func:`medusa.decoding.processors.sampling_only_blocker`). Sampling uses decoding's
warpers (:func:`medusa.decoding.processors.warp_logits`).

Why :class:`SlotCache` is not one of decoding's KV caches (:mod:`medusa.decoding.kv_cache`): their needs do
not meet. Here every slot is admitted at its own time (a prompt prefilled alone, then copied into a running
batch), columns are shifted left as replies end and the batch shrinks; one column per step, no tree. Decoding
prefills one batch once and compacts a verified tree's accepted path inside each row every step, on
transformers' own ``DynamicCache`` / ``StaticCache`` (whose layer objects the static path drives). A shared
class would carry both sets of operations with neither user needing the other's.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from medusa.decoding.acceptance import draw
from medusa.decoding.hf import cache_kwargs
from medusa.decoding.kv_cache import FIRST_PIECE
from medusa.decoding.processors import Warp, sampling_only_blocker, warp_logits
from medusa.modeling import native_body
from medusa.modeling.base import base_logits, decoder_of, text_config

COMPACT_EVERY = 64  # shift the buffers left once every slot's first column is at least this far in
LENGTH_SPREAD = 1.25  # prompts prefilled together: the longest at most this times the shortest


def refill_supported(model: torch.nn.Module) -> str | None:
    """``None`` when :func:`generate_refill` reproduces ``model.generate`` for this model, else the reason."""
    cfg = model.config
    if getattr(cfg, "is_encoder_decoder", False):
        return "encoder-decoder model"
    text = getattr(cfg, "get_text_config", lambda: cfg)()
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True) is not False:
        return f"sliding-window attention ({text.sliding_window})"
    impl = str(getattr(text, "_attn_implementation", "") or "")
    if "flash" in impl or "paged" in impl or "flex" in impl:
        return f"attn_implementation={impl}"
    return sampling_only_blocker(model)


class SlotCache:
    """KV buffers shared by ``batch`` slots: per layer ``[B, H_kv, capacity, head_dim]``, written at column
    ``col`` by every forward: the attention-facing cache interface
    (:class:`medusa.decoding.hf.AttentionCache`: ``update``, ``get_seq_length``) over a preallocated buffer
    that slots join and leave."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.col = 0  # columns [0, col) hold keys / values; the next forward writes from col
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key / value [B, H, q, hd]`` at columns ``[col, col+q)``; return columns ``[0, col+q)``.
        Further arguments (``cache_kwargs`` before transformers 5.2x, ``kwargs=`` after) are not needed."""
        q = key.shape[2]
        if layer_idx == len(self.keys):  # first forward: allocate
            b, h, _, hd = key.shape
            self.keys.append(key.new_zeros(b, h, self.capacity, hd))
            self.values.append(value.new_zeros(b, h, self.capacity, value.shape[3]))
        end = self.col + q
        self.keys[layer_idx][:, :, self.col:end] = key
        self.values[layer_idx][:, :, self.col:end] = value
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.col

    def shift(self, delta: int) -> None:
        """Move columns ``[0, col)`` by ``delta`` (left when negative); ``col`` follows."""
        lo, hi = (0, self.col) if delta >= 0 else (-delta, self.col)
        for buf in (*self.keys, *self.values):
            buf[:, :, lo + delta:hi + delta] = buf[:, :, lo:hi].clone()
        self.col += delta

    def write_rows(self, rows: torch.Tensor, other: SlotCache, width: int) -> None:
        """Copy ``other``'s first ``width`` columns into slots ``rows`` at columns ``[col - width, col)``."""
        for mine, theirs in zip((*self.keys, *self.values), (*other.keys, *other.values)):
            mine[rows, :, self.col - width:self.col] = theirs[:, :, :width]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only slots ``rows`` (the batch shrinks)."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]


@dataclass
class Row:
    index: int  # into the caller's prompts
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)


def pick_tokens(logits: torch.Tensor, warp: Warp | None, generator: torch.Generator | None) -> torch.Tensor:
    """``logits [B, V]`` -> next tokens ``[B]``: argmax without a ``warp`` (greedy), else a sample after it
    (HF's temperature, top-k and top-p warpers: :func:`medusa.decoding.processors.warp_logits`)."""
    if warp is None:
        return logits.float().argmax(-1)  # bf16 argmax is ~10x slower on CPU
    return draw(warp(logits).softmax(-1), generator).squeeze(-1)


class RefillLoop:
    """The state of one :func:`generate_refill` call: slots, their masks and positions, the queue."""

    def __init__(self, model: torch.nn.Module, prompts: Sequence[list[int]], max_new_tokens: int,
                 batch_size: int, pad_id: int, eos_ids: Sequence[int]) -> None:
        self.model, self.max_new, self.pad, self.eos = model, max_new_tokens, pad_id, set(eos_ids)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        body, config = decoder_of(model), text_config(model)
        # the body through the native bf16 kernels where it runs there (medusa.modeling.native_body): the
        # one-token steps (at most MAX_ROWS slots, over the shared buffers) and the prompts past their first
        # FIRST_PIECE columns (pieces)
        self.native = (body, config) if native_body.unsupported_reason(body, config) == "" else None
        self.queue = deque(Row(i, list(p)) for i, p in enumerate(prompts))
        longest = max((len(p) for p in prompts), default=1)
        # a slot spans at most longest + max_new_tokens - 1 columns before a step (its prompt, then one per
        # step); compact() shifts the oldest slot's first column to 0 once it is COMPACT_EVERY in (or the
        # buffer is full), so this many columns always hold every live slot and the next one
        self.cache = SlotCache(longest + max_new_tokens + COMPACT_EVERY)
        n = min(batch_size, len(prompts))
        self.slots: list[Row | None] = [None] * n
        self.valid = torch.zeros(n, self.cache.capacity, dtype=torch.bool, device=self.device)  # [B, cap]
        self.next_pos = torch.zeros(n, dtype=torch.long, device=self.device)  # [B]
        self.last = torch.full((n,), pad_id, dtype=torch.long, device=self.device)  # [B] token to feed next

    def forward(self, ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor,
                cache: SlotCache, logits: bool = True) -> torch.Tensor | None:
        """``ids [B, q]`` at ``positions [B, q]``, seeing the columns ``valid [B, col + q]`` marks (causally
        among the q new ones) -> logits ``[B, V]`` of the last position (None without ``logits``: a piece of
        a prompt that is not its last)."""
        q = ids.shape[1]
        allowed = valid.unsqueeze(1).expand(-1, q, -1).clone()  # [B, q, col + q]
        allowed[:, :, cache.col:] &= torch.ones(q, q, dtype=torch.bool, device=self.device).tril()
        neg = torch.finfo(self.dtype).min
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device).masked_fill_(~allowed, neg)
        mask = mask.unsqueeze(1)  # [B, 1, q, col + q]
        native = None if self.native is None else native_body.native_for(self.model, *self.native, ids, mask,
                                                                          cache)
        if native is not None:  # a step, or a piece of the prompts, through the kernels
            last, _ = native_body.forward(native, ids, mask, positions, cache)  # [B, q, d]
            out = base_logits(self.model, last[:, -1]) if logits else None  # [B, V]
        else:
            with grouped_sdpa(q > 1):
                out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                 use_cache=True, logits_to_keep=1, **cache_kwargs(cache)).logits[:, -1]
        cache.col += q
        return out  # [B, V]

    def admit(self, targets: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill the next ``len(targets)`` prompts on their own, then write them into slots ``targets``
        ending at the current column. Returns ``(slots [n], logits of their first reply token [n, V])``.
        Prompts of like length are prefilled together (:func:`length_groups`): a left-padded batch computes
        its padding too, 25-49% of the products when 4-32 prompts of a part go in one batch."""
        rows = [self.queue.popleft() for _ in targets]
        width = max(len(r.prompt) for r in rows)
        if self.cache.col < width:
            self.shift_all(width - self.cache.col)
        groups = length_groups([len(r.prompt) for r in rows])
        prefilled = torch.cat([self._prefill([rows[j] for j in g], [targets[j] for j in g])
                               for g in groups])  # [n, V] in group order
        logits = torch.empty_like(prefilled)
        logits[[j for g in groups for j in g]] = prefilled  # back in the order of ``targets``
        for t, r in zip(targets, rows):
            self.slots[t] = r
        return torch.tensor(targets, device=self.device), logits  # [n], [n, V]

    def _prefill(self, rows: list[Row], targets: list[int]) -> torch.Tensor:
        """``rows``' prompts, left-padded to the longest, in one forward; their keys / values written into
        slots ``targets`` ending at the current column (which leaves room for them). Returns their logits
        ``[n, V]``."""
        width = max(len(r.prompt) for r in rows)
        ids = torch.full((len(rows), width), self.pad, dtype=torch.long)  # [n, W] left-padded
        own = torch.zeros(len(rows), width, dtype=torch.bool)  # [n, W]
        for j, r in enumerate(rows):
            ids[j, width - len(r.prompt):] = torch.tensor(r.prompt)
            own[j, width - len(r.prompt):] = True
        ids, own = ids.to(self.device), own.to(self.device)
        positions = (own.long().cumsum(-1) - 1).clamp_min(0)  # [n, W]
        fresh = SlotCache(width)
        for start, end in self.pieces(len(rows), width):
            logits = self.forward(ids[:, start:end], own[:, :end], positions[:, start:end], fresh,
                                  logits=end == width)
        if not self.cache.keys:  # first admission: allocate the shared buffers like the fresh ones
            b, cap = len(self.slots), self.cache.capacity
            self.cache.keys = [k.new_zeros(b, k.shape[1], cap, k.shape[3]) for k in fresh.keys]
            self.cache.values = [v.new_zeros(b, v.shape[1], cap, v.shape[3]) for v in fresh.values]
        index = torch.tensor(targets, device=self.device)
        col = self.cache.col
        self.cache.write_rows(index, fresh, width)
        self.valid[index] = False
        self.valid[index, col - width:col] = own
        self.next_pos[index] = positions[:, -1] + 1
        return logits

    def pieces(self, rows: int, width: int) -> list[tuple[int, int]]:
        """The column ranges a prefill of ``rows`` prompts ``width`` wide runs in: where the body runs
        natively, the first :data:`FIRST_PIECE` columns through the model (they start the cache), then
        pieces of at most ``MAX_ROWS`` tokens through the kernels (1.3x the model's own bf16 prefill for one
        400-token prompt); else all at once."""
        step = native_body.MAX_ROWS // rows if self.native is not None else 0
        if step < 1 or width <= FIRST_PIECE:
            return [(0, width)]
        return [(0, FIRST_PIECE), *((s, min(s + step, width)) for s in range(FIRST_PIECE, width, step))]

    def take(self, index: torch.Tensor, tokens: torch.Tensor) -> Iterator[tuple[int, list[int], str]]:
        """Append ``tokens [n]`` to slots ``index [n]``; yield ``(prompt index, reply tokens, reason)`` for
        each reply that ends (its slot is freed)."""
        for slot, tok in zip(index.tolist(), tokens.tolist()):
            row = self.slots[slot]
            row.tokens.append(tok)
            if tok in self.eos or len(row.tokens) >= self.max_new:
                self.slots[slot] = None
                self.valid[slot] = False
                yield row.index, row.tokens, "stop" if tok in self.eos else "length"
            else:
                self.last[slot] = tok

    def step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One token for every live slot: ``(slots [n], logits [n, V])``."""
        live = torch.tensor([r is not None for r in self.slots], device=self.device)  # [B]
        col = self.cache.col
        if col + 1 > self.cache.capacity:
            raise RuntimeError(f"refill cache full ({self.cache.capacity} columns)")
        self.valid[:, col] = live
        logits = self.forward(self.last[:, None], self.valid[:, :col + 1], self.next_pos[:, None], self.cache)
        self.next_pos += 1
        index = live.nonzero().squeeze(-1)
        return index, logits.index_select(0, index)

    def shift_all(self, delta: int) -> None:
        """Shift every slot's columns by ``delta`` (the KV buffers and the valid mask)."""
        lo, hi = (0, self.cache.col) if delta >= 0 else (-delta, self.cache.col)
        if self.cache.keys:
            self.cache.shift(delta)
        else:
            self.cache.col += delta
        self.valid[:, lo + delta:hi + delta] = self.valid[:, lo:hi].clone()
        if delta > 0:
            self.valid[:, :delta] = False
        else:
            self.valid[:, hi + delta:] = False

    def compact(self) -> None:
        """Drop the leading columns no live slot uses; once the queue is empty and at most half the slots are
        busy, drop the idle slots (the batch shrinks)."""
        live = [j for j, r in enumerate(self.slots) if r is not None]
        if not live:
            return
        if not self.queue and len(live) <= len(self.slots) // 2:
            keep = torch.tensor(live, device=self.device)
            self.cache.select(keep)
            self.valid, self.next_pos, self.last = self.valid[keep], self.next_pos[keep], self.last[keep]
            self.slots = [self.slots[j] for j in live]
        used = self.valid[:, :self.cache.col].any(0)  # [col]
        first = int(used.nonzero()[0]) if bool(used.any()) else self.cache.col
        if first >= COMPACT_EVERY or (first > 0 and self.cache.col + 1 >= self.cache.capacity):
            self.shift_all(-first)


def length_groups(lengths: Sequence[int], spread: float = LENGTH_SPREAD) -> list[list[int]]:
    """Indices of ``lengths`` in groups of like length (shortest first): a group's longest is at most
    ``spread`` times its shortest, so a group prefilled as one left-padded batch computes at most
    ``1 - 1 / spread`` of padding."""
    groups: list[list[int]] = []
    for j in sorted(range(len(lengths)), key=lambda k: lengths[k]):
        if groups and lengths[j] <= spread * lengths[groups[-1][0]]:
            groups[-1].append(j)
        else:
            groups.append([j])
    return groups


@contextmanager
def grouped_sdpa(force: bool) -> Iterator[None]:
    """``force``: let transformers' SDPA attention read grouped K / V heads in place (``enable_gqa``)
    even with a mask, instead of copying them once per query head (``repeat_kv``; 10% of a batch-64 step
    on CPU when every forward forced it): now for prompts only. Not for one-query steps: transformers then
    folds a K / V head's query heads into one attention of ``group`` queries (``pack_gqa``), which
    PyTorch's CPU kernel runs 4.6x faster than the one query per head ``enable_gqa`` gives it (bf16, 128
    slots, 270 columns, one core: 5.4 against 25 ms a layer; a whole SmolLM2 refill step 284 against 856
    ms)."""
    key = "TRANSFORMERS_SDPA_FORCE_GQA"
    before = os.environ.get(key)
    if force:
        os.environ[key] = "1"
    else:
        os.environ.pop(key, None)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def generate_refill(model: torch.nn.Module, prompts: Sequence[list[int]], *, max_new_tokens: int,
                    batch_size: int, pad_id: int, eos_ids: Sequence[int], temperature: float = 0.0,
                    top_k: int | None = None, top_p: float = 1.0, seed: int = 0,
                    on_step: Callable[[int], None] | None = None) -> Iterator[tuple[int, list[int], str]]:
    """Generate a reply for every prompt (token ids) with ``batch_size`` slots kept busy.

    Yields ``(prompt index, reply tokens (EOS included when it ended), "stop" | "length")`` as replies end,
    in completion order. ``on_step(n)`` is called after each forward with the number of tokens it produced.
    """
    if not prompts:
        return
    loop = RefillLoop(model, prompts, max_new_tokens, batch_size, pad_id, eos_ids)
    generator, warp = None, None
    if temperature > 0:
        generator = torch.Generator(device=loop.device).manual_seed(seed)
        warp = warp_logits(temperature, top_k, top_p, loop.device)

    def pick(logits: torch.Tensor) -> torch.Tensor:
        return pick_tokens(logits, warp, generator)

    with torch.inference_mode():
        index, logits = loop.admit(list(range(len(loop.slots))))
        yield from loop.take(index, pick(logits))
        while any(r is not None for r in loop.slots) or loop.queue:
            free = [j for j, r in enumerate(loop.slots) if r is None]
            if loop.queue and free and (len(free) >= max(1, len(loop.slots) // 8)
                                        or len(free) == len(loop.slots)):
                index, logits = loop.admit(free[:len(loop.queue)])
                yield from loop.take(index, pick(logits))
                continue
            loop.compact()
            index, logits = loop.step()
            if on_step is not None:
                on_step(len(index))
            yield from loop.take(index, pick(logits))
