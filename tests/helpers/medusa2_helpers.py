"""Shared bits for the MEDUSA-2 tests: a naive heads loss (the reference, not the chunked one) and a batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from medusa.data.tokenize import IGNORE_INDEX


def naive_heads_loss(head_logits: torch.Tensor, labels: torch.Tensor, decay: float = 0.8) -> torch.Tensor:
    """``sum_k decay^k CE(head_k(h_t), y_{t+k+1})`` for k = 1..K: head_logits [K, B, T, V], labels [B, T]."""
    total = head_logits.new_zeros((), dtype=torch.float32)
    for i in range(head_logits.shape[0]):
        shift = i + 2  # head k = i + 1 predicts token t + k + 1
        logits = head_logits[i][:, :-shift].float()  # [B, T - shift, V]
        target = labels[:, shift:]  # [B, T - shift]
        if (target != IGNORE_INDEX).any():
            total = total + decay ** (i + 1) * F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE_INDEX)
    return total


def batch(vocab: int, b: int = 2, t: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [b, t] and labels [b, t]: the first 4 tokens are a 'prompt' (-100), the rest are labelled."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, t), generator=g)
    labels = ids.clone()
    labels[:, :4] = IGNORE_INDEX
    return ids, labels
