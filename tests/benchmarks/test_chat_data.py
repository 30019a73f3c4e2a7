"""The chat benchmark's data helpers: Spec-Bench public rows per category, statistics of distilled replies,
requests built on the model's own replies."""

from __future__ import annotations

import json

import pytest

from benchmarks.chat_data import DOC_KINDS, MAX_DOC_CHARS, document_tasks, reply_stats, spec_bench
from medusa.errors import DataError

from tiny_models import SHARED, require_shared


def test_spec_bench_rows_per_category():
    require_shared(SHARED)
    rows = spec_bench(SHARED, per_category=2)
    cats = [r["category"] for r in rows]
    assert sorted(set(cats)) == ["math_reasoning", "mt_bench", "qa", "rag", "summarization", "translation"]
    assert all(cats.count(c) == 2 for c in set(cats)) and all(r["prompt"].strip() for r in rows)


def test_spec_bench_groups_mt_bench_and_names_a_bad_row(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"question_id": 1, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
            {"question_id": 2, "category": "qa", "turns": ["Who?"]},
            {"question_id": 3, "category": "coding", "turns": ["Sort a list."]},
            {"category": "qa", "turns": ["Why?"]}]
    path = data / "spec_bench_public.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert spec_bench(tmp_path, per_category=None) == [
        {"id": "mt_bench-1", "category": "mt_bench", "prompt": "Write a poem."},
        {"id": "qa-2", "category": "qa", "prompt": "Who?"},
        {"id": "mt_bench-3", "category": "mt_bench", "prompt": "Sort a list."},
        {"id": "qa-4", "category": "qa", "prompt": "Why?"}]  # no question_id: the line number
    assert [r["id"] for r in spec_bench(tmp_path, per_category=1)] == ["mt_bench-1", "qa-2"]
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"category": "qa", "turns": []}) + "\n")
    with pytest.raises(DataError, match=r"spec_bench_public\.jsonl:2: not a Spec-Bench row \(IndexError\)"):
        spec_bench(tmp_path, per_category=None)
    with pytest.raises(DataError, match="not found"):
        spec_bench(tmp_path / "nowhere", per_category=None)


def test_reply_stats_counts_rows_tokens_and_cut_replies(tmp_path):
    def row(reasons, tokens):
        meta = {"finish_reasons": reasons, "completion_tokens": tokens}
        return json.dumps({"messages": [], "metadata": meta})

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join([row(["stop"], 10), row(["stop", "length"], 32), ""]) + "\n")
    b.write_text(row(["length"], 16) + "\n" + json.dumps({"prompt": "p", "completion": "c"}) + "\n")
    assert reply_stats([a, b]) == {"rows": 4, "reply_tokens": 58, "truncated_share": 0.5}
    assert reply_stats([]) == {"rows": 0, "reply_tokens": 0, "truncated_share": 0.0}


def _replied(i, words):
    reply = " ".join(f"Word{i}x{k}." for k in range(words))
    return {"messages": [{"role": "user", "content": f"request {i}"},
                         {"role": "assistant", "content": reply}]}


def test_document_tasks_cycle_kinds_on_the_models_own_replies():
    rows = [_replied(i, 60) for i in range(8)] + [_replied(99, 5)]  # the last reply is too short to be a doc
    tasks = document_tasks(rows)
    assert [t["kind"] for t in tasks] == [*DOC_KINDS, *DOC_KINDS[:2]]
    assert len({t["id"] for t in tasks}) == 8
    by_kind = {t["kind"]: t for t in reversed(tasks)}  # the first of each kind
    summary = by_kind["summarize"]["messages"]
    assert len(summary) == 1 and summary[0]["content"].endswith(rows[0]["messages"][1]["content"])
    answer = by_kind["answer"]["messages"][0]["content"]
    assert "Word1x0." in answer and answer.endswith("Question: request 1")
    passages = by_kind["passages"]["messages"][0]["content"]
    assert "Word2x0." in passages and "Word1x0." in passages  # its own text and its neighbour's
    follow = by_kind["follow_up"]["messages"]
    assert [m["role"] for m in follow] == ["user", "assistant", "user"]
    assert follow[0]["content"] == "request 5" and follow[1] == rows[5]["messages"][1]
    assert all(len(t["messages"][0]["content"]) < MAX_DOC_CHARS + 400 for t in tasks)


def test_document_tasks_clip_long_replies_at_a_sentence():
    tasks = document_tasks([_replied(0, 400)])
    text = tasks[0]["messages"][0]["content"]
    assert text.endswith(".") and len(text) < MAX_DOC_CHARS + 100
