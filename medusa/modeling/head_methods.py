"""Methods every head family (:class:`medusa.modeling.heads.MedusaHeads`,
:class:`medusa.modeling.hydra.HydraHeads`) shares, written once and assigned in each class body: the
draft-vocabulary mapping (delegated to the heads' :class:`medusa.modeling.draft_vocab.DraftVocab`), one head's
logits and its top-n. Plain functions of the heads, no base class."""

from __future__ import annotations

from typing import Any

import torch


def draft_vocab_size(heads: Any) -> int:
    """N, the draft vocabulary's size (0: the full vocabulary)."""
    return heads.vocab.size


def shared_lm_head(heads: Any) -> torch.nn.Module | None:
    """The base LM head the heads apply (None: they have their own projections); held in a BaseRef, outside
    the heads' parameters."""
    return heads._shared.module


def set_token_map(heads: Any, token_map: torch.Tensor) -> None:
    """Set the draft vocabulary's ``token_map [N]`` (distinct target ids in ``[0, V)``)."""
    heads.vocab.set_map(heads.token_map, token_map)


def target_to_draft(heads: Any) -> torch.Tensor | None:
    """``[V]`` int64: the draft id of each target id, -1 outside the draft vocabulary (None: full)."""
    return heads.vocab.target_to_draft(heads.token_map)


def to_target(heads: Any, draft_ids: torch.Tensor) -> torch.Tensor:
    """Draft ids (any shape) -> target ids (identity with the full vocabulary)."""
    return heads.vocab.to_target(heads.token_map, draft_ids)


def to_target_logits(heads: Any, logits: torch.Tensor) -> torch.Tensor:
    """Draft logits ``[..., N]`` -> ``[..., V]``, -inf outside the draft vocab (identity when full)."""
    return heads.vocab.to_target_logits(heads.token_map, logits)


def project(heads: Any, k: int, x: torch.Tensor) -> torch.Tensor:
    """Head k's W2 on ``x [..., d]`` -> ``[..., N]`` draft logits (``[..., V]`` with the full vocab): its own
    projection, or the base LM head (its ``token_map`` rows with a draft vocabulary)."""
    if heads.lm_heads is not None:
        head = heads.lm_heads[k]
        return head(x.to(head.weight.dtype))
    proj = heads.shared_lm_head
    if heads.token_map is None:
        return proj(x.to(proj.weight.dtype) if proj.weight.is_floating_point() else x)
    weight, bias = heads.vocab.shared_rows(proj, heads.token_map)  # [N, d], [N] or None
    return torch.nn.functional.linear(x.to(weight.dtype), weight, bias)


def head_logits(heads: Any, k: int, x: torch.Tensor) -> torch.Tensor:
    """Logits of head k (0-based) over its own vocabulary: ``[..., input] -> [..., N]`` (N = V when full)."""
    return heads.project(k, heads.transform(k, x))


@torch.no_grad()
def head_topk(heads: Any, k: int, x: torch.Tensor, n: int) -> torch.Tensor:
    """Head k's top-``n`` TARGET ids: ``[..., input] -> [..., n]`` (with a draft vocabulary the top-n of the
    N draft logits mapped back; n > N falls back to the -inf-filled target logits)."""
    logits = heads.head_logits(k, x)  # [..., N]
    if heads.token_map is None or n > heads.draft_vocab:
        return heads.to_target_logits(logits).topk(n, dim=-1).indices
    return heads.token_map[logits.topk(n, dim=-1).indices]


# what each head class assigns, in this order: draft_vocab and shared_lm_head (properties), set_token_map,
# target_to_draft, to_target, to_target_logits, project, head_logits, head_topk
SHARED = (property(draft_vocab_size), property(shared_lm_head), set_token_map, target_to_draft, to_target,
          to_target_logits, project, head_logits, head_topk)

__all__ = ["SHARED", "draft_vocab_size", "head_logits", "head_topk", "project", "set_token_map",
           "shared_lm_head", "target_to_draft", "to_target", "to_target_logits"]
