"""MEDUSA-2: train the backbone (LoRA, QLoRA or full fine-tuning) together with the heads.

Pieces, each a free function with explicit state (the training loop in ``train.py`` wires them):

- backbone setup: :func:`apply_lora` (targets per architecture, overridable), :func:`load_base_4bit`
  (QLoRA: NF4 + double quantisation), :func:`setup_full_finetune` (+ a frozen reference teacher);
- losses (pure): :func:`causal_lm_loss`, :func:`self_distill_kl`, :func:`medusa2_loss`
  (``L = L_LM + lambda_0(step) * L_heads``; ``L_LM`` becomes the KL to the teacher with self-distillation);
- teacher: :func:`teacher_logits` (peft ``disable_adapter()`` or the reference copy; warns once for 4-bit);
- optimizer: :func:`param_groups` (heads at ``lr * lr_multiplier``, no weight decay on biases / norms);
- heads: :func:`medusa_from_base` and :func:`init_heads_from_lm_head` (work with ZeRO-3 partitioned
  weights), :func:`load_heads_from` (two-stage training from a MEDUSA-1 checkpoint);
- export: :func:`merge_backbone` / :func:`save_merged` (LoRA merged; QLoRA merged into an unquantised copy).

Label convention (``medusa.data``): ``labels [B, T]`` are the input ids themselves on assistant tokens and
-100 elsewhere (not shifted); the base logits at position t predict ``labels[:, t + 1]``.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from medusa.errors import CheckpointError, ConfigError, MedusaError
from medusa.modeling.base import lm_head_of, lm_head_weight, load_base_model, text_config, unwrap
from medusa.modeling.config import WEIGHTS_NAME, MedusaConfig
from medusa.modeling.model import MedusaModel, check_state_keys, read_heads_file

IGNORE_INDEX = -100

_LLAMA_LIKE = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Every linear layer of attention and MLP (the official MEDUSA-2 recipe adapts all of them); never the LM head.
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


def _fix_cpu_4bit_packing(model: nn.Module) -> None:
    # bitsandbytes 0.50 repacks 4-bit weights in place for its AVX512-bf16 CPU kernel on the first eval +
    # no-grad forward (e.g. the self-distillation teacher) and fails unless every dimension is a multiple
    # of its block sizes (stories260K's 172-wide MLP is not). The repacking is an inference-only speed-up;
    # a model being trained keeps the plain NF4 layout.
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def load_base_4bit(
    name_or_path: str,
    compute_dtype: str | torch.dtype = torch.bfloat16,
    double_quant: bool = True,
    device_map: Any = None,
) -> nn.Module:
    """QLoRA's backbone: NF4 4-bit weights (double quantisation), prepared for k-bit training."""
    from peft import prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig

    from medusa.modeling.base import resolve_dtype

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_use_double_quant=double_quant,
                               bnb_4bit_compute_dtype=resolve_dtype(compute_dtype))
    base = load_base_model(name_or_path, device_map=device_map, quantization_config=quant)
    base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    _fix_cpu_4bit_packing(base)
    return base


def is_4bit(base: nn.Module) -> bool:
    inner = unwrap(base)
    return bool(getattr(inner, "is_loaded_in_4bit", False)) or any(
        type(m).__name__ in ("Linear4bit", "LinearNF4", "LinearFP4") for m in inner.modules())


def is_peft(base: nn.Module) -> bool:
    return hasattr(base, "disable_adapter") and hasattr(base, "peft_config")


def _is_zero3(params: Iterable[torch.Tensor]) -> bool:
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
        if _is_zero3(base.parameters()):
            raise ConfigError("medusa2.self_distill with lora.full_finetune is not supported under ZeRO-3 "
                              "(a partitioned teacher has no forward outside the engine); use LoRA or ZeRO-2")
        reference = copy.deepcopy(unwrap(base)).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    for p in list(base.parameters()) + list(model.heads.parameters()):
        p.requires_grad_(True)
    return reference


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


# ---------------------------------------------------------------------------------------------- losses
def _next_token_mask(labels: torch.Tensor) -> torch.Tensor:
    """``labels [B, T]`` -> bool ``[B, T - 1]``: position t predicts an assistant token (labels[t+1])."""
    return labels[:, 1:] != IGNORE_INDEX


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy on assistant tokens.

    logits ``[B, T, V]`` (position t predicts t+1), labels ``[B, T]`` (unshifted, -100 = ignored) -> scalar.
    Zero (with a graph) when no position is labelled.
    """
    shifted = logits[:, :-1].float()  # [B, T-1, V]
    target = labels[:, 1:]  # [B, T-1]
    if not bool((target != IGNORE_INDEX).any()):
        return shifted.sum() * 0.0
    return F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), target.reshape(-1), ignore_index=IGNORE_INDEX)


def self_distill_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``KL(p_teacher || p_student)`` averaged over the positions that predict an assistant token.

    student_logits, teacher_logits ``[B, T, V]``; labels ``[B, T]`` (unshifted). With temperature tau,
    ``p = softmax(logits / tau)`` for both and the KL is multiplied by ``tau**2`` (so its gradient scale
    does not depend on tau). Exactly 0 when the two logits are equal. Scalar.
    """
    if temperature <= 0:
        raise ConfigError(f"medusa2.distill_temperature: must be > 0, got {temperature}")
    mask = _next_token_mask(labels)  # [B, T-1]
    s = student_logits[:, :-1][mask].float() / temperature  # [N, V]
    t = teacher_logits[:, :-1][mask].detach().float() / temperature  # [N, V]
    if s.shape[0] == 0:
        return student_logits.sum() * 0.0
    log_ps, log_pt = F.log_softmax(s, dim=-1), F.log_softmax(t, dim=-1)
    kl = (log_pt.exp() * (log_pt - log_ps)).sum(-1)  # [N]
    return kl.mean() * temperature**2


def medusa2_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    heads_loss: torch.Tensor,
    lambda0: float,
    teacher_logits: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``L = L_LM + lambda0 * L_heads``.

    logits ``[B, T, V]``: the backbone's own (student) logits; labels ``[B, T]`` unshifted; heads_loss: the
    MEDUSA-1 heads loss (``sum_k decay^k CE_k``, computed in chunks by ``medusa.training.losses``);
    lambda0: ``lambda_0(step)`` from :mod:`medusa.training.schedules`. ``L_LM`` is the next-token CE on
    assistant tokens, or, given ``teacher_logits [B, T, V]``, ``self_distill_kl(logits, teacher_logits)``.
    Returns the scalar loss and float metrics (``lm_loss``, ``heads_loss``, ``lambda0``).
    """
    if teacher_logits is None:
        lm = causal_lm_loss(logits, labels)
    else:
        lm = self_distill_kl(logits, teacher_logits, labels, temperature)
    loss = lm + lambda0 * heads_loss
    metrics = {"lm_loss": float(lm.detach()), "heads_loss": float(heads_loss.detach()), "lambda0": float(lambda0)}
    if teacher_logits is not None:
        metrics["distill_kl"] = metrics["lm_loss"]
    return loss, metrics


# ---------------------------------------------------------------------------------------------- optimizer
def _norm_param_ids(model: nn.Module) -> set[int]:
    ids = set()
    for module in model.modules():
        name = type(module).__name__.lower()
        if isinstance(module, (nn.LayerNorm, nn.GroupNorm)) or "norm" in name:
            ids.update(id(p) for p in module.parameters(recurse=False))
    return ids


def param_groups(
    model: MedusaModel, lr: float, weight_decay: float = 0.0, lr_multiplier: float = 4.0
) -> list[dict[str, Any]]:
    """AdamW parameter groups: ``backbone_decay``, ``backbone_no_decay`` at ``lr`` and ``heads_decay``,
    ``heads_no_decay`` at ``lr * lr_multiplier``. Only trainable parameters; every parameter of
    ``model.heads`` (weights and biases) is in a heads group; biases, norm weights and other 1-D
    parameters get no weight decay. Empty groups are left out; each group carries a ``name``."""
    norm_ids = _norm_param_ids(model)
    head_ids = {id(p) for p in model.heads.parameters()}
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
    groups = []
    for name, params in buckets.items():
        if params:
            groups.append({"name": name, "params": params,
                           "lr": lr * lr_multiplier if name.startswith("heads") else lr,
                           "weight_decay": 0.0 if name.endswith("no_decay") else weight_decay})
    return groups


# ---------------------------------------------------------------------------------------------- heads
@contextlib.contextmanager
def gathered(params: Iterable[torch.Tensor], modifier_rank: int | None = None) -> Iterator[None]:
    """Gather DeepSpeed ZeRO-3 partitioned parameters for the body (a no-op for ordinary tensors).

    ``modifier_rank``: the rank whose in-place changes are kept and broadcast on exit (None: read only).
    """
    partitioned = [p for p in params if hasattr(p, "ds_id") or hasattr(p, "ds_tensor")]
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

    The checkpoint must have the same num_heads / num_layers / head_type / hidden_size / vocab_size.
    """
    config = MedusaConfig.load(path)
    for key in ("num_heads", "num_layers", "head_type", "hidden_size", "vocab_size"):
        theirs, ours = getattr(config, key), getattr(model.config, key)
        if theirs != ours:
            raise CheckpointError(f"heads.init_from: {path} has {key}={theirs!r} but the recipe builds {ours!r}")
    weights = Path(path) / WEIGHTS_NAME
    state = read_heads_file(weights)
    check_state_keys(model.heads, state, source=str(weights))
    params = list(model.heads.parameters())
    with gathered(params, modifier_rank=0), torch.no_grad():
        for name, tensor in model.heads.state_dict(keep_vars=True).items():
            tensor.copy_(state[name].to(tensor.dtype))


# ---------------------------------------------------------------------------------------------- export
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
            raise CheckpointError("cannot merge QLoRA adapters: the base model's path is unknown; pass base_name_or_path")
        adapters = {k: v.detach().cpu() for k, v in get_peft_model_state_dict(base).items()}
        lora_config = copy.deepcopy(base.peft_config["default"])
        fresh = load_base_model(source, dtype=dtype)
        wrapped = get_peft_model(fresh, lora_config)
        result = set_peft_model_state_dict(wrapped, adapters)
        if getattr(result, "unexpected_keys", None):
            raise CheckpointError(f"QLoRA merge: adapter tensors {result.unexpected_keys[:3]} do not fit {source}")
        merged = wrapped.merge_and_unload()
    else:
        merged = base.merge_and_unload()
    if model.heads.lm_heads is None:
        model.heads.set_shared_lm_head(lm_head_of(merged))
    merged.eval()
    return MedusaModel(merged, model.heads, MedusaConfig(**model.config.to_dict()), tree=model.tree)


def save_merged(
    model: MedusaModel,
    out_dir: str,
    tokenizer: Any = None,
    recipe: dict[str, Any] | None = None,
    base_name_or_path: str | None = None,
    dtype: str | torch.dtype = torch.float32,
) -> MedusaModel:
    """Merge (see :func:`merge_backbone`) and write heads + merged backbone (+ tokenizer, recipe) to
    ``out_dir`` so that ``MedusaModel.from_pretrained(out_dir)`` loads it with no other files."""
    merged = merge_backbone(model, base_name_or_path=base_name_or_path, dtype=dtype)
    if recipe is not None:
        merged.config.recipe = recipe
    merged.save_pretrained(out_dir, save_base=True, tokenizer=tokenizer)
    return merged


def method() -> Any:
    """The MEDUSA-2 ``Method`` for ``medusa.training.train`` (see :mod:`medusa.training.medusa2_run`)."""
    from medusa.training.medusa2_run import make_method

    return make_method()
