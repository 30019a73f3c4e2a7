"""The chat benchmark's data helpers: Spec-Bench public rows per category, statistics of distilled replies."""

from __future__ import annotations

from medusa.pipelines.chat_data import spec_bench

from tiny_models import SHARED, require_shared


def test_spec_bench_rows_per_category():
    require_shared(SHARED)
    rows = spec_bench(SHARED, per_category=2)
    cats = [r["category"] for r in rows]
    assert sorted(set(cats)) == ["math_reasoning", "mt_bench", "qa", "rag", "summarization", "translation"]
    assert all(cats.count(c) == 2 for c in set(cats)) and all(r["prompt"].strip() for r in rows)
