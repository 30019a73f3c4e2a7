"""Hydra heads (Ankner et al., 2024): MEDUSA heads that also read the draft tokens before them on their path.

Head k (k = 1..K) predicts token t+k+1 from ``[h_t, e(x_{t+1}), ..., e(x_{t+k})]``: the base model's last
hidden state and the (frozen) base input embeddings of the k tokens before its target. Its first layer is
Hydra's conditioned ResBlock on that ``d * (k+1)`` wide input, ``R x + SiLU(W1 x + b)``, then
``num_layers - 1`` ResBlocks ``x + SiLU(W1 x + b)``, then the projection W2: the heads' own
(``projection="own"``, initialised from the base LM head) or the base LM head itself
(``projection="shared_lm_head"``: frozen in MEDUSA-1, not saved with the heads), over the full vocabulary
or a draft vocabulary (``draft_vocab``: N target ids, as for MEDUSA heads).

At initialisation a Hydra head ignores the draft tokens and is a fresh MEDUSA head: W1 and b are zero and
R = ``[I, 0, ..., 0]`` picks h_t, so head k's logits are the base LM head's on h_t (like every new MEDUSA
head). Unlike zankner/Hydra, whose extra layers are one module repeated (``[ResBlock] * (n-1)``), every
layer here has its own weights.

Heads take one *wide* input ``[..., d * (K+1)]`` = ``[h_t, e(x_{t+1}), ..., e(x_{t+K})]`` and head k
reads its first ``d * (k+1)`` features, so the MEDUSA head loss and calibration, which slice positions,
work on it unchanged. :meth:`HydraHeads.teacher_inputs` builds it from the data's own tokens (teacher
forcing); decoding builds it per tree node (:mod:`medusa.decoding.hydra_candidates`).

Tensor names: ``blocks.{k}.0.res.weight``, ``blocks.{k}.{l}.linear.weight|bias``, ``lm_heads.{k}.weight``
(own projection only), ``token_map`` (draft vocabulary only).
"""

from __future__ import annotations

import torch
from torch import nn

from medusa.config.enums import HYDRA_PROJECTIONS
from medusa.modeling import head_methods
from medusa.modeling.base import lm_head_of, unwrap
from medusa.modeling.draft_vocab import DraftVocab
from medusa.modeling.heads import BaseRef, ResBlock


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
    """K Hydra heads. ``heads(wide [B, T, d * (K+1)]) -> logits [K, B, T, V]`` (target ids).

    ``embedding``: the base model's input embedding module (held outside the module tree: it is the base
    model's and stays frozen). ``projection="own"``: every head owns a W2 ``[V, d]`` (``lm_heads.{k}``,
    initialised from the base LM head); ``"shared_lm_head"``: every head applies the base LM head
    (``shared_lm_head``, held outside the module tree: neither trained by MEDUSA-1 nor saved).
    ``draft_vocab=N > 0``: the heads predict N target tokens (``token_map [N]``, draft id -> target id, a
    saved buffer); W2 is then ``[N, d]`` (own) or the N rows of the base LM head (shared), and
    :meth:`head_logits` is ``[..., N]`` over draft ids (:meth:`to_target` maps them back).
    """

    head_type = "hydra"

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1,
                 embedding: nn.Module | None = None, projection: str = "own",
                 shared_lm_head: nn.Module | None = None, draft_vocab: int = 0) -> None:
        super().__init__()
        if num_heads < 1 or num_layers < 1:
            raise ValueError(f"hydra heads need num_heads >= 1 and num_layers >= 1, "
                             f"got {num_heads}, {num_layers}")
        if projection not in HYDRA_PROJECTIONS:
            raise ValueError(f"hydra projection must be one of {HYDRA_PROJECTIONS}, got {projection!r}")
        if projection == "shared_lm_head" and shared_lm_head is None:
            raise ValueError("hydra heads with projection='shared_lm_head' need the base model's LM head")
        if not 0 <= draft_vocab <= vocab_size:
            raise ValueError(f"draft_vocab must be in [0, vocab_size={vocab_size}], got {draft_vocab}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers = num_heads, num_layers
        self.projection = projection
        self.vocab = DraftVocab(vocab_size, draft_vocab)  # draft vocabulary logic and caches
        self.blocks = nn.ModuleList(
            nn.Sequential(ConditionedResBlock(hidden_size * (k + 2), hidden_size),
                          *[ResBlock(hidden_size) for _ in range(num_layers - 1)])
            for k in range(num_heads)
        )
        self.lm_heads = None
        if projection == "own":
            self.lm_heads = nn.ModuleList(nn.Linear(hidden_size, draft_vocab or vocab_size, bias=False)
                                          for _ in range(num_heads))
        token_map = self.vocab.placeholder()  # token_map [N]: draft id -> target id (until set or loaded)
        if token_map is not None:
            self.register_buffer("token_map", token_map)
        else:
            self.token_map = None
        # Held outside the module tree (BaseRef): the embedding and the LM head belong to the base model.
        self._embedding = BaseRef(embedding)
        self._shared = BaseRef(shared_lm_head if projection == "shared_lm_head" else None)

    # written once for every head family (medusa.modeling.head_methods.SHARED)
    (draft_vocab, shared_lm_head, set_token_map, target_to_draft, to_target, to_target_logits, project,
     head_logits, head_topk) = head_methods.SHARED

    def set_shared_lm_head(self, lm_head: nn.Module | None) -> None:
        if self.projection == "shared_lm_head":
            self._shared.module = lm_head

    def bind_base(self, base_model: nn.Module) -> None:
        """Read ``base_model`` from now on: its input embeddings and, with ``projection="shared_lm_head"``,
        its LM head (e.g. after merging LoRA adapters into a new base)."""
        if self.lm_heads is None:
            self.set_shared_lm_head(lm_head_of(base_model))
        self.set_embedding(unwrap(base_model).get_input_embeddings())

    def hidden_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """None: Hydra heads also read the draft tokens, which the base hidden state alone does not give
        (decoding builds their input per tree node, training with :meth:`teacher_inputs`)."""
        return None

    # ------------------------------------------------------------------ draft vocabulary

    def restrict_vocab(self, token_map: torch.Tensor, base_weight: torch.Tensor | None = None) -> None:
        """Full vocabulary -> the draft vocabulary ``token_map [N]``, in place: the blocks are kept and an own
        W2 keeps its ``token_map`` rows (``[V, d] -> [N, d]``, a new parameter). Heads with a draft vocabulary
        are re-mapped, ``base_weight``'s rows for new ids (:meth:`DraftVocab.restrict`)."""
        device = self.blocks[0][0].linear.weight.device
        self.lm_heads, tm = self.vocab.restrict(token_map, self.lm_heads, self.hidden_size, device,
                                                      self.token_map, base_weight)
        del self.token_map
        self.register_buffer("token_map", tm)




    @property
    def embedding(self) -> nn.Module:
        if self._embedding.module is None:
            raise ValueError("hydra heads need the base model's input embeddings (set_embedding)")
        return self._embedding.module

    def set_embedding(self, embedding: nn.Module) -> None:
        self._embedding.module = embedding

    @property
    def input_width(self) -> int:
        """Features of the wide input: ``d * (K+1)``."""
        return self.hidden_size * (self.num_heads + 1)

    def init_from_lm_head(self, weight: torch.Tensor) -> None:
        """Copy the base LM head weight ``[V, d]`` (its ``token_map`` rows with a draft vocabulary) into
        every own W2 (no-op for a shared projection)."""
        self.vocab.init_heads(self.lm_heads, self.token_map, weight)

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



    def draft_logits(self, wide: torch.Tensor) -> torch.Tensor:
        """``wide [B, T, d * (K+1)] -> [K, B, T, N]``: every head's logits over its own vocabulary."""
        return torch.stack([self.head_logits(k, wide) for k in range(self.num_heads)], dim=0)

    def forward(self, wide: torch.Tensor) -> torch.Tensor:
        """``wide [B, T, d * (K+1)] -> logits [K, B, T, V]`` over TARGET ids (-inf outside a draft vocab)."""
        return self.to_target_logits(self.draft_logits(wide))

    def teacher_inputs(self, hidden: torch.Tensor, input_ids: torch.Tensor | None) -> torch.Tensor:
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


__all__ = ["HYDRA_PROJECTIONS", "ConditionedResBlock", "HydraHeads"]
