"""``make bench-chat`` (benchmarks.smollm2): the distill stage on the real chat model, the targets, the
printed summary and the command line."""

from __future__ import annotations

import pytest
from real_models import smollm2_dir

from benchmarks import smollm2

from tiny_models import SHARED, require_shared


def test_distill_stage_writes_chat_replies_and_resumes(tmp_path):
    """The bench-chat distill stage on a few prompts: greedy replay replies through the chat template."""
    import json

    from benchmarks.smollm2 import Settings, distill_stage

    require_shared(SHARED)
    model = str(smollm2_dir())
    s = Settings(out=str(tmp_path), shared=str(SHARED), sharegpt_prompts=2, alpaca_prompts=2, calib_prompts=2,
                 distill_tokens=8, distill_batch=4, progress=False)
    first = distill_stage(s, model, tmp_path / "data")
    assert first["train_rows"] == 4 and first["calib_rows"] == 2
    rows = [json.loads(line) for line in (tmp_path / "data" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        roles = [turn["role"] for turn in row["messages"]]
        assert roles == ["user", "assistant"] and row["messages"][1]["content"].strip()
        assert row["metadata"]["mode"] == "replay" and row["metadata"]["completion_tokens"] <= 8
    again = distill_stage(s, model, tmp_path / "data")
    assert sum(p["written"] for p in again["parts"]) == 0  # resumed: every row was already there


def test_targets_take_the_worst_exactness_and_the_best_speedup():
    bench = {"tokens_per_step": 2.4, "greedy_exact_match": 1.0, "speedup": 0.8}
    summary = {"bench": bench, "hydra": {"bench": {**bench, "tokens_per_step": 2.9, "speedup": 1.6}},
               "medusa2": {"bench": {**bench, "tokens_per_step": 3.1, "greedy_exact_match": 0.5}}}
    t = smollm2.targets(summary)
    assert t["medusa1_tokens_per_step"] == {"target": 2.3, "measured": 2.4, "met": True}
    assert t["hydra_tokens_per_step"] == {"target": 3.0, "measured": 2.9, "met": False}
    assert t["medusa2_tokens_per_step"]["met"] and t["best_speedup"] == {"target": 1.5, "measured": 1.6,
                                                                          "met": True}
    assert t["greedy_exact_match"] == {"target": 1.0, "measured": 0.5, "met": False}
    assert smollm2.targets({}) == {}  # nothing measured, nothing claimed


def test_format_summary_of_a_shipping_run_and_of_a_benchmark():
    shipped = {"ship": {"dest": "data/heads/x", "heads": {"medusa1": {}, "hydra": {}}},
               "calibrate": {"nodes": 24, "expected_tokens_per_step": 2.345},
               "hydra": {"calibrate": {"nodes": 32, "expected_tokens_per_step": 3.1}}}
    assert smollm2.format_summary(shipped).splitlines() == [
        "shipped to data/heads/x: medusa1, hydra",
        "MEDUSA-1 calibration: 24 nodes, predicted 2.35 tokens/step",
        "Hydra calibration: 32 nodes, predicted 3.10 tokens/step"]
    bench = {"cost_curve": {"ms": {1: 2.0, 8: 3.0}, "relative": {1: 1.0, 8: 1.5},
                            "packed_ms": {"1": 2.0, "8": 2.5}},
             "calibrate": {"nodes": 8}, "bench": {"table": "| MEDUSA-1 table |"},
             "targets": {"best_speedup": {"target": 1.5, "measured": 1.2, "met": False}}}
    assert smollm2.format_summary(bench).splitlines() == [
        "one forward over a 200-token cache, stock linears: 1 tok 2.0 ms (1.00x), 8 tok 3.0 ms (1.50x)",
        "the same, pre-packed linears: 1 tok 2.0 ms (1.00x), 8 tok 2.5 ms (1.25x)",
        "MEDUSA-1 (8-node tree):", "| MEDUSA-1 table |",
        "target best_speedup >= 1.5: measured 1.20 (missed by 0.30)"]


def test_parse_settings():
    s, args = smollm2.parse_settings(["--all-prompts", "--calib-prompts", "100", "--hydra-set",
                                      "train.epochs=1", "--set", "train.lr=1e-3", "--ship", "out/ship",
                                      "--no-progress", "--debug"])
    assert (s.sharegpt_prompts, s.alpaca_prompts, s.per_category) == (None, 4900, None)
    assert s.hydra_overrides == ("train.epochs=1",) and s.recipe_overrides == ("train.lr=1e-3",)
    assert s.ship == "out/ship" and s.progress is False and args.debug
    default, _ = smollm2.parse_settings([])
    assert (default.alpaca_prompts, default.per_category, default.nodes) == (4800, 10, "auto")
    with pytest.raises(SystemExit):
        smollm2.parse_settings(["--per-category", "many"])


def test_bench_by_category_compares_lookup_with_the_trees_length(tmp_path, monkeypatch):
    """The per-category bench measures heads only, lookup alone, hybrid and HF prompt lookup: L is the
    tree.json's lookup_tokens, else the settings' default; none with a dynamic tree or without prompt
    lookup."""
    import json

    from medusa.tree import MedusaTree

    calls = []

    def fake_bench_stage(heads, prompts, report, max_new_tokens, **kwargs):
        calls.append(kwargs)
        report.write_text("{}")
        return {}

    monkeypatch.setattr(smollm2.S, "bench_stage", fake_bench_stage)
    monkeypatch.setattr(smollm2.S, "category_table", lambda report: "table")
    s = smollm2.Settings(out=str(tmp_path))
    assert s.compare_lookup_tokens == 8 and s.prompt_lookup_num_tokens == 10
    rows = [{"prompt": "hi", "category": "qa"}]
    heads = tmp_path / "heads"
    heads.mkdir()
    report = tmp_path / "report.json"
    assert smollm2.bench_by_category(s, heads, rows, report) == {"table": "table"}  # no tree.json: default
    for lookup_tokens in (0, 5):  # 0: the default too
        tree = MedusaTree.from_choices([[0], [1]], lookup_tokens=lookup_tokens)
        (heads / "tree.json").write_text(json.dumps(tree.to_dict()))
        smollm2.bench_by_category(s, heads, rows, report)
    smollm2.bench_by_category(s, heads, rows, report, tree="dynamic")
    smollm2.bench_by_category(s, heads, rows, report, prompt_lookup=False)
    assert [c["compare_lookup"] for c in calls] == [8, 8, 5, 0, 5]  # every checkpoint tree compares
    assert [c["prompt_lookup"] for c in calls] == [True, True, True, True, False]
    assert smollm2.parse_settings(["--compare-lookup-tokens", "6"])[0].compare_lookup_tokens == 6
    plain = smollm2.parse_settings(["--no-lookup-rows"])[0]  # make bench-chat: each tree.json as it is
    assert plain.lookup_rows is False and smollm2.parse_settings([])[0].lookup_rows is True
    smollm2.bench_by_category(plain, heads, rows, report)
    assert calls[-1]["compare_lookup"] == 0 and calls[-1]["prompt_lookup"] is True
