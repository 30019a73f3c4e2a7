"""Where the suite finds the packaged real models, converted by ``make test``
(``python -m medusa.modeling.packaged_models [gemma-3-270m]``): skip when absent, fail in CI
(``MEDUSA_REQUIRE_SHARED=1``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def smollm2_dir() -> Path:
    """The converted SmolLM2-135M-Instruct directory (``$MEDUSA_SMOLLM2`` or the model cache)."""
    from medusa.modeling import packaged_models

    path = Path(os.environ.get("MEDUSA_SMOLLM2", packaged_models.default_cache() / "smollm2-135m-instruct"))
    if not (path / "model.safetensors").is_file():
        if os.environ.get("MEDUSA_REQUIRE_SHARED") == "1":
            pytest.fail(f"{path}: the converted SmolLM2 is missing (make test prepares it)")
        pytest.skip(f"{path}: run `python -m medusa.modeling.packaged_models` to prepare SmolLM2")
    return path


def gemma3_dir() -> Path:
    """The converted Gemma-3-270m directory (``$MEDUSA_GEMMA3`` or the model cache)."""
    from medusa.modeling import packaged_models as models

    path = Path(os.environ.get("MEDUSA_GEMMA3", models.model_dir(models.GEMMA3.name)))
    if not models.is_converted(path):
        if os.environ.get("MEDUSA_REQUIRE_SHARED") == "1":
            pytest.fail(f"{path}: the converted Gemma-3-270m is missing (make test prepares it)")
        pytest.skip(f"{path}: run `python -m medusa.modeling.packaged_models gemma-3-270m` to prepare it")
    return path
