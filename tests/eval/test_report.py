"""medusa.eval.report: per-category figures (Spec-Bench style) are the same aggregate applied to each
category's rows; the files written, the markdown table and the terminal summary."""

import json
from collections import Counter

import pytest

from medusa.eval.report import (
    aggregate,
    category_table,
    format_summary,
    markdown_table,
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


def _with_lookup(row, lookup_s, hybrid_s, steps):
    """``row`` with the lookup-alone and hybrid methods (bench(compare_lookup=L)), both exact."""
    for key, seconds in (("lookup_alone", lookup_s), ("hybrid", hybrid_s)):
        row.update({f"{key}_s": seconds, f"{key}_new_tokens": row["new_tokens"],
                    f"{key}_speedup": row["baseline_s"] / seconds, f"{key}_exact_match": True,
                    f"{key}_steps": steps, f"{key}_tokens_per_step": (row["new_tokens"] - 1) / steps})
    return row


def test_lookup_methods_aggregate_and_show_in_every_table():
    rows = [_with_lookup(_row("qa", 10, 2.0, 21, 1.0, 0.5, True, 0.9), 0.8, 0.4, 5),
            _with_lookup(_row("rag", 5, 3.0, 16, 2.0, 0.5, True, 1.0), 1.0, 0.5, 10)]
    report = summarize(rows, Counter({2: 15}), {"compare_lookup": 4})
    hybrid = report["hybrid"]
    assert hybrid["tokens_per_step"] == pytest.approx((20 + 15) / 15)  # gained tokens / steps, pooled
    assert hybrid["speedup"] == pytest.approx((2.5 + 4.0) / 2) and hybrid["greedy_exact_match"] == 1.0
    assert hybrid["tokens_per_s"] == pytest.approx(37 / 0.9)
    assert report["categories"]["rag"]["lookup_alone"]["tokens_per_step"] == pytest.approx(1.5)
    lines = format_summary(report).splitlines()
    assert lines[1].startswith("MEDUSA heads only ")
    hybrid_line = f"MEDUSA hybrid        {37 / 0.9:8.1f} tokens/s, 3.25x, 2.33 tokens/step, exact match 1.00"
    assert hybrid_line in lines
    assert lines[-1].startswith("HF prompt lookup")
    table = category_table(report).splitlines()
    assert table[1].count("|---") == 5 + 3 + 3 + 2
    # qa: lookup alone, then hybrid (tokens/step, speedup, exact match)
    assert table[2].split(" | ")[5:11] == ["4.00", "1.25x", "1.00", "4.00", "2.50x", "1.00"]
    for r in rows:
        r.update(prompt_tokens=5, baseline_tokens_per_s=21.0, medusa_tokens_per_s=42.0)
    report["config"] = {"base_model": "m", "num_heads": 3, "tree_nodes": 8, "max_new_tokens": 21,
                        "acceptance": "greedy", "dtype": "float32", "hardware": "cpu", "torch_threads": 1,
                        "date": "2026-11-24", "compare_lookup": 4}
    md = markdown_table(report)
    assert f"| MEDUSA hybrid (L=4) | {37 / 0.9:.1f} | 3.25x | 2.33 | — | 1.00 |" in md
    assert "| MEDUSA heads only |" in md


def test_reports_without_lookup_methods_are_unchanged():
    rows = [_row("qa", 10, 2.0, 21, 1.0, 0.5, True, 0.9)]
    report = summarize(rows, Counter({2: 10}), {})
    assert "lookup_alone" not in report and "hybrid" not in report
    assert category_table(report).splitlines()[0] == (
        "| category | prompts | tokens/step | speedup | exact match | prompt lookup speedup "
        "| lookup exact match |")
    assert format_summary(report).splitlines()[1].startswith("MEDUSA               ")
