"""Shipping trained heads with the project: a calibrated checkpoint copied into ``data/heads/<model>/<set>/``
tied to the packaged base it was trained on (:mod:`medusa.modeling.packaged`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from medusa.errors import CheckpointError
from medusa.modeling.base import load_base_model
from medusa.modeling.config import CONFIG_NAME, MedusaConfig
from medusa.modeling.packaged import PACKAGED_KEY, weights_fingerprint
from medusa.modeling.packaged_models import MARKER


def ship_heads(model: str, finals: dict[str, Path], dest: Path, hub_id: str | None = None) -> dict[str, Any]:
    """Copy each calibrated head set into ``dest/<name>/`` tied to the packaged base (its pinned GGUF sha256
    and weights fingerprint): ``MedusaModel.from_pretrained(dest/<name>)`` fetches that base and refuses
    another. Refuses a ``dest/<name>`` that exists (delete it to re-ship)."""
    shipped = {}
    for name, final in finals.items():
        shipped[name] = tie_to_packaged(final, dest / name, model, hub_id=hub_id)
    return {"dest": str(dest), "heads": shipped}


def tie_to_packaged(heads_dir: str | Path, dest: str | Path, base_dir: str | Path,
                    hub_id: str | None = None) -> dict[str, Any]:
    """Copy the heads checkpoint ``heads_dir`` to ``dest`` (which must not exist), tied to the converted
    packaged base in ``base_dir`` (its marker's GGUF sha256 and its weights fingerprint)."""
    dest, base_dir = Path(dest), Path(base_dir)
    if dest.exists():
        raise CheckpointError(f"{dest}: already exists; delete it to ship the heads again")
    marker = json.loads((base_dir / MARKER).read_text()) if (base_dir / MARKER).is_file() else {}
    base = load_base_model(str(base_dir), dtype=torch.float32)
    info = {"name": base_dir.name, "gguf_sha256": marker.get("gguf_sha256"),
            "weights": weights_fingerprint(base)}
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(heads_dir, tmp, ignore=shutil.ignore_patterns("*.png"))
    config = MedusaConfig.load(tmp)
    config.extra = {**(config.extra or {}), PACKAGED_KEY: info}
    if hub_id:
        config.base_model_name_or_path = hub_id
    config.save(tmp)
    tmp.rename(dest)
    return {"dir": str(dest), "config": str(dest / CONFIG_NAME), **info}


__all__ = ["ship_heads", "tie_to_packaged"]
