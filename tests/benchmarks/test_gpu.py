"""The GPU harness's code path, run for real in its CPU mode (tiny shapes, a few steps)."""

import json

import pytest

from benchmarks import gpu

from tiny_models import require_shared

# inductor compiles on a fresh machine: run first (tests/conftest.py)
pytestmark = pytest.mark.heavy(350)


@pytest.mark.slow  # compiles the verify step for two tree sizes, runs a compiled bench
def test_gpu_harness_small_cpu(tmp_path, capsys):
    require_shared()
    assert gpu.main(["--out", str(tmp_path), "--device", "cpu", "--small"]) == 0
    report = json.loads((tmp_path / "gpu_report.json").read_text())
    assert report["device"] == "cpu" and report["small"]
    modes = [(r["shape"], r["compiled"]) for r in report["step_costs"]]
    assert modes == [("tiny-llama", False), ("tiny-llama", True)]
    for row in report["step_costs"]:
        assert sorted(int(n) for n in row["step_ms"]) == list(gpu.SMALL_NODES)
        assert row["overhead"]["1"] == 1.0 and all(v > 0 for v in row["step_ms"].values())
    assert report["stories"]["compiled_exact_match"] == 1.0  # greedy compiled MEDUSA == compiled HF
    assert [f["dtype"] for f in report["fidelity"]] == ["float32", "bfloat16"]
    f32 = report["fidelity"][0]
    assert f32["identical_share"] == 1.0 and f32["hf_no_cache_identical_share"] == 1.0
    drafters = report["drafters"]
    assert [(d["drafter"], d["dtype"]) for d in drafters] == [("medusa", "bfloat16"), ("eagle3", "bfloat16")]
    assert all(d["steps"] >= 1 and d["step_ms"] > 0 and d["tokens_per_step"] >= 1 for d in drafters)
    assert [(g["model"], g["rows"]) for g in report["data_generation"]] == [("stories260K", 4)]
    assert report["data_generation"][0]["completion_tokens"] > 0
    assert (tmp_path / "distill_stories260K.jsonl").is_file()
    assert report["tests"]["returncode"] == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("stories260K") for line in lines)
    assert lines[-2].startswith("self-distill stories260K: 4 rows")
