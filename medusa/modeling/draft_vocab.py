"""Draft vocabulary: the N target tokens the heads predict, chosen as the most frequent training labels.

``token_map [N]`` (int64) maps draft id -> target id; draft id 0 is the most frequent label (ties: the
lower target id first). When fewer than N distinct ids are labelled, the rest of the map is the lowest
unlabelled ids, so N is always exact. :func:`coverage` is the share of target tokens the map covers.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import torch

from medusa.data.tokenize import IGNORE_INDEX
from medusa.errors import ConfigError


def label_counts(examples: Iterable[dict[str, Sequence[int]]], vocab_size: int) -> torch.Tensor:
    """How often each target id is a label (``-100`` skipped) -> ``[V]`` int64."""
    counts = torch.zeros(vocab_size, dtype=torch.long)  # [V]
    for ex in examples:
        labels = torch.as_tensor(ex["labels"], dtype=torch.long)
        labels = labels[labels != IGNORE_INDEX]
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= vocab_size):
            raise ConfigError(f"heads.draft_vocab: a label id lies outside the base vocabulary [0, "
                              f"{vocab_size})")
        counts += torch.bincount(labels, minlength=vocab_size)
    return counts


def most_frequent(counts: torch.Tensor, n: int) -> torch.Tensor:
    """``counts [V]`` -> ``token_map [n]``: ids by decreasing count, ties by increasing id."""
    v = counts.shape[0]
    if not 0 < n <= v:
        raise ConfigError(f"heads.draft_vocab: must be in [1, {v}] (the base vocabulary), got {n}")
    ids = torch.arange(v)
    # a stable sort on -count keeps equal counts in increasing id order
    order = torch.sort(-counts, stable=True).indices  # [V]
    return ids[order][:n].clone()


def build_token_map(examples: Iterable[dict[str, Sequence[int]]], vocab_size: int, n: int) -> torch.Tensor:
    """The ``n`` target ids most frequent among the ``examples``' labels -> ``token_map [n]`` int64."""
    return most_frequent(label_counts(examples, vocab_size), n)


def coverage(token_map: torch.Tensor | None, tokens: torch.Tensor) -> float:
    """Share of ``tokens`` (target ids, any shape; ``-100`` skipped) inside the draft vocabulary (1.0 if
    ``token_map`` is None, i.e. the full vocabulary; nan when there is no token)."""
    tokens = tokens[tokens != IGNORE_INDEX].reshape(-1)
    if token_map is None:
        return 1.0 if tokens.numel() else float("nan")
    if tokens.numel() == 0:
        return float("nan")
    return float(torch.isin(tokens.to(token_map.device), token_map).float().mean())



def _label_runs(labels: Sequence[int]) -> torch.Tensor:
    """The trained (non ``-100``) labels of one example, in order -> ``[L]`` int64."""
    t = torch.as_tensor(labels, dtype=torch.long)
    return t[t != IGNORE_INDEX]


def chain_bound(token_map: torch.Tensor | None, examples: Iterable[dict[str, Sequence[int]]],
                depth: int) -> float:
    """Tokens/step a perfect chain of ``depth`` heads would gain on the ``examples``' labels when every
    drafted token must lie in the draft vocabulary: the mean over positions t of 1 + the run of in-vocabulary
    tokens among t+1 .. t+depth (``1 + depth`` for the full vocabulary; nan without a position)."""
    total, count = 0.0, 0
    for ex in examples:
        seq = _label_runs(ex["labels"])
        n = seq.numel() - depth
        if n <= 0:
            continue
        inside = torch.ones_like(seq, dtype=torch.bool) if token_map is None else torch.isin(seq, token_map)
        alive = torch.ones(n, dtype=torch.bool)  # [n]: the chain from t is still unbroken
        run = torch.zeros(n, dtype=torch.long)
        for j in range(1, depth + 1):
            alive &= inside[j:j + n]
            run += alive
        total += float((1 + run).sum())
        count += n
    return total / count if count else float("nan")


def candidate_rows(train: Sequence[dict[str, Sequence[int]]], held_out: Sequence[dict[str, Sequence[int]]],
                   vocab_size: int, candidates: Sequence[int], depth: int) -> list[dict[str, Any]]:
    """For each candidate N: the map from the ``train`` labels, its coverage of the train and ``held_out``
    labels, and the perfect-chain tokens/step bound on ``held_out`` (:func:`chain_bound`) and the share of
    the full vocabulary's bound it loses."""
    counts = label_counts(train, vocab_size)
    held = torch.cat([_label_runs(ex["labels"]) for ex in held_out] or [torch.zeros(0, dtype=torch.long)])
    seen = torch.cat([_label_runs(ex["labels"]) for ex in train] or [torch.zeros(0, dtype=torch.long)])
    full = chain_bound(None, held_out, depth)
    rows = []
    for n in candidates:
        token_map = most_frequent(counts, min(int(n), vocab_size))
        bound = chain_bound(token_map, held_out, depth)
        rows.append({"draft_vocab": int(token_map.shape[0]), "train_coverage": coverage(token_map, seen),
                     "held_out_coverage": coverage(token_map, held), "chain_tokens_per_step": bound,
                     "chain_tokens_per_step_full": full, "chain_lost": 1 - bound / full})
    return rows


def choose_draft_vocab(rows: Sequence[dict[str, Any]], coverage_target: float,
                       max_n: int | None = None) -> int:
    """The smallest candidate (``rows`` from :func:`candidate_rows`) whose held-out coverage reaches
    ``coverage_target``, else the one with the best coverage; never above ``max_n`` (a parameter budget)."""
    allowed = [r for r in rows if max_n is None or r["draft_vocab"] <= max_n]
    if not allowed:
        raise ConfigError(f"heads.draft_vocab: every candidate exceeds the budget of {max_n} tokens")
    allowed = sorted(allowed, key=lambda r: r["draft_vocab"])
    for r in allowed:
        if r["held_out_coverage"] >= coverage_target:
            return r["draft_vocab"]
    return max(allowed, key=lambda r: (r["held_out_coverage"], -r["draft_vocab"]))["draft_vocab"]

# ----------------------------------------------------------------------------------------- heads' side
# Free functions of a ``token_map`` for the heads classes that hold one (MedusaHeads, HydraHeads; a ``cache``
# dict is the module's own ``__dict__``: a cached tensor is rebuilt whenever the map or the weight changes).
def target_to_draft_map(token_map: torch.Tensor, vocab_size: int, cache: dict[str, Any]) -> torch.Tensor:
    """``[V]`` int64: the draft id of each target id, -1 outside the draft vocabulary (cached)."""
    key = (token_map.data_ptr(), token_map._version, token_map.device)
    cached = cache.get("_t2d_cache")
    if cached is None or cached[0] != key:
        t2d = torch.full((vocab_size,), -1, dtype=torch.long, device=token_map.device)  # [V]
        t2d[token_map] = torch.arange(token_map.shape[0], device=token_map.device)
        cached = (key, t2d)
        cache["_t2d_cache"] = cached
    return cached[1]


def scatter_to_target(logits: torch.Tensor, token_map: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft logits ``[..., N]`` -> ``[..., V]``, -inf outside the draft vocabulary (as vLLM does)."""
    full = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))  # [..., V]
    full[..., token_map] = logits
    return full


def shared_rows(lm_head: torch.nn.Module, token_map: torch.Tensor, cache: dict[str, Any]
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The base LM head's ``token_map`` rows: ``(W [N, d], bias [N] or None)``. With autograd on they are
    gathered inside the graph (MEDUSA-2 may train the LM head); without, cached until a weight changes."""
    weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
    if not weight.is_floating_point():
        raise ValueError("a draft vocabulary on heads that share the base LM head needs a floating-point "
                         f"base LM head, got {weight.dtype}")
    tm = token_map.to(weight.device)
    if torch.is_grad_enabled():
        return weight.index_select(0, tm), None if bias is None else bias.index_select(0, tm)
    key = (weight.data_ptr(), weight._version, token_map.data_ptr(), token_map._version)
    cached = cache.get("_rows_cache")
    if cached is None or cached[0] != key:
        rows = weight.detach().index_select(0, tm)  # [N, d]
        cached = (key, rows, None if bias is None else bias.detach().index_select(0, tm))
        cache["_rows_cache"] = cached
    return cached[1], cached[2]


def draft_vocab_summary(heads: Any, tokens: torch.Tensor) -> dict[str, Any]:
    """``{"draft_vocab": N, "draft_vocab_coverage": share of tokens inside it}`` for heads with a draft
    vocabulary (``tokens``: target ids, any shape, ``-100`` skipped); ``{}`` for full-vocabulary heads."""
    token_map = getattr(heads, "token_map", None)
    if token_map is None:
        return {}
    cov = coverage(token_map, tokens)
    return {"draft_vocab": int(token_map.shape[0]), "draft_vocab_coverage": None if math.isnan(cov) else cov}


def check_token_map(token_map: torch.Tensor, draft_vocab: int, vocab_size: int,
                    source: str = "token_map") -> None:
    """``ValueError`` unless ``token_map`` is ``[draft_vocab]`` distinct int ids in ``[0, vocab_size)``."""
    if token_map.dtype.is_floating_point or token_map.dtype == torch.bool or token_map.dim() != 1:
        raise ValueError(f"{source}: expected a 1-D integer tensor, got {token_map.dtype} "
                         f"{tuple(token_map.shape)}")
    if token_map.shape[0] != draft_vocab:
        raise ValueError(f"{source}: has {token_map.shape[0]} ids, draft_vocab is {draft_vocab}")
    if draft_vocab and (int(token_map.min()) < 0 or int(token_map.max()) >= vocab_size):
        raise ValueError(f"{source}: ids must lie in [0, {vocab_size}), got [{int(token_map.min())}, "
                         f"{int(token_map.max())}]")
    if torch.unique(token_map).numel() != draft_vocab:
        raise ValueError(f"{source}: ids are not distinct")


def set_token_map(heads: Any, token_map: torch.Tensor) -> None:
    """Set a heads module's draft vocabulary ``token_map [N]`` (distinct target ids in ``[0, V)``)."""
    if heads.token_map is None:
        raise ValueError("these heads have the full vocabulary (draft_vocab=0)")
    check_token_map(token_map, heads.draft_vocab, heads.vocab_size)
    with torch.no_grad():
        heads.token_map.copy_(token_map.to(heads.token_map.device, torch.long))


def restrict_vocab(heads: Any, token_map: torch.Tensor, device: torch.device) -> None:
    """A full-vocabulary heads module -> the draft vocabulary ``token_map [N]``, in place: its blocks are
    kept and an own W2 (``heads.lm_heads``) keeps its ``token_map`` rows (``[V, d] -> [N, d]``, new
    parameters); ``device``: where the heads live."""
    if heads.draft_vocab:
        raise ValueError(f"the heads already have a draft vocabulary of {heads.draft_vocab} tokens")
    n = int(token_map.shape[0])
    check_token_map(token_map, n, heads.vocab_size)
    tm = token_map.to(device=device, dtype=torch.long)
    if heads.lm_heads is not None:
        new = torch.nn.ModuleList(torch.nn.Linear(heads.hidden_size, n, bias=False)
                                  for _ in range(heads.num_heads))
        new.to(device=device, dtype=heads.lm_heads[0].weight.dtype)
        with torch.no_grad():
            for head, old in zip(new, heads.lm_heads):
                head.weight.copy_(old.weight.index_select(0, tm))
        heads.lm_heads = new
    del heads.token_map
    heads.register_buffer("token_map", tm.clone())
    heads.draft_vocab = n


def init_from_lm_head(heads: Any, weight: torch.Tensor) -> None:
    """Copy the base LM head weight ``[V, d]`` (its ``token_map`` rows with a draft vocabulary) into every
    own W2 of ``heads`` (no-op for heads that share the LM head)."""
    if heads.lm_heads is None:
        return
    if heads.token_map is not None:
        weight = weight.index_select(0, heads.token_map.to(weight.device))  # [N, d]
    with torch.no_grad():
        for head in heads.lm_heads:
            head.weight.copy_(weight.to(head.weight.dtype))


__all__ = ["build_token_map", "candidate_rows", "chain_bound", "check_token_map", "choose_draft_vocab",
           "coverage", "draft_vocab_summary", "init_from_lm_head", "label_counts", "most_frequent",
           "restrict_vocab", "scatter_to_target", "set_token_map", "shared_rows", "target_to_draft_map"]
