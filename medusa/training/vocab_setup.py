"""``heads.draft_vocab: N`` at the start of a training run: the heads restricted to the N most frequent
training labels before the optimizer sees their parameters."""

from __future__ import annotations

from typing import Any

import torch

from medusa.config import Recipe
from medusa.errors import ConfigError
from medusa.modeling.draft_vocab import coverage, label_counts, most_frequent, widen_map
from medusa.modeling.model import MedusaModel


def restrict_draft_vocab(recipe: Recipe, model: MedusaModel, examples: list[dict[str, list[int]]],
                         accelerator: Any) -> None:
    """Restrict the heads to the ``heads.draft_vocab`` most frequent training labels (the same map on every
    process: each one holds all of the training data) and print their coverage. Heads from
    ``heads.init_from`` keep their own map when it has N ids, and are widened when it has fewer
    (:func:`~medusa.modeling.draft_vocab.widen_map`); 0 leaves the full vocabulary."""
    n, have = recipe.heads.draft_vocab, model.heads.draft_vocab
    if recipe.heads.init_from and have == n:
        return
    if recipe.heads.init_from and not 0 < have < n:
        raise ConfigError(f"heads.draft_vocab: {n}, but heads.init_from {recipe.heads.init_from} has "
                          f"draft_vocab {have or 'full'}: a trained draft vocabulary can only be widened")
    if not n:
        return
    counts = label_counts(examples, model.config.vocab_size)
    token_map = widen_map(model.heads.token_map, counts, n) if have else most_frequent(counts, n)
    model.use_draft_vocab(token_map)
    labels = torch.tensor([t for ex in examples for t in ex["labels"]], dtype=torch.long)
    accelerator.print(f"draft vocabulary: {n} of {model.config.vocab_size} tokens cover "
                      f"{coverage(token_map, labels):.2%} of the training labels")


__all__ = ["restrict_draft_vocab"]
