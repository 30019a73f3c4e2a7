"""``Heads``: what every family of parallel heads provides (MEDUSA heads:
:class:`~medusa.modeling.heads.MedusaHeads`; Hydra heads: :class:`~medusa.modeling.hydra.HydraHeads`). The
other kind of drafter, a sequential one (EAGLE-3: :class:`~medusa.modeling.eagle3.Eagle3Heads`), provides
:class:`medusa.decoding.drafter.Drafter` instead and none of these members.

The model, training and export speak to heads through this interface only. ``x`` below is the heads'
input: the base hidden state ``[..., d]`` for MEDUSA heads, the wide ``[..., d * (K+1)]`` input for Hydra
heads (:meth:`Heads.teacher_inputs` builds it for training). Both families compose one
:class:`~medusa.modeling.draft_vocab.DraftVocab` (``heads.vocab``) for their draft vocabulary.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from medusa.modeling.draft_vocab import DraftVocab


class Heads(Protocol):
    """K draft heads over a base model. Logits over "their own vocabulary" are ``[..., N]`` draft ids with a
    draft vocabulary of N tokens (``token_map [N]``: draft id -> target id), ``[..., V]`` target ids
    without; ``forward`` / ``topk``-style methods always speak target ids."""

    head_type: str  # "linear" | "shared_lm_head" | "hydra"
    num_heads: int  # K
    num_layers: int
    hidden_size: int  # d
    vocab_size: int  # V, the base vocabulary
    vocab: DraftVocab
    token_map: torch.Tensor | None  # [N] int64 buffer (saved); None with the full vocabulary
    lm_heads: nn.ModuleList | None  # own W2 per head; None when the heads apply the base LM head

    @property
    def draft_vocab(self) -> int:
        """N (0: the full vocabulary)."""

    # ------------------------------------------------------------------ logits
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, T, .] -> [K, B, T, V]`` over target ids (-inf outside a draft vocabulary)."""

    def head_logits(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """Head k (0-based) over its own vocabulary: ``[..., .] -> [..., N]``."""

    def draft_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Every head over its own vocabulary: ``[B, T, .] -> [K, B, T, N]``."""

    def head_topk(self, k: int, x: torch.Tensor, n: int) -> torch.Tensor:
        """Head k's top-``n`` target ids: ``[..., .] -> [..., n]``."""

    def project(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """Head k's W2: ``[..., d] -> [..., N]``."""

    def transform(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """Head k's layers before W2: ``[..., .] -> [..., d]``."""

    # ------------------------------------------------------------------ inputs and the base model
    def teacher_inputs(self, hidden: torch.Tensor, input_ids: torch.Tensor | None) -> torch.Tensor:
        """Training input from ``hidden [B, T, d]`` and the sequence's own tokens ``input_ids [B, T]``."""

    def hidden_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """``[K, B, T, V]`` from the base hidden state alone, None for heads that also read draft tokens."""

    def bind_base(self, base_model: nn.Module) -> None:
        """Read ``base_model`` (its LM head when the heads have no W2 of their own, what else they read)."""

    @property
    def shared_lm_head(self) -> nn.Module | None:
        """The base LM head the heads apply (None: own W2s)."""

    def set_shared_lm_head(self, lm_head: nn.Module | None) -> None: ...

    # ------------------------------------------------------------------ draft vocabulary
    def set_token_map(self, token_map: torch.Tensor) -> None:
        """Set ``token_map [N]`` (distinct target ids in ``[0, V)``)."""

    def restrict_vocab(self, token_map: torch.Tensor) -> None:
        """Full vocabulary -> the draft vocabulary ``token_map [N]``, in place."""

    def target_to_draft(self) -> torch.Tensor | None:
        """``[V]`` int64: each target id's draft id, -1 outside (None: full vocabulary)."""

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids (any shape) -> target ids."""

    def to_target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """``[..., N] -> [..., V]``, -inf outside the draft vocabulary."""

    def init_from_lm_head(self, weight: torch.Tensor) -> None:
        """Own W2s <- the base LM head weight ``[V, d]`` (its ``token_map`` rows)."""

    # ------------------------------------------------------------------ nn.Module
    def parameters(self, recurse: bool = True): ...

    def state_dict(self, *args, **kwargs): ...


__all__ = ["Heads"]
