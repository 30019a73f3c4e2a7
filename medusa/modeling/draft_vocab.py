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




def draft_vocab_summary(heads: Any, tokens: torch.Tensor) -> dict[str, Any]:
    """``{"draft_vocab": N, "draft_vocab_coverage": share of tokens inside it}`` for heads with a draft
    vocabulary (``tokens``: target ids, any shape, ``-100`` skipped); ``{}`` for full-vocabulary heads."""
    token_map = getattr(heads, "token_map", None)
    if token_map is None:
        return {}
    cov = coverage(token_map, tokens)
    return {"draft_vocab": int(token_map.shape[0]), "draft_vocab_coverage": None if math.isnan(cov) else cov}


__all__ = ["build_token_map", "coverage", "draft_vocab_summary", "label_counts", "most_frequent"]
