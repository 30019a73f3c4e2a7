"""MEDUSA-2 (``method: medusa2``): the backbone (LoRA, QLoRA or full fine-tuning) trains with the heads.

Plain functions the loop (:mod:`medusa.training.loop`) calls, with an explicit :class:`Medusa2State`:
:func:`check_recipe` (before anything loads), :func:`setup_model`, :func:`compute_loss`
(``L_LM (or KL to the teacher) + lambda_0(step) * L_heads`` through one trained module, so DDP /
DeepSpeed / FSDP see every gradient; the losses live in :mod:`medusa.training.losses`) and
:func:`save_final` (the merged export). Also the pieces they use:

- teacher: :func:`teacher_logits` (peft ``disable_adapter()`` or the reference copy; warns once for 4-bit);
- heads: :func:`medusa_from_base` and :func:`init_heads_from_lm_head` (work with ZeRO-3 partitioned
  weights), :func:`load_heads_from` (two-stage training from a MEDUSA-1 checkpoint).

The backbone setup and merge are in :mod:`medusa.training.backbone`; the optimizer groups (heads at
``lr * lr_multiplier``) in :func:`medusa.training.setup.param_groups`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from medusa.config import Recipe
from medusa.errors import CheckpointError, ConfigError, MedusaError
from medusa.modeling.base import base_logits, decoder_of, lm_head_weight, load_base_model
from medusa.modeling.config import MedusaConfig
from medusa.modeling.heads_file import check_state_keys, heads_weights_path, read_heads_file
from medusa.modeling.model import MedusaModel
from medusa.training.backbone import (
    apply_lora,
    is_4bit,
    is_peft,
    is_zero3,
    prepare_4bit,
    save_merged,
    setup_full_finetune,
)
from medusa.training.losses import Teacher, medusa2_loss, medusa_head_loss
from medusa.training.schedules import lambda0_at
from medusa.training.setup import load_backbone, load_tokenizer, load_whole, param_groups

# ---------------------------------------------------------------------------------------------- teacher
_WARNED_4BIT_TEACHER = [False]


def teacher_logits(
    model: MedusaModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    reference: nn.Module | None = None,
) -> torch.Tensor:
    """The teacher's base logits ``[B, T, V]`` (no grad, eval mode): ``reference`` if given, else the LoRA
    model with its adapters disabled. Warns once when the teacher is a 4-bit model."""
    teacher = reference if reference is not None else model.base_model
    if reference is None and not is_peft(teacher):
        raise MedusaError("medusa2.self_distill needs a teacher: LoRA adapters (disabled for the teacher) "
                          "or a frozen reference copy of the backbone (full fine-tuning)")
    if is_4bit(teacher) and not _WARNED_4BIT_TEACHER[0]:
        _WARNED_4BIT_TEACHER[0] = True
        warnings.warn("self-distillation teacher is a 4-bit quantised model; the MEDUSA paper advises "
                      "against quantised teachers (their distribution differs from the original model's)",
                      stacklevel=2)
    was_training = teacher.training
    teacher.eval()
    try:
        with torch.no_grad(), (teacher.disable_adapter() if reference is None else contextlib.nullcontext()):
            logits = teacher(input_ids=input_ids, attention_mask=attention_mask).logits  # [B, T, V]
    finally:
        teacher.train(was_training)
    return logits


# ---------------------------------------------------------------------------------------------- heads
@contextlib.contextmanager
def gathered(params: Iterable[torch.Tensor], modifier_rank: int | None = None) -> Iterator[None]:
    """Gather DeepSpeed ZeRO-3 partitioned parameters for the body (a no-op for ordinary tensors).

    ``modifier_rank``: the rank whose in-place changes are kept and broadcast on exit (None: read only).
    """
    partitioned = [p for p in params if is_zero3([p])]
    if not partitioned:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=modifier_rank):
        yield


def medusa_from_base(base: nn.Module, **kwargs: Any) -> MedusaModel:
    """``MedusaModel.from_base`` that also works when ZeRO-3 has partitioned the LM head (gathered first)."""
    with gathered([lm_head_weight(base)]):
        return MedusaModel.from_base(base, **kwargs)


def init_heads_from_lm_head(model: MedusaModel) -> None:
    """Re-initialise every head's W2 from the base LM head (ResBlocks untouched), gathering ZeRO-3
    partitions of both the LM head and the heads first."""
    weight = lm_head_weight(model.base_model)
    with gathered([weight] + list(model.heads.parameters()), modifier_rank=0):
        model.heads.init_from_lm_head(weight.detach())


def load_heads_from(model: MedusaModel, path: str | Path) -> None:
    """Stage 2 of two-stage training (``heads.init_from``): load trained MEDUSA-1 heads into ``model``.

    The checkpoint must have the same num_heads / num_layers / head_type / hidden_size / vocab_size; its
    draft vocabulary (if any) is taken over.
    """
    config = MedusaConfig.load(path)
    weights = heads_weights_path(path)
    state = read_heads_file(weights)
    if config.draft_vocab and not model.heads.draft_vocab and "token_map" in state:
        model.use_draft_vocab(state["token_map"])
    for key in ("num_heads", "num_layers", "head_type", "hydra_projection", "hidden_size", "vocab_size",
                "draft_vocab"):
        theirs, ours = getattr(config, key), getattr(model.config, key)
        if theirs != ours:
            raise CheckpointError(f"heads.init_from: {path} has {key}={theirs!r} but the recipe "
                                  f"builds {ours!r}")
    check_state_keys(model.heads, state, source=str(weights))
    params = list(model.heads.parameters())
    with gathered(params, modifier_rank=0), torch.no_grad():
        for name, tensor in model.heads.state_dict(keep_vars=True).items():
            tensor.copy_(state[name].to(tensor.dtype))


# ---------------------------------------------------------------------------------------------- run
@dataclass
class Medusa2State:
    """What MEDUSA-2's loss needs beyond the model and the batch."""

    total_steps: int  # lambda_0(step)'s schedule runs over these optimizer steps
    reference: nn.Module | None = None  # the frozen teacher of full fine-tuning with self-distillation


class Medusa2Module(nn.Module):
    """The trained module of MEDUSA-2: backbone + heads.

    ``forward`` returns ``(loss, stats [STATS_ROWS, K], parts [2])``: stats as MEDUSA-1's (per-head CE sum,
    top-1 hits, top-5 hits, count, draft misses) and parts = ``(L_LM or the KL, L_heads)``, detached, for the
    metrics log.
    """

    def __init__(self, model: MedusaModel, decay: float, chunk_size: int, teacher_loss: float = 0.0) -> None:
        super().__init__()
        self.model = model
        self.decay, self.chunk_size, self.teacher_loss = decay, chunk_size, teacher_loss

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                lambda0: float, teacher: torch.Tensor | None = None,
                temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        base = self.model.base_model
        out = decoder_of(base)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        hidden = out.last_hidden_state  # [B, T, d]; the heads' gradients flow into the backbone
        logits = base_logits(base, hidden)  # [B, T, V]
        heads_in = self.model.heads.teacher_inputs(hidden, input_ids)  # [B, T, d] (Hydra: [B, T, d * (K+1)])
        kl_to = None
        if self.teacher_loss > 0:
            tm = self.model.heads.token_map  # [N_draft] or None: the KL over the heads' vocabulary
            kl_to = Teacher(hidden, lambda h: base_logits(base, h) if tm is None
                            else base_logits(base, h).index_select(-1, tm), self.teacher_loss)
        heads = medusa_head_loss(heads_in, labels, self.model.heads.head_logits, self.model.heads.num_heads,
                                 decay=self.decay, chunk_size=self.chunk_size,
                                 label_map=self.model.heads.target_to_draft(), teacher=kl_to)
        loss, metrics = medusa2_loss(logits, labels, heads.loss, lambda0, teacher_logits=teacher,
                                     temperature=temperature)
        stats = heads.stats()  # [STATS_ROWS, K]
        parts = torch.tensor([metrics["lm_loss"], metrics["heads_loss"]])  # [2]
        return loss, stats, parts


def check_recipe(recipe: Recipe) -> None:
    """MEDUSA-2-specific combinations that cannot work (raised before any model loads)."""
    if recipe.lora.full_finetune and recipe.quantization is not None:
        raise ConfigError(f"lora.full_finetune: a {recipe.quantization} backbone cannot be fully fine-tuned "
                          "(set quantization: null, or lora.full_finetune: false for QLoRA)")


def _build_trained(base: nn.Module, recipe: Recipe) -> tuple[MedusaModel, nn.Module | None]:
    """Heads on ``base`` (fresh from its LM head or ``heads.init_from``), then LoRA or full fine-tuning.
    Returns the model and the full fine-tuning reference teacher (None with LoRA / without
    self-distillation)."""
    h, lo = recipe.heads, recipe.lora
    model = medusa_from_base(base, num_heads=h.num_heads, num_layers=h.num_layers, head_type=h.head_type,
                             heads_dtype=torch.float32, hydra_projection=h.hydra_projection)
    if h.init_from:
        load_heads_from(model, h.init_from)
    if lo.full_finetune:
        return model, setup_full_finetune(model, self_distill=recipe.medusa2.self_distill)
    apply_lora(model, r=lo.r, alpha=lo.alpha, dropout=lo.dropout, target_modules=lo.target_modules)
    return model, None


def setup_model(recipe: Recipe, device: torch.device,
                total_steps: int) -> tuple[MedusaModel, Medusa2Module, Medusa2State]:
    """The backbone (4-bit + k-bit training prep with ``quantization``), heads, LoRA or full fine-tuning,
    in train mode; the trained module; the state :func:`compute_loss` needs."""
    check_recipe(recipe)
    base = load_backbone(recipe, device)
    if recipe.quantization is not None:
        base = prepare_4bit(base)
    model, reference = _build_trained(base, recipe)
    model.heads.to(device=device, dtype=torch.float32)
    model.train()
    trainable = Medusa2Module(model, recipe.heads.decay, recipe.train.loss_chunk_size,
                              recipe.heads.teacher_loss)
    return model, trainable, Medusa2State(total_steps=total_steps, reference=reference)


def compute_loss(model: MedusaModel, trainable: nn.Module, batch: dict[str, torch.Tensor], recipe: Recipe,
                 step: int, state: Medusa2State) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """``(loss, stats [STATS_ROWS, K], metrics)`` of one micro-batch at optimizer step ``step``; metrics:
    ``lm_loss`` (the KL to the teacher when self-distilling, then also under ``distill_kl``), ``heads_loss``,
    ``lambda0``."""
    m = recipe.medusa2
    lam = lambda0_at(step, state.total_steps, m.lambda0, m.schedule)
    teacher = None
    if m.self_distill:
        teacher = teacher_logits(model, batch["input_ids"], batch["attention_mask"],
                                 reference=state.reference)
    loss, stats, parts = trainable(batch["input_ids"], batch["attention_mask"], batch["labels"], lam, teacher,
                                   m.distill_temperature)
    metrics = {"lm_loss": float(parts[0]), "heads_loss": float(parts[1]), "lambda0": lam}
    if m.self_distill:
        metrics["distill_kl"] = metrics["lm_loss"]
    return loss, stats, metrics


def _gather_state(module: nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """The full fp32 state of a ZeRO-3 partitioned module, one parameter gathered at a time (every rank
    must call this; only ``keep`` ranks get the tensors)."""
    state: dict[str, torch.Tensor] = {}
    for name, p in module.named_parameters(remove_duplicate=False):  # tied weights under every name
        with gathered([p]):
            if keep:
                state[name] = p.detach().float().cpu().clone()
    if keep:
        for name, t in module.state_dict().items():  # buffers are not partitioned
            state.setdefault(name, t.detach().cpu())
    return state


def _gathered_module(unwrapped: Medusa2Module, model: MedusaModel, recipe: Recipe,
                     is_main: bool) -> Medusa2Module | None:
    """A whole (unpartitioned) copy of a ZeRO-3 trained module on the main process (None elsewhere), with
    heads built as ``model``'s (draft vocabulary ``token_map [N]`` and Hydra projection included), so that it
    saves what the non-ZeRO path saves."""
    full = _gather_state(unwrapped, is_main)  # every process takes part
    if not is_main:
        return None
    with load_whole():
        base = load_base_model(recipe.model, dtype="float32")
    fresh = medusa_from_base(base, num_heads=model.num_heads, num_layers=model.config.num_layers,
                             head_type=model.config.head_type, heads_dtype=torch.float32,
                             hydra_projection=model.config.hydra_projection or "own",
                             token_map=full.get("model.heads.token_map"))  # [N] with a draft vocabulary
    if not recipe.lora.full_finetune:
        lo = recipe.lora
        apply_lora(fresh, r=lo.r, alpha=lo.alpha, dropout=lo.dropout, target_modules=lo.target_modules)
    module = Medusa2Module(fresh, 0.0, 1)
    module.load_state_dict(full, strict=True)
    return module


def save_final(accelerator: Any, model: MedusaModel, trainable: nn.Module, recipe: Recipe,
               path: Path) -> None:
    """Write the merged export (heads + merged backbone + tokenizer + recipe) to ``path``; on the main
    process ``model`` then holds the merged backbone and the trained heads."""
    unwrapped = accelerator.unwrap_model(trainable)
    if is_zero3(unwrapped.parameters()):
        unwrapped = _gathered_module(unwrapped, model, recipe, accelerator.is_main_process)
    if accelerator.is_main_process:
        merged = save_merged(unwrapped.model, str(path), tokenizer=load_tokenizer(recipe),
                             recipe=recipe.to_dict(), base_name_or_path=recipe.model, dtype=recipe.dtype,
                             overwrite=True)  # final/ is the run's own (output_dir checked at the start)
        model.base_model, model.heads = merged.base_model, merged.heads
    accelerator.wait_for_everyone()


class Medusa2:
    """MEDUSA-2 as the loop's :class:`~medusa.training.loop.TrainingMethod`: backbone (LoRA or full) at
    ``train.lr`` and heads at ``lr * medusa2.lr_multiplier``, with a :class:`Medusa2State`."""

    name = "medusa2"

    def check_recipe(self, recipe: Recipe) -> None:
        check_recipe(recipe)

    def setup_model(self, recipe: Recipe, device: torch.device,
                    total_steps: int) -> tuple[MedusaModel, Medusa2Module, Medusa2State]:
        return setup_model(recipe, device, total_steps)

    def param_groups(self, recipe: Recipe, trainable: nn.Module) -> list[dict[str, Any]]:
        t = recipe.train
        return param_groups(trainable.model, t.lr, t.weight_decay, lr_multiplier=recipe.medusa2.lr_multiplier)

    def compute_loss(self, recipe: Recipe, model: MedusaModel, trainable: nn.Module,
                     batch: dict[str, torch.Tensor], step: int,
                     state: Medusa2State) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        return compute_loss(model, trainable, batch, recipe, step, state)

    def save_final(self, accelerator: Any, model: MedusaModel, trainable: nn.Module, recipe: Recipe,
                   path: Path) -> None:
        save_final(accelerator, model, trainable, recipe, path)

    def trained_model(self, accelerator: Any, model: MedusaModel, trainable: nn.Module) -> MedusaModel:
        """``model`` itself: it holds the trained backbone and heads (merged on the main process by
        :func:`save_final`)."""
        return model


METHOD = Medusa2()
