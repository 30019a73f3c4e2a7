"""The bfloat16 product of a few rows against a packed weight through Intel AMX tiles: the decoder's every
matmul (one-token step, tree verification, drafting, LM heads) at the memory's streaming speed.

oneDNN's packed bfloat16 linear streams a weight at ~6 GB/s when one to 32 rows multiply it on one core
of an Intel Xeon with AMX; stock ``F.linear`` at ~5. This kernel (``kernels/amx_bf16_rows.c``) reads the
weight once, in order, as AMX B tiles straight from a copy packed at load time, and reaches ~11 GB/s for 1 to
16 rows (SmolLM2-135M's 30 layers: 20 ms against oneDNN's 36; ``docs/results/bf16-step.md``). A row's
result does not depend on which rows share the call (AMX multiplies each row of a tile on its own and every
output is the same chain of tile products): a tree's root, and a chain laid out in depth order, compute
exactly what one-token steps would.

It is C, built once per machine with the system's C compiler (``$CC``, else ``cc``) into
``$MEDUSA_CACHE/kernels`` (``~/.cache/medusa/kernels``; the file is named by a hash of source, flags and
compiler, written to a temporary name and renamed, so concurrent builders are safe) and called through
``ctypes``. Used where the CPU has AMX-BF16 (Linux ``/proc/cpuinfo``), the compiler builds it and the kernel
grants the tile state; :func:`unavailable_reason` says why not otherwise, and callers keep oneDNN's path.
``MEDUSA_AMX_KERNEL=0`` turns it off (to compare).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from medusa.modeling.packaged_models import default_cache

# the matmul, and the decoder layer's small ops between matmuls (:mod:`medusa.modeling.native_body`)
SOURCES = tuple(Path(__file__).with_name("kernels") / name
                for name in ("amx_bf16_rows.c", "bf16_decoder_ops.c"))
FLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mamx-tile", "-mamx-bf16",
         "-shared", "-fPIC")
MAX_ROWS = 32  # rows per call through the kernel (two A tiles); more rows: the caller's stock product
K_MULTIPLE = 32  # the input width must be a whole number of A-tile columns (32 bfloat16)
ENV = "MEDUSA_AMX_KERNEL"
_C_LONG, _PTR = ctypes.c_long, ctypes.c_void_p


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
    max_elements: int  # k * MAX_ROWS: the input sizes the kernel takes in one call


def kernel_dir() -> Path:
    """``$MEDUSA_CACHE/kernels`` (``~/.cache/medusa/kernels``), beside the converted models."""
    return default_cache().parent / "kernels"


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return set()
    return set()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc"))


def _build(cc: str) -> Path:
    """Compile the kernel (once per source, flags and compiler) and return the shared library's path."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    texts = [source.read_text() for source in SOURCES]
    digest = hashlib.sha256("\0".join([*texts, *FLAGS, version]).encode()).hexdigest()[:16]
    target = kernel_dir() / f"amx_bf16_rows-{digest}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".amx_bf16_rows-", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *FLAGS, "-o", tmp, *map(str, SOURCES)], capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1:]
            raise OSError(f"{cc} failed on {', '.join(s.name for s in SOURCES)}: {last}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.lru_cache(maxsize=1)
def _library() -> tuple[ctypes.CDLL | None, str]:
    """The loaded kernel, or None and why not (asked once per process)."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None, f"{ENV}=0"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None, f"not an x86-64 Linux host ({platform.system()} {platform.machine()})"
    missing = {"amx_tile", "amx_bf16", "avx512_bf16", "avx512bw"} - _cpu_flags()
    if missing:
        return None, f"this CPU lacks {', '.join(sorted(missing))}"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler ($CC or cc) to build the kernel"
    try:
        lib = ctypes.CDLL(str(_build(cc)))
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"building the kernel failed: {e}"
    if lib.medusa_amx_init() != 0:
        return None, "the OS refused the AMX tile state (arch_prctl)"
    lib.medusa_bf16_pack.argtypes = [_PTR, _C_LONG, _C_LONG, _C_LONG, _PTR, _C_LONG, _C_LONG]
    lib.medusa_bf16_pack.restype = None
    lib.medusa_bf16_rows_amx.argtypes = [_PTR, _C_LONG, _C_LONG, _PTR, _C_LONG, _C_LONG, _PTR, _PTR, _C_LONG,
                                         _C_LONG]
    lib.medusa_bf16_rows_amx.restype = None
    _declare_decoder_ops(lib)
    return lib, ""


def _declare_decoder_ops(lib: ctypes.CDLL) -> None:
    """The argument types of ``kernels/bf16_decoder_ops.c``'s entry points (pointers, longs, floats)."""
    f, n, p = ctypes.c_float, _C_LONG, _PTR
    signatures = {
        "medusa_rms_norm": [p, n, n, p, f, p],
        "medusa_add_rms_norm": [p, p, n, n, p, f, p, p],
        "medusa_rope": [p, n, n, n, n, p, p, n],
        "medusa_attention": [p, n, n, n, n, n, n, p, p, n, n, n, n, p, n, n, f, p, n, p],
        "medusa_silu_mul": [p, n, n, n, p, n],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, None


def library() -> ctypes.CDLL | None:
    """The loaded kernel library (the matmul and the decoder ops), None where :func:`available` is False."""
    return _library()[0]


def available() -> bool:
    """Whether the kernel is built, loaded and allowed on this machine."""
    return _library()[0] is not None


def unavailable_reason() -> str:
    """Why :func:`available` is False ("" when it is True)."""
    return _library()[1]


def fits(weight: torch.Tensor) -> bool:
    """Whether ``weight`` (``[n, k]``) can go through the kernel: bfloat16 on the CPU, ``k`` a multiple of
    :data:`K_MULTIPLE`, and the kernel available."""
    return (weight.dim() == 2 and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
            and weight.shape[1] % K_MULTIPLE == 0 and weight.shape[0] > 0 and available())


def pack(weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedBf16:
    """Pack a ``[n, k]`` bfloat16 weight (see :func:`fits`) and its bias for :func:`rows_matmul`."""
    lib = _library()[0]
    if lib is None or not fits(weight):
        raise ValueError(f"weight {tuple(weight.shape)} {weight.dtype} does not fit the AMX kernel "
                         f"({unavailable_reason() or f'k must be a multiple of {K_MULTIPLE}'})")
    w = weight.detach().contiguous()
    n, k = w.shape
    np_ = -(-n // 16) * 16
    data = torch.empty(np_ * k, dtype=torch.bfloat16)
    lib.medusa_bf16_pack(w.data_ptr(), n, k, k, data.data_ptr(), np_, k)
    b = None if bias is None else bias.detach().to(torch.float32).contiguous()
    return PackedBf16(data=data, bias=b, n=n, k=k, np=np_, call=lib.medusa_bf16_rows_amx,
                      data_ptr=data.data_ptr(), bias_ptr=None if b is None else b.data_ptr(),
                      max_elements=k * MAX_ROWS)


def rows_matmul(x: torch.Tensor, packed: PackedBf16) -> torch.Tensor:
    """``x [..., k] @ W.T + bias`` in bfloat16 (float32 accumulation), ``[..., n]``; ``x`` bfloat16 on the CPU
    (made contiguous if it is not), any number of rows (the kernel takes 32 at a time)."""
    if not x.is_contiguous():
        x = x.contiguous()
    rows = x.numel() // packed.k
    y = torch.empty((*x.shape[:-1], packed.n), dtype=torch.bfloat16)
    packed.call(x.data_ptr(), rows, packed.k, packed.data_ptr, packed.np, packed.k, packed.bias_ptr,
                y.data_ptr(), packed.n, packed.n)
    return y


__all__ = ["ENV", "K_MULTIPLE", "MAX_ROWS", "PackedBf16", "available", "fits", "kernel_dir", "library",
           "pack",
           "rows_matmul", "unavailable_reason"]
