"""Draft vocabulary: the N target tokens the heads predict, chosen as the most frequent training labels.

``token_map [N]`` (int64) maps draft id -> target id; draft id 0 is the most frequent label (ties: the
lower target id first). When fewer than N distinct ids are labelled, the rest of the map is the lowest
unlabelled ids, so N is always exact. :func:`coverage` is the share of target tokens the map covers.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import torch
from torch import nn

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


def widen_map(token_map: torch.Tensor, counts: torch.Tensor, n: int) -> torch.Tensor:
    """A trained drafter's ``token_map [N0]`` followed by the ``n - N0`` ids most frequent in ``counts [V]``
    outside it (ordered as :func:`most_frequent`) -> ``[n]``: every old id keeps its draft id, so the first
    N0 rows of a widened head are the trained ones, and narrowing to a prefix drops the rarest additions."""
    n0, v = int(token_map.shape[0]), int(counts.shape[0])
    if not n0 <= n <= v:
        raise ConfigError(f"heads.draft_vocab: widening a {n0}-token draft vocabulary needs a size in "
                          f"[{n0}, {v}], got {n}")
    order = most_frequent(counts, v)  # [V]
    extra = order[~torch.isin(order, token_map.cpu())][: n - n0]
    return torch.cat([token_map.cpu().long(), extra])


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
def scatter_to_target(logits: torch.Tensor, token_map: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft logits ``[..., N]`` -> ``[..., V]``, -inf outside the draft vocabulary (as vLLM does)."""
    full = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))  # [..., V]
    full[..., token_map] = logits
    return full


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


class DraftVocab:
    """The draft vocabulary of one heads module (MedusaHeads and HydraHeads each compose one as
    ``heads.vocab``): its size N (0: the full vocabulary of V target ids), the mapping between draft and
    target ids, and the tensors derived from ``token_map``, cached in named attributes and rebuilt whenever
    the map (or the base LM head's weight) changes. A cache derived from ``token_map`` is keyed on the map's
    contents (a copy, compared on each use: ``[N]`` ids, cheap), so no in-place rewrite — ``set_token_map``,
    ``load_state_dict``, a write through ``.data`` — can serve rows of an older map. The LM head's weight
    ``[V, d]`` is keyed on the tensor itself (held, so its address cannot be reused), its storage and its
    version counter (every in-place op through autograd's view of it); its bias ``[V]`` is never cached.

    ``token_map [N]`` (draft id -> target id) itself stays a buffer of the heads module and is passed to the
    methods: it is the checkpoint's tensor ``token_map``, which ``nn.Module`` must own to save, load and move
    it (``heads.to(device)`` replaces the buffer tensor, so a reference held here would go stale).
    """

    def __init__(self, vocab_size: int, size: int = 0) -> None:
        if not 0 <= size <= vocab_size:
            raise ValueError(f"draft_vocab must be in [0, vocab_size={vocab_size}], got {size}")
        self.vocab_size, self.size = vocab_size, size
        self._t2d: tuple[torch.Tensor, torch.Tensor] | None = None  # (map copy [N], [V] int64)
        self._rows: tuple[tuple[Any, ...], torch.Tensor, torch.Tensor] | None = None  # (key, map copy, W)

    def placeholder(self) -> torch.Tensor | None:
        """A new heads module's ``token_map``: ``arange(N)`` until set or loaded (None: full vocabulary)."""
        return torch.arange(self.size, dtype=torch.long) if self.size else None

    def set_map(self, buffer: torch.Tensor | None, token_map: torch.Tensor) -> None:
        """Copy ``token_map [N]`` (distinct target ids in ``[0, V)``) into the heads' ``buffer``."""
        if buffer is None:
            raise ValueError("these heads have the full vocabulary (draft_vocab=0)")
        check_token_map(token_map, self.size, self.vocab_size)
        with torch.no_grad():
            buffer.copy_(token_map.to(buffer.device, torch.long))

    def restrict(self, token_map: torch.Tensor, lm_heads: nn.ModuleList | None, hidden_size: int,
                 device: torch.device, current: torch.Tensor | None = None,
                 base_weight: torch.Tensor | None = None) -> tuple[nn.ModuleList | None, torch.Tensor]:
        """The heads' vocabulary -> the draft vocabulary ``token_map [N]``: sets the size and returns the
        heads' new own W2s (``[N, d]``, new parameters; None for heads that share the LM head) and the new
        ``token_map`` buffer on ``device``. From the full vocabulary each W2 keeps its ``token_map`` rows;
        from a draft vocabulary ``current [N0]`` (a trained drafter widened or narrowed) an id of both
        keeps its trained row and a new id starts as the base LM head's row (``base_weight [V, d]``)."""
        if self.size and current is None:
            raise ValueError(f"the heads already have a draft vocabulary of {self.size} tokens: pass its "
                             f"token_map as current to re-map it")
        n = int(token_map.shape[0])
        check_token_map(token_map, n, self.vocab_size)
        tm = token_map.to(device=device, dtype=torch.long)
        if lm_heads is not None:
            new = nn.ModuleList(nn.Linear(hidden_size, n, bias=False) for _ in range(len(lm_heads)))
            new.to(device=device, dtype=lm_heads[0].weight.dtype)
            with torch.no_grad():
                for head, old in zip(new, lm_heads):
                    head.weight.copy_(self._rows_of(tm, old.weight, current, base_weight))
            lm_heads = new
        self.size = n
        self._t2d = self._rows = None
        return lm_heads, tm.clone()

    def _rows_of(self, tm: torch.Tensor, weight: torch.Tensor, current: torch.Tensor | None,
                 base_weight: torch.Tensor | None) -> torch.Tensor:
        """A W2's rows for the new map ``tm [N]``: ``weight [N0 or V, d]`` indexed through ``current``."""
        if current is None:
            return weight.index_select(0, tm)  # [N, d] from the full vocabulary's [V, d]
        old_ids = self.target_to_draft(current.to(tm.device))[tm]  # [N]: each id's row in weight, -1 if new
        fresh = old_ids < 0
        if bool(fresh.any()) and base_weight is None:
            raise ValueError(f"{int(fresh.sum())} ids of the new draft vocabulary are not in the current "
                             f"one; their rows need the base LM head's weight (base_weight)")
        rows = weight.new_empty((tm.shape[0], weight.shape[1]))  # [N, d]
        rows[~fresh] = weight[old_ids[~fresh]]
        if bool(fresh.any()):
            rows[fresh] = base_weight[tm[fresh].to(base_weight.device)].to(rows.device, rows.dtype)
        return rows

    def init_heads(self, lm_heads: nn.ModuleList | None, token_map: torch.Tensor | None,
                   weight: torch.Tensor) -> None:
        """Copy the base LM head weight ``[V, d]`` (its ``token_map`` rows with a draft vocabulary) into
        every own W2 of ``lm_heads`` (no-op for heads that share the LM head: None)."""
        if lm_heads is None:
            return
        if token_map is not None:
            weight = weight.index_select(0, token_map.to(weight.device))  # [N, d]
        with torch.no_grad():
            for head in lm_heads:
                head.weight.copy_(weight.to(head.weight.dtype))

    def target_to_draft(self, token_map: torch.Tensor | None) -> torch.Tensor | None:
        """``[V]`` int64: the draft id of each target id, -1 outside the draft vocabulary (None: full;
        cached)."""
        if token_map is None:
            return None
        if self._t2d is None or not _same(self._t2d[0], token_map):
            t2d = torch.full((self.vocab_size,), -1, dtype=torch.long, device=token_map.device)  # [V]
            t2d[token_map] = torch.arange(token_map.shape[0], device=token_map.device)
            self._t2d = (token_map.detach().clone(), t2d)
        return self._t2d[1]

    @staticmethod
    def to_target(token_map: torch.Tensor | None, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids (any shape) -> target ids (identity with the full vocabulary)."""
        return draft_ids if token_map is None else token_map[draft_ids]

    def to_target_logits(self, token_map: torch.Tensor | None, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits ``[..., N]`` -> ``[..., V]``, -inf outside the draft vocab (identity when full)."""
        if token_map is None:
            return logits
        return scatter_to_target(logits, token_map, self.vocab_size)

    def shared_rows(self, lm_head: nn.Module, token_map: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The base LM head's ``token_map`` rows: ``(W [N, d], bias [N] or None)``. With autograd on they
        are gathered inside the graph (MEDUSA-2 may train the LM head); without, cached until a weight
        changes."""
        weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
        if not weight.is_floating_point():
            raise ValueError("a draft vocabulary on heads that share the base LM head needs a floating-point "
                             f"base LM head, got {weight.dtype}")
        tm = token_map.to(weight.device)
        if torch.is_grad_enabled():
            return weight.index_select(0, tm), None if bias is None else bias.index_select(0, tm)
        bias_rows = None if bias is None else bias.detach().index_select(0, tm)  # [N]: cheap, never cached
        key = (weight.data_ptr(), weight._version, weight.device)
        cached = self._rows
        if cached is None or cached[0][0] is not weight or cached[0][1:] != key or not _same(cached[1], tm):
            rows = weight.detach().index_select(0, tm)  # [N, d]
            self._rows = ((weight, *key), tm.detach().clone(), rows)
        return self._rows[2], bias_rows


def _same(copy: torch.Tensor, token_map: torch.Tensor) -> bool:
    """``token_map`` still holds the ids of ``copy`` (a cache's key), on the same device."""
    return copy.device == token_map.device and copy.shape == token_map.shape and torch.equal(copy, token_map)


__all__ = ["DraftVocab", "build_token_map", "candidate_rows", "chain_bound", "check_token_map",
           "choose_draft_vocab", "coverage", "draft_vocab_summary", "label_counts", "most_frequent",
           "scatter_to_target", "widen_map"]
