"""A peer's own pinned venv (vLLM's CPU build, the ``speculators`` package: their pins clash with ours), built
once and reused while its stamp file names the same pins.

The build: ``python3 -m venv``, each ``pip install`` step in order (torch first: the CPU wheel, so the
peer finds its torch pin satisfied), then :data:`BAD_WHEELS` removed (built for another torch, they break
the peer's imports), then the stamp. A failed step raises the caller's error class with pip's last lines.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from medusa.errors import MedusaError

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
                  error: type[MedusaError]) -> Path:
    """The venv's python, (re)building ``venv`` when its ``stamp`` file is missing or names other ``pins``:
    each of ``installs`` (pip install arguments) in order, then :data:`BAD_WHEELS` uninstalled."""
    marker = venv / stamp
    if marker.is_file() and marker.read_text().split() == list(pins) and venv_python(venv).is_file():
        return venv_python(venv)
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    python3 = shutil.which("python3") or "python3"
    run_step([python3, "-m", "venv", str(venv)], f"python3 -m venv {venv}", error)
    pip = [str(venv_python(venv)), "-m", "pip"]
    for args in installs:
        run_step([*pip, "install", "--quiet", *args], f"pip install {args[0]}", error)
    run_step([*pip, "uninstall", "--yes", "--quiet", *BAD_WHEELS], f"pip uninstall {' '.join(BAD_WHEELS)}",
             error)
    marker.write_text(" ".join(pins) + "\n")
    return venv_python(venv)


__all__ = ["BAD_WHEELS", "ensure_pinned", "run_step", "venv_python"]
