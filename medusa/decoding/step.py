"""One decode step, written once, and the loop that runs it: propose -> verify -> accept -> compact.

```
state (root [B], hidden [B, F], n_valid [B], cache)
  -> proposer.propose(root, hidden)            Proposal(tokens [B, N], tree: mask, depths, parents)
  -> verify: cache.write_tree(mask); forward over the N nodes at n_valid + depths -> logits [B, N, V]
     (propose + verify: one function, one compiled graph)
  -> scorer(logits, tokens, tree, draft_probs) path [B, D+1], n_acc [B], next root [B]
  -> proposer.observe(kept tokens, keep, next root, features at the path [B, D+1, F])
  -> one host copy (StepResult) ; cache.compact(path, keep) ; state advances
```
The step does not know which proposer (:mod:`medusa.decoding.proposals`), which cache
(:class:`medusa.decoding.kv_cache.DynamicKV`, :class:`medusa.decoding.static_cache.StaticKV`) or which
acceptance rule (:class:`medusa.decoding.acceptance.Scorer`, built once per run) it has. Compiled decoding
runs this same function with :class:`StepFns` whose ``propose_verify`` is wrapped by ``torch.compile`` and a
scorer whose greedy rule is (:mod:`medusa.decoding.compiled`); eager decoding with the plain ones.
:func:`decode_loop` runs steps until every row is done and records each row's tokens in the run's
:class:`medusa.decoding.acceptance.Progress`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from medusa.decoding.acceptance import Progress, Scorer
from medusa.decoding.kv_cache import TreeCache
from medusa.decoding.proposals import Proposal, Proposer


@dataclass
class DecodeState:
    """What one row-batch carries between steps (all on the model's device)."""

    proposer: Proposer
    cache: TreeCache
    n_valid: torch.Tensor  # [B] real tokens in each row's cache = the next position id
    root: torch.Tensor  # [B] the next tree's root token (already chosen, not yet in the cache)
    hidden: torch.Tensor  # [B, F] base features at the last cached position (the proposer's input)
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
    and base features ``[B, N, F]``; the tree's keys / values are appended to the cache."""
    mask, kv = cache.write_tree(float_mask)
    out = model(input_ids=tokens, attention_mask=mask, position_ids=positions, past_key_values=kv,
                use_cache=True, compute_heads=False)
    return out.logits, out.hidden_states


def propose_verify(model: Any, proposer: Proposer, cache: TreeCache, root: torch.Tensor, hidden: torch.Tensor,
                   n_valid: torch.Tensor) -> tuple[Proposal, torch.Tensor, torch.Tensor]:
    """Propose from ``root [B]`` / ``hidden [B, F]`` and verify the proposal at positions ``n_valid [B]`` +
    node depths: (proposal, logits ``[B, N, V]``, features ``[B, N, F]``). One function, so compiled
    decoding compiles drafting and verification into one graph."""
    proposal = proposer.propose(root, hidden)
    logits, hidden_states = verify_proposal(model, cache, proposal, n_valid)
    return proposal, logits, hidden_states


def verify_proposal(model: Any, cache: TreeCache, proposal: Proposal, n_valid: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`verify` of ``proposal``'s tree at positions ``n_valid [B]`` + node depths."""
    tokens, tree = proposal.tokens, proposal.tree
    positions = n_valid.view(tokens.shape[0], 1) + tree.depths  # [B, N] (depths [N] or [B, N])
    return verify(model, cache, tokens, positions, tree.float_mask)


PHASES = ("drafting", "target_forward", "acceptance", "host", "cache")


@dataclass
class PhaseClock:
    """Seconds one run's steps spent per phase (``medusa generate --profile``; eager decoding): the
    proposer's ``propose`` and ``observe`` (drafting), the verify forward (target forward), the scorer
    (acceptance), the step's host copy (host) and ``cache.compact`` (cache). Each lap syncs a GPU."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    steps: int = 0
    mark: float = 0.0

    def start(self) -> None:
        self.mark = time.perf_counter()
        self.steps += 1

    def lap(self, phase: str, like: torch.Tensor) -> None:
        """Add the time since the last mark to ``phase`` (``like``: a tensor on the step's device)."""
        if like.device.type == "cuda":
            torch.cuda.synchronize(like.device)
        now = time.perf_counter()
        self.seconds[phase] += now - self.mark
        self.mark = now


@dataclass
class StepFns:
    """The step's device function: the plain ``propose_verify`` or its ``torch.compile`` wrapper; ``clock``:
    time each phase (eager only: a compiled step fuses drafting and verification)."""

    propose_verify: Callable[..., tuple[Proposal, torch.Tensor, torch.Tensor]] = propose_verify
    compiled: bool = False
    clock: PhaseClock | None = None


def _clocked_propose_verify(model: Any, state: DecodeState, clock: PhaseClock
                            ) -> tuple[Proposal, torch.Tensor, torch.Tensor]:
    """:func:`propose_verify`, with the drafting and the target forward timed apart."""
    clock.start()
    proposal = state.proposer.propose(state.root, state.hidden)
    clock.lap("drafting", proposal.tokens)
    logits, hidden_states = verify_proposal(model, state.cache, proposal, state.n_valid)
    clock.lap("target_forward", logits)
    return proposal, logits, hidden_states


def path_features(hidden: torch.Tensor, path: torch.Tensor, n_acc: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The features at the kept path's nodes ``[B, D+1, F]`` (``hidden [B, N, F]``, ``path [B, D+1]``) and at
    each row's last kept node ``[B, F]``."""
    b, width = path.shape
    f = hidden.shape[-1]
    on_path = hidden.gather(1, path.view(b, width, 1).expand(-1, -1, f))  # [B, D+1, F]
    return on_path, on_path.gather(1, n_acc.view(b, 1, 1).expand(-1, -1, f))[:, 0]  # [B, F]


def step(model: Any, state: DecodeState, scorer: Scorer, fns: StepFns | None = None) -> StepResult:
    """Propose, verify (one forward over the tree), accept, compact; advances ``state`` in place and returns
    the step's :class:`StepResult` (its one device sync)."""
    fns = fns or StepFns()
    state.cache.reserve(state.proposer.num_nodes)
    if fns.compiled and not state.warm:
        warm_up(model, state, fns, scorer)
    graphs = fns.compiled and state.root.device.type == "cuda"
    if graphs:  # CUDA graphs: outputs of the previous replay may be overwritten from here on
        torch.compiler.cudagraph_mark_step_begin()
    clock = fns.clock
    if clock is None:
        proposal, logits, hidden = fns.propose_verify(model, state.proposer, state.cache, state.root,
                                                      state.hidden, state.n_valid)
    else:
        proposal, logits, hidden = _clocked_propose_verify(model, state, clock)
    tokens, tree = proposal.tokens, proposal.tree
    b = tokens.shape[0]
    path, n_acc, nxt = scorer(logits, tokens, tree, proposal.draft_probs)  # logits [B, N, V]
    features, state.hidden = path_features(hidden, path, n_acc)  # [B, D+1, F], [B, F]
    keep = n_acc + 1  # [B] kept tree nodes per row (root + accepted)
    width = path.shape[1]
    kept = tokens.gather(1, path)  # [B, D+1]
    if clock is not None:
        clock.lap("acceptance", kept)
    state.proposer.observe(kept, keep, nxt, features)
    if clock is not None:
        clock.lap("drafting", kept)
    both = torch.cat([kept, keep.view(b, 1), nxt.view(b, 1), path], dim=1).cpu()
    result = StepResult(both[:, :width], both[:, width], both[:, width + 1], both[:, width + 2:])
    if clock is not None:
        clock.lap("host", both)
    state.cache.compact(path, keep, result)
    if clock is not None:
        clock.lap("cache", both)
    state.n_valid = state.n_valid + keep
    state.root = nxt.clone() if graphs else nxt
    return result


def warm_up(model: Any, state: DecodeState, fns: StepFns, scorer: Scorer) -> None:
    """Run the compiled functions once on this state's shapes without changing the decode: propose is pure,
    verify idempotent (the real call rewrites the same cache columns), a pure scorer (greedy, no
    processors) runs too, and compaction runs on clones with the KV restored (``cache.dry_compact``). The
    time counts as compile time."""
    t0 = time.perf_counter()
    proposal, logits, _ = fns.propose_verify(model, state.proposer, state.cache, state.root, state.hidden,
                                             state.n_valid)
    tokens, tree = proposal.tokens, proposal.tree
    b = tokens.shape[0]
    if scorer.pure:
        scorer(logits, tokens, tree)
    path = torch.arange(tree.depth + 1, device=tokens.device).expand(b, -1).contiguous()  # [B, D+1]
    state.cache.dry_compact(path, torch.ones(b, dtype=torch.long, device=tokens.device))
    if tokens.device.type == "cuda":
        torch.cuda.synchronize(tokens.device)
    state.compile_time_s += time.perf_counter() - t0
    state.warm = True


def record(progress: Progress, row: int, new: list[int], eos: list[int], limit: int) -> int:
    """Emit ``new`` tokens for ``row`` (up to ``limit`` new tokens / EOS); returns how many were kept."""
    out = progress.generated[row]
    before = len(out)
    progress.done[row] = _emit(out, new, eos, limit)
    if progress.history is not None and not progress.done[row]:
        start = progress.prompt_len + before
        progress.history[row, start:start + len(out) - before] = torch.tensor(out[before:], dtype=torch.long)
    return len(out) - before


def _emit(out: list[int], new: list[int], eos: list[int], limit: int) -> bool:
    """Append ``new`` to ``out`` up to ``limit`` tokens or the first EOS; True when the row is finished."""
    for tok in new:
        out.append(tok)
        if tok in eos or len(out) >= limit:
            return True
    return len(out) >= limit


def decode_loop(model: Any, state: DecodeState, scorer: Scorer, eos: list[int], limit: int,
                accept_lengths: list[list[int]], streamer: Any = None, fns: StepFns | None = None) -> int:
    """Steps until every row of ``scorer.progress`` is done (``limit`` new tokens or an EOS of ``eos``); each
    row's tokens gained per step go to ``accept_lengths``. Returns the number of steps."""
    progress = scorer.progress
    steps = 0
    while not all(progress.done):
        result = step(model, state, scorer, fns)
        steps += 1
        for row in range(len(progress.done)):
            if progress.done[row]:
                continue
            gained = record(progress, row, result.new_tokens(row), eos, limit)
            accept_lengths[row].append(gained)
            if streamer is not None:
                streamer.put(torch.tensor(progress.generated[row][-gained:]))
    return steps


__all__ = ["PHASES", "DecodeState", "PhaseClock", "StepFns", "StepResult", "decode_loop", "path_features",
           "propose_verify", "record", "step", "verify", "verify_proposal", "warm_up"]
