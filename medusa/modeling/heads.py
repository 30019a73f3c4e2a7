"""MEDUSA heads: K extra decoding heads, each ``num_layers`` ResBlocks then a vocabulary projection.

Head k (k = 1..K) reads the base model's last hidden state h_t and predicts token t+k+1
(the base LM head predicts t+1).

Draft vocabulary (``draft_vocab = N > 0``): the heads predict only N target tokens; ``token_map [N]``
(int64, a buffer saved with the heads) gives the target id of each draft id. ``head_logits`` is then
``[..., N]`` (draft ids: what the loss and calibration score), while ``forward`` and :meth:`topk` speak
target ids (``forward`` scatters the N logits into ``[..., V]`` with -inf elsewhere, as vLLM does), so
the decoding candidates, verification and output are those of full-vocabulary heads.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from medusa.config.enums import MEDUSA_HEAD_TYPES
from medusa.modeling import head_methods
from medusa.modeling.base import lm_head_of
from medusa.modeling.draft_vocab import DraftVocab


class BaseRef:
    """A module of the base model (its LM head, its input embeddings) that heads read but do not own.

    ``nn.Module.__setattr__`` registers every module attribute as a submodule: its parameters would then
    be the heads' (in ``parameters()``, ``state_dict()``, moved by ``heads.to()``). The heads hold such a
    module in a ``BaseRef`` instead, a plain object nn.Module does not look into, so the module stays out
    of the heads' state_dict and parameters.
    """

    __slots__ = ("module",)

    def __init__(self, module: nn.Module | None = None) -> None:
        self.module = module


class ResBlock(nn.Module):
    """``x + SiLU(W1 x + b)`` with W1 and b zero-initialised, so a new block is the identity."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    """K heads. ``heads(hidden [B, T, d]) -> logits [K, B, T, V]``.

    ``head_type="linear"``: every head owns a W2 ``[V, d]`` (initialised from the base LM head).
    ``head_type="shared_lm_head"``: every head reuses the base LM head (not saved with the heads).
    ``draft_vocab=N > 0``: W2 is ``[N, d]`` (linear) or the N rows ``token_map`` selects from the base LM
    head (shared); ``token_map`` must then be set (:meth:`set_token_map`, or loaded with the state dict).

    Parameter names (``blocks.{k}.{l}.linear.weight|bias``, ``lm_heads.{k}.weight``, ``token_map``) are
    the checkpoint's tensor names.
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        num_heads: int,
        num_layers: int = 1,
        head_type: str = "linear",
        shared_lm_head: nn.Module | None = None,
        draft_vocab: int = 0,
    ) -> None:
        super().__init__()
        if head_type not in MEDUSA_HEAD_TYPES:
            raise ValueError(f"head_type must be one of {MEDUSA_HEAD_TYPES}, got {head_type!r}")
        if num_heads < 1 or num_layers < 0:
            raise ValueError(f"need num_heads >= 1 and num_layers >= 0, got {num_heads}, {num_layers}")
        if not 0 <= draft_vocab <= vocab_size:
            raise ValueError(f"draft_vocab must be in [0, vocab_size={vocab_size}], got {draft_vocab}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.vocab = DraftVocab(vocab_size, draft_vocab)  # draft vocabulary logic and caches
        out_size = draft_vocab or vocab_size
        self.num_heads, self.num_layers, self.head_type = num_heads, num_layers, head_type
        # A fresh ResBlock per (head, layer): never `[ResBlock(d)] * n`, which would share weights.
        self.blocks = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)]) for _ in range(num_heads)
        )
        if head_type == "linear":
            self.lm_heads = nn.ModuleList(
                nn.Linear(hidden_size, out_size, bias=False) for _ in range(num_heads)
            )
        else:
            if shared_lm_head is None:
                raise ValueError("head_type='shared_lm_head' needs the base model's LM head")
            self.lm_heads = None
        token_map = self.vocab.placeholder()  # token_map [N]: draft id -> target id (until set or loaded)
        if token_map is not None:
            self.register_buffer("token_map", token_map)
        else:
            self.token_map = None
        self._shared = BaseRef(shared_lm_head)  # the base model's LM head, outside the module tree
        # (key, w1t [L, K, d, d], b1 [L, K, 1, d]): the ResBlocks stacked for no-grad decoding, rebuilt
        # whenever a weight changes (:meth:`_stacked_blocks`)
        self._stacked: tuple[tuple[Any, ...], torch.Tensor, torch.Tensor] | None = None

    # written once for every head family (medusa.modeling.head_methods.SHARED)
    (draft_vocab, shared_lm_head, set_token_map, target_to_draft, to_target, to_target_logits, project,
     head_logits, head_topk) = head_methods.SHARED

    def set_shared_lm_head(self, lm_head: nn.Module | None) -> None:
        self._shared.module = lm_head

    def bind_base(self, base_model: nn.Module) -> None:
        """Read ``base_model`` from now on: its LM head, for heads without their own W2 (e.g. after
        merging LoRA adapters into a new base)."""
        if self.lm_heads is None:
            self._shared.module = lm_head_of(base_model)

    def teacher_inputs(self, hidden: torch.Tensor, input_ids: torch.Tensor | None) -> torch.Tensor:
        """The heads' training input at ``hidden [B, T, d]``: the hidden state itself (MEDUSA heads read
        no token; ``input_ids`` is ignored)."""
        return hidden

    def hidden_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """``hidden [B, T, d] -> [K, B, T, V]``: the heads' logits from the base hidden state alone (what
        ``MedusaModel.forward`` returns as ``head_logits``)."""
        return self(hidden)

    def init_from_lm_head(self, weight: torch.Tensor) -> None:
        """Copy the base LM head weight ``[V, d]`` (its ``token_map`` rows with a draft vocabulary) into
        every head's W2 (no-op for shared heads)."""
        self.vocab.init_heads(self.lm_heads, self.token_map, weight)


    def restrict_vocab(self, token_map: torch.Tensor, base_weight: torch.Tensor | None = None) -> None:
        """Full vocabulary -> the draft vocabulary ``token_map [N]``, in place: the ResBlocks are kept and a
        ``linear`` head's W2 keeps its ``token_map`` rows (``[V, d] -> [N, d]``, a new parameter). Heads with
        a draft vocabulary are re-mapped, ``base_weight``'s rows for new ids (:meth:`DraftVocab.restrict`)."""
        ref = next(iter(self.parameters()), None)
        device = ref.device if ref is not None else token_map.device
        self.lm_heads, tm = self.vocab.restrict(token_map, self.lm_heads, self.hidden_size, device,
                                                      self.token_map, base_weight)
        del self.token_map
        self.register_buffer("token_map", tm)



    def transform(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Head k's ResBlocks: ``[..., d] -> [..., d]`` (cast to the heads' dtype)."""
        block = self.blocks[k]
        if len(block) == 0:
            return hidden
        return block(hidden.to(block[0].linear.weight.dtype))



    @torch.no_grad()
    def topk(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """Each head's top-``k`` TARGET token ids at ``hidden [..., d]`` -> ``[K, ..., k]``.

        With a draft vocabulary the top-k is taken over the N draft logits and mapped through
        ``token_map`` (no ``[..., V]`` tensor is built); k > N falls back to the -inf-filled target logits.
        """
        if self.token_map is None or k > self.draft_vocab:
            return self(hidden).topk(k, dim=-1).indices
        return self.token_map[self.draft_logits(hidden).topk(k, dim=-1).indices]


    def draft_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``hidden_states [..., d] -> [K, ..., N]``: every head's logits over its own vocabulary.

        With autograd on, every head runs through its own modules. Under ``torch.no_grad()`` (decoding,
        calibration, evaluation) the K heads' ResBlocks run batched, one ``baddbmm`` per layer, on stacked
        copies of their weights (``K * num_layers * d * d`` extra elements, rebuilt whenever a weight
        changes): a decoding step then costs a handful of kernel launches instead of ~5 per head and layer.
        """
        if torch.is_grad_enabled() or self.num_layers == 0:
            return torch.stack([self.head_logits(k, hidden_states) for k in range(self.num_heads)], dim=0)
        return self._forward_batched(hidden_states)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``hidden_states [B, T, d] -> logits [K, B, T, V]`` over TARGET ids (:meth:`to_target_logits`)."""
        return self.to_target_logits(self.draft_logits(hidden_states))

    def _stacked_blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(w1t [L, K, d, d], b1 [L, K, 1, d])``: the ResBlocks stacked for ``baddbmm``, cached."""
        params = [(blk.linear.weight, blk.linear.bias) for layers in self.blocks for blk in layers]
        key = tuple((w.data_ptr(), w._version, b.data_ptr(), b._version) for w, b in params)
        cached = self._stacked
        if cached is None or cached[0] != key:
            k, n = self.num_heads, self.num_layers
            w1t = torch.stack([w.detach().t() for w, _ in params]).view(k, n, self.hidden_size,
                                                                        self.hidden_size)
            b1 = torch.stack([b.detach() for _, b in params]).view(k, n, 1, self.hidden_size)
            cached = (key, w1t.transpose(0, 1).contiguous(), b1.transpose(0, 1).contiguous())
            self._stacked = cached
        return cached[1], cached[2]

    def _forward_batched(self, hidden_states: torch.Tensor) -> torch.Tensor:
        w1t, b1 = self._stacked_blocks()
        lead = hidden_states.shape[:-1]
        x = hidden_states.reshape(1, -1, self.hidden_size).to(w1t.dtype)  # [1, M, d], M = B * T
        x = x.expand(self.num_heads, -1, -1)  # [K, M, d]
        for layer in range(self.num_layers):
            x = x + torch.nn.functional.silu(torch.baddbmm(b1[layer], x, w1t[layer]))  # [K, M, d]
        if self.lm_heads is None:  # one projection through the shared LM head reads its weight once
            out = self.project(0, x.reshape(-1, self.hidden_size))  # [K * M, N]
            return out.view(self.num_heads, *lead, -1)  # [K, ..., N]
        logits = [self.project(k, x[k]) for k in range(self.num_heads)]
        return torch.stack(logits, dim=0).view(self.num_heads, *lead, -1)  # [K, ..., N]

