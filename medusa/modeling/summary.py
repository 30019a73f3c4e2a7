"""``medusa info``'s checkpoint summary, read from the files alone (no base model loaded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from medusa.config.enums import DRAFTER_HEAD_TYPES
from medusa.errors import CheckpointError
from medusa.modeling.config import TREE_NAME, MedusaConfig
from medusa.modeling.heads_file import heads_weights_path, read_heads_file
from medusa.tree import DraftTreeShape, MedusaTree


def summarize(path: str | Path) -> dict[str, Any]:
    """A checkpoint summary (no base model loaded): base, heads, parameter count, tree."""
    path = Path(path)
    config = MedusaConfig.load(path)
    state = read_heads_file(heads_weights_path(path))
    summary: dict[str, Any] = {
        "path": str(path),
        "base_model": config.base_model_name_or_path,
        "base_model_type": config.base_model_type,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "num_heads": config.num_heads,
        "num_layers": config.num_layers,
        "head_type": config.head_type,
        "draft_vocab": config.draft_vocab,
        "hydra_projection": config.hydra_projection,
        "dtype": config.dtype,
        "parameters": int(sum(t.numel() for k, t in state.items() if k != "token_map")),
        "merged_backbone": bool(config.base_model_subdir),
        "trained_with": (config.recipe or {}).get("method"),
        "tree": None,
    }
    tree_path = path / TREE_NAME
    # read as decoding reads it: values bounded
    if tree_path.is_file() and config.head_type not in DRAFTER_HEAD_TYPES:
        tree = MedusaTree.from_json(tree_path)
        calib = tree.calibration or {}
        summary["tree"] = {"nodes": len(tree), "depth": tree.depth,
                           "expected_tokens_per_step": calib.get("expected_tokens_per_step")}
    elif tree_path.is_file():
        try:
            data = json.loads(tree_path.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{tree_path}: corrupt JSON ({exc})") from None
        calib = (data.get("calibration") if isinstance(data, dict) else None) or {}
        shape = DraftTreeShape.from_dict(data, source=str(tree_path))  # the drafter's per-step tree sizes
        summary["tree"] = {"nodes": shape.num_nodes, "depth": shape.depth, "branch": shape.branch,
                           "expand": shape.expand, "lookup_tokens": shape.lookup_tokens,
                           "expected_tokens_per_step": calib.get("expected_tokens_per_step")}
    if config.feature_layers is not None:
        summary["feature_layers"] = list(config.feature_layers)
    return summary


__all__ = ["summarize"]
