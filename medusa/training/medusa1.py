"""MEDUSA-1 (``method: medusa1``): fp32 heads trained on a frozen backbone's hidden states.

Plain functions (:func:`setup_model`, :func:`compute_loss`, :func:`save_final`), and :data:`METHOD`, the
:class:`~medusa.training.loop.TrainingMethod` the loop calls them through. The trained module is
:class:`HeadsLoss` (the heads, whose forward is the chunked head loss), so DDP / DeepSpeed / FSDP see and
reduce the heads' gradients.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from medusa.config import Recipe
from medusa.decoding.drafter import Drafter
from medusa.errors import ConfigError
from medusa.modeling.base import decoder_of, lm_head_of
from medusa.modeling.config import MedusaConfig
from medusa.modeling.eagle3 import base_states
from medusa.modeling.heads import BaseRef
from medusa.modeling.model import MedusaModel, build_heads
from medusa.training.decoder_features import decoder_copy, decoder_features
from medusa.training.eagle3 import Eagle3Loss
from medusa.training.losses import Teacher, TeacherFn, medusa_head_loss
from medusa.training.setup import backbone_bf16, load_backbone, param_groups


class HeadsLoss(nn.Module):
    """The trained module of MEDUSA-1: the heads, whose forward is the chunked head loss.

    Returns ``(loss, stats [STATS_ROWS, K])``: per-head CE sum, top-1 / top-5 hits, target count, draft
    misses. Hydra heads are teacher-forced on the batch's own tokens (``input_ids``). With ``teacher_loss``
    w > 0 the frozen base LM head (``teacher_head``, kept outside the module tree) gives the KL targets.
    """

    def __init__(self, heads: nn.Module, decay: float, chunk_size: int, teacher_loss: float = 0.0,
                 teacher_head: nn.Module | None = None) -> None:
        super().__init__()
        self.heads = heads
        self.decay, self.chunk_size, self.teacher_loss = decay, chunk_size, teacher_loss
        self._teacher_head = BaseRef(teacher_head)  # the base's LM head: not a trained submodule

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor,
                input_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        teacher = None
        if self.teacher_loss > 0:
            teacher = Teacher(hidden, draft_teacher_logits(self._teacher_head.module, self.heads),
                              self.teacher_loss)
        inputs = self.heads.teacher_inputs(hidden, input_ids)  # hidden, or Hydra's wide input
        out = medusa_head_loss(inputs, labels, self.heads.head_logits, self.heads.num_heads,
                               decay=self.decay, chunk_size=self.chunk_size,
                               label_map=self.heads.target_to_draft(), teacher=teacher)
        return out.loss, out.stats()


def draft_teacher_logits(lm_head: nn.Module, heads: nn.Module) -> TeacherFn:
    """The teacher's logits: the base LM head on hidden states ``[N, d]`` -> ``[N, V]``, or, when ``heads``
    have a draft vocabulary, only its ``heads.token_map`` rows -> ``[N, N_draft]`` (one ``[N_draft, d]``
    matmul; the rows come from :meth:`~medusa.modeling.draft_vocab.DraftVocab.shared_rows`, cached while the
    frozen weight is unchanged)."""
    if heads.token_map is None:
        return lambda h: lm_head(h.to(lm_head.weight.dtype))

    def logits(h: torch.Tensor) -> torch.Tensor:
        weight, bias = heads.vocab.shared_rows(lm_head, heads.token_map)  # [N_draft, d], [N_draft] or None
        return F.linear(h.to(weight.dtype), weight, bias)

    return logits


def check_init_from(recipe: Recipe) -> None:
    """``heads.init_from``'s heads must be the recipe's: same count, layers and family (a drafter is not
    MEDUSA heads), the same hydra projection, and the recipe's ``feature_layers`` where it gives them (an
    explicit choice is never silently replaced by the checkpoint's)."""
    h = recipe.heads
    theirs = MedusaConfig.load(h.init_from)
    wanted: dict[str, Any] = {"num_heads": h.num_heads, "num_layers": h.num_layers, "head_type": h.head_type}
    if h.head_type == "hydra":
        wanted["hydra_projection"] = h.hydra_projection
    if h.feature_layers is not None:
        wanted["feature_layers"] = list(h.feature_layers)
    for key, ours in wanted.items():
        got = getattr(theirs, key)
        got = list(got) if isinstance(got, (list, tuple)) else got
        if got != ours:
            raise ConfigError(f"heads.init_from: {h.init_from} has {key} {got!r}, the recipe's heads.{key} "
                              f"is {ours!r}: set heads.{key}: {got!r}, or init from other heads")


def setup_model(recipe: Recipe, device: torch.device) -> tuple[MedusaModel, HeadsLoss]:
    """Frozen backbone (eval mode, no grads) + fp32 heads initialised from the LM head (or ``init_from``)."""
    h = recipe.heads
    if h.init_from:
        check_init_from(recipe)  # before the base loads
    base = load_backbone(recipe, device)
    if h.init_from:
        model = MedusaModel.from_pretrained(h.init_from, base_model=base, heads_dtype=torch.float32)
    else:
        model = MedusaModel.from_base(base, num_heads=h.num_heads, num_layers=h.num_layers,
                                      head_type=h.head_type, heads_dtype=torch.float32,
                                      hydra_projection=h.hydra_projection, feature_layers=h.feature_layers)
    model.freeze_base()
    model.base_model.eval()
    model.heads.to(device=device, dtype=torch.float32).train()
    if isinstance(model.heads, Drafter):  # the drafter's training-time-test unroll (medusa.training.eagle3)
        teacher = (draft_teacher_logits(lm_head_of(model.base_model), model.heads) if h.teacher_loss > 0
                   else None)
        return model, Eagle3Loss(model.heads, h.decay, h.teacher_loss, teacher)
    return model, HeadsLoss(model.heads, h.decay, recipe.train.loss_chunk_size, h.teacher_loss,
                            lm_head_of(model.base_model))


def backbone_hidden(model: MedusaModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Last hidden state ``[B, T, d]`` of the frozen backbone, computed without autograd."""
    with torch.no_grad():
        out = decoder_of(model.base_model)(input_ids=batch["input_ids"],
                                           attention_mask=batch["attention_mask"], use_cache=False)
    return out.last_hidden_state


def compute_loss(model: MedusaModel, trainable: nn.Module, batch: dict[str, torch.Tensor],
                 bf16_base: bool = False,
                 decoder: MedusaModel | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The heads' loss on the frozen backbone's hidden states (``batch["hidden"]`` when they come from the
    hidden-state cache; eagle3 heads: the fused layers' features ``[B, T, 3d]``). Returns
    ``(loss, stats [STATS_ROWS, K])``. ``bf16_base`` (:func:`~medusa.training.setup.backbone_bf16`): the
    frozen backbone runs under bf16 autocast, as it does when it fills a bf16 hidden-state cache; its outputs
    reach the heads as float32. ``decoder`` (``train.base_features: decoder``, eagle3 heads): the features
    come from this bf16 copy of the model, as decoding computes them
    (:mod:`medusa.training.decoder_features`)."""
    layers = getattr(model.heads, "feature_layers", None)
    base_precision = (torch.autocast(model.base_model.device.type, dtype=torch.bfloat16) if bf16_base
                      else contextlib.nullcontext())  # an outer autocast (evaluation's) still applies
    if layers is not None:
        if "hidden" in batch:  # the cache holds the fused layers only (no teacher: checked in the recipe)
            return trainable(batch["hidden"], batch["labels"], batch["input_ids"], batch["attention_mask"])
        if decoder is not None:  # no teacher: checked in the recipe
            features = decoder_features(decoder, batch["input_ids"], batch["attention_mask"])  # [B, T, 3d]
            return trainable(features, batch["labels"], batch["input_ids"], batch["attention_mask"])
        with base_precision:
            features, last = base_states(model.base_model, batch["input_ids"], batch["attention_mask"],
                                         layers)  # [B, T, 3d], [B, T, d]
        return trainable(features.float(), batch["labels"], batch["input_ids"], batch["attention_mask"],
                         last.float())
    if "hidden" in batch:
        return trainable(batch["hidden"], batch["labels"], batch["input_ids"])
    with base_precision:
        hidden = backbone_hidden(model, batch)  # [B, T, d]
    return trainable(hidden.float(), batch["labels"], batch["input_ids"])


def save_final(accelerator: Any, model: MedusaModel, trainable: nn.Module, recipe: Recipe,
               path: Path) -> None:
    """Gather the heads (also from ZeRO-3 shards) and write our checkpoint format, with the recipe."""
    state = accelerator.get_state_dict(trainable)  # every process must call this
    if accelerator.is_main_process:
        cfg = model.config
        heads = build_heads(model.base_model, cfg.hidden_size, cfg.vocab_size, cfg.num_heads, cfg.num_layers,
                            cfg.head_type, cfg.draft_vocab, hydra_projection=cfg.hydra_projection,
                            feature_layers=cfg.feature_layers)
        heads.load_state_dict({k.removeprefix("heads."): v.detach().float().cpu() for k, v in state.items()})
        final = MedusaModel(model.base_model, heads, cfg, tree=None)
        final.config.recipe = recipe.to_dict()
        final.save_pretrained(path, overwrite=True)  # the run's own final/ (output_dir checked at the start)
    accelerator.wait_for_everyone()


class Medusa1:
    """MEDUSA-1 as the loop's :class:`~medusa.training.loop.TrainingMethod`: the heads alone are trained
    (at ``train.lr``); the loss state is the bf16 copy that computes the features under
    ``train.base_features: decoder`` (else None)."""

    name = "medusa1"

    def check_recipe(self, recipe: Recipe) -> None:
        """Nothing beyond the recipe's own validation."""

    def setup_model(self, recipe: Recipe, device: torch.device,
                    total_steps: int) -> tuple[MedusaModel, HeadsLoss, MedusaModel | None]:
        """The model, the trained module, and the loss state: the bf16 copy that computes the features
        under ``train.base_features: decoder``, else None."""
        model, trainable = setup_model(recipe, device)
        return model, trainable, decoder_copy(model) if recipe.train.base_features == "decoder" else None

    def param_groups(self, recipe: Recipe, trainable: nn.Module) -> list[dict[str, Any]]:
        return param_groups(trainable, recipe.train.lr, recipe.train.weight_decay, lr_multiplier=1.0)

    def compute_loss(self, recipe: Recipe, model: MedusaModel, trainable: nn.Module,
                     batch: dict[str, torch.Tensor], step: int,
                     state: MedusaModel | None) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        return (*compute_loss(model, trainable, batch, backbone_bf16(recipe), state), {})

    def save_final(self, accelerator: Any, model: MedusaModel, trainable: nn.Module, recipe: Recipe,
                   path: Path) -> None:
        save_final(accelerator, model, trainable, recipe, path)

    def trained_model(self, accelerator: Any, model: MedusaModel, trainable: nn.Module) -> MedusaModel:
        """``model`` with the trained heads (the prepared module's)."""
        model.heads = accelerator.unwrap_model(trainable).heads
        return model


METHOD = Medusa1()
