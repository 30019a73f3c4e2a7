"""Building blocks of a training run: accelerator, data, model, optimizer groups, schedule.

Each is a free function of the recipe so that MEDUSA-2 (medusa/training/medusa2.py) can reuse them
and replace only what differs (model setup, loss, optimizer groups).
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
from medusa.modeling.base import load_tokenizer as _load_tokenizer
from medusa.modeling.model import MedusaModel
from medusa.training.losses import medusa_head_loss


# ----------------------------------------------------------------------------------------- accelerator
def make_accelerator(recipe: Recipe) -> Any:
    from accelerate import Accelerator

    kwargs: dict[str, Any] = {"gradient_accumulation_steps": recipe.train.grad_accum,
                              "project_dir": recipe.output_dir}
    if recipe.train.mixed_precision is not None:
        kwargs["mixed_precision"] = recipe.train.mixed_precision
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
        order = torch.randperm(len(train.examples), generator=torch.Generator().manual_seed(recipe.train.seed))
        n_eval = max(1, int(len(order) * d.eval_split))
        held = set(order[:n_eval].tolist())
        evaluation = TokenizedData([e for i, e in enumerate(train.examples) if i in held], {}, d.train)
        train = TokenizedData([e for i, e in enumerate(train.examples) if i not in held], train.skipped, d.train)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return RunData(tokenizer, train, evaluation, int(pad if pad is not None else 0))


# ----------------------------------------------------------------------------------------- model
def quantization_config(recipe: Recipe) -> Any:
    if recipe.quantization is None:
        return None
    from transformers import BitsAndBytesConfig

    from medusa.modeling.base import resolve_dtype

    if recipe.quantization == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=resolve_dtype(recipe.dtype))
    return BitsAndBytesConfig(load_in_8bit=True)


def load_backbone(recipe: Recipe, device: torch.device) -> nn.Module:
    """The base model on ``device``, in ``recipe.dtype`` or quantised with bitsandbytes."""
    from medusa.modeling.base import load_base_model

    qcfg = quantization_config(recipe)
    if qcfg is not None:
        index = device.index if device.type == "cuda" else device.type
        base = load_base_model(recipe.model, dtype=recipe.dtype, quantization_config=qcfg,
                               device_map={"": index})
        _avoid_bnb_cpu_repack(base)
        return base
    return load_base_model(recipe.model, dtype=recipe.dtype).to(device)


def _avoid_bnb_cpu_repack(model: nn.Module) -> None:
    """bitsandbytes 0.50's CPU inference path for 4-bit layers (eval mode, no grad, AVX512-BF16) repacks
    the weight in blocks of 32 output rows and asserts on layers whose width is not a multiple of 32
    or whose input is not a multiple of 64 (stories260K's MLP is 172 wide). Those keep the generic 4-bit matmul."""
    try:
        from bitsandbytes.nn import Linear4bit
    except ImportError:
        return
    for module in model.modules():
        if isinstance(module, Linear4bit) and (module.out_features % 32 or module.in_features % 64):
            module.support_avx512bf16_for_cpu = False


class HeadsLoss(nn.Module):
    """The trained module of MEDUSA-1: the heads, whose forward is the chunked head loss.

    Going through ``forward`` is what lets DDP / DeepSpeed / FSDP see (and reduce) the heads' gradients.
    Returns ``(loss, stats [4, K])`` with stats = per-head CE sum, top-1 hits, top-5 hits, target count.
    """

    def __init__(self, heads: nn.Module, decay: float, chunk_size: int) -> None:
        super().__init__()
        self.heads = heads
        self.decay, self.chunk_size = decay, chunk_size

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = medusa_head_loss(hidden, labels, self.heads.head_logits, self.heads.num_heads,
                               decay=self.decay, chunk_size=self.chunk_size)
        return out.loss, torch.stack([out.ce_sum, out.correct1, out.correct5, out.count])


def setup_model_medusa1(recipe: Recipe, device: torch.device) -> tuple[MedusaModel, nn.Module]:
    """Frozen backbone (eval mode, no grads) + fp32 heads initialised from the LM head (or ``init_from``)."""
    base = load_backbone(recipe, device)
    h = recipe.heads
    if h.init_from:
        model = MedusaModel.from_pretrained(h.init_from, base_model=base, heads_dtype=torch.float32)
        if model.num_heads != h.num_heads:
            raise ConfigError(f"heads.init_from: {h.init_from} has {model.num_heads} heads, "
                              f"heads.num_heads is {h.num_heads}")
    else:
        model = MedusaModel.from_base(base, num_heads=h.num_heads, num_layers=h.num_layers,
                                      head_type=h.head_type, heads_dtype=torch.float32)
    model.freeze_base()
    model.base_model.eval()
    model.heads.to(device=device, dtype=torch.float32).train()
    return model, HeadsLoss(model.heads, h.decay, recipe.train.loss_chunk_size)


def backbone_hidden(model: MedusaModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Last hidden state ``[B, T, d]`` of the frozen backbone, computed without autograd."""
    from medusa.modeling.base import decoder_of

    with torch.no_grad():
        out = decoder_of(model.base_model)(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                           use_cache=False)
    return out.last_hidden_state


def compute_loss_medusa1(model: MedusaModel, trainable: nn.Module, batch: dict[str, torch.Tensor],
                         recipe: Recipe, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MEDUSA-1: heads' loss on the frozen backbone's hidden states. Returns ``(loss, stats [4, K])``."""
    hidden = backbone_hidden(model, batch)  # [B, T, d]
    return trainable(hidden, batch["labels"])


def optimizer_groups(trainable: nn.Module, recipe: Recipe, lr: float | None = None) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on matrices, none on biases / norms (1-D tensors)."""
    lr = recipe.train.lr if lr is None else lr
    decay, no_decay = [], []
    for _, p in trainable.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": recipe.train.weight_decay, "lr": lr},
              {"params": no_decay, "weight_decay": 0.0, "lr": lr}]
    return [g for g in groups if g["params"]]


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

    name = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}[recipe.train.scheduler]
    return get_scheduler(name, optimizer, num_warmup_steps=plan.warmup_steps,
                         num_training_steps=plan.total_steps)


def epoch_order(num_examples: int, seed: int, epoch: int) -> list[int]:
    """The shuffled example order of one epoch (the same on every process)."""
    return torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed * 1000 + epoch)).tolist()


def micro_batch_indices(order: list[int], micro: int, rank: int, plan: Plan) -> list[int]:
    """Example indices of this process's part of global micro-batch ``micro`` of the epoch."""
    start = (micro * plan.world + rank) * plan.micro_batch
    return order[start:start + plan.micro_batch]

