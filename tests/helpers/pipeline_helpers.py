"""Shared pieces of the pipeline tests (tests/pipelines, tests/integration): reduced demo settings, a fixed
benchmark summary with head-type rows, the keys every bench report carries, and a stories260K checkpoint
to calibrate."""

from __future__ import annotations

from pathlib import Path

# The keys of every report medusa.eval.bench.bench returns (and the pipelines write as report.json).
REPORT_KEYS = {"baseline_tokens_per_s", "medusa_tokens_per_s", "speedup", "tokens_per_step", "overhead",
               "greedy_exact_match", "rows", "config", "accept_length_histogram", "medusa_step_ms",
               "plain_step_ms"}


def demo_settings(out: Path, model: Path):
    """``medusa demo`` on tiny budgets (stories260K standing in for the default model)."""
    from medusa.demo.run import DemoSettings

    return DemoSettings(model=str(model), out=str(out), prompt_lines=3, distill_prompts=48, calib_prompts=8,
                        bench_prompts=2, distill_tokens=24, max_new_tokens=16, nodes="8", progress=False,
                        recipe_overrides=("train.epochs=1", "train.batch_size=8", "data.max_length=96",
                                          "heads.num_heads=3"))


def fixed_summary():
    """A stories260K pipeline summary with fixed figures, its ``head_types`` section made by
    :func:`benchmarks.stages.head_type_rows`."""
    from benchmarks import stages as S

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


def stories_calibration_checkpoint(root: Path) -> tuple[Path, Path]:
    """stories260K with 3 fresh heads saved in ``root/heads``, and two held-out rows in ``root/calib.jsonl``:
    what the ``medusa calibrate`` tests run on (skips without the shared model)."""
    import json

    from medusa import MedusaModel

    from tiny_models import STORIES, require_shared, stories_model

    require_shared(STORIES)
    path = root / "heads"
    MedusaModel.from_base(stories_model(), num_heads=3, num_layers=1).save_pretrained(path)
    data = path.parent / "calib.jsonl"
    rows = [{"prompt": "Once upon a time",
             "completion": " there was a little girl named Lily. She liked to play."},
            {"prompt": "Tom had a dog.",
             "completion": " The dog was big and brown. Tom and the dog ran to the park."}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, data
