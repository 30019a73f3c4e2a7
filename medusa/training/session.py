"""What one training run holds (:class:`Run`) and how it is built: accelerator, data, step plan, model (its
draft vocabulary, its hidden-state cache), optimizer and scheduler, prepared by accelerate."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from medusa.config import Recipe
from medusa.modeling.model import MedusaModel
from medusa.training import setup as S
from medusa.training.checkpoint import METRICS_NAME
from medusa.training.hidden_cache import HiddenCache
from medusa.training.hidden_cache import prepare as prepare_cache
from medusa.training.method import TrainingMethod, method_of
from medusa.training.vocab_setup import restrict_draft_vocab


@dataclass
class Run:
    """What one training session holds, built once by :func:`build_run`."""

    recipe: Recipe
    method: TrainingMethod
    accelerator: Any
    data: S.RunData
    plan: S.Plan
    model: MedusaModel
    trainable: nn.Module  # prepared by accelerate
    optimizer: Any
    scheduler: Any
    state: Any  # the method's loss state (MEDUSA-2: Medusa2State; MEDUSA-1: None)
    out_dir: Path
    metrics_path: Path
    cache: HiddenCache | None = None  # train.hidden_cache: training batches read hidden states from it


def setup_model(recipe: Recipe, device: torch.device, plan: S.Plan) -> tuple[MedusaModel, nn.Module, Any]:
    """The recipe's method's ``(model, trained module, loss state)``."""
    return method_of(recipe).setup_model(recipe, device, plan.total_steps)


def build_run(recipe: Recipe, method: TrainingMethod, progress: bool = True) -> Run:
    """Accelerator, data, step plan, model, optimizer and scheduler, prepared by accelerate."""
    from accelerate.utils import set_seed

    accelerator = S.make_accelerator(recipe)
    set_seed(recipe.train.seed)
    data = S.load_data(recipe, S.load_tokenizer(recipe))
    plan = S.make_plan(recipe, len(data.train.examples), accelerator.num_processes)
    model, trainable, state = setup_model(recipe, accelerator.device, plan)
    restrict_draft_vocab(recipe, model, data.train.examples, accelerator)
    cache = None
    if recipe.train.hidden_cache:
        cache = prepare_cache(recipe.train.hidden_cache, model.base_model, data.train.examples,
                              data.pad_token_id, recipe.train.batch_size, accelerator, log=accelerator.print,
                              bf16_compute=accelerator.mixed_precision == "bf16", progress=progress,
                              feature_layers=getattr(model.heads, "feature_layers", None))
    optimizer = torch.optim.AdamW(method.param_groups(recipe, trainable), lr=recipe.train.lr)
    scheduler = S.make_scheduler(optimizer, recipe, plan)
    trainable, optimizer = S.prepare(accelerator, model.config.hidden_size, trainable, optimizer)
    out_dir = Path(recipe.output_dir)
    return Run(recipe, method, accelerator, data, plan, model, trainable, optimizer, scheduler, state,
               out_dir, out_dir / METRICS_NAME, cache)


__all__ = ["Run", "build_run", "setup_model"]
