"""``medusa bench --compile``'s pieces: the fair compiled HF baseline's generation config, one prompt's
compiled fields and the eager-vs-compiled summary (compiled decoding: tests/decoding/test_compiled.py)."""

from types import SimpleNamespace

import torch
from transformers import GenerationConfig

from medusa.eval.bench_compiled import (
    compiled_fields,
    compiled_summary,
    format_compiled,
    static_compiled_config,
)


def test_static_compiled_config_is_a_copy_with_the_static_cache():
    cfg = GenerationConfig(max_new_tokens=7)
    out = static_compiled_config(cfg, torch.device("cpu"))
    assert out.cache_implementation == "static" and out.compile_config.dynamic is False
    assert out.compile_config._compile_all_devices and out.max_new_tokens == 7
    assert cfg.cache_implementation is None  # the caller's config is untouched


def test_compiled_fields_and_summary():
    seq = torch.tensor([[1, 2, 3, 4, 5, 6]])
    md = SimpleNamespace(sequences=seq, decode_time_s=0.3, num_steps=3)
    best = {"baseline_compiled": 2.0, "medusa_compiled": 1.0}
    row = compiled_fields(best, {"medusa_compiled": md, "baseline_compiled": seq}, prompt_len=2, greedy=True)
    assert row["compiled_speedup"] == 2.0 and row["compiled_exact_match"] is True
    assert row["compiled_medusa_step_ms"] == 100.0 and row["compiled_hf_step_ms"] == 500.0
    other = compiled_fields(best, {"medusa_compiled": md, "baseline_compiled": seq + 1}, 2, greedy=True)
    assert other["compiled_exact_match"] is False
    assert compiled_fields(best, {"medusa_compiled": md, "baseline_compiled": seq}, 2, greedy=False)[
        "compiled_exact_match"] is None
    rows = [dict(row, baseline_s=3.0, medusa_s=2.0), dict(other, baseline_s=1.0, medusa_s=2.0)]
    summary = compiled_summary(rows)
    assert summary["eager_speedup"] == 1.0 and summary["compiled_speedup"] == 2.0
    assert summary["compiled_vs_eager_medusa"] == 2.0 and summary["compiled_exact_match"] == 0.5
    text = format_compiled(summary)
    assert text.splitlines()[0] == "eager:    MEDUSA 1.00x over HF generate" and "exact match 0.5" in text
