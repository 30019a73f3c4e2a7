"""medusa demo: a reduced run end to end (stories260K standing in for the default model, tiny budgets) and
stage reuse on a re-run."""

from __future__ import annotations

import json
import os

from pipeline_helpers import demo_settings as _settings

from tiny_models import STORIES, require_shared

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_demo_reduced_end_to_end_then_reuses_stages(tmp_path, capsys):
    require_shared(STORIES)
    from medusa.demo.run import main

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
