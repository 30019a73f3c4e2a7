"""The C library behind the decoder's native paths, built once per machine and loaded through ``ctypes``.

Its sources (``kernels/``): the bfloat16 product of a few rows against a packed weight -- through Intel AMX
tiles (``amx_bf16_rows.c``) where the CPU has them, else through AVX-512 BF16 (``avx512_bf16_rows.c``: AMD Zen
4 / Zen 5, Intel Cooper Lake), chosen once per process behind one entry point (``bf16_rows.c``) and driven by
:mod:`medusa.modeling.bf16_kernel` --, the decoder layer's small ops between matmuls (``bf16_decoder_ops.c``,
:mod:`medusa.modeling.native_body`) and the picks made from logits (``bf16_pick_ops.c``,
:mod:`medusa.native.pick`). It is built with the system's C compiler (``$CC``, else ``cc``) into
``$MEDUSA_CACHE/kernels`` (``~/.cache/medusa/kernels``; the file is named by a hash of sources, flags and
compiler, written to a temporary name and renamed, so concurrent builders are safe). Used where the CPU has
AVX-512 BF16 (Linux ``/proc/cpuinfo``) and the compiler builds it; :func:`unavailable_reason` says why not
otherwise, and every caller keeps its torch path; :func:`kind` says which matmul runs.
``MEDUSA_BF16_KERNEL=0`` turns it off, ``=avx512`` takes AVX-512 BF16 on a CPU with AMX too (to compare).

It sits at the bottom of the package (it imports nothing of medusa's but :mod:`medusa.io`), so the decode
loop (:mod:`medusa.decoding`) and the models (:mod:`medusa.modeling`) both call it.
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
from pathlib import Path

from medusa.io import cache_root

SOURCES = tuple(Path(__file__).with_name("kernels") / name
                for name in ("bf16_rows.c", "amx_bf16_rows.c", "avx512_bf16_rows.c", "bf16_decoder_ops.c",
                             "bf16_pick_ops.c", "bf16_layers.c", "bf16_draft_step.c"))
FLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mamx-tile", "-mamx-bf16",
         "-shared", "-fPIC")
# included by the sources: hashed with them
HEADERS = tuple(Path(__file__).with_name("kernels") / name for name in ("bf16_simd.h", "medusa_ops.h"))
ENV = "MEDUSA_BF16_KERNEL"  # "0": off; "avx512": AVX-512 BF16 even where AMX is (to compare)
AMX, AVX512 = "amx", "avx512_bf16"  # what kind() answers
_C_LONG, _PTR = ctypes.c_long, ctypes.c_void_p


def kernel_dir() -> Path:
    """``$MEDUSA_CACHE/kernels`` (``~/.cache/medusa/kernels``), beside the converted models."""
    return cache_root() / "kernels"


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
    texts = [source.read_text() for source in (*SOURCES, *HEADERS)]
    digest = hashlib.sha256("\0".join([*texts, *FLAGS, version]).encode()).hexdigest()[:16]
    target = kernel_dir() / f"medusa_kernels-{digest}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".medusa_kernels-", suffix=".so", dir=target.parent)
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
def _library() -> tuple[ctypes.CDLL | None, str, str]:
    """The loaded kernel, the matmul it runs (:data:`AMX` or :data:`AVX512`) and why none ("" when loaded);
    asked once per process."""
    choice = os.environ.get(ENV, "1").strip().lower()
    if choice in ("0", "false", "no", "off"):
        return None, "", f"{ENV}=0"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None, "", f"not an x86-64 Linux host ({platform.system()} {platform.machine()})"
    flags = _cpu_flags()
    missing = {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"} - flags
    if missing:
        return None, "", f"this CPU lacks {', '.join(sorted(missing))}"
    cc = _compiler()
    if cc is None:
        return None, "", "no C compiler ($CC or cc) to build the kernel"
    try:
        lib = ctypes.CDLL(str(_build(cc)))
    except (OSError, subprocess.SubprocessError) as e:
        return None, "", f"building the kernel failed: {e}"
    amx = {"amx_tile", "amx_bf16"} <= flags and choice != "avx512"
    if lib.medusa_kernel_init(int(amx)) != 0:  # the OS refused the AMX tile state (arch_prctl)
        amx = False
        lib.medusa_kernel_init(0)
    lib.medusa_bf16_pack.argtypes = [_PTR, _C_LONG, _C_LONG, _C_LONG, _PTR, _C_LONG, _C_LONG]
    lib.medusa_bf16_pack.restype = None
    lib.medusa_bf16_rows.argtypes = [_PTR, _C_LONG, _C_LONG, _PTR, _C_LONG, _C_LONG, _PTR, _PTR, _C_LONG,
                                     _C_LONG]
    lib.medusa_bf16_rows.restype = None
    _declare_ops(lib)
    return lib, AMX if amx else AVX512, ""


def _declare_ops(lib: ctypes.CDLL) -> None:
    """The argument types of ``kernels/bf16_decoder_ops.c``'s and ``kernels/bf16_pick_ops.c``'s entry points
    (pointers, longs, floats)."""
    f, n, p = ctypes.c_float, _C_LONG, _PTR
    signatures = {
        "medusa_rms_norm": [p, n, n, p, f, p],
        "medusa_add_rms_norm": [p, p, n, n, p, f, p, p],
        "medusa_rope": [p, n, n, n, n, p, p, n],
        "medusa_attention": [p, n, n, n, n, n, n, p, p, n, n, n, n, p, n, n, f, p, n, p],
        "medusa_silu_mul": [p, n, n, n, p, n],
        "medusa_kv_append": [p, n, n, n, n, n, n, p, p, n, n, n, n],
        "medusa_add": [p, p, n, p],
        "medusa_draft_layer": [p, *[n] * 7, f, p, p, p, p, n, p, n, n, n, p, p, n, n, n, n, f, p, p, p, p],
        "medusa_body_forward": [p, *[n] * 8, f, p, p, p, p, n, p, n, n, n, p, n, n, n, n, f, p, p, p, p],
        "medusa_first_max": [p, n, n, n, p],
        "medusa_top_log_softmax": [p, n, n, n, n, p, p],
        "medusa_draft_top": [p, n, n, p, f, p, n, p, p, p],
        "medusa_draft_step": [p, p, p, p, *[n] * 7, f, *[p] * 6, n, n, n, p, p, n, n, n, n, f, p, p, p, p, n,
                              p, p],
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
    return _library()[2]


def kind() -> str:
    """The matmul the kernel runs on this machine: :data:`AMX` or :data:`AVX512` ("" where unavailable)."""
    return _library()[1]


__all__ = ["AMX", "AVX512", "ENV", "FLAGS", "HEADERS", "SOURCES", "available", "kernel_dir", "kind",
           "library",
           "unavailable_reason"]
