"""MEDUSA heads: K extra decoding heads, each ``num_layers`` ResBlocks then a vocabulary projection.

Head k (k = 1..K) reads the base model's last hidden state h_t and predicts token t+k+1
(the base LM head predicts t+1).
"""

from __future__ import annotations

import torch
from torch import nn

HEAD_TYPES = ("linear", "shared_lm_head")


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

    Parameter names (``blocks.{k}.{l}.linear.weight|bias``, ``lm_heads.{k}.weight``) are the
    checkpoint's tensor names.
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        num_heads: int,
        num_layers: int = 1,
        head_type: str = "linear",
        shared_lm_head: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if head_type not in HEAD_TYPES:
            raise ValueError(f"head_type must be one of {HEAD_TYPES}, got {head_type!r}")
        if num_heads < 1 or num_layers < 0:
            raise ValueError(f"need num_heads >= 1 and num_layers >= 0, got {num_heads}, {num_layers}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers, self.head_type = num_heads, num_layers, head_type
        # A fresh ResBlock per (head, layer): never `[ResBlock(d)] * n`, which would share weights.
        self.blocks = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)]) for _ in range(num_heads)
        )
        if head_type == "linear":
            self.lm_heads = nn.ModuleList(
                nn.Linear(hidden_size, vocab_size, bias=False) for _ in range(num_heads)
            )
        else:
            if shared_lm_head is None:
                raise ValueError("head_type='shared_lm_head' needs the base model's LM head")
            self.lm_heads = None
        # Held outside the module tree: the base LM head belongs to the base model, not to the heads.
        self._shared = [shared_lm_head]

    @property
    def shared_lm_head(self) -> nn.Module | None:
        return self._shared[0]

    def set_shared_lm_head(self, lm_head: nn.Module | None) -> None:
        self._shared[0] = lm_head

    def init_from_lm_head(self, weight: torch.Tensor) -> None:
        """Copy the base LM head weight ``[V, d]`` into every head's W2 (no-op for shared heads)."""
        if self.lm_heads is None:
            return
        with torch.no_grad():
            for head in self.lm_heads:
                head.weight.copy_(weight.to(head.weight.dtype))

    def head_projection(self, k: int) -> nn.Module:
        """The W2 of head k (0-based): its own Linear, or the base LM head."""
        return self.lm_heads[k] if self.lm_heads is not None else self.shared_lm_head

    def transform(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Head k's ResBlocks: ``[..., d] -> [..., d]`` (cast to the heads' dtype)."""
        block = self.blocks[k]
        if len(block) == 0:
            return hidden
        return block(hidden.to(block[0].linear.weight.dtype))

    def head_logits(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of head k (0-based): ``[..., d] -> [..., V]``."""
        x = self.transform(k, hidden)
        proj = self.head_projection(k)
        return proj(x.to(proj.weight.dtype))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``hidden_states [B, T, d] -> logits [K, B, T, V]``.

        With autograd on, every head runs through its own modules. Under ``torch.no_grad()`` (decoding,
        calibration, evaluation) the K heads' ResBlocks run batched, one ``baddbmm`` per layer, on stacked
        copies of their weights (``K * num_layers * d * d`` extra elements, rebuilt whenever a weight
        changes): a decoding step then costs a handful of kernel launches instead of ~5 per head and layer.
        """
        if torch.is_grad_enabled() or self.num_layers == 0:
            return torch.stack([self.head_logits(k, hidden_states) for k in range(self.num_heads)], dim=0)
        return self._forward_batched(hidden_states)

    def _stacked_blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(w1t [L, K, d, d], b1 [L, K, 1, d])``: the ResBlocks stacked for ``baddbmm``, cached."""
        params = [(blk.linear.weight, blk.linear.bias) for layers in self.blocks for blk in layers]
        key = tuple((w.data_ptr(), w._version, b.data_ptr(), b._version) for w, b in params)
        cached = self.__dict__.get("_stacked_cache")
        if cached is None or cached[0] != key:
            k, n = self.num_heads, self.num_layers
            w1t = torch.stack([w.detach().t() for w, _ in params]).view(k, n, self.hidden_size, self.hidden_size)
            b1 = torch.stack([b.detach() for _, b in params]).view(k, n, 1, self.hidden_size)
            cached = (key, w1t.transpose(0, 1).contiguous(), b1.transpose(0, 1).contiguous())
            self.__dict__["_stacked_cache"] = cached
        return cached[1], cached[2]

    def _forward_batched(self, hidden_states: torch.Tensor) -> torch.Tensor:
        w1t, b1 = self._stacked_blocks()
        lead = hidden_states.shape[:-1]
        x = hidden_states.reshape(1, -1, self.hidden_size).to(w1t.dtype)  # [1, M, d], M = B * T
        x = x.expand(self.num_heads, -1, -1)  # [K, M, d]
        for layer in range(self.num_layers):
            x = x + torch.nn.functional.silu(torch.baddbmm(b1[layer], x, w1t[layer]))  # [K, M, d]
        if self.lm_heads is None:  # one projection through the shared LM head reads its weight once
            proj = self.shared_lm_head
            flat = x.reshape(-1, self.hidden_size)  # [K * M, d]
            out = proj(flat.to(proj.weight.dtype) if proj.weight.is_floating_point() else flat)
            return out.view(self.num_heads, *lead, -1)  # [K, B, T, V]
        logits = [head(x[k].to(head.weight.dtype)) for k, head in enumerate(self.lm_heads)]
        return torch.stack(logits, dim=0).view(self.num_heads, *lead, -1)  # [K, B, T, V]
