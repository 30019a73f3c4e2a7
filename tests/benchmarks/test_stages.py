"""The benchmark stages: the head-type rows' ratios."""

import pytest
from pipeline_helpers import fixed_summary


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


def test_launch_recipe_trains_in_two_processes(tmp_path, tiny_recipe_env):
    """``--processes 2``: the train stage as ``accelerate launch`` of two data-parallel CPU processes."""
    from pathlib import Path

    from benchmarks import stages as S
    from medusa.errors import ConfigError

    recipe = Path("recipes/tiny/medusa1.yaml")
    overrides = [f"output_dir={tmp_path / 'run'}", "train.batch_size=2", "train.max_steps=2",
                 "data.max_length=32", "train.logging_steps=1", "data.eval_split=0.0",
                 "data.group_by_length=true"]
    with pytest.raises(ConfigError, match="train.max_steps"):  # a bad override fails before any launch
        S.launch_recipe(recipe, [*overrides, "train.max_steps=0"], 2, progress=False)
    assert not (tmp_path / "run").exists()
    result = S.launch_recipe(recipe, overrides, 2, progress=False)
    assert result["processes"] == 2 and result["steps"] == 2 and result["metrics"]["loss"] > 0
    assert (Path(result["final_dir"]) / "medusa_heads.safetensors").is_file()


def test_category_bench_stops_at_eos_and_tables_the_categories(tmp_path, monkeypatch):
    """Every pipeline's per-category bench: the rows' prompts and categories go to bench_stage (stopping at
    EOS as HF does), the report's per-category table comes back under "table"."""
    from benchmarks import stages

    calls = []

    def fake_bench_stage(heads, prompts, report, max_new_tokens, **kwargs):
        calls.append((heads, prompts, max_new_tokens, kwargs))
        report.write_text('{"rows": 1}')
        return {"overall": 1.0}

    monkeypatch.setattr(stages, "bench_stage", fake_bench_stage)
    monkeypatch.setattr(stages, "category_table", lambda report: f"table of {report}")
    rows = [{"prompt": "a", "category": "qa"}, {"prompt": "b", "category": "rag"}]
    result = stages.category_bench(tmp_path, rows, tmp_path / "r.json", 16, chat=True, compare_lookup=4)
    assert result == {"overall": 1.0, "table": "table of {'rows': 1}"}
    assert calls == [(tmp_path, ["a", "b"], 16, {"ignore_eos": False, "categories": ["qa", "rag"],
                                                  "chat": True, "compare_lookup": 4})]
