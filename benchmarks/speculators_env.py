"""The ``speculators`` package (vllm-project/speculators: the format ``--format speculators`` writes) in its
own pinned venv (``~/.cache/medusa/speculators-venv``; ``MEDUSA_SPECULATORS_VENV`` overrides).

``speculators==0.9.0`` pins ``transformers<=5.19`` (ours is newer), hence a venv of its own, built once and
reused while its stamp names the same pins (as :mod:`benchmarks.vllm_env` does for vLLM): ``torch==2.13.0``
first (the CPU wheel where one is offered, as for vLLM), then ``speculators==0.9.0`` with torch held at that
pin (otherwise pip upgrades torch to what the newest ``torchvision`` wants), then ``torchvision`` /
``torchaudio`` / ``torchcodec`` are removed: speculators lists them but never imports them, and wheels built
for another torch break ``transformers`` imports.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from benchmarks.vllm_env import BAD_WHEELS
from medusa.errors import MedusaError

TORCH = "torch==2.13.0"
SPECULATORS = "speculators==0.9.0"
PINS = (TORCH, SPECULATORS)
STAMP = ".medusa-speculators-installed"


class SpeculatorsUnavailable(MedusaError):
    """speculators could not be installed here (no network, no wheel for this platform, pip failed)."""


def venv_dir() -> Path:
    default = Path.home() / ".cache" / "medusa" / "speculators-venv"
    return Path(os.environ.get("MEDUSA_SPECULATORS_VENV", default))


def venv_python(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "python"


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SpeculatorsUnavailable(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")


def ensure_venv(venv: Path | None = None) -> Path:
    """The venv's python, building the venv when its stamp is missing or names other pins."""
    venv = venv or venv_dir()
    stamp = venv / STAMP
    if stamp.is_file() and stamp.read_text().split() == list(PINS) and venv_python(venv).is_file():
        return venv_python(venv)
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run([shutil.which("python3") or "python3", "-m", "venv", str(venv)], f"python3 -m venv {venv}")
    pip = [str(venv_python(venv)), "-m", "pip", "install", "--quiet"]
    _run([*pip, TORCH], f"pip install {TORCH}")
    _run([*pip, SPECULATORS, TORCH], f"pip install {SPECULATORS}")
    _run([str(venv_python(venv)), "-m", "pip", "uninstall", "--yes", "--quiet", *BAD_WHEELS],
         f"pip uninstall {' '.join(BAD_WHEELS)}")
    stamp.write_text(" ".join(PINS) + "\n")
    return venv_python(venv)
