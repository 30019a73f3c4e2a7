"""A peer's own pinned venv (vLLM's CPU build, the ``speculators`` package: their pins clash with ours), built
once and reused while its stamp file names the same pins.

The build: ``python3 -m venv``, each ``pip install`` step in order (torch first: the CPU wheel, so the
peer finds its torch pin satisfied), then :data:`BAD_WHEELS` removed (built for another torch, they break
the peer's imports), then the stamp. A failed step raises the caller's error class with pip's last lines.
The check and the build run under :func:`medusa.io.build_lock` (``.<venv>.lock`` beside the venv): of two
processes asking at once (two pytest-xdist workers), one builds and the other waits, then reuses it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from medusa.errors import MedusaError
from medusa.io import build_lock

BAD_WHEELS = ("torchvision", "torchaudio", "torchcodec")


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def run_step(argv: list[str], what: str, error: type[MedusaError]) -> None:
    """Run one build step; ``error`` (one line: the step, its exit status, pip's last lines) if it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise error(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")


def ensure_pinned(venv: Path, stamp: str, pins: Sequence[str], installs: Sequence[Sequence[str]],
                  error: type[MedusaError], complete: Callable[[Path], None] | None = None) -> Path:
    """The venv's python, (re)building ``venv`` when its ``stamp`` file is missing or names other ``pins``:
    each of ``installs`` (pip install arguments) in order, then :data:`BAD_WHEELS` uninstalled. Then
    ``complete(venv)`` (what the venv needs besides pip installs; it checks for itself whether that is
    there), still under the lock."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(venv):
        if not _is_built(venv, stamp, pins):
            _build(venv, stamp, pins, installs, error)
        if complete is not None:
            complete(venv)
    return venv_python(venv)


def _is_built(venv: Path, stamp: str, pins: Sequence[str]) -> bool:
    marker = venv / stamp
    return marker.is_file() and marker.read_text().split() == list(pins) and venv_python(venv).is_file()


def _build(venv: Path, stamp: str, pins: Sequence[str], installs: Sequence[Sequence[str]],
           error: type[MedusaError]) -> None:
    if venv.exists():
        shutil.rmtree(venv)
    python3 = shutil.which("python3") or "python3"
    run_step([python3, "-m", "venv", str(venv)], f"python3 -m venv {venv}", error)
    pip = [str(venv_python(venv)), "-m", "pip"]
    for args in installs:
        run_step([*pip, "install", "--quiet", *args], f"pip install {args[0]}", error)
    run_step([*pip, "uninstall", "--yes", "--quiet", *BAD_WHEELS], f"pip uninstall {' '.join(BAD_WHEELS)}",
             error)
    (venv / stamp).write_text(" ".join(pins) + "\n")


__all__ = ["BAD_WHEELS", "ensure_pinned", "run_step", "venv_python"]
