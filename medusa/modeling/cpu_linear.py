"""Pre-packed linear layers for CPU decoding: every matmul the decoder issues at oneDNN's blocked-weight
speed.

``F.linear`` on a CPU re-packs the whole weight on every float32 call whose input has a few rows (for
SmolLM2's 49,152 x 576 LM head, 8 rows cost 21 ms against 4.9 ms for 1 row; 8 ms against a weight reordered
once), and in bfloat16 even a one-row product streams its weight at a fraction of the memory's speed (the LM
head: 5.9 ms stock against 2.5 ms packed; 16 rows cost 2.9 ms packed: AMX makes a tree of 16 nodes cost what
one token does). ``docs/results/cpu-linear.md`` and ``docs/results/bf16-step.md`` have the tables (in a
whole forward, where the weights stream from memory, packing saves 8-18% in bfloat16).

:func:`pack_linears` swaps every float32 or bfloat16 CPU ``nn.Linear`` inside a module for a
:class:`PackedLinear` (as torch's quantization swaps modules): the same ``weight`` / ``bias`` Parameters
(state-dict keys and tied weights unchanged) plus a copy of the weight reordered once
(``torch.ops.mkldnn._reorder_linear_weight``), used (``torch.ops.mkldnn._linear_pointwise``) when the input
has the weight's dtype, is on the CPU, needs no gradient, the weight is still the one packed (a changed
weight is re-packed on its next call) and its row count is one the packed path wins at: float32
``MIN_ROWS..MAX_ROWS`` (one row stays the stock computation: no gain there), bfloat16 any row count (one row
included: the plain decode step). Everything else -- training, ``torch.compile`` tracing, other dtypes --
runs the stock ``F.linear``. The packed copy is a plain attribute of the module (not a buffer): it costs
memory (one more copy of the weight) and is never saved. :func:`unpack_linears` swaps stock ``nn.Linear``s
back (the same Parameters).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from medusa.modeling import bf16_kernel

MIN_ROWS, MAX_ROWS = 3, 64  # float32: rows (tokens) per call that use the packed weight (2 rows: no gain)
PACKED_DTYPES = (torch.float32, torch.bfloat16)  # bfloat16: every row count (1 row: 2.3x stock on AMX)
PACK_HINT = 8  # the row count oneDNN lays the blocked weight out for (best over 4..64 rows on this CPU)
ENV = "MEDUSA_CPU_PACK"  # "0": never pack (load_for_generation's default is "auto")


def packing_supported() -> bool:
    """Whether this torch build has oneDNN's linear weight reorder and pointwise linear."""
    ops = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and ops is not None
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))


def bf16_matmul_unit() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AMX tiles or AVX-512-BF16): where it does not, oneDNN's
    packed bfloat16 path emulates it and the stock ``F.linear`` is kept."""
    cpu = getattr(torch, "cpu", None)
    probes = [getattr(cpu, name, None) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
    return any(callable(probe) and probe() for probe in probes)


BF16_NATIVE = bf16_matmul_unit()  # asked once per process


def _packable_tensors(w: torch.Tensor, b: torch.Tensor | None) -> bool:
    """The weight (and bias) are float32, or bfloat16 on a CPU that multiplies it natively, on the CPU:
    what the packed path computes in."""
    return (w.dtype in PACKED_DTYPES and w.device.type == "cpu" and (b is None or b.dtype == w.dtype)
            and (w.dtype == torch.float32 or BF16_NATIVE))


def _packable(layer: nn.Module) -> bool:
    w = getattr(layer, "weight", None)
    return type(layer) is nn.Linear and isinstance(w, torch.Tensor) and _packable_tensors(w, layer.bias)


def rows_pay(rows: int, dtype: torch.dtype) -> bool:
    """Whether a call of ``rows`` rows in ``dtype`` is faster through the packed weight than ``F.linear``
    (measured on Intel AMX and AMD AVX-512-BF16 CPUs, one thread: ``docs/results/cpu-linear.md``)."""
    if dtype == torch.bfloat16:
        return rows >= 1 and BF16_NATIVE
    return dtype == torch.float32 and MIN_ROWS <= rows <= MAX_ROWS


def packed_matmul(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x [M, in] @ W.T + bias`` against the reordered weight ``packed`` (oneDNN), ``[M, out]``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedLinear(nn.Module):
    """An ``nn.Linear``'s own ``weight`` / ``bias`` Parameters plus their oneDNN-packed copy, used for the
    few-row float32 CPU calls where it pays (see the module docstring); ``F.linear`` otherwise."""

    def __init__(self, linear: nn.Linear, kernel: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameters: state-dict keys and tied weights unchanged
        self.bias = linear.bias
        self.packed: torch.Tensor | None = None  # oneDNN's reordered weight (not a buffer: never saved)
        self.native: bf16_kernel.PackedBf16 | None = None  # or the native kernel's packed weight (bfloat16)
        self.packed_key: tuple[int, ...] = (0, -1)  # (weight data_ptr, _version, bias _version) when packed
        self.stock = False  # True inside stock_linears(): F.linear always
        self.kernel = kernel  # bf16 through the native kernel where it fits (False: oneDNN's reorder)
        self.repack()

    def packable(self) -> bool:
        """The weight (and bias) are in a dtype the packed path computes in, on the CPU."""
        return _packable_tensors(self.weight, self.bias)

    def repack(self) -> None:
        """Reorder the current weight (it changed since it was packed: loaded, trained, moved)."""
        w = self.weight
        if self.kernel and bf16_kernel.fits(w):
            self.packed, self.native = None, bf16_kernel.pack(w, self.bias)
        else:
            self.packed, self.native = torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_HINT), None
        self.packed_key = self._key()

    def _key(self) -> tuple[int, ...]:
        w, b = self.weight, self.bias
        return (w.data_ptr(), w._version, -1 if b is None else b._version)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F.linear(x, weight, bias)``, through the packed weight where it pays."""
        if self.stock:
            return F.linear(x, self.weight, self.bias)
        native = self.native
        if (native is not None and x.dtype == torch.bfloat16 and x.is_cpu and not torch.is_grad_enabled()
                and not torch.compiler.is_compiling()
                and self._key() == self.packed_key):
            # the decoder's bfloat16 path, kept short (it runs ~200 times per token): the native kernel
            return bf16_kernel.rows_matmul(x, native)  # [..., out]
        return self._general(x)

    def _general(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        rows = x.numel() // max(x.shape[-1], 1)
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
        if (torch.compiler.is_compiling() or x.dtype != w.dtype or not rows_pay(rows, x.dtype)
                or x.device.type != "cpu" or needs_grad or not self.packable()):
            return F.linear(x, w, self.bias)
        if self._key() != self.packed_key:
            self.repack()
        if self.native is not None:  # bfloat16 through the native kernel, any row count
            return bf16_kernel.rows_matmul(x, self.native)  # [..., out]
        bias = None if self.bias is None else self.bias.detach()
        y = packed_matmul(x.reshape(rows, x.shape[-1]), self.packed, bias)  # [rows, out]
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


def _stock(layer: PackedLinear) -> nn.Linear:
    """A stock ``nn.Linear`` holding ``layer``'s Parameters."""
    linear = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta")
    linear.weight, linear.bias = layer.weight, layer.bias
    return linear


def _swap(module: nn.Module, pick: Any, make: Any) -> int:
    """Replace every child ``c`` of ``module`` (at any depth) for which ``pick(c)`` by ``make(c)`` in its
    parent; returns how many."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if pick(child):
                setattr(parent, name, make(child))
                count += 1
    return count


def pack_linears(module: nn.Module, kernel: bool = True) -> int:
    """Swap every float32 / bfloat16 CPU ``nn.Linear`` inside ``module`` for a :class:`PackedLinear` (in
    place; a layer packed before is re-packed); returns how many. No-op (0) where :func:`packing_supported`
    is False. ``kernel``: bfloat16 weights through the native kernel where it fits (:mod:`bf16_kernel`);
    False: oneDNN's reorder for every dtype (to compare)."""
    if not packing_supported():
        return 0
    repacked = 0
    for layer in module.modules():
        if isinstance(layer, PackedLinear) and layer.packable():
            layer.kernel = kernel
            layer.repack()
            repacked += 1
    return repacked + _swap(module, _packable, lambda linear: PackedLinear(linear, kernel))


def unpack_linears(module: nn.Module) -> int:
    """Undo :func:`pack_linears`: stock ``nn.Linear``s (the same Parameters) again; returns how many."""
    return _swap(module, lambda m: isinstance(m, PackedLinear), _stock)


@contextmanager
def stock_linears(module: nn.Module) -> Iterator[None]:
    """Within the block every :class:`PackedLinear` inside ``module`` computes the stock ``F.linear`` (what HF
    ``generate`` costs without packing, timed beside ours on the same weights); packed again after."""
    layers = [m for m in module.modules() if isinstance(m, PackedLinear)]
    for layer in layers:
        layer.stock = True
    try:
        yield
    finally:
        for layer in layers:
            layer.stock = False


def packed_count(module: nn.Module) -> int:
    return sum(isinstance(layer, PackedLinear) for layer in module.modules())


def linear_bytes(module: nn.Module) -> int:
    """Bytes of the float32 / bfloat16 CPU linear weights :func:`pack_linears` would copy (shared weights
    once)."""
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
    more than ``share`` of the available memory, or nothing is on the CPU in float32 / bfloat16; returns how
    many."""
    if os.environ.get(ENV, "auto").strip().lower() in ("0", "false", "no", "off"):
        return 0
    need, free = linear_bytes(model), _available_bytes()
    if need == 0 or (free is not None and need > share * free):
        return 0
    return pack_linears(model)


__all__ = ["BF16_NATIVE", "ENV", "MAX_ROWS", "MIN_ROWS", "PACKED_DTYPES", "PackedLinear", "auto_pack",
           "bf16_matmul_unit", "linear_bytes", "pack_linears", "packed_count", "packed_matmul",
           "packing_supported", "rows_pay", "stock_linears", "unpack_linears"]
