"""The static-shape decode path: transformers' ``StaticCache`` (preallocated ``[B, H, L, hd]`` per layer),
preallocated mask / position buffers, in-place compaction of the accepted path by an index copy inside each
row, and a fixed node count per tree, so every verification step has the same shapes (``torch.compile``
friendly: the cache length ``past`` is a device tensor, never a Python int inside the step).

A step is three functions: :func:`verify` (tree mask columns + one forward over the tree), the acceptance rule
(eager, with the generation_config's processors), and :func:`finish` (heads' top-k at the last kept node,
compaction, mask columns of the kept entries, ``past`` advance). :mod:`medusa.decoding.compiled` compiles
``verify`` and ``finish``; :func:`static_step` runs them and does the step's one host sync. Hydra heads and
dynamic trees use the same prefill, ``verify`` and :func:`compact` with their own proposal
(:mod:`medusa.decoding.static_dynamic`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from medusa.decoding.candidates import DecodeTree, propose
from medusa.decoding.kv_cache import prompt_position_ids, tree_mask_buffer
from medusa.errors import MedusaError
from medusa.modeling.base import text_config, unwrap

MIN_BUCKET = 64


def cache_bucket(length: int) -> int:
    """The cache length for ``length`` needed columns: the next power of two (at least :data:`MIN_BUCKET`), so
    prompts of similar length share one compiled step."""
    return max(MIN_BUCKET, 1 << (max(length, 1) - 1).bit_length())


def static_capacity(prompt_len: int, max_new_tokens: int, batch: int, dt: DecodeTree) -> int:
    """Cache columns a run can need: the prompt, the tree, and the kept entries of every step. One row
    advances by its own gain (<= max_new + D); rows of a batch advance by the step's largest gain (holes)."""
    kept = max_new_tokens + dt.depth + 1 if batch == 1 else (dt.depth + 1) * max_new_tokens
    return cache_bucket(prompt_len + kept + dt.num_nodes)


def new_static_cache(model: Any, max_len: int) -> Any:
    """A ``StaticCache`` of ``max_len`` columns whose layers are all full-attention ``StaticLayer``s."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    cache = StaticCache(config=unwrap(model.base_model).config, max_cache_len=max_len)
    if any(type(layer) is not StaticLayer for layer in cache.layers):
        raise MedusaError(f"{text_config(model.base_model).model_type}: the static cache path needs "
                          "full-attention layers only (sliding-window layers found); use the default cache")
    return cache


@dataclass
class StaticState:
    """What one row-batch carries between static steps (all on the model's device, fixed shapes)."""

    dt: DecodeTree
    cache: Any  # StaticCache: [B, H, L, hd] per layer; columns < past hold the rows' tokens and holes
    mask: torch.Tensor  # [B, 1, N, L] float: 0 real token / dtype-min pad, hole or unused column
    past: torch.Tensor  # [] long: used cache columns, equal for all rows (advance: the step's largest gain)
    n_valid: torch.Tensor  # [B] real tokens in each row's cache = the next position id
    root: torch.Tensor  # [B] the next tree's root token
    head_topk: torch.Tensor | None  # [K, B, kmax] heads' top-k tokens at the last cached position (MEDUSA)
    arange_n: torch.Tensor  # [N] long, preallocated
    past_host: int = 0  # ``past`` on the host (advanced from the step's host copy: no extra sync)
    compile_time_s: float = 0.0  # warm-up (compilation) time, reported apart from decode time
    warm: set = field(default_factory=set)  # step functions already warmed for this state's shapes
    proposal: tuple | None = None  # Hydra heads / dynamic tree: the next step's (tokens [B, N], tree)

    @property
    def valid(self) -> torch.Tensor:
        """``[B, past]`` bool: which cache columns hold a real token of the row."""
        return self.mask[:, 0, 0, :self.past_host] == 0


def static_prefill(model: Any, input_ids: torch.Tensor, mask2d: torch.Tensor, dt: DecodeTree,
                   choose_root: Callable[[torch.Tensor], torch.Tensor] | None = None,
                   capacity: int | None = None) -> StaticState:
    """Run the left-padded prompt ``[B, P]`` into a fresh ``StaticCache`` of ``capacity`` columns (eager: the
    prompt length varies); choose the root and the heads' top-k at the last position as the eager prefill."""
    state, out = prompt_state(model, input_ids, mask2d, dt, choose_root, capacity, compute_heads=True)
    state.head_topk = out.head_logits[:, :, -1].topk(dt.kmax, dim=-1).indices  # [K, B, kmax]
    return state


def prompt_state(model: Any, input_ids: torch.Tensor, mask2d: torch.Tensor, dt: Any,
                 choose_root: Callable[[torch.Tensor], torch.Tensor] | None, capacity: int | None,
                 compute_heads: bool) -> tuple[StaticState, Any]:
    """The prompt's forward into a fresh ``StaticCache`` and the state after it (no proposal yet: head_topk
    None); also returns the model's output (last logits, hidden states, head logits if computed)."""
    b, p = input_ids.shape
    device, dtype = input_ids.device, dt.dtype
    max_len = capacity or cache_bucket(p + 2 * dt.num_nodes)
    cache = new_static_cache(model, max_len)
    neg = torch.finfo(dtype).min
    causal = torch.ones(p, max_len, dtype=torch.bool, device=device).tril()  # [P, L]: key j <= query i
    real = torch.nn.functional.pad(mask2d.bool(), (0, max_len - p))  # [B, L]: the prompt's real tokens
    keep = causal.view(1, 1, p, max_len) & real.view(b, 1, 1, max_len)
    prompt_mask = torch.where(keep, 0.0, neg).to(dtype)  # [B, 1, P, L]
    out = model(input_ids=input_ids, attention_mask=prompt_mask, position_ids=prompt_position_ids(mask2d),
                past_key_values=cache, use_cache=True, positions=torch.tensor([p - 1], device=device),
                compute_heads=compute_heads)
    last = out.logits[:, -1]  # [B, V]
    root = last.argmax(dim=-1) if choose_root is None else choose_root(last)
    mask = tree_mask_buffer(mask2d, dt.num_nodes, max_len, dtype)  # [B, 1, N, L]
    past = torch.tensor(p, dtype=torch.long, device=device)
    arange_n = torch.arange(dt.num_nodes, device=device)
    for t in (mask, past):  # mutated inside the compiled step: fixed addresses (CUDA graphs need them)
        torch._dynamo.mark_static_address(t)
    return StaticState(dt, cache, mask, past, mask2d.sum(-1), root, None, arange_n, p), out


def verify(model: Any, cache: Any, mask: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
           cols: torch.Tensor, float_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Write the tree's mask columns ``cols [N]`` (= past + arange(N)) and run the tree ``tokens [B, N]`` at
    ``positions [B, N]`` into the cache there; ``float_mask``: the tree's ``[N, N]`` or per-row ``[B, N, N]``.
    Returns logits ``[B, N, V]`` and hidden states ``[B, N, d]``."""
    b, n = tokens.shape
    tree_cols = float_mask.expand(b, n, n).unsqueeze(1)  # [B, 1, N, N]: one tree ([N, N]) or one per row
    mask.index_copy_(3, cols, tree_cols)  # mask: [B, 1, N, L]
    for layer in cache.layers:
        layer.cumulative_length.copy_(cols[0])  # StaticLayer writes the new entries at cumulative_length
    out = model(input_ids=tokens, attention_mask=mask, position_ids=positions, past_key_values=cache,
                use_cache=True, compute_heads=False)
    return out.logits, out.hidden_states


def finish(model: Any, cache: Any, mask: torch.Tensor, past: torch.Tensor, path: torch.Tensor,
           n_acc: torch.Tensor, hidden: torch.Tensor, cols: torch.Tensor, arange_n: torch.Tensor, kmax: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """After acceptance (``path [B, D+1]`` node indices, ``n_acc [B]``): the heads' top-k at the last kept
    node, then :func:`compact`. Returns (head_topk ``[K, B, kmax]``, keep ``[B]``)."""
    picked = last_hidden(hidden, path, n_acc)  # [B, d]
    head_topk = stacked_heads(model.heads, picked.unsqueeze(1))[:, :, 0].topk(kmax, dim=-1).indices
    return head_topk, compact(cache, mask, past, path, n_acc, cols, arange_n)


def last_hidden(hidden: torch.Tensor, path: torch.Tensor, n_acc: torch.Tensor) -> torch.Tensor:
    """The hidden state ``[B, d]`` at each row's last kept node (``hidden [B, N, d]``, ``path [B, D+1]``)."""
    b = path.shape[0]
    last = path.gather(1, n_acc.view(b, 1))  # [B, 1]
    return hidden.gather(1, last.view(b, 1, 1).expand(-1, -1, hidden.shape[-1]))[:, 0]  # [B, d]


def compact(cache: Any, mask: torch.Tensor, past: torch.Tensor, path: torch.Tensor, n_acc: torch.Tensor,
            cols: torch.Tensor, arange_n: torch.Tensor) -> torch.Tensor:
    """The kept entries moved to columns ``past .. past+D`` of each row (fixed D+1 wide; entries past the
    row's keep are masked), their mask columns set, ``past`` advanced by the largest keep. Returns keep
    ``[B]`` (kept nodes per row, root included)."""
    b, width = path.shape
    n = cols.shape[0]
    neg = torch.finfo(mask.dtype).min
    src = path + cols[0]  # [B, D+1] cache columns of the kept nodes
    dst = cols[:width]  # [D+1]
    for layer in cache.layers:
        for t in (layer.keys, layer.values):  # [B, H, L, hd]
            idx = src.view(b, 1, width, 1).expand(-1, t.shape[1], -1, t.shape[3])
            t.index_copy_(2, dst, torch.gather(t, 2, idx))
    keep = n_acc + 1  # [B]
    valid = arange_n.view(1, n) < keep.view(b, 1)  # [B, N]: the first keep columns are real tokens
    cols_mask = torch.where(valid, 0.0, neg).to(mask.dtype)  # [B, N]
    mask.index_copy_(3, cols, cols_mask.view(b, 1, 1, n).expand(b, 1, n, n))
    past.add_(keep.max())
    return keep


def stacked_heads(heads: Any, hidden: torch.Tensor) -> torch.Tensor:
    """MEDUSA heads ``[B, T, d] -> [K, B, T, V]`` target logits; traced per head when compiling (the batched
    path's weight cache checks data pointers, a graph break; inductor fuses the per-head ops itself)."""
    if torch.compiler.is_compiling():
        draft = torch.stack([heads.head_logits(k, hidden) for k in range(heads.num_heads)], dim=0)
        return heads.to_target_logits(draft)  # -inf outside a draft vocabulary (identity when full)
    return heads(hidden)


@dataclass
class StepFns:
    """The step's device functions: eager or compiled (same signatures)."""

    verify: Callable[..., tuple[torch.Tensor, torch.Tensor]] = verify
    finish: Callable[..., tuple[torch.Tensor, torch.Tensor]] = finish
    compiled: bool = False
    accept: Callable[..., Any] | None = None  # replaces the run's acceptance (compiled greedy, no processors)


def _warm_up(model: Any, state: StaticState, fns: StepFns, tokens: torch.Tensor, pos: torch.Tensor,
             cols: torch.Tensor) -> None:
    """Compile both functions on this state's shapes without changing the decode: verify is idempotent (it
    rewrites the same columns again in the real call); finish runs on clones, with the identity path."""
    t0 = time.perf_counter()
    dt = state.dt
    logits, hidden = fns.verify(model, state.cache, state.mask, tokens, pos, cols, dt.float_mask)
    if fns.accept is not None:
        fns.accept(logits, tokens)
    finish_dry_run(state, tokens, t0, lambda path, zero: fns.finish(
        model, state.cache, state.mask.clone(), state.past.clone(), path, zero, hidden, cols, state.arange_n,
        dt.kmax))


def finish_dry_run(state: StaticState, tokens: torch.Tensor, t0: float,
                   finish: Callable[[torch.Tensor, torch.Tensor], Any]) -> None:
    """The warm-up's ``finish(path, kept)`` with the identity path ``[B, D+1]`` and nothing kept, run on
    clones of the mask / ``past`` (the caller's closure) with the KV cache restored afterwards; the time since
    ``t0`` counts as compile time."""
    b = tokens.shape[0]
    path = torch.arange(state.dt.depth + 1, device=tokens.device).expand(b, -1).contiguous()  # [B, D+1]
    saved = [(layer.keys.clone(), layer.values.clone()) for layer in state.cache.layers]
    finish(path, torch.zeros(b, dtype=torch.long, device=tokens.device))
    for layer, (k, v) in zip(state.cache.layers, saved):
        layer.keys.copy_(k)
        layer.values.copy_(v)
    if tokens.device.type == "cuda":
        torch.cuda.synchronize(tokens.device)
    state.compile_time_s += time.perf_counter() - t0


def static_step(model: Any, state: StaticState, accept: Any, fns: StepFns) -> torch.Tensor:
    """One verification step on the static cache; returns on the host ``[B, D+3]`` as ``decode_step`` does
    (kept path tokens, kept node count, next root). This is the step's one device sync."""
    dt = state.dt
    b, n = state.root.shape[0], dt.num_nodes
    if state.past_host + n > state.mask.shape[-1]:
        raise MedusaError(f"static cache full ({state.mask.shape[-1]} columns); raise its capacity")
    tokens = propose(state.root, state.head_topk, dt)  # [B, N]
    pos = state.n_valid.view(b, 1) + dt.depths.view(1, n)  # [B, N] position ids
    cols = state.arange_n + state.past  # [N] cache columns of the tree
    if fns.compiled and "step" not in state.warm:
        _warm_up(model, state, fns, tokens, pos, cols)
        state.warm.add("step")
    graphs = fns.compiled and tokens.device.type == "cuda"
    if graphs:  # CUDA graphs: outputs of the previous replay may be overwritten from here on
        torch.compiler.cudagraph_mark_step_begin()
    logits, hidden = fns.verify(model, state.cache, state.mask, tokens, pos, cols, dt.float_mask)
    path, n_acc, nxt = (fns.accept or accept)(logits, tokens)  # logits [B, N, V]
    head_topk, keep = fns.finish(model, state.cache, state.mask, state.past, path, n_acc, hidden, cols,
                                 state.arange_n, dt.kmax)
    state.head_topk = head_topk.clone() if graphs else head_topk
    host = torch.cat([tokens.gather(1, path), keep.view(b, 1), nxt.view(b, 1)], dim=1).cpu()  # [B, D+3]
    state.past_host += int(host[:, -2].max())
    state.n_valid = state.n_valid + keep
    state.root = nxt
    return host


__all__ = ["StaticState", "StepFns", "cache_bucket", "compact", "finish", "finish_dry_run", "last_hidden",
           "new_static_cache", "prompt_state", "stacked_heads", "static_capacity", "static_prefill",
           "static_step", "verify"]
