"""Scale-out engines for real (medusa/training/setup.py: make_accelerator, check_engine, engine_report): two
processes (gloo, CPU) launched with the shipped accelerate configs, exactly as the README's "Scaling out"
section shows, on the tiny recipes over stories260K.

- DeepSpeed ZeRO-2 (MEDUSA-1) and ZeRO-3 (MEDUSA-2 LoRA): each process's engine line shows the sharding
  (ZeRO-2: every parameter held, half the optimizer's elements updated; ZeRO-3: half the parameters held);
  the run equals a 1-process run of the same recipe, seed and global batch (2 x 2 = 1 x 4 examples):
  step 1 (same parameters) within 1e-5 relative, the token-weighted per-head losses of steps 1-3 within
  1e-3 (measured <= 1.2e-4: each process averages over its own tokens, so the processes' gradients are
  weighted per process, not per token); ``final/`` has the same files and config keys as the 1-process one
  and loads alone.
- FSDP: accelerate 1.15 applies FSDP only on a device backend; on a CPU its launch would train
  unsynchronised copies, so the run is refused with one ``error:`` line (per process) before any model loads.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.config import load_recipe
from medusa.errors import ConfigError
from medusa.modeling.model import MedusaModel
from medusa.training.loop import train
from medusa.training.setup import check_engine

from tiny_models import require_module

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "accelerate"
TINY = ROOT / "recipes" / "tiny"
STEPS = ["train.max_steps=3", "data.max_length=32", "train.logging_steps=1", "data.eval_split=0.0"]
ENGINE = re.compile(r"engine: (.+?), (\d+) process\(es\); rank (\d+) holds ([\d,]+) of ([\d,]+) parameter "
                    r"elements; its optimizer updates ([\d,]+) of ([\d,]+)")

pytestmark = pytest.mark.usefixtures("tiny_recipe_env")  # stories260K present, run from the repository root


def _launch(config: str, recipe: str, out: Path) -> subprocess.CompletedProcess:
    """``accelerate launch --config_file configs/accelerate/<config> --num_processes 2 ...`` (README)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config),
           "--num_processes", "2", "--main_process_port", "0", "--mixed_precision", "no",
           "-m", "medusa.train", str(TINY / f"{recipe}.yaml"), f"output_dir={out}", "train.batch_size=2",
           *STEPS]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)


def _engines(text: str) -> dict[int, tuple]:
    """rank -> (kind, processes, held, total, updated, trainable) from the processes' engine lines."""
    out = {}
    for m in ENGINE.finditer(text):
        kind, world, rank, *counts = m.groups()
        out[int(rank)] = (kind, int(world), *(int(c.replace(",", "")) for c in counts))
    return out


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _one_process(recipe: str, out: Path, capsys) -> tuple:
    """The same recipe, seed and global batch (4) in this process; returns its engine line's fields."""
    capsys.readouterr()
    train(load_recipe(TINY / f"{recipe}.yaml", [f"output_dir={out}", "train.batch_size=4", *STEPS]),
          progress=False)
    return _engines(capsys.readouterr().out)[0]


def _assert_equal_runs(two: Path, one: Path, keys: list[str]) -> None:
    a, b = _metrics(two), _metrics(one)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    assert a[0]["loss"] == pytest.approx(b[0]["loss"], rel=1e-5)
    for ra, rb in zip(a, b):
        for key in keys:
            assert ra[key] == pytest.approx(rb[key], rel=1e-3), (ra["step"], key)


def _assert_same_final(two: Path, one: Path) -> None:
    names = [sorted(p.name for p in (run / "final").iterdir()) for run in (two, one)]
    assert names[0] == names[1]
    config = "medusa_config.json"
    assert json.loads((two / "final" / config).read_text()).keys() == json.loads(
        (one / "final" / config).read_text()).keys()
    MedusaModel.from_pretrained(two / "final", base_model=None if (two / "final" / "config.json").exists()
                                else str(ROOT.parent / "shared" / "models" / "stories260K"))


def test_deepspeed_zero2_two_processes_equal_one(tmp_path, capsys):
    """MEDUSA-1 (frozen backbone) under ZeRO-2: parameters whole on each process, optimizer state halved."""
    require_module("deepspeed")
    proc = _launch("deepspeed_zero2.yaml", "medusa1", tmp_path / "zero2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = _engines(proc.stdout)
    assert sorted(ranks) == [0, 1]
    for kind, world, held, total, updated, trainable in ranks.values():
        assert (kind, world) == ("DEEPSPEED ZeRO-2", 2)
        assert held == total == trainable and trainable / 2 <= updated < trainable
    assert _one_process("medusa1", tmp_path / "one", capsys) == ("NO", 1, total, total, total, total)
    _assert_equal_runs(tmp_path / "zero2", tmp_path / "one", ["head1_loss", "head2_loss", "head3_loss"])
    _assert_same_final(tmp_path / "zero2", tmp_path / "one")


def test_deepspeed_zero3_two_processes_equal_one(tmp_path, capsys):
    """MEDUSA-2 with LoRA under ZeRO-3: each process holds about half of the parameters (backbone + heads)."""
    require_module("deepspeed")
    proc = _launch("deepspeed_zero3.yaml", "medusa2_lora", tmp_path / "zero3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = _engines(proc.stdout)
    assert sorted(ranks) == [0, 1]
    for kind, world, held, total, updated, trainable in ranks.values():
        assert (kind, world) == ("DEEPSPEED ZeRO-3", 2)
        assert total / 2 <= held < total and trainable / 2 <= updated < trainable < total
    one = _one_process("medusa2_lora", tmp_path / "one", capsys)
    assert one[:4] == ("NO", 1, total, total) and one[4] == one[5] == trainable
    _assert_equal_runs(tmp_path / "zero3", tmp_path / "one", ["head1_loss", "head2_loss", "head3_loss"])
    _assert_same_final(tmp_path / "zero3", tmp_path / "one")


def test_fsdp_on_cpu_is_refused_before_anything_loads(tmp_path):
    """The shipped FSDP config, 2 processes on this CPU: refused (not silently unsharded), nothing written."""
    proc = _launch("fsdp.yaml", "medusa1", tmp_path / "fsdp")
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors and set(errors) == {errors[0]} and "FSDP needs a GPU-class device" in errors[0]
    assert "engine:" not in proc.stdout and not (tmp_path / "fsdp").exists()


def test_check_engine_refuses_fsdp_only_without_a_device():
    with pytest.raises(ConfigError, match="FSDP needs a GPU-class device"):
        check_engine({"ACCELERATE_USE_FSDP": "true"}, has_device=False)
    check_engine({"ACCELERATE_USE_FSDP": "true"}, has_device=True)
    check_engine({"ACCELERATE_USE_DEEPSPEED": "true"}, has_device=False)
    check_engine({}, has_device=False)
