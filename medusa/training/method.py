"""The training method the loop runs: MEDUSA-1 (:mod:`medusa1`) or MEDUSA-2 (:mod:`medusa2`), each a
:class:`TrainingMethod` chosen once from ``recipe.method``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from medusa.config import Recipe
from medusa.modeling.model import MedusaModel
from medusa.training import medusa1, medusa2


class TrainingMethod(Protocol):
    """What the loop asks of a training method. :data:`medusa1.METHOD` and :data:`medusa2.METHOD` provide it;
    :func:`method_of` picks one from ``recipe.method``."""

    name: str  # the recipe's ``method``

    def check_recipe(self, recipe: Recipe) -> None:
        """Method-specific combinations that cannot work, raised before anything loads."""

    def setup_model(self, recipe: Recipe, device: torch.device,
                    total_steps: int) -> tuple[MedusaModel, nn.Module, Any]:
        """``(model, trained module, loss state)``."""

    def param_groups(self, recipe: Recipe, trainable: nn.Module) -> list[dict[str, Any]]:
        """The optimizer's parameter groups (learning rates and weight decay)."""

    def compute_loss(self, recipe: Recipe, model: MedusaModel, trainable: nn.Module,
                     batch: dict[str, torch.Tensor], step: int,
                     state: Any) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """``(loss, stats [STATS_ROWS, K], metrics)`` of one micro-batch at optimizer step ``step``."""

    def save_final(self, accelerator: Any, model: MedusaModel, trainable: nn.Module, recipe: Recipe,
                   path: Path) -> None:
        """Write ``final/`` (every process calls it)."""

    def trained_model(self, accelerator: Any, model: MedusaModel, trainable: nn.Module) -> MedusaModel:
        """The model holding what was trained, once training ends."""


METHODS: dict[str, TrainingMethod] = {m.name: m for m in (medusa1.METHOD, medusa2.METHOD)}


def method_of(recipe: Recipe) -> TrainingMethod:
    """The recipe's training method (``recipe.method``, validated against :data:`medusa.config.METHODS`)."""
    return METHODS[recipe.method]


__all__ = ["METHODS", "TrainingMethod", "method_of"]
