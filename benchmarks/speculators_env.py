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
from pathlib import Path

from benchmarks.pinned_venv import ensure_pinned
from benchmarks.pinned_venv import venv_python as pinned_python
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
    return pinned_python(venv or venv_dir())


def ensure_venv(venv: Path | None = None) -> Path:
    """The venv's python, building the venv when its stamp is missing or names other pins."""
    return ensure_pinned(venv or venv_dir(), STAMP, PINS, [[TORCH], [SPECULATORS, TORCH]],
                         SpeculatorsUnavailable)
