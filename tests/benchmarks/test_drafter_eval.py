"""The drafter comparison: held-out requests cut before the last reply, Spec-Bench per category, greedy
decoding through one tree counted per category, a clear error for a bad row."""

from __future__ import annotations

import json

import pytest
import torch
from selfdistill_helpers import chat_tokenizer, tiny_chat_model

from benchmarks import drafter_eval as E
from medusa.errors import DataError
from medusa.modeling.model import MedusaModel
from medusa.tree import DraftTreeShape

from tiny_models import SHARED, require_shared


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_held_out_requests_end_before_the_last_reply(tmp_path):
    (tmp_path / "heldout").mkdir()
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
             {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    _write(tmp_path / "heldout" / "multi_turn.jsonl", [{"messages": turns}] * 3)
    _write(tmp_path / "heldout" / "alpaca.jsonl", [{"messages": turns[:2]}])
    rows = E.held_out_requests(tmp_path, per_part=2)
    assert [r["category"] for r in rows] == ["alpaca", "multi_turn", "multi_turn"]
    assert rows[0]["messages"] == turns[:1] and rows[1]["messages"] == turns[:3]
    _write(tmp_path / "heldout" / "math.jsonl", [{"messages": turns}, {"text": "x"}])
    with pytest.raises(DataError, match=r"math.jsonl:2: not a conversation row \(KeyError\)"):
        E.held_out_requests(tmp_path, per_part=2)
    with pytest.raises(DataError, match="no held-out replies"):
        E.held_out_requests(tmp_path / "none", per_part=1)


def test_prompt_sets_take_spec_bench_per_category(tmp_path):
    require_shared(SHARED / "data" / "spec_bench_public.jsonl")
    (tmp_path / "heldout").mkdir()
    _write(tmp_path / "heldout" / "rag.jsonl", [{"messages": [{"role": "user", "content": "q"},
                                                              {"role": "assistant", "content": "r"}]}])
    sets = E.prompt_sets(tmp_path, SHARED, per_part=1, per_category=2)
    assert [r["category"] for r in sets["held_out"]] == ["rag"]
    cats = [r["category"] for r in sets["spec_bench"]]
    assert len(cats) == 2 * len(set(cats)) and "translation" in cats
    assert all(len(r["messages"]) == 1 and r["messages"][0]["role"] == "user" for r in sets["spec_bench"])


def test_decode_set_counts_accepted_tokens_per_category():
    """Every decoded token is counted once: tokens = the generated length, steps >= tokens / (depth + 1)."""
    tok = chat_tokenizer()
    model = MedusaModel.from_base(tiny_chat_model(), num_heads=2, num_layers=1, head_type="eagle3").eval()
    rows = [{"id": "a-1", "category": "a", "messages": [{"role": "user", "content": "Once upon a time"}]},
            {"id": "b-1", "category": "b", "messages": [{"role": "user", "content": "The cat"}]}]
    shape = DraftTreeShape(4, 2, 2, 2)
    with torch.no_grad():
        out = E.decode_set(model, tok, rows, shape, max_new_tokens=8)
    assert set(out["per_category"]) == {"a", "b"} and set(out["per_row"]) == {"a-1", "b-1"}
    assert [sum(v[i] for v in out["per_row"].values()) for i in (0, 1)] == [out["tokens"], out["steps"]]
    assert 1.0 <= out["tokens_per_step"] <= 3.0 and out["tokens"] >= out["steps"]
    assert out["tokens_per_s"] > 0
    table = E.table([{"drafter": "/x/d", "draft_vocab": 0, "held_out": out, "spec_bench": out}])
    head = "| drafter | draft vocab | held-out | Spec-Bench | Spec-Bench tok/s | a | b |"
    assert table.splitlines()[0] == head


def test_own_tree_decodes_hydra_heads_through_their_tree_without_its_lookup_chain(tmp_path):
    """``--tree own``: static-tree heads (Hydra) decode through their calibrated tree; ``lookup`` 0 drops the
    tree's lookup chain, so every accepted token is a head's (at most depth + 1 per step)."""
    from medusa.tree import MedusaTree

    tok = chat_tokenizer()
    model = MedusaModel.from_base(tiny_chat_model(), num_heads=2, num_layers=1, head_type="hydra").eval()
    model.tree = MedusaTree([[0], [1], [0, 0]], num_heads=2, lookup_tokens=6)
    rows = [{"category": "a", "messages": [{"role": "user", "content": "Once upon a time"}]}]
    with torch.no_grad():
        out = E.decode_set(model, tok, rows, None, max_new_tokens=8, lookup=0)
    assert 1.0 <= out["tokens_per_step"] <= 3.0 and out["tokens"] >= out["steps"]
    E.check_own_tree(tmp_path, model)  # it has a tree
    model.tree = None
    with pytest.raises(DataError, match="--tree own, but it has no tree.json"):
        E.check_own_tree(tmp_path, model)
    with pytest.raises(DataError, match="four integers\\) or 'own'"):
        E.parse_shape("8,4,2", 0)
    assert E.parse_shape("8,4,2,2", 3) == DraftTreeShape(8, 4, 2, 2, 3)
