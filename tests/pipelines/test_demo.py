"""medusa demo: a reduced run end to end (stories260K standing in for the default model, tiny budgets),
stage reuse, held-out prompt selection, and the one-line error when a stage fails."""

from __future__ import annotations

import json
import os
import sysconfig
from pathlib import Path

import pytest

from tiny_models import STORIES, require_shared

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[2]


def _settings(out: Path, model: Path):
    from medusa.pipelines.demo import DemoSettings

    return DemoSettings(model=str(model), out=str(out), prompt_lines=3, distill_prompts=48, calib_prompts=8,
                        bench_prompts=2, distill_tokens=24, max_new_tokens=16, nodes="8", progress=False,
                        recipe_overrides=("train.epochs=1", "train.batch_size=8", "data.max_length=96",
                                          "heads.num_heads=3"))


def test_demo_reduced_end_to_end_then_reuses_stages(tmp_path, capsys):
    require_shared(STORIES)
    from medusa.pipelines.demo import main

    out = tmp_path / "demo"
    assert main(_settings(out, STORIES)) == 0
    captured = capsys.readouterr()
    printed = captured.out
    bars = [line for line in captured.err.replace("\r", "\n").splitlines() if "%|" in line or "it/s" in line]
    assert bars == []  # progress=False (--no-progress): no stage, nor transformers, draws a bar
    report = json.loads((out / "report.json").read_text())
    for key in ("baseline_tokens_per_s", "medusa_tokens_per_s", "speedup", "tokens_per_step", "overhead",
                "greedy_exact_match", "rows"):
        assert key in report
    assert report["greedy_exact_match"] == 1.0
    assert "2/2 prompts" in printed and "MISMATCH" not in printed
    assert "one completion, streamed" in printed
    tree = json.loads((out / "final" / "tree.json").read_text())
    assert len(tree["choices"]) + 1 == 8
    vllm = out / "export" / "vllm"
    assert (vllm / "config.json").is_file() and any(vllm.glob("*.safetensors"))
    stages = sorted(p.stem for p in (out / ".stages").glob("*.json"))
    assert stages == ["bench", "calibrate", "distill", "export", "prompts", "train"]
    heads = out / "final" / "medusa_heads.safetensors"
    mtime = heads.stat().st_mtime_ns

    assert main(_settings(out, STORIES)) == 0  # a re-run reuses every stage
    printed = capsys.readouterr().out
    assert printed.count("reusing the finished stage") == 6
    assert heads.stat().st_mtime_ns == mtime


def test_demo_prompts_come_from_held_out_files_split_by_file(tmp_path):
    require_shared(STORIES)
    from medusa.pipelines.demo import held_out_files, split_prompts

    files = held_out_files(STORIES)  # no training_summary.json: the default model's held-out modules
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    modules = ("argparse", "csv", "dataclasses", "difflib", "fractions", "heapq", "json",
               "shlex", "statistics", "textwrap")
    for f in files:
        rel = f.relative_to(stdlib).parts
        assert rel[0].removesuffix(".py") in modules or (
            rel[0] == "test" and any(rel[1].removesuffix(".py") == f"test_{m}"
                                     or rel[1].startswith(f"test_{m}_")
                                     for m in modules)), rel
    assert any(f.name == "heapq.py" for f in files)
    rows = split_prompts(_settings(tmp_path, STORIES))
    texts = {name: {r["prompt"] for r in r_} for name, r_ in rows.items()}
    assert len(rows["bench"]) == 2 and len(rows["calib"]) == 8 and len(rows["distill"]) == 48
    assert not texts["bench"] & texts["distill"] and not texts["calib"] & texts["distill"]


def test_demo_stage_failure_is_one_line_error_without_marker(tmp_path, capsys):
    from medusa.cli import main
    from medusa.pipelines.stages import StageError, marker_path, run_stage

    def broken() -> dict:
        raise RuntimeError("disk on fire\nsecond line")

    with pytest.raises(StageError, match=r"^stage 'train' failed: RuntimeError: disk on fire \(re-run"):
        run_stage(tmp_path, "train", broken, log=lambda _: None)
    assert not marker_path(tmp_path, "train").exists()

    rc = main(["demo", "--model", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error:") and "nothing" in err and "\n" not in err
