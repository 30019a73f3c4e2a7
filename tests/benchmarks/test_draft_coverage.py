"""Draft-vocabulary coverage: the map from the training replies, measured on other replies; the head's
cost; Spec-Bench replies grouped by category."""

from __future__ import annotations

import json

import pytest
import torch
from selfdistill_helpers import chat_tokenizer

from benchmarks import draft_coverage as C

from tiny_models import SHARED, require_shared


def _ex(labels):
    return {"input_ids": list(range(len(labels))), "labels": labels}


def test_coverage_rows_take_the_map_from_training_labels_only():
    train = [_ex([-100, 1, 1, 1, 2, 2, 3])]  # frequency order: 1, 2, 3
    evals = {"held": [_ex([-100, 1, 2, 4, 4])], "other": [_ex([3, 3, 1, 5])]}
    rows = C.coverage_rows(train, evals, vocab_size=8, sizes=(1, 2, 3), depth=1)
    assert rows[0]["draft_vocab"] == "full" and rows[0]["held_chain"] == pytest.approx(2.0)
    by_n = {r["draft_vocab"]: r for r in rows[1:]}
    assert by_n[1]["train"] == pytest.approx(3 / 6) and by_n[1]["held"] == pytest.approx(1 / 4)
    assert by_n[2]["held"] == pytest.approx(2 / 4) and by_n[2]["other"] == pytest.approx(1 / 4)
    assert by_n[3]["other"] == pytest.approx(3 / 4)
    # held labels 1 2 4 4, depth 1: positions 0..2 gain when the next label is drafted (2 yes, 4 no, 4 no)
    assert by_n[2]["held_chain"] == pytest.approx(1 + 1 / 3)


def test_head_cost_counts_and_times():
    cost = C.head_cost(8192, 576, rows=4, repeats=2)
    assert cost["params_m"] == pytest.approx(4.72, abs=0.01) and cost["mmac_per_token"] == cost["params_m"]
    assert cost["ms_4_rows"] > 0
    assert "ms_8_rows" not in C.head_cost(16, 8)
    assert "ms_4_rows_packed" not in cost  # float32: only the stock product


def test_head_cost_times_the_packed_head_in_bf16_where_the_kernel_runs():
    from medusa.modeling import bf16_kernel

    cost = C.head_cost(256, 64, rows=4, dtype=torch.bfloat16, repeats=2)
    assert cost["ms_4_rows"] > 0
    assert ("ms_4_rows_packed" in cost) == (bf16_kernel.available() and bf16_kernel.fits(torch.zeros(256, 64,
                                                                                             dtype=torch.bfloat16)))


def test_reply_files_skip_errors_and_requests(tmp_path):
    for name in ("a.jsonl", "a.errors.jsonl", "synth.prompts.jsonl", "b.jsonl", "c.txt"):
        (tmp_path / name).write_text("")
    assert [p.name for p in C.reply_files(tmp_path)] == ["a.jsonl", "b.jsonl"]


def test_spec_bench_replies_group_by_category(tmp_path):
    require_shared(SHARED)
    prompts = C.spec_bench_prompts(SHARED, per_category=1)
    assert len(prompts) == 6 and all(len(p["messages"]) == 1 for p in prompts)
    rows = [{"id": p["id"], "messages": [*p["messages"], {"role": "assistant", "content": "Yes, it is."}]}
            for p in prompts[:3]]
    path = tmp_path / "sb.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    groups = C.by_category(path, chat_tokenizer())
    cats = sorted({p["id"].split("-")[0] for p in prompts[:3]})
    assert sorted(groups) == sorted(["spec_bench", *(f"sb_{c}" for c in cats)])
    assert len(groups["spec_bench"]) == 3
    assert all(any(x != -100 for x in ex["labels"]) for ex in groups["spec_bench"])


def test_shipped_map_row_reads_the_token_map(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"token_map": torch.tensor([1, 2], dtype=torch.long), "w": torch.zeros(2)}, tmp_path / "h.st")
    row = C.shipped_map_row(tmp_path / "h.st", {"held": [_ex([-100, 1, 2, 4, 4])]})
    assert row == {"draft_vocab": "shipped 2", "held": pytest.approx(0.5)}


def test_shipped_map_row_reads_a_packed_heads_folder(tmp_path):
    import lzma

    import torch
    from safetensors.torch import save

    data = save({"token_map": torch.tensor([1, 2, 4], dtype=torch.long), "w": torch.zeros(2)})
    (tmp_path / "medusa_heads.safetensors.xz").write_bytes(lzma.compress(data))
    row = C.shipped_map_row(tmp_path, {"held": [_ex([-100, 1, 2, 4, 4])]})
    assert row == {"draft_vocab": "shipped 3", "held": pytest.approx(1.0)}
