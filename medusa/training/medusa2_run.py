"""MEDUSA-2 inside the training loop (``method: medusa2``): the recipe-driven glue over :mod:`medusa2`.

``medusa.training.train`` asks :func:`medusa.training.medusa2.method` for a ``Method``; this module
builds it: model setup (LoRA / QLoRA / full fine-tuning, heads from the LM head or ``heads.init_from``),
the loss ``L_LM (or KL to the teacher) + lambda_0(step) * L_heads`` through one trained module (so DDP /
DeepSpeed / FSDP see every gradient), the optimizer groups (heads at ``lr * lr_multiplier``) and the
merged final export.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from medusa.config import Recipe
from medusa.errors import ConfigError
from medusa.modeling.base import base_logits, decoder_of, load_base_model
from medusa.modeling.model import MedusaModel
from medusa.training import medusa2 as M
from medusa.training.losses import medusa_head_loss
from medusa.training.schedules import lambda0_at


@contextlib.contextmanager
def _without_zero3_init() -> Iterator[None]:
    """Models built in the body load whole (transformers would otherwise build them under zero.Init)."""
    from transformers.integrations import deepspeed as hf_ds

    ref = hf_ds._hf_deepspeed_config_weak_ref
    hf_ds.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = ref


def _gather_state(module: nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """The full fp32 state of a ZeRO-3 partitioned module, one parameter gathered at a time (every rank
    must call this; only ``keep`` ranks get the tensors)."""
    state: dict[str, torch.Tensor] = {}
    for name, p in module.named_parameters(remove_duplicate=False):  # tied weights under every name
        with M.gathered([p]):
            if keep:
                state[name] = p.detach().float().cpu().clone()
    if keep:
        for name, t in module.state_dict().items():  # buffers are not partitioned
            state.setdefault(name, t.detach().cpu())
    return state


class Medusa2Module(nn.Module):
    """The trained module of MEDUSA-2: backbone + heads; ``forward`` returns ``(loss, stats [4, K])``."""

    def __init__(self, model: MedusaModel, decay: float, chunk_size: int) -> None:
        super().__init__()
        self.model = model
        self.decay, self.chunk_size = decay, chunk_size

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                lambda0: float, teacher: torch.Tensor | None = None,
                temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        base = self.model.base_model
        out = decoder_of(base)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        hidden = out.last_hidden_state  # [B, T, d]; the heads' gradients flow into the backbone
        logits = base_logits(base, hidden)  # [B, T, V]
        heads = medusa_head_loss(hidden, labels, self.model.heads.head_logits, self.model.heads.num_heads,
                                 decay=self.decay, chunk_size=self.chunk_size)
        loss, _ = M.medusa2_loss(logits, labels, heads.loss, lambda0, teacher_logits=teacher,
                                 temperature=temperature)
        return loss, torch.stack([heads.ce_sum, heads.correct1, heads.correct5, heads.count])


def check_recipe(recipe: Recipe) -> None:
    """MEDUSA-2-specific combinations that cannot work (raised before any model loads)."""
    if recipe.lora.full_finetune and recipe.quantization is not None:
        raise ConfigError(f"lora.full_finetune: a {recipe.quantization} backbone cannot be fully fine-tuned "
                          "(set quantization: null, or lora.full_finetune: false for QLoRA)")


def make_method() -> Any:
    """The ``Method`` of ``medusa.training.train`` for MEDUSA-2 (state: the teacher and the step count)."""
    from medusa.training import setup as S
    from medusa.training.loop import Method

    state: dict[str, Any] = {"reference": None, "total_steps": None}

    def setup_model(recipe: Recipe, device: torch.device) -> tuple[MedusaModel, nn.Module]:
        check_recipe(recipe)
        base = S.load_backbone(recipe, device)
        if recipe.quantization is not None:
            from peft import prepare_model_for_kbit_training

            base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
            M._fix_cpu_4bit_packing(base)
        h = recipe.heads
        model = M.medusa_from_base(base, num_heads=h.num_heads, num_layers=h.num_layers, head_type=h.head_type,
                                   heads_dtype=torch.float32)
        if h.init_from:
            M.load_heads_from(model, h.init_from)
        lo = recipe.lora
        if lo.full_finetune:
            state["reference"] = M.setup_full_finetune(model, self_distill=recipe.medusa2.self_distill)
        else:
            M.apply_lora(model, r=lo.r, alpha=lo.alpha, dropout=lo.dropout, target_modules=lo.target_modules)
        model.heads.to(device=device, dtype=torch.float32)
        model.train()
        return model, Medusa2Module(model, h.decay, recipe.train.loss_chunk_size)

    def set_plan(plan: Any) -> None:
        state["total_steps"] = plan.total_steps

    def compute_loss(model: MedusaModel, trainable: nn.Module, batch: dict[str, torch.Tensor], recipe: Recipe,
                     step: int) -> tuple[torch.Tensor, torch.Tensor]:
        m = recipe.medusa2
        lam = lambda0_at(step, state["total_steps"] or 1, m.lambda0, m.schedule)
        teacher = None
        if m.self_distill:
            teacher = M.teacher_logits(model, batch["input_ids"], batch["attention_mask"],
                                       reference=state["reference"])
        return trainable(batch["input_ids"], batch["attention_mask"], batch["labels"], lam, teacher,
                         m.distill_temperature)

    def optimizer_groups(trainable: nn.Module, recipe: Recipe) -> list[dict[str, Any]]:
        return M.param_groups(trainable.model, recipe.train.lr, recipe.train.weight_decay,
                              recipe.medusa2.lr_multiplier)

    def save_final(accelerator: Any, model: MedusaModel, trainable: nn.Module, recipe: Recipe, path: Any) -> None:
        unwrapped = accelerator.unwrap_model(trainable)
        if M._is_zero3(unwrapped.parameters()):
            full = _gather_state(unwrapped, accelerator.is_main_process)  # every process takes part
            if accelerator.is_main_process:
                with _without_zero3_init():
                    base = load_base_model(recipe.model, dtype="float32")
                fresh = M.medusa_from_base(base, num_heads=model.num_heads, num_layers=model.config.num_layers,
                                           head_type=model.config.head_type, heads_dtype=torch.float32)
                if not recipe.lora.full_finetune:
                    lo = recipe.lora
                    M.apply_lora(fresh, r=lo.r, alpha=lo.alpha, dropout=lo.dropout,
                                 target_modules=lo.target_modules)
                unwrapped = Medusa2Module(fresh, 0.0, 1)
                unwrapped.load_state_dict(full, strict=True)
        if accelerator.is_main_process:
            merged = M.save_merged(unwrapped.model, str(path), tokenizer=S.load_tokenizer(recipe),
                                   recipe=recipe.to_dict(), base_name_or_path=recipe.model,
                                   dtype=recipe.dtype)
            model.base_model, model.heads = merged.base_model, merged.heads
        accelerator.wait_for_everyone()

    return Method(setup_model, compute_loss, optimizer_groups, save_final, set_plan=set_plan)
