"""One decode step, written once: propose -> verify -> accept -> compact.

```
state (root [B], hidden [B, d], n_valid [B], cache)
  -> proposer.propose(root, hidden)            Proposal(tokens [B, N], tree: mask, depths, parents)
  -> verify: cache.write_tree(mask); forward over the N nodes at n_valid + depths -> logits [B, N, V]
     (propose + verify: one function, one compiled graph)
  -> accept(logits, tokens, tree)              path [B, D+1], n_acc [B], next root [B]
  -> proposer.observe(kept tokens, keep, next root)   (a lookup drafter appends them to its context)
  -> one host copy (StepResult) ; cache.compact(path, keep) ; state advances
```
The step does not know which proposer (:mod:`medusa.decoding.proposals`) or which cache
(:class:`medusa.decoding.kv_cache.DynamicKV`, :class:`medusa.decoding.static_cache.StaticKV`) it has.
Compiled decoding runs this same function with :class:`StepFns` whose device functions are wrapped by
``torch.compile`` (:mod:`medusa.decoding.compiled`); eager decoding with the plain ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from medusa.decoding.kv_cache import TreeCache
from medusa.decoding.proposals import Proposal, Proposer

# accept(logits [B, N, V], tokens [B, N], tree) -> (path [B, D+1], n_accepted [B], next_root [B])
Accept = Callable[[torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass
class DecodeState:
    """What one row-batch carries between steps (all on the model's device)."""

    proposer: Proposer
    cache: TreeCache
    n_valid: torch.Tensor  # [B] real tokens in each row's cache = the next position id
    root: torch.Tensor  # [B] the next tree's root token (already chosen, not yet in the cache)
    hidden: torch.Tensor  # [B, d] base hidden state at the last cached position (the proposer's input)
    compile_time_s: float = 0.0  # warm-up (compilation) time, reported apart from decode time
    warm: bool = False  # the compiled functions have run on this state's shapes


@dataclass
class StepResult:
    """One step's outcome on the host: the step's one device-to-host copy."""

    tokens: torch.Tensor  # [B, D+1] the kept path's tokens, root first (entries past ``kept`` are not kept)
    kept: torch.Tensor  # [B] kept tree nodes per row (root + accepted)
    next_root: torch.Tensor  # [B] the token after the last kept node (the next step's root)
    path: torch.Tensor  # [B, D+1] node indices of the kept path

    @property
    def max_kept(self) -> int:
        """The largest keep over the rows: how far the cache advances."""
        return int(self.kept.max())

    def new_tokens(self, row: int) -> list[int]:
        """``row``'s tokens gained this step: the accepted nodes after the root, then the next root."""
        k = int(self.kept[row])
        return self.tokens[row, 1:k].tolist() + [int(self.next_root[row])]


def verify(model: Any, cache: TreeCache, tokens: torch.Tensor, positions: torch.Tensor,
           float_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward over the tree ``tokens [B, N]`` at ``positions [B, N]``, attending to the cache and, inside
    the tree, to each node's ancestors (``float_mask [N, N]`` or ``[B, N, N]``). Returns logits ``[B, N, V]``
    and hidden states ``[B, N, d]``; the tree's keys / values are appended to the cache."""
    mask, kv = cache.write_tree(float_mask)
    out = model(input_ids=tokens, attention_mask=mask, position_ids=positions, past_key_values=kv,
                use_cache=True, compute_heads=False)
    return out.logits, out.hidden_states


def propose_verify(model: Any, proposer: Proposer, cache: TreeCache, root: torch.Tensor, hidden: torch.Tensor,
                   n_valid: torch.Tensor) -> tuple[Proposal, torch.Tensor, torch.Tensor]:
    """Propose from ``root [B]`` / ``hidden [B, d]`` and verify the proposal at positions ``n_valid [B]`` +
    node depths: (proposal, logits ``[B, N, V]``, hidden states ``[B, N, d]``). One function, so compiled
    decoding compiles drafting and verification into one graph."""
    proposal = proposer.propose(root, hidden)
    tokens, tree = proposal.tokens, proposal.tree
    positions = n_valid.view(tokens.shape[0], 1) + tree.depths  # [B, N] (depths [N] or [B, N])
    logits, hidden_states = verify(model, cache, tokens, positions, tree.float_mask)
    return proposal, logits, hidden_states


@dataclass
class StepFns:
    """The step's device functions: the plain ones, or their ``torch.compile`` wrappers (same signatures).
    ``accept``: replaces the run's acceptance (compiled greedy acceptance without logits processors)."""

    propose_verify: Callable[..., tuple[Proposal, torch.Tensor, torch.Tensor]] = propose_verify
    accept: Accept | None = None
    compiled: bool = False


def last_hidden(hidden: torch.Tensor, path: torch.Tensor, n_acc: torch.Tensor) -> torch.Tensor:
    """The hidden state ``[B, d]`` at each row's last kept node (``hidden [B, N, d]``, ``path [B, D+1]``)."""
    b = path.shape[0]
    last = path.gather(1, n_acc.view(b, 1))  # [B, 1]
    return hidden.gather(1, last.view(b, 1, 1).expand(-1, -1, hidden.shape[-1]))[:, 0]  # [B, d]


def step(model: Any, state: DecodeState, accept: Accept, fns: StepFns | None = None) -> StepResult:
    """Propose, verify (one forward over the tree), accept, compact; advances ``state`` in place and returns
    the step's :class:`StepResult` (its one device sync)."""
    fns = fns or StepFns()
    state.cache.reserve(state.proposer.shape.num_nodes)
    if fns.compiled and not state.warm:
        warm_up(model, state, fns, accept)
    graphs = fns.compiled and state.root.device.type == "cuda"
    if graphs:  # CUDA graphs: outputs of the previous replay may be overwritten from here on
        torch.compiler.cudagraph_mark_step_begin()
    proposal, logits, hidden = fns.propose_verify(model, state.proposer, state.cache, state.root,
                                                  state.hidden, state.n_valid)
    tokens, tree = proposal.tokens, proposal.tree
    b = tokens.shape[0]
    path, n_acc, nxt = (fns.accept or accept)(logits, tokens, tree)  # logits [B, N, V]
    state.hidden = last_hidden(hidden, path, n_acc)  # [B, d]
    keep = n_acc + 1  # [B] kept tree nodes per row (root + accepted)
    width = path.shape[1]
    kept = tokens.gather(1, path)  # [B, D+1]
    state.proposer.observe(kept, keep, nxt)
    both = torch.cat([kept, keep.view(b, 1), nxt.view(b, 1), path], dim=1).cpu()
    result = StepResult(both[:, :width], both[:, width], both[:, width + 1], both[:, width + 2:])
    state.cache.compact(path, keep, result)
    state.n_valid = state.n_valid + keep
    state.root = nxt.clone() if graphs else nxt
    return result


def warm_up(model: Any, state: DecodeState, fns: StepFns, accept: Accept) -> None:
    """Run the compiled functions once on this state's shapes without changing the decode: propose is pure,
    verify idempotent (the real call rewrites the same cache columns), acceptance pure, and compaction runs
    on clones with the KV restored (``cache.dry_compact``). The time counts as compile time."""
    t0 = time.perf_counter()
    proposal, logits, _ = fns.propose_verify(model, state.proposer, state.cache, state.root, state.hidden,
                                             state.n_valid)
    tokens, tree = proposal.tokens, proposal.tree
    b = tokens.shape[0]
    if fns.accept is not None:
        fns.accept(logits, tokens, tree)
    path = torch.arange(tree.depth + 1, device=tokens.device).expand(b, -1).contiguous()  # [B, D+1]
    state.cache.dry_compact(path, torch.ones(b, dtype=torch.long, device=tokens.device))
    if tokens.device.type == "cuda":
        torch.cuda.synchronize(tokens.device)
    state.compile_time_s += time.perf_counter() - t0
    state.warm = True


__all__ = ["Accept", "DecodeState", "StepFns", "StepResult", "last_hidden", "propose_verify", "step",
           "verify", "warm_up"]
