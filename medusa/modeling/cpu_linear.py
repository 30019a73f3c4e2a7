"""Pre-packed float32 linear layers for CPU decoding: tree verification's few-row matmuls at the speed of
oneDNN's blocked weights.

``F.linear`` on a CPU re-packs the whole weight on every call whose input has a few rows: for
SmolLM2's 49,152 x 576 LM head, 8 rows cost 21 ms against 4.9 ms for 1 row, while the same product against
a weight reordered once into oneDNN's blocked layout costs 8 ms (1 thread, `docs/results/cpu-linear.md`).
A MEDUSA step verifies 8-40 tree nodes at batch 1 -- exactly those shapes -- so the verification forward
is where the re-packing hurts.

:func:`pack_linears` reorders every float32 ``nn.Linear`` weight of a module once
(``torch.ops.mkldnn._reorder_linear_weight``) and gives the layer an instance ``forward`` that uses the
packed copy (``torch.ops.mkldnn._linear_pointwise``) when the input has ``MIN_ROWS..MAX_ROWS`` rows, is
float32 on the CPU, needs no gradient, and the weight is still the one packed (a changed weight is re-packed
on its next call). Everything else -- one row (plain decoding stays the stock computation), long
prefills, training, ``torch.compile`` tracing, other dtypes -- runs the stock ``F.linear``. Parameters and
state-dict keys are untouched; the packed copies are plain attributes, so they cost memory (one more copy
of every packed weight) and are never saved.
"""

from __future__ import annotations

import os
from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

MIN_ROWS, MAX_ROWS = 3, 64  # rows (tokens) per call that use the packed weight (2 rows: no gain measured)
PACK_HINT = 8  # the row count oneDNN lays the blocked weight out for (best over 4..64 rows on this CPU)
PACK_ATTR = "_medusa_cpu_pack"  # (packed weight, weight data_ptr, weight _version)
ENV = "MEDUSA_CPU_PACK"  # "0": never pack (load_for_generation's default is "auto")


def packing_supported() -> bool:
    """Whether this torch build has oneDNN's linear weight reorder and pointwise linear."""
    ops = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and ops is not None
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))


def _packable(layer: nn.Module) -> bool:
    w = getattr(layer, "weight", None)
    return (isinstance(layer, nn.Linear) and isinstance(w, torch.Tensor) and w.dtype == torch.float32
            and w.device.type == "cpu" and (layer.bias is None or layer.bias.dtype == torch.float32))


def _pack(layer: nn.Linear) -> None:
    w = layer.weight
    packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_HINT)
    layer.__dict__[PACK_ATTR] = (packed, w.data_ptr(), w._version)


def packed_matmul(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x [M, in] @ W.T + bias`` against the reordered weight ``packed`` (oneDNN), ``[M, out]``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through the packed weight where it pays (see the module docstring)."""
    rows = x.numel() // max(x.shape[-1], 1)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
    if (torch.compiler.is_compiling() or not MIN_ROWS <= rows <= MAX_ROWS or x.dtype != torch.float32
            or x.device.type != "cpu" or needs_grad or PACK_ATTR not in self.__dict__):
        return F.linear(x, self.weight, self.bias)
    w = self.weight
    packed, ptr, version = self.__dict__[PACK_ATTR]
    if w.data_ptr() != ptr or w._version != version or w.dtype != torch.float32:
        if not _packable(self):
            return F.linear(x, w, self.bias)
        _pack(self)  # the weight changed since it was packed (loaded, trained, moved)
        packed = self.__dict__[PACK_ATTR][0]
    bias = None if self.bias is None else self.bias.detach()
    y = packed_matmul(x.reshape(rows, x.shape[-1]), packed, bias)  # [rows, out]
    return y.reshape(*x.shape[:-1], y.shape[-1])


def pack_linears(module: nn.Module) -> int:
    """Pack every float32 CPU ``nn.Linear`` inside ``module`` (in place); returns how many. A layer packed
    before is re-packed. No-op (0) where :func:`packing_supported` is False."""
    if not packing_supported():
        return 0
    count = 0
    for layer in module.modules():
        if _packable(layer):
            _pack(layer)
            layer.forward = MethodType(_packed_forward, layer)
            count += 1
    return count


def unpack_linears(module: nn.Module) -> int:
    """Undo :func:`pack_linears`: the stock forward and no packed copy; returns how many layers."""
    count = 0
    for layer in module.modules():
        if PACK_ATTR in layer.__dict__:
            del layer.__dict__[PACK_ATTR]
            layer.__dict__.pop("forward", None)
            count += 1
    return count


def packed_count(module: nn.Module) -> int:
    return sum(PACK_ATTR in layer.__dict__ for layer in module.modules())


def linear_bytes(module: nn.Module) -> int:
    """Bytes of the float32 CPU linear weights :func:`pack_linears` would copy (shared weights once)."""
    seen: dict[int, int] = {}
    for layer in module.modules():
        if _packable(layer):
            seen[layer.weight.data_ptr()] = layer.weight.numel() * layer.weight.element_size()
    return sum(seen.values())


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def auto_pack(model: Any, share: float = 0.25) -> int:
    """:func:`pack_linears` on a model for generation unless ``MEDUSA_CPU_PACK=0``, the copies would take
    more than ``share`` of the available memory, or nothing is on the CPU in float32; returns how many."""
    if os.environ.get(ENV, "auto").strip().lower() in ("0", "false", "no", "off"):
        return 0
    need, free = linear_bytes(model), _available_bytes()
    if need == 0 or (free is not None and need > share * free):
        return 0
    return pack_linears(model)


__all__ = ["ENV", "MAX_ROWS", "MIN_ROWS", "auto_pack", "linear_bytes", "pack_linears", "packed_count",
           "packed_matmul", "packing_supported", "unpack_linears"]
