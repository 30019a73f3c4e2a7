"""The bench report's ``config``: what :func:`medusa.eval.bench.bench` measured, with which settings, on
what (``s``: its :class:`medusa.eval.bench.BenchSetup`)."""

from __future__ import annotations

import datetime as _dt
import platform
from typing import Any

import torch

from medusa.decoding.tree_option import LOOKUP_TREE, is_lookup_tree, resolve_lookup_tokens, tree_kind


def bench_config(s: Any, assistant_model: Any, prompt_lookup: bool, lookup_tokens: int, repeats: int,
                 ignore_eos: bool) -> dict[str, Any]:
    """The report's ``config``: what was measured, with which settings, on what."""
    import transformers

    model, tree = s.model, s.tree
    params = next(model.base_model.parameters())
    return {
        "base_model": model.config.base_model_name_or_path,
        "num_heads": model.num_heads,
        "num_layers": model.config.num_layers,
        "tree_nodes": (s.lookup_tokens or 0) + 1 if is_lookup_tree(tree) else len(tree) if tree is not None
        else None,
        "tree_source": "given" if tree is not None else "built-in default",
        "tree_kind": LOOKUP_TREE if is_lookup_tree(tree) else tree_kind(tree, model.tree),
        "max_new_tokens": s.max_new_tokens,
        "acceptance": s.acceptance,
        "temperature": None if s.acceptance == "greedy" else s.temperature,
        "top_k": s.top_k, "top_p": s.top_p,
        "ignore_eos": ignore_eos, "repeats": repeats,
        "seed": s.seed,
        "dtype": str(params.dtype).removeprefix("torch."),
        "device": str(params.device),
        "torch_threads": torch.get_num_threads(),
        "assistant_model": str(getattr(getattr(assistant_model, "config", None), "name_or_path", "") or "")
        if assistant_model is not None else None,
        "prompt_lookup_num_tokens": lookup_tokens if prompt_lookup else None,
        "hardware": _hardware(params.device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def lookup_config(s: Any) -> dict[str, Any]:
    """The report config's lookup keys: the MEDUSA row's lookup chain (``lookup_tokens``) and the L of the
    lookup-alone / hybrid rows (``compare_lookup``; None when not measured)."""
    return {"lookup_tokens": resolve_lookup_tokens(s.model, s.tree, s.lookup_tokens),
            "compare_lookup": s.compare_lookup or None}


def _hardware(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import os

    return f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores visible"


__all__ = ["bench_config", "lookup_config"]
