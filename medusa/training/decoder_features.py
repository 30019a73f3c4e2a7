"""The frozen base's EAGLE-3 features for training, computed as the bfloat16 decoder computes them
(``train.base_features: decoder``).

By default a training step runs the base through the model's own code (bf16 autocast over float32 weights on a
CPU with native bf16). Here a bfloat16 copy of the model runs each row's tokens as a decoding run's prefill
does (:func:`medusa.decoding.kv_cache.dynamic_prefill`): the first tokens through the model's own code, the
rest in pieces through the native bf16 body (:mod:`medusa.modeling.native_body`). The drafter then trains on
exactly the features it reads when it decodes one row in bf16; on SmolLM2-135M real batches' features run
1.4-1.5x faster than through the autocast path, a training step ~12% faster (docs/results/data-plan.md,
round 12). Memory: the copy (made in float32, then cast) and the native body's packed weights sit beside the
training model on every process (~0.6 GB for SmolLM2-135M). Inference only: the copy is frozen and never
trained; a teacher loss (which needs the base's last hidden state) is refused with it.
"""

from __future__ import annotations

import copy

import torch

from medusa.decoding.kv_cache import dynamic_prefill
from medusa.errors import ConfigError
from medusa.modeling.model import MedusaModel
from medusa.native import fixed_weights


def decoder_copy(model: MedusaModel) -> MedusaModel:
    """A frozen bfloat16 copy of ``model`` (base and heads; the heads are never called) whose prefill runs
    through the native bf16 body; refused with one line where it cannot."""
    if getattr(model.heads, "feature_layers", None) is None:
        raise ConfigError("train.base_features: decoder computes EAGLE-3 features; these heads take none "
                          "(use base_features: model)")
    dec = copy.deepcopy(model).to(torch.bfloat16).eval()
    for p in dec.parameters():
        p.requires_grad_(False)
    if not dec.prefill_chunk():
        raise ConfigError("train.base_features: decoder needs the native bf16 body (a Llama / Qwen2 base on "
                          "a CPU with native bf16); use base_features: model")
    return dec


def decoder_features(dec: MedusaModel, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor) -> torch.Tensor:
    """The features ``[B, T, F]`` (float32) of each row's attended tokens ``input_ids [B, T]`` (one
    contiguous run of ones in ``attention_mask [B, T]``: left or right padding), each row prefilled alone as
    a decoding run prefills its prompt; padded positions get zeros (the loss masks them)."""
    b, t = input_ids.shape
    out: torch.Tensor | None = None
    with torch.no_grad(), fixed_weights.during():
        for row in range(b):
            where = attention_mask[row].nonzero().flatten()  # [n]
            if where.numel() == 0:
                continue
            lo, hi = int(where[0]), int(where[-1]) + 1
            if hi - lo != where.numel():
                raise ValueError(f"decoder_features: row {row}'s attention mask is not one run of ones")
            ids = input_ids[row:row + 1, lo:hi]  # [1, n]
            _, _, feats, _ = dynamic_prefill(dec, ids, torch.ones_like(ids), 1, 0,
                                             torch.bfloat16)  # feats [1, n, F]
            if out is None:
                out = torch.zeros(b, t, feats.shape[-1], dtype=torch.float32, device=input_ids.device)
            out[row, lo:hi] = feats[0].float()
    if out is None:
        raise ValueError("decoder_features: every row of the batch is padding")
    return out


__all__ = ["decoder_copy", "decoder_features"]
