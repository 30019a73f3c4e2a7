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
from medusa.modeling.config import CONFIG_NAME, TREE_NAME, WEIGHTS_NAME, MedusaConfig
from medusa.modeling.heads_file import pack_heads_file
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


def trim_to_tree(directory: Path, dtype: torch.dtype | None) -> dict[str, Any]:
    """Drop the heads deeper than the calibrated tree reaches (decoding never calls them) and store the
    float tensors in ``dtype``: what ships is what decodes, in as few bytes as it takes."""
    from safetensors.torch import load_file, save_file


    config = MedusaConfig.load(directory)
    tree = json.loads((directory / TREE_NAME).read_text())
    state = load_file(directory / WEIGHTS_NAME)
    if config.head_type == "eagle3":  # one drafter drafting every depth: nothing to trim, only the dtype
        return _store_dtype(directory, config, state, dtype)
    depth = max(len(c) for c in tree["choices"])
    keep = {k: v for k, v in state.items()
            if not (k.split(".")[0] in ("blocks", "lm_heads") and int(k.split(".")[1]) >= depth)}
    if dtype is not None:
        keep = {k: v.to(dtype) if v.is_floating_point() else v for k, v in keep.items()}
        config.dtype = str(dtype).replace("torch.", "")
    save_file(keep, directory / WEIGHTS_NAME)
    dropped = config.num_heads - depth
    config.num_heads = depth
    tree["num_heads"] = depth
    (directory / TREE_NAME).write_text(json.dumps(tree, indent=1) + "\n")
    config.save(directory)
    return {"num_heads": depth, "dropped_heads": dropped, "dtype": config.dtype}


def _store_dtype(directory: Path, config: MedusaConfig, state: dict[str, torch.Tensor],
                 dtype: torch.dtype | None) -> dict[str, Any]:
    """The drafter's floats stored in ``dtype`` while ``config.dtype`` keeps the dtype it decodes in (float32
    for CPU decoding): ``from_pretrained`` casts them back up, so the repository carries half the bytes."""
    from safetensors.torch import save_file

    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        save_file(state, directory / WEIGHTS_NAME, metadata={"format": "pt"})
    stored = next((v.dtype for v in state.values() if v.is_floating_point()), None)
    return {"num_heads": config.num_heads, "dropped_heads": 0, "dtype": config.dtype,
            "stored_dtype": str(stored).replace("torch.", "")}


def tie_to_packaged(heads_dir: str | Path, dest: str | Path, base_dir: str | Path,
                    hub_id: str | None = None, dtype: torch.dtype | None = torch.bfloat16) -> dict[str, Any]:
    """Copy the heads checkpoint ``heads_dir`` to ``dest`` (which must not exist), tied to the converted
    packaged base in ``base_dir`` (its marker's GGUF sha256 and its weights fingerprint), trimmed to its
    tree's depth, stored in ``dtype`` (:func:`trim_to_tree`) and its weight file xz-compressed (lossless,
    :func:`medusa.modeling.heads_file.pack_heads_file`)."""
    dest, base_dir = Path(dest), Path(base_dir)
    if dest.exists():
        raise CheckpointError(f"{dest}: already exists; delete it to ship the heads again")
    marker = json.loads((base_dir / MARKER).read_text()) if (base_dir / MARKER).is_file() else {}
    base = load_base_model(str(base_dir), dtype=torch.float32)
    info = {"name": base_dir.name, "gguf_sha256": marker.get("gguf_sha256"),
            "weights": weights_fingerprint(base)}
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(heads_dir, tmp, ignore=shutil.ignore_patterns("*.png", ".medusa-manifest.json"))
    config = MedusaConfig.load(tmp)
    config.extra = {**(config.extra or {}), PACKAGED_KEY: info}
    if hub_id:
        config.base_model_name_or_path = hub_id
    config.save(tmp)
    trimmed = trim_to_tree(tmp, dtype)
    pack_heads_file(tmp)
    for path in tmp.rglob("*"):  # readable by a server running as another user
        path.chmod(0o755 if path.is_dir() else 0o644)
    tmp.chmod(0o755)
    tmp.rename(dest)
    size = sum(f.stat().st_size for f in dest.iterdir())
    return {"dir": str(dest), "config": str(dest / CONFIG_NAME), "bytes": size, **trimmed, **info}


__all__ = ["ship_heads", "tie_to_packaged", "trim_to_tree"]
