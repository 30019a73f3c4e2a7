"""Hydra heads (Ankner et al., 2024): MEDUSA heads that also read the draft tokens before them on their path.

Head k (k = 1..K) predicts token t+k+1 from ``[h_t, e(x_{t+1}), ..., e(x_{t+k})]``: the base model's last
hidden state and the (frozen) base input embeddings of the k tokens before its target. Its first layer is
Hydra's conditioned ResBlock on that ``d * (k+1)`` wide input, ``R x + SiLU(W1 x + b)``, then
``num_layers - 1`` ResBlocks ``x + SiLU(W1 x + b)``, then the projection W2 (own, initialised from the
base LM head).

At initialisation a Hydra head ignores the draft tokens and is a fresh MEDUSA head: W1 and b are zero and
R = ``[I, 0, ..., 0]`` picks h_t, so head k's logits are the base LM head's on h_t (like every new MEDUSA
head). Unlike zankner/Hydra, whose extra layers are one module repeated (``[ResBlock] * (n-1)``), every
layer here has its own weights.

Heads take one *wide* input ``[..., d * (K+1)]`` = ``[h_t, e(x_{t+1}), ..., e(x_{t+K})]`` and head k
reads its first ``d * (k+1)`` features, so the MEDUSA head loss and calibration, which slice positions,
work on it unchanged. :meth:`HydraHeads.teacher_inputs` builds it from the data's own tokens (teacher
forcing); decoding builds it per tree node (:mod:`medusa.decoding.hydra_candidates`).

Tensor names: ``blocks.{k}.0.res.weight``, ``blocks.{k}.{l}.linear.weight|bias``, ``lm_heads.{k}.weight``.
"""

from __future__ import annotations

import torch
from torch import nn

from medusa.modeling.heads import ResBlock


class ConditionedResBlock(nn.Module):
    """``R x + SiLU(W1 x + b)``: ``x [..., d_in]`` -> ``[..., d]``; R starts as ``[I, 0]``, W1 and b zero."""

    def __init__(self, in_features: int, hidden_size: int) -> None:
        super().__init__()
        self.res = nn.Linear(in_features, hidden_size, bias=False)
        self.linear = nn.Linear(in_features, hidden_size)
        with torch.no_grad():
            self.res.weight.zero_()
            self.res.weight[:, :hidden_size].copy_(torch.eye(hidden_size))
            self.linear.weight.zero_()
            self.linear.bias.zero_()
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res(x) + self.act(self.linear(x))


class HydraHeads(nn.Module):
    """K Hydra heads. ``heads(wide [B, T, d * (K+1)]) -> logits [K, B, T, V]``.

    ``embedding``: the base model's input embedding module (held outside the module tree: it is the base
    model's and stays frozen).
    """

    head_type = "hydra"
    draft_vocab = 0  # no draft vocabulary (yet): heads predict over the full vocabulary
    token_map = None

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1,
                 embedding: nn.Module | None = None) -> None:
        super().__init__()
        if num_heads < 1 or num_layers < 1:
            raise ValueError(f"hydra heads need num_heads >= 1 and num_layers >= 1, "
                             f"got {num_heads}, {num_layers}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers = num_heads, num_layers
        self.blocks = nn.ModuleList(
            nn.Sequential(ConditionedResBlock(hidden_size * (k + 2), hidden_size),
                          *[ResBlock(hidden_size) for _ in range(num_layers - 1)])
            for k in range(num_heads)
        )
        self.lm_heads = nn.ModuleList(nn.Linear(hidden_size, vocab_size, bias=False)
                                      for _ in range(num_heads))
        # Held outside the module tree: the embedding belongs to the base model.
        self._embedding = [embedding]

    @property
    def shared_lm_head(self) -> None:
        """Hydra heads own their projections (same attribute as MedusaHeads')."""
        return None

    def target_to_draft(self) -> None:
        """The full vocabulary: no target -> draft id map (same method as MedusaHeads')."""
        return None

    @property
    def embedding(self) -> nn.Module:
        if self._embedding[0] is None:
            raise ValueError("hydra heads need the base model's input embeddings (set_embedding)")
        return self._embedding[0]

    def set_embedding(self, embedding: nn.Module) -> None:
        self._embedding[0] = embedding

    @property
    def input_width(self) -> int:
        """Features of the wide input: ``d * (K+1)``."""
        return self.hidden_size * (self.num_heads + 1)

    def init_from_lm_head(self, weight: torch.Tensor) -> None:
        """Copy the base LM head weight ``[V, d]`` into every head's W2."""
        with torch.no_grad():
            for head in self.lm_heads:
                head.weight.copy_(weight.to(head.weight.dtype))

    def head_projection(self, k: int) -> nn.Module:
        return self.lm_heads[k]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Frozen base input embeddings: ``tokens [...] -> [..., d]`` in the heads' dtype, no gradient."""
        with torch.no_grad():
            out = self.embedding(tokens)
        return out.to(self.blocks[0][0].linear.weight.dtype)

    def transform(self, k: int, wide: torch.Tensor) -> torch.Tensor:
        """Head k's layers on its slice of the wide input: ``[..., >= d * (k+2)] -> [..., d]``."""
        block = self.blocks[k]
        x = wide[..., : self.hidden_size * (k + 2)]
        return block(x.to(block[0].linear.weight.dtype))

    def head_logits(self, k: int, wide: torch.Tensor) -> torch.Tensor:
        """Logits of head k (0-based): ``[..., >= d * (k+2)] -> [..., V]``."""
        x = self.transform(k, wide)
        proj = self.head_projection(k)
        return proj(x.to(proj.weight.dtype))

    def forward(self, wide: torch.Tensor) -> torch.Tensor:
        """``wide [B, T, d * (K+1)] -> logits [K, B, T, V]``."""
        return torch.stack([self.head_logits(k, wide) for k in range(self.num_heads)], dim=0)

    def teacher_inputs(self, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: ``[h_t, e(x_{t+1}), ..., e(x_{t+K})]`` from the sequence's own tokens.

        ``hidden [B, T, d]``, ``input_ids [B, T]`` -> ``[B, T, d * (K+1)]``; embeddings past the end are
        zero (those positions have no target for the heads that read them).
        """
        b, t = input_ids.shape
        emb = self.embed(input_ids)  # [B, T, d]
        pad = emb.new_zeros(b, self.num_heads, emb.shape[-1])
        emb = torch.cat([emb, pad], dim=1)  # [B, T + K, d]
        parts = [hidden.to(emb.dtype)] + [emb[:, j:j + t] for j in range(1, self.num_heads + 1)]
        return torch.cat(parts, dim=-1)  # [B, T, d * (K+1)]


def needs_tokens(heads: nn.Module) -> bool:
    """True for heads that read draft tokens (Hydra): they take a wide input, not the hidden state alone."""
    return isinstance(heads, HydraHeads)


__all__ = ["ConditionedResBlock", "HydraHeads", "needs_tokens"]
