"""``heads.draft_vocab: N`` at the start of a training run: the heads restricted to the N most frequent
training labels before the optimizer sees their parameters."""

from __future__ import annotations

from typing import Any

import torch

from medusa.config import Recipe
from medusa.errors import ConfigError
from medusa.modeling.draft_vocab import build_token_map, coverage
from medusa.modeling.model import MedusaModel


def restrict_draft_vocab(recipe: Recipe, model: MedusaModel, examples: list[dict[str, list[int]]],
                         accelerator: Any) -> None:
    """Restrict the heads to the ``heads.draft_vocab`` most frequent training labels (the same map on every
    process: each one holds all of the training data) and print their coverage. Heads from
    ``heads.init_from`` keep their own map, which must have that many ids; 0 leaves the full vocabulary."""
    n, have = recipe.heads.draft_vocab, model.heads.draft_vocab
    if recipe.heads.init_from:
        if have != n:
            raise ConfigError(f"heads.draft_vocab: {n}, but heads.init_from {recipe.heads.init_from} has "
                              f"draft_vocab {have}")
        return
    if not n:
        return
    token_map = build_token_map(examples, model.config.vocab_size, n)
    model.use_draft_vocab(token_map)
    labels = torch.tensor([t for ex in examples for t in ex["labels"]], dtype=torch.long)
    accelerator.print(f"draft vocabulary: {n} of {model.config.vocab_size} tokens cover "
                      f"{coverage(token_map, labels):.2%} of the training labels")


__all__ = ["restrict_draft_vocab"]
