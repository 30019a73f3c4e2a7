"""MEDUSA-2's trained backbone: LoRA / QLoRA / full fine-tuning setup and the merged export.

- setup: :func:`apply_lora` (targets per architecture, overridable), :func:`prepare_4bit` (QLoRA's NF4
  backbone made ready for k-bit training), :func:`setup_full_finetune` (+ a frozen reference teacher);
- what a backbone is: :func:`is_peft`, :func:`is_4bit`, :func:`is_zero3`;
- export: :func:`merge_backbone` / :func:`save_merged` (LoRA merged; QLoRA merged into an unquantised copy).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from medusa.errors import CheckpointError, ConfigError
from medusa.modeling.base import load_base_model, text_config, unwrap
from medusa.modeling.config import MedusaConfig
from medusa.modeling.model import MedusaModel
from medusa.modeling.quantization import keep_plain_4bit_layout

_LLAMA_LIKE = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Every linear layer of attention and MLP (the official MEDUSA-2 recipe adapts all of them); never the LM
# head.
LORA_TARGETS: dict[str, list[str]] = {
    "llama": _LLAMA_LIKE, "mistral": _LLAMA_LIKE, "qwen2": _LLAMA_LIKE, "qwen3": _LLAMA_LIKE,
    "gemma": _LLAMA_LIKE, "gemma2": _LLAMA_LIKE,
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
    "gpt_neox": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
}


# ---------------------------------------------------------------------------------------------- backbone
def lora_target_modules(base: nn.Module, override: list[str] | str | None = None) -> list[str] | str:
    """LoRA target module names for ``base``: ``override`` if given, else the per-architecture list,
    else peft's ``"all-linear"`` (every linear layer except the output head)."""
    if override:
        return override
    return LORA_TARGETS.get(text_config(base).model_type, "all-linear")


def apply_lora(
    model: MedusaModel,
    r: int = 16,
    alpha: int = 32,
    dropout: float = 0.05,
    target_modules: list[str] | str | None = None,
) -> MedusaModel:
    """Wrap ``model.base_model`` in a peft LoRA model (in place; returned for chaining).

    Base weights (LM head included) are frozen by peft; LoRA matrices and every head parameter train.
    LoRA's B matrices start at zero, so the adapted model starts exactly equal to the base.
    """
    from peft import LoraConfig, get_peft_model

    base = model.base_model
    targets = lora_target_modules(base, target_modules)
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none",
                        task_type="CAUSAL_LM", fan_in_fan_out=text_config(base).model_type == "gpt2")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # peft's notes on fan_in_fan_out / kbit casting
            model.base_model = get_peft_model(base, config)
    except ValueError as exc:
        raise ConfigError(f"lora.target_modules: {targets!r} do not fit {type(unwrap(base)).__name__}: "
                          f"{str(exc).splitlines()[0]}") from None
    for p in model.heads.parameters():
        p.requires_grad_(True)
    return model


def prepare_4bit(base: nn.Module) -> nn.Module:
    """QLoRA: a 4-bit backbone (from :func:`medusa.training.setup.load_backbone`) prepared for k-bit
    training (peft's ``prepare_model_for_kbit_training``, no gradient checkpointing)."""
    from peft import prepare_model_for_kbit_training

    base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    keep_plain_4bit_layout(base)
    return base


def is_4bit(base: nn.Module) -> bool:
    inner = unwrap(base)
    return bool(getattr(inner, "is_loaded_in_4bit", False)) or any(
        type(m).__name__ in ("Linear4bit", "LinearNF4", "LinearFP4") for m in inner.modules())


def is_peft(base: nn.Module) -> bool:
    return hasattr(base, "disable_adapter") and hasattr(base, "peft_config")


def is_zero3(params: Iterable[torch.Tensor]) -> bool:
    return any(hasattr(p, "ds_id") or hasattr(p, "ds_tensor") for p in params)


def setup_full_finetune(model: MedusaModel, self_distill: bool = False) -> nn.Module | None:
    """Make every backbone and head parameter trainable; with ``self_distill`` return a frozen copy of the
    backbone (the teacher, in eval mode), else None."""
    base = model.base_model
    if is_peft(base):
        raise ConfigError("lora.full_finetune: the backbone already carries LoRA adapters")
    if is_4bit(base):
        raise ConfigError("lora.full_finetune: a 4-bit backbone cannot be fully fine-tuned; use QLoRA")
    reference = None
    if self_distill:
        if is_zero3(base.parameters()):
            raise ConfigError("medusa2.self_distill with lora.full_finetune is not supported under ZeRO-3 "
                              "(a partitioned teacher has no forward outside the engine); use LoRA or ZeRO-2")
        reference = copy.deepcopy(unwrap(base)).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    for p in list(base.parameters()) + list(model.heads.parameters()):
        p.requires_grad_(True)
    return reference


def merge_backbone(
    model: MedusaModel, base_name_or_path: str | None = None, dtype: str | torch.dtype = torch.float32
) -> MedusaModel:
    """A MedusaModel whose backbone has the LoRA weights merged in (a plain ``PreTrainedModel``).

    LoRA: ``merge_and_unload()`` in place (``model.base_model`` must not be used afterwards).
    QLoRA: the base is reloaded unquantised in ``dtype`` (bf16 / fp32) from ``base_name_or_path`` (default:
    the checkpoint's base), the trained adapters are loaded into it and merged. Full fine-tuning: as is.
    """
    base = model.base_model
    if not is_peft(base):
        return model
    if is_4bit(base):
        from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

        source = base_name_or_path or model.config.base_model_name_or_path
        if not source:
            raise CheckpointError("cannot merge QLoRA adapters: the base model's path is unknown; pass "
                                  "base_name_or_path")
        adapters = {k: v.detach().cpu() for k, v in get_peft_model_state_dict(base).items()}
        lora_config = copy.deepcopy(base.peft_config["default"])
        fresh = load_base_model(source, dtype=dtype)
        wrapped = get_peft_model(fresh, lora_config)
        result = set_peft_model_state_dict(wrapped, adapters)
        if getattr(result, "unexpected_keys", None):
            raise CheckpointError(f"QLoRA merge: adapter tensors {result.unexpected_keys[:3]} do not "
                                  f"fit {source}")
        merged = wrapped.merge_and_unload()
    else:
        merged = base.merge_and_unload()
    model.heads.bind_base(merged)  # the merged base's LM head (shared heads), input embeddings (Hydra)
    merged.eval()
    return MedusaModel(merged, model.heads, MedusaConfig(**model.config.to_dict()), tree=model.tree)


def save_merged(
    model: MedusaModel,
    out_dir: str,
    tokenizer: Any = None,
    recipe: dict[str, Any] | None = None,
    base_name_or_path: str | None = None,
    dtype: str | torch.dtype = torch.float32,
    overwrite: bool = False,
) -> MedusaModel:
    """Merge (see :func:`merge_backbone`) and write heads + merged backbone (+ tokenizer, recipe) to
    ``out_dir`` so that ``MedusaModel.from_pretrained(out_dir)`` loads it with no other files (an existing
    non-empty ``out_dir``: refused unless ``overwrite``, see ``MedusaModel.save_pretrained``)."""
    merged = merge_backbone(model, base_name_or_path=base_name_or_path, dtype=dtype)
    if recipe is not None:
        merged.config.recipe = recipe
    merged.save_pretrained(out_dir, save_base=True, tokenizer=tokenizer, overwrite=overwrite)
    return merged
