"""Building blocks of a training run shared by MEDUSA-1 and MEDUSA-2: accelerator, data, backbone,
optimizer groups, step plan, schedule and data order. Free functions of the recipe (or of explicit
arguments); what differs between the methods lives in ``medusa1.py`` and ``medusa2.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from medusa.config import Recipe
from medusa.data import TokenizedData, load_tokenized
from medusa.errors import ConfigError
from medusa.modeling.base import load_base_model, native_bf16
from medusa.modeling.base import load_tokenizer as _load_tokenizer
from medusa.modeling.quantization import bnb_config, keep_plain_4bit_layout


# ----------------------------------------------------------------------------------------- accelerator
def mixed_precision(recipe: Recipe) -> str | None:
    """The recipe's ``train.mixed_precision`` with ``auto`` resolved: ``bf16`` where the training device
    (CUDA when available, else the CPU) computes bfloat16 natively (:func:`native_bf16`: Ampere+, or AVX-512
    BF16 / AMX), else ``no`` (emulated bf16 runs several times slower than float32 on such CPUs)."""
    value = recipe.train.mixed_precision
    if value != "auto":
        return value
    return "bf16" if native_bf16("cuda" if torch.cuda.is_available() else "cpu") else "no"


def make_accelerator(recipe: Recipe) -> Any:
    from accelerate import Accelerator

    kwargs: dict[str, Any] = {"gradient_accumulation_steps": recipe.train.grad_accum,
                              "project_dir": recipe.output_dir}
    if recipe.train.mixed_precision is not None:
        kwargs["mixed_precision"] = mixed_precision(recipe)
    if recipe.report_to != "none":
        kwargs["log_with"] = recipe.report_to
    accelerator = Accelerator(**kwargs)
    ds = accelerator.state.deepspeed_plugin
    if ds is not None:  # our data loader is not prepared, so DeepSpeed cannot infer the micro-batch size
        ds.deepspeed_config["train_micro_batch_size_per_gpu"] = recipe.train.batch_size
    return accelerator


# ----------------------------------------------------------------------------------------- data
@dataclass
class RunData:
    tokenizer: Any
    train: TokenizedData
    eval: TokenizedData | None
    pad_token_id: int


def load_tokenizer(recipe: Recipe) -> Any:
    return _load_tokenizer(recipe.model, error=ConfigError, what="a tokenizer (recipe key model)")


def load_data(recipe: Recipe, tokenizer: Any) -> RunData:
    d = recipe.data
    kw = dict(max_length=d.max_length, format=d.format, chat_template=d.chat_template,
              skip_invalid=d.skip_invalid)
    train = load_tokenized(d.train, tokenizer, **kw)
    evaluation = load_tokenized(d.eval, tokenizer, **kw) if d.eval else None
    if evaluation is None and d.eval_split > 0:
        order = torch.randperm(len(train.examples),
                               generator=torch.Generator().manual_seed(recipe.train.seed))
        n_eval = max(1, int(len(order) * d.eval_split))
        held = set(order[:n_eval].tolist())
        evaluation = TokenizedData([e for i, e in enumerate(train.examples) if i in held], {}, d.train)
        train = TokenizedData([e for i, e in enumerate(train.examples) if i not in held],
                              train.skipped, d.train)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return RunData(tokenizer, train, evaluation, int(pad if pad is not None else 0))


# ----------------------------------------------------------------------------------------- model
def load_backbone(recipe: Recipe, device: torch.device) -> nn.Module:
    """The base model on ``device``, in ``recipe.dtype`` or quantised with bitsandbytes
    (``recipe.quantization``; 4-bit layers keep the plain NF4 layout on CPU)."""
    if recipe.quantization is None:
        return load_base_model(recipe.model, dtype=recipe.dtype).to(device)
    index = device.index if device.type == "cuda" else device.type
    base = load_base_model(recipe.model, dtype=recipe.dtype, device_map={"": index},
                           quantization_config=bnb_config(recipe.quantization, compute_dtype=recipe.dtype))
    keep_plain_4bit_layout(base)
    return base


# ----------------------------------------------------------------------------------------- optimizer
def _norm_param_ids(model: nn.Module) -> set[int]:
    ids = set()
    for module in model.modules():
        name = type(module).__name__.lower()
        if isinstance(module, (nn.LayerNorm, nn.GroupNorm)) or "norm" in name:
            ids.update(id(p) for p in module.parameters(recurse=False))
    return ids


def param_groups(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.0,
    lr_multiplier: float = 4.0,
    heads: nn.Module | None = None,
) -> list[dict[str, Any]]:
    """AdamW parameter groups of every trainable parameter of ``model``: ``backbone_decay``,
    ``backbone_no_decay`` at ``lr`` and ``heads_decay``, ``heads_no_decay`` at ``lr * lr_multiplier``.

    ``heads`` (default ``model.heads``): every one of its parameters (weights and biases) is in a heads
    group. Biases, norm weights and other 1-D parameters get no weight decay. Empty groups are left out;
    each group carries a ``name``. MEDUSA-1 (heads only) uses ``lr_multiplier=1``.
    """
    norm_ids = _norm_param_ids(model)
    head_ids = {id(p) for p in (model.heads if heads is None else heads).parameters()}
    buckets: dict[str, list[nn.Parameter]] = {"backbone_decay": [], "backbone_no_decay": [],
                                              "heads_decay": [], "heads_no_decay": []}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        part = "heads" if id(p) in head_ids else "backbone"
        no_decay = p.dim() < 2 or id(p) in norm_ids or name.endswith("bias")
        buckets[f"{part}_{'no_decay' if no_decay else 'decay'}"].append(p)
    return [{"name": name, "params": params, "lr": lr * lr_multiplier if name.startswith("heads") else lr,
             "weight_decay": 0.0 if name.endswith("no_decay") else weight_decay}
            for name, params in buckets.items() if params]


# ----------------------------------------------------------------------------------------- schedule
@dataclass
class Plan:
    """How many steps: optimizer steps per epoch, total, warmup, and the global micro-batch size."""

    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    world: int
    micro_batch: int
    grad_accum: int


def make_plan(recipe: Recipe, num_examples: int, world: int) -> Plan:
    t = recipe.train
    micro_batches = num_examples // (t.batch_size * world)
    steps_per_epoch = micro_batches // t.grad_accum
    if steps_per_epoch < 1:
        raise ConfigError(f"train.batch_size: {num_examples} examples do not fill one step of batch_size "
                          f"{t.batch_size} x {world} process(es) x grad_accum {t.grad_accum}")
    total = t.max_steps if t.max_steps > 0 else max(1, math.ceil(t.epochs * steps_per_epoch))
    return Plan(steps_per_epoch, total, int(t.warmup_ratio * total), world, t.batch_size, t.grad_accum)


def make_scheduler(optimizer: torch.optim.Optimizer, recipe: Recipe, plan: Plan) -> Any:
    from transformers import get_scheduler

    name = {"cosine": "cosine", "linear": "linear",
            "constant": "constant_with_warmup"}[recipe.train.scheduler]
    return get_scheduler(name, optimizer, num_warmup_steps=plan.warmup_steps,
                         num_training_steps=plan.total_steps)


def epoch_order(num_examples: int, seed: int, epoch: int) -> list[int]:
    """The shuffled example order of one epoch (the same on every process)."""
    return torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed * 1000 + epoch)).tolist()


def micro_batch_indices(order: list[int], micro: int, rank: int, plan: Plan) -> list[int]:
    """Example indices of this process's part of global micro-batch ``micro`` of the epoch."""
    start = (micro * plan.world + rank) * plan.micro_batch
    return order[start:start + plan.micro_batch]

