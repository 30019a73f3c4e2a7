"""Per-category figures (Spec-Bench style) are the same aggregate applied to each category's rows."""

from collections import Counter

import pytest

from medusa.eval.report import aggregate, category_table, summarize


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
