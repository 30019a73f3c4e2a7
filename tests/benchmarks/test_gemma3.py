"""``make bench-gemma`` (benchmarks.gemma3) without the model: prompt splits held out from each other,
the draft-vocabulary budget, the heads' share of the parameters, the targets and the command line."""

from __future__ import annotations

import pytest
import torch

from tiny_models import SHARED, require_shared


def test_text_prompts_hold_out_calibration_and_benchmark():
    from benchmarks.gemma3 import Settings, text_prompts

    require_shared(SHARED)
    s = Settings(shared=str(SHARED), train_stories=6, alpaca_prompts=5, calib_prompts=3, per_category=2)
    rows = text_prompts(s)
    train, calib, bench = ({r["prompt"] for r in rows[k]} for k in ("train", "calib", "bench"))
    assert not (train & calib) and not (train & bench) and not (calib & bench)
    assert len(rows["calib"]) == 6 and sum(r["id"].startswith("alpaca-") for r in rows["train"]) == 5
    cats = [r["category"] for r in rows["bench"]]
    assert sorted(set(cats)) == ["alpaca", "math_reasoning", "mt_bench", "qa", "rag", "summarization",
                                 "tinystories", "translation"]
    assert all(cats.count(c) == 2 for c in set(cats)) and all(r["prompt"].strip() for r in rows["bench"])
    ids = {r["id"] for r in rows["train"]}
    assert not ids & {r["id"] for r in rows["calib"] + rows["bench"]}  # same source row never in two splits


def test_draft_budget_bounds_heads_with_their_own_w2():
    from benchmarks.gemma3 import MAX_HEADS_SHARE, draft_budget
    from medusa.config import HeadsConfig

    base = 268_098_176  # Gemma-3-270m's parameters
    n = draft_budget(HeadsConfig(num_heads=4, num_layers=1, head_type="linear"), 640, base)
    heads = lambda v: 4 * (640 * 640 + 640) + 4 * v * 640
    assert heads(n) <= MAX_HEADS_SHARE * base < heads(n + 1) and 8192 < n < 16384
    assert draft_budget(HeadsConfig(num_heads=4, head_type="shared_lm_head"), 640, base) is None
    assert draft_budget(HeadsConfig(num_heads=4, head_type="hydra", hydra_projection="shared_lm_head"), 640,
                        base) is None


def test_heads_share_counts_float_tensors_not_the_token_map(tmp_path):
    from safetensors.torch import save_file

    from benchmarks.gemma3 import heads_share

    save_file({"blocks.0.0.linear.weight": torch.zeros(4, 4), "token_map": torch.arange(10)},
              str(tmp_path / "medusa_heads.safetensors"))
    save_file({"w": torch.zeros(10, 16)}, str(tmp_path / "model.safetensors"))
    assert heads_share(tmp_path, str(tmp_path)) == {"heads_parameters": 16, "base_parameters": 160,
                                                    "share": 0.1}


def test_targets_say_what_is_unmeasured():
    from benchmarks.gemma3 import format_summary, targets

    bench = {"tokens_per_step": 2.4, "greedy_exact_match": 1.0, "table": "| table |"}
    summary = {"bench": bench, "heads_share": {"share": 0.006, "heads_parameters": 1, "base_parameters": 2},
               "calibrate": {"nodes": 8},
               "draft_vocab": {"chosen": 16384, "depth": 4, "held_out_label_tokens": 10, "rows": [
                   {"draft_vocab": 16384, "held_out_coverage": 0.96, "train_coverage": 1.0,
                    "chain_tokens_per_step": 4.6, "chain_tokens_per_step_full": 5.0, "chain_lost": 0.08}]}}
    t = targets(summary)
    assert t["tokens_per_step"]["met"] and t["greedy_exact_match"]["met"] and t["heads_share"]["met"]
    assert t["draft_vocab"]["met"] and t["tokens_per_step_lost"] == {"target": "< 0.03", "measured": None,
                                                                       "met": None}
    summary["calibrate"]["draft_vocab_loss"] = {"lost_upper_bound": 0.02}  # the oracle bound decides when low
    lost = targets(summary)["tokens_per_step_lost"]
    assert lost == {"target": "< 0.03", "measured": 0.02, "upper_bound": True, "twin_estimate": None,
                    "met": True}
    summary["calibrate"]["draft_vocab_loss"] = {"lost_upper_bound": 0.04}  # and cannot say "missed"
    assert targets(summary)["tokens_per_step_lost"]["met"] is None
    assert "(upper bound)" in format_summary({**summary, "targets": targets(summary)})
    summary["full_vocab_twin"] = {"lost": -0.01}
    assert "0.04 (upper bound); the same heads over the full vocabulary: -0.01" in format_summary(
        {**summary, "targets": targets(summary)})
    bench["hybrid"] = {"tokens_per_step": 1.9}
    assert targets(summary)["hybrid_tokens_per_step"] == {"target": ">= 2.0", "measured": 1.9, "met": False}
    summary["full_vocab"] = {"tokens_per_step_lost": 0.05}  # a measured reference wins over the bound
    summary["targets"] = targets(summary)
    assert summary["targets"]["tokens_per_step_lost"]["met"] is False
    text = format_summary(summary)
    assert "N=16384: coverage 0.9600" in text and "tokens_per_step_lost < 0.03: 0.05 (missed)" in text


def test_parse_settings():
    from benchmarks.gemma3 import parse_settings

    s, _ = parse_settings(["--candidates", "1024,2048", "--per-category", "1", "--set", "train.epochs=1",
                           "--compare-lookup-tokens", "6"])
    assert s.candidates == (1024, 2048) and s.per_category == 1 and s.recipe_overrides == ("train.epochs=1",)
    assert s.compare_lookup_tokens == 6 and parse_settings([])[0].compare_lookup_tokens == 8
    with pytest.raises(SystemExit):
        parse_settings(["--medusa2"])
