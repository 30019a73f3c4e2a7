"""Compiled MEDUSA against HF static-cache compiled ``generate`` in ``medusa bench --compile``: the baseline's
generation config, the per-prompt fields and the summary (eager-vs-eager beside compiled-vs-compiled)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from medusa.decoding.compiled import compile_mode


def static_compiled_config(gen_cfg: Any, device: torch.device) -> Any:
    """``gen_cfg`` with HF's static cache and its compiled forward (CUDA graphs on CUDA, inductor elsewhere):
    the fair baseline of ``compile=True`` MEDUSA."""
    from transformers.generation.configuration_utils import CompileConfig


    cfg = copy.deepcopy(gen_cfg)
    cfg.cache_implementation = "static"
    cfg.compile_config = CompileConfig(dynamic=False, mode=compile_mode(device) or "default")
    cfg.compile_config._compile_all_devices = True  # HF compiles on CUDA only unless told
    return cfg


def compiled_fields(best: dict[str, float], outputs: dict[str, Any], prompt_len: int, greedy: bool
                    ) -> dict[str, Any]:
    """Compiled MEDUSA against compiled static-cache HF generate on one prompt (never against eager HF)."""
    md, hf = outputs["medusa_compiled"], outputs["baseline_compiled"]
    new_md, new_hf = md.sequences.shape[1] - prompt_len, hf.shape[1] - prompt_len
    return {
        "compiled_baseline_s": best["baseline_compiled"],
        "compiled_medusa_s": best["medusa_compiled"],
        "compiled_speedup": (new_md / best["medusa_compiled"]) / (new_hf / best["baseline_compiled"]),
        "compiled_medusa_step_ms": 1e3 * md.decode_time_s / max(md.num_steps, 1),
        "compiled_hf_step_ms": 1e3 * best["baseline_compiled"] / max(new_hf, 1),
        "compiled_exact_match": bool(torch.equal(md.sequences[0].cpu(), hf[0].cpu())) if greedy else None,
    }


def compiled_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Eager-vs-eager and compiled-vs-compiled speedups side by side (total time over all prompts)."""
    tot = {k: sum(r[k] for r in rows) for k in ("baseline_s", "medusa_s", "compiled_baseline_s",
                                                 "compiled_medusa_s")}
    matches = [r["compiled_exact_match"] for r in rows if r["compiled_exact_match"] is not None]
    return {
        "eager_speedup": tot["baseline_s"] / tot["medusa_s"],
        "compiled_speedup": tot["compiled_baseline_s"] / tot["compiled_medusa_s"],
        "compiled_vs_eager_medusa": tot["medusa_s"] / tot["compiled_medusa_s"],
        "compiled_vs_eager_hf": tot["baseline_s"] / tot["compiled_baseline_s"],
        "compiled_medusa_step_ms": sum(r["compiled_medusa_step_ms"] for r in rows) / len(rows),
        "compiled_hf_step_ms": sum(r["compiled_hf_step_ms"] for r in rows) / len(rows),
        "compiled_exact_match": sum(matches) / len(matches) if matches else None,
    }


def format_compiled(c: dict[str, Any]) -> str:
    """Two lines: eager-vs-eager and compiled-vs-compiled (same prompts, same run)."""
    return (f"eager:    MEDUSA {c['eager_speedup']:.2f}x over HF generate\n"
            f"compiled: MEDUSA {c['compiled_speedup']:.2f}x over HF static-cache compiled generate "
            f"(MEDUSA step {c['compiled_medusa_step_ms']:.2f} ms, HF step {c['compiled_hf_step_ms']:.2f} ms, "
            f"exact match {c['compiled_exact_match']})")


__all__ = ["compiled_fields", "compiled_summary", "format_compiled", "static_compiled_config"]
