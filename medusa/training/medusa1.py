"""MEDUSA-1 (``method: medusa1``): fp32 heads trained on a frozen backbone's hidden states.

Plain functions the loop (:mod:`medusa.training.loop`) calls: :func:`setup_model`, :func:`compute_loss`,
:func:`save_final`. The trained module is :class:`HeadsLoss` (the heads, whose forward is the chunked
head loss), so DDP / DeepSpeed / FSDP see and reduce the heads' gradients.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from medusa.config import Recipe
from medusa.errors import ConfigError
from medusa.modeling.base import decoder_of
from medusa.modeling.heads import MedusaHeads
from medusa.modeling.model import MedusaModel
from medusa.training.losses import medusa_head_loss
from medusa.training.setup import load_backbone


class HeadsLoss(nn.Module):
    """The trained module of MEDUSA-1: the heads, whose forward is the chunked head loss.

    Returns ``(loss, stats [STATS_ROWS, K])``: per-head CE sum, top-1 / top-5 hits, target count, draft
    misses.
    """

    def __init__(self, heads: nn.Module, decay: float, chunk_size: int) -> None:
        super().__init__()
        self.heads = heads
        self.decay, self.chunk_size = decay, chunk_size

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = medusa_head_loss(hidden, labels, self.heads.head_logits, self.heads.num_heads,
                               decay=self.decay, chunk_size=self.chunk_size,
                               label_map=self.heads.target_to_draft())
        return out.loss, out.stats()


def setup_model(recipe: Recipe, device: torch.device) -> tuple[MedusaModel, HeadsLoss]:
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
    with torch.no_grad():
        out = decoder_of(model.base_model)(input_ids=batch["input_ids"],
                                           attention_mask=batch["attention_mask"], use_cache=False)
    return out.last_hidden_state


def compute_loss(model: MedusaModel, trainable: nn.Module,
                 batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The heads' loss on the frozen backbone's hidden states (``batch["hidden"]`` when they come from the
    hidden-state cache). Returns ``(loss, stats [STATS_ROWS, K])``."""
    hidden = batch["hidden"] if "hidden" in batch else backbone_hidden(model, batch)  # [B, T, d]
    return trainable(hidden, batch["labels"])


def save_final(accelerator: Any, model: MedusaModel, trainable: nn.Module, recipe: Recipe,
               path: Path) -> None:
    """Gather the heads (also from ZeRO-3 shards) and write our checkpoint format, with the recipe."""
    state = accelerator.get_state_dict(trainable)  # every process must call this
    if accelerator.is_main_process:
        cfg = model.config
        heads = MedusaHeads(cfg.hidden_size, cfg.vocab_size, cfg.num_heads, cfg.num_layers, cfg.head_type,
                            shared_lm_head=model.heads.shared_lm_head, draft_vocab=cfg.draft_vocab)
        heads.load_state_dict({k.removeprefix("heads."): v.detach().float().cpu() for k, v in state.items()})
        final = MedusaModel(model.base_model, heads, cfg, tree=None)
        final.config.recipe = recipe.to_dict()
        final.save_pretrained(path)
    accelerator.wait_for_everyone()
