"""The bfloat16 product of a few rows against a packed weight, in C: the decoder's every matmul (one-token
step, tree verification, drafting, LM heads) at the memory's streaming speed.

Two implementations behind one entry point, chosen once per process (:mod:`medusa.native.library`):

- **AMX tiles** (``kernels/amx_bf16_rows.c``, Intel Sapphire Rapids and later). oneDNN's packed bfloat16
  linear streams a weight at ~6 GB/s when one to 32 rows multiply it on one core of such a Xeon; stock
  ``F.linear`` at ~5. The kernel reads the weight once, in order, as AMX B tiles straight from a copy packed
  at load time: ~11 GB/s for 1 to 16 rows (SmolLM2-135M's 30 layers: 20 ms against oneDNN's 36;
  ``docs/results/bf16-step.md``).
- **AVX-512 BF16** (``kernels/avx512_bf16_rows.c``, AMD Zen 4 / Zen 5, Intel Cooper Lake): one
  ``vdpbf16ps`` per pair of inputs and 16 outputs; up to 16 rows form one register tile (each weight line
  loaded once for all of them; eight weight streams at once for one or two rows), more rows go in groups of
  up to 14 over 192-output panels kept in L2. On an AMD EPYC (Zen 5)
  one row streams SmolLM2's 57 MB LM head at 38 GB/s against stock ``F.linear``'s 16; from 16 rows it
  multiplies at ~450-490 GFLOP/s.

From 64 rows (a prompt's prefill) both stream the weight once for all rows. A row's result does not depend
on which rows share the call (every output is the same chain of products over k, whatever the batch): a
tree's root, and a chain laid out in depth order, compute exactly what one-token steps would. The two
implementations may round differently from each other; one machine always runs the same one.

Its ``available``, ``library``, ``unavailable_reason``, ``kind``, ``kernel_dir`` and ``ENV`` are re-exported
here from :mod:`medusa.native.library`; where it is not available, callers keep oneDNN's path.
``MEDUSA_BF16_KERNEL=0`` turns it off (to compare).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from medusa.native.library import ENV, available, kernel_dir, kind, library, unavailable_reason  # noqa: F401

K_MULTIPLE = 32  # the input width must be a whole number of A-tile columns (32 bfloat16)


@dataclass(frozen=True)
class PackedBf16:
    """A ``[n, k]`` bfloat16 weight packed for the kernel: ``data`` is ``[np/16, k/2, 16, 2]`` (flat), outputs
    padded to ``np`` (a multiple of 16) with zeros; ``bias`` the float32 bias ``[n]`` or None; the kernel's
    entry point and the two tensors' addresses, looked up once (a call costs ~200 per token)."""

    data: torch.Tensor
    bias: torch.Tensor | None
    n: int
    k: int
    np: int
    call: Any  # the kernel's entry point (ctypes)
    data_ptr: int
    bias_ptr: int | None


def fits(weight: torch.Tensor) -> bool:
    """Whether ``weight`` (``[n, k]``) can go through the kernel: bfloat16 on the CPU, ``k`` a multiple of
    :data:`K_MULTIPLE`, and the kernel available."""
    return (weight.dim() == 2 and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
            and weight.shape[1] % K_MULTIPLE == 0 and weight.shape[0] > 0 and available())


def pack(weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedBf16:
    """Pack a ``[n, k]`` bfloat16 weight (see :func:`fits`) and its bias for :func:`rows_matmul`."""
    lib = library()
    if lib is None or not fits(weight):
        raise ValueError(f"weight {tuple(weight.shape)} {weight.dtype} does not fit the native kernel "
                         f"({unavailable_reason() or f'k must be a multiple of {K_MULTIPLE}'})")
    w = weight.detach().contiguous()
    n, k = w.shape
    np_ = -(-n // 16) * 16
    data = torch.empty(np_ * k, dtype=torch.bfloat16)
    lib.medusa_bf16_pack(w.data_ptr(), n, k, k, data.data_ptr(), np_, k)
    b = None if bias is None else bias.detach().to(torch.float32).contiguous()
    return PackedBf16(data=data, bias=b, n=n, k=k, np=np_, call=lib.medusa_bf16_rows,
                      data_ptr=data.data_ptr(), bias_ptr=None if b is None else b.data_ptr())


def rows_matmul(x: torch.Tensor, packed: PackedBf16) -> torch.Tensor:
    """``x [..., k] @ W.T + bias`` in bfloat16 (float32 accumulation), ``[..., n]``; ``x`` bfloat16 on the CPU
    (made contiguous if it is not), any number of rows."""
    if not x.is_contiguous():
        x = x.contiguous()
    rows = x.numel() // packed.k
    y = torch.empty((*x.shape[:-1], packed.n), dtype=torch.bfloat16)
    packed.call(x.data_ptr(), rows, packed.k, packed.data_ptr, packed.np, packed.k, packed.bias_ptr,
                y.data_ptr(), packed.n, packed.n)
    return y


__all__ = ["ENV", "K_MULTIPLE", "PackedBf16", "available", "fits", "kernel_dir", "kind", "library",
           "pack",
           "rows_matmul", "unavailable_reason"]
