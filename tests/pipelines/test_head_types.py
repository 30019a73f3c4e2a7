"""The head-type rows of the benchmark pipelines: Hydra heads and the dynamic tree beside MEDUSA-1 at the
same node budget (``summary["head_types"]``), on by default, ``--no-hydra`` to skip them."""

import json
import math

import pytest
import torch

from medusa.pipelines import stages as S
from medusa.pipelines.head_types import STAGES

from tiny_models import SHARED, require_shared

ROW = ("tokens_per_step", "speedup", "overhead", "greedy_exact_match", "nodes")


def tiny_settings(out):
    from medusa.pipelines.stories260k import Settings

    return Settings(out=str(out), shared=str(SHARED), train_stories=12, max_sentences=1, distill_tokens=24,
                    samples=0, calib_stories=4, bench_prompts=2, max_new_tokens=12, repeats=1, nodes="4",
                    progress=False, timing_threads=1,
                    recipe_overrides=("train.epochs=1", "train.max_steps=2", "train.batch_size=4",
                                      "train.save_steps=0", "data.eval_split=0", "heads.num_heads=3",
                                      "heads.num_layers=1"))


def test_stories260k_head_type_rows_after_a_run_without_them(tmp_path):
    """A run with ``hydra=False`` has none of the new stages; the same output resumed with them on reuses
    every earlier stage and adds the four rows at the MEDUSA-1 node count, every one exact."""
    require_shared(SHARED)
    from medusa.pipelines.stories260k import format_summary, run

    torch.manual_seed(0)
    out = tmp_path / "b"
    s = tiny_settings(out)
    s.hydra = False
    first = run(s, log=lambda line: None)
    assert "head_types" not in first and "hydra" not in first
    assert not any(S.marker_path(out, name).exists() for name in STAGES)
    assert not (out / "report_hydra.json").exists()

    s.hydra = True
    logs: list[str] = []
    summary = run(s, log=logs.append)
    reused = {line.split("]")[0][1:] for line in logs if "reusing" in line}
    assert {"prompts", "distill", "train", "calibrate", "bench"} <= reused and not reused & set(STAGES)
    assert all(S.marker_path(out, name).is_file() for name in STAGES)
    section = summary["head_types"]
    assert section["nodes"] == summary["calibrate"]["nodes"] == 4
    assert [(r["heads"], r["tree"]) for r in section["rows"]] == [
        ("medusa1", "static"), ("hydra", "static"), ("medusa1", "dynamic"), ("hydra", "dynamic")]
    for row in section["rows"]:
        assert all(isinstance(row[k], (int, float)) and math.isfinite(row[k]) for k in ROW), row
        assert row["nodes"] == 4 and row["greedy_exact_match"] == 1.0 and row["tokens_per_step"] >= 1.0
    assert section["rows"][0]["tokens_per_step"] == summary["bench"]["tokens_per_step"]
    for name in ("report_hydra.json", "report_dynamic.json", "report_hydra_dynamic.json"):
        report = json.loads((out / name).read_text())
        assert report["greedy_exact_match"] == 1.0 and report["config"]["tree_nodes"] == 4
    assert json.loads((out / "report_hydra.json").read_text())["config"]["heads"] == str(
        (out / "final_hydra").resolve())
    config = json.loads((out / "final_hydra" / "medusa_config.json").read_text())
    assert config["head_type"] == "hydra" and config["num_heads"] == 3
    tps = {(r["heads"], r["tree"]): r["tokens_per_step"] for r in section["rows"]}
    ratio = section["hydra_over_medusa1_tokens_per_step"]["static"]
    assert ratio["measured"] == pytest.approx(tps["hydra", "static"] / tps["medusa1", "static"])
    ratio = section["dynamic_over_static_tokens_per_step"]["hydra"]
    assert ratio["measured"] == pytest.approx(tps["hydra", "dynamic"] / tps["hydra", "static"])
    assert section["best_speedup"]["speedup"] == max(r["speedup"] for r in section["rows"])
    assert json.loads((out / "summary.json").read_text())["head_types"]["rows"] == section["rows"]
    text = format_summary(summary)
    assert "head types at the same node budget (4 nodes):" in text and section["best_speedup"]["line"] in text


def fixed_summary():
    bench = {"tokens_per_step": 2.0, "speedup": 1.5, "overhead": 1.2, "greedy_exact_match": 1.0,
             "baseline_tokens_per_s": 100.0, "medusa_tokens_per_s": 150.0}
    benches = [("medusa1", "static", 8, bench),
               ("hydra", "static", 8, {**bench, "tokens_per_step": 2.8, "speedup": 1.9}),
               ("medusa1", "dynamic", 8, {**bench, "tokens_per_step": 2.1, "speedup": 1.2}),
               ("hydra", "dynamic", 8, {**bench, "tokens_per_step": 3.5, "speedup": 1.7, "overhead": 1.4})]
    return {"calibrate": {"final_dir": "out/final", "nodes": 8, "expected_tokens_per_step": 2.1,
                          "top1": [0.5, 0.3]},
            "bench": bench, "targets": {"speedup": {"target": 2.0, "measured": 1.5, "met": False}},
            "head_types": {"nodes": 8, **S.head_type_rows(benches)}}


def test_head_type_rows_ratios_and_best():
    section = fixed_summary()["head_types"]
    assert section["rows"][1] == {"heads": "hydra", "tree": "static", "nodes": 8, "tokens_per_step": 2.8,
                                  "speedup": 1.9, "overhead": 1.2, "greedy_exact_match": 1.0}
    h = section["hydra_over_medusa1_tokens_per_step"]
    assert h["static"] == {"measured": pytest.approx(1.4), "target": 1.3, "met": True}
    assert h["dynamic"]["measured"] == pytest.approx(3.5 / 2.1) and h["dynamic"]["met"]
    d = section["dynamic_over_static_tokens_per_step"]
    assert d["medusa1"] == {"measured": pytest.approx(1.05), "target": 1.1, "met": False}
    assert d["hydra"]["measured"] == pytest.approx(1.25) and d["hydra"]["met"]
    assert section["best_speedup"] == {"heads": "hydra", "tree": "static", "speedup": 1.9,
                                       "line": "best wall-clock speedup: hydra heads, static tree (8 nodes), "
                                               "1.90x"}


def test_format_summary_prints_the_head_type_table():
    from medusa.pipelines.stories260k import format_summary

    summary = fixed_summary()
    lines = format_summary(summary).splitlines()
    start = lines.index("head types at the same node budget (8 nodes):")
    assert lines[start + 1:] == [
        "heads    tree     nodes tokens/step  speedup overhead  exact",
        "medusa1  static       8        2.00    1.50x     1.20   1.00",
        "hydra    static       8        2.80    1.90x     1.20   1.00",
        "medusa1  dynamic      8        2.10    1.20x     1.20   1.00",
        "hydra    dynamic      8        3.50    1.70x     1.40   1.00",
        "hydra_over_medusa1_tokens_per_step (static): 1.40 (target >= 1.3, met)",
        "hydra_over_medusa1_tokens_per_step (dynamic): 1.67 (target >= 1.3, met)",
        "dynamic_over_static_tokens_per_step (medusa1): 1.05 (target >= 1.1, missed)",
        "dynamic_over_static_tokens_per_step (hydra): 1.25 (target >= 1.1, met)",
        "best wall-clock speedup: hydra heads, static tree (8 nodes), 1.90x",
    ]
    del summary["head_types"]
    assert "head types" not in format_summary(summary)


def test_no_hydra_flag_turns_the_rows_off():
    from medusa.pipelines.smollm2 import parse_settings as chat_settings
    from medusa.pipelines.stories260k import parse_settings

    assert parse_settings([])[0].hydra is True
    assert parse_settings(["--no-hydra"])[0].hydra is False
    assert chat_settings([])[0].hydra is True
    assert chat_settings(["--no-hydra", "--set", "train.epochs=1"])[0].hydra is False


def test_hydra_overrides_follow_the_medusa1_projection(tmp_path):
    from medusa.pipelines.head_types import HeadTypePlan, hydra_overrides

    def plan(recipe_text, overrides=()):
        recipe = tmp_path / "r.yaml"
        recipe.write_text(recipe_text)
        return HeadTypePlan(recipe=str(recipe), overrides=("model=m", *overrides), user_overrides=("a.b=1",),
                            calib_data=tmp_path, medusa1_final=tmp_path, hydra_final=tmp_path, reports={})

    shared = "heads:\n  head_type: shared_lm_head\n"
    assert hydra_overrides(plan(shared)) == ["model=m", "heads.head_type=hydra",
                                             "heads.hydra_projection=shared_lm_head", "a.b=1"]
    linear = hydra_overrides(plan("heads:\n  head_type: linear\n"))
    assert linear == ["model=m", "heads.head_type=hydra", "a.b=1"]
    overridden = hydra_overrides(plan(shared, ["heads.head_type=linear"]))
    assert "heads.hydra_projection=shared_lm_head" not in overridden
