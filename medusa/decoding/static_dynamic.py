"""The static-shape step for proposals that need the last kept node's hidden state and the next root: Hydra
heads (static tree, grown depth by depth) and dynamic trees (any heads: each row's N best nodes).

The step is the static one (:mod:`medusa.decoding.static_cache`: preallocated ``StaticCache``, mask and
position buffers, in-place compaction per row) with one change: instead of the heads' top-k,
:func:`finish_propose` builds the whole next proposal on the device, ``tokens [B, N]`` and, for a dynamic
tree, its per-row tables (``[B, N, N]`` float mask, ``[B, N]`` depths / parents, ``[B, N, D+1]`` retrieve
and ancestor tables, ``[B, N, kmax]`` children). N is fixed, so every step has the same shapes: compiled
once per (batch, N, cache bucket), never from step to step, and the step's one host sync is unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from medusa.decoding.candidates import DecodeTree
from medusa.decoding.dynamic_tree import DynamicTree, StepTree
from medusa.decoding.hydra_candidates import hydra_levels
from medusa.decoding.proposals import step_candidates
from medusa.decoding.static_cache import (
    StaticState,
    StepFns,
    compact,
    finish_dry_run,
    last_hidden,
    prompt_state,
)
from medusa.errors import MedusaError

# The tensors of a StepTree after num_nodes, depth and kmax, in field order (tokens first).
_TREE_FIELDS = ("tokens", "depths", "parents", "children", "retrieve", "retrieve_valid", "ancestors",
                "float_mask")


def propose_parts(heads: torch.nn.Module, root: torch.Tensor, hidden: torch.Tensor,
                  dt: DecodeTree | DynamicTree) -> tuple[torch.Tensor, ...]:
    """The next proposal as plain tensors (compiled functions return tensors): ``(tokens [B, N],)`` on a
    static tree, else the step tree's tensors in :data:`_TREE_FIELDS` order. ``root [B]``, ``hidden [B, d]``:
    the base hidden state at the last kept position."""
    tokens, tree = step_candidates(heads, root, hidden, dt)
    if isinstance(tree, StepTree):
        return tuple(getattr(tree, name) for name in _TREE_FIELDS)
    return (tokens,)


def as_proposal(parts: tuple[torch.Tensor, ...], dt: DecodeTree | DynamicTree
                ) -> tuple[torch.Tensor, DecodeTree | StepTree]:
    """``(tokens [B, N], tree)`` from :func:`propose_parts`'s tensors."""
    if len(parts) == 1:
        return parts[0], dt
    children = parts[_TREE_FIELDS.index("children")]  # [B, N, kmax]
    return parts[0], StepTree(dt.num_nodes, dt.depth, children.shape[-1], *parts)


def finish_propose(model: Any, cache: Any, mask: torch.Tensor, past: torch.Tensor, path: torch.Tensor,
                   n_acc: torch.Tensor, hidden: torch.Tensor, cols: torch.Tensor, arange_n: torch.Tensor,
                   root: torch.Tensor, dt: DecodeTree | DynamicTree
                   ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """After acceptance (``path [B, D+1]``, ``n_acc [B]``, next root ``root [B]``): the next proposal from the
    hidden state at the last kept node (:func:`propose_parts`), then the kept entries compacted in place
    (:func:`medusa.decoding.static_cache.compact`). Returns (proposal tensors, keep ``[B]``)."""
    parts = propose_parts(model.heads, root, last_hidden(hidden, path, n_acc), dt)
    return parts, compact(cache, mask, past, path, n_acc, cols, arange_n)


def proposal_prefill(model: Any, input_ids: torch.Tensor, mask2d: torch.Tensor, dt: DecodeTree | DynamicTree,
                     choose_root: Callable[[torch.Tensor], torch.Tensor] | None = None,
                     capacity: int | None = None) -> StaticState:
    """The static prefill (:func:`medusa.decoding.static_cache.prompt_state`) and the first proposal, built
    eagerly from the prompt's last hidden state."""
    state, out = prompt_state(model, input_ids, mask2d, dt, choose_root, capacity, compute_heads=False)
    if isinstance(dt, DecodeTree):
        hydra_levels(dt)  # the growth plan is built (host lists) once, outside any compiled function
    parts = propose_parts(model.heads, state.root, out.hidden_states[:, -1], dt)
    state.proposal = as_proposal(parts, dt)
    return state


def _warm_up(model: Any, state: StaticState, fns: StepFns, accept: Any, pos: torch.Tensor,
             cols: torch.Tensor) -> None:
    """Compile the step's functions on this state's shapes without changing the decode (verify is
    idempotent; finish runs on clones of the mask and ``past`` with the identity path, the cache restored)."""
    t0 = time.perf_counter()
    tokens, tree = state.proposal
    logits, hidden = fns.verify(model, state.cache, state.mask, tokens, pos, cols, tree.float_mask)
    if fns.accept is not None:
        fns.accept(logits, tokens, tree)
    finish_dry_run(state, tokens, t0, lambda path, zero: fns.finish(
        model, state.cache, state.mask.clone(), state.past.clone(), path, zero, hidden, cols, state.arange_n,
        state.root, state.dt))


def proposal_step(model: Any, state: StaticState, accept: Any, fns: StepFns) -> torch.Tensor:
    """One verification step on the static cache with a Hydra / dynamic-tree proposal; returns on the host
    ``[B, D+3]`` as ``decode_step`` does (kept path tokens, kept node count, next root): the step's one sync.
    ``accept(logits [B, N, V], tokens [B, N], tree)``; ``fns.finish`` is :func:`finish_propose`."""
    tokens, tree = state.proposal
    b, n = tokens.shape
    if state.past_host + n > state.mask.shape[-1]:
        raise MedusaError(f"static cache full ({state.mask.shape[-1]} columns); raise its capacity")
    pos = state.n_valid.view(b, 1) + tree.depths  # [B, N] position ids (depths [N] or [B, N])
    cols = state.arange_n + state.past  # [N] cache columns of the tree
    if fns.compiled and "step" not in state.warm:
        _warm_up(model, state, fns, accept, pos, cols)
        state.warm.add("step")
    graphs = fns.compiled and tokens.device.type == "cuda"
    if graphs:  # CUDA graphs: outputs of the previous replay may be overwritten from here on
        torch.compiler.cudagraph_mark_step_begin()
    logits, hidden = fns.verify(model, state.cache, state.mask, tokens, pos, cols, tree.float_mask)
    path, n_acc, nxt = (fns.accept or accept)(logits, tokens, tree)  # logits [B, N, V]
    host = torch.cat([tokens.gather(1, path), (n_acc + 1).view(b, 1), nxt.view(b, 1)], dim=1)  # [B, D+3]
    parts, keep = fns.finish(model, state.cache, state.mask, state.past, path, n_acc, hidden, cols,
                             state.arange_n, nxt, state.dt)
    state.proposal = as_proposal(tuple(t.clone() for t in parts) if graphs else parts, state.dt)
    host = host.cpu()
    state.past_host += int(host[:, -2].max())
    state.n_valid = state.n_valid + keep
    state.root = nxt
    return host


__all__ = ["as_proposal", "finish_propose", "propose_parts", "proposal_prefill", "proposal_step"]
