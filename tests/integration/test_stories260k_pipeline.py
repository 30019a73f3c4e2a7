"""The ``make bench`` pipeline (benchmarks.stories260k) on tiny budgets, end to end: every stage runs,
the report lands where documented and a re-run reuses every stage; and the head-type rows (Hydra heads and
the dynamic tree beside MEDUSA-1 at the same node budget) added to a finished run without them."""

from __future__ import annotations

import json
import math

import pytest
import torch
from pipeline_helpers import REPORT_KEYS

from benchmarks import stages as S
from benchmarks.head_types import STAGES

from tiny_models import SHARED, require_shared


def test_stories260k_pipeline_reduced_end_to_end_and_reuse(tmp_path):
    """The `make bench` pipeline on tiny budgets: every stage runs, the report lands where documented, and a
    re-run reuses every stage (outputs untouched)."""
    require_shared(SHARED)
    from benchmarks.stories260k import Settings, run

    torch.manual_seed(0)
    s = Settings(out=str(tmp_path / "b"), shared=str(SHARED), train_stories=16, max_sentences=1,
                 distill_tokens=32, samples=0, calib_stories=6, bench_prompts=2, max_new_tokens=16, repeats=1,
                 nodes="8", progress=False,
                 recipe_overrides=("train.epochs=1", "train.batch_size=4", "train.save_steps=0",
                                   "data.eval_split=0", "heads.num_heads=3", "heads.num_layers=1"))
    logs: list[str] = []
    summary = run(s, log=logs.append)
    out = tmp_path / "b"
    report = json.loads((out / "report.json").read_text())
    assert REPORT_KEYS <= set(report) and report["greedy_exact_match"] == 1.0
    assert (out / "final" / "tree.json").is_file() and (out / "final" / "medusa_heads.safetensors").is_file()
    assert summary["calibrate"]["nodes"] == 8
    # measured, reported; exactness is not a target to miss
    assert set(summary["missed"]) <= {"tokens_per_step", "speedup"}
    prompts = [json.loads(line)["prompt"]
               for line in (out / "data" / "prompts_bench.jsonl").read_text().splitlines()]
    train = (out / "data" / "prompts_train.jsonl").read_text()
    assert prompts and not any(json.dumps(p) in train for p in prompts)  # held-out prompts never distilled
    mtime = (out / "final" / "tree.json").stat().st_mtime_ns
    logs.clear()
    again = run(s, log=logs.append)
    assert all("reusing" in line for line in logs), logs
    assert (out / "final" / "tree.json").stat().st_mtime_ns == mtime
    assert again["bench"]["speedup"] == summary["bench"]["speedup"]


ROW = ("tokens_per_step", "speedup", "overhead", "greedy_exact_match", "nodes")


def tiny_settings(out):
    from benchmarks.stories260k import Settings

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
    from benchmarks.stories260k import format_summary, run

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
