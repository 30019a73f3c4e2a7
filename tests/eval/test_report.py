"""medusa.eval.report: per-category figures (Spec-Bench style) are the same aggregate applied to each
category's rows; the files written, the markdown table and the terminal summary."""

import json
from collections import Counter

import pytest

from medusa.eval.report import (
    aggregate,
    category_table,
    format_summary,
    report_paths,
    summarize,
    write_report,
)


def _row(category, steps, tps, new, base_s, md_s, exact, lookup_s):
    return {"category": category, "steps": steps, "tokens_per_step": tps, "new_tokens": new,
            "baseline_new_tokens": new, "baseline_s": base_s, "medusa_s": md_s,
            "speedup": base_s / md_s, "medusa_step_ms": 2.0, "plain_step_ms": 1.0, "hf_step_ms": 1.1,
            "exact_match": exact, "prompt_lookup_s": lookup_s, "prompt_lookup_new_tokens": new,
            "prompt_lookup_speedup": base_s / lookup_s, "prompt_lookup_exact_match": True}


def test_categories_aggregate_their_own_rows():
    rows = [_row("qa", 10, 2.0, 21, 1.0, 0.5, True, 0.9), _row("qa", 5, 3.0, 16, 2.0, 0.5, True, 1.0),
            _row("rag", 8, 1.5, 13, 1.0, 1.0, False, 0.5)]
    report = summarize(rows, Counter({1: 3, 2: 10, 3: 10}), {})
    assert list(report["categories"]) == ["qa", "rag"]
    qa = report["categories"]["qa"]
    assert qa == aggregate(rows[:2])
    assert qa["tokens_per_step"] == pytest.approx((10 * 2.0 + 5 * 3.0) / 15)  # gained tokens / steps, pooled
    assert qa["speedup"] == pytest.approx((2.0 + 4.0) / 2)  # median of two per-prompt ratios
    assert report["categories"]["rag"]["greedy_exact_match"] == 0.0
    assert report["greedy_exact_match"] == pytest.approx(2 / 3)
    table = category_table(report).splitlines()
    assert [line.split("|")[1].strip() for line in table[2:]] == ["qa", "rag", "overall"]
    assert "2.33" in table[2] and "0.00" in table[3]  # qa tokens/step; rag's exact match


def test_no_categories_without_labels():
    row = _row("x", 4, 2.0, 9, 1.0, 0.5, True, 0.8)
    del row["category"]
    assert "categories" not in summarize([row], Counter({2: 4}), {})


def test_report_paths_are_what_write_report_writes(tmp_path):
    out = tmp_path / "bench" / "run.json"
    folder = tmp_path / "bench"
    assert report_paths(out) == [out, folder / "run.md", folder / "run_accept_lengths.png",
                                 folder / "run_speedup.png"]
    assert report_paths(out, plots=False) == [out, tmp_path / "bench" / "run.md"]
    rows = [_row("qa", 10, 2.0, 21, 1.0, 0.5, True, 0.9)]
    for r in rows:
        r.update(prompt_tokens=5, baseline_tokens_per_s=21.0, medusa_tokens_per_s=42.0)
    config = {"base_model": "m", "num_heads": 3, "tree_nodes": 8, "max_new_tokens": 21,
              "acceptance": "greedy", "dtype": "float32", "hardware": "cpu", "torch_threads": 1,
              "date": "2026-11-24"}
    report = summarize(rows, Counter({2: 10}), config)
    assert write_report(report, out, plots=False) == report_paths(out, plots=False)
    assert json.loads(out.read_text())["config"] == config
    table = out.with_suffix(".md").read_text()
    assert "| MEDUSA | 42.0 | 2.00x | 2.00 | 2.00 | 1.00 |" in table
    assert "| 0 | 5 | 21 | 21.0 | 42.0 |" in table


def test_format_summary_lines():
    rows = [_row("qa", 10, 2.0, 21, 1.0, 0.5, True, 0.9), _row("qa", 5, 3.0, 16, 2.0, 0.5, True, 1.0)]
    report = summarize(rows, Counter({2: 15}), {})
    lines = format_summary(report).splitlines()
    assert lines[0] == f"HF generate          {37 / 3.0:8.1f} tokens/s"
    assert lines[2] == "speedup (median)         3.00x   (range 2.00-4.00)"
    assert lines[5] == "greedy exact match       1.00" and lines[-1].startswith("HF prompt lookup")
    assert lines[-1] == f"HF prompt lookup     {37 / 1.9:8.1f} tokens/s, {(1 / 0.9 + 2.0) / 2:.2f}x"
    report["greedy_exact_match"] = None
    del report["prompt_lookup"]
    assert not any(line.startswith(("greedy", "HF prompt")) for line in format_summary(report).splitlines())
