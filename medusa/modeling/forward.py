"""One pass of the base body with the heads' inputs (``MedusaModel.forward``): the body, the base logits at
chosen positions, the features the heads read and, for parallel heads, their logits. :class:`BodyParts`
resolves what the pass needs from the base; ``forward`` resolves it per call, a decoding run once
(:class:`TreeVerifier`), so its steps go from the step straight into the HF body and the LM head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from medusa.decoding.attention import body_mask
from medusa.decoding.drafter import Drafter
from medusa.decoding.hf import CACHE_KWARG
from medusa.modeling import native_body
from medusa.modeling.base import (
    base_logits,
    decoder_of,
    lm_head_of,
    logits_post_processed,
    text_config,
)
from medusa.modeling.protocol import Heads


@dataclass
class MedusaOutput:
    logits: torch.Tensor  # base logits [B, P, V] at the requested positions (P = T by default)
    head_logits: torch.Tensor | None  # [K, B, P, V]
    # [B, T, d] the last hidden state (post final norm), all positions; heads with ``feature_layers``:
    # [B, T, len(feature_layers) * d], the base's hidden_states[i] (0 = embeddings) concatenated over them
    hidden_states: torch.Tensor
    past_key_values: Any = None


def gather_positions(x: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    """``x [B, T, d]`` at ``positions`` (``[P]`` shared by all rows or ``[B, P]``) -> ``[B, P, d]``."""
    if positions is None:
        return x
    if positions.dim() == 1:
        return x.index_select(1, positions.to(x.device))
    idx = positions.to(x.device).unsqueeze(-1).expand(-1, -1, x.shape[-1])
    return torch.gather(x, 1, idx)


@dataclass(frozen=True)
class BodyParts:
    """What a forward needs from the base: resolved per call by ``MedusaModel.forward``, once per decoding
    run by :class:`TreeVerifier`, so a decode step runs the HF body and the LM head without looking them up
    again. The decoding run also settles once whether the mask needs windowing and whether the native body
    can apply (``windowed`` / ``native`` False), so its steps enter neither module where they never act;
    ``forward`` leaves both True: ``body_mask`` and ``native_for`` decide per call, as for any caller."""

    body: nn.Module  # decoder_of(base): the transformer body, post-norm output
    head: nn.Module  # lm_head_of(base)
    base: nn.Module  # the base model as held (a peft wrapper included)
    config: Any  # its text config
    post: bool  # base_logits post-processes the head's output (logit_scale / logits_scaling / soft cap)
    windowed: bool  # False: no sliding window, the mask goes to the body as it is (else attention.body_mask)
    native: bool  # False: never the native body (else native_body.native_for decides per call)
    feature_layers: Any  # the drafter's base hidden-state indices, or None (the last hidden state)


def run_body(parts: BodyParts, heads: Heads, input_ids: torch.Tensor | None, attention_mask: Any,
             position_ids: torch.Tensor | None, past_key_values: Any, use_cache: bool | None,
             positions: torch.Tensor | None, compute_heads: bool, **kwargs: Any) -> MedusaOutput:
    """:meth:`MedusaModel.forward` on resolved :class:`BodyParts`."""
    layers = parts.feature_layers  # drafters that read several base layers
    mask = body_mask(parts.base, attention_mask) if parts.windowed else attention_mask
    native = None
    if parts.native and not kwargs and use_cache and position_ids is not None:
        native = native_body.native_for(parts.base, parts.body, parts.config, input_ids, mask,
                                         past_key_values)
    if native is not None:  # a tree step in bfloat16 through the kernels (medusa.modeling.native_body)
        last, states = native_body.forward(native, input_ids, mask, position_ids, past_key_values,
                                           hidden_states=layers is not None)
        cache = past_key_values
    else:
        if layers is not None:
            kwargs["output_hidden_states"] = True
        out = parts.body(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                         use_cache=use_cache, **{CACHE_KWARG: past_key_values}, **kwargs)
        last, states, cache = out.last_hidden_state, out.hidden_states, out.get(CACHE_KWARG)  # [B, T, d]
    picked = gather_positions(last, positions)  # [B, P, d]
    # the features the heads read: the last hidden state, or the chosen layers' concatenated [B, T, n * d]
    hidden = last if layers is None else torch.cat([states[i] for i in layers], dim=-1)
    if parts.post:
        logits = base_logits(parts.base, picked)  # [B, P, V]
    else:  # base_logits without post-processing: the head alone
        weight = parts.head.weight
        logits = parts.head(picked.to(weight.dtype) if weight.is_floating_point() else picked)
    # None from heads that also read draft tokens (Hydra) and from a sequential drafter (EAGLE-3):
    # decoding and training build their inputs.
    parallel = compute_heads and not isinstance(heads, Drafter)
    head_logits = heads.hidden_logits(picked) if parallel else None  # [K, B, P, V]
    return MedusaOutput(logits, head_logits, hidden, cache)


def body_parts(base: nn.Module, heads: Heads, windowed: bool = True, native: bool = True) -> BodyParts:
    """What a forward of ``base`` under ``heads`` needs, resolved now (``windowed`` / ``native``: see
    :class:`BodyParts`)."""
    return BodyParts(body=decoder_of(base), head=lm_head_of(base), base=base, config=text_config(base),
                     post=logits_post_processed(base), windowed=windowed, native=native,
                     feature_layers=getattr(heads, "feature_layers", None))


@dataclass(frozen=True)
class TreeVerifier:
    """A model's forward with its base resolved once (``MedusaModel.tree_verifier``): called as the model is
    by a decoding run's steps (:func:`medusa.decoding.step.verify`)."""

    parts: BodyParts
    heads: Heads

    def __call__(self, input_ids: torch.Tensor, attention_mask: Any = None, position_ids: Any = None,
                 past_key_values: Any = None, use_cache: bool | None = None, positions: Any = None,
                 compute_heads: bool = True, **kwargs: Any) -> MedusaOutput:
        return run_body(self.parts, self.heads, input_ids, attention_mask, position_ids, past_key_values,
                        use_cache, positions, compute_heads, **kwargs)


__all__ = ["BodyParts", "MedusaOutput", "TreeVerifier", "body_parts", "gather_positions", "run_body"]
