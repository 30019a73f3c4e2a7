"""Picks made from logits through the native library (``kernels/bf16_pick_ops.c``): each row's first
maximum (greedy acceptance) and each row's top-k log-probabilities (a drafter's children).

PyTorch's CPU reductions with indices are not vectorised for bfloat16: ``max(dim=-1)`` over a verified
tree's 14 x 49,152 logits takes ~0.6 ms of a ~48 ms decode step, ``log_softmax`` + ``topk`` over a drafting
level's 8,192 draft logits ~0.1-0.2 ms, four times a step. The C ops read the values once at the memory's
speed. Both fall back to the same torch computation where the library is unavailable, the logits are not
bfloat16 on the CPU, or ``torch.compile`` is tracing.

- :func:`first_max` gives exactly ``argmax``'s answer (the first maximum; NaN larger than every number,
  the first NaN winning).
- :func:`top_log_softmax` gives ``log_softmax(x.float()).topk(k)`` to float32 rounding (the sum of the
  exponentials is taken in another order), ties to the lower index, indices equal where values differ.
"""

from __future__ import annotations

import torch

from medusa.native.library import library

MAX_K = 64  # the most children a row's top-k keeps in C (the torch path beyond)


def _native_rows(x: torch.Tensor) -> torch.Tensor | None:
    """``x`` as rows the C ops read (contiguous bfloat16 on the CPU, no autograd, not tracing), or None."""
    if (x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.dim() == 0 or x.shape[-1] == 0
            or x.numel() == 0 or x.requires_grad or torch.compiler.is_compiling() or library() is None):
        return None
    return x.contiguous()


def first_max(logits: torch.Tensor) -> torch.Tensor:
    """``logits [..., V]`` -> the index of each row's first maximum ``[...]`` (``argmax``'s answer)."""
    x = _native_rows(logits)
    if x is None:
        return logits.max(dim=-1).indices
    out = torch.empty(x.shape[:-1], dtype=torch.long)
    n = x.shape[-1]
    library().medusa_first_max(x.data_ptr(), x.numel() // n, n, n, out.data_ptr())
    return out


def top_log_softmax(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [..., V]`` -> each row's ``k`` largest log-softmax values ``[..., k]`` (float32, descending)
    and their indices ``[..., k]``."""
    x = _native_rows(logits)
    n = logits.shape[-1] if logits.dim() else 0
    if x is None or not 1 <= k <= min(n, MAX_K):
        top = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
        return top.values, top.indices
    values = torch.empty(*x.shape[:-1], k, dtype=torch.float32)
    indices = torch.empty(*x.shape[:-1], k, dtype=torch.long)
    library().medusa_top_log_softmax(x.data_ptr(), x.numel() // n, n, n, k, values.data_ptr(),
                                     indices.data_ptr())
    return values, indices


__all__ = ["MAX_K", "first_max", "top_log_softmax"]
